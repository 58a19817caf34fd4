// The calling thread's last error message (ucmgo_last_error, declared in ucmgo.h): each thread
// sees the message of its own last failed call, as with dlerror.
#include <stddef.h>
#include <string.h>

#define UCMGO_ERROR_MAX 4096

static __thread char ucmgo_error[UCMGO_ERROR_MAX];

void ucmgo_set_error(const char *msg, size_t n) {
	if (n >= sizeof ucmgo_error) {
		n = sizeof ucmgo_error - 1;
	}
	memcpy(ucmgo_error, msg, n);
	ucmgo_error[n] = '\0';
}

const char *ucmgo_last_error(void) { return ucmgo_error; }
