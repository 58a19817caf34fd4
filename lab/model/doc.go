// Package model is UCM-Go's small real model: a byte-level Llama-architecture decoder (RoPE,
// grouped-query attention, RMSNorm, SwiGLU) trained on the Go standard library's source by
// train.py, with its forward pass in Go on a paged fp16 KV cache laid out as vLLM's
// FlashAttention backend lays out its own: per layer [2, num_blocks, block_size, kv_heads,
// head_dim], K stored after RoPE.
//
// It exists so that KV representations, compression and sparse attention are judged on real
// KV. The weights (weights/model.ucmw, fp16, ≈6 MB) and their manifest are committed; CI never
// trains. docs/model.md describes the architecture, the weight file format and the training run.
//
// A forward step writes the K/V of its tokens into the cache through the sequence's slot
// mapping and then attends by reading K/V back through the block table, so a prefill in one
// call, in chunks, or token by token computes bit-identical logits, and so does any
// permutation of the physical blocks.
package model
