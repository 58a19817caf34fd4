package engine

import (
	"path/filepath"
	"testing"
	"time"
)

// VisibilityLatency measures only segments published while the instance was open: those an
// instance finds at Open, published long before, are indexed but not counted (they once made
// the mean tens of seconds).
func TestSharedVisibilityCountsOnlyNew(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	dumpBlocks(t, a, ids(0, 8))
	if err := a.Close(); err != nil { // publishes A's segments
		t.Fatal(err)
	}
	b := mustOpen(t, filepath.Join(root, "b"), sharedOptions(sharedB, time.Hour))
	defer b.Close()
	waitFor(t, "A's segments indexed in B", func() bool { return allHit(b, ids(0, 8)) && b.Stats().Sharing.SegmentsIndexed > 0 })
	if st := b.Stats().Sharing; st.VisibilitySamples != 0 {
		t.Fatalf("%d visibility samples of segments published before B opened (mean %v)", st.VisibilitySamples, st.VisibilityLatency)
	}
	c := mustOpen(t, filepath.Join(root, "c"), sharedOptions(shared, time.Hour))
	dumpBlocks(t, c, ids(100, 108))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "C's segments counted in B", func() bool { return b.Stats().Sharing.VisibilitySamples > 0 })
	if !allHit(b, ids(100, 108)) {
		t.Fatal("C's blocks not visible in B once its segment was counted")
	}
}
