//go:build !linux

package devio

// mapRegion returns Go heap memory where anonymous mappings with huge-page advice are not
// implemented.
func (m *HostMemory) mapRegion(n int) ([]byte, error) { return AlignedBuffer(n), nil }

func unmap([]byte) error { return nil }

// populatePages reports false: Populate writes to each page itself on this platform.
func populatePages([]byte) bool { return false }

// PhysicalMemory returns the host's RAM in bytes; 0 here: not read on this platform.
func PhysicalMemory() int64 { return 0 }
