package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refFormat describes a small binary float format from its bit fields, for references computed
// independently of convert.go: values with math.Ldexp, rounding by a search over all codes.
type refFormat struct {
	name          string
	bits          uint // total bits (8 or 16)
	expBits, mant uint
	bias          int
	fn            bool // e4m3fn: no infinities; only the all-ones code (per sign) is NaN
}

var (
	refF16  = refFormat{name: "float16", bits: 16, expBits: 5, mant: 10, bias: 15}
	refBF16 = refFormat{name: "bfloat16", bits: 16, expBits: 8, mant: 7, bias: 127}
	refE4M3 = refFormat{name: "e4m3fn", bits: 8, expBits: 4, mant: 3, bias: 7, fn: true}
	refE5M2 = refFormat{name: "e5m2", bits: 8, expBits: 5, mant: 2, bias: 15}
)

// value returns the code's value as a float64: NaN, ±Inf or a finite value from its fields.
func (r refFormat) value(c uint32) float64 {
	sign := 1.0
	if c>>(r.bits-1)&1 == 1 {
		sign = -1
	}
	e := int(c>>r.mant) & (1<<r.expBits - 1)
	m := int(c & (1<<r.mant - 1))
	maxE := 1<<r.expBits - 1
	switch {
	case r.fn && e == maxE && m == 1<<r.mant-1:
		return math.NaN()
	case !r.fn && e == maxE && m != 0:
		return math.NaN()
	case !r.fn && e == maxE:
		return math.Inf(int(sign))
	case e == 0:
		return sign * math.Ldexp(float64(m), 1-r.bias-int(r.mant))
	}
	return sign * math.Ldexp(float64(m|1<<r.mant), e-r.bias-int(r.mant))
}

// maxCode is the largest finite positive code; the code after it stands for overflow.
func (r refFormat) maxCode() uint32 {
	if r.fn {
		return 1<<(r.bits-1) - 2
	}
	return (1<<r.expBits-1)<<r.mant - 1
}

