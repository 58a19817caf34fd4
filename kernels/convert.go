package kernels

import (
	"encoding/binary"
	"math"
	"sync"
)

// Conversions between float32 and the element types of KV caches.
//
// Every float32 → narrow conversion rounds to nearest, ties to even, and keeps NaN a NaN (with
// its sign, and quiet). Overflow follows torch's Tensor.to(dtype) exactly:
//
//   - float16, bfloat16, float8_e5m2 (IEEE-like): a magnitude that rounds beyond the largest
//     finite value becomes ±Inf (float16: |x| ≥ 65520; e5m2: |x| ≥ 61440).
//   - float8_e4m3fn (no infinities): a magnitude that rounds beyond 448 (|x| > 464), ±Inf and
//     NaN all become NaN (0x7F, or 0xFF when negative). This is not saturating: torch's plain
//     cast is not either; callers that want saturation clamp to ±448 first.
//
// Narrow → float32 is exact for every code (every float16, bfloat16 and float8 value is a
// float32 value). Multi-byte elements are little-endian in byte slices, as in host and GPU
// memory.

// Float16ToFloat32 returns the float32 value of the IEEE binary16 code h (exact; NaN payloads
// are kept).
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	f := float32(mant) * (1.0 / (1 << 24)) // subnormal: mant × 2^-24, exact
	return math.Float32frombits(sign | math.Float32bits(f))
}

// Float32ToFloat16 rounds f to the nearest binary16 value, ties to even; |f| ≥ 65520 becomes
// ±Inf; NaN stays a quiet NaN with its sign and the top bits of its payload.
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00 | uint16(abs>>13)&0x3ff
	case abs >= 0x477ff000: // 65520, the midpoint between 65504 and the next (2^16): to even = Inf
		return sign | 0x7c00
	case abs >= 0x38800000: // 2^-14, the smallest normal
		m := abs - (127-15)<<23
		m += 0xfff + (m>>13)&1
		return sign | uint16(m>>13)
	case abs <= 0x33000000: // 2^-25 (half the smallest subnormal, ties to 0) and below
		return sign
	}
	// Subnormal result: value = (abs's mantissa with the hidden bit) × 2^(e-150), in units of
	// 2^-24 that is m >> (126-e), 14 ≤ shift ≤ 24.
	e := abs >> 23
	m := abs&0x7fffff | 0x800000
	return sign | uint16(roundShift(m, 126-e))
}

// roundShift returns m >> s rounded to nearest, ties to even (1 ≤ s ≤ 31).
func roundShift(m, s uint32) uint32 {
	r := m >> s
	rem := m & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || rem == half && r&1 == 1 {
		r++
	}
	return r
}

// BFloat16ToFloat32 returns the float32 value of the bfloat16 code b (exact).
func BFloat16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Float32ToBFloat16 rounds f to the nearest bfloat16, ties to even; values that round beyond
// the largest finite bfloat16 become ±Inf; NaN stays a quiet NaN with its sign.
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float8E4M3ToFloat32 returns the float32 value of the OCP float8 E4M3FN code b (bias 7, no
// infinities; 0x7F and 0xFF are NaN). Exact.
func Float8E4M3ToFloat32(b uint8) float32 {
	sign := uint32(b>>7) << 31
	exp := uint32(b>>3) & 0xf
	mant := uint32(b) & 7
	switch {
	case exp == 0xf && mant == 7:
		return math.Float32frombits(sign | 0x7fc00000)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-7)<<23 | mant<<20)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	f := float32(mant) * (1.0 / (1 << 9)) // subnormal: mant × 2^-9
	return math.Float32frombits(sign | math.Float32bits(f))
}

// Float32ToFloat8E4M3 rounds f to the nearest OCP float8 E4M3FN value, ties to even, as torch
// does: |f| > 464 (rounding beyond 448), ±Inf and NaN become NaN (0x7F with f's sign).
func Float32ToFloat8E4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	abs := b & 0x7fffffff
	switch {
	case abs > 0x43e80000: // > 464, Inf, NaN
		return sign | 0x7f
	case abs >= 0x3c800000: // 2^-6, the smallest normal
		m := abs - (127-7)<<23
		m += 0x7ffff + (m>>20)&1
		return sign | uint8(m>>20)
	case abs <= 0x3a800000: // 2^-10: half the smallest subnormal 2^-9, ties to 0
		return sign
	}
	// Subnormal: units of 2^-9: m × 2^(e-150+9) = m >> (141-e), 21 ≤ shift ≤ 24.
	e := abs >> 23
	m := abs&0x7fffff | 0x800000
	return sign | uint8(roundShift(m, 141-e))
}

// Float8E5M2ToFloat32 returns the float32 value of the OCP float8 E5M2 code b (bias 15, IEEE
// infinities and NaNs; the high byte of a binary16). Exact.
func Float8E5M2ToFloat32(b uint8) float32 { return Float16ToFloat32(uint16(b) << 8) }

