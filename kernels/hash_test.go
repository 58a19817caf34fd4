package kernels

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func mustEncoder(t testing.TB, dim, hbits int, seed uint64) *HashEncoder {
	t.Helper()
	e, err := NewHashEncoder(dim, hbits, seed)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func randVec(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

func TestHashEncoderOrthonormal(t *testing.T) {
	for _, c := range [][2]int{{8, 8}, {64, 32}, {128, 128}, {576 - 512, 64}, {100, 40}} {
		e := mustEncoder(t, c[0], c[1], 42)
		w := e.Weights()
		n, m := c[0], c[1]
		for a := range m {
			for b := range m {
				s := 0.0
				for i := range n {
					s += float64(w[i*m+a]) * float64(w[i*m+b])
				}
				want := 0.0
				if a == b {
					want = 1
				}
				if math.Abs(s-want) > 1e-5 {
					t.Fatalf("%v: (WᵀW)[%d][%d] = %v", c, a, b, s)
				}
			}
		}
	}
}

// TestHashEncoderIsGramSchmidtOfG checks the recipe independently: modified Gram–Schmidt of the
// same G gives the QR factor with a positive diagonal, which must be W.
func TestHashEncoderIsGramSchmidtOfG(t *testing.T) {
	const n, m = 48, 32
	g := hashGaussian(n, m, 7)
	// mean ≈ 0 and standard deviation ≈ 2 (1536 draws).
	var sum, sq float64
	for _, v := range g {
		sum += v
		sq += v * v
	}
	if mean, sd := sum/float64(len(g)), math.Sqrt(sq/float64(len(g))); math.Abs(mean) > 0.2 || math.Abs(sd-2) > 0.15 {
		t.Fatalf("G mean %v sd %v, want 0 and 2", mean, sd)
	}
	cols := make([][]float64, m)
	for j := range m {
		cols[j] = make([]float64, n)
		for i := range n {
			cols[j][i] = g[i*m+j]
		}
	}
	for j := range m {
		for p := range j {
			dot := 0.0
			for i := range n {
				dot += cols[p][i] * cols[j][i]
			}
			for i := range n {
				cols[j][i] -= dot * cols[p][i]
			}
		}
		norm := 0.0
		for _, v := range cols[j] {
			norm += v * v
		}
		norm = math.Sqrt(norm)
		for i := range cols[j] {
			cols[j][i] /= norm
		}
	}
	w := mustEncoder(t, n, m, 7).Weights()
	for i := range n {
		for j := range m {
			if math.Abs(float64(w[i*m+j])-cols[j][i]) > 1e-6 {
				t.Fatalf("W[%d][%d] = %v, Gram–Schmidt %v", i, j, w[i*m+j], cols[j][i])
			}
		}
	}
}

func TestHashEncoderDeterministic(t *testing.T) {
	a, b, c := mustEncoder(t, 64, 64, 1), mustEncoder(t, 64, 64, 1), mustEncoder(t, 64, 64, 2)
	if !slices.Equal(a.Weights(), b.Weights()) || a.Fingerprint() != b.Fingerprint() {
		t.Fatal("same seed, different W")
	}
	if slices.Equal(a.Weights(), c.Weights()) || a.Fingerprint() == c.Fingerprint() {
		t.Fatal("different seeds, same W")
	}
	rng := rand.New(rand.NewPCG(1, 1))
	x := randVec(rng, 64)
	ha, hb := make([]byte, 8), make([]byte, 8)
	if err := a.Hash(ha, x); err != nil {
		t.Fatal(err)
	}
	if err := b.Hash(hb, x); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ha, hb) {
		t.Fatal("same seed, different codes")
	}
	if a.InputDim() != 64 || a.HashBits() != 64 || a.CodeBytes() != 8 || a.Seed() != 1 {
		t.Fatal("accessors")
	}
}

// TestHashFingerprintsGolden pins W for a few shapes and seeds: a change here changes every
// stored hash sidecar (sidecars record the fingerprint, so old ones are then refused).
func TestHashFingerprintsGolden(t *testing.T) {
	var sb strings.Builder
	for _, c := range []struct {
		dim, bits int
		seed      uint64
	}{{128, 128, 0}, {128, 64, 0}, {128, 128, 1}, {192, 64, 0}, {64, 64, 1}} {
		fmt.Fprintf(&sb, "dim %d bits %d seed %d: %08x\n", c.dim, c.bits, c.seed, mustEncoder(t, c.dim, c.bits, c.seed).Fingerprint())
	}
	golden(t, "hash_fingerprints.golden", []byte(sb.String()))
}

func TestHashProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	for _, c := range [][2]int{{128, 128}, {128, 64}, {16, 8}, {64, 64}} {
		e := mustEncoder(t, c[0], c[1], 3)
		w := e.Weights()
		for range 200 {
			x := randVec(rng, c[0])
			h := make([]byte, e.CodeBytes())
			if err := e.Hash(h, x); err != nil {
				t.Fatal(err)
			}
			if len(h) != c[1]/8 {
				t.Fatalf("code of %d bytes", len(h))
			}
			p := make([]float32, c[1])
			if err := e.Project(p, x); err != nil {
				t.Fatal(err)
			}
			zero := false
			for j := range c[1] {
				// bit j = 1 iff (xW)_j > 0, LSB first.
				if bit := h[j/8] >> (j % 8) & 1; (bit == 1) != (p[j] > 0) {
					t.Fatalf("bit %d = %d, projection %v", j, bit, p[j])
				}
				// Project is x·W.
				ref := 0.0
				for i := range c[0] {
					ref += float64(x[i]) * float64(w[i*c[1]+j])
				}
				if math.Abs(float64(p[j])-ref) > 1e-4 {
					t.Fatalf("projection %d: %v, float64 %v", j, p[j], ref)
				}
				zero = zero || p[j] == 0
			}
			// hash(αx) = hash(x): exactly for powers of two (the projection scales exactly).
			for _, alpha := range []float32{2, 0.5, 1024, 0x1p-20} {
				ax := make([]float32, len(x))
				for i := range x {
					ax[i] = alpha * x[i]
				}
				ha := make([]byte, len(h))
				if err := e.Hash(ha, ax); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(ha, h) {
					t.Fatalf("hash(%v·x) ≠ hash(x)", alpha)
				}
			}
			// For any α > 0 the bits agree wherever the projection is not within rounding of 0.
			alpha := float32(0.01 + rng.Float64()*100)
			ax := make([]float32, len(x))
			for i := range x {
				ax[i] = alpha * x[i]
			}
			ha := make([]byte, len(h))
			if err := e.Hash(ha, ax); err != nil {
				t.Fatal(err)
			}
			for j := range c[1] {
				if math.Abs(float64(p[j])) > 1e-4 && (ha[j/8]^h[j/8])>>(j%8)&1 != 0 {
					t.Fatalf("hash(%v·x) bit %d differs, projection %v", alpha, j, p[j])
				}
			}
			// hash(−x) is the complement when no projection is 0.
			if !zero {
				nx := make([]float32, len(x))
				for i := range x {
					nx[i] = -x[i]
				}
				hn := make([]byte, len(h))
				if err := e.Hash(hn, nx); err != nil {
					t.Fatal(err)
				}
				for i := range h {
					if hn[i] != ^h[i] {
						t.Fatalf("hash(−x) byte %d = %08b, hash(x) %08b", i, hn[i], h[i])
					}
				}
				if Hamming(h, hn) != c[1] {
					t.Fatal("d(h(x), h(−x)) ≠ hash bits")
				}
			}
		}
	}
	// The zero vector projects to 0 everywhere: all bits 0.
	e := mustEncoder(t, 16, 16, 1)
	h := []byte{0xff, 0xff}
	if err := e.Hash(h, make([]float32, 16)); err != nil || h[0] != 0 || h[1] != 0 {
		t.Fatalf("hash(0) = %v, %v", h, err)
	}
}

