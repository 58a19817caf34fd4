package engine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// publishedByA has an instance A dump n blocks on a new shared path and close: its segments
// are sealed, published and summarized. It returns the shared path, the blocks and A's
// namespace directory.
func publishedByA(t *testing.T, n int) (shared string, blocks []BlockID, nsDir string) {
	t.Helper()
	root := t.TempDir()
	shared = filepath.Join(root, "shared")
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	blocks = ids(0, n)
	for lo := 0; lo < n; lo += 5 {
		dumpBlocks(t, a, blocks[lo:min(n, lo+5)])
	}
	inst := a.instance
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	return shared, blocks, tiers.NamespaceDir(shared, inst)
}

// summaries lists the summary files of a namespace.
func summaries(t *testing.T, nsDir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(nsDir, SummaryDir, "*"+format.SummaryExt))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// openIndexed opens instance B on shared and waits until it indexed every segment A listed.
func openIndexed(t *testing.T, shared string) *Engine {
	t.Helper()
	b := mustOpen(t, filepath.Join(t.TempDir(), "b"), sharedOptions(shared, time.Hour))
	t.Cleanup(func() { _ = b.Close() })
	waitFor(t, "B to index every segment A published", func() bool {
		st := b.Stats().Sharing
		return st.SegmentsListed > 0 && st.ForeignSegments == st.SegmentsListed
	})
	return b
}

// TestSharedIndexFromSummaries: the owner writes a summary of each published segment, and a new
// instance indexes every segment from it (no record header read), with every block a hit
// loaded byte-exact, whole and by shard; its progress (listed, indexed) is in its stats.
func TestSharedIndexFromSummaries(t *testing.T) {
	shared, blocks, nsDir := publishedByA(t, 60)
	if n := len(summaries(t, nsDir)); n < 3 {
		t.Fatalf("A wrote %d summaries, want one per published segment (several)", n)
	}
	b := openIndexed(t, shared)
	st := b.Stats().Sharing
	if st.IndexedFromSummary != int64(st.SegmentsListed) || st.IndexedFromHeaders != 0 || st.SummariesDamaged != 0 {
		t.Fatalf("stats %+v: want every segment indexed from its summary", st)
	}
	if st.IndexedRecords != int64(len(blocks)) || st.ForeignBlocks != int64(len(blocks)) {
		t.Fatalf("indexed %d records, %d blocks; want %d", st.IndexedRecords, st.ForeignBlocks, len(blocks))
	}
	checkBlocks(t, b, blocks)
	checkShards(t, b, blocks)
}

// TestSharedIndexWithoutSummaries: segments without a summary (written by a version before
// summaries) are indexed from their footer and record headers, every block a hit, exact.
func TestSharedIndexWithoutSummaries(t *testing.T) {
	shared, blocks, nsDir := publishedByA(t, 30)
	if err := os.RemoveAll(filepath.Join(nsDir, SummaryDir)); err != nil {
		t.Fatal(err)
	}
	b := openIndexed(t, shared)
	st := b.Stats().Sharing
	if st.IndexedFromHeaders != int64(st.SegmentsListed) || st.IndexedFromSummary != 0 || st.SummariesDamaged != 0 {
		t.Fatalf("stats %+v: want every segment indexed from its headers", st)
	}
	checkBlocks(t, b, blocks)
}

// TestSharedIndexDamagedSummary: a summary with one byte changed, one cut short and one of
// another segment are each refused (counted, logged) and their segments indexed from their
// footer and headers; every block is a hit, exact.
func TestSharedIndexDamagedSummary(t *testing.T) {
	shared, blocks, nsDir := publishedByA(t, 40)
	sums := summaries(t, nsDir)
	if len(sums) < 4 {
		t.Fatalf("%d summaries", len(sums))
	}
	flip, err := os.ReadFile(sums[0])
	if err != nil {
		t.Fatal(err)
	}
	flip[len(flip)/2] ^= 1
	cut, err := os.ReadFile(sums[1])
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.ReadFile(sums[3])
	if err != nil {
		t.Fatal(err)
	}
	// Summary 2 gets summary 3's bytes: it checks, but names another segment.
	for path, b := range map[string][]byte{sums[0]: flip, sums[1]: cut[:len(cut)-1], sums[2]: other} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := openIndexed(t, shared)
	st := b.Stats().Sharing
	want := int64(3)
	if st.SummariesDamaged != want || st.IndexedFromHeaders != want || st.IndexedFromSummary != int64(st.SegmentsListed)-want {
		t.Fatalf("stats %+v: want %d summaries refused and their segments indexed from headers", st, want)
	}
	checkBlocks(t, b, blocks)
	// The refusal is a typed error naming the file.
	ent := format.ManifestEntry{Number: mustParse(t, sums[0]), Generation: 0}
	if _, err := b.share.ReadSummary(filepath.Join(nsDir, SegmentDir), [16]byte{}, ent); err == nil {
		t.Fatal("a damaged summary was accepted")
	} else if se := (*SummaryError)(nil); !errors.As(err, &se) || se.Path != sums[0] || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("error %v: want a *SummaryError for %s wrapping ErrCorrupt", err, sums[0])
	}
}