// Float32ToFloat8E5M2 rounds f to the nearest OCP float8 E5M2 value, ties to even:
// |f| ≥ 61440 becomes ±Inf, NaN stays NaN (0x7F with f's sign), as torch does.
func Float32ToFloat8E5M2(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000:
		return sign | 0x7f
	case abs >= 0x47700000: // 61440, the midpoint between 57344 and 2^16: to even = Inf
		return sign | 0x7c
	case abs >= 0x38800000: // 2^-14
		m := abs - (127-15)<<23
		m += 0xfffff + (m>>21)&1
		return sign | uint8(m>>21)
	case abs <= 0x37000000: // 2^-17: half the smallest subnormal 2^-16, ties to 0
		return sign
	}
	// Subnormal: units of 2^-16: m >> (134-e), 22 ≤ shift ≤ 24.
	e := abs >> 23
	m := abs&0x7fffff | 0x800000
	return sign | uint8(roundShift(m, 134-e))
}

// Decode tables, built on first use: 256 KiB for float16, 1 KiB for each float8.
var (
	f16Table = sync.OnceValue(func() *[1 << 16]float32 {
		t := new([1 << 16]float32)
		for i := range t {
			t[i] = Float16ToFloat32(uint16(i))
		}
		return t
	})
	e4m3Table = sync.OnceValue(func() *[256]float32 {
		t := new([256]float32)
		for i := range t {
			t[i] = Float8E4M3ToFloat32(uint8(i))
		}
		return t
	})
	e5m2Table = sync.OnceValue(func() *[256]float32 {
		t := new([256]float32)
		for i := range t {
			t[i] = Float8E5M2ToFloat32(uint8(i))
		}
		return t
	})
)

// DecodeFloat32 converts the len(dst) elements of type dt in src (little-endian, contiguous)
// to float32, exactly. len(src) must be len(dst)·dt.Size(); otherwise it returns ErrInvalid
// and writes nothing.
func DecodeFloat32(dst []float32, src []byte, dt DType) error {
	if !dt.Valid() {
		return errorf(ErrInvalid, "decode: dtype %v", dt)
	}
	if len(src) != len(dst)*dt.Size() {
		return errorf(ErrInvalid, "decode: %d bytes of %v for %d elements (want %d)", len(src), dt, len(dst), len(dst)*dt.Size())
	}
	decodeRow(dst, src, dt)
	return nil
}

// decodeRow is DecodeFloat32 for checked arguments: len(src) == len(dst)·dt.Size().
func decodeRow(dst []float32, src []byte, dt DType) {
	switch dt {
	case Float16:
		// Four elements per 8-byte load; table lookups for each.
		t := f16Table()
		src = src[:2*len(dst)]
		i := 0
		for ; i+4 <= len(dst); i += 4 {
			w := binary.LittleEndian.Uint64(src[2*i:])
			d := dst[i : i+4 : i+4]
			d[0] = t[uint16(w)]
			d[1] = t[uint16(w>>16)]
			d[2] = t[uint16(w>>32)]
			d[3] = t[uint16(w>>48)]
		}
		for ; i < len(dst); i++ {
			dst[i] = t[binary.LittleEndian.Uint16(src[2*i:])]
		}
	case BFloat16:
		src = src[:2*len(dst)]
		i := 0
		for ; i+4 <= len(dst); i += 4 {
			w := binary.LittleEndian.Uint64(src[2*i:])
			d := dst[i : i+4 : i+4]
			d[0] = math.Float32frombits(uint32(w) << 16)
			d[1] = math.Float32frombits(uint32(w>>16) << 16)
			d[2] = math.Float32frombits(uint32(w>>32) << 16)
			d[3] = math.Float32frombits(uint32(w>>48) << 16)
		}
		for ; i < len(dst); i++ {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case Float8E4M3, Float8E5M2:
		t := e4m3Table()
		if dt == Float8E5M2 {
			t = e5m2Table()
		}
		src = src[:len(dst)]
		for i, b := range src {
			dst[i] = t[b]
		}
	case Float32:
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	}
}

// EncodeFloat32 converts src to elements of type dt in dst (little-endian, contiguous),
// rounding as the scalar Float32To* functions do. len(dst) must be len(src)·dt.Size();
// otherwise it returns ErrInvalid and writes nothing.
func EncodeFloat32(dst []byte, src []float32, dt DType) error {
	if !dt.Valid() {
		return errorf(ErrInvalid, "encode: dtype %v", dt)
	}
	if len(dst) != len(src)*dt.Size() {
		return errorf(ErrInvalid, "encode: %d bytes of %v for %d elements (want %d)", len(dst), dt, len(src), len(src)*dt.Size())
	}
	encodeRow(dst, src, dt)
	return nil
}

// encodeRow is EncodeFloat32 for checked arguments.
func encodeRow(dst []byte, src []float32, dt DType) {
	switch dt {
	case Float16:
		dst = dst[:2*len(src)]
		for i, f := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], Float32ToFloat16(f))
		}
	case BFloat16:
		dst = dst[:2*len(src)]
		for i, f := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], Float32ToBFloat16(f))
		}
	case Float8E4M3:
		dst = dst[:len(src)]
		for i, f := range src {
			dst[i] = Float32ToFloat8E4M3(f)
		}
	case Float8E5M2:
		dst = dst[:len(src)]
		for i, f := range src {
			dst[i] = Float32ToFloat8E5M2(f)
		}
	case Float32:
		dst = dst[:4*len(src)]
		for i, f := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
		}
	}
}
