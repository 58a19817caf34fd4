package memcopy

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyNT copies n bytes, n > 0 a multiple of 128, from src to dst (32-byte aligned) with
// non-temporal stores. Implemented in stream_amd64.s.
//
//go:noescape
func copyNT(dst, src *byte, n int)

// sfence orders the non-temporal stores issued before it (SFENCE).
func sfence()

// HaveNT reports whether Stream writes around the caches on this CPU (AVX2).
var HaveNT = cpu.X86.HasAVX2

// Stream copies src into dst (len(dst) ≥ len(src)) like copy, but writes around the caches
// when the copy is at least MinRun bytes. Bytes copied this way are ordered only by Fence,
// which must run on the same goroutine before the copy is reported done (to another goroutine
// or to a device).
func Stream(dst, src []byte) {
	n := len(src)
	if !HaveNT || n < MinRun {
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

// Fence makes the bytes Stream (or another non-temporal store) wrote on this goroutine visible
// in order with the stores that follow it (the completion of the copy).
func Fence() {
	if HaveNT {
		sfence()
	}
}
