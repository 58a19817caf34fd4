//go:build !linux

package devio

import "errors"

// setDirect reports that O_DIRECT is not supported on this platform.
func setDirect(fd uintptr) error {
	return errors.New("O_DIRECT is only supported on Linux")
}
