package engine

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// layerSources returns, for each layer, the shard buffers of blocks: copies on 4 KiB
// boundaries (a connector's pinned buffers) or one byte off them.
func layerSources(l Layout, blocks []BlockID, aligned bool) [][][]byte {
	out := make([][][]byte, l.Shards)
	for sh := range out {
		out[sh] = make([][]byte, len(blocks))
		for i, id := range blocks {
			src := blockBytes(l, id)[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]
			b := devio.AlignedBuffer(int(l.ShardBytes) + 1)
			if !aligned {
				b = b[1:] // never on a 4 KiB boundary
			}
			copy(b, src)
			out[sh][i] = b[:l.ShardBytes]
		}
	}
	return out
}

// dumpLayers dumps blocks layer by layer, one task per layer over the whole list, the layers in
// the given order, and returns each task's error.
func dumpLayers(e *Engine, blocks []BlockID, src [][][]byte, order []int) []error {
	errs := make([]error, len(order))
	for k, sh := range order {
		errs[k] = e.DumpShard(blocks, sh, src[sh]).Wait()
	}
	return errs
}

// checkShards loads every shard of blocks with LoadShard and compares it.
func checkShards(t *testing.T, e *Engine, blocks []BlockID) {
	t.Helper()
	l := e.Layout()
	for sh := 0; sh < l.Shards; sh++ {
		dst := make([][]byte, len(blocks))
		for i := range dst {
			dst[i] = devio.AlignedBuffer(int(l.ShardBytes))
		}
		if err := e.LoadShard(blocks, sh, dst).Wait(); err != nil {
			t.Fatalf("load shard %d: %v", sh, err)
		}
		for i, id := range blocks {
			if !bytes.Equal(dst[i], blockBytes(l, id)[int64(sh)*l.ShardBytes:int64(sh+1)*l.ShardBytes]) {
				t.Fatalf("block %s shard %d differs", id, sh)
			}
		}
	}
}

