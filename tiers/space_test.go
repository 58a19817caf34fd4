package tiers

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ucm-go/ucm/internal/testwait"
)

// The admission rules bound used by capacity plus one reservation, whatever the interleaving.
func TestSpaceAdmission(t *testing.T) {
	s := NewSpace(100, 0.9, 0.5)
	if _, err := s.Reserve(60, false, 0, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(60, false, 0, nil, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("dump reservation beyond capacity: %v", err)
	}
	// Relocations may go one reservation past capacity, never from above it.
	if _, err := s.Reserve(60, true, 0, nil, nil, nil); err != nil {
		t.Fatalf("relocation within capacity: %v", err)
	}
	if s.Used() != 120 {
		t.Fatalf("used %d", s.Used())
	}
	if _, err := s.Reserve(10, true, 0, nil, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("relocation above capacity: %v", err)
	}
	if !s.OverHigh() || s.Excess() != 70 {
		t.Fatalf("over high %v, excess %d", s.OverHigh(), s.Excess())
	}
	// A waiting dump is admitted when space is freed.
	done := make(chan error)
	var kicked atomic.Int32
	go func() { _, err := s.Reserve(50, false, time.Minute, nil, func() { kicked.Add(1) }, nil); done <- err }()
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
	go func() { _, _ = w.Reserve(40, false, time.Minute, nil, nil, nil) }()
	testwait.Until(t, "the waiter's reservation to count in the excess", func() bool { return w.Excess() == 10 }) // 70 − (100 − 40), not 70 − 80
	w.Add(-10)
	testwait.Until(t, "the waiter to be admitted", func() bool { return w.Used() == 100 && w.Excess() == 20 }) // admitted: back to the low watermark
	// ... and fails with ErrNoSpace at its deadline or when stopped.
	if _, err := s.Reserve(50, false, 5*time.Millisecond, nil, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("timed out reservation: %v", err)
	}
	stop := make(chan struct{})
	close(stop)
	if _, err := s.Reserve(50, false, time.Minute, stop, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("stopped reservation: %v", err)
	}
	if u := NewSpace(0, 0.9, 0.5); func() error { _, err := u.Reserve(1<<50, false, 0, nil, nil, nil); return err }() != nil || u.OverHigh() || u.Excess() != 0 {
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
				if _, err := s.Reserve(seg, g%2 == 0, time.Millisecond, nil, nil, nil); err == nil {
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

// fakeRecycler is a recycle pool of equal files for TestSpacePool.
type fakeRecycler struct {
	s               *Space
	files           int   // pooled files left
	size            int64 // each
	taken, returned int
	deleted         int64
}

func (f *fakeRecycler) Take() int64 {
	if f.files == 0 {
		return 0
	}
	f.files--
	f.taken++
	f.s.Unpool(f.size)
	return f.size
}

func (f *fakeRecycler) Return() { f.files++; f.returned++; f.s.Pool(f.size) }

func (f *fakeRecycler) Release(need int64) int64 {
	var freed int64
	for f.files > 0 && freed < need {
		f.files--
		f.s.Unpool(f.size)
		f.s.Add(-f.size)
		freed += f.size
	}
	f.deleted += freed
	return freed
}

// Pooled bytes (retired files kept for reuse) are on disk, so they stay in Used, but
// reclamation does not evict for them; a reservation takes a pooled file (its bytes count
// towards the reservation), deletes others when it still does not fit, and gives its file
// back while it waits.
func TestSpacePool(t *testing.T) {
	s := NewSpace(100, 0.9, 0.5)
	s.Add(95)
	if !s.OverHigh() || s.Excess() != 45 {
		t.Fatalf("95 of 100 used: over high %v, excess %d", s.OverHigh(), s.Excess())
	}
	rc := &fakeRecycler{s: s, files: 1, size: 40}
	s.Pool(40) // a retired 40-byte file kept
	if s.Used() != 95 || s.Pooled() != 40 || s.Segments() != 55 || s.OverHigh() || s.Excess() != 5 {
		t.Fatalf("after pooling 40: used %d, pooled %d, segments %d, over high %v, excess %d", s.Used(), s.Pooled(), s.Segments(), s.OverHigh(), s.Excess())
	}
	// A 40-byte segment fits once it reuses the pooled file: 55 + 40 ≤ 100.
	reused, err := s.Reserve(40, false, 0, nil, nil, rc)
	if err != nil || reused != 40 || rc.taken != 1 || s.Used() != 95 || s.Pooled() != 0 {
		t.Fatalf("reserve with a pooled file: %v, reused %d, taken %d, used %d, pooled %d", err, reused, rc.taken, s.Used(), s.Pooled())
	}
	// Nothing pooled: the reservation fails at once (no timeout), and nothing is taken.
	if _, err := s.Reserve(40, false, 0, nil, nil, rc); !errors.Is(err, ErrNoSpace) || rc.taken != 1 {
		t.Fatalf("reserve beyond capacity: %v, taken %d", err, rc.taken)
	}
	// Another 30-byte file pooled, and a 60-byte segment: reusing it is not enough (95 - 30 +
	// 60 > 100), there is nothing else to delete, so the file goes back before the refusal.
	rc.files, rc.size = 1, 30
	s.Pool(30)
	s.Add(30)
	if _, err := s.Reserve(60, false, 0, nil, nil, rc); !errors.Is(err, ErrNoSpace) || rc.returned != 1 || s.Pooled() != 30 || s.Used() != 125 {
		t.Fatalf("reserve that does not fit: %v, returned %d, pooled %d, used %d", err, rc.returned, s.Pooled(), s.Used())
	}
	// A relocation takes the file; one that still does not fit has pooled files deleted.
	rc.files = 2
	s.Pool(30)
	s.Add(30)
	if _, err := s.Reserve(40, true, 0, nil, nil, rc); err != nil || rc.deleted == 0 {
		t.Fatalf("relocation with pooled files: %v, deleted %d", err, rc.deleted)
	}
}

// Under a limit (a shared tier's share) a dump segment is admitted while used ≤ limit, a
// relocation only if it fits under it; a waiter's demand is what it lacks; a raised limit
// admits it; ShrinkLimit gives back only what is unused beyond its margin.
func TestSpaceLimit(t *testing.T) {
	s := NewSpace(0, 0.9, 0.8)
	s.SetLimit(100)
	if _, err := s.Reserve(60, true, 0, nil, nil, nil); err != nil {
		t.Fatalf("relocation of 60 under a limit of 100: %v", err)
	}
	if _, err := s.Reserve(50, true, 0, nil, nil, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("relocation past the limit: %v, want ErrNoSpace", err)
	}
	if _, err := s.Reserve(50, false, 0, nil, nil, nil); err != nil {
		t.Fatalf("dump segment starting under the limit: %v", err)
	}
	if used := s.Used(); used != 110 {
		t.Fatalf("used %d, want 110 (one segment past the limit)", used)
	}
	done := make(chan error, 1)
	kicked := make(chan struct{}, 1)
	go func() {
		_, err := s.Reserve(50, false, time.Minute, nil, func() {
			select {
			case kicked <- struct{}{}:
			default:
			}
		}, nil)
		done <- err
	}()
	<-kicked
	if d := s.Demand(); d != 60 {
		t.Fatalf("demand %d, want 60 (110 used + 50 wanted - 100)", d)
	}
	s.SetLimit(170)
	if err := <-done; err != nil {
		t.Fatalf("waiter after the limit rose: %v", err)
	}
	if got := s.ShrinkLimit(0, 20); got != 0 {
		t.Fatalf("ShrinkLimit gave back %d within its margin", got)
	}
	if got := s.ShrinkLimit(0, 5); got != 10 {
		t.Fatalf("ShrinkLimit gave back %d, want 10 (limit 170, used 160)", got)
	}
	if got := s.ShrinkLimit(0, 5); got != 0 {
		t.Fatalf("ShrinkLimit gave back %d more", got)
	}
	if l, ok := s.Limit(); !ok || l != 160 {
		t.Fatalf("limit %d, %v", l, ok)
	}
	if s.OverHigh() || s.Excess() > 0 {
		t.Fatal("a limit started local reclamation")
	}
}
