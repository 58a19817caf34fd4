package engine

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/ucm-go/ucm/tiers"
)

// tierBlocks returns the blocks each tier holds, by name.
func tierBlocks(e *Engine) map[string]int64 {
	out := map[string]int64{}
	for _, s := range e.TierStats() {
		out[s.Name] = s.Blocks
	}
	return out
}

// demoteAll moves every block of the first disk tier ("ssd") down to the next one.
func demoteAll(t *testing.T, e *Engine, n int64) {
	t.Helper()
	if _, err := e.Evict("ssd", 0); err != nil {
		t.Fatal(err)
	}
	if got := tierBlocks(e); got["ssd"] != 0 || got["hdd"] != n {
		t.Fatalf("after demoting everything: %v, want all %d blocks in hdd", got, n)
	}
}

// TestPrefetchPromotesFromLowerTier: Prefetch moves the blocks it names from a lower disk tier
// into the first, counts them, and leaves the others where they are; every block loads intact.
func TestPrefetchPromotesFromLowerTier(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/ssd"), diskTierCfg("hdd", 0, "/hdd")))
	defer e.Close()
	ids := make([]BlockID, 20)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	demoteAll(t, e, 20)
	if err := e.Prefetch(ids[:8]).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := tierBlocks(e); got["ssd"] != 8 || got["hdd"] != 12 {
		t.Fatalf("after prefetching 8 blocks: %v, want 8 in ssd and 12 in hdd", got)
	}
	if got := e.Stats().Promotions; got != 8 {
		t.Fatalf("%d promotions, want 8", got)
	}
	// Prefetching blocks already in the first tier moves nothing.
	if err := e.Prefetch(ids[:8]).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := e.Stats().Promotions; got != 8 {
		t.Fatalf("%d promotions after prefetching promoted blocks again, want 8", got)
	}
	for _, id := range ids {
		checkBlock(t, e, id)
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestPrefetchUnknownIDs: blocks not stored fail alone with ErrNotFound naming them; the
// stored ones are prefetched; a closed engine refuses.
func TestPrefetchUnknownIDs(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/ssd"), diskTierCfg("hdd", 0, "/hdd")))
	stored := []BlockID{blockID(1), blockID(2)}
	dumpBlocks(t, e, stored)
	demoteAll(t, e, 2)
	missing := blockID(99)
	task := e.Prefetch([]BlockID{stored[0], missing, stored[1]})
	err := task.Wait()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("prefetch with a missing block: %v, want ErrNotFound", err)
	}
	be := task.BlockErrors()
	if be[0] != nil || be[2] != nil {
		t.Errorf("stored blocks failed: %v", be)
	}
	if !errors.Is(be[1], ErrNotFound) || !strings.Contains(be[1].Error(), missing.String()) {
		t.Errorf("missing block: %v, want ErrNotFound naming %s", be[1], missing)
	}
	if got := tierBlocks(e); got["ssd"] != 2 {
		t.Errorf("the stored blocks were not promoted alongside the missing one: %v", got)
	}
	if err := e.Prefetch(nil).Wait(); err != nil {
		t.Errorf("empty prefetch: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Prefetch(stored).Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("prefetch after close: %v, want ErrClosed", err)
	}
}

// TestPrefetchFillsMemoryTier: with a memory tier, Prefetch reads the blocks into it, so the
// loads that follow touch no segment.
func TestPrefetchFillsMemoryTier(t *testing.T) {
	_, inner := memFS()
	fs := &countingFS{FS: inner}
	mem := tiers.Config{Name: "dram", Kind: tiers.KindMemory, Capacity: 40 * mhaLayout.BlockBytes()}
	o := tierOptions(fs, mem, diskTierCfg("ssd", 0, "/ssd"))
	o.DirectIO = 2 // off: the counting wrapper sees every read
	e := mustOpen(t, "/store", o)
	ids := make([]BlockID, 12)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", o) // the memory tier starts empty
	defer e.Close()
	if err := e.Prefetch(ids).Wait(); err != nil {
		t.Fatal(err)
	}
	fs.reads.Store(0)
	for _, id := range ids {
		checkBlock(t, e, id)
	}
	if n := fs.reads.Load(); n != 0 {
		t.Fatalf("%d segment reads after prefetching into memory", n)
	}
	if got := e.Stats().MemoryHits; got != int64(len(ids)) {
		t.Fatalf("memory hits %d, want %d", got, len(ids))
	}
}

// TestPrefetchConcurrentWithLoads: prefetches, loads and evictions of the same blocks at once
// (the race detector watches); every load that succeeds returns the dumped bytes, and the
// accounting agrees with the segments afterwards.
func TestPrefetchConcurrentWithLoads(t *testing.T) {
	_, fs := memFS()
	mem := tiers.Config{Name: "dram", Kind: tiers.KindMemory, Capacity: 16 * mhaLayout.BlockBytes()}
	e := mustOpen(t, "/store", tierOptions(fs, mem, diskTierCfg("ssd", 0, "/ssd"), diskTierCfg("hdd", 0, "/hdd")))
	defer e.Close()
	ids := make([]BlockID, 48)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 40 {
				pick := []BlockID{ids[r.IntN(len(ids))], ids[r.IntN(len(ids))]}
				switch w % 3 {
				case 0:
					if err := e.Prefetch(pick).Wait(); err != nil && !errors.Is(err, ErrNoSpace) {
						errs <- err
						return
					}
				case 1:
					got, err := loadOne(e, pick[0])
					if err != nil {
						errs <- err
						return
					}
					if string(got) != string(blockBytes(mhaLayout, pick[0])) {
						errs <- errors.New("a load during prefetches returned wrong bytes")
						return
					}
				default:
					if _, err := e.Evict("ssd", 0); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, id := range ids {
		checkBlock(t, e, id)
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestPrefetchFullFirstTierStillFillsMemory: with the first disk tier above its high
// watermark, the blocks below it stay where they are, each reported with an error wrapping
// ErrNoSpace that names it, and every stored block is still read into the memory tier: the
// loads that follow are memory hits and touch no segment. A block not stored is ErrNotFound.
func TestPrefetchFullFirstTierStillFillsMemory(t *testing.T) {
	_, inner := memFS()
	fs := &countingFS{FS: inner}
	mem := tiers.Config{Name: "dram", Kind: tiers.KindMemory, Capacity: 40 * mhaLayout.BlockBytes()}
	o := tierOptions(fs, mem, diskTierCfg("ssd", 64*tierSegment, "/ssd"), diskTierCfg("hdd", 0, "/hdd"))
	o.DirectIO = 2 // off: the counting wrapper sees every read
	e := mustOpen(t, "/store", o)
	defer e.Close()
	ids := make([]BlockID, 12)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	demoteAll(t, e, int64(len(ids)))
	// The memory tier starts without them: the dumps put them there, the demotion did not
	// take them out. Evict them from memory by reopening.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", o)
	defer e.Close()
	// Fill the first disk tier's account past its high watermark (a dump waiting for room
	// does the same); it holds no block the reclaimer could move, so it stays there.
	ssd := e.tiers[0].Space()
	fill := ssd.Capacity()
	ssd.Add(fill)
	defer ssd.Add(-fill)
	if !ssd.OverHigh() {
		t.Fatal("the first tier is not above its high watermark")
	}
	missing := blockID(99)
	task := e.Prefetch(append(append([]BlockID(nil), ids...), missing))
	_ = task.Wait()
	be := task.BlockErrors()
	for i, id := range ids {
		if !errors.Is(be[i], ErrNoSpace) || !strings.Contains(be[i].Error(), id.String()) {
			t.Errorf("block %s: %v, want ErrNoSpace naming it (not promoted)", id, be[i])
		}
	}
	if last := be[len(ids)]; !errors.Is(last, ErrNotFound) || !strings.Contains(last.Error(), missing.String()) {
		t.Errorf("missing block: %v, want ErrNotFound naming it", last)
	}
	if got := tierBlocks(e); got["ssd"] != 0 || got["hdd"] != int64(len(ids)) {
		t.Errorf("tiers %v: nothing should have moved", got)
	}
	fs.reads.Store(0)
	for _, id := range ids {
		checkBlock(t, e, id)
	}
	if n := fs.reads.Load(); n != 0 {
		t.Errorf("%d segment reads after prefetching into memory", n)
	}
	if got := e.Stats().MemoryHits; got != int64(len(ids)) {
		t.Errorf("memory hits %d, want %d", got, len(ids))
	}
}
