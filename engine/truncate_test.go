package engine

import (
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// truncatedStore dumps 60 blocks into a store on disk (1 MiB segments: several sealed ones)
// and returns it with the blocks and the first segment's blocks in dump order.
func truncatedStore(t *testing.T) (*Engine, string, []BlockID, []BlockID) {
	t.Helper()
	dir := t.TempDir()
	o := testOptions(vfs.Default, mhaLayout)
	e := mustOpen(t, dir, o)
	all := ids(0, 60)
	for i := 0; i < len(all); i += 10 {
		dumpBlocks(t, e, all[i:i+10])
	}
	first := location(t, e, all[0]).Segment
	var inFirst []BlockID
	for _, id := range all {
		if location(t, e, id).Segment == first {
			inFirst = append(inFirst, id)
		}
	}
	if len(inFirst) < 8 || location(t, e, all[len(all)-1]).Segment == first {
		t.Fatalf("segment %d holds %d of 60 blocks: want a sealed segment of several", first, len(inFirst))
	}
	slices.SortFunc(inFirst, func(a, b BlockID) int { return int(location(t, e, a).Offset - location(t, e, b).Offset) })
	return e, dir, all, inFirst
}

// cutBefore truncates id's segment file just before id's record.
func cutBefore(t *testing.T, e *Engine, id BlockID) {
	t.Helper()
	loc := location(t, e, id)
	if err := os.Truncate(e.segPath(loc.Segment), loc.Offset); err != nil {
		t.Fatal(err)
	}
}

// TestTruncatedSegmentIsCorruption: blocks whose records a truncation cut off a sealed segment
// are corruption, not a transient I/O error: the load fails with ErrCorrupt, the entry is
// dropped (Lookup misses), so the connector's re-dump writes the block again and it loads;
// the blocks before the cut still load; compaction skips the lost records and never reports
// negative bytes.
func TestTruncatedSegmentIsCorruption(t *testing.T) {
	e, _, all, inFirst := truncatedStore(t)
	defer e.Close()
	lost := inFirst[len(inFirst)-4:]
	cutBefore(t, e, lost[0])
	for _, id := range lost {
		if _, err := loadOne(e, id); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("load of %s cut off its segment: %v, want ErrCorrupt", id, err)
		}
	}
	if hits := e.Lookup(lost); slices.Contains(hits, true) {
		t.Fatalf("lookup after the failed loads: %v, want misses", hits)
	}
	dumpBlocks(t, e, lost) // the connector's re-dump
	for _, id := range all {
		checkBlock(t, e, id)
	}
	// A second cut, found by compaction rather than a load.
	again := inFirst[len(inFirst)-6 : len(inFirst)-4]
	cutBefore(t, e, again[0])
	rep, err := e.Compact(0.99, nil)
	if err != nil {
		t.Fatalf("compact over a truncated segment: %v", err)
	}
	if rep.BytesReclaimed < 0 || rep.SegmentsRetired == 0 {
		t.Fatalf("compact report %+v", rep)
	}
	if hits := e.Lookup(again); slices.Contains(hits, true) {
		t.Fatalf("blocks cut off found by compaction still indexed: %v", hits)
	}
	for _, id := range all {
		if !slices.Contains(again, id) {
			checkBlock(t, e, id)
		}
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestTruncatedSegmentFoundAtOpen: Open compares every sealed segment's file with its
// recorded size; one cut short is recovered like a crashed one (sealed again after its last
// intact record), its lost blocks dropped and reported, the rest kept.
func TestTruncatedSegmentFoundAtOpen(t *testing.T) {
	e, dir, all, inFirst := truncatedStore(t)
	lost := inFirst[len(inFirst)-3:]
	seg := location(t, e, lost[0]).Segment
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, dir, testOptions(vfs.Default, mhaLayout))
	cutBefore(t, e, lost[0])
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, dir, testOptions(vfs.Default, mhaLayout))
	defer e.Close()
	rep := e.Recovery()
	if !slices.Contains(rep.TruncatedSegments, seg) || rep.EntriesDropped != len(lost) {
		t.Fatalf("recovery %+v: want segment %d reported truncated and %d entries dropped", rep, seg, len(lost))
	}
	if hits := e.Lookup(lost); slices.Contains(hits, true) {
		t.Fatalf("lost blocks still indexed: %v", hits)
	}
	for _, id := range all {
		if !slices.Contains(lost, id) {
			checkBlock(t, e, id)
		}
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	// Reopened again, the store is clean: nothing more to report.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e2 := mustOpen(t, dir, testOptions(vfs.Default, mhaLayout))
	defer e2.Close()
	if r := e2.Recovery(); len(r.TruncatedSegments) != 0 || r.EntriesDropped != 0 {
		t.Fatalf("second reopen reports %+v", r)
	}
}