func TestHashEncoderRejects(t *testing.T) {
	for _, c := range [][2]int{{0, 8}, {8, 0}, {8, 12}, {8, 16}, {MaxHashDim + 8, 8}, {-1, -8}} {
		if _, err := NewHashEncoder(c[0], c[1], 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewHashEncoder(%d, %d): %v", c[0], c[1], err)
		}
	}
	e := mustEncoder(t, 16, 8, 0)
	if err := e.Hash(make([]byte, 1), make([]float32, 15)); !errors.Is(err, ErrInvalid) {
		t.Error(err)
	}
	if err := e.Hash(make([]byte, 2), make([]float32, 16)); !errors.Is(err, ErrInvalid) {
		t.Error(err)
	}
	if err := e.Project(make([]float32, 7), make([]float32, 16)); !errors.Is(err, ErrInvalid) {
		t.Error(err)
	}
}

// bitLoopHamming is the reference: one bit at a time, the shorter code zero-padded.
func bitLoopHamming(a, b []byte) int {
	n := max(len(a), len(b))
	d := 0
	for i := range 8 * n {
		var x, y byte
		if i/8 < len(a) {
			x = a[i/8] >> (i % 8) & 1
		}
		if i/8 < len(b) {
			y = b[i/8] >> (i % 8) & 1
		}
		if x != y {
			d++
		}
	}
	return d
}

