// abi.c drives libucmgo.so through ucmgo.h as a C program would (main_test.go builds and runs
// it): layer-wise dumps and loads from aligned and unaligned memory, lookups, V0
// create/commit, stats, and every bad-input case, which must return a status and a message.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ucmgo.h"
#include "check.h"

#define N 48
#define SHARDS 4
#define TENSOR 8192
#define SHARD (2 * TENSOR)

static void fill(uint8_t *p, size_t n, const uint8_t *id, int shard) {
	for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(id[i % 16] ^ (i / 16) ^ (shard * 31));
}

static int same(const uint8_t *p, size_t n, const uint8_t *id, int shard) {
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(id[i % 16] ^ (i / 16) ^ (shard * 31))) return 0;
	return 1;
}

struct waiter {
	int64_t store, task;
	int32_t status;
};

static void *wait_thread(void *arg) {
	struct waiter *w = arg;
	w->status = ucmgo_wait(w->store, w->task, NULL, 0);
	return NULL;
}

static void *other_thread(void *arg) {
	int64_t store = *(int64_t *)arg;
	int64_t idx;
	// Fails here; the main thread's message must not change.
	ucmgo_lookup_on_prefix(store, NULL, 3, &idx);
	return strstr(ucmgo_last_error(), "null pointer") ? (void *)1 : NULL;
}

// Small tasks in flight from several threads at once: calls of up to 32 blocks are queued in C
// and submitted from Go by whichever thread looks first (queue.c); every byte must arrive.
struct stress {
	int64_t store;
	const uint8_t *ids; // N stored blocks
	int seed, bad;
};

#define WINDOW 4
static void *stress_thread(void *arg) {
	struct stress *st = arg;
	uint8_t *buf;
	if (posix_memalign((void **)&buf, 4096, (size_t)WINDOW * 4 * SHARD) != 0) return NULL;
	int64_t tasks[WINDOW] = {0};
	int nblk[WINDOW], first[WINDOW], shard[WINDOW];
	for (int it = 0; it < 200 + WINDOW; it++) {
		int r = it % WINDOW;
		if (tasks[r] > 0) {
			uint8_t failed[4];
			if (ucmgo_wait(st->store, tasks[r], failed, (size_t)nblk[r]) != UCMGO_OK) st->bad++;
			for (int j = 0; j < nblk[r]; j++)
				if (!same(buf + ((size_t)r * 4 + j) * SHARD, SHARD, st->ids + (first[r] + j) * 16, shard[r])) st->bad++;
			tasks[r] = 0;
		}
		if (it >= 200) continue;
		nblk[r] = 1 + (it + st->seed) % 4, first[r] = (it * 7 + st->seed) % (N - 4), shard[r] = (it + st->seed) % SHARDS;
		int64_t sh[4];
		void *at[4];
		for (int j = 0; j < nblk[r]; j++) sh[j] = shard[r], at[j] = buf + ((size_t)r * 4 + j) * SHARD;
		memset(buf + (size_t)r * 4 * SHARD, 0, 4 * SHARD);
		tasks[r] = ucmgo_load(st->store, st->ids + first[r] * 16, sh, (size_t)nblk[r], at, 1);
		if (tasks[r] <= 0) st->bad++, tasks[r] = 0;
	}
	free(buf);
	return NULL;
}

// Small loads issued without pause while another thread closes the store: each returns a task or
// a status, every task returned is settled by the close (a wait reports the store closed), and
// the close returns.
struct racer {
	int64_t store;
	const uint8_t *ids;
	uint8_t *buf;
	int64_t tasks[4096];
	int n, last;
};

