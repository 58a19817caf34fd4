// The layout of ucmgo_retrieval (ucmgo.h) as the C compiler sees it: retrieve.go's Go mirror
// of the struct is checked against it (retrieve_test.go), and UCMGO_RM_DOT against its value.
#include <stddef.h>
#include "ucmgo.h"

_Static_assert(UCMGO_RM_DOT == 1, "retrieve.go's rmDot");

size_t ucmgoi_retrieval_offsets(size_t *out) {
	out[0] = offsetof(ucmgo_retrieval, method);
	out[1] = offsetof(ucmgo_retrieval, topk);
	out[2] = offsetof(ucmgo_retrieval, batch);
	out[3] = offsetof(ucmgo_retrieval, dim);
	out[4] = offsetof(ucmgo_retrieval, q);
	out[5] = offsetof(ucmgo_retrieval, reprs);
	out[6] = offsetof(ucmgo_retrieval, n_reprs);
	out[7] = offsetof(ucmgo_retrieval, cand);
	out[8] = offsetof(ucmgo_retrieval, cand_width);
	out[9] = offsetof(ucmgo_retrieval, out_idx);
	out[10] = offsetof(ucmgo_retrieval, out_scores);
	out[11] = offsetof(ucmgo_retrieval, out_count);
	return sizeof(ucmgo_retrieval);
}