// round is the reference float32 → code: the nearest of all finite codes, ties to the even
// code; the virtual code maxCode+1 (value max + one ulp) stands for overflow, which is Inf or,
// for e4m3fn, NaN. NaN maps to any NaN (checked separately).
func (r refFormat) round(f float32) (code uint32, nan bool) {
	x := float64(f)
	if math.IsNaN(x) {
		return 0, true
	}
	var sign uint32
	if math.Signbit(x) {
		sign = 1 << (r.bits - 1)
		x = -x
	}
	top := r.maxCode() + 1
	topVal := r.value(r.maxCode()) + (r.value(r.maxCode()) - r.value(r.maxCode()-1))
	if math.IsInf(x, 1) {
		x = 2 * topVal
	}
	// Positive codes are ordered like their values: binary search the first code ≥ x.
	val := func(c uint32) float64 {
		if c == top {
			return topVal
		}
		return r.value(c)
	}
	lo, hi := uint32(0), top
	if x >= topVal {
		lo = top
	} else {
		for lo < hi {
			mid := (lo + hi) / 2
			if val(mid) < x {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
	}
	c := lo
	if c > 0 && val(c) != x {
		below := c - 1
		db, da := x-val(below), val(c)-x
		if db < da || db == da && below&1 == 0 {
			c = below
		}
	}
	if c == top {
		if r.fn {
			return sign | top, true
		}
		return sign | top, false // the Inf code
	}
	return sign | c, false
}

func TestDecodeExhaustive(t *testing.T) {
	cases := []struct {
		r   refFormat
		dec func(uint32) float32
	}{
		{refF16, func(c uint32) float32 { return Float16ToFloat32(uint16(c)) }},
		{refBF16, func(c uint32) float32 { return BFloat16ToFloat32(uint16(c)) }},
		{refE4M3, func(c uint32) float32 { return Float8E4M3ToFloat32(uint8(c)) }},
		{refE5M2, func(c uint32) float32 { return Float8E5M2ToFloat32(uint8(c)) }},
	}
	for _, tc := range cases {
		for c := uint32(0); c < 1<<tc.r.bits; c++ {
			want := tc.r.value(c)
			got := tc.dec(c)
			if math.IsNaN(want) {
				if !math.IsNaN(float64(got)) {
					t.Fatalf("%s %#x: got %v want NaN", tc.r.name, c, got)
				}
				if math.Signbit(float64(got)) != (c>>(tc.r.bits-1) == 1) {
					t.Fatalf("%s %#x: NaN lost its sign", tc.r.name, c)
				}
				continue
			}
			if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
				t.Fatalf("%s %#x: got %v want %v", tc.r.name, c, got, want)
			}
		}
	}
}

// TestEncodeAgainstReference checks each float32 → code conversion against the reference on
// every code's value, every midpoint between neighbours and one float32 ulp either side of
// it, overflow boundaries, and random float32s of every magnitude.
func TestEncodeAgainstReference(t *testing.T) {
	cases := []struct {
		r   refFormat
		enc func(float32) uint32
	}{
		{refF16, func(f float32) uint32 { return uint32(Float32ToFloat16(f)) }},
		{refBF16, func(f float32) uint32 { return uint32(Float32ToBFloat16(f)) }},
		{refE4M3, func(f float32) uint32 { return uint32(Float32ToFloat8E4M3(f)) }},
		{refE5M2, func(f float32) uint32 { return uint32(Float32ToFloat8E5M2(f)) }},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range cases {
		var inputs []float32
		top := tc.r.maxCode()
		for c := uint32(0); c <= top; c++ {
			// bfloat16 has 32K positive codes and a uniform rounding path: every 5th in the
			// middle (the race detector makes the full sweep slow), all near the ends.
			if tc.r.name == "bfloat16" && c > 512 && c < top-512 && c%5 != 0 {
				continue
			}
			v := tc.r.value(c)
			next := tc.r.value(c + 1)
			if c == top {
				next = v + (v - tc.r.value(c-1))
			}
			mid := float32((v + next) / 2) // exact in float32 for every format here
			inputs = append(inputs, float32(v), mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))))
		}
		inputs = append(inputs, float32(math.Inf(1)), math.MaxFloat32, math.SmallestNonzeroFloat32, 0)
		for range 10000 {
			inputs = append(inputs, math.Float32frombits(rng.Uint32()&0x7fffffff))
		}
		if tc.r.bits == 8 || tc.r.name == "float16" {
			for range 10000 { // concentrate on the format's range
				inputs = append(inputs, float32(math.Ldexp(rng.Float64()+0.5, rng.IntN(40)-28)))
			}
		}
		for _, f := range inputs {
			for _, x := range []float32{f, -f} {
				want, wantNaN := tc.r.round(x)
				got := tc.enc(x)
				if wantNaN {
					if !math.IsNaN(tc.r.value(got)) {
						t.Fatalf("%s(%v = %#x): got %#x want NaN", tc.r.name, x, math.Float32bits(x), got)
					}
					if got>>(tc.r.bits-1) != uint32(math.Float32bits(x)>>31) {
						t.Fatalf("%s(%v): NaN %#x lost the sign", tc.r.name, x, got)
					}
					continue
				}
				if got != want {
					t.Fatalf("%s(%v = %#x): got %#x (%v) want %#x (%v)", tc.r.name, x, math.Float32bits(x), got, tc.r.value(got), want, tc.r.value(want))
				}
			}
		}
		// NaN inputs, with and without payload, of both signs, stay NaN with their sign.
		for _, nb := range []uint32{0x7fc00000, 0x7f800001, 0x7fffffff, 0xffc00000, 0xff800001, 0x7fa00000} {
			got := tc.enc(math.Float32frombits(nb))
			if !math.IsNaN(tc.r.value(got)) || got>>(tc.r.bits-1) != nb>>31 {
				t.Fatalf("%s(NaN %#x) = %#x", tc.r.name, nb, got)
			}
		}
	}
}

func TestRoundTripEveryCode(t *testing.T) {
	for c := range 1 << 16 {
		h := uint16(c)
		if f := Float16ToFloat32(h); !math.IsNaN(float64(f)) && Float32ToFloat16(f) != h {
			t.Fatalf("float16 %#x -> %v -> %#x", h, f, Float32ToFloat16(f))
		}
		if f := BFloat16ToFloat32(h); !math.IsNaN(float64(f)) && Float32ToBFloat16(f) != h {
			t.Fatalf("bfloat16 %#x -> %v -> %#x", h, f, Float32ToBFloat16(f))
		}
	}
	for c := range 256 {
		b := uint8(c)
		if f := Float8E4M3ToFloat32(b); !math.IsNaN(float64(f)) && Float32ToFloat8E4M3(f) != b {
			t.Fatalf("e4m3 %#x -> %v -> %#x", b, f, Float32ToFloat8E4M3(f))
		}
		if f := Float8E5M2ToFloat32(b); !math.IsNaN(float64(f)) && Float32ToFloat8E5M2(f) != b {
			t.Fatalf("e5m2 %#x -> %v -> %#x", b, f, Float32ToFloat8E5M2(f))
		}
	}
}

