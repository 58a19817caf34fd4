package tiers

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ucm-go/ucm/format"
)

// copyCheck3 copies exactly and returns format.Checksum of each part, for every length from 0
// to past a few words and at unaligned offsets, and for part sizes the memory tier serves.
func TestCopyCheck3(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	lengths := []int{2048, 2112, 4160, 8192, 16448, 65536 + 5}
	for n := 0; n <= 70; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		for _, shift := range []int{0, 1, 3, 7} {
			var src, dst [3][]byte
			for i := range src {
				src[i] = make([]byte, n+shift+8)
				for j := range src[i] {
					src[i][j] = byte(rng.Uint32())
				}
				src[i] = src[i][shift : shift+n]
				// The destinations are longer than the parts: the bytes past n stay untouched.
				dst[i] = bytes.Repeat([]byte{0xA5}, n+8)[(i*shift)%8:]
			}
			c0, c1, c2 := copyCheck3(dst[0], src[0], dst[1], src[1], dst[2], src[2])
			for i, c := range []uint32{c0, c1, c2} {
				if want := format.Checksum(src[i]); c != want {
					t.Fatalf("n %d shift %d part %d: checksum %08x, want %08x", n, shift, i, c, want)
				}
				if !bytes.Equal(dst[i][:n], src[i]) {
					t.Fatalf("n %d shift %d part %d: copy differs", n, shift, i)
				}
				for _, b := range dst[i][n:] {
					if b != 0xA5 {
						t.Fatalf("n %d shift %d part %d: wrote past the part", n, shift, i)
					}
				}
			}
			g0, g1, g2 := copyCheck3Generic(make([]byte, n), src[0], make([]byte, n), src[1], make([]byte, n), src[2])
			if g0 != c0 || g1 != c1 || g2 != c2 {
				t.Fatalf("n %d: generic checksums differ", n)
			}
		}
	}
}

// BenchmarkCopyCheck3 compares the one-pass copy and checksum of three parts with a copy and a
// checksum of the copy, and with a plain copy, over 256 MiB of sources (cold, as a memory
// tier's parts are): 2 KiB and 8 KiB parts.
func BenchmarkCopyCheck3(b *testing.B) {
	for _, part := range []int{2 << 10, 8 << 10} {
		const region = 256 << 20
		src := make([]byte, region)
		for i := range src {
			src[i] = byte(i * 7)
		}
		dst := make([]byte, 3*part)
		stride := 64 << 10 // one part per 64 KiB: a different block's sidecar each time
		for _, mode := range []string{"fused", "copy+checksum", "copy"} {
			b.Run(fmt.Sprintf("part=%dKiB/%s", part>>10, mode), func(b *testing.B) {
				b.SetBytes(int64(3 * part))
				off := 0
				var sink uint32
				for b.Loop() {
					s0, s1, s2 := src[off:off+part], src[off+stride:off+stride+part], src[off+2*stride:off+2*stride+part]
					d0, d1, d2 := dst[:part], dst[part:2*part], dst[2*part:]
					switch mode {
					case "fused":
						c0, c1, c2 := copyCheck3(d0, s0, d1, s1, d2, s2)
						sink += c0 + c1 + c2
					case "copy+checksum":
						c0, c1, c2 := copyCheck3Generic(d0, s0, d1, s1, d2, s2)
						sink += c0 + c1 + c2
					default:
						copy(d0, s0)
						copy(d1, s1)
						copy(d2, s2)
					}
					if off += 3 * stride; off+3*stride > region {
						off = (off + 4096) % stride
					}
				}
				_ = sink
			})
		}
	}
}
