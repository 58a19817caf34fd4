package format

import (
	"errors"
	"fmt"
)

// ErrCorrupt is wrapped by every error that reports bytes read from disk failing a check
// (bad magic, checksum mismatch, out-of-range length). Test with errors.Is.
var ErrCorrupt = errors.New("corrupt")

// ErrInvalid is wrapped by every error that reports a caller passing an invalid value to an
// encoder (too many shards, a zero length). Test with errors.Is.
var ErrInvalid = errors.New("invalid argument")

// errorf returns an error wrapping kind whose message is kind's text followed by the formatted
// detail, e.g. "corrupt: record header at 8192: field shards: 0 out of range [1, 960]".
func errorf(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))
}
