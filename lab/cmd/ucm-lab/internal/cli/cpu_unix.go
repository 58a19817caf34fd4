//go:build unix

package cli

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user and system) this process has used so far: the
// engine's goroutines and the kernel work they do (io_uring submission, page pinning), and the
// bench's own in-line checks. 0 where it cannot be read.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
