// retrieve.c drives the retriever ABI through ucmgo.h as a C program would (retrieve_test.go
// builds and runs it): a DOT retrieval checked against a brute-force reference, asynchronous
// and synchronous, the task states, and bad fields, each refused with UCMGO_EPARAM naming it;
// MAXDOT and SOFTMAX retrievals against brute-force references, and their bad fields.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ucmgo.h"
#include "check.h"

#define B 2
#define DIM 24
#define ROWS 300
#define WIDTH 200
#define K 17

// MAXDOT: two requests of 4 query heads over 2 KV heads, 2 rows per block and head, over 40
// blocks: request 0 the run 5 … 34, request 1 a scattered list padded with -1; small integers
// (exact means and dots, ties many), UCM's windows, each request its own length.
#define MB 40
#define MQH 4
#define MKV 2
#define MM 2
#define MD 8
#define MW 30
#define MOUT 12

static void maxdot(int64_t r) {
	static float q[2 * MQH * MD], reprs[MB * MKV * MM * MD];
	static int32_t cand[2 * MW], out[2 * MOUT], topks[2] = {7, 2};
	static int64_t count[2];
	for (int i = 0; i < 2 * MQH * MD; i++) q[i] = (float)((i * 5) % 7 - 3);
	for (int i = 0; i < MB * MKV * MM * MD; i++) reprs[i] = (float)((i * 11 + i / 5) % 5 - 2);
	for (int j = 0; j < MW; j++) {
		cand[j] = 5 + j;
		cand[MW + j] = j < 20 ? (int32_t)((j * 17 + 3) % MB) : -1;
	}
	for (int i = 0; i < 2 * MOUT; i++) out[i] = 99;
	ucmgo_retrieval a;
	memset(&a, 0, sizeof a);
	a.size = sizeof a;
	a.method = UCMGO_RM_MAXDOT;
	a.topk = MOUT;
	a.batch = 2;
	a.dim = MD;
	a.q = q;
	a.reprs = reprs;
	a.n_reprs = MB;
	a.cand = cand;
	a.cand_width = MW;
	a.out_idx = out;
	a.out_count = count;
	a.q_heads = MQH;
	a.kv_heads = MKV;
	a.rows_per_block = MM;
	a.row_topk = topks;
	a.init = 1;
	a.local = 2;
	int64_t task = ucmgo_retrieve_submit(r, &a);
	CHECK(task > 0, "maxdot submit: %lld", (long long)task);
	CHECK(ucmgo_retrieve_release(r, task) == UCMGO_OK, "maxdot release");
	for (int b = 0; b < 2; b++) {
		int n = b == 0 ? MW : 20, k = topks[b], g = MQH / MKV;
		double s[MW];
		for (int j = 0; j < n; j++) {
			int blk = cand[b * MW + j];
			s[j] = 0;
			for (int h = 0; h < MKV; h++) {
				double best = -INFINITY;
				for (int m = 0; m < MM; m++) {
					double dot = 0;
					for (int d = 0; d < MD; d++) {
						double mean = 0;
						for (int x = 0; x < g; x++) mean += q[(b * MQH + h * g + x) * MD + d];
						dot += mean / g * reprs[((blk * MKV + h) * MM + m) * MD + d];
					}
					if (dot > best) best = dot;
				}
				s[j] += best;
			}
		}
		// UCM's order: 0, n-2, n-1, then the k-3 best of 1 … n-3, ties to the earlier.
		int want[MOUT], w = 0, used[MW] = {0};
		want[w++] = 0;
		want[w++] = n - 2;
		want[w++] = n - 1;
		for (int i = 0; i < k - 3; i++) {
			int best = -1;
			for (int j = 1; j < n - 2; j++)
				if (!used[j] && (best < 0 || s[j] > s[best])) best = j;
			used[best] = 1;
			want[w++] = best;
		}
		CHECK(count[b] == w, "maxdot request %d: count %lld, want %d", b, (long long)count[b], w);
		for (int i = 0; i < MOUT; i++)
			CHECK(out[b * MOUT + i] == (i < w ? want[i] : 99), "maxdot request %d entry %d: %d, want %d", b, i,
			      out[b * MOUT + i], i < w ? want[i] : 99);
	}
	ucmgo_retrieval bad = a;
	bad.topk = 5;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "request 0 selects 7 entries");
	bad = a;
	bad.kv_heads = 3;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.q_heads");
	bad = a;
	bad.out_scores = (float *)out;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.out_scores: not used by UCMGO_RM_MAXDOT");
	bad = a;
	bad.r_dtype = UCMGO_DTYPE_FLOAT16;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.r_dtype");
	bad = a;
	bad.row_topk = (const int32_t *)(uintptr_t)5;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.row_topk");
}

