//go:build linux

package devio

import "golang.org/x/sys/unix"

// allocate reserves [0, size) of fd with fallocate(2) mode 0: the blocks are allocated (as
// unwritten extents, which read as zeros) and the file size becomes at least size.
func allocate(fd uintptr, size int64) error { return unix.Fallocate(int(fd), 0, 0, size) }

// truncate sets fd's size with ftruncate(2).
func truncate(fd uintptr, size int64) error { return unix.Ftruncate(int(fd), size) }
