// Transfer tasks completed on the C side. A Python or C caller's thread is not a Go thread: each
// call into Go makes it wait for one of the Go scheduler's Ps, which on a machine with few
// cores and loads in flight costs it 150–270 µs (docs/connector.md, "What the ABI costs").
// So a load or dump enters Go at most once, to submit (a small one not at all: queue.c); the
// task is registered here, a goroutine fills in its result when its I/O is done, and ucmgo_wait
// and ucmgo_check are answered from this table in C, without entering Go: the waiting thread
// sleeps on the task's condition variable. Tasks not in the table (a failed registration, a
// closed store, a handle never issued) go to the Go implementation, which knows what to report.
//
// The wake-up is handed over. A Go caller blocked on a task is resumed by the goroutine that
// completes it on the same thread, right after it (the scheduler's runnext), without the
// kernel. A C or Python caller's thread is asleep in pthread_cond_wait and must be scheduled
// by the kernel, which on a busy machine lets the waking Go thread, and others, run on first:
// on two busy vCPUs the woken C caller resumed 115-300 µs after its task was done on average
// (a fifth to two fifths of the wake-ups after over 200 µs), a goroutine 6-15 µs after; meanwhile
// its next task is not submitted (docs/connector.md, "What the ABI costs"). So a completer that
// woke a sleeping waiter yields its CPU once (sched_yield): a waiter queued on the same CPU runs
// at once, as a goroutine would, and usually queues its next load or dump (queue.c), which the
// completer then submits, still in Go (ucmgoi_task_done returns 1 to say so).
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "ucmgo.h"

typedef struct ucmgo_task {
	int64_t store, id;
	size_t n; // blocks: the size of the failure mask
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;       // the result below is filled in
	int32_t status; // UCMGO_OK or the task's failure status
	char *msg;      // its message when status < 0
	size_t msglen;
	uint8_t *failed; // n entries: 1 for a block that failed
	int sleepers;    // threads asleep in ucmgo_wait on cv
	int refs;        // the table, the Go completer, each thread inside wait or check
	int listed;      // still in the table (not yet consumed by a wait, nor dropped at close)
	struct ucmgo_task *next;
} ucmgo_task;

#define BUCKETS 4096
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static ucmgo_task *table[BUCKETS];

static size_t bucket(int64_t store, int64_t id) {
	uint64_t h = (uint64_t)store * 0x9E3779B97F4A7C15ull ^ (uint64_t)id * 0xC2B2AE3D27D4EB4Full;
	return (size_t)(h >> 32) % BUCKETS;
}

static void release(ucmgo_task *t) {
	if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
	pthread_cond_destroy(&t->cv);
	pthread_mutex_destroy(&t->mu);
	free(t->msg);
	free(t->failed);
	free(t);
}

// ucmgoi_task_new registers task id of store, of n blocks, with two references: the table's
// and the completer's (ucmgoi_task_done releases it). NULL when out of memory.
ucmgo_task *ucmgoi_task_new(int64_t store, int64_t id, size_t n) {
	ucmgo_task *t = calloc(1, sizeof *t);
	if (t == NULL) return NULL;
	t->failed = calloc(n > 0 ? n : 1, 1);
	if (t->failed == NULL) {
		free(t);
		return NULL;
	}
	t->store = store;
	t->id = id;
	t->n = n;
	t->refs = 2;
	t->listed = 1;
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	size_t b = bucket(store, id);
	pthread_mutex_lock(&table_mu);
	t->next = table[b];
	table[b] = t;
	pthread_mutex_unlock(&table_mu);
	return t;
}

// ucmgoi_task_done fills in the result of t (msg and failed are copied: they are Go memory,
// valid only during the call), wakes its waiters and drops the completer's reference. It
// returns 1 when it woke a sleeping waiter and handed it the CPU: the caller must then take
// the submission queue (ucmgoi_queue_take with done_expecting), else 0.
int ucmgoi_task_done(ucmgo_task *t, int32_t status, const char *msg, size_t msglen, const uint8_t *failed) {
	char *copy = NULL;
	if (status < 0 && msglen > 0) {
		copy = malloc(msglen);
		if (copy != NULL) memcpy(copy, msg, msglen);
	}
	pthread_mutex_lock(&t->mu);
	t->status = status;
	t->msg = copy;
	t->msglen = copy != NULL ? msglen : 0;
	if (failed != NULL && t->n > 0) memcpy(t->failed, failed, t->n);
	t->done = 1;
	int handoff = t->sleepers > 0;
	if (handoff) ucmgoi_queue_expect(); // before the waiter can run and queue
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
	release(t);
	if (handoff) sched_yield(); // let the woken caller run now (see the top of this file)
	return handoff;
}

