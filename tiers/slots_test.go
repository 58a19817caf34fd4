package tiers

import (
	"testing"
	"time"
)

// Slots come back most recently returned first, take hands out at most what is free (at least
// one), and tryTake reports an empty stack.
func TestSlotStackOrder(t *testing.T) {
	a, b, c := []byte("a"), []byte("b"), []byte("c")
	s := newSlotStack([][]byte{a, b, c})
	got := s.take(2)
	if len(got) != 2 || &got[0][0] != &b[0] || &got[1][0] != &c[0] {
		t.Fatalf("take(2) = %q, want the two on top, b and c", got)
	}
	s.put(got[1]) // c back: it is what the next taker gets
	if x := s.tryTake(); x == nil || &x[0] != &c[0] {
		t.Fatalf("tryTake = %q, want c, the last returned", x)
	}
	if got := s.take(5); len(got) != 1 || &got[0][0] != &a[0] {
		t.Fatalf("take(5) with one free = %q, want a", got)
	}
	if x := s.tryTake(); x != nil {
		t.Fatalf("tryTake on an empty stack = %q, want nil", x)
	}
}

// take waits while no slot is free and returns once one is put back.
func TestSlotStackTakeWaits(t *testing.T) {
	slot := []byte("s")
	s := newSlotStack(nil)
	got := make(chan [][]byte, 1)
	go func() { got <- s.take(3) }()
	select {
	case g := <-got:
		t.Fatalf("take returned %q with no slot free", g)
	case <-time.After(20 * time.Millisecond):
	}
	s.put(slot)
	select {
	case g := <-got:
		if len(g) != 1 || &g[0][0] != &slot[0] {
			t.Fatalf("take = %q, want the slot put back", g)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("take still waiting after a slot was put back")
	}
}
