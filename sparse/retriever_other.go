//go:build !linux

package sparse

import "fmt"

// checkCPUs refuses pinning where threads cannot be pinned (only Linux's affinity is used).
func checkCPUs(cpus []int) error {
	return fmt.Errorf("retriever: pinning to CPUs %v needs Linux: %w", cpus, ErrInvalid)
}

// pinThread does nothing where threads cannot be pinned.
func pinThread(int) {}
