package tiers

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The admission rules bound used by capacity plus one reservation, whatever the interleaving.
func TestSpaceAdmission(t *testing.T) {
	s := NewSpace(100, 0.9, 0.5)
	if err := s.Reserve(60, false, 0, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(60, false, 0, nil, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("dump reservation beyond capacity: %v", err)
	}
	// Relocations may go one reservation past capacity, never from above it.
	if err := s.Reserve(60, true, 0, nil, nil, nil); err != nil {
		t.Fatalf("relocation within capacity: %v", err)
	}
	if s.Used() != 120 {
		t.Fatalf("used %d", s.Used())
	}
	if err := s.Reserve(10, true, 0, nil, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("relocation above capacity: %v", err)
	}
	if !s.OverHigh() || s.Excess() != 70 {
		t.Fatalf("over high %v, excess %d", s.OverHigh(), s.Excess())
	}
	// A waiting dump is admitted when space is freed.
	done := make(chan error)
	var kicked atomic.Int32
	go func() { done <- s.Reserve(50, false, time.Minute, nil, func() { kicked.Add(1) }, nil) }()
	time.Sleep(10 * time.Millisecond)
	s.Add(-100)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if kicked.Load() == 0 || s.Used() != 70 {
		t.Fatalf("kicked %d, used %d", kicked.Load(), s.Used())
	}
	// A waiter whose reservation does not fit under the low watermark asks for more to be freed.
	w := NewSpace(100, 0.9, 0.8)
	w.Add(70)
	go func() { _ = w.Reserve(40, false, time.Minute, nil, nil, nil) }()
	waitUntil(t, func() bool { return w.Excess() == 10 }) // 70 − (100 − 40), not 70 − 80
	w.Add(-10)
	waitUntil(t, func() bool { return w.Used() == 100 && w.Excess() == 20 }) // admitted: back to the low watermark
	// ... and fails with ErrNoSpace at its deadline or when stopped.
	if err := s.Reserve(50, false, 5*time.Millisecond, nil, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("timed out reservation: %v", err)
	}
	stop := make(chan struct{})
	close(stop)
	if err := s.Reserve(50, false, time.Minute, stop, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("stopped reservation: %v", err)
	}
	if u := NewSpace(0, 0.9, 0.5); u.Reserve(1<<50, false, 0, nil, nil, nil) != nil || u.OverHigh() || u.Excess() != 0 {
		t.Fatalf("unlimited space refused or asked for reclamation")
	}
}

func TestSpaceConcurrentBound(t *testing.T) {
	const capacity, seg = 1000, 100
	s := NewSpace(capacity, 0.9, 0.5)
	var wg sync.WaitGroup
	var peak atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if s.Reserve(seg, g%2 == 0, time.Millisecond, nil, nil, nil) == nil {
					if u := s.Used(); u > peak.Load() {
						peak.Store(u)
					}
					s.Add(-seg)
				}
			}
		}()
	}
	wg.Wait()
	if peak.Load() > capacity+seg || s.Used() != 0 {
		t.Fatalf("used peaked at %d (bound %d), ended at %d", peak.Load(), capacity+seg, s.Used())
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// Pooled bytes (retired files kept for reuse) are on disk, so they stay in Used, but
// reclamation does not evict for them, and a reservation that does not fit has relieve reuse
// or delete them instead of waiting.
func TestSpacePool(t *testing.T) {
	s := NewSpace(100, 0.9, 0.5)
	s.Add(95)
	if !s.OverHigh() || s.Excess() != 45 {
		t.Fatalf("95 of 100 used: over high %v, excess %d", s.OverHigh(), s.Excess())
	}
	s.Pool(40) // a retired 40-byte file kept
	if s.Used() != 95 || s.Pooled() != 40 || s.OverHigh() || s.Excess() != 5 {
		t.Fatalf("after pooling 40: used %d, pooled %d, over high %v, excess %d", s.Used(), s.Pooled(), s.OverHigh(), s.Excess())
	}
	// A 40-byte segment does not fit (95 + 40 > 100): relieve reuses the pooled file, whose
	// bytes count towards the reservation.
	calls := 0
	relieve := func(need int64) (int64, bool) {
		calls++
		if need != 35 {
			t.Errorf("relieve asked for %d bytes, want 35", need)
		}
		s.Unpool(40)
		return 40, true
	}
	if err := s.Reserve(40, false, 0, nil, nil, relieve); err != nil || calls != 1 {
		t.Fatalf("reserve with a pooled file: %v after %d relieve calls", err, calls)
	}
	if s.Used() != 95 || s.Pooled() != 0 {
		t.Fatalf("after reuse: used %d, pooled %d, want 95 and 0", s.Used(), s.Pooled())
	}
	// Nothing pooled: relieve is not called, and the reservation fails at once (no timeout).
	if err := s.Reserve(40, false, 0, nil, nil, func(int64) (int64, bool) { t.Error("relieve called with nothing pooled"); return 0, false }); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("reserve beyond capacity: %v", err)
	}
	// Pooled files elsewhere are deleted to make room.
	s.Pool(30)
	deleting := func(need int64) (int64, bool) { s.Unpool(30); s.Add(-30); return 0, true }
	if err := s.Reserve(30, false, 0, nil, nil, deleting); err != nil || s.Used() != 95 || s.Pooled() != 0 {
		t.Fatalf("reserve after deleting pooled files: %v, used %d, pooled %d", err, s.Used(), s.Pooled())
	}
}
