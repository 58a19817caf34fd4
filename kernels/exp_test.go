package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// expImpls are ExpColumns as called (the AVX2+FMA kernel where the CPU has it, for rows of 8
// columns and of 1, 2 or 4) and the portable loop.
var expImpls = []struct {
	name string
	run  func(t *testing.T, x, shift, sum []float32)
}{
	{"exported", func(t *testing.T, x, shift, sum []float32) { must(t, ExpColumns(x, shift, sum)) }},
	{"go", func(t *testing.T, x, shift, sum []float32) { expColumnsGo(x, shift, sum) }},
}

// checkExp: got is e^t as ExpColumns promises: 0 for NaN and below ExpMin, +Inf where e^t
// exceeds MaxFloat32 (or rounds past it within the error), else within ExpRelError of math.Exp.
func checkExp(t *testing.T, what string, arg, got float32) {
	t.Helper()
	a := float64(arg)
	want := math.Exp(a)
	switch {
	case arg != arg || a < float64(ExpMin):
		if got != 0 {
			t.Fatalf("%s: e^%v = %v, want 0", what, arg, got)
		}
	case want*(1+ExpRelError) > math.MaxFloat32:
		if !math.IsInf(float64(got), 1) && (want > math.MaxFloat32 || math.Abs(float64(got)-want) > ExpRelError*want) {
			t.Fatalf("%s: e^%v = %v, want %v or +Inf", what, arg, got, want)
		}
	default:
		if e := math.Abs(float64(got)-want) / want; !(e <= ExpRelError) {
			t.Fatalf("%s: e^%v = %v, want %v (relative error %.3g > %g)", what, arg, got, want, e, ExpRelError)
		}
	}
}

// TestExpColumnsAccuracy: every implementation agrees with math.Exp within ExpRelError over the
// whole float32 line (a stride through every bit pattern: both signs, every exponent,
// subnormals, NaNs), densely over [−90, 90], and at the edges: ±0, ±Inf, NaN, ExpMin and its
// neighbours, ln MaxFloat32 and its neighbours.
func TestExpColumnsAccuracy(t *testing.T) {
	args := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x7fc00001), math.Float32frombits(0xffc00000), math.Float32frombits(0x7f800001), // NaNs
		ExpMin, math.Nextafter32(ExpMin, 0), math.Nextafter32(ExpMin, -1), -87.5, -88, -103, -104, -1e4, -math.MaxFloat32,
		88.72283, math.Nextafter32(88.72283, 0), math.Nextafter32(88.72283, 100), 88.75, 89, 1e4, math.MaxFloat32,
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1e-30, -1e-30, 0.34657359, -0.34657359, 1, -1}
	for b := uint64(0); b < 1<<32; b += 4093 {
		args = append(args, math.Float32frombits(uint32(b)))
	}
	for x := -90.0; x <= 90; x += 1.0 / 4096 {
		args = append(args, float32(x))
	}
	for len(args)%8 != 0 {
		args = append(args, 0)
	}
	for _, im := range expImpls {
		x := append([]float32(nil), args...)
		shift, sum := make([]float32, 8), make([]float32, 8)
		im.run(t, x, shift, sum)
		for i, got := range x {
			checkExp(t, im.name, args[i], got)
		}
	}
}

// TestExpColumnsSoftmax: rows of random logits (some NaN or ±Inf) with every column's maximum as
// its shift, for column counts the kernel takes (multiples of 8; 1, 2, 4 folded into 8) and
// others: each value is e^(x − shift) within ExpRelError, each column's sum is the float64 sum of
// the exact exponentials within ExpRelError plus float32 accumulation, and a NaN logit neither
// leaves a NaN behind nor changes its column's sum.
func TestExpColumnsSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for it := range 600 {
		c := []int{1, 2, 3, 4, 5, 8, 16, 24, 32, 40}[r.IntN(10)]
		rows := r.IntN(70)
		spread := []float64{1, 10, 100}[r.IntN(3)]
		x := make([]float32, rows*c)
		for i := range x {
			x[i] = float32(r.NormFloat64() * spread)
			if r.IntN(50) == 0 {
				x[i] = []float32{float32(math.NaN()), float32(math.Inf(-1))}[r.IntN(2)]
			}
		}
		shift := make([]float32, c)
		for j := range shift {
			shift[j] = float32(math.Inf(-1))
			for i := j; i < len(x); i += c {
				if x[i] > shift[j] { // NaN is not a maximum
					shift[j] = x[i]
				}
			}
			if math.IsInf(float64(shift[j]), -1) {
				shift[j] = 0
			}
		}
		for _, im := range expImpls {
			got := append(make([]float32, 0, len(x)+1), x...)
			got = append(got, 42)
			sum := make([]float32, c)
			for j := range sum {
				sum[j] = 0.5 // sums are added to
			}
			im.run(t, got[:len(x)], shift, sum)
			if got[len(x)] != 42 {
				t.Fatalf("case %d %s: wrote past x", it, im.name)
			}
			want := make([]float64, c)
			for i, v := range x {
				arg := v - shift[i%c]
				checkExp(t, im.name, arg, got[i])
				if arg >= ExpMin {
					want[i%c] += math.Exp(float64(arg))
				}
			}
			for j := range c {
				w := 0.5 + want[j]
				if e := math.Abs(float64(sum[j])-w) / w; !(e <= ExpRelError+float64(rows)*6e-8) {
					t.Fatalf("case %d %s: %d rows of %d: column %d sums %v, want %v", it, im.name, rows, c, j, sum[j], w)
				}
			}
		}
	}
}

// TestExpColumnsRefusesShapes: no columns, sums of another length, or values that are not whole
// rows are ErrInvalid, and nothing is written.
func TestExpColumnsRefusesShapes(t *testing.T) {
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, c := range []struct{ x, shift, sum []float32 }{
		{x, nil, nil},
		{x, make([]float32, 2), make([]float32, 2)}, // 9 values are not rows of 2
		{x[:8], make([]float32, 8), make([]float32, 4)},
	} {
		if err := ExpColumns(c.x, c.shift, c.sum); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%d values, %d shifts, %d sums: %v, want ErrInvalid", len(c.x), len(c.shift), len(c.sum), err)
		}
	}
	for i, v := range x {
		if v != float32(i+1) {
			t.Fatalf("x written: %v", x)
		}
	}
}

// BenchmarkExpColumns: one ESA softmax step's exponentials at 32 query heads (1,021 candidates).
func BenchmarkExpColumns(b *testing.B) {
	const rows, cols = 1021, 32
	src := make([]float32, rows*cols)
	for i := range src {
		src[i] = -float32(i%97) / 8
	}
	x, shift, sum := make([]float32, len(src)), make([]float32, cols), make([]float32, cols)
	for _, im := range []struct {
		name string
		f    func(x, shift, sum []float32)
	}{{"dispatch", expColumns}, {"go", expColumnsGo}} {
		b.Run(im.name, func(b *testing.B) {
			for range b.N {
				copy(x, src)
				im.f(x, shift, sum)
			}
		})
	}
}
