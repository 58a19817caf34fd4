package verify_test

import (
	"bytes"
	"cmp"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tools/verify"
	"github.com/ucm-go/ucm/tools/verify/verifytest"
)

// batchFixture is a store whose last segment holds batch records: committed batches of 5
// and 4 blocks around an abandoned one of 3 (its first layer written).
type batchFixture struct {
	fs        vfs.FS
	seg       uint64
	path      string
	committed [][]format.BlockID // the committed batches' blocks
	offsets   []int64            // the batches' offsets, in file order (the abandoned one second)
	extents   []int64
}

func batchID(batch, k int) format.BlockID { return testID(1000 + 100*batch + k) }

// buildBatchStore makes a store of 12 blocks written by the engine, then a sealed segment of
// batch records (verifytest.WriteBatchSegment).
func buildBatchStore(t *testing.T) *batchFixture {
	t.Helper()
	fs := buildStore(t, 12)
	var batches []*verifytest.Batch
	for j, n := range []int{5, 3, 4} {
		bt := &verifytest.Batch{IDs: make([]format.BlockID, n), Commit: j != 1}
		for k := range bt.IDs {
			bt.IDs[k] = batchID(j, k)
		}
		batches = append(batches, bt)
	}
	seg, err := verifytest.WriteBatchSegment(fs, storeDir, batches)
	if err != nil {
		t.Fatal(err)
	}
	fx := &batchFixture{fs: fs, seg: seg, path: segPath(seg)}
	for _, bt := range batches {
		if bt.Commit {
			fx.committed = append(fx.committed, bt.IDs)
		}
		fx.offsets, fx.extents = append(fx.offsets, bt.Offset), append(fx.extents, bt.Extent)
	}
	return fx
}

// locOf returns block id's index entry.
func locOf(t *testing.T, fs vfs.FS, id format.BlockID) index.Location {
	t.Helper()
	h := open(t, fs)
	defer func() { _ = h.Close() }()
	loc, ok, err := h.Index.Get(id)
	if err != nil || !ok {
		t.Fatalf("block %s not in the index: %v", id, err)
	}
	return loc
}

// flipByte flips one byte of the file at path.
func flipByte(t *testing.T, fs vfs.FS, path string, off int64) {
	t.Helper()
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	_, err = f.ReadAt(b, off)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, fs, path, []byte{b[0] ^ 0x40}, off)
}

