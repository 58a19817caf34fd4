//go:build unix && !linux

package engine

import "golang.org/x/sys/unix"

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

// lockFD takes a flock lock on fd's file without waiting (EWOULDBLOCK when another open file
// description holds a conflicting one); it belongs to the description, as Linux's OFD locks.
func lockFD(fd uintptr, exclusive bool) error {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	return unix.Flock(int(fd), how|unix.LOCK_NB)
}
