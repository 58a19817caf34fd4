//go:build unix

package devio

import "golang.org/x/sys/unix"

// pread reads from fd at off.
func pread(fd uintptr, b []byte, off int64) (n int, err error) {
	return unix.Pread(int(fd), b, off)
}

// pwrite writes to fd at off.
func pwrite(fd uintptr, b []byte, off int64) (n int, err error) {
	return unix.Pwrite(int(fd), b, off)
}

// rawFdIO reports whether pread/pwrite on raw descriptors are available.
const rawFdIO = true

// isRetryable reports whether err is EINTR or EAGAIN (retry without progress).
func isRetryable(err error) bool { return err == unix.EINTR || err == unix.EAGAIN }
