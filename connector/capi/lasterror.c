// The calling thread's last error message (ucmgo_last_error, declared in ucmgo.h): each thread
// sees the message of its own last failed call, as with dlerror.
//
// The per-thread buffer hangs off a pthread key, not a __thread variable: a 4 KiB __thread
// array would need static TLS, which a library dlopen()ed late (Python loading libucmgo.so
// after torch) cannot get ("cannot allocate memory in static TLS block").
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static pthread_key_t error_key;
static pthread_once_t error_once = PTHREAD_ONCE_INIT;
static int error_key_ok;

static void make_key(void) { error_key_ok = pthread_key_create(&error_key, free) == 0; }

static char *thread_buffer(int create) {
	pthread_once(&error_once, make_key);
	if (!error_key_ok) return NULL;
	char *buf = pthread_getspecific(error_key);
	if (buf == NULL && create) {
		buf = calloc(1, UCMGOI_ERROR_MAX);
		if (buf != NULL && pthread_setspecific(error_key, buf) != 0) {
			free(buf);
			buf = NULL;
		}
	}
	return buf;
}

void ucmgo_set_error(const char *msg, size_t n) {
	char *buf = thread_buffer(1);
	if (buf == NULL) return;
	if (n >= UCMGOI_ERROR_MAX) n = UCMGOI_ERROR_MAX - 1;
	memcpy(buf, msg, n);
	buf[n] = '\0';
}

const char *ucmgo_last_error(void) {
	const char *buf = thread_buffer(0);
	return buf != NULL ? buf : "";
}
