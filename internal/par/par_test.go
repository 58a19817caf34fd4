package par

import (
	"sync"
	"sync/atomic"
	"testing"
)

// Every index is visited exactly once, in chunks of grain, whatever the worker count.
func TestChunksCoversOnce(t *testing.T) {
	for _, c := range []struct{ n, grain, workers int }{
		{0, 1, 4}, {1, 1, 4}, {10, 3, 1}, {10, 3, 2}, {1000, 7, 4}, {1000, 1000, 8}, {1000, 0, 3}, {5, 10, 3},
	} {
		seen := make([]atomic.Int32, c.n)
		var calls atomic.Int32
		Chunks(c.n, c.grain, c.workers, func(lo, hi int) {
			calls.Add(1)
			if lo < 0 || hi > c.n || lo >= hi {
				t.Errorf("%+v: chunk [%d, %d)", c, lo, hi)
				return
			}
			if c.workers > 1 && c.grain > 0 && hi-lo > c.grain {
				t.Errorf("%+v: chunk [%d, %d) longer than the grain", c, lo, hi)
			}
			for i := lo; i < hi; i++ {
				seen[i].Add(1)
			}
		})
		for i := range seen {
			if v := seen[i].Load(); v != 1 {
				t.Fatalf("%+v: index %d visited %d times", c, i, v)
			}
		}
		if c.n == 0 && calls.Load() != 0 {
			t.Fatalf("%+v: fn called for an empty loop", c)
		}
	}
}

// The call returns once every chunk is done even when no helper goroutine ever gets to run:
// the caller does all the work itself.
func TestChunksDoesNotWaitForIdleHelpers(t *testing.T) {
	var mu sync.Mutex
	ran := 0
	Chunks(8, 1, 4, func(lo, hi int) {
		mu.Lock()
		ran += hi - lo
		mu.Unlock()
	})
	if ran != 8 {
		t.Fatalf("ran %d of 8 indexes", ran)
	}
	// A worker stuck in one chunk does not hold back the others: the first chunk blocks until
	// every other chunk has run, which a static split into per-worker ranges would deadlock on.
	release := make(chan struct{})
	var first atomic.Bool
	var other atomic.Int32
	done := make(chan struct{})
	go func() {
		Chunks(100, 1, 2, func(lo, hi int) {
			if lo == 0 {
				first.Store(true)
				<-release
				return
			}
			if other.Add(1) == 99 {
				close(release)
			}
		})
		close(done)
	}()
	<-done
	if !first.Load() || other.Load() != 99 {
		t.Fatalf("first chunk ran %v, others %d", first.Load(), other.Load())
	}
}
