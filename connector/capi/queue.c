// ucmgo_load and ucmgo_dump: a small, valid call is queued in C and submitted from Go by a
// thread already running Go code, so that the caller's thread never enters Go for it.
//
// Why. A C or Python caller's thread entering Go must take one of the Go scheduler's Ps; on a
// machine with few cores and loads in flight it often waits for one (the load call took 16 µs
// from C, 25-30 µs from Python, against 5 µs from Go), and its P then stays parked with it
// while it sleeps in ucmgo_wait. A queued call costs the caller a copy of its arguments.
//
// Who submits. The goroutine that completes a task and wakes a caller sleeping in ucmgo_wait
// yields its CPU to it (tasks.c): the caller runs, typically queues its next call at once, and
// the completer, back in Go with its P, takes everything queued and submits it: one entry into
// Go for a burst of calls. Calls queued while no completer is about to look wake a drainer
// goroutine (drain in main.go) that sleeps here.
//
// What is queued. Only calls this file can prove valid against the store's layout: a store it
// knows (registered at open), 1 to MAX_QUEUED blocks, every table (ids, shards, addresses) and
// every address inside the memory a caller can have (ucmgoi_plausible: checked before a table
// is read, and each address for the largest span it could name, the whole block), a known
// address count, every shard index in range (or -1, the whole block), no zero id, no block
// twice for the same shard or whole and by shard. Every other call goes to the Go
// implementation synchronously, which reports what is wrong with the same status and message
// as before. So an error the header documents as synchronous stays so.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "ucmgo.h"

#define MAX_QUEUED 32 // blocks: a larger call is worth its own entry into Go
#define MAX_STORES 64 // stores open at once that take the queue; more go to Go synchronously

// The Go implementations (main.go), for calls not queued.
int64_t ucmgoi_load(int64_t store, const uint8_t *ids, const int64_t *shards, size_t n, void *const *addrs,
                    size_t addrs_per_block);
int64_t ucmgoi_dump(int64_t store, const uint8_t *ids, const int64_t *shards, size_t n, void *const *addrs,
                    size_t addrs_per_block, uint64_t prerequisite);

typedef struct {
	int64_t h;
	int64_t shards;      // shard indexes are in [0, shards), or -1 (the whole block)
	size_t tensors;      // addresses per shard: tensors, or 1
	int64_t block_bytes; // shards × shard bytes: no span an address names is larger
} store_layout;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER; // the drainer sleeps on it
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER; // ucmgoi_queue_flush sleeps on it
static ucmgo_entry *head, *tail;
static int sleeping;           // drainers asleep on work
static int expected;           // completers that will take the queue before they leave Go
static size_t outstanding;     // entries queued or being submitted
static store_layout stores[MAX_STORES];
static int64_t next_handle = INT64_C(1) << 40; // above every handle Go issues

// ucmgoi_store_add lets calls on store h take the queue (ucmgo_open); 0 when the table is full.
int ucmgoi_store_add(int64_t h, int64_t shards, size_t tensors, int64_t shard_bytes) {
	int ok = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_STORES && !ok; i++) {
		if (stores[i].h == 0) {
			stores[i] = (store_layout){h, shards, tensors, shards * shard_bytes};
			ok = 1;
		}
	}
	pthread_mutex_unlock(&mu);
	return ok;
}

// ucmgoi_store_drop stops queueing calls on store h (ucmgo_close, before it flushes).
void ucmgoi_store_drop(int64_t h) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_STORES; i++)
		if (stores[i].h == h) stores[i].h = 0;
	pthread_mutex_unlock(&mu);
}

// layout returns store h's layout under mu, or 0.
static int layout(int64_t h, store_layout *out) {
	for (int i = 0; i < MAX_STORES; i++) {
		if (h > 0 && stores[i].h == h) {
			*out = stores[i];
			return 1;
		}
	}
	return 0;
}

static int zero_id(const uint8_t *id) {
	static const uint8_t zero[UCMGO_ID_BYTES];
	return memcmp(id, zero, UCMGO_ID_BYTES) == 0;
}

// same_block: ids i and k name the same block for overlapping parts (the same shard, or one of
// them the whole block).
static int same_block(const uint8_t *ids, const int64_t *shards, size_t i, size_t k) {
	return (shards[k] == shards[i] || shards[k] < 0 || shards[i] < 0) &&
	       memcmp(ids + k * UCMGO_ID_BYTES, ids + i * UCMGO_ID_BYTES, UCMGO_ID_BYTES) == 0;
}

