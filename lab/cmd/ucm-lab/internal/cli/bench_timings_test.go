package cli

import (
	"os"
	"testing"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
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

// A device's counters: requests, sectors, weighted queue time and flushes; fewer than 11
// fields or a field that is not a number is refused.
func TestParseBlockStat(t *testing.T) {
	line := "  371290   112834 61873234   640139  1036398  1290341 296017128 29372734       33  2154616 30122905        0        0        0        0    14218   104032\n"
	c, ok := parseBlockStat([]byte(line))
	want := blockCounters{readIOs: 371290, readSectors: 61873234, writeIOs: 1036398, writeSectors: 296017128, inQueueMs: 30122905, flushIOs: 14218}
	if !ok || c != want {
		t.Fatalf("parseBlockStat = %+v, %v; want %+v", c, ok, want)
	}
	// A kernel before 5.5: no flush counters.
	if c, ok := parseBlockStat([]byte("1 2 3 4 5 6 7 8 9 10 11")); !ok || c.flushIOs != 0 || c.inQueueMs != 11 {
		t.Errorf("11 fields: %+v, %v", c, ok)
	}
	for _, bad := range []string{"", "1 2 3 4 5 6 7 8 9 10", "1 2 3 4 x 6 7 8 9 10 11", "1 2 3 4 5 6 7 8 9 10 -11"} {
		if c, ok := parseBlockStat([]byte(bad)); ok {
			t.Errorf("parseBlockStat(%q) = %+v, want refused", bad, c)
		}
	}
}

// The shape of a phase: request counts and mean sizes, flushes and the mean depth from the
// weighted queue time over the wall time; counters that went backwards count nothing.
func TestShapeOf(t *testing.T) {
	a := blockCounters{readIOs: 10, readSectors: 80, writeIOs: 100, writeSectors: 1000, inQueueMs: 500, flushIOs: 7}
	b := blockCounters{readIOs: 30, readSectors: 80 + 20*256, writeIOs: 200, writeSectors: 1000 + 100*4096, inQueueMs: 500 + 32*2000, flushIOs: 57}
	s := shapeOf("vda", a, b, 2*time.Second)
	want := ioShape{Device: "vda", Writes: 100, WriteKiB: 2048, Reads: 20, ReadKiB: 128, Flushes: 50, MeanQueue: 32}
	if *s != want {
		t.Fatalf("shape %+v, want %+v", *s, want)
	}
	clitest.MustContain(t, s.String(), "vda: 100 writes of 2048 KiB", "20 reads of 128 KiB", "50 flushes", "32.0 in flight")
	if s := shapeOf("vda", b, a, time.Second); s.Writes != 0 || s.Reads != 0 || s.Flushes != 0 || s.MeanQueue != 0 {
		t.Errorf("counters reset: %+v, want nothing counted", *s)
	}
	var none *ioMeter
	if none.end() != nil {
		t.Error("a nil meter measured something")
	}
	// A real directory's device, where there is one, is read before and after.
	if m := startIOMeter(os.TempDir()); m != nil && m.end() == nil {
		t.Error("the meter started but could not read its device again")
	}
}

// The bytes per fdatasync of a phase: the dumped bytes over the dump writer's syncs between the
// two readings; none synced is 0.
func TestSyncInterval(t *testing.T) {
	before := engine.Stats{DumpedBytes: 1 << 30, DumpSyncs: 100}
	if got := syncInterval(before, engine.Stats{DumpedBytes: 1<<30 + 6<<20, DumpSyncs: 102}); got != 3<<20 {
		t.Fatalf("%d bytes per sync, want %d (6 MiB over 2 syncs)", got, 3<<20)
	}
	if got := syncInterval(before, engine.Stats{DumpedBytes: 1<<30 + 6<<20, DumpSyncs: 100}); got != 0 {
		t.Fatalf("no sync: %d, want 0", got)
	}
}
