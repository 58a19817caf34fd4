//go:build !amd64

package kernels

// copyStream is copy on this architecture (no non-temporal stores).
func copyStream(dst, src []byte) { copy(dst, src) }

// streamFence does nothing on this architecture.
func streamFence() {}
