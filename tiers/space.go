package tiers

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrNoSpace is returned when a tier cannot admit a new segment within its capacity.
var ErrNoSpace = errors.New("tier full")

// Space is the exact byte account of one disk tier: the bytes of every segment file in it,
// with the active segments counted at the size they may grow to (their reservation) until they
// are sealed. Admission keeps the tier within its capacity plus at most one segment:
//
//   - a segment for new dumps is admitted only if used + reservation ≤ capacity;
//   - a segment for relocations (compaction, demotion, promotion), which reclamation needs in
//     order to free space, is admitted only if used ≤ capacity.
//
// So used never exceeds capacity + one reservation. A capacity of 0 means unlimited.
//
// Retired segment files kept for reuse (the recycle pool) stay in used, since they are on
// disk, and are also counted as pooled: reclamation does not evict for them (OverHigh and
// Excess leave them out), a new segment that reuses one converts its bytes into its
// reservation, and a segment that does not fit while files are pooled has Reserve's Recycler
// reuse or delete one instead of waiting for reclamation.
//
// Space is safe for concurrent use.
type Space struct {
	capacity  int64
	high, low int64 // watermarks in bytes (0 with an unlimited capacity)

	mu      sync.Mutex
	limited bool  // admission is bounded by limit instead of capacity (SetLimit)
	limit   int64 // a shared tier's share of its global capacity, granted to this instance
	used    int64
	pooled  int64 // of used: retired files kept for reuse
	waiters int
	want    int64         // the largest reservation a waiter asks for (while waiters > 0)
	freed   chan struct{} // closed and replaced whenever used falls
}

// NewSpace returns the account of a tier of the given capacity (0: unlimited) and watermarks
// (fractions of capacity, 0 < low < high ≤ 1).
func NewSpace(capacity int64, high, low float64) *Space {
	s := &Space{capacity: capacity, freed: make(chan struct{})}
	if capacity > 0 {
		s.high, s.low = int64(float64(capacity)*high), int64(float64(capacity)*low)
	}
	return s
}

// Capacity returns the tier's capacity in bytes (0: unlimited).
func (s *Space) Capacity() int64 { return s.capacity }

// Used returns the bytes accounted to the tier.
func (s *Space) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Add accounts n more bytes (n may be negative: bytes freed). It never refuses: callers use
// it for segments that exist already (found at Open, or a sealed segment's final size).
func (s *Space) Add(n int64) {
	s.mu.Lock()
	s.used += n
	if n < 0 {
		close(s.freed)
		s.freed = make(chan struct{})
	}
	s.mu.Unlock()
}

// Pool moves n bytes already in used to the recycle pool: a retired segment's file kept for
// reuse instead of deleted. Waiters for space look again (their Recycler can take or delete it).
func (s *Space) Pool(n int64) {
	s.mu.Lock()
	s.pooled += n
	close(s.freed)
	s.freed = make(chan struct{})
	s.mu.Unlock()
}

// Unpool takes n bytes out of the recycle pool; they stay in used (a new segment reusing the
// file, then Reserve of the rest of its reservation) unless the caller frees them with Add.
func (s *Space) Unpool(n int64) {
	s.mu.Lock()
	s.pooled -= n
	s.mu.Unlock()
}

// PoolRoom reports whether n more bytes may be pooled: within the headroom above the high
// watermark, which blocks never fill (reclamation keeps them below it), so kept files take no
// room from them. Unlimited tiers have room for any.
func (s *Space) PoolRoom(n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capacity == 0 || s.pooled+n <= s.capacity-s.high
}

// Segments returns the bytes accounted to segments: Used less the recycle pool.
func (s *Space) Segments() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used - s.pooled
}

// Pooled returns the bytes of the recycle pool (part of Used).
func (s *Space) Pooled() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pooled
}

// OverHigh reports whether reclamation should start: used, less the recycle pool, above the
// high watermark, or a writer waiting for space.
func (s *Space) OverHigh() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capacity > 0 && (s.used-s.pooled > s.high || s.waiters > 0)
}

// Excess returns the bytes to free to get down to the low watermark, or further when a writer
// waits for a reservation the low watermark leaves no room for (≤ 0: nothing to do).
func (s *Space) Excess() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capacity == 0 {
		return 0
	}
	target := s.low
	if s.waiters > 0 {
		target = min(target, s.capacity-s.want)
	}
	return s.used - s.pooled - target
}

// Recycler is the recycle pool a reservation may draw on (nil: none). Its methods are called
// without the Space's lock.
type Recycler interface {
	// Take takes a pooled file for the new segment (Unpool) and returns its size (0: none),
	// at most the reservation's.
	Take() int64
	// Return gives the taken file back to the pool (Pool), or deletes it (Add).
	Return()
	// Release deletes other pooled files worth at least need bytes (Unpool, Add) and returns
	// the bytes freed.
	Release(need int64) int64
}

