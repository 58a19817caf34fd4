package sparse

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// checkCPUs refuses a CPU the process may not run on (its affinity mask), naming it.
func checkCPUs(cpus []int) error {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return fmt.Errorf("retriever: the process's CPUs: %w", err)
	}
	for i, c := range cpus {
		if c < 0 || c >= 1024 || !allowed.IsSet(c) {
			return fmt.Errorf("retriever: cpu %d (entry %d): not one this process may run on: %w", c, i, ErrInvalid)
		}
	}
	return nil
}

// pinThread pins the calling (locked) OS thread to cpu; checked allowed by checkCPUs, a later
// refusal only loses the pinning.
func pinThread(cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	_ = unix.SchedSetaffinity(0, &set)
}
