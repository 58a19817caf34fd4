package kernels

import (
	"unsafe"

	"github.com/ucm-go/ucm/internal/memcopy"
)

// runSeq is the sequence of contiguous runs that a transfer's items expand to: each item one
// run, or, with a template's table of run offsets, len(offs) runs of run bytes per item.
type runSeq struct {
	items []xitem
	offs  []runOff // nil: each item is one run of its n bytes
	run   int64
}

// runIter is a position in a runSeq: item i, template run j.
type runIter struct{ i, j int }

// next returns the run at it and advances it; ok is false past the last run.
func (q *runSeq) next(it *runIter) (layer int32, src, dst, n int64, ok bool) {
	if it.i >= len(q.items) {
		return 0, 0, 0, 0, false
	}
	x := &q.items[it.i]
	if q.offs == nil {
		it.i++
		return x.layer, x.src, x.dst, x.n, true
	}
	o := q.offs[it.j]
	if it.j++; it.j == len(q.offs) {
		it.i, it.j = it.i+1, 0
	}
	return x.layer, x.src + o.src, x.dst + o.dst, q.run, true
}

// pfDist is how far ahead of a gather's copy, in bytes of the sequence of runs, the device
// bytes are prefetched: far enough to cover a memory access's latency at copy speed (16 KiB
// is about 1 µs at 16 GB/s), near enough that the lines are still in L1/L2 when copied. 4, 8,
// 16, 32 and 64 KiB measured the same (docs/kernels.md).
const pfDist = 16 << 10

// pfMinRun is the shortest template run gathered with gatherAhead; shorter runs (a TP slice's
// heads of one token) are copied run by run, without the prefetch cursor's per-run work.
const pfMinRun = 256

// gatherAhead copies every run of q from the caches (mems, by layer) into host, with
// non-temporal stores when stream (for runs of memcopy.MinRun bytes or more, as memcopy.Stream),
// prefetching the device bytes pfDist ahead of the copy in the sequence of runs: each 128
// bytes copied issue the prefetch of the 128 bytes pfDist further on (copyPF), so the reads of
// scattered runs overlap the way the hardware prefetcher overlaps those of one contiguous copy,
// which it cannot do for a run it has not seen yet (nor across a page it has no translation
// for). Bytes written with non-temporal stores are ordered by memcopy.Fence, which the caller
// runs on the same goroutine.
func (q *runSeq) gatherAhead(mems [][]byte, host []byte, stream bool) {
	var cur runIter // the prefetch cursor
	var cmem []byte
	var cs, cn int64 // the cursor's run: its next byte's offset in cmem, bytes left
	more := true
	step := func() { // the cursor's next run; more is false past the last
		var l int32
		if l, cs, _, cn, more = q.next(&cur); more {
			cmem = mems[l]
		}
	}
	burst := func(m int64) { // prefetch the cursor's next m bytes at once
		for m > 0 && more {
			if cn < 128 { // a run's last bytes, or a tiny run: skipped
				step()
				continue
			}
			k := min(m, cn)
			prefetch(&cmem[cs], int(k))
			cs, cn, m = cs+k, cn-k, m-k
		}
	}
	step()
	burst(pfDist)
	for it := (runIter{}); ; {
		l, s, d, n, ok := q.next(&it)
		if !ok {
			return
		}
		src, dst := mems[l][s:s+n], host[d:d+n]
		if !memcopy.HaveNT || n < 256 {
			copy(dst, src)
			burst(n)
			continue
		}
		nt := stream && n >= memcopy.MinRun
		pos := int64(0)
		if nt { // non-temporal stores need 32-byte alignment
			pos = int64(-uintptr(unsafe.Pointer(&dst[0])) & 31)
			copy(dst[:pos], src[:pos])
		}
		for n-pos >= 128 {
			if more && cn < 128 {
				step()
				continue
			}
			k, pf := (n-pos)&^127, &src[pos] // past the last run: prefetch what is read anyway
			if more {
				k = min(k, cn&^127)
				pf = &cmem[cs]
			}
			copyPF(&dst[pos], &src[pos], int(k), pf, nt)
			pos += k
			if more {
				cs, cn = cs+k, cn-k
			}
		}
		copy(dst[pos:], src[pos:])
	}
}
