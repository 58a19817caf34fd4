package tiers

import (
	"golang.org/x/sys/cpu"

	"github.com/ucm-go/ucm/format"
)

// copyCRC3 copies n bytes (a multiple of 8, > 0) from each of s0, s1, s2 to d0, d1, d2 and
// runs the CRC32 instruction (the Castagnoli polynomial, no pre- or post-inversion) over them
// from the register values c0, c1, c2: three independent chains, so the instruction's latency
// is hidden, and each source byte is read once. Implemented in copycheck_amd64.s.
//
//go:noescape
func copyCRC3(d0, s0, d1, s1, d2, s2 *byte, n int, c0, c1, c2 uint32) (r0, r1, r2 uint32)

var haveCRC3 = cpu.X86.HasSSE42

// copyCheck3 copies three equal-length parts (s0 into d0, s1 into d1, s2 into d2; each dᵢ at
// least as long as s0) and returns the format.Checksum of each, in one pass over the bytes:
// what a memory-tier hit costs is then about one copy, not a copy and a checksum.
func copyCheck3(d0, s0, d1, s1, d2, s2 []byte) (c0, c1, c2 uint32) {
	n := len(s0)
	s1, s2, d0, d1, d2 = s1[:n], s2[:n], d0[:n], d1[:n], d2[:n] // bounds checked here, once
	m := n &^ 7
	if !haveCRC3 || m == 0 {
		return copyCheck3Generic(d0, s0, d1, s1, d2, s2)
	}
	c0, c1, c2 = copyCRC3(&d0[0], &s0[0], &d1[0], &s1[0], &d2[0], &s2[0], m, ^uint32(0), ^uint32(0), ^uint32(0))
	c0, c1, c2 = ^c0, ^c1, ^c2 // format.Checksum inverts on entry and on exit
	if m < n {
		copy(d0[m:], s0[m:])
		copy(d1[m:], s1[m:])
		copy(d2[m:], s2[m:])
		c0 = format.ChecksumUpdate(c0, d0[m:])
		c1 = format.ChecksumUpdate(c1, d1[m:])
		c2 = format.ChecksumUpdate(c2, d2[m:])
	}
	return c0, c1, c2
}
