// Package kvgen generates KV-cache-shaped test data: 16-bit floats (bf16 or fp16) drawn from a
// normal distribution with a per-channel scale, laid out as rows of headDim channels, as a
// K or V tensor of one block is ([tokens][heads][head_dim]). Random bytes or stamped patterns
// compress very differently from real KV; this is what compression is measured and tested
// on. The output is a pure function of (dtype, seed), so a reader can regenerate and compare.
package kvgen

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// DType is a 16-bit float format.
type DType int

const (
	// BF16 is bfloat16: 1 sign, 8 exponent, 7 mantissa bits.
	BF16 DType = iota
	// FP16 is IEEE half precision: 1 sign, 5 exponent, 10 mantissa bits.
	FP16
)

// HeadDim is the channel count of a row (a typical attention head dimension).
const HeadDim = 128

// Fill fills dst (even length; a trailing odd byte is zeroed) with little-endian 16-bit floats
// of dt: value = N(0, 1) × scale[channel], the 128 channel scales being log-normal
// (exp(N(0, 0.75))), drawn from seed like the values.
func Fill(dst []byte, dt DType, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var scale [HeadDim]float64
	for i := range scale {
		scale[i] = math.Exp(0.75 * r.NormFloat64())
	}
	for i := 0; i+2 <= len(dst); i += 2 {
		v := r.NormFloat64() * scale[(i/2)%HeadDim]
		var h uint16
		if dt == FP16 {
			h = toFP16(float32(v))
		} else {
			h = toBF16(float32(v))
		}
		binary.LittleEndian.PutUint16(dst[i:], h)
	}
	if len(dst)%2 == 1 {
		dst[len(dst)-1] = 0
	}
}

// toBF16 rounds f to bfloat16 (round to nearest even; inputs here are finite).
func toBF16(f float32) uint16 {
	b := math.Float32bits(f)
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// toFP16 converts f to IEEE half precision (round to nearest, flush tiny values to zero,
// saturate large ones to infinity).
func toFP16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	man := b & 0x7fffff
	switch {
	case exp >= 31:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint(14 - exp)
		return sign | uint16((man+(1<<(shift-1)))>>shift)
	}
	h := sign | uint16(exp)<<10 | uint16(man>>13)
	if man&0x1000 != 0 {
		h++ // round half up; a carry into the exponent is the right result
	}
	return h
}
