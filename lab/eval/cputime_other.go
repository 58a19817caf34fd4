//go:build !linux

package eval

import (
	"errors"
	"time"
)

// processCPU is unsupported off Linux: SelectLatency reports this error.
func processCPU() (time.Duration, error) {
	return 0, errors.New("eval: process CPU time is read on Linux only")
}