// find returns the listed task id of store with a reference taken, or NULL.
static ucmgo_task *find(int64_t store, int64_t id) {
	pthread_mutex_lock(&table_mu);
	ucmgo_task *t = table[bucket(store, id)];
	while (t != NULL && (t->store != store || t->id != id)) t = t->next;
	if (t != NULL) __atomic_add_fetch(&t->refs, 1, __ATOMIC_ACQ_REL);
	pthread_mutex_unlock(&table_mu);
	return t;
}

// unlist removes t from the table; it returns 1 for the caller that removed it (and so owns the
// table's reference, which it drops), 0 when another did first.
static int unlist(ucmgo_task *t) {
	int mine = 0;
	pthread_mutex_lock(&table_mu);
	if (t->listed) {
		ucmgo_task **p = &table[bucket(t->store, t->id)];
		while (*p != t) p = &(*p)->next;
		*p = t->next;
		t->listed = 0;
		mine = 1;
	}
	pthread_mutex_unlock(&table_mu);
	if (mine) release(t);
	return mine;
}

// ucmgoi_tasks_drop unlists every task of store (ucmgo_close): waits on them then go to the Go
// side, which reports the store closed, as it does for every call on a closed handle.
void ucmgoi_tasks_drop(int64_t store) {
	for (size_t b = 0; b < BUCKETS; b++) {
		for (;;) {
			pthread_mutex_lock(&table_mu);
			ucmgo_task *t = table[b];
			while (t != NULL && t->store != store) t = t->next;
			if (t != NULL) __atomic_add_fetch(&t->refs, 1, __ATOMIC_ACQ_REL);
			pthread_mutex_unlock(&table_mu);
			if (t == NULL) break;
			unlist(t);
			release(t);
		}
	}
}

static void set_error(const char *msg, size_t n) {
	if (msg != NULL && n > 0) ucmgo_set_error(msg, n);
	else ucmgo_set_error("ucmgo: error", 12);
}

// The Go implementations (main.go), for tasks the table does not hold.
int32_t ucmgoi_wait(int64_t store, int64_t task, uint8_t *failed, size_t n);
int32_t ucmgoi_check(int64_t store, int64_t task, int32_t *finished);

int32_t ucmgo_wait(int64_t store, int64_t task, uint8_t *failed, size_t n) {
	// A count no task can have is refused (in Go, which names it) before the task is looked at.
	ucmgo_task *t = n > UCMGOI_MAX_BLOCKS ? NULL : find(store, task);
	if (t == NULL) return ucmgoi_wait(store, task, failed, n);
	if (failed != NULL && (n != t->n || !ucmgoi_plausible(failed, n, 1))) {
		char msg[200];
		int len = n != t->n
		              ? snprintf(msg, sizeof msg, "wait: failure mask of %zu entries for a task of %zu blocks: invalid argument", n, t->n)
		              : snprintf(msg, sizeof msg, "wait: failure mask: %zu bytes at %p: outside the memory a caller can have: invalid argument", n, (void *)failed);
		release(t);
		set_error(msg, len > 0 ? (size_t)len : 0);
		return UCMGO_EPARAM;
	}
	pthread_mutex_lock(&t->mu);
	while (!t->done) {
		t->sleepers++;
		pthread_cond_wait(&t->cv, &t->mu);
		t->sleepers--;
	}
	pthread_mutex_unlock(&t->mu);
	if (!unlist(t)) {
		// Another wait consumed it first: the handle is no longer known.
		release(t);
		return ucmgoi_wait(store, task, failed, n);
	}
	if (failed != NULL) memcpy(failed, t->failed, t->n);
	int32_t st = t->status;
	if (st < 0) set_error(t->msg, t->msglen);
	release(t);
	return st;
}

int32_t ucmgo_check(int64_t store, int64_t task, int32_t *finished) {
	// A result pointer it cannot write goes to the Go implementation, which names it.
	ucmgo_task *t = ucmgoi_plausible(finished, 1, sizeof *finished) ? find(store, task) : NULL;
	if (t == NULL) return ucmgoi_check(store, task, finished);
	pthread_mutex_lock(&t->mu);
	int done = t->done;
	int32_t st = done ? t->status : UCMGO_OK;
	if (st < 0) set_error(t->msg, t->msglen);
	pthread_mutex_unlock(&t->mu);
	release(t);
	*finished = done;
	return st;
}
