package kernels

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