// valid reports whether the call's arguments pass every check the Go implementation makes.
static int valid(const store_layout *l, const uint8_t *ids, const int64_t *shards, size_t n, void *const *addrs,
                 size_t per) {
	if (n == 0 || n > MAX_QUEUED || per == 0 || per > (size_t)l->shards * l->tensors) return 0;
	if (!ucmgoi_plausible(ids, n, UCMGO_ID_BYTES) || !ucmgoi_plausible(shards, n, sizeof(int64_t)) ||
	    !ucmgoi_plausible(addrs, (uint64_t)n * per, sizeof(void *)))
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (shards[i] == -1) {
			// The whole block: one address, one per shard, or one per tensor of every shard.
			if (per != 1 && per != (size_t)l->shards && per != (size_t)l->shards * l->tensors) return 0;
		} else if (shards[i] < 0 || shards[i] >= l->shards || (per != 1 && per != l->tensors)) {
			return 0;
		}
		if (zero_id(ids + i * UCMGO_ID_BYTES)) return 0;
		for (size_t j = 0; j < per; j++)
			if (!ucmgoi_plausible(addrs[i * per + j], 1, (uint64_t)l->block_bytes)) return 0;
		for (size_t k = 0; k < i; k++)
			if (same_block(ids, shards, i, k)) return 0;
	}
	return 1;
}

// enqueue queues a valid call and returns its task handle, or 0 when it must go to Go.
static int64_t enqueue(int32_t load, int64_t store, const uint8_t *ids, const int64_t *shards, size_t n,
                       void *const *addrs, size_t per) {
	store_layout l;
	pthread_mutex_lock(&mu);
	int known = layout(store, &l);
	pthread_mutex_unlock(&mu);
	if (!known || !valid(&l, ids, shards, n, addrs, per)) return 0;
	size_t idb = n * UCMGO_ID_BYTES, shb = n * sizeof(int64_t), adb = n * per * sizeof(void *);
	ucmgo_entry *e = malloc(sizeof *e + shb + adb + idb);
	if (e == NULL) return 0;
	e->shards = (int64_t *)(e + 1);
	e->addrs = (void **)((char *)e->shards + shb);
	e->ids = (uint8_t *)e->addrs + adb;
	memcpy(e->ids, ids, idb);
	memcpy(e->shards, shards, shb);
	memcpy(e->addrs, addrs, adb);
	e->next = NULL, e->load = load, e->store = store, e->n = n, e->per = per;
	// The record is made under mu, where the store is known open: ucmgo_close drops the store
	// under mu before it submits what is queued, so no entry of a closed store is ever queued.
	pthread_mutex_lock(&mu);
	int64_t h = ++next_handle;
	if (!layout(store, &l) || (e->task = ucmgoi_task_new(store, h, n)) == NULL) {
		pthread_mutex_unlock(&mu);
		free(e);
		return 0;
	}
	if (tail != NULL) tail->next = e;
	else head = e;
	tail = e;
	outstanding++;
	if (expected == 0 && sleeping > 0) pthread_cond_signal(&work);
	pthread_mutex_unlock(&mu);
	return h;
}

// ucmgoi_queue_take moves up to max queued entries into out and returns how many. With wait,
// it sleeps until there is one (the drainer); done_expecting ends a completer's promise to look
// (ucmgoi_queue_expect), in the same step, so that a call queued after it wakes the drainer.
size_t ucmgoi_queue_take(ucmgo_entry **out, size_t max, int wait, int done_expecting) {
	size_t k = 0;
	pthread_mutex_lock(&mu);
	if (done_expecting) expected--;
	while (wait && head == NULL) {
		sleeping++;
		pthread_cond_wait(&work, &mu);
		sleeping--;
	}
	while (head != NULL && k < max) {
		out[k++] = head;
		head = head->next;
	}
	if (head == NULL) tail = NULL;
	else if (k == max && sleeping > 0 && expected == 0) pthread_cond_signal(&work);
	pthread_mutex_unlock(&mu);
	return k;
}

// ucmgoi_queue_expect is called by a completer before it hands its CPU to a woken caller: calls
// queued until its ucmgoi_queue_take(..., done_expecting) are its to submit.
void ucmgoi_queue_expect(void) {
	pthread_mutex_lock(&mu);
	expected++;
	pthread_mutex_unlock(&mu);
}

// ucmgoi_entry_done frees a submitted entry.
void ucmgoi_entry_done(ucmgo_entry *e) {
	free(e);
	pthread_mutex_lock(&mu);
	if (--outstanding == 0) pthread_cond_broadcast(&idle);
	pthread_mutex_unlock(&mu);
}

// ucmgoi_queue_flush returns once no entry is queued or being submitted (ucmgo_close, after
// ucmgoi_store_drop and after taking what is queued itself).
void ucmgoi_queue_flush(void) {
	pthread_mutex_lock(&mu);
	while (outstanding > 0) pthread_cond_wait(&idle, &mu);
	pthread_mutex_unlock(&mu);
}

int64_t ucmgo_load(int64_t store, const uint8_t *ids, const int64_t *shards, size_t n, void *const *addrs,
                   size_t addrs_per_block) {
	int64_t h = enqueue(1, store, ids, shards, n, addrs, addrs_per_block);
	return h > 0 ? h : ucmgoi_load(store, ids, shards, n, addrs, addrs_per_block);
}

int64_t ucmgo_dump(int64_t store, const uint8_t *ids, const int64_t *shards, size_t n, void *const *addrs,
                   size_t addrs_per_block, uint64_t prerequisite) {
	int64_t h = enqueue(0, store, ids, shards, n, addrs, addrs_per_block);
	return h > 0 ? h : ucmgoi_dump(store, ids, shards, n, addrs, addrs_per_block, prerequisite);
}
