package engine

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// patchFile overwrites bytes of a file in place.
func patchFile(t *testing.T, fs vfs.FS, path string, off int64, fn func([]byte)) {
	t.Helper()
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	fn(buf)
	if _, err := f.WriteAt(buf, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func location(t *testing.T, e *Engine, id BlockID) index.Location {
	t.Helper()
	loc, ok, err := e.ix.Get(id)
	if err != nil || !ok {
		t.Fatalf("block %s not indexed: %v", id, err)
	}
	return loc
}

// TestTornTailTruncated: a crash that tears the last record of the active segment loses only
// that record; recovery truncates it, seals the segment, and the store keeps working.
func TestTornTailTruncated(t *testing.T) {
	mem, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	e := mustOpen(t, "/store", opts)
	blocks := ids(0, 5)
	dumpBlocks(t, e, blocks)
	last := location(t, e, blocks[4])
	// Power loss, then tear the last record's second shard as a torn write would.
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	e.Close()
	seg := e.segDir + "/" + segName(last.Segment)
	patchFile(t, crashed, seg, last.Offset+mhaLayout.ShardOffset(1), func(b []byte) { clear(b[:4096]) })

	opts.FS = crashed
	e2 := mustOpen(t, "/store", opts)
	defer e2.Close()
	r := e2.Recovery()
	// The index may or may not hold the entries (dumps do not wait for its sync: the active
	// segment is their durable copy): the torn one is dropped if it was there, the intact
	// ones are indexed again if they were not.
	if r.SegmentsRecovered != 1 || r.EntriesDropped+r.EntriesAdopted == 0 || r.EntriesDropped > 1 || r.TruncatedBytes != mhaLayout.RecordBytes() {
		t.Fatalf("recovery report %+v: want 1 segment, at most 1 entry dropped, %d bytes cut", r, mhaLayout.RecordBytes())
	}
	if hits := e2.Lookup(blocks); !hits[3] || hits[4] {
		t.Fatalf("after torn tail: %v", hits)
	}
	checkBlocks(t, e2, blocks[:4])
	// The recovered segment is sealed; new dumps go to a new segment.
	dumpBlocks(t, e2, blocks[4:])
	checkBlocks(t, e2, blocks)
	if loc := location(t, e2, blocks[4]); loc.Segment == last.Segment {
		t.Fatal("a recovered segment was appended to")
	}
	if err := e2.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	if err := fileSizesMatch(crashed, e2); err != nil {
		t.Fatal(err)
	}
}

func segName(n uint64) string {
	return formatSegmentName(n)
}

// TestBitFlipIsAMissNeverGarbage flips one byte in a sealed segment's payload and one in a
// record header: the loads fail with ErrCorrupt naming the block, the blocks are dropped from
// the index (so the connector recomputes and re-dumps them), other blocks are unaffected.
func TestBitFlipIsAMissNeverGarbage(t *testing.T) {
	mem, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	e := mustOpen(t, "/store", opts)
	blocks := ids(0, 6)
	dumpBlocks(t, e, blocks)
	e.Close()
	e = mustOpen(t, "/store", opts)
	defer e.Close()
	payloadVictim, headerVictim := location(t, e, blocks[1]), location(t, e, blocks[2])
	patchFile(t, mem, e.segDir+"/"+segName(payloadVictim.Segment), payloadVictim.Offset+mhaLayout.ShardOffset(3)+100, func(b []byte) { b[0] ^= 0x04 })
	patchFile(t, mem, e.segDir+"/"+segName(headerVictim.Segment), headerVictim.Offset+20, func(b []byte) { b[0] ^= 0x80 })

	// A shard load of an untouched shard of the payload victim still verifies.
	dst := devio.AlignedBuffer(int(mhaLayout.ShardBytes))
	if err := e.LoadShard(blocks[1:2], 0, [][]byte{dst}).Wait(); err != nil {
		t.Fatalf("untouched shard: %v", err)
	}
	// The flipped shard fails.
	if err := e.LoadShard(blocks[1:2], 3, [][]byte{dst}).Wait(); !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte(blocks[1].String())) {
		t.Fatalf("flipped shard: %v", err)
	}
	bufs := make([][]byte, len(blocks))
	for i := range bufs {
		bufs[i] = devio.AlignedBuffer(int(mhaLayout.BlockBytes()))
	}
	task := e.Load(blocks, bufs)
	task.Wait()
	errs := task.BlockErrors()
	for i, err := range errs {
		switch i {
		case 1: // already dropped by the failed shard load: a plain miss now
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("block 1 after being dropped: %v", err)
			}
		case 2:
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("header flip: %v", err)
			}
		default:
			if err != nil || !bytes.Equal(bufs[i], blockBytes(mhaLayout, blocks[i])) {
				t.Fatalf("block %d: %v", i, err)
			}
		}
	}
	if failed := task.Failed(); len(failed) != 2 || failed[0] != blocks[1] || failed[1] != blocks[2] {
		t.Fatalf("Failed() = %v", failed)
	}
	if hits := e.Lookup(blocks); hits[1] || hits[2] || !hits[0] {
		t.Fatalf("corrupt blocks still indexed: %v", hits)
	}
	if st := e.Stats(); st.CorruptReads != 2 {
		t.Fatalf("corrupt reads counted %d, want 2", st.CorruptReads)
	}
	// Re-dumping them works and serves the right bytes.
	dumpBlocks(t, e, blocks[1:3])
	checkBlocks(t, e, blocks)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestMissingSegmentIsAMiss: a sealed segment deleted under the store makes its blocks misses,
