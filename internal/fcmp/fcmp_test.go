package fcmp

import "testing"

func TestMaxRelDiff(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want []float32
		diff      float64
	}{
		{"equal", []float32{1, -2, 3}, []float32{1, -2, 3}, 0},
		{"relative to the largest of want", []float32{1, -2, 3.5}, []float32{1, -2, 4}, 0.125},
		{"sign counts", []float32{-4}, []float32{4}, 2},
		{"lengths differ", []float32{1}, []float32{1, 1}, 1},
		{"empty", nil, nil, 0},
	} {
		if d := MaxRelDiff(c.got, c.want); d != c.diff {
			t.Errorf("%s: MaxRelDiff(%v, %v) = %g, want %g", c.name, c.got, c.want, d, c.diff)
		}
	}
}
