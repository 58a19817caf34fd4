package kernels

import (
	"encoding/binary"
	"testing"
)

// BenchmarkDotsF16Group: the per-query-head scan of a GQA group (4 query heads of 128 dims per
// KV head, 8 KV heads, 1,024 blocks: ESA's head_score softmax at Llama-3-8B's shape), with the
// row converted once per query head (the general kernel) and once per group (dotsF16x4AVX2).
func BenchmarkDotsF16Group(b *testing.B) {
	if !haveF16FMA {
		b.Skip("no AVX2, FMA and F16C")
	}
	const blocks, heads, group, d = 1024, 8, 4, 128
	q := make([]float32, heads*group*d)
	for i := range q {
		q[i] = float32(i%7) - 3
	}
	v := make([]byte, 2*blocks*heads*d)
	for i := range blocks * heads * d {
		binary.LittleEndian.PutUint16(v[2*i:], Float32ToFloat16(float32(i%13)-6))
	}
	out := make([]float32, heads*group)
	for _, k := range []struct {
		name string
		f    func(out, q *float32, v *byte)
	}{
		{"per-head", func(out, q *float32, v *byte) { dotsF16AVX2(out, q, v, group, d, d, 0) }},
		{"per-group", func(out, q *float32, v *byte) { dotsF16x4AVX2(out, q, v, d, d) }},
	} {
		b.Run(k.name, func(b *testing.B) {
			for range b.N {
				for j := range blocks {
					for h := range heads {
						k.f(&out[h*group], &q[h*group*d], &v[2*(j*heads+h)*d])
					}
				}
			}
		})
	}
}
