package engine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Sidecars of the tests: 4 parts (one per layer of mhaLayout) of 96 bytes, a function of
// (block, kind) so any reader can check them.
const (
	sideParts = 4
	sidePart  = 96
)

func sidecarBytes(id BlockID, kind SidecarKind) []byte {
	b := make([]byte, sideParts*sidePart)
	payload(id, 1000+uint64(kind), b)
	return b
}

func dumpSidecars(t testing.TB, e *Engine, kind SidecarKind, ids []BlockID) {
	t.Helper()
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = sidecarBytes(id, kind)
	}
	if err := e.DumpSidecars(kind, sideParts, ids, src).Wait(); err != nil {
		t.Fatalf("dump sidecars: %v", err)
	}
}

// checkSidecars loads every part of kind for ids and compares; want[i] false means ids[i]
// must not be found.
func checkSidecars(t testing.TB, e *Engine, kind SidecarKind, ids []BlockID, want []bool) {
	t.Helper()
	for p := range sideParts {
		dst := make([]byte, len(ids)*sidePart)
		found, err := e.LoadSidecars(kind, p, ids, dst)
		if err != nil {
			t.Fatalf("load sidecars part %d: %v", p, err)
		}
		for i, id := range ids {
			w := want == nil || want[i]
			if found[i] != w {
				t.Fatalf("sidecar %d of %s part %d: found %v, want %v", kind, id, p, found[i], w)
			}
			if w && !bytes.Equal(dst[i*sidePart:(i+1)*sidePart], sidecarBytes(id, kind)[p*sidePart:(p+1)*sidePart]) {
				t.Fatalf("sidecar %d of %s part %d: bytes differ", kind, id, p)
			}
		}
	}
}

func TestSidecarDumpLoad(t *testing.T) {
	for _, withMemory := range []bool{false, true} {
		name := "disk"
		if withMemory {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) {
			_, fs := memFS()
			opts := testOptions(fs, mhaLayout)
			if withMemory {
				opts.Tiers = []tiers.Config{{Name: "dram", Kind: tiers.KindMemory, Capacity: 1 << 20}, diskTierCfg("ssd", 0, "/store")}
			}
			e := mustOpen(t, "/store", opts)
			blocks := ids(0, 40)
			dumpBlocks(t, e, blocks)
			dumpSidecars(t, e, 3, blocks[:30])
			dumpSidecars(t, e, 7, blocks[10:20])
			// Once more: kept, not written again.
			dumpSidecars(t, e, 3, blocks[:5])
			want := make([]bool, len(blocks))
			for i := range 30 {
				want[i] = true
			}
			checkSidecars(t, e, 3, blocks, want)
			checkSidecars(t, e, 7, blocks[10:20], nil)
			if has := e.HasSidecars(7, blocks[:12]); countTrue(has) != 2 || !has[10] || !has[11] {
				t.Fatalf("HasSidecars = %v", has)
			}
			st := e.Stats()
			if st.Sidecars != 40 || st.DumpedSidecars != 40 || st.Blocks != 40 {
				t.Fatalf("stats: %d sidecars, %d dumped, %d blocks", st.Sidecars, st.DumpedSidecars, st.Blocks)
			}
			if withMemory && (st.SidecarDiskReads != 0 || st.SidecarMemoryHits == 0) {
				t.Fatalf("memory tier: %d disk reads, %d memory hits", st.SidecarDiskReads, st.SidecarMemoryHits)
			}
			if err := e.ix.CheckAccounting(); err != nil {
				t.Fatal(err)
			}
			// Across a reopen, from disk (and into memory on the first read).
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = mustOpen(t, "/store", opts)
			defer e.Close()
			checkSidecars(t, e, 3, blocks, want)
			checkSidecars(t, e, 3, blocks, want)
			st = e.Stats()
			// With a memory tier the first read of a sidecar caches all of it; without, each
			// part asked is read.
			if wantReads := map[bool]int64{true: 30, false: 30 * 2 * sideParts}[withMemory]; st.SidecarDiskReads != wantReads {
				t.Fatalf("after reopen: %d disk reads, want %d", st.SidecarDiskReads, wantReads)
			}
			if withMemory && st.SidecarMemoryHits != 30*(2*sideParts-1) {
				t.Fatalf("after reopen: %d memory hits, want %d", st.SidecarMemoryHits, 30*(2*sideParts-1))
			}
			checkBlocks(t, e, blocks)
		})
	}
}

