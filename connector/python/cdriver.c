// cdriver.c runs bench.py's transfer pattern from C through libucmgo.so: one thread keeping
// `window` tasks of `batch` blocks in flight, K and V of each shard passed as two addresses,
// address tables built once per buffer slot, the same dump and load orders. bench.py compiles
// and runs it beside the Python and Go drivers, so that the cost of the C ABI (entering Go from
// a foreign thread, the C task table, the wake-up) is told apart from the Python interpreter's.
//
//     cdriver DIR WORKLOAD BLOCK SHARDS TOTAL BATCH WINDOW IO_ENGINE [EXTRA]
//
// EXTRA, when given, is more members of the store's JSON configuration ("io_direct": false).
// prints one JSON object: dump_mbps, load_mbps, load_cpu_us (process CPU per load task). Every
// loaded byte is compared after the timed phase; a difference or a failed call exits 1.
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "ucmgo.h"

static void die(const char *what) {
	fprintf(stderr, "cdriver: %s: %s\n", what, ucmgo_last_error());
	exit(1);
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu(void) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       (double)ru.ru_stime.tv_usec / 1e6;
}

// slots maps count blocks of private memory advised into huge pages, as bench.py's Slots.
static uint8_t *slots(size_t count, size_t block) {
	size_t n = count * block;
	uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("cdriver: mmap");
		exit(1);
	}
	madvise(p, n, MADV_HUGEPAGE);
	return p;
}

// fill writes a fixed pseudo-random body (the untimed set-up, as bench.py's os.urandom).
static void fill(uint8_t *p, size_t n) {
	uint64_t x = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; i + 8 <= n; i += 8) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
}

// stamp writes (block b, sub-shard k) into the first 16 bytes of every sub-shard of the block
// at p, so that every block's bytes are its own: bench.py's Slots.stamp.
static void stamp(uint8_t *p, size_t block, int subs, uint64_t b) {
	size_t sub = block / (size_t)subs;
	for (int k = 0; k < subs; k++) {
		uint64_t kk = (uint64_t)k;
		memcpy(p + (size_t)k * sub, &b, 8);
		memcpy(p + (size_t)k * sub + 8, &kk, 8);
	}
}

static void block_id(uint8_t *id, uint64_t b) {
	memset(id, 0, 16);
	uint64_t v = b + 1;
	memcpy(id, &v, 8); // little-endian, as bench.py's block_id
}

struct run {
	int64_t h;
	size_t ring, batch, shards, shard;
	int64_t *pending; // ring × shards task handles, 0 for none
	size_t *npending;
};

static void drain(struct run *r, size_t slot) {
	for (size_t i = 0; i < r->npending[slot]; i++)
		if (ucmgo_wait(r->h, r->pending[slot * r->shards + i], NULL, 0) != UCMGO_OK) die("wait");
	r->npending[slot] = 0;
}

