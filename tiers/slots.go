package tiers

import "sync"

// slotStack holds free staging slots and hands out the most recently returned first, so that
// the slots in use cycle through as little memory as the load in flight needs: the bytes a
// get lands in, and the copy out of them reads, are then the ones still in the CPU's caches
// and TLB from the last use, not the coldest of the whole staging area. It is safe for
// concurrent use.
type slotStack struct {
	mu   sync.Mutex
	cond sync.Cond
	free [][]byte
}

func newSlotStack(slots [][]byte) *slotStack {
	s := &slotStack{free: slots}
	s.cond.L = &s.mu
	return s
}

// take returns between 1 and max free slots (max ≥ 1), waiting while none is free.
func (s *slotStack) take(max int) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.free) == 0 {
		s.cond.Wait()
	}
	n := min(max, len(s.free))
	lo := len(s.free) - n
	got := append([][]byte(nil), s.free[lo:]...)
	clear(s.free[lo:])
	s.free = s.free[:lo]
	return got
}

// tryTake returns a free slot, or nil when none is free.
func (s *slotStack) tryTake() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) == 0 {
		return nil
	}
	slot := s.free[len(s.free)-1]
	s.free[len(s.free)-1] = nil
	s.free = s.free[:len(s.free)-1]
	return slot
}

// put returns slots to the stack.
func (s *slotStack) put(slots ...[]byte) {
	s.mu.Lock()
	s.free = append(s.free, slots...)
	s.mu.Unlock()
	s.cond.Broadcast()
}