func mustParse(t *testing.T, path string) uint64 {
	t.Helper()
	base := filepath.Base(path)
	n, ok := wal.ParseSegmentFileName(base[:len(base)-len(format.SummaryExt)])
	if !ok {
		t.Fatalf("summary name %s", base)
	}
	return n
}

// rewriteSummary decodes the first summary of nsDir, lets lie change its entries, and writes it
// back with valid checksums. It returns the entries as rewritten.
func rewriteSummary(t *testing.T, nsDir string, lie func(en []format.SummaryEntry)) []format.SummaryEntry {
	t.Helper()
	path := summaries(t, nsDir)[0]
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := format.DecodeSummary(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Entries) < 4 {
		t.Fatalf("summary of %d entries", len(sum.Entries))
	}
	lie(sum.Entries)
	enc, err := format.EncodeSummary(sum)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, enc, 0o644); err != nil {
		t.Fatal(err)
	}
	return sum.Entries
}

// TestSharedSummaryNamingAnotherRecord: a summary that checks but names, for a block, another
// record's place (alone, or with that record's sequence number and checksums) disagrees with
// the segment's footer: it is refused and the segment indexed from its headers; every block
// is a hit, exact.
func TestSharedSummaryNamingAnotherRecord(t *testing.T) {
	shared, blocks, nsDir := publishedByA(t, 40)
	rewriteSummary(t, nsDir, func(en []format.SummaryEntry) {
		en[1].Offset = en[3].Offset
		en[2].Offset, en[2].ShardCRCs, en[2].HeaderCRC, en[2].Seq = en[3].Offset, en[3].ShardCRCs, en[3].HeaderCRC, en[3].Seq
	})
	b := openIndexed(t, shared)
	if st := b.Stats().Sharing; st.SummariesDamaged != 1 || st.IndexedFromHeaders != 1 {
		t.Fatalf("stats %+v: want the summary refused, its segment indexed from headers", st)
	}
	checkBlocks(t, b, blocks)
	checkShards(t, b, blocks)
}

// TestSharedLyingSummary: a summary that checks and agrees with the footer but names wrong
// shard checksums (flipped, or another record's) or another layout gives, for those blocks,
// ErrCorrupt or a miss from every load (one shard or whole), never wrong bytes; the blocks it
// tells the truth about load exact.
func TestSharedLyingSummary(t *testing.T) {
	shared, blocks, nsDir := publishedByA(t, 40)
	en := rewriteSummary(t, nsDir, func(en []format.SummaryEntry) {
		en[0].ShardCRCs = append([]uint32(nil), en[0].ShardCRCs...)
		en[0].ShardCRCs[1] ^= 1
		en[1].ShardCRCs = en[3].ShardCRCs
		en[2].Layout.TensorsPerShard *= 2
	})
	lied := map[BlockID]bool{en[0].ID: true, en[1].ID: true, en[2].ID: true}
	b := openIndexed(t, shared)
	if st := b.Stats().Sharing; st.IndexedFromSummary != int64(st.SegmentsListed) {
		t.Fatalf("stats %+v: the lying summary was not used", st)
	}
	l := b.Layout()
	for _, id := range blocks {
		want := blockBytes(l, id)
		// One shard first (for a lie, the whole-block load drops the entry).
		for _, sh := range []int{1, AllShards} {
			n, off := l.BlockBytes(), int64(0)
			if sh != AllShards {
				n, off = l.ShardBytes, int64(sh)*l.ShardBytes
			}
			dst := [][]byte{devio.AlignedBuffer(int(n))}
			var err error
			if sh == AllShards {
				err = b.Load([]BlockID{id}, dst).Wait()
			} else {
				err = b.LoadShard([]BlockID{id}, sh, dst).Wait()
			}
			switch {
			case err == nil && !bytes.Equal(dst[0], want[off:off+n]):
				t.Fatalf("block %s (shard %d): wrong bytes loaded", id, sh)
			case err == nil && lied[id]:
				t.Fatalf("block %s (shard %d): loaded exact through a lying entry", id, sh)
			case err != nil && !lied[id]:
				t.Fatalf("block %s (shard %d): %v", id, sh, err)
			case err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotFound):
				t.Fatalf("block %s (shard %d): %v, want ErrCorrupt or ErrNotFound", id, sh, err)
			}
		}
	}
}

