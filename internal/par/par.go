// Package par splits a loop across goroutines in a way that suits a loaded machine: the
// calling goroutine works too, helper goroutines claim chunks of the loop as they get a CPU,
// and a call returns as soon as every chunk is done, without waiting for helpers that never
// started (on a busy machine a new goroutine can wait milliseconds for a CPU; a static split
// would make the whole call wait for it).
package par

import "sync/atomic"

// Chunks runs fn(lo, hi) over [0, n) in consecutive chunks of grain indexes (the last may be
// shorter), each chunk exactly once, on the calling goroutine and up to workers-1 helper
// goroutines, and returns when every chunk has returned. Chunks are claimed in order, so with
// workers ≤ 1 or a single chunk everything runs on the caller, in order. A helper that starts
// after the work is done returns without calling fn. fn must not panic.
func Chunks(n, grain, workers int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := (n + grain - 1) / grain
	workers = min(workers, chunks)
	if workers <= 1 {
		fn(0, n)
		return
	}
	s := &loop{n: int64(n), grain: int64(grain), fn: fn, done: make(chan struct{})}
	s.left.Store(int64(n))
	for range workers - 1 {
		go s.work()
	}
	s.work()
	<-s.done
}

type loop struct {
	next  atomic.Int64 // first index not yet claimed (may run past n)
	left  atomic.Int64 // indexes claimed or not whose fn has not returned
	n     int64
	grain int64
	fn    func(lo, hi int)
	done  chan struct{} // closed when left reaches 0
}

func (s *loop) work() {
	for {
		lo := s.next.Add(s.grain) - s.grain
		if lo >= s.n {
			return
		}
		hi := min(lo+s.grain, s.n)
		s.fn(int(lo), int(hi))
		if s.left.Add(lo-hi) == 0 {
			close(s.done)
		}
	}
}
