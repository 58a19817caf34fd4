//go:build linux

package devio

import "golang.org/x/sys/unix"

// setDirect enables O_DIRECT on fd with fcntl(F_SETFL).
func setDirect(fd uintptr) error {
	flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	_, err = unix.FcntlInt(fd, unix.F_SETFL, flags|unix.O_DIRECT)
	return err
}