func TestHamming(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	code := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for range 500 {
		n := rng.IntN(40)
		a, b, c := code(n), code(n), code(n)
		dab := Hamming(a, b)
		if dab != bitLoopHamming(a, b) {
			t.Fatalf("Hamming %d, bit loop %d", dab, bitLoopHamming(a, b))
		}
		if Hamming(a, a) != 0 || Hamming(b, a) != dab {
			t.Fatal("d(a,a) ≠ 0 or not symmetric")
		}
		if Hamming(a, c) > dab+Hamming(b, c) {
			t.Fatal("triangle inequality")
		}
		na := make([]byte, n)
		for i := range a {
			na[i] = ^a[i]
		}
		if Hamming(a, na) != 8*n {
			t.Fatal("d(a, ¬a) ≠ bits")
		}
		// Unequal lengths: the shorter is zero-padded.
		d := code(rng.IntN(40))
		if Hamming(a, d) != bitLoopHamming(a, d) || Hamming(d, a) != Hamming(a, d) {
			t.Fatalf("unequal lengths %d/%d: %d, bit loop %d", len(a), len(d), Hamming(a, d), bitLoopHamming(a, d))
		}
	}
	var zero []byte
	if bits.OnesCount8(0xff) != 8 || Hamming(zero, nil) != 0 {
		t.Fatal("empty codes")
	}
}

func TestHashBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	// GQA: one part per head.
	gqa := mustEncoder(t, 32, 16, 5)
	// MLA: a nope part and a rope part on a single head of 48 + 16.
	nope, rope := mustEncoder(t, 48, 48, 5), mustEncoder(t, 16, 16, 6)
	for _, dt := range allDTypes {
		for _, tc := range []struct {
			s     KShape
			parts []*HashEncoder
		}{
			{KShape{7, 3, 32}, []*HashEncoder{gqa}},
			{KShape{16, 1, 64}, []*HashEncoder{nope, rope}},
		} {
			s := tc.s
			k := randK(rng, dt, s)
			c := HashCodeBytes(tc.parts...)
			dst := make([]byte, s.Tokens*s.Heads*c)
			if err := HashBlock(dst, k, dt, s, tc.parts...); err != nil {
				t.Fatal(err)
			}
			for tok := range s.Tokens {
				for h := range s.Heads {
					x := make([]float32, s.Dim)
					for d := range x {
						x[d] = float32(refAt(k, dt, s, tok, h, d))
					}
					var want []byte
					for _, p := range tc.parts {
						code := make([]byte, p.CodeBytes())
						if err := p.Hash(code, x[:p.InputDim()]); err != nil {
							t.Fatal(err)
						}
						want = append(want, code...)
						x = x[p.InputDim():]
					}
					got := dst[(tok*s.Heads+h)*c : (tok*s.Heads+h+1)*c]
					if !slices.Equal(got, want) {
						t.Fatalf("%v token %d head %d: %x want %x", dt, tok, h, got, want)
					}
				}
			}
		}
	}
}

// TestHashSIMDEqualsPortable: the assembly projection (where the CPU has it) gives the same
// code bytes as the portable loop, bit for bit, at every shape class (32-projection chunks and
// a portable tail), for ordinary inputs, tiny ones (projections near 0) and inputs with zeros,
// infinities and NaNs.
func TestHashSIMDEqualsPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, sh := range []struct{ n, bits int }{{8, 8}, {40, 32}, {64, 56}, {128, 128}, {200, 136}, {512, 512}, {64, 64}} {
		e, err := NewHashEncoder(sh.n, sh.bits, uint64(sh.n))
		if err != nil {
			t.Fatal(err)
		}
		got, want := make([]byte, e.CodeBytes()), make([]byte, e.CodeBytes())
		x := make([]float32, sh.n)
		for it := range 600 {
			for i := range x {
				x[i] = float32(r.NormFloat64())
				switch it % 5 {
				case 1:
					x[i] *= 1e-38 // subnormal projections
				case 2:
					if r.IntN(4) == 0 {
						x[i] = 0
					}
				case 3:
					if r.IntN(50) == 0 {
						x[i] = float32(math.Inf(1 - 2*r.IntN(2)))
					}
				case 4:
					if r.IntN(50) == 0 {
						x[i] = float32(math.NaN())
					}
				}
			}
			if it%6 == 5 { // p_j ≈ 1 − 1: the sign is the two products' rounding (a fused
				// multiply-add would round them differently)
				clear(x)
				j, w := it%sh.bits, e.Weights()
				a, b := r.IntN(sh.n), r.IntN(sh.n)
				if a != b && w[a*sh.bits+j] != 0 && w[b*sh.bits+j] != 0 {
					x[a] = 1 / w[a*sh.bits+j] * (1 + float32(r.NormFloat64())*1e-7)
					x[b] = -1 / w[b*sh.bits+j]
				}
			}
			e.hash(got, x)
			e.hashBytes(want, x, 0)
			if !bytes.Equal(got, want) {
				t.Fatalf("n %d bits %d case %d: %x, portable %x", sh.n, sh.bits, it, got, want)
			}
		}
	}
}
