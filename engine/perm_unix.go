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

// sameDevice reports whether a and b are on the same file system (device).
func sameDevice(a, b os.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && sa.Dev == sb.Dev
}
