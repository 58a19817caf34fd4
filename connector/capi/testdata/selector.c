// selector.c drives the selector part of libucmgo.so through ucmgo.h as a C program would
// (selector_test.go builds and runs it): representations computed from K and precomputed,
// loaded back by id (with a block that has none), selections synchronous and as tasks, and the
// bad-input cases, each of which must return a status and a message naming the field.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ucmgo.h"
#include "check.h"

#define N 12       // stored blocks
#define SHARDS 4   // layers
#define TENSOR 4096
#define SHARD (2 * TENSOR)
#define BS 16
#define KV 2
#define QH 4
#define HD 16

// kval is K's value at (block, layer, token, head, channel): small integers, exact in float16,
// whose means over a block's 16 tokens are exact too.
static float kval(int b, int l, int t, int h, int d) { return (float)((b * 3 + l + t * (d % 3) + h * 5 + d) % 9) - 4; }

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: selector STORE_DIR\n");
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

	uint8_t ids[(N + 1) * UCMGO_ID_BYTES]; // the last id is never stored
	srand(11);
	for (size_t i = 0; i < sizeof ids; i++) ids[i] = (uint8_t)rand();
	static uint8_t blocks[N][SHARDS * SHARD];
	void *addrs[N];
	int64_t shards[N];
	for (int i = 0; i < N; i++) {
		memset(blocks[i], i + 1, sizeof blocks[i]);
		addrs[i] = blocks[i];
		shards[i] = -1;
	}
	int64_t task = ucmgo_dump(store, ids, shards, N, addrs, 1, 0);
	CHECK(task > 0 && ucmgo_wait(store, task, NULL, 0) == UCMGO_OK, "dump of the blocks");

	const char *shape = "{\"layers\": 4, \"q_heads\": 4, \"kv_heads\": 2, \"head_dim\": 16, \"block_size\": 16}";
	int64_t sel = ucmgo_selector_open(store, "ESA:\n  sparse_ratio: 0.3\n  head_select: kv\n", shape);
	CHECK(sel > 0, "selector open: %lld", (long long)sel);
	if (sel <= 0) return 1;
	int64_t layers, rows, heads, cols;
	int32_t kind;
	CHECK(ucmgo_reprs_shape(sel, &layers, &rows, &heads, &cols, &kind) == UCMGO_OK && layers == 4 && rows == 1 && heads == KV &&
	          cols == HD && kind == UCMGO_REPR_ESA_MEAN,
	      "shape %lld %lld %lld %lld %d", (long long)layers, (long long)rows, (long long)heads, (long long)cols, kind);

	// K of the N stored blocks and the one not stored, float16, one pointer per layer.
	static _Float16 k[N + 1][SHARDS][BS * KV * HD];
	void *kaddrs[(N + 1) * SHARDS];
	for (int b = 0; b <= N; b++)
		for (int l = 0; l < SHARDS; l++) {
			for (int t = 0; t < BS; t++)
				for (int h = 0; h < KV; h++)
					for (int d = 0; d < HD; d++) k[b][l][(t * KV + h) * HD + d] = (_Float16)kval(b, l, t, h, d);
			kaddrs[b * SHARDS + l] = k[b][l];
		}
	// The blocks 0..N-1 and the missing one: it fails alone.
	task = ucmgo_reprs_dump(sel, ids, N + 1, kaddrs, SHARDS, UCMGO_DTYPE_FLOAT16);
	CHECK(task > 0, "reprs_dump: %lld", (long long)task);
	uint8_t failed[N + 1];
	int32_t st = ucmgo_wait(store, task, failed, N + 1);
	CHECK(st == UCMGO_ENOOBJ, "reprs_dump wait: %d", st);
	for (int i = 0; i <= N; i++) CHECK(failed[i] == (i == N), "block %d failed %d", i, failed[i]);

	// Loaded means equal the means of K (exact: small integers over 16 tokens).
	static float dst[(N + 1) * KV * HD];
	uint8_t found[N + 1];
	for (int l = 0; l < SHARDS; l++) {
		CHECK(ucmgo_reprs_load(sel, l, ids, N + 1, dst, KV * HD, found) == UCMGO_OK, "reprs_load layer %d", l);
		for (int b = 0; b <= N; b++) {
			CHECK(found[b] == (b < N), "layer %d block %d found %d", l, b, found[b]);
			for (int h = 0; b < N && h < KV; h++)
				for (int d = 0; d < HD; d++) {
					float sum = 0;
					for (int t = 0; t < BS; t++) sum += kval(b, l, t, h, d);
					float got = dst[(b * KV + h) * HD + d];
					if (fabsf(got - sum / BS) > 1e-3f) {
						CHECK(0, "layer %d block %d head %d dim %d: mean %g, want %g", l, b, h, d, got, sum / BS);
						h = KV;
						break;
					}
				}
			if (b == N)
				for (int j = 0; j < KV * HD; j++) CHECK(dst[b * KV * HD + j] == 0, "the missing block's values are not zero");
		}
	}

	// Selections: 12 stored blocks and a partial one; synchronous, then the same as a task.
	float q[QH * HD];
	for (int i = 0; i < QH * HD; i++) q[i] = (float)((i * 7) % 5) - 2;
	int64_t seq = N * BS + 5, nb = N + 1;
	int32_t out[N + 1], outh[KV * (N + 1)], out2[N + 1], outh2[KV * (N + 1)];
	int64_t count = -1, hcounts[KV], count2 = -1, hcounts2[KV];
	st = ucmgo_select(sel, "req-a", 1, 0, q, QH * HD, ids, N, seq, out, nb, &count, outh, hcounts);
	CHECK(st == UCMGO_OK, "select: %d", st);
	CHECK(count > 0 && count < nb, "a selection, not dense: %lld of %lld", (long long)count, (long long)nb);
	for (int64_t i = 1; i < count; i++) CHECK(out[i] > out[i - 1], "blocks not ascending");
	CHECK(out[0] == 0 && out[count - 1] == nb - 1, "the windows: first %d last %d", out[0], out[count - 1]);
	for (int h = 0; h < KV; h++) CHECK(hcounts[h] > 0 && hcounts[h] <= count, "head %d: %lld blocks", h, (long long)hcounts[h]);

	int64_t stask = ucmgo_select_submit(sel, "req-b", 1, 0, q, QH * HD, ids, N, seq, out2, nb, &count2, outh2, hcounts2);
	CHECK(stask > 0, "select_submit: %lld", (long long)stask);
	CHECK(ucmgo_select_wait(sel, stask) == UCMGO_OK, "select_wait");
	CHECK(ucmgo_select_wait(sel, stask) == UCMGO_OK, "select_wait again");
	int32_t fin = -1;
	CHECK(ucmgo_select_check(sel, stask, &fin) == UCMGO_OK && fin == 1, "select_check: %d", fin);
	CHECK(count2 == count && memcmp(out, out2, sizeof(int32_t) * (size_t)count) == 0, "async selection differs");
	for (int h = 0; h < KV; h++)
		CHECK(hcounts2[h] == hcounts[h] && memcmp(outh + h * nb, outh2 + h * nb, sizeof(int32_t) * (size_t)hcounts[h]) == 0,
		      "head %d differs", h);
	CHECK(ucmgo_select_release(sel, stask) == UCMGO_OK, "release");
	EXPECT_STATUS(ucmgo_select_release(sel, stask), UCMGO_ENOOBJ, "already released");
	EXPECT_STATUS(ucmgo_select_check(sel, stask, &fin), UCMGO_ENOOBJ, "already released");
	CHECK(ucmgo_selector_request_finished(sel, "req-a") == UCMGO_OK, "request_finished");

	// ESA's retrieval reading the representations from the store by block id equals the
	// retriever's over the matrix ucmgo_reprs_load returns, the block without one left out.
	{
		enum { B = 2, D = KV * HD, K = 5 };
		float rq[B * D];
		for (int i = 0; i < B * D; i++) rq[i] = (float)((i * 5) % 7) - 3;
		int32_t sidx[B * 2 * N], midx[B * 2 * N];
		float ssc[B * 2 * N], msc[B * 2 * N];
		int64_t scount[B], mcount[B];
		uint8_t sfound[N + 1];
		memset(sfound, 7, sizeof sfound);
		st = ucmgo_selector_retrieve_dot(sel, 2, ids, N + 1, rq, B, D, NULL, 0, K, 2, sidx, ssc, scount, sfound);
		CHECK(st == UCMGO_OK, "selector_retrieve_dot: %d", st);
		for (int i = 0; i <= N; i++) CHECK(sfound[i] == (i < N), "retrieve found[%d] = %d", i, sfound[i]);
		CHECK(ucmgo_reprs_load(sel, 2, ids, N + 1, dst, D, found) == UCMGO_OK, "reprs_load layer 2");
		int32_t every[B * N];
		for (int i = 0; i < B * N; i++) every[i] = i % N; // the stored blocks only
		int64_t ret = ucmgo_retriever_new(1, NULL, 0);
		CHECK(ret > 0, "retriever_new: %lld", (long long)ret);
		for (int k = K; k <= 2 * N; k += 2 * N - K) { // topk 5, and 24: more than the 12 with one
			ucmgo_retrieval a;
			memset(&a, 0, sizeof a);
			a.size = sizeof a;
			a.method = UCMGO_RM_DOT;
			a.topk = k;
			a.batch = B;
			a.dim = D;
			a.q = rq;
			a.reprs = dst;
			a.n_reprs = N + 1;
			a.cand = every;
			a.cand_width = N;
			a.out_idx = midx;
			a.out_scores = msc;
			a.out_count = mcount;
			CHECK(ucmgo_retrieve(ret, &a) == UCMGO_OK, "retrieve over the matrix, topk %d", k);
			st = ucmgo_selector_retrieve_dot(sel, 2, ids, N + 1, rq, B, D, NULL, 0, k, 1, sidx, ssc, scount, NULL);
			CHECK(st == UCMGO_OK, "selector_retrieve_dot topk %d: %d", k, st);
			for (int b = 0; b < B; b++) {
				CHECK(scount[b] == (k < N ? k : N) && scount[b] == mcount[b], "topk %d row %d: count %lld, matrix %lld", k, b,
				      (long long)scount[b], (long long)mcount[b]);
				for (int j = 0; j < k; j++) {
					int x = b * k + j;
					CHECK(sidx[x] == midx[x] && (ssc[x] == msc[x] || (isinf(ssc[x]) && isinf(msc[x]))),
					      "topk %d row %d entry %d: store %d %g, matrix %d %g", k, b, j, sidx[x], ssc[x], midx[x], msc[x]);
					if (j >= N) CHECK(sidx[x] == -1 && isinf(ssc[x]) && ssc[x] < 0, "topk %d row %d entry %d: not padding", k, b, j);
				}
			}
		}
		CHECK(ucmgo_retriever_free(ret) == UCMGO_OK, "retriever_free");
		// Candidates: the block without a representation and padding are none.
		int32_t cand[B * 4] = {N, 3, -1, 5, 0, N, N, -1};
		st = ucmgo_selector_retrieve_dot(sel, 2, ids, N + 1, rq, B, D, cand, 4, 3, 1, sidx, ssc, scount, NULL);
		CHECK(st == UCMGO_OK && scount[0] == 2 && scount[1] == 1, "candidates: %d, counts %lld %lld", st, (long long)scount[0],
		      (long long)scount[1]);
		CHECK((sidx[0] == 3 || sidx[0] == 5) && (sidx[1] == 3 || sidx[1] == 5) && sidx[0] != sidx[1] && sidx[2] == -1, "row 0: %d %d %d",
		      sidx[0], sidx[1], sidx[2]);
		CHECK(sidx[3] == 0 && sidx[4] == -1, "row 1: %d %d", sidx[3], sidx[4]);
		// Bad input: EPARAM naming the argument.
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, rq, B, D - 1, NULL, 0, K, 1, sidx, ssc, scount, NULL), UCMGO_EPARAM, "dim 31");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 9, ids, N, rq, B, D, NULL, 0, K, 1, sidx, ssc, scount, NULL), UCMGO_EPARAM, "layer 9");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, rq, B, D, NULL, 0, K, 0, sidx, ssc, scount, NULL), UCMGO_EPARAM, "workers 0");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, rq, B, D, NULL, 0, -1, 1, sidx, ssc, scount, NULL), UCMGO_EPARAM, "topk -1");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, rq, -2, D, NULL, 0, K, 1, sidx, ssc, scount, NULL), UCMGO_EPARAM, "batch -2");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, NULL, B, D, NULL, 0, K, 1, sidx, ssc, scount, NULL), UCMGO_EPARAM, "query");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, rq, B, D, NULL, 0, K, 1, NULL, ssc, scount, NULL), UCMGO_EPARAM, "out_idx");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, rq, B, D, NULL, 0, K, 1, sidx, ssc, scount, (uint8_t *)8), UCMGO_EPARAM, "found");
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, NULL, N, rq, B, D, NULL, 0, K, 1, sidx, ssc, scount, NULL), UCMGO_EPARAM, "block ids");
		int32_t outside[B * 4] = {0, 1, 2, 3, 4, N, 6, 7}; // N is outside [-1, N) over N blocks
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(sel, 2, ids, N, rq, B, D, outside, 4, K, 1, sidx, ssc, scount, NULL), UCMGO_EPARAM,
		              "row 1, column 1");
	}

	// Precomputed representations on a second selector (Quest: min and max rows).
	int64_t quest = ucmgo_selector_open(store, "{\"ucm_sparse_config\": {\"Quest\": {}}}", shape);
	CHECK(quest > 0, "quest selector");
	CHECK(ucmgo_reprs_shape(quest, &layers, &rows, &heads, &cols, &kind) == UCMGO_OK && rows == 2 && kind == UCMGO_REPR_QUEST, "quest shape");
	{
		float rq[2 * KV * HD] = {0};
		int32_t ri[1];
		float rs[1];
		EXPECT_STATUS(ucmgo_selector_retrieve_dot(quest, 0, ids, 1, rq, 1, 2 * KV * HD, NULL, 0, 1, 1, ri, rs, NULL, NULL), UCMGO_EPARAM,
		              "not one row per block");
	}
	static float put[2][SHARDS * 2 * KV * HD];
	for (int b = 0; b < 2; b++)
		for (int j = 0; j < SHARDS * 2 * KV * HD; j++) put[b][j] = (float)((j * 13 + b) % 31) / 8 - 2;
	task = ucmgo_reprs_put(quest, ids, 2, &put[0][0], SHARDS * 2 * KV * HD);
	CHECK(task > 0 && ucmgo_wait(store, task, NULL, 0) == UCMGO_OK, "reprs_put");
	static float back[2 * 2 * KV * HD];
	CHECK(ucmgo_reprs_load(quest, 3, ids, 2, back, 2 * KV * HD, found) == UCMGO_OK && found[0] && found[1], "quest load");
	for (int b = 0; b < 2; b++)
		CHECK(memcmp(back + b * 2 * KV * HD, put[b] + 3 * 2 * KV * HD, sizeof(float) * 2 * KV * HD) == 0, "quest block %d layer 3 differs", b);

	// Bad input: EPARAM naming the field.
	EXPECT_STATUS(ucmgo_selector_open(store, "ESA: {}", "{\"layers\": 4}"), UCMGO_EPARAM, "shape: kv heads 0");
	EXPECT_STATUS(ucmgo_selector_open(store, "ESA: {}", "{\"layers\": 4, \"heads\": 2}"), UCMGO_EPARAM, "unknown field \"heads\"");
	EXPECT_STATUS(ucmgo_selector_open(store, "Nope: {}", shape), UCMGO_EPARAM, "ucm_sparse_config.Nope");
	EXPECT_STATUS(ucmgo_selector_open(store, "ESA: {sparse_ratio: 2}", shape), UCMGO_EPARAM, "sparse_ratio");
	EXPECT_STATUS(ucmgo_selector_open(store, NULL, shape), UCMGO_EPARAM, "sparse config");
	EXPECT_STATUS(ucmgo_selector_open(store + 1000, "ESA: {}", shape), UCMGO_EPARAM, "store handle");
	EXPECT_STATUS(ucmgo_reprs_dump(sel, ids, 1, kaddrs, 3, UCMGO_DTYPE_FLOAT16), UCMGO_EPARAM, "addrs_per_block 3");
	EXPECT_STATUS(ucmgo_reprs_dump(sel, ids, 1, kaddrs, SHARDS, 9), UCMGO_EPARAM, "k_dtype 9");
	void *badk[SHARDS] = {kaddrs[0], (void *)8, kaddrs[2], kaddrs[3]};
	EXPECT_STATUS(ucmgo_reprs_dump(sel, ids, 1, badk, SHARDS, UCMGO_DTYPE_FLOAT16), UCMGO_EPARAM, "layer 1: K address");
	EXPECT_STATUS(ucmgo_reprs_put(quest, ids, 1, &put[0][0], 7), UCMGO_EPARAM, "floats_per_block 7");
	EXPECT_STATUS(ucmgo_reprs_load(sel, 9, ids, 1, dst, KV * HD, found), UCMGO_EPARAM, "layer 9");
	EXPECT_STATUS(ucmgo_reprs_load(sel, 0, ids, 1, NULL, KV * HD, found), UCMGO_EPARAM, "destination");
	EXPECT_STATUS(ucmgo_select(sel, "r", 0, 0, q, QH * HD, ids, N, seq, out, nb - 1, &count, NULL, NULL), UCMGO_EPARAM, "out_capacity");
	EXPECT_STATUS(ucmgo_select(sel, "r", 0, 0, NULL, QH * HD, ids, N, seq, out, nb, &count, NULL, NULL), UCMGO_EPARAM, "query");
	EXPECT_STATUS(ucmgo_select(sel, "r", 0, 0, q, QH * HD - 1, ids, N, seq, out, nb, &count, NULL, NULL), UCMGO_EPARAM, "query of 63");
	EXPECT_STATUS(ucmgo_select(sel, "r", 7, 0, q, QH * HD, ids, N, seq, out, nb, &count, NULL, NULL), UCMGO_EPARAM, "layer 7");
	EXPECT_STATUS(ucmgo_select(sel, NULL, 0, 0, q, QH * HD, ids, N, seq, out, nb, &count, NULL, NULL), UCMGO_EPARAM, "request id");
	EXPECT_STATUS(ucmgo_select(sel, "r", 0, 0, q, QH * HD, ids, N, 16, out, nb, &count, NULL, NULL), UCMGO_EPARAM, "12 block ids for seq_len 16");
	EXPECT_STATUS(ucmgo_select(sel, "r", 0, 0, q, QH * HD, ids, N, seq, out, nb, &count, outh, NULL), UCMGO_EPARAM, "both or neither");
	EXPECT_STATUS(ucmgo_select_wait(sel, 0), UCMGO_EPARAM, "task 0");
	EXPECT_STATUS(ucmgo_select_wait(sel, 12345), UCMGO_ENOOBJ, "task 12345");

	CHECK(ucmgo_selector_close(quest) == UCMGO_OK, "close quest");
	EXPECT_STATUS(ucmgo_selector_close(quest), UCMGO_EPARAM, "not open");
	CHECK(ucmgo_close(store) == UCMGO_OK, "close store");
	// Closing the store closed its selectors.
	EXPECT_STATUS(ucmgo_select(sel, "r", 0, 0, q, QH * HD, ids, N, seq, out, nb, &count, NULL, NULL), UCMGO_EPARAM, "selector handle");
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
