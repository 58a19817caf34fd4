//go:build unix

package engine

import (
	"os"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fchmod sets f's mode when it is a file of the operating system.
func fchmod(f vfs.File, mode os.FileMode) error {
	fd := f.Fd()
	if fd == vfs.InvalidFd {
		return nil
	}
	return syscall.Fchmod(int(fd), uint32(mode.Perm()))
}
