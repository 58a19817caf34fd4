//go:build !amd64

package kernels

import "unsafe"

// prefetch does nothing on this architecture.
func prefetch(p *byte, n int) {}

// copyPF copies n bytes from src to dst; it is not reached on this architecture (gatherAhead
// uses it only with memcopy.HaveNT).
func copyPF(dst, src *byte, n int, pf *byte, nt bool) {
	copy(unsafe.Slice(dst, n), unsafe.Slice(src, n))
}