int main(int argc, char **argv) {
	if (argc != 9 && argc != 10) {
		fprintf(stderr, "usage: cdriver DIR WORKLOAD BLOCK SHARDS TOTAL BATCH WINDOW IO_ENGINE [EXTRA]\n");
		return 2;
	}
	const char *dir = argv[1];
	int layerwise = strcmp(argv[2], "layerwise") == 0;
	size_t block = strtoull(argv[3], NULL, 10), nshards = strtoull(argv[4], NULL, 10);
	size_t total = strtoull(argv[5], NULL, 10), batch = strtoull(argv[6], NULL, 10);
	size_t window = strtoull(argv[7], NULL, 10);
	if (block == 0 || nshards == 0 || batch == 0 || window == 0 || block % nshards != 0) {
		fprintf(stderr, "cdriver: bad shape\n");
		return 2;
	}
	size_t shards = layerwise ? nshards : 1, shard = block / shards, half = shard / 2;
	size_t blocks = total / block, groups = (blocks + batch - 1) / batch;
	char cfg[2048];
	const char *extra = argc == 10 && argv[9][0] != '\0' ? argv[9] : NULL;
	snprintf(cfg, sizeof cfg,
	         "{\"storage_backends\": \"%s\", \"device_id\": 0, \"tensor_size_list\": [%zu, %zu], "
	         "\"shard_size\": %zu, \"block_size\": %zu, \"instance\": \"bench\", \"io_engine\": \"%s\", "
	         "\"sync_policy\": \"always\"%s%s}",
	         dir, half, half, shard, block, argv[8], extra ? ", " : "", extra ? extra : "");

	uint8_t *ids = calloc(blocks, 16);
	int64_t *shard_of = calloc(batch, sizeof(int64_t) * shards);
	uint8_t *src = slots(window * batch, block), *dst = slots(window * batch, block);
	fill(src, window * batch * block);
	fill(dst, window * batch * block);
	// Address tables, layer-first as UCM's connector builds them: [slot][shard][block][K, V].
	void **src_tab = calloc(window * shards * batch * 2, sizeof(void *));
	void **dst_tab = calloc(window * shards * batch * 2, sizeof(void *));
	if (ids == NULL || shard_of == NULL || src_tab == NULL || dst_tab == NULL) die("calloc");
	for (size_t r = 0; r < window; r++)
		for (size_t s = 0; s < shards; s++)
			for (size_t j = 0; j < batch; j++) {
				size_t at = ((r * shards + s) * batch + j) * 2, off = (r * batch + j) * block + s * shard;
				src_tab[at] = src + off, src_tab[at + 1] = src + off + half;
				dst_tab[at] = dst + off, dst_tab[at + 1] = dst + off + half;
			}
	for (size_t s = 0; s < shards; s++)
		for (size_t j = 0; j < batch; j++) shard_of[s * batch + j] = (int64_t)s;
	for (size_t b = 0; b < blocks; b++) block_id(ids + 16 * b, b);

	struct run run = {.ring = window, .batch = batch, .shards = shards, .shard = shard};
	run.pending = calloc(window * shards, sizeof(int64_t));
	run.npending = calloc(window, sizeof(size_t));
	if (run.pending == NULL || run.npending == NULL) die("calloc");
	if ((run.h = ucmgo_open(cfg)) <= 0) die("open");

	double t0 = now();
	for (size_t g = 0; g < groups; g++) {
		size_t r = g % window, n = g * batch + batch <= blocks ? batch : blocks - g * batch;
		drain(&run, r);
		for (size_t j = 0; j < n; j++) stamp(src + (r * batch + j) * block, block, (int)nshards, g * batch + j);
		for (size_t s = 0; s < shards; s++) {
			int64_t t = ucmgo_dump(run.h, ids + 16 * g * batch, shard_of + s * batch, n,
			                       src_tab + (r * shards + s) * batch * 2, 2, 0);
			if (t <= 0) die("dump");
			run.pending[r * shards + run.npending[r]++] = t;
		}
	}
	for (size_t r = 0; r < window; r++) drain(&run, r);
	double dump_s = now() - t0;
	if (ucmgo_close(run.h) != UCMGO_OK) die("close");
	if ((run.h = ucmgo_open(cfg)) <= 0) die("reopen");

	// Every (group, shard) unit, shuffled for layerwise (a fixed xorshift Fisher-Yates).
	size_t units = groups * shards;
	size_t *order = calloc(units, sizeof(size_t));
	if (order == NULL) die("calloc");
	for (size_t u = 0; u < units; u++) order[u] = u;
	if (layerwise) {
		uint64_t x = 88172645463325252ull;
		for (size_t u = units - 1; u > 0; u--) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			size_t v = (size_t)(x % (u + 1)), tmp = order[u];
			order[u] = order[v], order[v] = tmp;
		}
	}
	double c0 = cpu(), waited = 0, submitting = 0;
	t0 = now();
	for (size_t u = 0; u < units; u++) {
		size_t g = order[u] / shards, s = order[u] % shards, r = u % window;
		size_t n = g * batch + batch <= blocks ? batch : blocks - g * batch;
		double w0 = now();
		drain(&run, r);
		double s0 = now();
		int64_t t = ucmgo_load(run.h, ids + 16 * g * batch, shard_of + s * batch, n,
		                       dst_tab + (r * shards + s) * batch * 2, 2);
		double s1 = now();
		waited += s0 - w0, submitting += s1 - s0;
		if (t <= 0) die("load");
		run.pending[r * shards + run.npending[r]++] = t;
	}
	for (size_t r = 0; r < window; r++) drain(&run, r);
	double load_s = now() - t0, load_cpu = cpu() - c0;

	// Verify every byte outside the timing: each group loaded again into slot 0, compared.
	uint8_t *want = malloc(block);
	if (want == NULL) die("malloc");
	for (size_t g = 0; g < groups; g++) {
		size_t n = g * batch + batch <= blocks ? batch : blocks - g * batch;
		for (size_t s = 0; s < shards; s++) {
			int64_t t = ucmgo_load(run.h, ids + 16 * g * batch, shard_of + s * batch, n, dst_tab + s * batch * 2, 2);
			if (t <= 0 || ucmgo_wait(run.h, t, NULL, 0) != UCMGO_OK) die("verify load");
		}
		for (size_t j = 0; j < n; j++) {
			memcpy(want, src + ((g % window) * batch + j) * block, block); // the slot it was dumped from
			stamp(want, block, (int)nshards, g * batch + j);
			if (memcmp(dst + j * block, want, block) != 0) {
				fprintf(stderr, "cdriver: block %zu differs\n", g * batch + j);
				return 1;
			}
		}
	}
	if (ucmgo_close(run.h) != UCMGO_OK) die("close");
	double bytes = (double)blocks * (double)block;
	printf("{\"dump_mbps\": %.1f, \"load_mbps\": %.1f, \"load_cpu_us\": %.2f, \"load_submit_us\": %.2f, "
	       "\"load_wait_us\": %.2f}\n",
	       bytes / dump_s / 1e6, bytes / load_s / 1e6, load_cpu * 1e6 / (double)units, submitting * 1e6 / (double)units,
	       waited * 1e6 / (double)units);
	return 0;
}
