package reuse

import "testing"

func TestGrowZeroesAndReuses(t *testing.T) {
	s := []int{1, 2, 3, 4}
	g := Grow(s, 3)
	if len(g) != 3 || &g[0] != &s[0] {
		t.Fatalf("len %d, reused %v", len(g), &g[0] == &s[0])
	}
	for i, v := range g {
		if v != 0 {
			t.Fatalf("element %d = %d, want 0", i, v)
		}
	}
	if g := Grow(s, 9); len(g) != 9 || cap(g) < 9 {
		t.Fatalf("grown to len %d cap %d", len(g), cap(g))
	}
}
