//go:build linux

package eval

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// processCPU is the CPU time (user and system, every thread) the process has used so far.
func processCPU() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0, fmt.Errorf("eval: process CPU clock: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}
