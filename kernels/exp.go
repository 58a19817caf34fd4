package kernels

import "math"

// The softmax exponential of sparse-attention selection (head_score: softmax): many small
// exponentials of logits already shifted by their maximum, in float32.
//
// ExpColumns computes e^t with t reduced as t = n·ln2 + r (|r| ≤ ln2/2, ln2 split in two parts
// so that n·ln2hi is exact), e^r by its Taylor polynomial to r^7 (Horner, float32), and 2^n
// built from exponent bits in two factors (so n = 128 at the top of the range is exact). Its
// relative error against math.Exp is at most ExpRelError for every t ≥ ExpMin; below ExpMin
// (e^t under the smallest normal float32) the result is 0, above ln(MaxFloat32) +Inf.
// NaN and −Inf give 0: a NaN logit adds nothing to a softmax instead of poisoning the sums of
// its column. On amd64 with AVX2 and FMA the columns are computed eight lanes at a time (fused
// multiply-adds); the portable loop computes the same steps one value at a time, rounding
// differently: both are within ExpRelError (measured: 7.7e-8 and 9.8e-8 at worst over
// [ExpMin, 88.7] in steps of 2^-13, TestExpColumnsAccuracy checks the bound).

const (
	// ExpMin is the smallest t for which ExpColumns computes e^t: ln 2^-126 rounded up, e^t
	// the smallest normal float32. Below it (and for NaN, −Inf) the result is 0.
	ExpMin = float32(-87.33654)
	// ExpRelError bounds |ExpColumns(t) − e^t| / e^t for t ≥ ExpMin (under two float32 ulps).
	ExpRelError = 2e-7

	expHi   = float32(88.75) // above ln(MaxFloat32): the result overflows to +Inf
	expLn2H = float32(0.693359375)
	expLn2L = float32(-2.12194440e-4) // ln 2 − expLn2H
)

// ExpColumns treats x as rows of c = len(shift) columns (len(x) a multiple of c) and sets
// x[r·c+j] = e^(x[r·c+j] − shift[j]), adding each column's results to sum[j] (len(sum) = c):
// the numerators of a softmax over the rows of each column and their sums, when shift holds
// the columns' maxima. An argument x − shift below ExpMin, −∞ or NaN gives 0, one above
// ln MaxFloat32 +Inf; the others are within ExpRelError of e^(x − shift).
func ExpColumns(x, shift, sum []float32) error {
	c := len(shift)
	if c == 0 || len(sum) != c || len(x)%c != 0 {
		return errorf(ErrInvalid, "exp columns: %d values in rows of %d columns (%d shifts, %d sums)", len(x), c, len(shift), len(sum))
	}
	if len(x) > 0 {
		expColumns(x, shift, sum)
	}
	return nil
}

// expColumnsGo is the portable ExpColumns.
func expColumnsGo(x, shift, sum []float32) {
	c := len(shift)
	for r := 0; r+c <= len(x); r += c {
		row := x[r : r+c]
		for j, v := range row {
			e := expF32(v - shift[j])
			row[j] = e
			sum[j] += e
		}
	}
}

// expF32 is e^t as ExpColumns computes it, one value at a time.
func expF32(t float32) float32 {
	if !(t >= ExpMin) { // also NaN
		return 0
	}
	t = min(t, expHi)
	n := float32(math.RoundToEven(float64(t * float32(math.Log2E))))
	r := t - n*expLn2H
	r -= n * expLn2L
	p := ((((((1.0/5040*r+1.0/720)*r+1.0/120)*r+1.0/24)*r+1.0/6)*r+0.5)*r+1)*r + 1
	ni := int32(n)
	n1 := ni >> 1
	return p * math.Float32frombits(uint32(n1+127)<<23) * math.Float32frombits(uint32(ni-n1+127)<<23)
}
