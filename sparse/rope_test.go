package sparse

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ucm-go/ucm/internal/fcmp"
)

func randVec(r *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64())
	}
	return out
}

func rotated(t *testing.T, r RoPE, x []float32, delta int) []float32 {
	t.Helper()
	y := append([]float32(nil), x...)
	if err := r.Rotate(y, delta); err != nil {
		t.Fatal(err)
	}
	return y
}

// TestRoPEGroup: R(0) = I exactly; R(d)∘R(−d) = I; R(a)∘R(b) = R(a+b); each pair's norm is
// kept; ⟨R(m)q, R(n)k⟩ depends on n − m only: for both pairings.
func TestRoPEGroup(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, p := range []Pairing{PairNeoX, PairInterleaved} {
		r := RoPE{Dim: 32, Theta: 10000, Pairing: p}
		x := randVec(rng, 3*32)
		if d := fcmp.MaxRelDiff(rotated(t, r, x, 0), x); d != 0 {
			t.Fatalf("%v: R(0) moved x by %g", p, d)
		}
		for _, d := range []int{1, 7, 100, 1023, -513, 100000} {
			if e := fcmp.MaxRelDiff(rotated(t, r, rotated(t, r, x, d), -d), x); e > 1e-6 {
				t.Errorf("%v: R(%d)R(%d) = I off by %g", p, d, -d, e)
			}
			a, b := d/3, d-d/3
			if e := fcmp.MaxRelDiff(rotated(t, r, rotated(t, r, x, a), b), rotated(t, r, x, d)); e > 1e-5 {
				t.Errorf("%v: R(%d)R(%d) ≠ R(%d) by %g", p, a, b, d, e)
			}
			y := rotated(t, r, x, d)
			for h := 0; h < len(x); h += r.Dim {
				for i := range r.Dim / 2 {
					ia, ib := r.pair(i)
					n0 := math.Hypot(float64(x[h+ia]), float64(x[h+ib]))
					n1 := math.Hypot(float64(y[h+ia]), float64(y[h+ib]))
					if math.Abs(n0-n1) > 1e-5*max(1, n0) {
						t.Fatalf("%v: pair %d norm %g → %g", p, i, n0, n1)
					}
				}
			}
		}
		q, k := randVec(rng, 32), randVec(rng, 32)
		dot := func(m, n int) float64 {
			a, b := rotated(t, r, q, m), rotated(t, r, k, n)
			var s float64
			for i := range a {
				s += float64(a[i]) * float64(b[i])
			}
			return s
		}
		for _, mn := range [][2]int{{0, 5}, {10, 15}, {500, 505}, {-3, 2}} {
			if d := math.Abs(dot(mn[0], mn[1]) - dot(0, 5)); d > 1e-4 {
				t.Errorf("%v: ⟨R(%d)q, R(%d)k⟩ differs from ⟨q, R(5)k⟩ by %g", p, mn[0], mn[1], d)
			}
		}
		if math.Abs(dot(0, 5)-dot(0, 6)) < 1e-3 {
			t.Errorf("%v: the score does not depend on the distance (the check cannot fail)", p)
		}
	}
	// The pairings differ (so each is tested as itself).
	x := randVec(rng, 32)
	if fcmp.MaxRelDiff(rotated(t, RoPE{Dim: 32, Theta: 10000, Pairing: PairNeoX}, x, 9), rotated(t, RoPE{Dim: 32, Theta: 10000, Pairing: PairInterleaved}, x, 9)) < 1e-3 {
		t.Fatal("NeoX and interleaved pairings rotate alike")
	}
	// Interleaved: sources §6B's formula for the first pair.
	r := RoPE{Dim: 4, Theta: 10000, Pairing: PairInterleaved}
	y := rotated(t, r, []float32{1, 2, 3, 4}, 1)
	c, s := math.Cos(1), math.Sin(1)
	if math.Abs(float64(y[0])-(c-2*s)) > 1e-6 || math.Abs(float64(y[1])-(s+2*c)) > 1e-6 {
		t.Fatalf("interleaved pair 0: %v", y[:2])
	}
}

// TestRoPEBadInput: odd or zero dims, partial heads, bad theta or pairing are ErrInvalid and
// leave x alone.
func TestRoPEBadInput(t *testing.T) {
	x := []float32{1, 2, 3, 4, 5, 6}
	for _, r := range []RoPE{{Dim: 3, Theta: 10000}, {Dim: 0, Theta: 10000}, {Dim: 4, Theta: 10000},
		{Dim: 2, Theta: math.NaN()}, {Dim: 2, Theta: 1}, {Dim: 2, Theta: math.Inf(1)}, {Dim: 2, Theta: 10000, Pairing: 7}} {
		if err := r.Rotate(x, 3); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if x[0] != 1 || x[5] != 6 {
		t.Fatalf("x changed: %v", x)
	}
	if _, err := ParsePairing("rotate"); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}