func TestSidecarBadInput(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	blocks := ids(0, 2)
	dumpBlocks(t, e, blocks[:1])
	good := [][]byte{sidecarBytes(blocks[0], 1)}
	for name, task := range map[string]*Task{
		"kind 0":         e.DumpSidecars(0, sideParts, blocks[:1], good),
		"kind too large": e.DumpSidecars(MaxSidecarKind+1, sideParts, blocks[:1], good),
		"no parts":       e.DumpSidecars(1, 0, blocks[:1], good),
		"parts unequal":  e.DumpSidecars(1, 5, blocks[:1], good),
		"empty":          e.DumpSidecars(1, 1, blocks[:1], [][]byte{{}}),
		"buffers":        e.DumpSidecars(1, sideParts, blocks[:1], nil),
		"zero id":        e.DumpSidecars(1, sideParts, []BlockID{{}}, good),
	} {
		if err := task.Wait(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	// A block not stored: ErrNotFound naming it; the stored one beside it is fine.
	err := e.DumpSidecars(1, sideParts, blocks, [][]byte{good[0], sidecarBytes(blocks[1], 1)}).Wait()
	if !errors.Is(err, ErrNotFound) || !bytes.Contains([]byte(err.Error()), []byte(blocks[1].String())) {
		t.Fatalf("sidecar of a missing block: %v", err)
	}
	checkSidecars(t, e, 1, blocks, []bool{true, false})
	for name, f := range map[string]func() error{
		"kind":  func() error { _, err := e.LoadSidecars(0, 0, blocks, make([]byte, 2*sidePart)); return err },
		"size":  func() error { _, err := e.LoadSidecars(1, 0, blocks, make([]byte, 2*sidePart+1)); return err },
		"part":  func() error { _, err := e.LoadSidecars(1, -1, blocks, make([]byte, 2*sidePart)); return err },
		"empty": func() error { _, err := e.LoadSidecars(1, 0, blocks, nil); return err },
	} {
		if err := f(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("load %s: %v, want ErrInvalidArgument", name, err)
		}
	}
	// Parts of another size, a part past the end: misses, not errors, and dst zeroed.
	dst := bytes.Repeat([]byte{0xff}, 2*2*sidePart)
	if found, err := e.LoadSidecars(1, 0, blocks, dst); err != nil || found[0] || found[1] || !bytes.Equal(dst, make([]byte, len(dst))) {
		t.Fatalf("wrong part size: %v %v", found, err)
	}
	if found, err := e.LoadSidecars(1, sideParts, blocks[:1], make([]byte, sidePart)); err != nil || found[0] {
		t.Fatalf("part past the end: %v %v", found, err)
	}
}

// TestSidecarWaitsForItsBlock: a sidecar dumped while its block is being assembled layer by
// layer is stored once the block is complete, never before it.
func TestSidecarWaitsForItsBlock(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	id := blockID(1)
	full := blockBytes(mhaLayout, id)
	shard := func(s int) [][]byte {
		return [][]byte{full[int64(s)*mhaLayout.ShardBytes : int64(s+1)*mhaLayout.ShardBytes]}
	}
	for s := 0; s < mhaLayout.Shards-1; s++ {
		if err := e.DumpShard([]BlockID{id}, s, shard(s)).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	side := e.DumpSidecars(2, sideParts, []BlockID{id}, [][]byte{sidecarBytes(id, 2)})
	if done, _ := side.Check(); done {
		t.Fatal("the sidecar task finished before its block was complete")
	}
	if e.HasSidecars(2, []BlockID{id})[0] {
		t.Fatal("a sidecar is visible before its block")
	}
	if err := e.DumpShard([]BlockID{id}, mhaLayout.Shards-1, shard(mhaLayout.Shards-1)).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := side.Wait(); err != nil {
		t.Fatal(err)
	}
	checkSidecars(t, e, 2, []BlockID{id}, nil)
}

// TestSidecarCorruptOnDisk: a sidecar whose bytes changed on disk is a miss, dropped from the
// index and counted; its block still loads.
func TestSidecarCorruptOnDisk(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Layout: mhaLayout, Schema: testSchema, SegmentSize: 1 << 20}
	e := mustOpen(t, dir, opts)
	blocks := ids(0, 3)
	dumpBlocks(t, e, blocks)
	dumpSidecars(t, e, 4, blocks)
	loc, ok, err := e.ix.GetSidecar(blocks[1], 4)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	path, _ := e.SegmentPath(loc.Segment)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0x5a}, loc.Offset+4096+2*sidePart+7); err != nil { // part 2
		t.Fatal(err)
	}
	_ = f.Close()
	e = mustOpen(t, dir, opts)
	defer e.Close()
	dst := make([]byte, 3*sidePart)
	found, err := e.LoadSidecars(4, 0, blocks, dst) // part 0 asked: the whole sidecar is checked
	if err != nil || !found[0] || found[1] || !found[2] {
		t.Fatalf("found %v err %v: want the corrupt one missed", found, err)
	}
	if e.HasSidecars(4, blocks[1:2])[0] || e.Stats().CorruptReads != 1 {
		t.Fatalf("corrupt sidecar still indexed (%v) or not counted (%d)", e.HasSidecars(4, blocks[1:2])[0], e.Stats().CorruptReads)
	}
	checkBlocks(t, e, blocks)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestSidecarsFollowTheirBlocks: eviction drops a block's sidecars with it, compaction copies
// them forward, demotion moves them to the next tier with their block, promotion back up; the
// accounting stays exact and no sidecar is ever found without its block.
func TestSidecarsFollowTheirBlocks(t *testing.T) {
	t.Run("evict", func(t *testing.T) {
		_, fs := memFS()
		e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
		defer e.Close()
		blocks := ids(0, 60)
		dumpBlocks(t, e, blocks)
		dumpSidecars(t, e, 5, blocks)
		if _, err := e.Evict("", 0); err != nil {
			t.Fatal(err)
		}
		if n := countTrue(e.Lookup(blocks)); n != 0 {
			t.Fatalf("%d blocks left", n)
		}
		if st := e.Stats(); st.Sidecars != 0 || st.LiveBytes != 0 {
			t.Fatalf("after evicting everything: %d sidecars, %d live bytes", st.Sidecars, st.LiveBytes)
		}
		checkSidecars(t, e, 5, blocks, make([]bool, len(blocks)))
		if err := e.ix.CheckAccounting(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("compact", func(t *testing.T) {
		_, fs := memFS()
		e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
		defer e.Close()
		blocks := ids(0, 60)
		for i := range blocks {
			dumpBlocks(t, e, blocks[i:i+1])
			dumpSidecars(t, e, 5, blocks[i:i+1])
		}
		// Drop every other block (and so its sidecar): the segments become sparse.
		b := e.ix.NewBatch()
		for i := 0; i < len(blocks); i += 2 {
			b.Delete(blocks[i])
		}
		if err := e.ix.Apply(b, true); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		rep, err := e.Compact(0.99, nil)
		if err != nil || rep.SegmentsCompacted == 0 {
			t.Fatalf("compact: %+v %v", rep, err)
		}
		want := make([]bool, len(blocks))
		for i := 1; i < len(blocks); i += 2 {
			want[i] = true
		}
		checkSidecars(t, e, 5, blocks, want)
		for i := 1; i < len(blocks); i += 2 {
			checkBlocks(t, e, blocks[i:i+1])
		}
		if err := e.ix.CheckAccounting(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("demote and promote", func(t *testing.T) {
		_, fs := memFS()
		e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 1<<20, "/ssd"), diskTierCfg("nfs", 0, "/nfs")))
		defer e.Close()
		blocks := ids(0, 80)
		for i := range blocks {
			dumpBlocks(t, e, blocks[i:i+1])
			dumpSidecars(t, e, 6, blocks[i:i+1])
		}
		waitFor(t, "the first tier to get under its high watermark", func() bool { return !e.tiers[0].Space().OverHigh() })
		st := e.TierStats()
		if st[1].Blocks == 0 || st[1].Sidecars == 0 {
			t.Fatalf("nothing demoted: %+v", st)
		}
		sameTier := func() {
			t.Helper()
			for _, id := range blocks {
				bl, okb, _ := e.ix.Get(id)
				sl, oks, _ := e.ix.GetSidecar(id, 6)
				if oks && !okb {
					t.Fatalf("sidecar of %s outlives its block", id)
				}
				if okb && oks && e.tierOf(bl.Segment) != e.tierOf(sl.Segment) {
					t.Fatalf("block %s in tier %s, its sidecar in %s", id, e.tierOf(bl.Segment).Name(), e.tierOf(sl.Segment).Name())
				}
			}
		}
		sameTier()
		checkSidecars(t, e, 6, blocks, nil)
		var low BlockID
		for _, id := range blocks {
			if loc, _, _ := e.ix.Get(id); e.tierOf(loc.Segment).Pos() == 1 {
				low = id
				break
			}
		}
		if _, err := e.promoteBlocks([]BlockID{low}); err != nil {
			t.Fatal(err)
		}
		if loc, _, _ := e.ix.GetSidecar(low, 6); e.tierOf(loc.Segment).Pos() != 0 {
			t.Fatal("the sidecar stayed below its promoted block")
		}
		sameTier()
		checkAllIndexed(t, e)
	})
}

// TestSidecarCrashRecovery: after a power loss, sidecars in the segment that was active are
// indexed again by recovery beside their blocks; a torn sidecar record costs only that sidecar
// (its block stays), and a torn block takes its sidecar with it.
func TestSidecarCrashRecovery(t *testing.T) {
	mem, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	e := mustOpen(t, "/store", opts)
	blocks := ids(0, 6)
	dumpBlocks(t, e, blocks[:5])
	dumpSidecars(t, e, 9, blocks[:5])
	dumpBlocks(t, e, blocks[5:])
	dumpSidecars(t, e, 9, blocks[5:])
	side, _, _ := e.ix.GetSidecar(blocks[2], 9)
	last := location(t, e, blocks[5])
	seg := e.segDir + "/" + segName(side.Segment)
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	// Blocks 0-4 were appended together, then their sidecars, then block 5 and its sidecar.
	// Tear sidecar 2's payload: recovery's scan stops at the first bad record, so the log is
	// cut there: sidecars 2-4, block 5 and its sidecar are lost, blocks 0-4 and sidecars 0-1
	// stay.
	patchFile(t, crashed, seg, side.Offset+4096, func(b []byte) { b[10] ^= 1 })
	opts.FS = crashed
	e2 := mustOpen(t, "/store", opts)
	defer e2.Close()
	if hits := e2.Lookup(blocks); countTrue(hits[:5]) != 5 || (hits[5] && last.Segment == side.Segment) {
		t.Fatalf("blocks after the crash: %v", hits)
	}
	checkBlocks(t, e2, blocks[:5])
	checkSidecars(t, e2, 9, blocks[:5], []bool{true, true, false, false, false})
	if err := e2.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	// The store goes on: the lost sidecars can be dumped again.
	dumpSidecars(t, e2, 9, blocks[:5])
	checkSidecars(t, e2, 9, blocks[:5], nil)
}

// TestSidecarsShared: another instance's sidecars on a shared tier are found beside its
// blocks (from its segments' footers), byte-exact; copying its blocks into this instance's
// own tier (promotion after a hit) brings their sidecars.
func TestSidecarsShared(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	aIDs := ids(0, 12)
	dumpBlocks(t, a, aIDs)
	dumpSidecars(t, a, 8, aIDs[:8])
	if err := a.Close(); err != nil { // seals and publishes A's segments
		t.Fatal(err)
	}
	o := sharedOptions(sharedB, time.Hour)
	o.Tiers = []tiers.Config{{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{filepath.Join(root, "b-ssd")}}, o.Tiers[0]}
	b := mustOpen(t, filepath.Join(root, "b"), o)
	defer b.Close()
	// The sidecars may be in a segment of their own, indexed by a later refresh.
	waitFor(t, "A's blocks and sidecars visible in B", func() bool { return allHit(b, aIDs) && countTrue(b.HasSidecars(8, aIDs)) == 8 })
	want := make([]bool, len(aIDs))
	for i := range 8 {
		want[i] = true
	}
	checkSidecars(t, b, 8, aIDs, want)
	if has := b.HasSidecars(8, aIDs); countTrue(has) != 8 {
		t.Fatalf("HasSidecars of foreign blocks: %v", has)
	}
	// A hit copies A's blocks into B's own first tier, with their sidecars.
	checkBlocks(t, b, aIDs)
	// (A block's sidecar may be appended after it: the foreign copy serves meanwhile.)
	waitFor(t, "A's blocks copied into B's SSD tier with their sidecars", func() bool {
		for i, id := range aIDs {
			if !b.ix.Contains(id) || (i < 8 && !b.ix.HasSidecar(id, 8)) {
				return false
			}
		}
		return true
	})
	checkSidecars(t, b, 8, aIDs, want)
	if err := b.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestSidecarsSharedForgottenInMemory: the memory tier serves sidecars without asking the
// index, so another instance's sidecars cached there must go when their entries leave the
// foreign index: the owner retired the segment (the refresh drops it), or a load found the
// block damaged (dropBroken; a segment found gone takes the same path). Afterwards the sidecars are misses, as HasSidecars says, not hits
// served from memory for blocks no longer stored. Blocks copied into the memory tier from the
// foreign segment stay served there: verified bytes of a content-addressed block
// (docs/sharing.md).
func TestSidecarsSharedForgottenInMemory(t *testing.T) {
	for _, how := range []string{"retired", "corrupt"} {
		t.Run(how, func(t *testing.T) {
			root := t.TempDir()
			shared, sharedB := sharedDirs(t)
			a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
			defer func() { _ = a.Close() }()
			aIDs := ids(0, 12)
			side, copied := aIDs[:8], aIDs[8:]
			dumpBlocks(t, a, aIDs)
			dumpSidecars(t, a, 8, side)
			// Seal and publish A's segments by reopening it.
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			a = mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
			// B: a memory tier in front of the shared tier alone, so nothing is promoted into a
			// tier of its own and the foreign index is the only one holding A's blocks.
			o := sharedOptions(sharedB, time.Hour)
			o.Tiers = []tiers.Config{{Name: "dram", Kind: tiers.KindMemory, Capacity: 8 << 20}, o.Tiers[0]}
			b := mustOpen(t, filepath.Join(root, "b"), o)
			defer b.Close()
			waitFor(t, "A's blocks and sidecars visible in B", func() bool {
				return allHit(b, aIDs) && countTrue(b.HasSidecars(8, side)) == len(side)
			})
			checkSidecars(t, b, 8, side, nil)
			checkBlocks(t, b, copied)
			if st := b.mem.Stats(); st.Sidecars != len(side) || st.Blocks != len(copied) {
				t.Fatalf("B's memory tier holds %d sidecars and %d blocks, want %d and %d", st.Sidecars, st.Blocks, len(side), len(copied))
			}

			switch how {
			case "retired":
				// A retires everything; B drops the segments at its next refresh, and the cached
				// sidecars right after their entries (waited for: the index shows the drop first).
				if _, err := a.Evict("shared", 0); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "A's retired blocks and their cached sidecars gone from B", func() bool {
					return b.LookupPrefix(aIDs) == 0 && countTrue(b.HasSidecars(8, side)) == 0 && b.mem.Stats().Sidecars == 0
				})
			case "corrupt":
				// A's blocks damaged in place (a file B has open, so deleting it would not do):
				// B's loads find them corrupt and drop them, with their sidecars, from its
				// foreign index.
				for _, id := range side {
					damageForeignBlock(t, b, id)
				}
				dst := make([][]byte, len(side))
				for i := range dst {
					dst[i] = devio.AlignedBuffer(int(b.Layout().BlockBytes()))
				}
				task := b.Load(side, dst)
				_ = task.Wait()
				for i, err := range task.BlockErrors() {
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("load of %s, its bytes damaged: %v, want ErrCorrupt", side[i], err)
					}
				}
				if n := countTrue(b.HasSidecars(8, side)); n != 0 {
					t.Fatalf("%d sidecars still indexed after their blocks were dropped", n)
				}
			}
			checkSidecars(t, b, 8, side, make([]bool, len(side)))
			checkBlocks(t, b, copied)
		})
	}
}

// TestSidecarsSharedAheadOfTheirBlock: relocation can put a sidecar in an older segment than
// its block (compaction of the sidecar's emptier segment first); another instance indexing
// the segments in order still finds the sidecar beside its block.
func TestSidecarsSharedAheadOfTheirBlock(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	oa := sharedOptions(shared, time.Hour)
	a := mustOpen(t, filepath.Join(root, "a"), oa)
	fill := ids(0, 6) // 6 × 36 KiB: segment 1 holds them and X
	x := blockID(100)
	dumpBlocks(t, a, append(fill, x))
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	xloc, _, _ := a.ix.Get(x)
	// Seal segment 1 so the sidecar goes into a new one.
	if err := a.w.SealOlderThan(time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	dumpSidecars(t, a, 8, []BlockID{x})
	if sl, _, _ := a.ix.GetSidecar(x, 8); sl.Segment == xloc.Segment {
		t.Fatalf("sidecar in the block's segment %d: the test needs them apart", sl.Segment)
	}
	// Relocate X's block alone (what compaction does when the sidecar's emptier segment was
	// compacted first): the block lands in a newer segment than its sidecar.
	if _, blocks, _, err := a.relocate([]recordRef{{id: x, loc: xloc}}, a.tiers[0]); err != nil || blocks != 1 {
		t.Fatalf("relocate: %d blocks, %v", blocks, err)
	}
	bl, _, _ := a.ix.Get(x)
	sl, _, _ := a.ix.GetSidecar(x, 8)
	if sl.Segment >= bl.Segment {
		t.Fatalf("block at segment %d, sidecar at %d: the test needs the sidecar ahead", bl.Segment, sl.Segment)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	bo := sharedOptions(sharedB, time.Hour)
	bi := mustOpen(t, filepath.Join(root, "b"), bo)
	defer bi.Close()
	waitFor(t, "X and its sidecar visible in B", func() bool { return allHit(bi, []BlockID{x}) && bi.HasSidecars(8, []BlockID{x})[0] })
	checkSidecars(t, bi, 8, []BlockID{x}, nil)
}

// TestSidecarsRebuiltIndex: a lost index is rebuilt from the segments with the sidecars beside
// their blocks, also one that compaction copied ahead of its block into an older segment.
func TestSidecarsRebuiltIndex(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	opts.SegmentSize = 256 << 10
	e := mustOpen(t, "/store", opts)
	fill := ids(0, 6)
	x := blockID(100)
	dumpBlocks(t, e, append(fill, x))
	dumpSidecars(t, e, 8, fill[:2])
	if err := e.w.SealOlderThan(time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	dumpSidecars(t, e, 8, []BlockID{x})
	// Relocate X's block alone (as compaction of its segment would, when the sidecar's
	// segment was compacted first): the block lands in a newer segment than its sidecar.
	xloc, _, _ := e.ix.Get(x)
	if _, blocks, _, err := e.relocate([]recordRef{{id: x, loc: xloc}}, e.tiers[0]); err != nil || blocks != 1 {
		t.Fatalf("relocate: %d blocks, %v", blocks, err)
	}
	bl, _, _ := e.ix.Get(x)
	sl, _, _ := e.ix.GetSidecar(x, 8)
	if sl.Segment >= bl.Segment {
		t.Fatalf("block at segment %d, sidecar at %d: the test needs the sidecar ahead", bl.Segment, sl.Segment)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.RemoveAll("/store/" + IndexDir); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", opts)
	defer e.Close()
	checkBlocks(t, e, append(fill[:2], x))
	checkSidecars(t, e, 8, []BlockID{fill[0], fill[1], x}, nil)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestSidecarIOErrors: a read that fails with EIO is a miss that keeps the sidecar indexed (a
// transient failure is not corruption); a write that fails fails the sidecar's dump with ErrIO
// and stores nothing; afterwards both work.
func TestSidecarIOErrors(t *testing.T) {
	mem, _ := memFS()
	inj := &segInjector{kind: errorfs.OpFileReadAt, err: syscall.EIO}
	e := mustOpen(t, "/store", testOptions(errorfs.Wrap(mem, inj), mhaLayout))
	defer e.Close()
	blocks := ids(0, 4)
	dumpBlocks(t, e, blocks)
	dumpSidecars(t, e, 2, blocks[:2])
	inj.armed.Store(true)
	found, err := e.LoadSidecars(2, 0, blocks[:2], make([]byte, 2*sidePart))
	inj.armed.Store(false)
	if err != nil || found[0] || found[1] || inj.hits.Load() == 0 {
		t.Fatalf("under EIO: found %v err %v (%d reads failed)", found, err, inj.hits.Load())
	}
	if !e.HasSidecars(2, blocks[:1])[0] || e.Stats().ReadErrors == 0 || e.Stats().CorruptReads != 0 {
		t.Fatalf("a transient read error dropped the sidecar or was miscounted: %+v", e.Stats())
	}
	checkSidecars(t, e, 2, blocks[:2], nil)

	inj.kind, inj.err = errorfs.OpFileWriteAt, syscall.EIO
	inj.hits.Store(0)
	inj.armed.Store(true)
	err = e.DumpSidecars(2, sideParts, blocks[2:], [][]byte{sidecarBytes(blocks[2], 2), sidecarBytes(blocks[3], 2)}).Wait()
	inj.armed.Store(false)
	if !errors.Is(err, ErrIO) || inj.hits.Load() == 0 {
		t.Fatalf("dump under EIO: %v (%d writes failed)", err, inj.hits.Load())
	}
	if has := e.HasSidecars(2, blocks[2:]); has[0] || has[1] {
		t.Fatal("a sidecar whose write failed is indexed")
	}
	dumpSidecars(t, e, 2, blocks[2:])
	checkSidecars(t, e, 2, blocks, nil)
	checkBlocks(t, e, blocks)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestLoadSidecarsFollowsRelocation: a LoadSidecars that read a sidecar's index entry just
// before reclamation moved it (demoted with its block, or copied forward by compaction) and
// retired its segment finds the sidecar at its new place instead of reporting a miss. This
// was the acknowledged sidecar "lost" in TestPowerLossDuringReclamation/demote: after the
// recovery the store's first tier was above its high watermark, the reclaimer demoted blocks
// with their sidecars while the check loaded them, and the load reported the moved sidecar
// missing (and logged it dropped) although it was indexed, durable and intact.
func TestLoadSidecarsFollowsRelocation(t *testing.T) {
	for _, tc := range []struct {
		name string
		// move relocates keep's block and sidecar out of segment seg and retires seg.
		move func(t *testing.T, e *Engine, keep BlockID, seg uint64)
	}{
		{"demote", func(t *testing.T, e *Engine, keep BlockID, seg uint64) {
			if _, err := e.Evict("ssd", 0); err != nil {
				t.Error(err)
			}
			if loc, _, _ := e.ix.GetSidecar(keep, 5); e.tierOf(loc.Segment).Name() != "cold" {
				t.Errorf("sidecar not demoted: in segment %d", loc.Segment)
			}
		}},
		{"compact", func(t *testing.T, e *Engine, keep BlockID, seg uint64) {
			// Leave keep alone in its segment, then compact: it moves and the segment goes.
			b := e.ix.NewBatch()
			for id := range e.blocksIn(t, seg) {
				if id != keep {
					b.Delete(id)
				}
			}
			if err := e.ix.Apply(b, true); err != nil {
				t.Error(err)
			}
			if _, err := e.Compact(0.99, nil); err != nil {
				t.Error(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, fs := memFS()
			e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/ssd"), diskTierCfg("cold", 0, "/cold")))
			defer e.Close()
			blocks := ids(0, 30)
			dumpBlocks(t, e, blocks)
			dumpSidecars(t, e, 5, blocks)
			// Seal the active segment and wait for the seal (Sync returns once every started
			// seal has finished): where the last records land depends on how the group
			// commits fell (without the race detector they often all fit the active segment).
			if err := e.w.SealOlderThan(time.Nanosecond); err != nil {
				t.Fatal(err)
			}
			if err := e.w.Sync(); err != nil {
				t.Fatal(err)
			}
			keep := blocks[0]
			stale, ok, err := e.ix.GetSidecar(keep, 5)
			if err != nil || !ok {
				t.Fatalf("get sidecar: %v %v", ok, err)
			}
			if row, _ := e.ix.Segment(stale.Segment); row.State != index.SegmentSealed {
				t.Fatalf("setup: segment %d of the first sidecar is %v, want sealed", stale.Segment, row.State)
			}
			moved := false
			e.setSeam(func(p seamPoint, id BlockID) {
				if p != seamSidecarLookedUp || id != keep || moved {
					return
				}
				moved = true
				tc.move(t, e, keep, stale.Segment)
				if _, err := e.acquireSegment(stale.Segment); !errors.Is(err, wal.ErrSegmentGone) {
					t.Errorf("segment %d not retired by the move: %v", stale.Segment, err)
				}
			})
			checkSidecars(t, e, 5, blocks[:1], nil)
			if !moved {
				t.Fatal("the seam was not reached")
			}
			e.setSeam(nil)
			present := e.Lookup(blocks)
			if st := e.Stats(); st.MissingSegmentReads != 0 || st.Sidecars != int64(countTrue(present)) {
				t.Fatalf("%d missing-segment reads, %d sidecars indexed, want 0 and %d", st.MissingSegmentReads, st.Sidecars, countTrue(present))
			}
			checkSidecars(t, e, 5, blocks, present)
			if err := e.ix.CheckAccounting(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// blocksIn returns the blocks whose entry points into segment n.
func (e *Engine) blocksIn(t *testing.T, n uint64) map[BlockID]bool {
	t.Helper()
	out := map[BlockID]bool{}
	if err := e.ix.Iterate(func(id BlockID, loc index.Location) bool {
		if loc.Segment == n {
			out[id] = true
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSidecarNotCachedAfterItsBlock: a sidecar read from disk (LoadSidecars) or appended
// (DumpSidecars) while its block is being dropped is not left in the memory tier, which serves
// sidecars without asking the index: no sidecar outlives its block, in memory either.
func TestSidecarNotCachedAfterItsBlock(t *testing.T) {
	for _, path := range []string{"load", "dump"} {
		t.Run(path, func(t *testing.T) {
			_, fs := memFS()
			opts := testOptions(fs, mhaLayout)
			opts.Tiers = []tiers.Config{{Name: "dram", Kind: tiers.KindMemory, Capacity: 1 << 20}, diskTierCfg("ssd", 0, "/store")}
			e := mustOpen(t, "/store", opts)
			defer e.Close()
			blocks := ids(0, 4)
			dumpBlocks(t, e, blocks)
			keep := blocks[0]
			if path == "load" {
				dumpSidecars(t, e, 5, blocks)
				e.mem.RemoveSidecar(keep, 5) // the next load reads it from disk
			}
			dropped := false
			e.setSeam(func(p seamPoint, id BlockID) {
				if p != seamSidecarRead || id != keep || dropped {
					return
				}
				dropped = true
				// Eviction from the only disk tier drops the blocks with their sidecars.
				if _, err := e.Evict("", 0); err != nil {
					t.Error(err)
				}
			})
			if path == "load" {
				dst := make([]byte, sidePart)
				if _, err := e.LoadSidecars(5, 0, []BlockID{keep}, dst); err != nil {
					t.Fatal(err)
				}
			} else {
				// Stored beside its block, which went after: the dump succeeded.
				dumpSidecars(t, e, 5, blocks[:1])
			}
			if !dropped {
				t.Fatal("the seam was not reached")
			}
			e.setSeam(nil)
			if n := countTrue(e.Lookup(blocks)); n != 0 {
				t.Fatalf("%d blocks left after evicting everything", n)
			}
			checkSidecars(t, e, 5, blocks, make([]bool, len(blocks)))
		})
	}
}

// TestRelocationSkipsMovedRecords: a relocation whose refs were read before another one moved
// the records and retired their segment (a promotion beside a compaction) skips them: they are
// not broken, so nothing is dropped, counted as a missing segment or logged as unusable.
func TestRelocationSkipsMovedRecords(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/ssd"), diskTierCfg("cold", 0, "/cold")))
	defer e.Close()
	blocks := ids(0, 30)
	dumpBlocks(t, e, blocks)
	dumpSidecars(t, e, 5, blocks)
	keep := blocks[0]
	bl, _, _ := e.ix.Get(keep)
	sl, _, _ := e.ix.GetSidecar(keep, 5)
	stale := []recordRef{{id: keep, loc: bl}, {id: keep, kind: 5, loc: sl}}
	if _, err := e.Evict("ssd", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.acquireSegment(bl.Segment); !errors.Is(err, wal.ErrSegmentGone) {
		t.Fatalf("segment %d not retired by the demotion: %v", bl.Segment, err)
	}
	moved, _, _, err := e.relocate(stale, e.tiers[1])
	if err != nil || moved != 0 {
		t.Fatalf("relocate stale refs: %d moved, %v", moved, err)
	}
	if st := e.Stats(); st.MissingSegmentReads != 0 || st.CorruptReads != 0 {
		t.Fatalf("stale refs counted as broken: %d missing-segment reads, %d corrupt", st.MissingSegmentReads, st.CorruptReads)
	}
	checkBlocks(t, e, blocks)
	checkSidecars(t, e, 5, blocks, nil)
}
