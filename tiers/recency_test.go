package tiers

import (
	"slices"
	"sync"
	"testing"
)

// Segments not used since Open go first, in write order (number); used ones follow by their
// last use; a load's stamps leave its first block (a chain's root) the most recent.
func TestRecencyOrder(t *testing.T) {
	r := NewRecency()
	for _, n := range []uint64{1, 2, 3, 4, 5} {
		r.Track(n)
	}
	r.Written(6)                  // a new segment: the newest
	s := NextStamps(2)            // a load of two blocks: block 0 in segment 2, block 1 in segment 4
	r.Touch(4, 0, s+0)            // block 1, the leaf: the older stamp
	r.Touch(2, 0, s+1)            // block 0, the root: the newer
	r.Inherit(7, 1)               // compacted out of an unused segment: as unused
	r.Inherit(8, 2)               // out of segment 2: as recent as it
	r.Touch(99, 0, NextStamps(1)) // unknown: ignored, not tracked
	got := r.Order([]uint64{8, 7, 6, 5, 4, 3, 2, 1, 99})
	want := []uint64{1, 3, 5, 7, 99, 6, 4, 2, 8}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if r.Len() != 8 {
		t.Fatalf("%d segments known, want 8 (99 never tracked)", r.Len())
	}
}

// A pinned segment is left out of Order until its last pin goes; pins of unknown or forgotten
// segments are ignored and do not bring them back.
func TestRecencyPins(t *testing.T) {
	r := NewRecency()
	r.Track(1)
	r.Track(2)
	r.Pin(1)
	r.Pin(1)
	if got := r.Order([]uint64{1, 2}); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("pinned twice: order %v, want [2]", got)
	}
	r.Unpin(1, 3, NextStamps(1)) // a read that loaded slot 3: touched
	if got := r.Order([]uint64{1, 2}); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("one pin left: order %v, want [2]", got)
	}
	r.Unpin(1, 0, 0)
	if got := r.Order([]uint64{1, 2}); !slices.Equal(got, []uint64{2, 1}) {
		t.Fatalf("unpinned (and touched by the read): order %v, want [2 1]", got)
	}
	r.Unpin(1, 0, 0) // not pinned: nothing
	r.Forget(2)
	r.Pin(2)
	r.Unpin(2, 0, NextStamps(1))
	r.Pin(3)
	if r.Len() != 1 {
		t.Fatalf("%d segments known after pins of forgotten and unknown ones, want 1", r.Len())
	}
}

// A nil Recency (a tier that never evicts on its own) orders by number and ignores the rest.
func TestRecencyNil(t *testing.T) {
	var r *Recency
	r.Track(1)
	r.Written(2)
	r.Pin(3)
	r.Unpin(3, 0, 1)
	r.Touch(3, 0, 1)
	r.Inherit(4, 3)
	r.Forget(3)
	if got := r.Order([]uint64{3, 1, 2}); !slices.Equal(got, []uint64{1, 2, 3}) || r.Len() != 0 || r.TakeLoaded(3) != nil {
		t.Fatalf("nil recency: order %v, %d known", got, r.Len())
	}
}

// Concurrent writes, loads, pins and orders (run with -race).
func TestRecencyConcurrent(t *testing.T) {
	r := NewRecency()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				n := uint64(i % 16)
				switch (i + g) % 5 {
				case 0:
					r.Written(n)
				case 1:
					r.Pin(n)
					r.Unpin(n, uint64(i), NextStamps(1))
				case 2:
					r.Order([]uint64{1, 2, 3, 4, 5})
				case 3:
					r.TakeLoaded(n)
				default:
					r.Inherit(n+16, n)
				}
			}
		}(g)
	}
	wg.Wait()
	if got := r.Order(make([]uint64, 0)); len(got) != 0 {
		t.Fatalf("order of nothing: %v", got)
	}
	for n := uint64(0); n < 16; n++ {
		if got := r.Order([]uint64{n}); len(got) != 1 {
			t.Fatalf("segment %d still pinned after every read ended", n)
		}
	}
}

// Loaded slots: marked by a load (Unpin with a stamp, Touch), not by a read that failed (Unpin
// without one); TakeLoaded hands them over once and forgets them; slots beyond MaxSlot and
// segments forgotten or unknown are not marked.
func TestRecencyLoadedSlots(t *testing.T) {
	r := NewRecency()
	r.Track(1)
	r.Pin(1)
	r.Unpin(1, 5, NextStamps(1))
	r.Pin(1)
	r.Unpin(1, 6, 0) // the read failed
	r.Touch(1, 200, NextStamps(1))
	r.Touch(1, MaxSlot+1, NextStamps(1))
	r.Touch(2, 7, NextStamps(1)) // unknown
	got := r.TakeLoaded(1)
	for _, slot := range []uint64{5, 200} {
		if !got.Has(slot) {
			t.Fatalf("slot %d not marked loaded", slot)
		}
	}
	for _, slot := range []uint64{0, 6, 199, 201, MaxSlot + 1} {
		if got.Has(slot) {
			t.Fatalf("slot %d marked loaded", slot)
		}
	}
	if len(got) > 4 {
		t.Fatalf("%d words for slots up to 200", len(got))
	}
	if again := r.TakeLoaded(1); again != nil {
		t.Fatalf("slots handed over twice: %v", again)
	}
	if r.TakeLoaded(2) != nil || r.Len() != 1 {
		t.Fatal("an unknown segment was marked")
	}
}
