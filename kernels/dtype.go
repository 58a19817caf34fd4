package kernels

import (
	"fmt"
	"strings"
)

// DType is the element type of a KV cache or of a staged tensor.
type DType uint8

// Element types. The numbering is part of the sidecar payload formats: do not renumber.
const (
	// Float16 is IEEE 754 binary16.
	Float16 DType = 1
	// BFloat16 is bfloat16 (the high half of a binary32).
	BFloat16 DType = 2
	// Float8E4M3 is OCP FP8 E4M3 (FN variant: no infinities, 0x7F/0xFF are NaN), as in
	// torch.float8_e4m3fn.
	Float8E4M3 DType = 3
	// Float8E5M2 is OCP FP8 E5M2 (IEEE-like, with infinities), as in torch.float8_e5m2.
	Float8E5M2 DType = 4
	// Float32 is IEEE 754 binary32.
	Float32 DType = 5
)

// Size is the bytes of one element, or 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case Float16, BFloat16:
		return 2
	case Float8E4M3, Float8E5M2:
		return 1
	case Float32:
		return 4
	}
	return 0
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d.Size() != 0 }

// String returns the torch-style name ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
// "float32") or "dtype(N)".
func (d DType) String() string {
	switch d {
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Float8E4M3:
		return "float8_e4m3fn"
	case Float8E5M2:
		return "float8_e5m2"
	case Float32:
		return "float32"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType accepts the String names, with or without a "torch." prefix, and the short forms
// "fp16", "half", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp32", "float".
func ParseDType(s string) (DType, error) {
	switch strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "torch.") {
	case "float16", "fp16", "half":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "float8_e4m3fn", "float8_e4m3", "fp8", "fp8_e4m3", "e4m3":
		return Float8E4M3, nil
	case "float8_e5m2", "fp8_e5m2", "e5m2":
		return Float8E5M2, nil
	case "float32", "fp32", "float":
		return Float32, nil
	}
	return 0, errorf(ErrInvalid, "unknown dtype %q", s)
}
