// Package ucmhash turns the token ids of a prompt into the chain of block ids a store is
// addressed by, as UCM's connectors do: id[i] depends on id[i-1] and the tokens of block i, so
// two prompts with the same first n full blocks get the same first n ids, and a trailing
// partial block gets none.
//
// Two schemes are implemented (engine.HashScheme names them; a store records which one its ids
// were computed with in its Schema):
//
//   - engine.HashSchemeUCMGo: seed = MD5("UCMHASHSEED" ‖ meta), id[i] = MD5(id[i-1] ‖ LE32 of
//     each token of block i). The default.
//   - engine.HashSchemeUCMPickle: bit-compatible with UCM's Python RequestHasher, so a store
//     serves blocks UCM dumped: hasher(x) = MD5(meta ‖ pickle.dumps(x, protocol=5)), seed =
//     hasher("UCM_HASH_SEED"), id[i] = hasher((id[i-1], tuple(tokens of block i))). The pickle
//     encoder is checked byte for byte against CPython (testdata/hasher/vectors.json, written by
//     gen_vectors.py).
//
// meta is "model:tp_size:dtype:rank" (HashMeta). Hasher.ForRank derives a tensor-parallel
// rank's id from the rank-0 id, as UCM's workers of non-MLA models do.
//
// A Hasher is immutable after NewHasher and safe for concurrent use.
//
//	h, err := ucmhash.NewHasher(ucmhash.HashMeta{Model: "Qwen/Qwen2.5-7B-Instruct", TPSize: 1,
//		DType: "torch.bfloat16"}, engine.HashSchemeUCMGo, 16)
//	ids := h.BlockIDs(tokens, nil)        // one id per full block of 16 tokens
//	more := h.BlockIDs(next, &ids[len(ids)-1]) // continue the chain
//
// The engine itself never hashes: it treats block ids as opaque 16-byte names.
package ucmhash
