package devio

import "unsafe"

// DefaultAlignment is the alignment in bytes that devio requires of the
// buffer address, length and file offset of every operation on a direct file,
// and the alignment of every buffer returned by AlignedBuffer and BufferPool.
const DefaultAlignment = 4096

// AlignUp returns the smallest multiple of DefaultAlignment that is >= n.
// n must be non-negative.
func AlignUp(n int64) int64 {
	return (n + DefaultAlignment - 1) &^ (DefaultAlignment - 1)
}

// IsAligned reports whether len(b) is a multiple of DefaultAlignment and, for
// a non-empty b, whether the address of b[0] is DefaultAlignment-aligned. An
// empty slice is aligned.
func IsAligned(b []byte) bool {
	if len(b)%DefaultAlignment != 0 {
		return false
	}
	if len(b) == 0 {
		return true
	}
	return addrAligned(b)
}

// addrAligned reports whether the first byte of the non-empty b is aligned.
func addrAligned(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%DefaultAlignment == 0
}

// AlignedBuffer returns a zeroed slice of length n whose first byte is
// DefaultAlignment-aligned in memory; its capacity may exceed n. The memory
// is ordinary Go heap memory (kept alive by the slice), so it is safe to hand
// to the kernel for the duration of a Submit. AlignedBuffer(0) (or a negative
// n) returns an empty, non-nil slice.
func AlignedBuffer(n int) []byte {
	if n <= 0 {
		return []byte{}
	}
	raw := make([]byte, n+DefaultAlignment)
	off := 0
	if a := int(uintptr(unsafe.Pointer(&raw[0])) % DefaultAlignment); a != 0 {
		off = DefaultAlignment - a
	}
	return raw[off : off+n]
}
