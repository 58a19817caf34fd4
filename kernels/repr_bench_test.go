package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkRepr measures each representation kernel on one layer of one block, in bytes of K
// consumed per second: go test -run '^$' -bench Repr -cpu 1 ./kernels/
func BenchmarkRepr(b *testing.B) {
	const heads, dim = 8, 128
	enc, err := NewHashEncoder(dim, 128, 0)
	if err != nil {
		b.Fatal(err)
	}
	kv := KVStarParams{BlockSize: 128, PruneRatio: 0.5, Merge: 4}
	for _, dt := range []DType{Float16, BFloat16} {
		for _, tokens := range []int{128, 16} {
			s := KShape{tokens, heads, dim}
			k := randK(rand.New(rand.NewPCG(1, uint64(tokens))), dt, s)
			n := heads * dim
			out := make([]float32, s.Elems())
			mean, max := make([]float32, n), make([]float32, n)
			mm := make([]float32, 2*n)
			kvOut := make([]float32, kv.Rows(tokens)*heads*kv.KeptDims(dim))
			kvCh := make([]uint16, heads*kv.KeptDims(dim))
			codes := make([]byte, tokens*heads*enc.CodeBytes())
			run := func(name string, f func() error) {
				b.Run(fmt.Sprintf("%s/%v/%dx%dx%d", name, dt, tokens, heads, dim), func(b *testing.B) {
					b.SetBytes(int64(len(k)))
					b.ReportAllocs()
					for b.Loop() {
						if err := f(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			run("decode", func() error { return DecodeFloat32(out, k, dt) })
			run("esa-mean", func() error { return ESAPool(mean, nil, k, dt, s) })
			run("esa-max", func() error { return ESAPool(nil, max, k, dt, s) })
			run("esa-mean+max", func() error { return ESAPool(mean, max, k, dt, s) })
			run("quest", func() error { return QuestMinMax(mm, k, dt, s) })
			run("kvstar-0.5-4", func() error { return KVStar(kvOut, kvCh, k, dt, s, kv) })
			run("hash-128", func() error { return HashBlock(codes, k, dt, s, enc) })
		}
	}
}

// BenchmarkReprHamming measures Hamming distances of 128-bit codes, in code bytes per second.
func BenchmarkReprHamming(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	codes := make([]byte, 1<<16)
	for i := range codes {
		codes[i] = byte(rng.Uint32())
	}
	q := codes[:16]
	b.SetBytes(int64(len(codes)))
	sum := 0
	for b.Loop() {
		for i := 0; i < len(codes); i += 16 {
			sum += Hamming(q, codes[i:i+16])
		}
	}
	_ = sum
}