// at load time and after reopen, never an error that stops the engine.
func TestMissingSegmentIsAMiss(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	e := mustOpen(t, "/store", opts)
	blocks := ids(0, 40) // 40 × 36 KiB over 1 MiB segments: two segments
	dumpBlocks(t, e, blocks)
	e.Close()
	e = mustOpen(t, "/store", opts)
	gone := location(t, e, blocks[0]).Segment
	if err := fs.Remove(e.segDir + "/" + segName(gone)); err != nil {
		t.Fatal(err)
	}
	err := e.Load(blocks[:1], [][]byte{make([]byte, mhaLayout.BlockBytes())}).Wait()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("load from a deleted segment: %v", err)
	}
	e.Close()
	e = mustOpen(t, "/store", opts)
	defer e.Close()
	if r := e.Recovery(); len(r.MissingSegments) != 1 || r.MissingSegments[0] != gone {
		t.Fatalf("recovery report %+v", r)
	}
	hits := e.Lookup(blocks)
	var kept []BlockID
	for i, h := range hits {
		if h {
			kept = append(kept, blocks[i])
		}
	}
	if len(kept) == 0 || len(kept) == len(blocks) {
		t.Fatalf("%d of %d blocks kept", len(kept), len(blocks))
	}
	checkBlocks(t, e, kept)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestIndexRebuiltFromSegments: a deleted index directory is rebuilt from the segments.
func TestIndexRebuiltFromSegments(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	e := mustOpen(t, "/store", opts)
	blocks := ids(0, 40)
	dumpBlocks(t, e, blocks)
	e.Close()
	if err := fs.RemoveAll("/store/" + IndexDir); err != nil {
		t.Fatal(err)
	}
	other := opts
	other.Schema.Model = "other"
	if _, err := Open("/store", other); !errors.Is(err, ErrSchemaMismatch) {
		t.Fatalf("rebuild under another schema: %v", err)
	}
	if err := fs.RemoveAll("/store/" + IndexDir); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", opts)
	defer e.Close()
	checkBlocks(t, e, blocks)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

var _ = format.Alignment

func formatSegmentName(n uint64) string { return wal.SegmentFileName(n) }
