package wal

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// testBatch is the content of a batch of n blocks of testLayout: block k's shard i is filled
// from seed, so every byte can be checked after a read.
type testBatch struct {
	ids  []format.BlockID
	runs [][][]byte // runs[i][k]: shard i of block k, ShardStride bytes
	crcs [][]uint32 // crcs[i][k]
}

func newTestBatch(seed, n int) *testBatch {
	tb := &testBatch{ids: make([]format.BlockID, n)}
	for k := range tb.ids {
		copy(tb.ids[k][:], fmt.Sprintf("bat-%05d-%06d", seed, k))
	}
	for i := 0; i < testLayout.Shards; i++ {
		var run [][]byte
		var crcs []uint32
		for k := 0; k < n; k++ {
			s := devio.AlignedBuffer(int(testLayout.ShardStride()))
			for j := int64(0); j < testLayout.ShardBytes; j++ {
				s[j] = byte(seed*31 + k*7 + i*13 + int(j))
			}
			run = append(run, s)
			crcs = append(crcs, format.Checksum(s[:testLayout.ShardBytes]))
		}
		tb.runs = append(tb.runs, run)
		tb.crcs = append(tb.crcs, crcs)
	}
	return tb
}

// write reserves the batch and writes the given layers (all when none are given).
func (tb *testBatch) write(t *testing.T, w *Writer, layers ...int) *Batch {
	t.Helper()
	b, err := w.ReserveBatch(tb.ids, testLayout)
	if err != nil {
		t.Fatal(err)
	}
	if layers == nil {
		for i := testLayout.Shards - 1; i >= 0; i-- { // any order
			layers = append(layers, i)
		}
	}
	for _, i := range layers {
		if err := b.WriteRun(i, tb.runs[i], tb.crcs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func batchWriter(t *testing.T, fs vfs.FS, segSize int64) (*Writer, *recHooks, devio.Backend) {
	return newTestWriterWith(t, fs, segSize, func(o *Options) { o.BatchRecords = true })
}

// checkScannedBatch checks that recs hold the batch tb in order and that every shard's bytes
// are where ShardOffset says.
func checkScannedBatch(t *testing.T, fs vfs.FS, path string, recs []ScannedRecord, tb *testBatch) {
	t.Helper()
	if len(recs) != len(tb.ids) {
		t.Fatalf("%d scanned blocks, want %d", len(recs), len(tb.ids))
	}
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for k, r := range recs {
		if r.Header.ID != tb.ids[k] || r.BatchPos != k || r.BatchBlocks != len(tb.ids) || r.Header.Type != format.RecordBatch || r.Header.Seq != recs[0].Header.Seq+uint64(k) {
			t.Fatalf("block %d: %+v", k, r)
		}
		h := format.BatchHeader{Layout: testLayout, IDs: tb.ids}
		for i := 0; i < testLayout.Shards; i++ {
			if r.Header.ShardCRCs[i] != tb.crcs[i][k] {
				t.Fatalf("block %d shard %d: crc %#x, want %#x", k, i, r.Header.ShardCRCs[i], tb.crcs[i][k])
			}
			got := make([]byte, testLayout.ShardBytes)
			if _, err := f.ReadAt(got, r.Offset+h.ShardOffset(k, i)); err != nil {
				t.Fatal(err)
			}
			if format.Checksum(got) != tb.crcs[i][k] {
				t.Fatalf("block %d shard %d: bytes at ShardOffset do not match", k, i)
			}
		}
	}
}

// A batch reserved between two records, its layers written out of order while another record
// is appended after it, commits: its blocks are published with their positions and sequence
// numbers, the footer lists it once, and a scan gives back every block and shard.
func TestBatchCommitPublishScanAndFooter(t *testing.T) {
	fs := vfs.NewMem()
	w, h, be := batchWriter(t, fs, 1<<20)
	if err := w.Append([]*Record{testRecord(0)}); err != nil {
		t.Fatal(err)
	}
	tb := newTestBatch(1, 5)
	b := tb.write(t, w, 2, 0)
	if err := w.Append([]*Record{testRecord(1)}); err != nil {
		t.Fatal(err)
	}
	if err := b.CommitBatch(); err == nil || !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("commit with layer 1 missing: %v", err)
	}
	if err := b.WriteRun(1, tb.runs[1], tb.crcs[1]); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteRun(1, tb.runs[1], tb.crcs[1]); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("layer written twice: %v", err)
	}
	if err := b.CommitBatch(); err != nil {
		t.Fatal(err)
	}
	if err := b.CommitBatch(); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("second commit: %v", err)
	}
	if b.AbandonBatch() {
		t.Fatal("a committed batch was abandoned")
	}
	h.mu.Lock()
	pub := append([]*Record(nil), h.published...)
	h.mu.Unlock()
	if len(pub) != 7 {
		t.Fatalf("%d records published, want 7", len(pub))
	}
	var shares int64
	for k, r := range pub[2:] {
		if r.ID != tb.ids[k] || r.BatchBlocks != 5 || r.BatchPos != k || r.Seq != b.FirstSeq+uint64(k) || r.Offset != b.Offset || r.End() != b.Offset+b.Extent() {
			t.Fatalf("published batch block %d: %+v", k, r)
		}
		shares += r.Size()
	}
	if shares != b.Extent() {
		t.Fatalf("the blocks' shares sum to %d, the batch record is %d bytes", shares, b.Extent())
	}
	if pub[1].Seq <= b.FirstSeq+4 {
		t.Fatalf("record appended after the reservation has sequence %d, the batch's last is %d", pub[1].Seq, b.FirstSeq+4)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := SegmentPath("/segs", h.created[0])
	res, err := ScanSegment(fs, path, devio.DirectOff, be)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Sealed || len(res.Records) != 7 || len(res.Skipped) != 0 || res.Header.Features&format.FeatureBatchRecords == 0 {
		t.Fatalf("scan: sealed %v, %d records, skipped %v, stop %v", res.Sealed, len(res.Records), res.Skipped, res.Stop)
	}
	checkScannedBatch(t, fs, path, res.Records[1:6], tb)
	if res.Records[0].Header.ID != testRecord(0).ID || res.Records[6].Header.ID != testRecord(1).ID {
		t.Fatal("records around the batch lost")
	}
	seg, err := OpenSegmentForRead(fs, "/segs", h.created[0], h.gens[0], devio.DirectOff, be)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Release()
	entries, err := ReadFooter(seg, h.sealed[h.created[0]], be)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 || entries[1].Type != format.RecordBatch || entries[1].ID != tb.ids[0] || entries[1].Length != b.Extent() || entries[1].Seq != b.FirstSeq {
		t.Fatalf("footer: %+v", entries)
	}
	// A reader without an index (another instance) gets the same blocks from the footer, the
	// batch header and the commit block.
	sealed, err := ReadSealedRecords(seg, h.sealed[h.created[0]], be)
	if err != nil {
		t.Fatal(err)
	}
	if len(sealed) != len(res.Records) {
		t.Fatalf("ReadSealedRecords: %d records, the scan %d", len(sealed), len(res.Records))
	}
	for i := range sealed {
		got, want := sealed[i], res.Records[i]
		if got.Header.ID != want.Header.ID || got.Offset != want.Offset || got.Header.Seq != want.Header.Seq || got.BatchPos != want.BatchPos ||
			got.BatchBlocks != want.BatchBlocks || got.Length() != want.Length() || fmt.Sprint(got.Header.ShardCRCs) != fmt.Sprint(want.Header.ShardCRCs) {
			t.Fatalf("record %d: ReadSealedRecords %+v, scan %+v", i, got, want)
		}
	}
	bh, err := ReadBatchHeader(seg, entries[1], be)
	if err != nil || fmt.Sprint(bh.IDs) != fmt.Sprint(tb.ids) {
		t.Fatalf("ReadBatchHeader: %v %v", bh.IDs, err)
	}
	if _, err := ReadBatchHeader(seg, entries[0], be); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("ReadBatchHeader of a block record's entry: %v", err)
	}
	bad := entries[1]
	bad.Seq++
	var ce *CorruptionError
	if _, err := ReadBatchHeader(seg, bad, be); !errors.As(err, &ce) || !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("ReadBatchHeader of a mismatched entry: %v", err)
	}
}

