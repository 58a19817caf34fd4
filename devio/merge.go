package devio

import "runtime"

// Request merging. A batch often holds ops that continue each other in one file: a record's
// 4 KiB header and its payload, consecutive records of one group commit, a whole-block load's
// header and payload. Issued one by one they cost the device two requests per record (and a
// 4 KiB write between every two large ones); merged, they are one vectored request
// (preadv/pwritev, IORING_OP_READV/WRITEV) whose iovecs are the ops' own buffers: no copy, and
// the device sees the large sequential transfers fio issues.
//
// Only ops adjacent in the batch are merged, never reordered, and a merged request that fails
// or comes up short is split back into its ops, each retried alone, so every op's N and Err are
// exactly what they would have been unmerged.
const (
	// maxMergeBytes bounds the bytes of one merged request: large enough to put a record's
	// header and a 2 MiB payload together, small enough that one request does not hold up
	// the queue depth's worth of parallelism.
	maxMergeBytes = 4 << 20
	// maxMergeOps bounds the iovecs of one merged request (the kernel's UIO_MAXIOV is 1024).
	maxMergeOps = 1024
)

// opUnit is ops[lo:hi] issued as one request: one op (hi == lo+1) or a merged run.
type opUnit struct{ lo, hi int }

// mergeRuns returns the units to issue for ops: runs of consecutive ops for which issue
// returns true (it prepares and validates an op, or runs it inline and returns false) that
// are on the same file descriptor, in the same direction and contiguous (ops[i+1].Off ==
// ops[i].Off + len(ops[i].Buf)), within maxMergeBytes and maxMergeOps; every other op is a
// unit of its own.
func mergeRuns(ops []Op, issue func(*Op) bool) []opUnit {
	units := make([]opUnit, 0, len(ops))
	var (
		cur   opUnit
		bytes int
		open  bool
	)
	for i := range ops {
		op := &ops[i]
		if !issue(op) {
			if open {
				units = append(units, cur)
				open = false
			}
			continue
		}
		if open {
			prev := &ops[cur.hi-1]
			if vectoredIO && op.File.hasFd() && prev.File == op.File && prev.Write == op.Write && prev.Off+int64(len(prev.Buf)) == op.Off &&
				bytes+len(op.Buf) <= maxMergeBytes && cur.hi-cur.lo < maxMergeOps {
				cur.hi++
				bytes += len(op.Buf)
				continue
			}
			units = append(units, cur)
		}
		cur, bytes, open = opUnit{lo: i, hi: i + 1}, len(op.Buf), true
	}
	if open {
		units = append(units, cur)
	}
	return units
}

// settle applies the outcome of a merged request (n bytes transferred, or err) to its ops:
// every op fully covered by n is done; it returns the indices of the others, which must be
// issued again one by one (their N says how much of them is already transferred).
func (un opUnit) settle(ops []Op, n int, err error) (again []int) {
	if err != nil || n < 0 {
		n = 0
	}
	for i := un.lo; i < un.hi; i++ {
		op := &ops[i]
		take := min(n, len(op.Buf))
		op.N = take
		n -= take
		if op.N < len(op.Buf) {
			again = append(again, i)
		}
	}
	return again
}

// bufs returns the buffers of the unit's ops, in order: the iovecs of its vectored request.
func (un opUnit) bufs(ops []Op) [][]byte {
	bufs := make([][]byte, un.hi-un.lo)
	for i := range bufs {
		bufs[i] = ops[un.lo+i].Buf
	}
	return bufs
}

// runMerged runs a merged run synchronously with one preadv/pwritev, then finishes every op it
// did not complete on its own (transfer), so each op's N and Err are its own.
func runMerged(ops []Op) {
	un := opUnit{lo: 0, hi: len(ops)}
	bufs := un.bufs(ops)
	first := &ops[0]
	var (
		n   int
		err error
	)
	if first.Write {
		n, err = pwritev(first.File.fd, bufs, first.Off)
	} else {
		n, err = preadv(first.File.fd, bufs, first.Off)
	}
	for _, i := range un.settle(ops, n, err) {
		_ = transfer(&ops[i])
	}
	runtime.KeepAlive(first.File.file)
}