// Reserve admits a new segment of up to n bytes and accounts it. relocation selects the
// reclamation rule (see Space). A dump segment that does not fit waits for space to be freed
// (kick is called so that reclamation runs) until timeout or stop; it then fails with an error
// wrapping ErrNoSpace that says how full the tier is.
//
// With files pooled, rc supplies them: the segment takes one (rc.Take; its bytes, already in
// used, count towards n, and the admission rules apply to the tier without them), and if it
// still does not fit, other pooled files are deleted (rc.Release) before it waits. A segment
// that waits gives its file back first (rc.Return): a waiting reservation holds nothing, as it
// would if the file had been deleted. Reserve returns the bytes reused (rc's file is the
// segment's if > 0).
func (s *Space) Reserve(n int64, relocation bool, timeout time.Duration, stop <-chan struct{}, kick func(), rc Recycler) (reused int64, err error) {
	var deadline <-chan time.Time
	for {
		s.mu.Lock()
		if reused == 0 && s.pooled > 0 && rc != nil {
			s.mu.Unlock()
			reused = rc.Take()
			s.mu.Lock()
		}
		others := s.used - reused // what the tier holds besides the segment's reused bytes
		bound, bounded := s.boundLocked()
		fits := !bounded || others+n <= bound
		if relocation {
			fits = !bounded || others <= bound
		}
		if s.limited {
			// A shared tier's share: the dump writer's segments may start up to the limit
			// (one segment in flight past it), relocations must fit under it.
			fits = others <= bound
			if relocation {
				fits = others+n <= bound
			}
		}
		if fits {
			s.used += n - reused
			s.mu.Unlock()
			return reused, nil
		}
		if s.pooled > 0 && rc != nil {
			need := others + n - s.capacity
			if relocation {
				need = others - s.capacity
			}
			s.mu.Unlock()
			if rc.Release(need) > 0 {
				continue
			}
			s.mu.Lock()
		}
		if reused > 0 {
			s.mu.Unlock()
			rc.Return()
			reused = 0
			s.mu.Lock()
		}
		if relocation || timeout <= 0 {
			used := s.used
			s.mu.Unlock()
			return 0, fmt.Errorf("%w: %d of %d bytes used, %d more needed", ErrNoSpace, used, bound, n)
		}
		s.waiters++
		s.want = max(s.want, n)
		freed := s.freed
		s.mu.Unlock()
		if kick != nil {
			kick()
		}
		if deadline == nil {
			deadline = time.After(timeout)
		}
		select {
		case <-freed:
		case <-deadline:
			err = fmt.Errorf("%w: waited %v for %d bytes; %d of %d used", ErrNoSpace, timeout, n, s.Used(), bound)
		case <-stop:
			err = fmt.Errorf("%w: store closing", ErrNoSpace)
		}
		s.mu.Lock()
		if s.waiters--; s.waiters == 0 {
			s.want = 0
		}
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
}

// boundLocked is what admission bounds used by: the limit once SetLimit was called, else the
// capacity; bounded is false for an unlimited tier.
func (s *Space) boundLocked() (bound int64, bounded bool) {
	if s.limited {
		return s.limit, true
	}
	return s.capacity, s.capacity > 0
}

// SetLimit bounds admission by limit instead of the capacity, from now on: a shared tier's
// share of its global capacity, which the lease holder grants this instance. Under a limit the
// rules swap: a segment for dumps is admitted if used ≤ limit, a segment for relocations if
// used + reservation ≤ limit, so used never exceeds limit + one reservation, and the dump
// writer's segment prepared ahead takes no room beyond it. The watermarks (OverHigh, Excess:
// local reclamation) still follow the capacity. Waiters look again when the limit rises.
func (s *Space) SetLimit(limit int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	raised := !s.limited || limit > s.limit
	s.limited, s.limit = true, limit
	if raised {
		close(s.freed)
		s.freed = make(chan struct{})
	}
}

// Limit returns the admission limit SetLimit set; ok is false when admission follows the
// capacity.
func (s *Space) Limit() (limit int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit, s.limited
}

// ShrinkLimit lowers the limit to used + keep when it is more than keep + over above used, and
// returns the bytes it gave up (0 otherwise, or without a limit). Atomic with Reserve: a
// segment is admitted under the old limit or the new one, never past the new one.
func (s *Space) ShrinkLimit(keep, over int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.limited || s.limit-s.used <= keep+over {
		return 0
	}
	to := s.used + keep
	given := s.limit - to
	s.limit = to
	return given
}

// Demand returns the bytes admission lacks for the largest reservation a writer waits for
// (0 when no writer waits or it fits).
func (s *Space) Demand() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	bound, _ := s.boundLocked()
	if s.waiters == 0 {
		return 0
	}
	return max(0, s.used+s.want-bound)
}
