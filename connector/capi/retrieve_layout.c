// The layout of ucmgo_retrieval (ucmgo.h) as the C compiler sees it: retrieve.go's Go mirror
// of the struct is checked against it (retrieve_test.go), and the method and dtype constants
// against its values.
#include <stddef.h>
#include "ucmgo.h"

_Static_assert(UCMGO_RM_DOT == 1, "retrieve.go's rmDot");
_Static_assert(UCMGO_RM_MAXDOT == 2, "retrieve.go's rmMaxDot");
_Static_assert(UCMGO_RM_SOFTMAX == 3, "retrieve.go's rmSoftmax");
_Static_assert(UCMGO_DTYPE_FLOAT16 == 1 && UCMGO_DTYPE_FLOAT32 == 5, "retrieve.go's dtypes");

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
	out[12] = offsetof(ucmgo_retrieval, q_dtype);
	out[13] = offsetof(ucmgo_retrieval, r_dtype);
	out[14] = offsetof(ucmgo_retrieval, q_heads);
	out[15] = offsetof(ucmgo_retrieval, kv_heads);
	out[16] = offsetof(ucmgo_retrieval, rows_per_block);
	out[17] = offsetof(ucmgo_retrieval, channels);
	out[18] = offsetof(ucmgo_retrieval, kept);
	out[19] = offsetof(ucmgo_retrieval, row_topk);
	out[20] = offsetof(ucmgo_retrieval, init);
	out[21] = offsetof(ucmgo_retrieval, local);
	return sizeof(ucmgo_retrieval);
}
