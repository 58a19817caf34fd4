package kernels

import (
	"errors"
	"fmt"
)

// Errors returned by the kernels package, testable with errors.Is. Every error names what was
// wrong (layer, block id, field, shape) in its message.
var (
	// ErrInvalid is a bad argument or registration: a shape, dtype, stride or size that does not
	// fit.
	ErrInvalid = errors.New("kernels: invalid argument")
	// ErrOutOfRange is an address, offset or block id outside the region it must lie in.
	ErrOutOfRange = errors.New("kernels: out of range")
	// ErrNoDevice is a device operation asked of a device that is not there (no NVML, no GPU,
	// closed device).
	ErrNoDevice = errors.New("kernels: no device")
)

func errorf(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{kind}, args...)...)
}

// ErrCorrupt is a serialized payload (a sidecar) whose bytes are not a valid encoding: bad
// magic, version, checksum, lengths or contents.
var ErrCorrupt = errors.New("kernels: corrupt payload")
