//go:build darwin

package devio

import "golang.org/x/sys/unix"

// setDirect turns the page cache off for fd with fcntl(F_NOCACHE), macOS's direct I/O: what
// github.com/ncw/directio does at open, done here on a descriptor a vfs.FS opened (see
// docs/operations.md, "Direct I/O on other platforms").
func setDirect(fd uintptr) error {
	_, err := unix.FcntlInt(fd, unix.F_NOCACHE, 1)
	return err
}
