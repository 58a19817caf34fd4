//go:build !amd64

package kernels

import "unsafe"

// copyStream is copy on this architecture (no non-temporal stores).
func copyStream(dst, src []byte) { copy(dst, src) }

// streamFence does nothing on this architecture.
func streamFence() {}

// prefetch does nothing on this architecture.
func prefetch(p *byte, n int) {}

// haveNT is false: no non-temporal copy routine on this architecture.
const haveNT = false

// copyPF copies n bytes from src to dst; it is not reached on this architecture (gatherAhead
// uses it only with haveNT).
func copyPF(dst, src *byte, n int, pf *byte, nt bool) {
	copy(unsafe.Slice(dst, n), unsafe.Slice(src, n))
}
