package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyNT copies n bytes, n > 0 a multiple of 128, from src to dst (32-byte aligned) with
// non-temporal stores. Implemented in copy_amd64.s.
//
//go:noescape
func copyNT(dst, src *byte, n int)

// copyPF copies n bytes, n > 0 a multiple of 128, from src to dst (32-byte aligned when nt),
// with non-temporal stores when nt, prefetching the n bytes at pf as it goes (the bytes a
// gather copies pfDist later). Implemented in copy_amd64.s.
//
//go:noescape
func copyPF(dst, src *byte, n int, pf *byte, nt bool)

// prefetch asks for the cache lines of [p, p+n), n > 0, to be loaded (PREFETCHT0).
//
//go:noescape
func prefetch(p *byte, n int)

// sfence orders the non-temporal stores issued before it (SFENCE).
func sfence()

var haveNT = cpu.X86.HasAVX2

// copyStream copies src into dst (len(dst) ≥ len(src)) like copy, but writes around the
// caches when the run is at least streamMinRun bytes: what runtime·memmove does for a single
// copy of 1 MiB or more, so that a transfer of many shorter runs moves its bytes the way one
// large copy of them would. Bytes copied this way are ordered only by streamFence, which must
// run on the same goroutine before the copy is reported done.
func copyStream(dst, src []byte) {
	n := len(src)
	if !haveNT || n < streamMinRun {
		copy(dst, src)
		return
	}
	dst = dst[:n]
	head := int(-uintptr(unsafe.Pointer(&dst[0])) & 31) // bytes up to 32-byte alignment
	body := (n - head) &^ 127
	copy(dst[:head], src[:head])
	if body > 0 {
		copyNT(&dst[head], &src[head], body)
	}
	copy(dst[head+body:], src[head+body:])
}

// streamFence makes the bytes copyStream wrote with non-temporal stores visible in order with
// the stores that follow it (the completion of the copy).
func streamFence() {
	if haveNT {
		sfence()
	}
}
