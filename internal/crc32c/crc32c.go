// Package crc32c computes CRC32C (Castagnoli), the checksum of every byte UCM-Go stores: the
// same function as hash/crc32 with the Castagnoli table, bit for bit, faster on large buffers
// when the binary is built with the `isal` tag.
//
// Built with `isal` (and cgo), buffers of AccelMinBytes or more are checksummed by Intel's
// ISA-L (crc32_iscsi, Debian's libisal-dev), which picks the widest code path the CPU has
// (AVX-512 with VPCLMULQDQ folding where present); shorter ones, and every buffer in a build
// without the tag, by Go's hash/crc32 (SSE4.2). On the project's machines (AMD EPYC, AVX-512)
// ISA-L checksums 16 MiB that are in memory but not in cache at 2.3× Go's rate and 256 KiB
// in cache at 1.9× (docs/performance.md, "Checksums"). Implementation says which is linked.
package crc32c

import "hash/crc32"

// AccelMinBytes is the shortest buffer handed to the accelerated implementation: below it the
// cost of the cgo call outweighs the faster loop (measured: 2 KiB is the first size where
// ISA-L wins).
const AccelMinBytes = 2048

// accelChunkBytes bounds the bytes of one call into the accelerated implementation, so that
// a call returns within a few microseconds (a longer cgo call makes the runtime hand its
// processor to another thread).
const accelChunkBytes = 256 << 10

var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC32C of p (= hash/crc32.Checksum(p, Castagnoli table)).
func Checksum(p []byte) uint32 { return Update(0, p) }

// Update returns the CRC32C of the bytes checksummed into crc followed by p:
// Update(Checksum(a), b) == Checksum(a+b), and Update(0, b) == Checksum(b).
func Update(crc uint32, p []byte) uint32 {
	if len(p) < AccelMinBytes || !accelerated {
		return crc32.Update(crc, table, p)
	}
	for len(p) > 0 {
		n := min(len(p), accelChunkBytes)
		crc = accelUpdate(crc, p[:n])
		p = p[n:]
	}
	return crc
}

// Implementation names the code that checksums buffers of AccelMinBytes or more: "isa-l" in a
// build with the `isal` tag, else "go".
func Implementation() string { return implementation }
