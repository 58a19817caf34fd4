package kernels

import "golang.org/x/sys/cpu"

// projSignsAVX2 writes the signs of chunks × 32 projections of x (n values) through W
// (row-major, stride floats a row), 4 bytes a chunk, two chunks a pass (hash_amd64.s). n ≥ 1,
// chunks ≥ 1.
//
//go:noescape
func projSignsAVX2(dst *byte, x, w *float32, n, stride, chunks int)

var haveAVX2 = cpu.X86.HasAVX2

// hashSigns sets dst[:k] to the code bytes of the first 8k projections of x, k the largest
// multiple of 4 bytes it can do with the assembly, and returns k (0 without AVX2).
func (e *HashEncoder) hashSigns(dst []byte, x []float32) int {
	chunks := e.hashBits / 32
	if !haveAVX2 || chunks == 0 {
		return 0
	}
	projSignsAVX2(&dst[0], &x[0], &e.w[0], e.inputDim, e.hashBits, chunks)
	return 4 * chunks
}
