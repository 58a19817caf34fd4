//go:build !amd64

package tiers

// copyCheck3 copies three equal-length parts (s0 into d0, s1 into d1, s2 into d2) and returns
// the format.Checksum of each.
func copyCheck3(d0, s0, d1, s1, d2, s2 []byte) (c0, c1, c2 uint32) {
	n := len(s0)
	return copyCheck3Generic(d0[:n], s0, d1[:n], s1[:n], d2[:n], s2[:n])
}
