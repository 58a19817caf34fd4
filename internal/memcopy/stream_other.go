//go:build !amd64

package memcopy

// HaveNT is false: no non-temporal copy routine on this architecture.
const HaveNT = false

// Stream is copy on this architecture (no non-temporal stores).
func Stream(dst, src []byte) { copy(dst, src) }

// Fence does nothing on this architecture.
func Fence() {}
