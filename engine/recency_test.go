package engine

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestOpenHeapPerBlockWithCapacity: an open store whose disk tier has a capacity (so it evicts)
// holds no per-block state for eviction: recency is per segment (tiers.Recency). What it holds
// per block once Open's background work is done is the index's membership (at most 16 bytes a
// block: index.TestMemberTableUniqueIDs) and a few bytes more: the engine's fixed state spread
// over the blocks (1.6 bytes a block here; a per-block recency list held 60). Measured as the
// Go heap allocated after a GC, before and after Open, over 200,000 blocks (index entries: Open
// reads entries, not records).
func TestOpenHeapPerBlockWithCapacity(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("heap measurement: not under the race detector or -short")
	}
	const blocks = 200_000
	// On disk: a file system in memory would count its files' churn (the index's WAL and
	// compactions during Open) as heap.
	dir := t.TempDir()
	opts := tierOptions(vfs.Default, diskTierCfg("ssd", 1<<40, filepath.Join(dir, "ssd")))
	opts.SyncPolicy = SyncNone
	store := filepath.Join(dir, "store")
	e := mustOpen(t, store, opts)
	dumpBlocks(t, e, ids(0, 7))
	// The other entries share the first block's record: Open reads entries, not records.
	loc := location(t, e, blockID(0))
	for lo := 0; lo < blocks; lo += 10_000 {
		b := e.ix.NewBatch()
		for i := lo; i < lo+10_000; i++ {
			b.Put(blockID(1_000_000+i), loc)
		}
		if err := e.ix.Apply(b, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	// Once more first: what the first Open leaves behind for good (caches filled once per
	// process) is not the store's.
	e = mustOpen(t, store, opts)
	if err := e.ix.WaitMembers(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = nil // what a closed engine held is not counted
	before := heap()
	e = mustOpen(t, store, opts)
	defer e.Close()
	if e.tiers[0].Recency() == nil {
		t.Fatal("a tier with a capacity keeps no recency")
	}
	if err := e.ix.WaitMembers(); err != nil {
		t.Fatal(err)
	}
	after := heap()
	per := float64(after-before) / blocks
	t.Logf("%.1f bytes of heap per block (%d blocks, +%.1f MiB; membership %.1f bytes a block)",
		per, blocks, float64(after-before)/(1<<20), float64(e.ix.MembersBytes())/blocks)
	members := float64(e.ix.MembersBytes()) / blocks
	if per-members > 4 {
		t.Fatalf("%.1f bytes of heap per stored block, %.1f beyond the membership's %.1f: want at most 4", per, per-members, members)
	}
	runtime.KeepAlive(e)
}
