package kernels

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ucm-go/ucm/internal/memcopy"
)

// copyPF copies exactly n bytes (every multiple of 128 up to 4 KiB, from any source alignment,
// to any destination alignment with ordinary stores and 32-byte-aligned ones with
// non-temporal stores), and writes nothing past them, wherever its prefetch pointer points.
func TestCopyPF(t *testing.T) {
	if !memcopy.HaveNT {
		t.Skip("no AVX2 copy routine on this machine")
	}
	src := testRandomBytes(4096+64, 3)
	other := testRandomBytes(4096, 4)
	for n := 128; n <= 4096; n += 128 {
		for _, nt := range []bool{false, true} {
			for _, so := range []int{0, 1, 31, 32, 63} {
				for _, do := range []int{0, 1, 17, 32} {
					if nt && do%32 != 0 {
						continue
					}
					buf := bytes.Repeat([]byte{0x5A}, n+128)
					base := int(-addrOf(buf) & 31) // a 32-byte-aligned start for the non-temporal stores
					dst := buf[base+do : base+do+n]
					copyPF(&dst[0], &src[so], n, &other[(n+so)%len(other)], nt)
					memcopy.Fence()
					if !bytes.Equal(dst, src[so:so+n]) {
						t.Fatalf("n %d nt %v src+%d dst+%d: copy differs", n, nt, so, do)
					}
					for i, b := range append(buf[:base+do:base+do], buf[base+do+n:]...) {
						if b != 0x5A {
							t.Fatalf("n %d nt %v src+%d dst+%d: byte %d outside the destination written", n, nt, so, do, i)
						}
					}
				}
			}
		}
	}
}

// gatherAhead copies every run of its sequence to its place, like a plain copy of each run,
// for runs of every length from 1 to 256 bytes and longer, at odd offsets on both sides, one
// run per item or a template's runs per item, from several layers, with ordinary and
// non-temporal stores; bytes of the host buffer outside the runs stay untouched.
func TestGatherAhead(t *testing.T) {
	const memBytes = 1 << 20
	mems := [][]byte{testRandomBytes(memBytes, 5), testRandomBytes(memBytes, 6)}
	rng := rand.New(rand.NewPCG(9, 9))
	check := func(t *testing.T, q runSeq, hostBytes int64) {
		t.Helper()
		want := bytes.Repeat([]byte{0xA5}, int(hostBytes))
		for it := (runIter{}); ; {
			l, s, d, n, ok := q.next(&it)
			if !ok {
				break
			}
			copy(want[d:d+n], mems[l][s:s+n])
		}
		for _, stream := range []bool{false, true} {
			got := bytes.Repeat([]byte{0xA5}, int(hostBytes))
			q.gatherAhead(mems, got, stream)
			memcopy.Fence()
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("stream %v: byte %d of the host buffer is %#x, want %#x", stream, i, got[i], want[i])
			}
		}
	}
	// One run per item: every length 1..256, then long runs, at random offsets, in order of
	// length and shuffled (a long run after short ones and the reverse).
	var lens []int64
	for n := int64(1); n <= 256; n++ {
		lens = append(lens, n)
	}
	lens = append(lens, 257, 1000, memcopy.MinRun-1, memcopy.MinRun, memcopy.MinRun+129, 32<<10+77, 100<<10)
	for _, order := range []string{"ascending", "shuffled", "descending"} {
		t.Run("items/"+order, func(t *testing.T) {
			ls := append([]int64(nil), lens...)
			switch order {
			case "shuffled":
				rng.Shuffle(len(ls), func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
			case "descending":
				for i, j := 0, len(ls)-1; i < j; i, j = i+1, j-1 {
					ls[i], ls[j] = ls[j], ls[i]
				}
			}
			var items []xitem
			dst := int64(3) // odd host offsets: the first run starts misaligned
			for _, n := range ls {
				items = append(items, xitem{layer: int32(rng.IntN(2)), src: rng.Int64N(memBytes - n), dst: dst, n: n})
				dst += n + rng.Int64N(3) // gaps of 0–2 bytes stay untouched
			}
			check(t, runSeq{items: items}, dst+5)
		})
	}
	// A template's runs per item, for run lengths around the thresholds.
	for _, run := range []int64{pfMinRun, 300, memcopy.MinRun, 5000} {
		t.Run(fmt.Sprintf("template/run=%d", run), func(t *testing.T) {
			offs := []runOff{{0, 0}, {3 * run, run}, {run + 7, 2 * run}}
			var items []xitem
			for j := int64(0); j < 12; j++ {
				items = append(items, xitem{layer: int32(j % 2), src: rng.Int64N(memBytes - 4*run - 7), dst: 1 + j*3*run, n: 3 * run})
			}
			check(t, runSeq{items: items, offs: offs, run: run}, 1+12*3*run)
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
