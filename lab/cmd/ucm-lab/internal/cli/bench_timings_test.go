package cli

import (
	"os"
	"testing"
)

// The device queue is the ninth field of a block device's stat file; anything else is refused.
func TestParseStatInFlight(t *testing.T) {
	// /sys/block/vda/stat during a fio job at iodepth 32 (the second-last field group is the
	// discard counters; newer kernels append flush counters).
	line := "  371290   112834 61873234   640139  1036398  1290341 296017128 29372734       33  2154616 30122905        0        0        0        0    14218   104032\n"
	if n, ok := parseStatInFlight([]byte(line)); !ok || n != 33 {
		t.Fatalf("in flight %d, %v; want 33", n, ok)
	}
	for _, bad := range []string{"", "1 2 3 4 5 6 7 8", "1 2 3 4 5 6 7 8 x 10 11", "1 2 3 4 5 6 7 8 -1 10 11"} {
		if n, ok := parseStatInFlight([]byte(bad)); ok {
			t.Errorf("parseStatInFlight(%q) = %d, want refused", bad, n)
		}
	}
	// The reader finds the device of a real directory where there is one, and reads it.
	if read, closeFn, name := inflightReader(os.TempDir()); read != nil {
		defer closeFn()
		if _, ok := read(); !ok {
			t.Errorf("the stat file of %s could not be read", name)
		}
	}
}
