package kernels

import (
	"fmt"
	"testing"
)

// BenchmarkDecodeSidecarPart: verifying (and converting) the ESA mean parts a cold selection
// step reads, 1,021 blocks × 32 heads × 128 dims (8 MiB), against one copy of the same bytes.
//
//	GOMAXPROCS=1 flock /tmp/ucm-bench.lock go test -run '^$' -bench DecodeSidecarPart -benchtime 50x ./kernels/
func BenchmarkDecodeSidecarPart(b *testing.B) {
	const blocks = 1021
	for _, elem := range []DType{Float16, BFloat16} {
		spec := SidecarSpec{Kind: SidecarESAMean, Layers: 1, Heads: 32, Dim: 128, BlockSize: 128, Elem: elem}
		p, err := makePayload(spec, Float16, spec.BlockSize, func(l int) []byte {
			return goldenK(KShape{spec.BlockSize, spec.Heads, spec.Dim}, l)
		})
		if err != nil {
			b.Fatal(err)
		}
		pb := spec.PartBytes()
		parts := make([]byte, blocks*pb)
		for j := range blocks {
			copy(parts[j*pb:], p)
		}
		values := make([]float32, spec.Heads*spec.Dim)
		for _, c := range []struct {
			name string
			out  []float32 // nil: verify only
		}{{"verify", nil}, {"convert", values}} {
			b.Run(fmt.Sprintf("%v-%s", elem, c.name), func(b *testing.B) {
				b.SetBytes(int64(len(parts)))
				for range b.N {
					for j := range blocks {
						if _, _, err := DecodeSidecarPart(parts[j*pb:(j+1)*pb], c.out, nil); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
		dst := make([]byte, len(parts))
		b.Run(fmt.Sprintf("%v-copy", elem), func(b *testing.B) {
			b.SetBytes(int64(len(parts)))
			for range b.N {
				copy(dst, parts)
			}
		})
	}
}