// TestTorchBoundaries pins the overflow and NaN behaviour documented in convert.go.
func TestTorchBoundaries(t *testing.T) {
	cases := []struct {
		name string
		got  uint32
		want uint32
	}{
		{"f16 65504", uint32(Float32ToFloat16(65504)), 0x7bff},
		{"f16 65519", uint32(Float32ToFloat16(65519)), 0x7bff},
		{"f16 65520", uint32(Float32ToFloat16(65520)), 0x7c00},
		{"f16 -inf", uint32(Float32ToFloat16(float32(math.Inf(-1)))), 0xfc00},
		{"f16 2^-24", uint32(Float32ToFloat16(0x1p-24)), 0x0001},
		{"f16 2^-25", uint32(Float32ToFloat16(0x1p-25)), 0x0000},
		{"f16 1.5*2^-25", uint32(Float32ToFloat16(0x1.8p-25)), 0x0001},
		{"bf16 max", uint32(Float32ToBFloat16(math.MaxFloat32)), 0x7f80},
		{"bf16 1+2^-8", uint32(Float32ToBFloat16(1 + 0x1p-8)), 0x3f80},
		{"bf16 1+3*2^-8", uint32(Float32ToBFloat16(1 + 0x3p-8)), 0x3f82},
		{"e4m3 448", uint32(Float32ToFloat8E4M3(448)), 0x7e},
		{"e4m3 464", uint32(Float32ToFloat8E4M3(464)), 0x7e},
		{"e4m3 464.1", uint32(Float32ToFloat8E4M3(464.1)), 0x7f},
		{"e4m3 -1000", uint32(Float32ToFloat8E4M3(-1000)), 0xff},
		{"e4m3 +inf", uint32(Float32ToFloat8E4M3(float32(math.Inf(1)))), 0x7f},
		{"e4m3 2^-9", uint32(Float32ToFloat8E4M3(0x1p-9)), 0x01},
		{"e4m3 2^-10", uint32(Float32ToFloat8E4M3(0x1p-10)), 0x00},
		{"e5m2 57344", uint32(Float32ToFloat8E5M2(57344)), 0x7b},
		{"e5m2 61439", uint32(Float32ToFloat8E5M2(61439)), 0x7b},
		{"e5m2 61440", uint32(Float32ToFloat8E5M2(61440)), 0x7c},
		{"e5m2 -inf", uint32(Float32ToFloat8E5M2(float32(math.Inf(-1)))), 0xfc},
		{"e5m2 2^-16", uint32(Float32ToFloat8E5M2(0x1p-16)), 0x01},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: got %#x want %#x", c.name, c.got, c.want)
		}
	}
}

func TestBulkConversions(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []DType{Float16, BFloat16, Float8E4M3, Float8E5M2, Float32} {
		n := 1000
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(rng.NormFloat64() * 10)
		}
		buf := make([]byte, n*dt.Size())
		if err := EncodeFloat32(buf, src, dt); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, n)
		if err := DecodeFloat32(got, buf, dt); err != nil {
			t.Fatal(err)
		}
		for i, f := range src {
			var want float32
			switch dt {
			case Float16:
				want = Float16ToFloat32(Float32ToFloat16(f))
			case BFloat16:
				want = BFloat16ToFloat32(Float32ToBFloat16(f))
			case Float8E4M3:
				want = Float8E4M3ToFloat32(Float32ToFloat8E4M3(f))
			case Float8E5M2:
				want = Float8E5M2ToFloat32(Float32ToFloat8E5M2(f))
			case Float32:
				want = f
			}
			if got[i] != want && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want))) {
				t.Fatalf("%v element %d: %v -> %v, want %v", dt, i, f, got[i], want)
			}
		}
		// Encoding what was decoded gives the same bytes back.
		again := make([]byte, len(buf))
		if err := EncodeFloat32(again, got, dt); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(again, buf) {
			t.Fatalf("%v: decode/encode changed bytes", dt)
		}
	}
	if err := DecodeFloat32(make([]float32, 3), make([]byte, 5), Float16); !errors.Is(err, ErrInvalid) {
		t.Fatalf("short source: %v", err)
	}
	if err := EncodeFloat32(make([]byte, 4), make([]float32, 1), DType(9)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad dtype: %v", err)
	}
}
