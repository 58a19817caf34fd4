package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// populateLargest faults in the largest anonymous mapping of this process of at least n bytes:
// the memory Mooncake's client allocated for the pool (it never touches it itself). A pool that
// has served for a while has its memory resident; without this, every phase of the bench would
// pay the holder's first touch of the pages its objects land on (the kernel zeroing them, on the
// same cores as the transfers), and the first phase to use a page would be charged for it.
func populateLargest(n int64) error {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return err
	}
	var lo, hi uint64
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) != 5 || !strings.HasPrefix(f[1], "rw") || f[4] != "0" { // anonymous: no path, inode 0
			continue
		}
		a, b, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(a, 16, 64)
		end, err2 := strconv.ParseUint(b, 16, 64)
		if err1 == nil && err2 == nil && end-start > hi-lo {
			lo, hi = start, end
		}
	}
	if hi-lo < uint64(n) {
		return fmt.Errorf("no anonymous mapping of %d bytes (the largest has %d)", n, hi-lo)
	}
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(lo), uintptr(hi-lo), unix.MADV_POPULATE_WRITE); e != 0 {
		return fmt.Errorf("populate the pool's %d bytes: %w", hi-lo, e)
	}
	return nil
}
