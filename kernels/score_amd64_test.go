package kernels

import (
	"encoding/binary"
	"math"
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

// TestDotsF32Assembly checks each assembly kernel the CPU has against float64 sums, and
// against the portable loop on the same inputs (both within rounding of the float64 sum).
func TestDotsF32Assembly(t *testing.T) {
	kernels := map[string]struct {
		have bool
		lane int
		run  func(out, q, v *float32, n, d, qs, vs int)
	}{
		"avx2":   {haveF32FMA, 8, dotsF32AVX2},
		"avx512": {haveF32AVX512, 16, dotsF32AVX512},
	}
	for name, k := range kernels {
		if !k.have {
			t.Logf("%s: not on this CPU", name)
			continue
		}
		ran := 0
		checkDotsF32(t, name, 3, func(out, q, v []float32, d, qs, vs int) {
			if d%k.lane != 0 {
				dotsF32Go(out, q, v, d, qs, vs)
				return
			}
			ran++
			k.run(&out[0], &q[0], &v[0], len(out), d, qs, vs)
			ref := make([]float32, len(out))
			dotsF32Go(ref, q, v, d, qs, vs)
			for i := range out {
				var mag float64
				for j := range d {
					mag += math.Abs(float64(q[i*qs+j]) * float64(v[i*vs+j]))
				}
				if math.Abs(float64(out[i]-ref[i])) > 2e-5*mag+1e-6 {
					t.Fatalf("%s: d %d run %d: %v, portable %v", name, d, i, out[i], ref[i])
				}
			}
		})
		if ran == 0 {
			t.Fatalf("%s: no case took the kernel", name)
		}
	}
}

// TestDotsF16RowsPortable runs TestDotsF16Rows with the two-row kernel off: the row-by-row
// path meets the same float64 sums and maxima.
func TestDotsF16RowsPortable(t *testing.T) {
	if !haveRows4 {
		t.Skip("no AVX2, FMA and F16C: TestDotsF16Rows ran the portable path")
	}
	haveRows4 = false
	defer func() { haveRows4 = true }()
	TestDotsF16Rows(t)
}
