//go:build darwin || linux || openbsd

package devio

import "golang.org/x/sys/unix"

// vectoredIO reports whether preadv/pwritev on raw descriptors are available, so adjacent
// ops can be merged into one request (merge.go).
const vectoredIO = rawFdIO

// preadv reads into bufs, in order, from fd at off.
func preadv(fd uintptr, bufs [][]byte, off int64) (int, error) {
	return unix.Preadv(int(fd), bufs, off)
}

// pwritev writes bufs, in order, to fd at off.
func pwritev(fd uintptr, bufs [][]byte, off int64) (int, error) {
	return unix.Pwritev(int(fd), bufs, off)
}
