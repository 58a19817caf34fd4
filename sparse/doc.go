// Package sparse will hold the sparse-attention methods (ESA, GSA, GSA On-Device, KVStar,
// Blend, ReRoPE) built on the engine and the kernels.
package sparse
