// retrieve.c drives the retriever ABI through ucmgo.h as a C program would (retrieve_test.go
// builds and runs it): a DOT retrieval checked against a brute-force reference, asynchronous
// and synchronous, the task states, and bad fields, each refused with UCMGO_EPARAM naming it.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ucmgo.h"

static int failures;

#define CHECK(cond, ...)                                                \
	do {                                                                \
		if (!(cond)) {                                                  \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
			fprintf(stderr, __VA_ARGS__);                               \
			fprintf(stderr, " (last error: %s)\n", ucmgo_last_error()); \
			failures++;                                                 \
		}                                                               \
	} while (0)

#define EXPECT_STATUS(got, status, want)                                                  \
	do {                                                                                  \
		long long g_ = (long long)(got);                                                  \
		CHECK(g_ == (status), "status %lld, want %d", g_, (status));                      \
		CHECK(strstr(ucmgo_last_error(), (want)) != NULL, "message lacks \"%s\"", (want)); \
	} while (0)

#define B 2
#define DIM 24
#define ROWS 300
#define WIDTH 200
#define K 17

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
	bad.method = 2;
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
	EXPECT_STATUS(ucmgo_retrieve_wait(r, 0), UCMGO_EPARAM, "task handles are > 0");
	EXPECT_STATUS(ucmgo_retrieve_check(r, 1, NULL), UCMGO_EPARAM, "finished");
	EXPECT_STATUS(ucmgo_retriever_new(0, NULL, 0), UCMGO_EPARAM, "workers");

	CHECK(ucmgo_retriever_free(r) == UCMGO_OK, "free");
	EXPECT_STATUS(ucmgo_retriever_free(r), UCMGO_EPARAM, "not open");
	if (failures) return 1;
	printf("ok\n");
	return 0;
}
