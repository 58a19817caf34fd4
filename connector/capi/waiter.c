// ucmgo_wait blocks in C, not in Go: a Go goroutine blocked on a thread that C owns (a cgo
// callback's thread is locked to it) makes the Go scheduler hand its P away and back through
// futex round trips on every wait, which cost a Python caller ~300 µs per call on a 2-vCPU VM
// (docs/connector.md, "What the ABI costs"). Here the caller's thread sleeps on a condition
// variable that a Go goroutine signals when the task's I/O is done: one wake-up.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct ucmgo_waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	int refs; // the waiting thread and the signalling goroutine: the last one frees it
} ucmgo_waiter;

ucmgo_waiter *ucmgo_waiter_new(void) {
	ucmgo_waiter *w = calloc(1, sizeof *w);
	if (w == NULL) return NULL;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->refs = 2;
	return w;
}

static void release(ucmgo_waiter *w) {
	if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) == 0) {
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		free(w);
	}
}

void ucmgo_waiter_signal(ucmgo_waiter *w) {
	pthread_mutex_lock(&w->mu);
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	release(w);
}

// Declared by the Go side (main.go).
int32_t ucmgoi_wait_begin(int64_t store, int64_t task, ucmgo_waiter **w);
int32_t ucmgoi_wait_end(int64_t store, int64_t task, uint8_t *failed, size_t n);

int32_t ucmgo_wait(int64_t store, int64_t task, uint8_t *failed, size_t n) {
	ucmgo_waiter *w = NULL;
	int32_t st = ucmgoi_wait_begin(store, task, &w);
	if (st < 0) return st;
	if (w != NULL) {
		pthread_mutex_lock(&w->mu);
		while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
		pthread_mutex_unlock(&w->mu);
		release(w);
	}
	return ucmgoi_wait_end(store, task, failed, n);
}
