//go:build linux

package devio

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapRegion maps n bytes (plus one huge page of slack, to start on a huge-page boundary),
// advises huge pages and returns the aligned n bytes.
func (m *HostMemory) mapRegion(n int) ([]byte, error) {
	mapping, err := unix.Mmap(-1, 0, n+HugePageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("%w: map %d bytes: %w", ErrHostMemory, n, err)
	}
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&mapping[0])) % HugePageSize); r != 0 {
		skip = HugePageSize - r
	}
	region := mapping[skip : skip+n : skip+n]
	// Advice only: with transparent huge pages disabled the region still works, in 4 KiB pages.
	m.huge = unix.Madvise(region, unix.MADV_HUGEPAGE) == nil
	m.mapping = mapping
	return region, nil
}

func unmap(mapping []byte) error { return unix.Munmap(mapping) }

// populatePages asks the kernel to fault in the pages b spans (MADV_POPULATE_WRITE: their bytes
// are left as they are, so the pages b shares at its ends with other memory are safe to
// include). It reports false when the kernel refuses (before Linux 5.14: EINVAL).
func populatePages(b []byte) bool {
	page := uintptr(os.Getpagesize())
	lo := uintptr(unsafe.Pointer(&b[0])) &^ (page - 1)
	hi := (uintptr(unsafe.Pointer(&b[0])) + uintptr(len(b)) + page - 1) &^ (page - 1)
	_, _, e := unix.Syscall(unix.SYS_MADVISE, lo, hi-lo, unix.MADV_POPULATE_WRITE)
	runtime.KeepAlive(b)
	return e == 0
}

// PhysicalMemory returns the host's RAM in bytes (0 when it cannot be read).
func PhysicalMemory() int64 {
	var info unix.Sysinfo_t
	if err := unix.Sysinfo(&info); err != nil {
		return 0
	}
	return int64(info.Totalram) * int64(info.Unit)
}
