//go:build !linux

package devio

// mapRegion returns Go heap memory where anonymous mappings with huge-page advice are not
// implemented.
func (m *HostMemory) mapRegion(n int) ([]byte, error) { return AlignedBuffer(n), nil }

func unmap([]byte) error { return nil }