// Writers without BatchRecords refuse batches and write segments without the flag; bad
// arguments are refused with ErrInvalid naming what is wrong.
func TestBatchRefusals(t *testing.T) {
	fs := vfs.NewMem()
	w, _, _ := newTestWriter(t, fs, 1<<20)
	tb := newTestBatch(1, 2)
	if _, err := w.ReserveBatch(tb.ids, testLayout); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("batch on a writer without batch records: %v", err)
	}
	w.Close()
	w, _, _ = batchWriter(t, vfs.NewMem(), 1<<20)
	defer w.Close()
	if _, err := w.ReserveBatch(nil, testLayout); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("empty batch: %v", err)
	}
	if _, err := w.ReserveBatch(tb.ids, format.Layout{}); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("bad layout: %v", err)
	}
	b, err := w.ReserveBatch(tb.ids, testLayout)
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"layer out of range": func() error { return b.WriteRun(testLayout.Shards, tb.runs[0], tb.crcs[0]) },
		"too few shards":     func() error { return b.WriteRun(0, tb.runs[0][:1], tb.crcs[0]) },
		"too few checksums":  func() error { return b.WriteRun(0, tb.runs[0], tb.crcs[0][:1]) },
		"short buffer":       func() error { return b.WriteRun(0, [][]byte{tb.runs[0][0][:4096], tb.runs[0][1]}, tb.crcs[0]) },
	} {
		if err := call(); !errors.Is(err, format.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if !b.AbandonBatch() {
		t.Fatal("open batch not abandoned")
	}
	if err := b.WriteRun(0, tb.runs[0], tb.crcs[0]); !errors.Is(err, ErrBatchAbandoned) {
		t.Fatalf("write after abandon: %v", err)
	}
	if err := b.CommitBatch(); !errors.Is(err, ErrBatchAbandoned) {
		t.Fatalf("commit after abandon: %v", err)
	}
}

// An abandoned batch and one left open at Close are never published; the seal lists neither,
// and a scan passes over their extents to the records after them.
func TestBatchAbandonedAndOpenAtClose(t *testing.T) {
	fs := vfs.NewMem()
	w, h, be := batchWriter(t, fs, 1<<20)
	gone := newTestBatch(1, 3)
	b := gone.write(t, w, 0)
	b.AbandonBatch()
	if err := w.Append([]*Record{testRecord(0)}); err != nil {
		t.Fatal(err)
	}
	open := newTestBatch(2, 2)
	ob := open.write(t, w)
	if err := w.Append([]*Record{testRecord(1)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ob.CommitBatch(); !errors.Is(err, ErrBatchAbandoned) {
		t.Fatalf("commit after Close: %v", err)
	}
	if len(h.published) != 2 {
		t.Fatalf("%d records published, want the 2 plain ones", len(h.published))
	}
	res, err := ScanSegment(fs, SegmentPath("/segs", h.created[0]), devio.DirectOff, be)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Sealed || len(res.Records) != 2 || len(res.Skipped) != 2 {
		t.Fatalf("scan: sealed %v, %d records, skipped %v, stop %v", res.Sealed, len(res.Records), res.Skipped, res.Stop)
	}
	var ce *CorruptionError
	if !errors.As(res.Skipped[0], &ce) || ce.Offset != b.Offset || ce.ID != gone.ids[0] || !errors.Is(ce, format.ErrCorrupt) {
		t.Fatalf("skipped batch: %v", res.Skipped[0])
	}
}

// Crash points of a batch in an active segment, recovered: before its commit (skipped; the
// records placed after it survive; a trailing one is cut), after it, and with a shard whose
// bytes did not reach the disk (skipped, like a missing commit). In a sealed segment, a
// listed batch that no longer checks is corruption, not a skip.
func TestBatchRecovery(t *testing.T) {
	t.Run("uncommitted batch between records", func(t *testing.T) {
		fs := vfs.NewMem()
		w, h, be := batchWriter(t, fs, 1<<20)
		if err := w.Append([]*Record{testRecord(0)}); err != nil {
			t.Fatal(err)
		}
		tb := newTestBatch(1, 4)
		b := tb.write(t, w)
		if err := w.Append([]*Record{testRecord(1)}); err != nil {
			t.Fatal(err)
		}
		done := newTestBatch(2, 3)
		if err := done.write(t, w).CommitBatch(); err != nil {
			t.Fatal(err)
		}
		trailing := newTestBatch(3, 2).write(t, w, 1)
		stopUnsealed(w)
		path := SegmentPath("/segs", h.created[0])
		res, err := RecoverSegment(fs, path, h.created[0], devio.DirectOff, be, false)
		if err != nil {
			t.Fatal(err)
		}
		// The trailing batch's extent runs past the end of the file: a torn tail, where the
		// scan stops; the one between records is passed over.
		if len(res.Records) != 5 || len(res.Skipped) != 1 || !res.Sealed || res.ValidEnd != trailing.Offset {
			t.Fatalf("recover: %d records, skipped %v, sealed %v, valid end %d (trailing batch at %d)", len(res.Records), res.Skipped, res.Sealed, res.ValidEnd, trailing.Offset)
		}
		if res.Records[1].Header.ID != testRecord(1).ID {
			t.Fatal("the record after the uncommitted batch was lost")
		}
		checkScannedBatch(t, fs, path, res.Records[2:], done)
		again, err := ScanSegment(fs, path, devio.DirectOff, be)
		if err != nil || !again.Sealed || len(again.Records) != 5 || len(again.Skipped) != 1 || again.Skipped[0].(*CorruptionError).Offset != b.Offset {
			t.Fatalf("rescan: %+v %v", again, err)
		}
	})
	t.Run("torn shard under a valid commit", func(t *testing.T) {
		fs := vfs.NewMem()
		w, h, be := batchWriter(t, fs, 1<<20)
		tb := newTestBatch(1, 3)
		b := tb.write(t, w)
		if err := b.CommitBatch(); err != nil {
			t.Fatal(err)
		}
		if err := w.Append([]*Record{testRecord(0)}); err != nil {
			t.Fatal(err)
		}
		stopUnsealed(w)
		path := SegmentPath("/segs", h.created[0])
		st, _ := fs.Stat(path)
		hdr := format.BatchHeader{Layout: testLayout, IDs: tb.ids}
		victim := b.Offset + hdr.ShardOffset(2, 1)
		copyFile(t, fs, path, "/segs/x", st.Size(), func(buf []byte) { buf[victim+100] ^= 0x40 })
		if err := fs.Rename("/segs/x", path); err != nil {
			t.Fatal(err)
		}
		res, err := ScanSegment(fs, path, devio.DirectOff, be)
		if err != nil {
			t.Fatal(err)
		}
		var ce *CorruptionError
		if len(res.Records) != 1 || len(res.Skipped) != 1 || !errors.As(res.Skipped[0], &ce) || ce.ID != tb.ids[2] {
			t.Fatalf("scan: %d records, skipped %v", len(res.Records), res.Skipped)
		}
	})
	t.Run("sealed batch rotted", func(t *testing.T) {
		fs := vfs.NewMem()
		w, h, be := batchWriter(t, fs, 1<<20)
		tb := newTestBatch(1, 3)
		b := tb.write(t, w)
		if err := b.CommitBatch(); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		path := SegmentPath("/segs", h.created[0])
		st, _ := fs.Stat(path)
		commit := b.Offset + format.BatchHeaderSize(3) + int64(testLayout.Shards)*3*testLayout.ShardStride()
		copyFile(t, fs, path, "/bad.seg", st.Size(), func(buf []byte) { buf[commit+70] ^= 1 })
		res, err := ScanSegment(fs, "/bad.seg", devio.DirectOff, be)
		if err != nil {
			t.Fatal(err)
		}
		if res.Sealed || res.Stop == nil || !errors.Is(res.Stop, format.ErrCorrupt) {
			t.Fatalf("sealed segment whose listed batch no longer checks: sealed %v stop %v", res.Sealed, res.Stop)
		}
	})
}

// A batch that does not fit the active segment goes to the next one; the full segment's seal
// waits for the batch still open in it, without holding up Sync; once the batch commits the
// segment is sealed listing it.
func TestBatchHoldsItsSegmentsSeal(t *testing.T) {
	fs := vfs.NewMem()
	segSize := int64(256 << 10)
	w, h, be := batchWriter(t, fs, segSize)
	tb := newTestBatch(1, 2)
	b := tb.write(t, w)
	for i := 0; ; i++ {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		n := len(h.created)
		h.mu.Unlock()
		if n > 1 {
			break
		}
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	_, sealed := h.sealed[b.Segment]
	h.mu.Unlock()
	if sealed {
		t.Fatal("segment sealed while a batch in it was open")
	}
	big := newTestBatch(2, 12) // 12 blocks × 3 shards × 8 KiB: more than what is left
	bb := big.write(t, w)
	if bb.Segment == b.Segment {
		t.Fatal("a batch was placed in a full segment")
	}
	if err := b.CommitBatch(); err != nil {
		t.Fatal(err)
	}
	if err := bb.CommitBatch(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		seg uint64
		tb  *testBatch
		at  int
	}{{b.Segment, tb, 0}, {bb.Segment, big, 0}} {
		path := SegmentPath("/segs", tc.seg)
		res, err := ScanSegment(fs, path, devio.DirectOff, be)
		if err != nil || !res.Sealed {
			t.Fatalf("segment %d: %v %v", tc.seg, err, res.Stop)
		}
		checkScannedBatch(t, fs, path, res.Records[tc.at:tc.at+len(tc.tb.ids)], tc.tb)
	}
}

// A relocating batch publishes each block with the origin it copies (so the index moves an
// entry only if it still points there); origins must come one per block, before the commit.
func TestBatchOrigins(t *testing.T) {
	w, hooks, _ := batchWriter(t, vfs.NewMem(), 1<<20)
	defer w.Close()
	tb := newTestBatch(3, 3)
	b := tb.write(t, w)
	if err := b.SetOrigins([]*Origin{{Segment: 7, Offset: 4096}}); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("one origin for three blocks: %v", err)
	}
	origins := []*Origin{{Segment: 7, Offset: 4096}, nil, {Segment: 9, Offset: 8192}}
	if err := b.SetOrigins(origins); err != nil {
		t.Fatal(err)
	}
	if err := b.CommitBatch(); err != nil {
		t.Fatal(err)
	}
	hooks.mu.Lock()
	pub := hooks.published
	hooks.mu.Unlock()
	if len(pub) != 3 {
		t.Fatalf("%d published, want 3", len(pub))
	}
	for k, r := range pub {
		if r.Origin != origins[k] {
			t.Errorf("block %d published with origin %+v, want %+v", k, r.Origin, origins[k])
		}
	}
	if err := b.SetOrigins(origins); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("origins after the commit: %v", err)
	}
	b2 := newTestBatch(4, 1).write(t, w)
	b2.AbandonBatch()
	if err := b2.SetOrigins([]*Origin{nil}); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("origins after abandon: %v", err)
	}
}

// CommitBatches commits the chunks of a list together: the committed ones are published in one
// Publish call per segment, in file order, and recovery finds them committed; a batch that
// cannot commit (abandoned, a layer missing) fails alone, and one with a layer missing stays
// open so that it can be finished and committed later, as with CommitBatch.
func TestCommitBatches(t *testing.T) {
	fs := vfs.NewMem()
	w, h, be := batchWriter(t, fs, 1<<20)
	a, b, gone, part := newTestBatch(1, 3), newTestBatch(2, 2), newTestBatch(3, 2), newTestBatch(4, 2)
	ba, bb, bgone, bpart := a.write(t, w), b.write(t, w), gone.write(t, w), part.write(t, w, 0)
	bgone.AbandonBatch()
	groups := h.groups
	errs := CommitBatches([]*Batch{bb, bgone, ba, bpart})
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], ErrBatchAbandoned) || !errors.Is(errs[3], format.ErrInvalid) {
		t.Fatalf("errs %v: want nil, abandoned, nil, invalid (a layer not written)", errs)
	}
	if h.groups != groups+1 || len(h.published) != 5 {
		t.Fatalf("%d publish calls with %d records, want 1 with the 5 blocks of both batches", h.groups-groups, len(h.published))
	}
	for k, id := range append(append([]format.BlockID(nil), a.ids...), b.ids...) { // file order
		if h.published[k].ID != id {
			t.Fatalf("published %d: %s, want %s", k, h.published[k].ID, id)
		}
	}
	if errs := CommitBatches([]*Batch{ba}); !errors.Is(errs[0], format.ErrInvalid) {
		t.Errorf("second commit: %v, want ErrInvalid", errs[0])
	}
	for i := 1; i < testLayout.Shards; i++ {
		if err := bpart.WriteRun(i, part.runs[i], part.crcs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := bpart.CommitBatch(); err != nil {
		t.Fatalf("the batch finished after a failed commit: %v", err)
	}
	stopUnsealed(w)
	path := SegmentPath("/segs", h.created[0])
	res, err := RecoverSegment(fs, path, h.created[0], devio.DirectOff, be, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 7 || len(res.Skipped) != 1 {
		t.Fatalf("recover: %d records, skipped %v; want the 7 blocks of the 3 committed batches, the abandoned one skipped", len(res.Records), res.Skipped)
	}
	checkScannedBatch(t, fs, path, res.Records[:3], a)
	checkScannedBatch(t, fs, path, res.Records[3:5], b)
}

// A failed commit write fails the segment: every batch of the list in it fails, none is
// published, and the segment takes no more writes.
func TestCommitBatchesWriteFailure(t *testing.T) {
	var failCommits atomic.Bool
	w, h, _, _ := newFailingWriter(t, 1<<20, func(op *devio.Op) bool { return failCommits.Load() && len(op.Buf) < int(testLayout.ShardStride()) })
	w.opts.BatchRecords = true
	a, b := newTestBatch(1, 2), newTestBatch(2, 2)
	ba, bb := a.write(t, w), b.write(t, w)
	failCommits.Store(true)
	errs := CommitBatches([]*Batch{ba, bb})
	for k, err := range errs {
		if err == nil {
			t.Errorf("batch %d committed after its commit write failed", k)
		}
	}
	if len(h.published) != 0 {
		t.Fatalf("%d records published after a failed commit", len(h.published))
	}
	if err := bb.CommitBatch(); !errors.Is(err, ErrBatchAbandoned) {
		t.Errorf("a failed batch committed again: %v, want ErrBatchAbandoned", err)
	}
}