// float16 bits from a float (values here are exact in float16), and back.
static uint16_t f16(float f) {
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
	if (e == 0) return (uint16_t)sign;
	return (uint16_t)(sign | ((e - 112) << 10) | (m >> 13));
}
static double f32of16(uint16_t h) {
	int e = (h >> 10) & 0x1f, m = h & 0x3ff;
	double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
	return (h & 0x8000) ? -v : v;
}

// SOFTMAX: 2 tokens of 4 query heads of 12 channels over 2 KV heads keeping 8 each, 3 rows per
// block, 25 blocks; the block scores against a float64 reference.
#define SX 2
#define SH 4
#define SKV 2
#define SQD 12
#define SD 8
#define SM 3
#define SN 25
#define SK 6

static void softmax(int64_t r) {
	static uint16_t q[SX * SH * SQD], reprs[SN * SM * SKV * SD];
	static int64_t channels[SKV * SD], count;
	static int32_t out[SK + 2];
	for (int i = 0; i < SX * SH * SQD; i++) q[i] = f16((float)((i * 7) % 9 - 4) / 8);
	for (int i = 0; i < SN * SM * SKV * SD; i++) reprs[i] = f16((float)((i * 13 + i / 3) % 11 - 5) / 4);
	for (int i = 0; i < SKV * SD; i++) channels[i] = (i * 5 + i / SD) % SQD;
	ucmgo_retrieval a;
	memset(&a, 0, sizeof a);
	a.size = sizeof a;
	a.method = UCMGO_RM_SOFTMAX;
	a.q_dtype = UCMGO_DTYPE_FLOAT16;
	a.topk = SK + 2;
	a.batch = SX;
	a.dim = SQD;
	a.q = q;
	a.reprs = reprs;
	a.n_reprs = SN;
	a.out_idx = out;
	a.out_count = &count;
	a.q_heads = SH;
	a.kv_heads = SKV;
	a.rows_per_block = SM;
	a.channels = channels;
	a.kept = SD;
	CHECK(ucmgo_retrieve(r, &a) == UCMGO_OK, "softmax retrieve");
	double score[SN] = {0};
	for (int x = 0; x < SX; x++)
		for (int hq = 0; hq < SH; hq++) {
			int h = hq / (SH / SKV);
			double y[SN * SM], mx = -INFINITY, sum = 0;
			for (int row = 0; row < SN * SM; row++) {
				y[row] = 0;
				for (int i = 0; i < SD; i++)
					y[row] += f32of16(q[(x * SH + hq) * SQD + channels[h * SD + i]]) * f32of16(reprs[(row * SKV + h) * SD + i]);
				if (y[row] > mx) mx = y[row];
			}
			for (int row = 0; row < SN * SM; row++) sum += (y[row] = exp(y[row] - mx));
			for (int row = 0; row < SN * SM; row++) score[row / SM] += y[row] / sum;
		}
	int used[SN] = {0};
	CHECK(count == SK + 2, "softmax count %lld", (long long)count);
	for (int i = 0; i < SK + 2; i++) {
		int best = -1;
		for (int b = 0; b < SN; b++)
			if (!used[b] && (best < 0 || score[b] > score[best])) best = b;
		used[best] = 1;
		CHECK(out[i] == best, "softmax entry %d: block %d, want %d (%g)", i, out[i], best, score[best]);
	}
	ucmgo_retrieval bad = a;
	bad.q_dtype = UCMGO_DTYPE_FLOAT32;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.q_dtype");
	int64_t wild[SKV * SD];
	memcpy(wild, channels, sizeof wild);
	wild[SD + 3] = SQD;
	bad = a;
	bad.channels = wild;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "channel 12 (KV head 1, column 3)");
	bad = a;
	bad.channels = NULL;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.kept");
	bad = a;
	bad.row_topk = (const int32_t *)out;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.row_topk: not used by UCMGO_RM_SOFTMAX");
	// More than the blocks: every block, then -1.
	a.topk = SK + 2;
	a.n_reprs = 5;
	CHECK(ucmgo_retrieve(r, &a) == UCMGO_OK && count == 5 && out[5] == -1 && out[7] == -1, "softmax k > n: %lld", (long long)count);
}

