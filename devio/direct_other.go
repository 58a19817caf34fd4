//go:build !linux && !darwin

package devio

import "errors"

// setDirect reports that O_DIRECT is not supported on this platform.
func setDirect(fd uintptr) error {
	return errors.New("direct I/O is only supported on Linux (O_DIRECT) and macOS (F_NOCACHE)")
}
