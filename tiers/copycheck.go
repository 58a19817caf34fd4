package tiers

import "github.com/ucm-go/ucm/format"

// copyCheck3Generic is copyCheck3 without assembly: copy, then checksum the copy while it is
// in cache.
func copyCheck3Generic(d0, s0, d1, s1, d2, s2 []byte) (c0, c1, c2 uint32) {
	copy(d0, s0)
	copy(d1, s1)
	copy(d2, s2)
	return format.Checksum(d0), format.Checksum(d1), format.Checksum(d2)
}