int main(void) {
	static float q[B * DIM], reprs[ROWS * DIM], scores[B * K];
	static int32_t cand[B * WIDTH], idx[B * K];
	static int64_t count[B];
	// Small integers: every dot product is exact in float32, and ties are many.
	for (int i = 0; i < B * DIM; i++) q[i] = (float)((i * 7) % 5 - 2);
	for (int i = 0; i < ROWS * DIM; i++) reprs[i] = (float)((i * 13 + i / 7) % 3 - 1);
	for (int i = 0; i < B * WIDTH; i++) cand[i] = (i % 11 == 0) ? -1 : (int32_t)((i * 37) % ROWS);

	int64_t r = ucmgo_retriever_new(2, NULL, 0);
	CHECK(r > 0, "retriever_new: %lld", (long long)r);
	ucmgo_retrieval a;
	memset(&a, 0, sizeof a);
	a.size = sizeof a;
	a.method = UCMGO_RM_DOT;
	a.topk = K;
	a.batch = B;
	a.dim = DIM;
	a.q = q;
	a.reprs = reprs;
	a.n_reprs = ROWS;
	a.cand = cand;
	a.cand_width = WIDTH;
	a.out_idx = idx;
	a.out_scores = scores;
	a.out_count = count;

	int64_t task = ucmgo_retrieve_submit(r, &a);
	CHECK(task > 0, "submit: %lld", (long long)task);
	CHECK(ucmgo_retrieve_wait(r, task) == UCMGO_OK, "wait");
	CHECK(ucmgo_retrieve_wait(r, task) == UCMGO_OK, "second wait");
	int32_t finished = 0;
	CHECK(ucmgo_retrieve_check(r, task, &finished) == UCMGO_OK && finished == 1, "check: %d", finished);
	CHECK(ucmgo_retrieve_release(r, task) == UCMGO_OK, "release");
	EXPECT_STATUS(ucmgo_retrieve_release(r, task), UCMGO_ENOOBJ, "no such retrieval task");
	EXPECT_STATUS(ucmgo_retrieve_check(r, task, &finished), UCMGO_ENOOBJ, "no such retrieval task");

	// The reference: for each row, the K best by score, ties to the earlier candidate.
	for (int b = 0; b < B; b++) {
		float s[WIDTH];
		int used[WIDTH] = {0}, valid = 0;
		for (int j = 0; j < WIDTH; j++) {
			int32_t c = cand[b * WIDTH + j];
			s[j] = 0;
			if (c < 0) { used[j] = 1; continue; }
			valid++;
			for (int d = 0; d < DIM; d++) s[j] += q[b * DIM + d] * reprs[c * DIM + d];
		}
		CHECK(count[b] == (valid < K ? valid : K), "row %d count %lld", b, (long long)count[b]);
		for (int i = 0; i < K; i++) {
			int best = -1;
			for (int j = 0; j < WIDTH; j++)
				if (!used[j] && (best < 0 || s[j] > s[best])) best = j;
			used[best] = 1;
			CHECK(idx[b * K + i] == cand[b * WIDTH + best] && scores[b * K + i] == s[best],
			      "row %d entry %d: (%d, %g), want (%d, %g)", b, i, idx[b * K + i], scores[b * K + i],
			      cand[b * WIDTH + best], s[best]);
		}
	}

	// Synchronous: the same results.
	int32_t idx2[B * K];
	memcpy(idx2, idx, sizeof idx);
	memset(idx, 0, sizeof idx);
	CHECK(ucmgo_retrieve(r, &a) == UCMGO_OK, "retrieve");
	CHECK(memcmp(idx, idx2, sizeof idx) == 0, "retrieve differs from the task");

	// Bad fields: refused at submit, naming the field.
	ucmgo_retrieval bad = a;
	bad.size = sizeof a - 8;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.size");
	bad = a;
	bad.method = 7;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.method");
	bad = a;
	bad.dim = 0;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.dim");
	bad = a;
	bad.topk = -1;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.topk");
	bad = a;
	bad.q = NULL;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.q");
	bad = a;
	bad.out_scores = (float *)(uintptr_t)5;
	EXPECT_STATUS(ucmgo_retrieve(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.out_scores");
	bad = a;
	bad.batch = 1LL << 40;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.batch");
	int32_t wild[B * WIDTH];
	memcpy(wild, cand, sizeof wild);
	wild[WIDTH + 5] = ROWS; // one past the last row
	bad = a;
	bad.cand = wild;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "row 1, column 5");
	EXPECT_STATUS(ucmgo_retrieve_submit(r, NULL), UCMGO_EPARAM, "ucmgo_retrieval");
	EXPECT_STATUS(ucmgo_retrieve_submit(r + 100, &a), UCMGO_EPARAM, "retriever handle");
	EXPECT_STATUS(ucmgo_retrieve_wait(r, 0), UCMGO_EPARAM, "not a task handle");
	EXPECT_STATUS(ucmgo_retrieve_check(r, 1, NULL), UCMGO_EPARAM, "finished");
	EXPECT_STATUS(ucmgo_retriever_new(0, NULL, 0), UCMGO_EPARAM, "workers");

	bad = a;
	bad.init = 1;
	EXPECT_STATUS(ucmgo_retrieve_submit(r, &bad), UCMGO_EPARAM, "ucmgo_retrieval.init: not used by UCMGO_RM_DOT");

	maxdot(r);
	softmax(r);

	CHECK(ucmgo_retriever_free(r) == UCMGO_OK, "free");
	EXPECT_STATUS(ucmgo_retriever_free(r), UCMGO_EPARAM, "not open");
	if (failures) return 1;
	printf("ok\n");
	return 0;
}