// TestSharedLookupsWhileIndexing: while a new instance indexes a long list of segments, the
// blocks of the segments indexed so far are hits and load exact, and its stats say how far it
// is (indexed fewer than listed): lookups do not wait for the whole tier.
func TestSharedLookupsWhileIndexing(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	o := sharedOptions(shared, time.Hour)
	o.SharedRefreshInterval = time.Hour // refreshes only when kicked
	o.SharedOwnerTimeout = 8 * time.Hour
	b := mustOpen(t, filepath.Join(root, "b"), o)
	defer b.Close()
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	blocks := ids(0, 60)
	for lo := 0; lo < len(blocks); lo += 5 {
		dumpBlocks(t, a, blocks[lo:lo+5])
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	first, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.setSeam(func(p seamPoint, _ BlockID) {
		if p == seamForeignIndexed {
			once.Do(func() {
				close(first)
				<-release
			})
		}
	})
	b.share.Kick()
	select {
	case <-first:
	case <-time.After(testwait.Bound):
		t.Fatal("B never indexed a segment of A")
	}
	var indexed []BlockID
	for _, id := range blocks {
		if b.share.ForeignIndex().Contains(id) {
			indexed = append(indexed, id)
		}
	}
	st := b.Stats().Sharing
	close(release)
	if len(indexed) == 0 || len(indexed) == len(blocks) || st.ForeignSegments != 1 || st.SegmentsListed < 3 {
		t.Fatalf("mid-indexing: %d of %d blocks indexed, stats %+v", len(indexed), len(blocks), st)
	}
	if !allHit(b, indexed) {
		t.Fatal("a block of an indexed segment is a miss while the rest is indexed")
	}
	checkBlocks(t, b, indexed)
	waitFor(t, "B to finish indexing", func() bool {
		st := b.Stats().Sharing
		return st.ForeignSegments == st.SegmentsListed
	})
	checkBlocks(t, b, blocks)
}

// TestSharedSummaryBatchesAndSidecars: a segment holding a batch record, plain blocks and
// sidecars is indexed from its summary (the batch's blocks, their positions and the sidecars
// included, checked against the footer), and every block and sidecar loads exact.
func TestSharedSummaryBatchesAndSidecars(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	batch, plain := ids(0, 6), ids(6, 9)
	l := a.Layout()
	if errs := dumpLayers(a, batch, layerSources(l, batch, true), []int{2, 0, 3, 1}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	dumpBlocks(t, a, plain)
	all := append(append([]BlockID(nil), batch...), plain...)
	dumpSidecars(t, a, 2, all)
	if st := a.Stats(); st.BatchRecords != 1 {
		t.Fatalf("%d batch records", st.BatchRecords)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := openIndexed(t, shared)
	st := b.Stats().Sharing
	if st.IndexedFromSummary != int64(st.SegmentsListed) || st.SummariesDamaged != 0 || st.IndexedRecords != int64(2*len(all)) {
		t.Fatalf("stats %+v: want every segment, %d records, from summaries", st, 2*len(all))
	}
	checkBlocks(t, b, all)
	checkShards(t, b, all)
	waitFor(t, "B to index A's sidecars beside their blocks", func() bool { return b.share.ForeignIndex().SidecarCount() == len(all) })
	checkSidecars(t, b, 2, all, nil)
}

// summaryMatchesFooter refuses every disagreement with the footer (a block's id, place,
// sequence, header checksum, type; a batch's positions, sequence numbers, size; records
// missing or extra) and accepts the records the footer describes.
func TestSummaryMatchesFooter(t *testing.T) {
	lay := Layout{Shards: 2, TensorsPerShard: 1, ShardBytes: 4096}
	ids := ids(0, 4)
	recs := func() []wal.ScannedRecord {
		out := []wal.ScannedRecord{{Header: format.RecordHeader{Type: format.RecordBlock, ID: ids[0], Seq: 10, Layout: lay}, Offset: 4096, HeaderCRC: 7}}
		for p := range 3 {
			out = append(out, wal.ScannedRecord{Header: format.RecordHeader{Type: format.RecordBatch, ID: ids[1+p], Seq: 11 + uint64(p), Layout: lay},
				Offset: 5 * 4096, HeaderCRC: 9, BatchBlocks: 3, BatchPos: p})
		}
		return out
	}
	batchLen := format.BatchHeaderSize(3) + 2*3*lay.ShardStride() + format.BatchCommitSize(3, 2)
	foot := []format.FooterEntry{
		{ID: ids[0], Offset: 4096, Length: format.RecordHeaderSize + 2*lay.ShardStride(), Seq: 10, HeaderCRC: 7, Type: format.RecordBlock},
		{ID: ids[1], Offset: 5 * 4096, Length: batchLen, Seq: 11, HeaderCRC: 9, Type: format.RecordBatch},
	}
	if err := share.SummaryMatchesFooter(recs(), foot); err != nil {
		t.Fatalf("matching summary refused: %v", err)
	}
	lies := map[string]func(r []wal.ScannedRecord) []wal.ScannedRecord{
		"block id":         func(r []wal.ScannedRecord) []wal.ScannedRecord { r[0].Header.ID = ids[3]; return r },
		"block offset":     func(r []wal.ScannedRecord) []wal.ScannedRecord { r[0].Offset = 5 * 4096; return r },
		"block seq":        func(r []wal.ScannedRecord) []wal.ScannedRecord { r[0].Header.Seq++; return r },
		"block header crc": func(r []wal.ScannedRecord) []wal.ScannedRecord { r[0].HeaderCRC++; return r },
		"block as sidecar": func(r []wal.ScannedRecord) []wal.ScannedRecord {
			r[0].Header.Type, r[0].Header.Kind = format.RecordSidecar, 1
			return r
		},
		"batch block 0 id": func(r []wal.ScannedRecord) []wal.ScannedRecord {
			r[1].Header.ID, r[2].Header.ID = r[2].Header.ID, r[1].Header.ID
			return r
		},
		"batch positions":       func(r []wal.ScannedRecord) []wal.ScannedRecord { r[2].BatchPos, r[3].BatchPos = 2, 1; return r },
		"batch seq":             func(r []wal.ScannedRecord) []wal.ScannedRecord { r[3].Header.Seq = 20; return r },
		"batch size":            func(r []wal.ScannedRecord) []wal.ScannedRecord { r[1].BatchBlocks = 4; return r[:4] },
		"batch block elsewhere": func(r []wal.ScannedRecord) []wal.ScannedRecord { r[3].Offset = 4096; return r },
		"record missing":        func(r []wal.ScannedRecord) []wal.ScannedRecord { return r[:3] },
		"record extra":          func(r []wal.ScannedRecord) []wal.ScannedRecord { return append(r, r[0]) },
		"block layout":          func(r []wal.ScannedRecord) []wal.ScannedRecord { r[0].Header.Layout.Shards = 3; return r },
		"batch layout": func(r []wal.ScannedRecord) []wal.ScannedRecord {
			for i := 1; i < 4; i++ {
				r[i].Header.Layout.ShardBytes = 8192
			}
			return r
		},
		"no records": func(r []wal.ScannedRecord) []wal.ScannedRecord { return nil },
	}
	for name, lie := range lies {
		if err := share.SummaryMatchesFooter(lie(recs()), foot); !errors.Is(err, format.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// The owner removes the summaries of segments its manifest no longer lists, and leftovers of
// an interrupted write, and keeps the others.
func TestPruneSummaries(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	dumpBlocks(t, a, ids(0, 30))
	// Closed: its sharer no longer rewrites what is pruned.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	nsDir := tiers.NamespaceDir(shared, a.instance)
	sums := summaries(t, nsDir)
	if len(sums) < 3 {
		t.Fatalf("%d summaries", len(sums))
	}
	keep := format.ManifestEntry{Number: mustParse(t, sums[0])}
	tmp := sums[1] + ".tmp"
	if err := os.WriteFile(tmp, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.share.PruneSummaries(nsDir, []format.ManifestEntry{keep})
	left, _ := filepath.Glob(filepath.Join(nsDir, SummaryDir, "*"))
	if len(left) != 1 || left[0] != sums[0] {
		t.Fatalf("after pruning to segment %d: %v", keep.Number, left)
	}
}
