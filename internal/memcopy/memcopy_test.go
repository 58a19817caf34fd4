package memcopy

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// Stream copies exactly the source, whatever the length and the alignment of either side,
// and writes nothing past it.
func TestStream(t *testing.T) {
	src := make([]byte, 1<<20+300)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	for _, n := range []int{0, 1, 127, MinRun - 1, MinRun, MinRun + 1, 4096, 32<<10 + 77, 1 << 20} {
		for _, so := range []int{0, 1, 31, 64} {
			for _, do := range []int{0, 5, 32, 33} {
				buf := bytes.Repeat([]byte{0xC3}, n+do+64)
				Stream(buf[do:do+n], src[so:so+n])
				Fence()
				if !bytes.Equal(buf[do:do+n], src[so:so+n]) {
					t.Fatalf("n %d src+%d dst+%d: copy differs", n, so, do)
				}
				for i, b := range append(buf[:do:do], buf[do+n:]...) {
					if b != 0xC3 {
						t.Fatalf("n %d src+%d dst+%d: byte %d outside the destination written", n, so, do, i)
					}
				}
			}
		}
	}
}
