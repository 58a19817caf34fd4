package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/wal"
)

// liveSegmentBytes is the total size of the segment files in dir (not the retired ones kept
// for reuse).
func liveSegmentBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, ent := range ents {
		if !strings.HasSuffix(ent.Name(), wal.SegmentExt) {
			continue
		}
		st, err := os.Stat(filepath.Join(dir, ent.Name()))
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size()
	}
	return n
}

// TestEvictReportsBytesReclaimed: Evict's BytesReclaimed is the fall of the tier's segment file
// bytes, measured on the file system before and after.
func TestEvictReportsBytesReclaimed(t *testing.T) {
	dir := t.TempDir()
	e := mustOpen(t, dir, testOptions(vfs.Default, mhaLayout))
	defer e.Close()
	all := ids(0, 90)
	for i := 0; i < len(all); i += 10 {
		dumpBlocks(t, e, all[i:i+10])
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	segDir := e.tiers[0].Dirs()[0]
	before := liveSegmentBytes(t, segDir)
	rep, err := e.Evict("", 0)
	if err != nil {
		t.Fatalf("evict: %v", err)
	}
	after := liveSegmentBytes(t, segDir)
	if rep.SegmentsRetired == 0 || before-after <= 0 {
		t.Fatalf("evict retired nothing (report %+v, segment files %d → %d bytes)", rep, before, after)
	}
	if rep.BytesReclaimed != before-after {
		t.Fatalf("report says %d bytes reclaimed, the segment files went from %d to %d bytes (%d freed); report %+v",
			rep.BytesReclaimed, before, after, before-after, rep)
	}
}
