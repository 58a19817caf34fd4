//go:build linux

package engine

import (
	"errors"
	"io"

	"golang.org/x/sys/unix"
)

// osFileLocks: lockFile works here.
const osFileLocks = true

// fdFileID returns the device and inode of the file open as fd.
func fdFileID(fd uintptr) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}, nil
}

// lockFD takes an open file description lock on all of fd's file without waiting (EAGAIN
// when another description holds a conflicting one), or, on a kernel or file system without
// them (EINVAL), a flock lock, which also belongs to the description.
func lockFD(fd uintptr, exclusive bool) error {
	spec := unix.Flock_t{Type: unix.F_RDLCK, Whence: io.SeekStart}
	how := unix.LOCK_SH
	if exclusive {
		spec.Type, how = unix.F_WRLCK, unix.LOCK_EX
	}
	err := unix.FcntlFlock(fd, unix.F_OFD_SETLK, &spec)
	if errors.Is(err, unix.EINVAL) {
		err = unix.Flock(int(fd), how|unix.LOCK_NB)
	}
	return err
}