// A layer-wise dump of a list of new blocks, one task per layer in any order, is written as one
// batch record: nothing is visible before the last layer, every block loads whole and by shard
// after it, from aligned buffers no staging memory is used, from unaligned ones one layer's
// bounce buffers; reopened, everything is still there and the accounting is exact.
func TestLayerBatchDump(t *testing.T) {
	for _, tc := range []struct {
		name    string
		l       Layout
		aligned bool
	}{
		{"aligned", mhaLayout, true},
		{"unaligned-callers", mhaLayout, false},
		{"padded-shards", Layout{Shards: 5, TensorsPerShard: 2, ShardBytes: 5000}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, fs := memFS()
			opts := testOptions(fs, tc.l)
			e := mustOpen(t, "/store", opts)
			blocks := ids(0, 10)
			src := layerSources(tc.l, blocks, tc.aligned)
			order := rand.Perm(tc.l.Shards)
			for k, sh := range order {
				if k == len(order)-1 {
					for _, hit := range e.Lookup(blocks) {
						if hit {
							t.Fatal("a block is visible before its last layer was dumped")
						}
					}
				}
				if err := e.DumpShard(blocks, sh, src[sh]).Wait(); err != nil {
					t.Fatalf("layer %d: %v", sh, err)
				}
			}
			checkBlocks(t, e, blocks)
			checkShards(t, e, blocks)
			st := e.Stats()
			if st.BatchRecords != 1 || st.DumpedBlocks != int64(len(blocks)) || st.StagingBytes != 0 || st.StagingBlocks != 0 {
				t.Fatalf("stats: %d batch records, %d blocks dumped, staging %d bytes %d blocks", st.BatchRecords, st.DumpedBlocks, st.StagingBytes, st.StagingBlocks)
			}
			var wantPeak int64 // zero copy
			if !tc.aligned || tc.l.ShardStride() != tc.l.ShardBytes {
				wantPeak = int64(len(blocks)) * tc.l.ShardStride() // one layer's bounce buffers
			}
			if st.StagingPeakBytes != wantPeak {
				t.Fatalf("staging peak %d bytes, want %d", st.StagingPeakBytes, wantPeak)
			}
			loc := location(t, e, blocks[3])
			if !loc.IsBatch() || loc.BatchBlocks != len(blocks) || loc.BatchPos != 3 {
				t.Fatalf("location %+v", loc)
			}
			if err := e.ix.CheckAccounting(); err != nil {
				t.Fatal(err)
			}
			// The same list again: stored, written once.
			if errs := dumpLayers(e, blocks, src, order); errors.Join(errs...) != nil {
				t.Fatal(errors.Join(errs...))
			}
			if st := e.Stats(); st.BatchRecords != 1 || st.DumpedBlocks != int64(len(blocks)) {
				t.Fatalf("a repeated dump wrote again: %+v", st)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = mustOpen(t, "/store", opts)
			defer e.Close()
			checkBlocks(t, e, blocks)
			checkShards(t, e, blocks)
			if err := e.ix.CheckAccounting(); err != nil {
				t.Fatal(err)
			}
			if err := fileSizesMatch(fs, e); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A list larger than MaxBatchBytes is written as several batch records, each within the limit.
func TestLayerBatchChunks(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	opts.MaxBatchBytes = 6 * mhaLayout.PayloadBytes() // 5 blocks with the header and commit
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 12)
	if errs := dumpLayers(e, blocks, layerSources(mhaLayout, blocks, true), []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	if st := e.Stats(); st.BatchRecords != 3 {
		t.Fatalf("%d batch records for 12 blocks at 5 per record, want 3", st.BatchRecords)
	}
	for i, id := range blocks {
		if loc := location(t, e, id); loc.BatchBlocks != []int{5, 5, 2}[i/5] || loc.BatchPos != i%5 {
			t.Fatalf("block %d: %+v", i, loc)
		}
	}
	if h := (format.BatchHeader{Layout: mhaLayout, IDs: blocks[:5]}); h.ExtentBytes() > opts.MaxBatchBytes {
		t.Fatalf("a batch record of %d bytes above MaxBatchBytes %d", h.ExtentBytes(), opts.MaxBatchBytes)
	}
	checkBlocks(t, e, blocks)
	checkShards(t, e, blocks)
}

// A crash after a batch is committed keeps it; a crash before its last layer loses only it:
// recovery passes over its extent, keeps the records written after it, and the blocks can be
// dumped again.
func TestLayerBatchCrash(t *testing.T) {
	mem, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	e := mustOpen(t, "/store", opts)
	done, open := ids(0, 6), ids(10, 16)
	if errs := dumpLayers(e, done, layerSources(mhaLayout, done, true), []int{3, 2, 1, 0}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	openSrc := layerSources(mhaLayout, open, true)
	if errs := dumpLayers(e, open, openSrc, []int{0, 1, 2}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	after := ids(20, 23)
	dumpBlocks(t, e, after)
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	e.Close()

	opts.FS = crashed
	e2 := mustOpen(t, "/store", opts)
	defer e2.Close()
	if hits := e2.Lookup(append(append(append([]BlockID(nil), done...), open...), after...)); hits[0] != true || hits[6] || !hits[12] {
		t.Fatalf("after the crash: %v", hits)
	}
	checkBlocks(t, e2, done)
	checkBlocks(t, e2, after)
	if errs := dumpLayers(e2, open, openSrc, []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	checkBlocks(t, e2, open)
	if err := e2.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// A layer with a wrong-sized buffer fails the whole list: nothing is published, the other
// layers fail with ErrBlockFailed, and once every layer was tried the blocks can be dumped
// again.
func TestLayerBatchFailedLayer(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	blocks := ids(0, 4)
	src := layerSources(mhaLayout, blocks, true)
	if err := e.DumpShard(blocks, 0, src[0]).Wait(); err != nil {
		t.Fatal(err)
	}
	bad := append([][]byte{make([]byte, 100)}, src[1][1:]...)
	if err := e.DumpShard(blocks, 1, bad).Wait(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad layer: %v", err)
	}
	for _, sh := range []int{2, 3} {
		if err := e.DumpShard(blocks, sh, src[sh]).Wait(); !errors.Is(err, ErrBlockFailed) {
			t.Fatalf("layer %d after a failed layer: %v, want ErrBlockFailed", sh, err)
		}
	}
	for _, hit := range e.Lookup(blocks) {
		if hit {
			t.Fatal("a block of a failed batch was published")
		}
	}
	if errs := dumpLayers(e, blocks, src, []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	checkBlocks(t, e, blocks)
	if st := e.Stats(); st.FailedBlocks != int64(len(blocks)) || st.BatchRecords != 1 {
		t.Fatalf("stats: %+v", st)
	}
}

// A list whose last layers never come is discarded after TaskTimeout: its blocks were never
// visible (but one a whole-block dump stored meanwhile), and they can be dumped again; the
// segment is sealed at Close.
func TestLayerBatchExpires(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	opts.TaskTimeout = 300 * time.Millisecond
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 3)
	src := layerSources(mhaLayout, blocks, true)
	if err := e.DumpShard(blocks, 0, src[0]).Wait(); err != nil {
		t.Fatal(err)
	}
	// A whole-block dump of one of its blocks does not wait for the batch.
	if err := e.Dump(blocks[:1], [][]byte{blockBytes(mhaLayout, blocks[0])}).Wait(); err != nil {
		t.Fatalf("whole dump of a block of an open batch: %v", err)
	}
	if st := e.Stats(); st.BatchOpenBlocks != 2 {
		t.Fatalf("%d blocks partly dumped in batch records, want the 2 not stored otherwise", st.BatchOpenBlocks)
	}
	for deadline := time.Now().Add(10 * time.Second); e.Stats().StagingExpired == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the batch did not expire")
		}
		time.Sleep(20 * time.Millisecond)
	}
	dumpBlocks(t, e, blocks)
	checkBlocks(t, e, blocks)
}

// Dumps of a block of an open batch by other tasks (a whole-block dump, another list) do not
// wait for the batch, whose last layers may never come: each writes the block on its own, and
// the batch, committing later, indexes its own copy of the same bytes. Every block loads.
func TestLayerBatchOverlappingDumps(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	blocks := ids(0, 4)
	src := layerSources(mhaLayout, blocks, true)
	if err := e.DumpShard(blocks, 0, src[0]).Wait(); err != nil {
		t.Fatal(err)
	}
	// Both complete while the batch still waits for its layers 1-3.
	if err := e.Dump(blocks[1:2], [][]byte{blockBytes(mhaLayout, blocks[1])}).Wait(); err != nil {
		t.Fatalf("whole-block dump of a block of an open batch: %v", err)
	}
	other := []BlockID{blocks[2], blockID(99)}
	if errs := dumpLayers(e, other, layerSources(mhaLayout, other, true), []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
		t.Fatalf("layer-wise dump of a list overlapping an open batch: %v", errors.Join(errs...))
	}
	if hits := e.Lookup(append(blocks, blockID(99))); !hits[1] || !hits[2] || hits[0] || hits[3] || !hits[4] {
		t.Fatalf("before the batch commits: %v", hits)
	}
	checkBlocks(t, e, []BlockID{blocks[1], blocks[2], blockID(99)})
	if errs := dumpLayers(e, blocks, src, []int{1, 2, 3}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	checkBlocks(t, e, append(blocks, blockID(99)))
	checkShards(t, e, append(blocks, blockID(99)))
	if loc := location(t, e, blocks[1]); !loc.IsBatch() {
		t.Fatalf("block 1 after the batch committed: %+v, want its batch copy", loc)
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// Compaction keeps a batch's live blocks layer-major: those of one source batch move together
// into a new batch record (in their order, shard i of each adjacent to the next), published
// only once durable; a block whose shard rotted on disk is dropped instead of copied, and a
// batch with one live block left moves it as a record of its own.
func TestLayerBatchCompaction(t *testing.T) {
	mem, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/a")))
	defer e.Close()
	blocks, lone := ids(0, 20), ids(200, 204)
	for _, list := range [][]BlockID{blocks, lone} {
		if errs := dumpLayers(e, list, layerSources(mhaLayout, list, true), []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
			t.Fatal(errors.Join(errs...))
		}
	}
	dumpBlocks(t, e, ids(100, 140)) // rotate: the batches' segment is sealed
	old := location(t, e, blocks[0])
	// Keep blocks 0, 2, 3 and 5 of the first batch record (the list was cut into records of a
	// few blocks each) and block 1, whose shard rots below.
	live, rotten := []BlockID{blocks[0], blocks[2], blocks[3], blocks[5]}, blocks[1]
	for _, id := range append(live, rotten) {
		if loc := location(t, e, id); !loc.IsBatch() || loc.Offset != old.Offset || loc.Segment != old.Segment {
			t.Fatalf("block %s is not in the first batch record: %+v", id, loc)
		}
	}
	b := e.ix.NewBatch()
	for _, id := range blocks {
		if !slices.Contains(live, id) && id != rotten {
			b.Delete(id)
		}
	}
	for _, id := range lone[1:] {
		b.Delete(id)
	}
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	corruptShard(t, e, mem, location(t, e, rotten), 3)
	rep, err := e.Compact(0.99, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.SegmentsCompacted == 0 {
		t.Fatalf("nothing compacted: %+v", rep)
	}
	first := location(t, e, live[0])
	for k, id := range live {
		loc := location(t, e, id)
		if !loc.IsBatch() || loc.Segment == old.Segment || loc.Segment != first.Segment || loc.Offset != first.Offset ||
			loc.BatchBlocks != len(live) || loc.BatchPos != k {
			t.Fatalf("block %d (%s) after compaction: %+v, want position %d of one new batch record of %d", k, id, loc, k, len(live))
		}
	}
	if loc := location(t, e, lone[0]); loc.IsBatch() || loc.Segment == old.Segment {
		t.Fatalf("the lone live block of a batch after compaction: %+v, want a record of its own", loc)
	}
	if _, ok, _ := e.ix.Get(rotten); ok {
		t.Fatalf("block %s with a rotten shard was copied", rotten)
	}
	checkBlocks(t, e, append(live, lone[0]))
	checkShards(t, e, live)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	// The relocated batch reopens from its segment like a dumped one.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/a")))
	checkBlocks(t, e, append(live, lone[0]))
	checkShards(t, e, live)
}

// Another instance on a shared tier indexes a sealed segment's batch records from its footer,
// batch headers and commit blocks, and loads their blocks whole and by shard.
func TestLayerBatchShared(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	b := mustOpen(t, filepath.Join(root, "b"), sharedOptions(sharedB, time.Hour))
	defer b.Close()
	blocks := ids(0, 6)
	l := a.Layout()
	if errs := dumpLayers(a, blocks, layerSources(l, blocks, true), rand.Perm(l.Shards)); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	if st := a.Stats(); st.BatchRecords != 1 {
		t.Fatalf("%d batch records", st.BatchRecords)
	}
	if err := a.Close(); err != nil { // seals, publishes
		t.Fatal(err)
	}
	waitFor(t, "A's batch blocks visible in B", func() bool { return allHit(b, blocks) })
	checkBlocks(t, b, blocks)
	checkShards(t, b, blocks)
}

// Demotion moves the blocks of batch records to the next tier in batch records again (those of
// one source batch evicted together): every block loads whole and by shard, nothing is lost,
// the accounting is exact.
func TestLayerBatchDemotion(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 1<<20, "/ssd"), diskTierCfg("nfs", 0, "/nfs")))
	defer e.Close()
	var all []BlockID
	for r := 0; r < 16; r++ { // 16 requests of 5 blocks: 2.5 MiB into a 1 MiB first tier
		blocks := ids(r*5, r*5+5)
		if errs := dumpLayers(e, blocks, layerSources(mhaLayout, blocks, true), []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
			t.Fatal(errors.Join(errs...))
		}
		all = append(all, blocks...)
	}
	if st := e.Stats(); st.BatchRecords != 16 {
		t.Fatalf("%d batch records for 16 requests", st.BatchRecords)
	}
	waitFor(t, "the first tier to get under its high watermark", func() bool { return !e.tiers[0].Space().OverHigh() })
	if st := e.TierStats(); st[1].Blocks == 0 || e.Stats().EvictedBlocks == 0 {
		t.Fatalf("nothing demoted: %+v", st)
	}
	var inBatches, alone int
	for _, id := range all {
		if loc := location(t, e, id); e.tierOf(loc.Segment).Pos() == 1 {
			if loc.IsBatch() {
				inBatches++
			} else {
				alone++
			}
		}
	}
	t.Logf("demoted: %d blocks in batch records, %d as records of their own", inBatches, alone)
	if inBatches <= alone {
		// Victims are whole segments, coldest first: a request's batch record moves whole; only
		// its blocks compacted or relocated on their own before move as records of their own.
		t.Fatalf("%d blocks demoted in batch records, %d as records of their own: want most kept layer-major", inBatches, alone)
	}
	checkBlocks(t, e, all)
	checkShards(t, e, all)
	checkAllIndexed(t, e)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// A layer-major relocation whose commit cannot be made durable publishes nothing: compaction
// fails with ErrIO, every block stays where it was and loads, and the next compaction moves
// them.
func TestLayerBatchRelocationFailure(t *testing.T) {
	mem := vfs.NewCrashableMem()
	inj := &segInjector{kind: errorfs.OpFileSyncData, err: syscall.EIO}
	opts := tierOptions(errorfs.Wrap(mem, inj), diskTierCfg("ssd", 0, "/a"))
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 6)
	if errs := dumpLayers(e, blocks, layerSources(mhaLayout, blocks, true), []int{0, 1, 2, 3}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	dumpBlocks(t, e, ids(100, 140)) // rotate: the batch's segment is sealed
	old := location(t, e, blocks[0])
	b := e.ix.NewBatch()
	b.Delete(blocks[0])
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	live := blocks[1:]
	inj.armed.Store(true)
	if _, err := e.Compact(0.99, nil); !errors.Is(err, ErrIO) || !strings.Contains(err.Error(), "relocate a batch of 5 blocks") {
		t.Fatalf("compaction with failing syncs: %v, want ErrIO naming the batch relocation", err)
	}
	inj.armed.Store(false)
	for _, id := range live {
		if loc := location(t, e, id); loc.Segment != old.Segment || loc.Offset != old.Offset {
			t.Fatalf("block %s moved by a failed relocation: %+v", id, loc)
		}
	}
	checkBlocks(t, e, live)
	if _, err := e.Compact(0.99, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range live {
		if loc := location(t, e, id); loc.Segment == old.Segment || !loc.IsBatch() {
			t.Fatalf("block %s after the second compaction: %+v", id, loc)
		}
	}
	checkBlocks(t, e, live)
	checkShards(t, e, live)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}
