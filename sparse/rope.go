package sparse

import (
	"fmt"
	"math"
)

// Pairing says which two elements of a head RoPE rotates together (sources §6B [DECISION]).
type Pairing int

// Pairings.
const (
	// PairNeoX pairs element i with i + D/2 (HF Llama's rotate_half; the small model's).
	PairNeoX Pairing = iota
	// PairInterleaved pairs elements 2i and 2i+1 (sources §6B's formula, GPT-J style).
	PairInterleaved
)

// String returns "neox" or "interleaved".
func (p Pairing) String() string {
	if p == PairInterleaved {
		return "interleaved"
	}
	return "neox"
}

// ParsePairing parses "neox" or "interleaved".
func ParsePairing(s string) (Pairing, error) {
	switch s {
	case "neox":
		return PairNeoX, nil
	case "interleaved":
		return PairInterleaved, nil
	}
	return 0, fmt.Errorf("%w: rope pairing %q: want neox or interleaved", ErrInvalid, s)
}

// RoPE is a rotary position embedding of heads of dim elements (dim even) with base theta:
// pair i of a head at position p is rotated by the angle p·θ_i, θ_i = theta^(−2i/dim).
type RoPE struct {
	Dim     int
	Theta   float64
	Pairing Pairing
}

// Validate checks dim (even, in [2, kernels' MaxDim]), theta (finite, > 1) and the pairing.
func (r RoPE) Validate() error {
	switch {
	case r.Dim < 2 || r.Dim%2 != 0 || r.Dim > 1<<14:
		return fmt.Errorf("%w: rope: head dim %d: want an even number in [2, 16384]", ErrInvalid, r.Dim)
	case !(r.Theta > 1) || math.IsInf(r.Theta, 0):
		return fmt.Errorf("%w: rope: theta %v: want a finite number > 1", ErrInvalid, r.Theta)
	case r.Pairing != PairNeoX && r.Pairing != PairInterleaved:
		return fmt.Errorf("%w: rope: pairing %d", ErrInvalid, int(r.Pairing))
	}
	return nil
}

// pair returns the indexes of pair i's two elements.
func (r RoPE) pair(i int) (int, int) {
	if r.Pairing == PairInterleaved {
		return 2 * i, 2*i + 1
	}
	return i, i + r.Dim/2
}

// Rotate rotates every head of x (heads of Dim elements, len(x) a multiple of Dim) by the
// angles of delta positions, in place: x'[a] = x[a]·cos − x[b]·sin, x'[b] = x[a]·sin +
// x[b]·cos for each pair (a, b), in float64. Rotate(RoPE(k, s), t − s) = RoPE(k, t): the
// position correction of a key cached at s and reused at t (sources §6B); Rotate(x, p) applied to
// an unrotated x is RoPE at position p.
func (r RoPE) Rotate(x []float32, delta int) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if len(x)%r.Dim != 0 {
		return fmt.Errorf("%w: rope: %d elements are not whole heads of %d", ErrInvalid, len(x), r.Dim)
	}
	if delta == 0 {
		return nil
	}
	half := r.Dim / 2
	var cs [2][]float64
	cs[0], cs[1] = make([]float64, half), make([]float64, half)
	for i := range half {
		ang := float64(delta) * math.Pow(r.Theta, -float64(2*i)/float64(r.Dim))
		cs[1][i], cs[0][i] = math.Sincos(ang)
	}
	for h := 0; h < len(x); h += r.Dim {
		head := x[h : h+r.Dim]
		for i := range half {
			a, b := r.pair(i)
			xa, xb := float64(head[a]), float64(head[b])
			c, s := cs[0][i], cs[1][i]
			head[a] = float32(xa*c - xb*s)
			head[b] = float32(xa*s + xb*c)
		}
	}
	return nil
}