// TestVerifyBatchStore: a store whose sealed segment holds committed batches and an abandoned
// one (not in the footer) is clean: every batch block is verified against its batch record,
// and the abandoned batch is dead space, noted, not a problem.
func TestVerifyBatchStore(t *testing.T) {
	fx := buildBatchStore(t)
	r := run(t, fx.fs, false)
	if !r.Clean() {
		t.Fatalf("problems: %v", r.Problems)
	}
	if r.IndexEntries != 12+5+4 || r.BlocksVerified != r.IndexEntries {
		t.Errorf("%d index entries, %d verified; want 21 and 21", r.IndexEntries, r.BlocksVerified)
	}
	if r.DeadRecords != 1 || r.DeadBytes != fx.extents[1] {
		t.Errorf("dead: %d records, %d bytes; want the abandoned batch: 1, %d", r.DeadRecords, r.DeadBytes, fx.extents[1])
	}
	if !hasNote(r, fmt.Sprintf("offset %d: batch record of 3 blocks", fx.offsets[1])) {
		t.Errorf("no note about the abandoned batch: %q", r.Notes)
	}
	// The segment read: three batch records, the abandoned one uncommitted; no problem.
	h := open(t, fx.fs)
	m, _ := h.Index.Segment(fx.seg)
	_ = h.Close()
	res, err := verify.ReadSegment(fx.fs, fx.path, m, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Footer || len(res.Problems) != 0 || len(res.Records) != 3 {
		t.Fatalf("footer %v, problems %v, %d records", res.Footer, res.Problems, len(res.Records))
	}
	for k, ri := range res.Records {
		if ri.Batch == nil || ri.Err != nil || ri.Offset != fx.offsets[k] || ri.Length != fx.extents[k] || ri.Batch.Committed != (k != 1) {
			t.Fatalf("record %d: %+v", k, ri)
		}
	}
	if b := res.Records[2].Batch; b.Header.IDs[3] != batchID(2, 3) || len(b.ShardCRCs) != 4 || !res.Records[2].PayloadChecked ||
		res.Records[2].Seq != b.Header.FirstSeq {
		t.Errorf("last batch: %+v", b)
	}
}

func hasNote(r *verify.Report, sub string) bool {
	for _, n := range r.Notes {
		if strings.Contains(n, sub) {
			return true
		}
	}
	return false
}

// TestVerifyBatchFlippedShard: a flipped byte in shard 2 of block 3 of a committed batch is a
// problem naming that block.
func TestVerifyBatchFlippedShard(t *testing.T) {
	fx := buildBatchStore(t)
	id := fx.committed[0][3]
	loc := locOf(t, fx.fs, id)
	flipByte(t, fx.fs, fx.path, loc.ShardOffset(2)+77)
	r := run(t, fx.fs, false)
	if len(r.Problems) != 1 {
		t.Fatalf("%d problems, want 1", len(r.Problems))
	}
	p := r.Problems[0]
	if p.Block != id || p.Offset != loc.Offset || !strings.Contains(p.Msg, "shard 2 checksum") || !strings.Contains(p.Msg, id.String()) {
		t.Errorf("problem %v: want block %s, offset %d, shard 2", p, id, loc.Offset)
	}
}

// engineLoads opens the store on fs with the engine, as a connector does, and loads the
// blocks ids of the fixture's batch j: it returns how many loaded with exactly the bytes the
// fixture wrote (verifytest.WriteBatchSegment's pattern), and the error of the first that did
// not.
func engineLoads(t *testing.T, fs vfs.FS, j int, ids []format.BlockID) (int, error) {
	t.Helper()
	e := openEngine(t, fs)
	defer func() { _ = e.Close() }()
	ok := 0
	var first error
	for k, id := range ids {
		buf := devio.AlignedBuffer(int(testLayout.BlockBytes()))
		err := e.Load([]format.BlockID{id}, [][]byte{buf}).Wait()
		want := make([]byte, len(buf))
		for i := 0; i < testLayout.Shards; i++ {
			for p := int64(0); p < testLayout.ShardBytes; p++ {
				want[int64(i)*testLayout.ShardBytes+p] = byte(31*j + 7*k + 13*i + int(p))
			}
		}
		if err == nil && !bytes.Equal(buf, want) {
			err = fmt.Errorf("block %s loaded other bytes", id)
		}
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		ok++
	}
	return ok, first
}

// checkDamagedCommit checks what verify reports of the store on fs whose batch at offset off
// (blocks ids, all indexed) has a damaged commit block: the batch committed (its blocks are
// indexed: the writer publishes them only once the commit block is durable), so its blocks
// are verified against the index's checksums and load; the damaged commit block is one
// problem, which says so and does not call the batch uncommitted nor its blocks misses.
func checkDamagedCommit(t *testing.T, r *verify.Report, off int64, ids []format.BlockID) {
	t.Helper()
	if r.IndexEntries != 12+5+4 || r.BlocksVerified != r.IndexEntries {
		t.Errorf("%d of %d index entries verified, want all 21: the damaged batch's blocks are intact", r.BlocksVerified, r.IndexEntries)
	}
	if len(r.Problems) != 1 {
		t.Fatalf("%d problems, want 1 (the damaged commit block): %v", len(r.Problems), r.Problems)
	}
	p := r.Problems[0]
	if p.Offset != off || !strings.Contains(p.Msg, "commit block damaged") || !strings.Contains(p.Msg, fmt.Sprintf("%d indexed blocks load", len(ids))) ||
		strings.Contains(p.Msg, "never committed") || strings.Contains(p.Msg, "will miss") {
		t.Errorf("problem %v: want the damaged commit block at offset %d, its %d blocks loading", p, off, len(ids))
	}
	if hasNote(r, fmt.Sprintf("offset %d: batch record", off)) {
		t.Errorf("the damaged batch is noted as dead space: %q", r.Notes)
	}
}

// TestVerifyBatchFlippedCommit: a flipped byte in the commit block of a committed batch of a
// sealed segment. The engine serves the batch's blocks (their index entries carry their shard
// checksums); verify agrees, and reports the damaged commit block as a problem of its own.
func TestVerifyBatchFlippedCommit(t *testing.T) {
	fx := buildBatchStore(t)
	commitAt := fx.offsets[2] + fx.extents[2] - format.Alignment
	flipByte(t, fx.fs, fx.path, commitAt+70) // inside the shard CRC table
	checkDamagedCommit(t, run(t, fx.fs, false), fx.offsets[2], fx.committed[1])
	if n, err := engineLoads(t, fx.fs, 2, fx.committed[1]); n != len(fx.committed[1]) {
		t.Fatalf("the engine loads %d of the batch's %d blocks: %v", n, len(fx.committed[1]), err)
	}
	checkDamagedCommit(t, run(t, fx.fs, true), fx.offsets[2], fx.committed[1])
}

// TestVerifyBatchActiveFlippedCommit: the same in a segment left active by a crash: recovery
// keeps the indexed blocks of the batch (they committed), verify without recovery says so, and
// after recovery, which seals the segment without the batch in its footer, still does.
func TestVerifyBatchActiveFlippedCommit(t *testing.T) {
	fx := buildBatchStore(t)
	fx.unseal(t)
	commitAt := fx.offsets[0] + fx.extents[0] - format.Alignment
	flipByte(t, fx.fs, fx.path, commitAt+9) // the commit block's segment number
	r := run(t, fx.fs, false)
	if r.PendingDrops != 0 {
		t.Errorf("%d entries to drop, want 0: recovery keeps them", r.PendingDrops)
	}
	checkDamagedCommit(t, r, fx.offsets[0], fx.committed[0])
	r = run(t, fx.fs, true)
	if r.Recovery == nil || r.Recovery.EntriesDropped != 0 {
		t.Fatalf("recovery %+v: want it to run and keep every entry", r.Recovery)
	}
	checkDamagedCommit(t, r, fx.offsets[0], fx.committed[0])
	if n, err := engineLoads(t, fx.fs, 0, fx.committed[0]); n != len(fx.committed[0]) {
		t.Fatalf("the engine loads %d of the batch's %d blocks: %v", n, len(fx.committed[0]), err)
	}
}

// TestVerifyBatchEntryMismatch: an index entry that puts a block at another position of its
// batch is a problem.
func TestVerifyBatchEntryMismatch(t *testing.T) {
	fx := buildBatchStore(t)
	id := fx.committed[1][1]
	loc := locOf(t, fx.fs, id)
	ix, err := index.Open(storeDir+"/"+engine.IndexDir, index.Options{FS: fx.fs})
	if err != nil {
		t.Fatal(err)
	}
	loc.BatchPos = 2
	b := ix.NewBatch()
	b.Put(id, loc)
	if err := ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	_ = ix.Close()
	r := run(t, fx.fs, false)
	if len(r.Problems) != 1 || r.Problems[0].Block != id || !strings.Contains(r.Problems[0].Msg, "holds the block at position 1") {
		t.Fatalf("problems %v: want one naming %s at position 1", r.Problems, id)
	}
}

// TestVerifyBatchActiveSegment: a segment of batches left active by a crash (no footer) holds
// an uncommitted batch between committed ones: without recovery, the committed blocks are
// verified through recovery's scan and the uncommitted batch is dead space, not a problem.
func TestVerifyBatchActiveSegment(t *testing.T) {
	fx := buildBatchStore(t)
	m := fx.unseal(t)
	end := m.Size

	r := run(t, fx.fs, false)
	if !r.Clean() || r.Active != 1 || r.PendingDrops != 0 {
		t.Fatalf("problems %v, %d active, %d pending drops", r.Problems, r.Active, r.PendingDrops)
	}
	if r.BlocksVerified != r.IndexEntries || r.IndexEntries != 21 {
		t.Errorf("%d of %d entries verified, want 21", r.BlocksVerified, r.IndexEntries)
	}
	if r.DeadRecords != 1 || r.DeadBytes != fx.extents[1] || !hasNote(r, "never committed") {
		t.Errorf("dead: %d records, %d bytes (want 1, %d); notes %q", r.DeadRecords, r.DeadBytes, fx.extents[1], r.Notes)
	}
	// The same segment read without the scan: the walk passes over the uncommitted batch.
	res, err := verify.ReadSegment(fx.fs, fx.path, m, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stop != nil || len(res.Records) != 3 || res.Records[1].Batch == nil || res.Records[1].Batch.Committed || res.DataEnd != end {
		t.Fatalf("walk: stop %v, %d records, data end %d (want %d)", res.Stop, len(res.Records), res.DataEnd, end)
	}

	// Recovered (as ucm-tool verify does by default), the segment is sealed again without the
	// uncommitted batch in its footer: still clean, the batch still dead space.
	r = run(t, fx.fs, true)
	if !r.Clean() || r.Recovery == nil || r.Active != 0 || r.BlocksVerified != 21 || r.DeadBytes != fx.extents[1] {
		t.Fatalf("recovered: problems %v, recovery %+v, %d active, %d verified, %d dead bytes", r.Problems, r.Recovery, r.Active, r.BlocksVerified, r.DeadBytes)
	}
}

// unseal turns the fixture's batch segment into one left active by a crash: the footer never
// written, the index row still active. It returns the row.
func (fx *batchFixture) unseal(t *testing.T) index.SegmentMeta {
	t.Helper()
	end := fx.offsets[2] + fx.extents[2]
	f, err := fx.fs.Open(fx.path)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, end)
	_, err = f.ReadAt(data, 0)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.Remove(fx.path); err != nil {
		t.Fatal(err)
	}
	writeAt(t, fx.fs, fx.path, data, 0)
	ix, err := index.Open(storeDir+"/"+engine.IndexDir, index.Options{FS: fx.fs})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := ix.Segment(fx.seg)
	m.State, m.Size = index.SegmentActive, end
	b := ix.NewBatch()
	b.SetSegment(m)
	if err := ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	_ = ix.Close()
	return m
}

// TestVerifyBatchActiveFlippedShard: in a segment left active, a committed batch with a bad
// shard is passed over by recovery's scan; verify reads it again and reports the indexed block
// whose shard fails.
func TestVerifyBatchActiveFlippedShard(t *testing.T) {
	fx := buildBatchStore(t)
	fx.unseal(t)
	id := fx.committed[0][1]
	loc := locOf(t, fx.fs, id)
	flipByte(t, fx.fs, fx.path, loc.ShardOffset(3)+5)
	r := run(t, fx.fs, false)
	if len(r.Problems) != 1 {
		t.Fatalf("%d problems, want 1", len(r.Problems))
	}
	if p := r.Problems[0]; p.Block != id || p.Offset != loc.Offset || !strings.Contains(p.Msg, "shard 3 checksum") || !strings.Contains(p.Msg, "loads of the block with a bad shard will miss") {
		t.Errorf("problem %v: want block %s, offset %d, shard 3", p, id, loc.Offset)
	}
}