static void *racer_thread(void *arg) {
	struct racer *rc = arg;
	int64_t sh[1] = {0};
	void *at[1] = {rc->buf};
	while (rc->n < 4096) {
		int64_t t = ucmgo_load(rc->store, rc->ids, sh, 1, at, 1);
		if (t <= 0) {
			__atomic_store_n(&rc->last, (int)t, __ATOMIC_RELAXED);
			return NULL;
		}
		rc->tasks[rc->n] = t;
		__atomic_store_n(&rc->n, rc->n + 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: abi STORE_DIR\n");
		return 2;
	}
	char config[1024];
	snprintf(config, sizeof config,
	         "{\"storage_backends\": [\"%s\"], \"device_id\": 0, \"tensor_size_list\": [%d, %d], "
	         "\"shard_size\": %d, \"block_size\": %d}",
	         argv[1], TENSOR, TENSOR, SHARD, SHARD * SHARDS);
	int64_t store = ucmgo_open(config);
	CHECK(store > 0, "open: %lld", (long long)store);
	if (store <= 0) return 1;

	uint8_t ids[N * UCMGO_ID_BYTES];
	srand(7);
	for (size_t i = 0; i < sizeof ids; i++) ids[i] = (uint8_t)rand();
	int64_t shards[N];
	// Aligned memory for even blocks (one address per shard), unaligned tensors apart for odd.
	uint8_t *aligned;
	if (posix_memalign((void **)&aligned, 4096, (size_t)N * SHARD) != 0) return 1;
	uint8_t *loose = malloc((size_t)N * SHARD * 2 + 1);
	void *addrs[N * 2];
	uint8_t failed[N];

	for (int sh = 0; sh < SHARDS; sh++) {
		for (int i = 0; i < N; i++) {
			shards[i] = sh;
			uint8_t *a = aligned + (size_t)i * SHARD, *k = loose + 1 + (size_t)i * SHARD * 2, *v = k + SHARD + 3;
			fill(a, SHARD, ids + i * 16, sh);
			memcpy(k, a, TENSOR);
			memcpy(v, a + TENSOR, TENSOR);
			addrs[2 * i] = (i % 2 == 0) ? (void *)a : (void *)k;
			addrs[2 * i + 1] = (i % 2 == 0) ? (void *)(a + TENSOR) : (void *)v;
		}
		int64_t task = ucmgo_dump(store, ids, shards, N, addrs, 2, 0);
		CHECK(task > 0, "dump shard %d: %lld", sh, (long long)task);
		CHECK(ucmgo_wait(store, task, failed, N) == UCMGO_OK, "wait dump shard %d", sh);
		EXPECT_STATUS(ucmgo_wait(store, task, NULL, 0), UCMGO_ENOOBJ, "already waited");
	}
	uint8_t found[N];
	CHECK(ucmgo_lookup(store, ids, N, found) == UCMGO_OK, "lookup");
	for (int i = 0; i < N; i++) CHECK(found[i] == 1, "block %d not found", i);
	int64_t last;
	CHECK(ucmgo_lookup_on_prefix(store, ids, N, &last) == UCMGO_OK && last == N - 1, "prefix %lld", (long long)last);

	// Load every shard: even blocks into aligned memory at one address, odd into unaligned tensors.
	for (int sh = 0; sh < SHARDS; sh++) {
		memset(aligned, 0, (size_t)N * SHARD);
		memset(loose, 0, (size_t)N * SHARD * 2 + 1);
		for (int i = 0; i < N; i++) shards[i] = sh;
		int64_t task = ucmgo_load(store, ids, shards, N, addrs, 2);
		CHECK(task > 0, "load shard %d", sh);
		int32_t finished = 0;
		CHECK(ucmgo_check(store, task, &finished) == UCMGO_OK, "check");
		CHECK(ucmgo_wait(store, task, failed, N) == UCMGO_OK, "wait load shard %d", sh);
		for (int i = 0; i < N; i++) {
			CHECK(!failed[i], "block %d failed", i);
			if (i % 2 == 0) {
				CHECK(same(aligned + (size_t)i * SHARD, SHARD, ids + i * 16, sh), "block %d shard %d differs", i, sh);
			} else {
				uint8_t *k = loose + 1 + (size_t)i * SHARD * 2, *v = k + SHARD + 3;
				uint8_t tmp[SHARD];
				memcpy(tmp, k, TENSOR);
				memcpy(tmp + TENSOR, v, TENSOR);
				CHECK(same(tmp, SHARD, ids + i * 16, sh), "block %d shard %d differs (tensors apart)", i, sh);
			}
		}
	}
	// A missing block fails alone, named in the failure mask.
	uint8_t mixed[2 * 16];
	memcpy(mixed, ids, 16);
	memset(mixed + 16, 0xab, 16);
	int64_t two[2] = {0, 0};
	void *one_each[2] = {aligned, aligned + SHARD};
	int64_t task = ucmgo_load(store, mixed, two, 2, one_each, 1);
	CHECK(task > 0, "load with a miss");
	int32_t done = 0;
	while (ucmgo_check(store, task, &done) == UCMGO_OK && !done) usleep(1000);
	EXPECT_STATUS(ucmgo_check(store, task, &done), UCMGO_ENOOBJ, "not found");
	CHECK(done == 1, "check of a finished task: %d", done);
	EXPECT_STATUS(ucmgo_wait(store, task, failed, 2), UCMGO_ENOOBJ, "not found"); // check did not consume it
	CHECK(failed[0] == 0 && failed[1] == 1, "failure mask %d %d", failed[0], failed[1]);
	EXPECT_STATUS(ucmgo_check(store, task, &done), UCMGO_ENOOBJ, "task");

	// Two threads wait for one task: one gets its result, the other finds it consumed.
	task = ucmgo_load(store, ids, two, 1, addrs, 2);
	struct waiter w1 = {store, task, 99}, w2 = {store, task, 99};
	pthread_t t1, t2;
	pthread_create(&t1, NULL, wait_thread, &w1);
	pthread_create(&t2, NULL, wait_thread, &w2);
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	CHECK((w1.status == UCMGO_OK && w2.status == UCMGO_ENOOBJ) || (w2.status == UCMGO_OK && w1.status == UCMGO_ENOOBJ),
	      "concurrent waits: %d and %d", w1.status, w2.status);

	// Bad input: a status and a message, never a crash, nothing stored lost.
	EXPECT_STATUS(ucmgo_load(store, NULL, shards, 2, addrs, 2), UCMGO_EPARAM, "null");
	EXPECT_STATUS(ucmgo_load(store, ids, NULL, 2, addrs, 2), UCMGO_EPARAM, "shard indexes");
	EXPECT_STATUS(ucmgo_load(store, ids, shards, 2, NULL, 2), UCMGO_EPARAM, "address table");
	void *with_null[4] = {aligned, NULL, aligned, aligned + TENSOR};
	EXPECT_STATUS(ucmgo_dump(store, ids, shards, 2, with_null, 2, 0), UCMGO_EPARAM, "address 1: null");
	EXPECT_STATUS(ucmgo_dump(store, ids, shards, 1, addrs, 3, 0), UCMGO_EPARAM, "addresses per block");
	int64_t bad_shards[2] = {SHARDS, 0};
	EXPECT_STATUS(ucmgo_load(store, ids, bad_shards, 2, addrs, 2), UCMGO_EPARAM, "shard index 4");
	uint8_t dup[2 * 16];
	memcpy(dup, ids, 16);
	memcpy(dup + 16, ids, 16);
	EXPECT_STATUS(ucmgo_dump(store, dup, two, 2, addrs, 2, 0), UCMGO_EDUPLICATE, "positions 0 and 1");
	EXPECT_STATUS(ucmgo_wait(store, 999999, NULL, 0), UCMGO_ENOOBJ, "task 999999");
	int32_t finished;
	EXPECT_STATUS(ucmgo_check(store, -3, &finished), UCMGO_EPARAM, "task -3: not a task handle");
	EXPECT_STATUS(ucmgo_lookup(store, ids, N, NULL), UCMGO_EPARAM, "result array: null");

	// Pointers and addresses no caller's memory can have: refused before anything reads or
	// writes through them, by the queued path (up to 32 blocks) and the one through Go alike.
	void *minus5[2] = {(void *)(uintptr_t)-5, aligned + TENSOR};
	void *top[2] = {aligned, (void *)(uintptr_t)(0 - (uintptr_t)4096)};
	void *page0[1] = {(void *)(uintptr_t)16};
	const void *kernel = (const void *)(uintptr_t)(0 - (uintptr_t)4096);
	for (size_t n = 1; n <= N; n += N - 1) { // 1: the queue's checks, N: Go's
		int64_t zeros[N] = {0};
		void *many[N * 2];
		for (size_t i = 0; i < N * 2; i++) many[i] = i % 2 ? minus5[0] : (void *)aligned;
		EXPECT_STATUS(ucmgo_dump(store, ids, zeros, n, n == 1 ? minus5 : many, 2, 0), UCMGO_EPARAM, "8192 bytes at 0xfffffffffffffffb: outside");
		EXPECT_STATUS(ucmgo_load(store, ids, zeros, 1, top, 2), UCMGO_EPARAM, "address 1: 8192 bytes at 0xfffffffffffff000");
		EXPECT_STATUS(ucmgo_load(store, ids, zeros, 1, page0, 1), UCMGO_EPARAM, "address 0: 16384 bytes at 0x10");
		EXPECT_STATUS(ucmgo_load(store, (const uint8_t *)kernel, zeros, n, addrs, 2), UCMGO_EPARAM, "block ids:");
		EXPECT_STATUS(ucmgo_load(store, ids, (const int64_t *)kernel, n, addrs, 2), UCMGO_EPARAM, "shard indexes:");
		EXPECT_STATUS(ucmgo_load(store, ids, zeros, n, (void *const *)kernel, 2), UCMGO_EPARAM, "address table:");
		EXPECT_STATUS(ucmgo_load(store, ids, zeros, n, addrs, (size_t)1 << 62), UCMGO_EPARAM, "addresses per block");
	}
	EXPECT_STATUS(ucmgo_load(store, ids, shards, (size_t)-1, addrs, 2), UCMGO_EPARAM, "more than");
	EXPECT_STATUS(ucmgo_lookup(store, ids, 2, (uint8_t *)kernel), UCMGO_EPARAM, "result array:");
	EXPECT_STATUS(ucmgo_lookup_on_prefix(store, ids, 2, (int64_t *)kernel), UCMGO_EPARAM, "result pointer:");
	EXPECT_STATUS(ucmgo_create(store, ids, 2, (int32_t *)kernel), UCMGO_EPARAM, "result array:");
	EXPECT_STATUS(ucmgo_prefetch(store, (const uint8_t *)kernel, 2), UCMGO_EPARAM, "block ids:");
	EXPECT_STATUS(ucmgo_commit(store, (const uint8_t *)kernel, 2, 1), UCMGO_EPARAM, "block ids:");
	EXPECT_STATUS(ucmgo_stats(store, (char *)kernel, 100), UCMGO_EPARAM, "stats: buffer:");
	char statbuf[16];
	EXPECT_STATUS(ucmgo_stats(store, statbuf, (size_t)-1), UCMGO_EPARAM, "stats: buffer of");
	EXPECT_STATUS(ucmgo_open((const char *)kernel), UCMGO_EPARAM, "config:");
	task = ucmgo_load(store, ids, two, 1, addrs, 2);
	CHECK(task > 0, "load before bad waits");
	EXPECT_STATUS(ucmgo_check(store, task, (int32_t *)kernel), UCMGO_EPARAM, "check: result pointer:");
	EXPECT_STATUS(ucmgo_wait(store, task, (uint8_t *)kernel, 1), UCMGO_EPARAM, "failure mask");
	EXPECT_STATUS(ucmgo_wait(store, -7, NULL, 0), UCMGO_EPARAM, "task -7: not a task handle");
	CHECK(ucmgo_wait(store, task, failed, 1) == UCMGO_OK, "wait after bad waits");
	// A task of no blocks has a mask of no entries: it is never read, wherever it points.
	task = ucmgo_load(store, ids, two, 0, addrs, 2);
	CHECK(task > 0, "load of no blocks");
	CHECK(ucmgo_wait(store, task, (uint8_t *)kernel, 0) == UCMGO_OK, "wait of no blocks, mask never read");

	// The whole block (shard -1): one address per tensor of every shard, by the queue and by Go.
	for (size_t n = 1; n <= N; n += N - 1) {
		int64_t whole[N];
		void *rows[N * 2 * SHARDS];
		uint8_t *big = malloc(n * SHARD * SHARDS);
		for (size_t i = 0; i < n; i++) {
			whole[i] = -1;
			for (int j = 0; j < 2 * SHARDS; j++) rows[i * 2 * SHARDS + j] = big + (i * SHARDS * SHARD) + (size_t)j * TENSOR;
		}
		task = ucmgo_load(store, ids, whole, n, rows, 2 * SHARDS);
		CHECK(task > 0 && ucmgo_wait(store, task, NULL, 0) == UCMGO_OK, "whole-block load of %zu", n);
		for (size_t i = 0; i < n; i++)
			for (int sh = 0; sh < SHARDS; sh++)
				CHECK(same(big + (i * SHARDS + (size_t)sh) * SHARD, SHARD, ids + i * 16, sh), "whole block %zu shard %d differs", i, sh);
		free(big);
		EXPECT_STATUS(ucmgo_load(store, ids, whole, n, rows, 2), UCMGO_EPARAM, "the whole block: want 1, 4 (one per shard) or 8");
	}

	// ucmgo_open_env reads UCM's variables from the array it is given.
	const char *env[] = {"UCM_CONFIG_FILE=/nonexistent/ucm-abi.yaml", NULL};
	EXPECT_STATUS(ucmgo_open_env(NULL, env), UCMGO_EPARAM, "/nonexistent/ucm-abi.yaml");
	const char *bad_env[] = {"NOEQUALS", NULL};
	EXPECT_STATUS(ucmgo_open_env(NULL, bad_env), UCMGO_EPARAM, "environment entry 0");
	EXPECT_STATUS(ucmgo_lookup(12345, ids, N, found), UCMGO_EPARAM, "store handle 12345");
	EXPECT_STATUS(ucmgo_open("{\"storage_backends\": \"/tmp/x\", \"shard_sise\": 1}"), UCMGO_EPARAM, "shard_sise");
	task = ucmgo_load(store, ids, two, 1, addrs, 2);
	EXPECT_STATUS(ucmgo_wait(store, task, failed, 5), UCMGO_EPARAM, "mask of 5 entries");
	CHECK(ucmgo_wait(store, task, failed, 1) == UCMGO_OK, "wait after a bad mask");

	// The last error is per thread.
	EXPECT_STATUS(ucmgo_wait(store, 424242, NULL, 0), UCMGO_ENOOBJ, "task 424242");
	pthread_t th;
	void *res;
	pthread_create(&th, NULL, other_thread, &store);
	pthread_join(th, &res);
	CHECK(res != NULL, "the other thread's message");
	CHECK(strstr(ucmgo_last_error(), "task 424242") != NULL, "this thread's message changed");

	// V0: create, dump every shard, commit.
	uint8_t v0[2 * 16];
	memset(v0, 0x5a, sizeof v0);
	v0[31] = 1;
	int32_t results[2];
	CHECK(ucmgo_create(store, v0, 2, results) == UCMGO_OK && results[0] == 0 && results[1] == 0, "create");
	CHECK(ucmgo_lookup(store, v0, 2, found) == UCMGO_OK && !found[0], "created block visible before commit");
	for (int sh = 0; sh < SHARDS; sh++) {
		int64_t sv[2] = {sh, sh};
		for (int i = 0; i < 2; i++) fill(aligned + (size_t)i * SHARD, SHARD, v0 + i * 16, sh);
		task = ucmgo_dump(store, v0, sv, 2, one_each, 1, 0);
		CHECK(task > 0 && ucmgo_wait(store, task, NULL, 0) == UCMGO_OK, "v0 dump shard %d", sh);
	}
	CHECK(ucmgo_commit(store, v0, 2, 1) == UCMGO_OK, "commit");
	CHECK(ucmgo_lookup(store, v0, 2, found) == UCMGO_OK && found[0] && found[1], "committed blocks not visible");
	CHECK(ucmgo_create(store, v0, 1, results) == UCMGO_OK && results[0] == UCMGO_EDUPLICATE, "create of a stored block: %d", results[0]);

	char small[8];
	int64_t need = ucmgo_stats(store, small, sizeof small);
	CHECK(need > (int64_t)sizeof small, "stats length %lld", (long long)need);
	char *stats = malloc((size_t)need + 1);
	CHECK(ucmgo_stats(store, stats, (size_t)need + 1) == need && strstr(stats, "\"instance\"") && strstr(stats, "\"LoadedShards\""), "stats: %s", stats);
	free(stats);

	struct stress st[4];
	pthread_t sts[4];
	for (int i = 0; i < 4; i++) {
		st[i] = (struct stress){store, ids, i, 0};
		pthread_create(&sts[i], NULL, stress_thread, &st[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(sts[i], NULL);
		CHECK(st[i].bad == 0, "stress thread %d: %d failed waits or differing blocks", i, st[i].bad);
	}

	task = ucmgo_load(store, ids, two, 1, addrs, 2); // never waited for before the close
	CHECK(task > 0, "load before close");
	CHECK(ucmgo_close(store) == UCMGO_OK, "close");
	EXPECT_STATUS(ucmgo_wait(store, task, NULL, 0), UCMGO_EPARAM, "not open");
	EXPECT_STATUS(ucmgo_check(store, task, &finished), UCMGO_EPARAM, "not open");
	EXPECT_STATUS(ucmgo_close(store), UCMGO_EPARAM, "not open");
	EXPECT_STATUS(ucmgo_lookup(store, ids, N, found), UCMGO_EPARAM, "not open");
	// Reopened, everything is still there.
	store = ucmgo_open(config);
	CHECK(store > 0 && ucmgo_lookup_on_prefix(store, ids, N, &last) == UCMGO_OK && last == N - 1, "after reopen: %lld", (long long)last);
	// Closed while another thread issues loads.
	static struct racer rc;
	rc.store = store, rc.ids = ids, rc.buf = aligned;
	pthread_t rt;
	pthread_create(&rt, NULL, racer_thread, &rc);
	while (__atomic_load_n(&rc.n, __ATOMIC_RELAXED) < 16 && __atomic_load_n(&rc.last, __ATOMIC_RELAXED) == 0) usleep(100);
	CHECK(ucmgo_close(store) == UCMGO_OK, "close under loads");
	pthread_join(rt, NULL);
	CHECK(rc.n > 0, "no load before the close");
	CHECK(rc.n == 4096 || rc.last < 0, "loads after the close: %d", rc.last);
	for (int i = 0; i < rc.n; i++) {
		int32_t st_ = ucmgo_wait(store, rc.tasks[i], NULL, 0);
		if (st_ != UCMGO_EPARAM || strstr(ucmgo_last_error(), "not open") == NULL) {
			CHECK(0, "wait on task %d of a closed store: %d", i, st_);
			break;
		}
	}
	store = ucmgo_open(config);
	CHECK(store > 0 && ucmgo_lookup_on_prefix(store, ids, N, &last) == UCMGO_OK && last == N - 1, "after the second reopen: %lld", (long long)last);
	ucmgo_close(store);
	free(aligned);
	free(loose);
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
