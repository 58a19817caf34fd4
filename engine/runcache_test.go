package engine

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ucm-go/ucm/devio"
)

// loadLayer loads shard sh of blocks and compares every byte.
func loadLayer(t *testing.T, e *Engine, blocks []BlockID, sh int) error {
	t.Helper()
	l := e.Layout()
	dst := make([][]byte, len(blocks))
	for i := range dst {
		dst[i] = devio.AlignedBuffer(int(l.ShardBytes))
	}
	if err := e.LoadShard(blocks, sh, dst).Wait(); err != nil {
		return err
	}
	for i, id := range blocks {
		if want := blockBytes(l, id)[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]; !bytes.Equal(dst[i], want) {
			t.Fatalf("block %s shard %d: wrong bytes", id, sh)
		}
	}
	return nil
}

// quietly runs fn until the index committed nothing while it ran (background seals and
// retirements settle), and returns the index passes and reuses of that run.
func quietly(t *testing.T, e *Engine, fn func()) (passes, reuses int64) {
	t.Helper()
	for attempt := 0; attempt < 200; attempt++ {
		m, p, r := e.ix.Mutations(), e.runs.passes.Load(), e.runs.reuses.Load()
		fn()
		if e.ix.Mutations() == m {
			return e.runs.passes.Load() - p, e.runs.reuses.Load() - r
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the index never stopped changing")
	return 0, 0
}

// The layers of a list share one index pass while the index does not change; a change
// (compaction moved the blocks, eviction deleted one) makes the next layer look again, so a
// load never reads where a block no longer is according to the index, and never serves a
// block the index no longer holds.
func TestRunCacheSharedAndInvalidated(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/a")))
	defer e.Close()
	blocks := ids(0, 6)
	if errs := dumpLayers(e, blocks, layerSources(mhaLayout, blocks, true), []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	dumpBlocks(t, e, ids(100, 140)) // rotate: the batch's segment is sealed
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	list := blocks[1:] // blocks[0] goes, so that compaction moves the others
	b := e.ix.NewBatch()
	b.Delete(blocks[0])
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	p, r := quietly(t, e, func() {
		for sh := 0; sh < 2; sh++ {
			if err := loadLayer(t, e, list, sh); err != nil {
				t.Fatal(err)
			}
		}
	})
	if p > 1 || p+r != 2 {
		t.Fatalf("two layers of one list: %d index passes, %d reuses; want one pass shared", p, r)
	}
	// Compaction moves the blocks: the next layers look the list up again (a reused pass
	// would still point into the compacted segment) and read the new place.
	old := location(t, e, list[0])
	if _, err := e.Compact(0.99, nil); err != nil {
		t.Fatal(err)
	}
	if location(t, e, list[0]).Segment == old.Segment {
		t.Fatal("compaction did not move the blocks")
	}
	before := e.runs.passes.Load()
	p, r = quietly(t, e, func() {
		for sh := 2; sh < 4; sh++ {
			if err := loadLayer(t, e, list, sh); err != nil {
				t.Fatal(err)
			}
		}
	})
	if e.runs.passes.Load() == before || p > 1 || p+r != 2 {
		t.Fatalf("two layers after compaction: %d index passes since it (%d, %d reuses, in the quiet run); want a new one, shared",
			e.runs.passes.Load()-before, p, r)
	}
	// A block deleted since the pass is a miss, not served from where it was.
	b = e.ix.NewBatch()
	b.Delete(blocks[3])
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	if err := loadLayer(t, e, list, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("load of a list with a deleted block: %v, want ErrNotFound", err)
	}
}

// Loads of every layer of a list issued at once share the first one's index pass: they wait
// for it rather than each looking the list up.
func TestRunCacheConcurrentLayers(t *testing.T) {
	_, fs := memFS()
	l := Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 4096}
	opts := tierOptions(fs, diskTierCfg("ssd", 0, "/a"))
	opts.Layout = l
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 5)
	order := make([]int, l.Shards)
	for i := range order {
		order[i] = i
	}
	if errs := dumpLayers(e, blocks, layerSources(l, blocks, true), order); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	p, r := quietly(t, e, func() {
		var wg sync.WaitGroup
		errs := make([]error, l.Shards)
		for sh := 0; sh < l.Shards; sh++ {
			wg.Add(1)
			go func(sh int) {
				defer wg.Done()
				errs[sh] = loadLayer(t, e, blocks, sh)
			}(sh)
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})
	if p > 1 || p+r != int64(l.Shards) {
		t.Fatalf("32 layers of one list loaded at once: %d index passes, %d reuses; want one pass shared", p, r)
	}
}
