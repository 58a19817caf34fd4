package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// recHooks records what the writer tells the index.
type recHooks struct {
	mu        sync.Mutex
	created   []uint64
	gens      []uint64 // gens[i] is created[i]'s generation
	sealed    map[uint64]int64
	published []*Record
	groups    int
	synced    int
	dropped   []uint64
}

func (h *recHooks) SegmentCreated(n, gen uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.created = append(h.created, n)
	h.gens = append(h.gens, gen)
	return nil
}
func (h *recHooks) Publish(recs []*Record, durable bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.groups++
	h.published = append(h.published, recs...)
	return nil
}
func (h *recHooks) SegmentSealed(n uint64, size int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sealed[n] = size
	return nil
}
func (h *recHooks) Synced() error { h.mu.Lock(); h.synced++; h.mu.Unlock(); return nil }
func (h *recHooks) SegmentDropped(n uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropped = append(h.dropped, n)
	return nil
}

var testLayout = format.Layout{Shards: 3, TensorsPerShard: 1, ShardBytes: 5000}

func testRecord(i int) *Record {
	var id format.BlockID
	copy(id[:], fmt.Sprintf("rec-%012d", i))
	r := &Record{ID: id, Layout: testLayout, ShardCRCs: make([]uint32, testLayout.Shards), Buf: devio.AlignedBuffer(int(testLayout.RecordBytes()))}
	for sh := 0; sh < testLayout.Shards; sh++ {
		off := testLayout.ShardOffset(sh)
		b := r.Buf[off : off+testLayout.ShardBytes]
		for j := range b {
			b[j] = byte(i*7 + sh*13 + j)
		}
		r.ShardCRCs[sh] = format.Checksum(b)
	}
	return r
}

func newTestWriter(t *testing.T, fs vfs.FS, segSize int64) (*Writer, *recHooks, devio.Backend) {
	t.Helper()
	return newTestWriterWith(t, fs, segSize, nil)
}

// newTestWriterWith is newTestWriter with options changed by tweak (if not nil) before the
// Writer starts; the returned recHooks are the ones in the options unless tweak replaced them.
// writeClosed appends records 0..n-1 one by one to a new writer in /segs and closes it (every
// segment sealed), returning its hooks and backend.
func writeClosed(t *testing.T, fs vfs.FS, segSize int64, n int) (*recHooks, devio.Backend) {
	t.Helper()
	w, h, b := newTestWriter(t, fs, segSize)
	for i := 0; i < n; i++ {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return h, b
}

func newTestWriterWith(t *testing.T, fs vfs.FS, segSize int64, tweak func(*Options)) (*Writer, *recHooks, devio.Backend) {
	t.Helper()
	if err := fs.MkdirAll("/segs", 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := devio.NewBackend(devio.EnginePsync, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	h := &recHooks{sealed: map[uint64]int64{}}
	opts := Options{FS: fs, Dir: "/segs", SegmentSize: segSize, Sync: SyncAlways, Backend: b, Hooks: h, Direct: devio.DirectOff}
	if tweak != nil {
		tweak(&opts)
	}
	w, err := NewWriter(opts)
	if err != nil {
		t.Fatal(err)
	}
	return w, h, b
}

// TestWriterGroupCommitRotationAndSeal: concurrent appends are published, segments rotate at
// the configured size, each sealed segment ends with a footer listing exactly its records.
func TestWriterGroupCommitRotationAndSeal(t *testing.T) {
	fs := vfs.NewMem()
	w, h, b := newTestWriter(t, fs, 64<<10) // 16 KiB records: 3 a segment with the footer
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if err := w.Append([]*Record{testRecord(g*100 + i)}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if len(h.published) != 40 {
		t.Fatalf("published %d records, want 40", len(h.published))
	}
	if h.groups > 40 {
		t.Fatalf("%d publish groups for 40 records", h.groups)
	}
	if len(h.created) < 13 || len(h.sealed) != len(h.created) {
		t.Fatalf("created %d segments, sealed %d: want ≥13, all sealed", len(h.created), len(h.sealed))
	}
	seen := map[format.BlockID]bool{}
	for _, n := range h.created {
		res, err := ScanSegment(fs, SegmentPath("/segs", n), devio.DirectOff, b)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Sealed || res.Stop != nil || res.FileSize != h.sealed[n] || res.FileSize > 64<<10 {
			t.Fatalf("segment %d: sealed %v stop %v size %d (reported %d)", n, res.Sealed, res.Stop, res.FileSize, h.sealed[n])
		}
		for _, r := range res.Records {
			seen[r.Header.ID] = true
		}
	}
	if len(seen) != 40 {
		t.Fatalf("segments hold %d distinct records, want 40", len(seen))
	}
	if err := w.Append([]*Record{testRecord(1)}); !errors.Is(err, ErrWriterClosed) {
		t.Fatalf("append after close: %v", err)
	}
}

// writeActive writes n records to a fresh segment and leaves it unsealed (as a crash would).
func writeActive(t *testing.T, fs vfs.FS, n int) (string, int64) {
	w, h, _ := newTestWriter(t, fs, 1<<20)
	for i := 0; i < n; i++ {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
	}
	stopUnsealed(w)
	return SegmentPath("/segs", h.created[0]), format.SegmentHeaderSize + int64(n)*testLayout.RecordBytes()
}

// stopUnsealed stops w's committer without sealing its active segment (Close would seal it).
func stopUnsealed(w *Writer) {
	w.mu.Lock()
	w.closed = true
	close(w.stop)
	w.mu.Unlock()
	w.wg.Wait()
}

// A retired segment's file reused for a new segment (on a real file system: reuse needs a
// kernel descriptor to lay the file out and trim it). The retired segment's records past the
// new ones are never taken for the new segment's: an unsealed scan stops at them and recovery
// cuts them, a seal trims them. Until the new header is written the file names the retired
// segment, and recovery reports ErrStaleHeader without touching it.
func TestRecycledSegmentFile(t *testing.T) {
	fs, dir := vfs.Default, t.TempDir()
	b, err := devio.NewBackend(devio.EnginePsync, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// open starts a writer whose segments are numbered from first; reuseFrom (if not 0) is
	// the retired segment whose recycled file its first segment reuses.
	open := func(first, reuseFrom uint64) (*Writer, *recHooks) {
		h := &recHooks{sealed: map[uint64]int64{}}
		next := first - 1
		w, err := NewWriter(Options{FS: fs, Dir: dir, SegmentSize: 1 << 20, Sync: SyncAlways, Backend: b, Hooks: h,
			Direct: devio.DirectOff, Allocate: func() uint64 { next++; return next },
			Admit: func(n uint64, d string) (string, error) {
				if n != first || reuseFrom == 0 {
					return "", nil
				}
				return RecyclePath(d, reuseFrom), nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		return w, h
	}
	appendRecs := func(w *Writer, from, n int) {
		for i := from; i < from+n; i++ {
			if err := w.Append([]*Record{testRecord(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	recycle := func(n uint64) {
		if err := fs.Rename(SegmentPath(dir, n), RecyclePath(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(res *ScanResult) (out []int) {
		for _, r := range res.Records {
			var i int
			_, _ = fmt.Sscanf(string(r.Header.ID[:]), "rec-%012d", &i)
			out = append(out, i)
		}
		return out
	}

	// Segment 1: six records, sealed, retired and kept for reuse.
	w, _ := open(1, 0)
	appendRecs(w, 0, 6)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recycle(1)

	// Segment 2 reuses it for two records, then the process dies before the seal.
	w, h := open(2, 1)
	appendRecs(w, 10, 2)
	stopUnsealed(w)
	if len(h.created) != 1 || h.created[0] != 2 {
		t.Fatalf("created %v, want segment 2", h.created)
	}
	if _, err := fs.Stat(RecyclePath(dir, 1)); !oserror.IsNotExist(err) {
		t.Fatalf("recycled file still there after reuse: %v", err)
	}
	path := SegmentPath(dir, 2)
	res, err := ScanSegment(fs, path, devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(res); res.Header.Number != 2 || !slices.Equal(got, []int{10, 11}) || res.Sealed || res.HasFooter || res.Stop == nil {
		t.Fatalf("scan of the reused file: segment %d, records %v, sealed %v, footer %v, stop %v: want segment 2's records 10 and 11, stopped at the retired segment's bytes",
			res.Header.Number, got, res.Sealed, res.HasFooter, res.Stop)
	}
	rec, err := RecoverSegment(fs, path, 2, devio.DirectOff, b, false)
	if err != nil {
		t.Fatal(err)
	}
	res, err = ScanSegment(fs, path, devio.DirectOff, b)
	if err != nil || !res.Sealed || !slices.Equal(ids(res), []int{10, 11}) || res.FileSize != rec.FileSize {
		t.Fatalf("after recovery: %v, sealed %v, records %v, size %d (recovery said %d)", err, res.Sealed, ids(res), res.FileSize, rec.FileSize)
	}

	// Segment 3 reuses segment 2's file for one record and is sealed by Close: the seal trims
	// what is left of segment 2.
	recycle(2)
	w, h = open(3, 2)
	appendRecs(w, 20, 1)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res, err = ScanSegment(fs, SegmentPath(dir, 3), devio.DirectOff, b)
	if err != nil || !res.Sealed || res.Stop != nil || !slices.Equal(ids(res), []int{20}) || res.FileSize != h.sealed[3] {
		t.Fatalf("sealed reused segment: %v, sealed %v, stop %v, records %v, size %d (sealed at %d)", err, res.Sealed, res.Stop, ids(res), res.FileSize, h.sealed[3])
	}

	// A reuse interrupted before the first write: segment 4's file still holds segment 3's
	// header. Recovery says so and leaves the file alone.
	recycle(3)
	if err := fs.Rename(RecyclePath(dir, 3), SegmentPath(dir, 4)); err != nil {
		t.Fatal(err)
	}
	before, _ := fs.Stat(SegmentPath(dir, 4))
	if _, err := RecoverSegment(fs, SegmentPath(dir, 4), 4, devio.DirectOff, b, false); !errors.Is(err, ErrStaleHeader) || !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("recovering a file with a retired segment's header: %v, want ErrStaleHeader", err)
	}
	if after, _ := fs.Stat(SegmentPath(dir, 4)); after.Size() != before.Size() {
		t.Fatalf("stale-header file changed size from %d to %d", before.Size(), after.Size())
	}
	if n, ok := ParseRecycleFileName(filepath.Base(RecyclePath(dir, 7))); !ok || n != 7 {
		t.Fatalf("ParseRecycleFileName(%s) = %d, %v", RecyclePath(dir, 7), n, ok)
	}
	if _, ok := ParseRecycleFileName(SegmentFileName(7)); ok {
		t.Fatal("a segment file name parsed as a recycled file's")
	}
}

func copyFile(t *testing.T, fs vfs.FS, from, to string, n int64, mutate func([]byte)) {
	t.Helper()
	f, err := fs.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if mutate != nil {
		mutate(buf)
	}
	g, err := fs.Create(to, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write(buf); err != nil {
		t.Fatal(err)
	}
	g.Close()
}

// TestScanAfterTruncationZeroingAndFlips: whatever happens to an unsealed segment's tail, a
// scan returns a prefix of what was written, never an invalid record.
func TestScanAfterTruncationZeroingAndFlips(t *testing.T) {
	fs := vfs.NewMem()
	const n = 6
	path, end := writeActive(t, fs, n)
	b, _ := devio.NewBackend(devio.EnginePsync, 4, nil)
	defer b.Close()
	recLen := testLayout.RecordBytes()
	recordsBefore := func(off int64) int { return int((off - format.SegmentHeaderSize) / recLen) }
	check := func(name string, res *ScanResult, wantRecords int) {
		t.Helper()
		if len(res.Records) != wantRecords {
			t.Fatalf("%s: %d records, want %d (stop %v)", name, len(res.Records), wantRecords, res.Stop)
		}
		for i, r := range res.Records {
			if r.Header.ID != testRecord(i).ID || r.Offset != format.SegmentHeaderSize+int64(i)*recLen {
				t.Fatalf("%s: record %d is not what was written there", name, i)
			}
		}
		if res.ValidEnd != format.SegmentHeaderSize+int64(wantRecords)*recLen {
			t.Fatalf("%s: valid end %d", name, res.ValidEnd)
		}
	}
	// Truncation at every 1 KiB.
	for cut := int64(format.SegmentHeaderSize); cut <= end; cut += 1024 {
		copyFile(t, fs, path, "/cut", cut, nil)
		res, err := ScanSegment(fs, "/cut", devio.DirectOff, b)
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		check(fmt.Sprintf("cut at %d", cut), res, recordsBefore(cut))
	}
	// A zeroed 4 KiB block anywhere ends the log there (clean end or torn record).
	for z := int64(format.SegmentHeaderSize); z < end; z += format.Alignment {
		copyFile(t, fs, path, "/zero", end, func(buf []byte) { clear(buf[z : z+format.Alignment]) })
		res, err := ScanSegment(fs, "/zero", devio.DirectOff, b)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("zeroed at %d", z), res, recordsBefore(z))
	}
	// A flipped bit anywhere in a record invalidates that record and ends the valid prefix.
	for off := int64(format.SegmentHeaderSize); off < end; off += 997 {
		inPadding := false
		rel := (off - format.SegmentHeaderSize) % recLen
		if rel >= format.RecordHeaderSize {
			sh := (rel - format.RecordHeaderSize) % testLayout.ShardStride()
			inPadding = sh >= testLayout.ShardBytes
		}
		copyFile(t, fs, path, "/flip", end, func(buf []byte) { buf[off] ^= 0x20 })
		res, err := ScanSegment(fs, "/flip", devio.DirectOff, b)
		if err != nil {
			t.Fatal(err)
		}
		want := recordsBefore(off)
		if inPadding {
			want = n // padding is not checksummed and never returned to a reader
		}
		check(fmt.Sprintf("flip at %d", off), res, want)
		if !inPadding {
			var ce *CorruptionError
			if !errors.As(res.Stop, &ce) || ce.Offset != format.SegmentHeaderSize+int64(want)*recLen {
				t.Fatalf("flip at %d: stop %v does not name the record's offset", off, res.Stop)
			}
		}
	}
}

// TestRecoverSegmentAndSealedStrictness: RecoverSegment cuts a torn tail and seals; in a
// sealed segment a bad record is corruption reported with its place.
func TestRecoverSegmentAndSealedStrictness(t *testing.T) {
	fs := vfs.NewMem()
	path, end := writeActive(t, fs, 4)
	b, _ := devio.NewBackend(devio.EnginePsync, 4, nil)
	defer b.Close()
	// Tear the last record and add trailing garbage.
	recLen := testLayout.RecordBytes()
	copyFile(t, fs, path, "/segs/torn.seg", end, func(buf []byte) { buf[end-recLen+format.RecordHeaderSize+10] ^= 1 })
	if err := fs.Rename("/segs/torn.seg", path); err != nil {
		t.Fatal(err)
	}
	res, err := RecoverSegment(fs, path, 1, devio.DirectOff, b, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 3 || res.Truncated != recLen || !res.Sealed {
		t.Fatalf("recover: %d records, cut %d, sealed %v", len(res.Records), res.Truncated, res.Sealed)
	}
	again, err := ScanSegment(fs, path, devio.DirectOff, b)
	if err != nil || !again.Sealed || len(again.Records) != 3 || again.FileSize != res.FileSize {
		t.Fatalf("rescan after recovery: %+v %v", again, err)
	}
	// Recovering a sealed segment changes nothing.
	if res2, err := RecoverSegment(fs, path, 1, devio.DirectOff, b, true); err != nil || res2.Truncated != 0 || res2.FileSize != res.FileSize {
		t.Fatalf("second recovery: %+v %v", res2, err)
	}
	// A flipped payload bit in the sealed segment: reported, with offset and block id.
	st, _ := fs.Stat(path)
	victim := format.SegmentHeaderSize + recLen
	copyFile(t, fs, path, "/bad.seg", st.Size(), func(buf []byte) { buf[victim+format.RecordHeaderSize+3] ^= 1 })
	bad, err := ScanSegment(fs, "/bad.seg", devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	var ce *CorruptionError
	if bad.Sealed || !errors.As(bad.Stop, &ce) || ce.Offset != victim || ce.ID != testRecord(1).ID || !errors.Is(bad.Stop, format.ErrCorrupt) {
		t.Fatalf("sealed segment with a bad record: sealed %v stop %v", bad.Sealed, bad.Stop)
	}
}

func TestSegmentFileNames(t *testing.T) {
	for _, n := range []uint64{1, 42, 1<<40 + 3} {
		got, ok := ParseSegmentFileName(SegmentFileName(n))
		if !ok || got != n {
			t.Fatalf("%d: %d %v", n, got, ok)
		}
	}
	for _, bad := range []string{"", "1.seg", "0000000000000000.seg", "000000000000000a.seg", "0000000000000001.seg.tmp", "0000000000000001.sst"} {
		if _, ok := ParseSegmentFileName(bad); ok {
			t.Fatalf("%q parsed", bad)
		}
	}
	if _, err := ParseSyncPolicy("sometimes"); !errors.Is(err, format.ErrInvalid) {
		t.Fatal(err)
	}
}

// TestRecoverRefusesToCutSealedSegment: a sealed segment with a bad record in the middle is
// corruption: RecoverSegment reports it and leaves the file (and the records after it) alone.
func TestRecoverRefusesToCutSealedSegment(t *testing.T) {
	fs := vfs.NewMem()
	h, b := writeClosed(t, fs, 1<<20, 4)
	path := SegmentPath("/segs", h.created[0])
	st, _ := fs.Stat(path)
	victim := format.SegmentHeaderSize + testLayout.RecordBytes() + format.RecordHeaderSize + 1
	copyFile(t, fs, path, "/segs/x", st.Size(), func(buf []byte) { buf[victim] ^= 1 })
	if err := fs.Rename("/segs/x", path); err != nil {
		t.Fatal(err)
	}
	res, err := RecoverSegment(fs, path, 1, devio.DirectOff, b, true)
	var ce *CorruptionError
	if !errors.As(err, &ce) || !res.HasFooter || res.Sealed {
		t.Fatalf("recover of a corrupt sealed segment: %v", err)
	}
	if st2, _ := fs.Stat(path); st2.Size() != st.Size() {
		t.Fatalf("corrupt sealed segment was cut from %d to %d bytes", st.Size(), st2.Size())
	}
}

// TestCloseWithPeriodicSync: Close never waits on a periodic sync the committer will not answer.
func TestCloseWithPeriodicSync(t *testing.T) {
	for i := 0; i < 50; i++ {
		fs := vfs.NewMem()
		if err := fs.MkdirAll("/segs", 0o755); err != nil {
			t.Fatal(err)
		}
		b, _ := devio.NewBackend(devio.EnginePsync, 4, nil)
		w, err := NewWriter(Options{FS: fs, Dir: "/segs", SegmentSize: 1 << 20, Sync: SyncInterval, SyncInterval: 50 * time.Microsecond,
			Backend: b, Hooks: &recHooks{sealed: map[uint64]int64{}}, Direct: devio.DirectOff})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%5) * 20 * time.Microsecond)
		done := make(chan error, 1)
		go func() { done <- w.Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close hung with a periodic sync pending")
		}
		b.Close()
	}
}

// TestWriterPlacementAndAdmission: with Allocate, DirFor and Admit, segment numbers come from
// the caller, each segment lands in the directory DirFor names, and a refused admission fails
// exactly the records that needed the new segment, with the refusal's error, and writes nothing.
func TestWriterPlacementAndAdmission(t *testing.T) {
	fs := vfs.NewMem()
	for _, d := range []string{"/a", "/b"} {
		if err := fs.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := devio.NewBackend(devio.EnginePsync, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var (
		mu      sync.Mutex
		next    uint64 = 100
		admit          = 2 // segments admitted before refusals start
		errFull        = errors.New("tier full")
	)
	h := &recHooks{sealed: map[uint64]int64{}}
	w, err := NewWriter(Options{FS: fs, SegmentSize: 64 << 10, Sync: SyncAlways, Backend: b, Hooks: h, Direct: devio.DirectOff,
		Allocate: func() uint64 { mu.Lock(); defer mu.Unlock(); next += 10; return next },
		DirFor: func(n uint64) string {
			if n%20 == 0 {
				return "/a"
			}
			return "/b"
		},
		Admit: func(n uint64, dir string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			if admit == 0 {
				return "", errFull
			}
			admit--
			return "", nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// 2 records (28 KiB each) fit a 64 KiB segment: 4 are admitted, the 5th needs a third one.
	for i := 0; i < 4; i++ {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if err := w.Append([]*Record{testRecord(4)}); !errors.Is(err, errFull) {
		t.Fatalf("append beyond admission: %v, want %v", err, errFull)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h.created, []uint64{110, 120}) {
		t.Fatalf("created %v, want [110 120]", h.created)
	}
	for n, dir := range map[uint64]string{110: "/b", 120: "/a"} {
		res, err := ScanSegment(fs, SegmentPath(dir, n), devio.DirectOff, b)
		if err != nil || len(res.Records) != 2 {
			t.Fatalf("segment %d in %s: %v, %d records", n, dir, err, len(res.Records))
		}
	}
	if len(h.published) != 4 {
		t.Fatalf("published %d records, want 4", len(h.published))
	}
}

// TestAllocatedSegmentOnDisk: on a real file system the active segment is laid out to the
// segment size (its unused tail reads as zeros, the clean end of the log for a scan after a
// crash) and sealing trims it to end at the footer. Records published by pipelined appends
// are exactly the ones a scan finds, in placement order.
func TestAllocatedSegmentOnDisk(t *testing.T) {
	fs := vfs.Default
	dir := t.TempDir()
	b, err := devio.NewBackend(devio.EnginePsync, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const segSize = 1 << 20
	h := &recHooks{sealed: map[uint64]int64{}}
	w, err := NewWriter(Options{FS: fs, Dir: dir, SegmentSize: segSize, Sync: SyncAlways, Backend: b, Hooks: h, Direct: devio.DirectAuto})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if err := w.Append([]*Record{testRecord(g*100 + i)}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	path := SegmentPath(dir, h.created[0])
	st, err := fs.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	allocated := st.Size() == segSize
	if !allocated {
		t.Logf("file system did not allocate the segment (size %d): appends extend it", st.Size())
	}
	// What a crash now leaves: the unsealed segment, its tail zero. A scan stops cleanly there.
	crash := path + ".crash"
	copyFile(t, fs, path, crash, st.Size(), nil)
	res, err := ScanSegment(fs, crash, devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sealed || res.Stop != nil || len(res.Records) != 20 {
		t.Fatalf("crash copy: sealed %v stop %v, %d records (want 20)", res.Sealed, res.Stop, len(res.Records))
	}
	h.mu.Lock()
	for i, r := range res.Records {
		if p := h.published[i]; p.ID != r.Header.ID || p.Offset != r.Offset || p.Seq != r.Header.Seq {
			t.Fatalf("record %d: published %s at %d seq %d, scanned %s at %d seq %d", i, p.ID, p.Offset, p.Seq, r.Header.ID, r.Offset, r.Header.Seq)
		}
	}
	h.mu.Unlock()
	if err := fs.Remove(crash); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res, err = ScanSegment(fs, path, devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Sealed || res.FileSize != h.sealed[h.created[0]] || len(res.Records) != 20 {
		t.Fatalf("after close: sealed %v size %d (reported %d), %d records", res.Sealed, res.FileSize, h.sealed[h.created[0]], len(res.Records))
	}
}

// failingBackend fails every batch holding a write for which fail returns true.
type failingBackend struct {
	devio.Backend
	fail func(op *devio.Op) bool
}

func (f *failingBackend) Submit(ops []devio.Op) error {
	for i := range ops {
		if ops[i].Write && f.fail(&ops[i]) {
			for j := range ops {
				ops[j].Err = errors.New("injected write error")
			}
			return ops[i].Err
		}
	}
	return f.Backend.Submit(ops)
}

// newFailingWriter is a Writer on a fresh MemFS directory /segs whose backend fails the
// batches fail picks.
func newFailingWriter(t *testing.T, segSize int64, fail func(op *devio.Op) bool) (*Writer, *recHooks, vfs.FS, devio.Backend) {
	t.Helper()
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/segs", 0o755); err != nil {
		t.Fatal(err)
	}
	inner, err := devio.NewBackend(devio.EnginePsync, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	h := &recHooks{sealed: map[uint64]int64{}}
	w, err := NewWriter(Options{FS: fs, Dir: "/segs", SegmentSize: segSize, Sync: SyncAlways,
		Backend: &failingBackend{Backend: inner, fail: fail}, Hooks: h, Direct: devio.DirectOff})
	if err != nil {
		t.Fatal(err)
	}
	return w, h, fs, inner
}

// TestPipelinedWriteFailure: when a write fails, no record placed at or after it in the same
// segment is published (recovery cuts the segment there), the appends report the error, and
// the next append goes to a new segment.
func TestPipelinedWriteFailure(t *testing.T) {
	// The third record of segment 1 fails, wherever its group lands.
	failAt := format.SegmentHeaderSize + 2*testLayout.RecordBytes()
	var limit atomic.Int64
	limit.Store(failAt)
	w, h, _, _ := newFailingWriter(t, 1<<30, func(op *devio.Op) bool { return op.Off+int64(len(op.Buf)) > limit.Load() })
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.Append([]*Record{testRecord(i)})
		}()
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	h.mu.Lock()
	for _, r := range h.published {
		if r.Segment == 1 && r.Offset >= failAt {
			t.Errorf("record %s at offset %d of segment 1 published after the failed write at %d", r.ID, r.Offset, failAt)
		}
	}
	published := len(h.published)
	h.mu.Unlock()
	if failed == 0 || failed+published != 8 {
		t.Fatalf("%d appends failed, %d records published: want some failed, 8 in all", failed, published)
	}
	limit.Store(1 << 40) // heal
	if err := w.Append([]*Record{testRecord(100)}); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	last := h.published[len(h.published)-1]
	h.mu.Unlock()
	if last.Segment == 1 {
		t.Fatalf("append after the failure went to the abandoned segment 1")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// ReadFooter lists exactly the records of a sealed segment, and refuses a damaged footer or a
// size that is not the sealed one.
func TestReadFooter(t *testing.T) {
	fs := vfs.NewMem()
	h, b := writeClosed(t, fs, 128<<10, 7)
	for k, n := range h.created {
		seg, err := OpenSegmentForRead(fs, "/segs", n, h.gens[k], devio.DirectOff, b)
		if err != nil {
			t.Fatal(err)
		}
		entries, err := ReadFooter(seg, h.sealed[n], b)
		if err != nil {
			t.Fatalf("segment %d: %v", n, err)
		}
		res, err := ScanSegment(fs, SegmentPath("/segs", n), devio.DirectOff, b)
		if err != nil || len(res.Records) != len(entries) {
			t.Fatalf("segment %d: footer lists %d records, scan finds %d (%v)", n, len(entries), len(res.Records), err)
		}
		for i, r := range res.Records {
			if entries[i].ID != r.Header.ID || entries[i].Offset != r.Offset {
				t.Fatalf("segment %d entry %d: %+v, scanned %s at %d", n, i, entries[i], r.Header.ID, r.Offset)
			}
		}
		var ce *CorruptionError
		if _, err := ReadFooter(seg, h.sealed[n]-format.Alignment, b); !errors.As(err, &ce) {
			t.Fatalf("segment %d at a wrong size: %v", n, err)
		}
		seg.Release()
	}
}

// TestSealFailureLeavesSegmentForRecovery: a full segment is sealed behind its records while
// appends go on in the next one; when its footer cannot be written, every record already
// acknowledged stays published, later appends still succeed, the segment is not reported
// sealed, and recovery finds all of its records.
func TestSealFailureLeavesSegmentForRecovery(t *testing.T) {
	// Segment 1's footer goes after the last record that fits with it in 64 KiB.
	const segSize = 64 << 10
	perSeg := 0
	for format.SegmentHeaderSize+int64(perSeg+1)*testLayout.RecordBytes()+format.FooterSize(perSeg+1) <= segSize {
		perSeg++
	}
	footer := format.SegmentHeaderSize + int64(perSeg)*testLayout.RecordBytes()
	w, h, fs, inner := newFailingWriter(t, segSize, func(op *devio.Op) bool {
		return op.File.Path() == SegmentPath("/segs", 1) && op.Off == footer
	})
	for i := range 7 {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if len(h.published) != 7 {
		t.Fatalf("published %d records, want 7", len(h.published))
	}
	if _, ok := h.sealed[1]; ok {
		t.Fatal("segment 1 reported sealed although its footer write failed")
	}
	for _, n := range h.created[1:] {
		if _, ok := h.sealed[n]; !ok {
			t.Errorf("segment %d not sealed", n)
		}
	}
	res, err := RecoverSegment(fs, SegmentPath("/segs", 1), 1, devio.DirectOff, inner, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != perSeg || perSeg < 2 {
		t.Fatalf("recovery found %d records in segment 1, want %d (≥ 2)", len(res.Records), perSeg)
	}
}

// slowSealHooks holds every SegmentSealed until release is closed.
type slowSealHooks struct {
	*recHooks
	release chan struct{}
	started chan uint64
}

func (h *slowSealHooks) SegmentSealed(n uint64, size int64) error {
	h.started <- n
	<-h.release
	return h.recHooks.SegmentSealed(n, size)
}

// A seal in progress does not hold up appends to the next segment: the footer's write and
// sync run beside publication. Sync and Close wait for it.
func TestSealRunsBesidePublication(t *testing.T) {
	h := &slowSealHooks{recHooks: &recHooks{sealed: map[uint64]int64{}}, release: make(chan struct{}), started: make(chan uint64, 16)}
	w, _, _ := newTestWriterWith(t, vfs.NewMem(), 64<<10, func(o *Options) { o.Hooks = h })
	// 16 KiB records, 3 to a segment: the 4th starts segment 2 and seals segment 1.
	for i := 0; i < 6; i++ {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Seals run on goroutines of their own: segment 2's (full after the 6th record) may start
	// before segment 1's.
	if n := <-h.started; n != 1 && n != 2 {
		t.Fatalf("first seal of segment %d, want 1 or 2", n)
	}
	h.mu.Lock()
	published := len(h.published)
	h.mu.Unlock()
	if published != 6 {
		t.Fatalf("%d records published while segment 1's seal is held, want 6", published)
	}
	synced := make(chan error, 1)
	go func() { synced <- w.Sync() }()
	select {
	case err := <-synced:
		t.Fatalf("Sync returned (%v) before the seal it must cover finished", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(h.release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if _, ok := h.sealed[1]; !ok {
		t.Fatal("Sync returned before segment 1 was sealed")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// With PrepareNext the writer creates its next segment ahead of need: rotation takes it, and
// the one left unused at Close is handed back with SegmentDropped. Every record still lands in
// a sealed segment in order.
func TestPrepareNextSegment(t *testing.T) {
	w, h, _ := newTestWriterWith(t, vfs.NewMem(), 64<<10, func(o *Options) { o.PrepareNext = true })
	for i := 0; i < 7; i++ {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	used := uint64(0)
	for i, r := range h.published {
		if r.Segment != used && r.Segment != used+1 || (i == 0 && r.Segment != 1) {
			t.Fatalf("record %d in segment %d after segment %d: segments not used in order", i, r.Segment, used)
		}
		used = r.Segment
	}
	if used < 3 || len(h.created) != int(used)+1 || len(h.dropped) != 1 || h.dropped[0] != used+1 {
		t.Fatalf("records in segments 1-%d, created %v, dropped %v: want %d created, the last prepared and dropped", used, h.created, h.dropped, used+1)
	}
	if len(h.sealed) != int(used) {
		t.Fatalf("sealed %v, want segments 1-%d", h.sealed, used)
	}
}

// A failed preparation (here: Admit refuses segment 2 once) does not fail appends: the
// committer creates the segment itself when it needs it.
func TestPrepareNextFailureFallsBack(t *testing.T) {
	var refused atomic.Int32
	admit := func(n uint64, _ string) (string, error) {
		if n == 2 && refused.Add(1) == 1 {
			return "", errors.New("no room yet")
		}
		return "", nil
	}
	w, h, _ := newTestWriterWith(t, vfs.NewMem(), 64<<10, func(o *Options) { o.PrepareNext, o.Admit = true, admit })
	for i := 0; i < 4; i++ { // more than a segment holds
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatalf("append %d after a failed preparation: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	last := h.published[len(h.published)-1].Segment
	if refused.Load() != 1 || len(h.published) != 4 || h.published[0].Segment != 1 || last != 3 {
		t.Fatalf("refusals %d, %d records published, in segments %d..%d: want 1 refusal, 4 records in segments 1 and 3",
			refused.Load(), len(h.published), h.published[0].Segment, last)
	}
}

// A segment's header is written with its first records, not at creation: a created segment
// reads as never written (ErrNoHeader) until then, holds a valid header after, and a segment
// sealed without records gets its header from the seal.
func TestHeaderWrittenWithFirstRecords(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/segs", 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := devio.NewBackend(devio.EnginePsync, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := &format.SegmentHeader{Number: 1, Generation: 7}
	seg, err := CreateSegment(fs, "/segs", 1, devio.DirectOff, h, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ScanSegment(fs, seg.Path(), devio.DirectOff, b); !errors.Is(err, ErrNoHeader) || !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("scan of a created segment: %v, want ErrNoHeader", err)
	}
	w := &Writer{opts: Options{FS: fs, Dir: "/segs", SegmentSize: 1 << 20, Sync: SyncAlways, Backend: b,
		Hooks: &recHooks{sealed: map[uint64]int64{}}, Direct: devio.DirectOff, Logger: slog.New(slog.DiscardHandler)}}
	if err := w.writeRunSync(seg, []*Record{testRecord(1)}); err != nil {
		t.Fatal(err)
	}
	res, err := ScanSegment(fs, seg.Path(), devio.DirectOff, b)
	if err != nil || res.Header.Number != 1 || res.Header.Generation != 7 || len(res.Records) != 1 {
		t.Fatalf("after the first record: %+v, %v", res, err)
	}

	empty, err := CreateSegment(fs, "/segs", 2, devio.DirectOff, &format.SegmentHeader{Number: 2, Generation: 9}, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.sealSegment(empty); err != nil {
		t.Fatal(err)
	}
	res, err = ScanSegment(fs, empty.Path(), devio.DirectOff, b)
	if err != nil || !res.Sealed || res.Header.Number != 2 || len(res.Records) != 0 {
		t.Fatalf("sealed without records: %+v, %v", res, err)
	}
}

// TestReadSealedRecords: a reader without an index lists a sealed segment's records from its
// footer and record headers (what a scan finds, with the same header checksums), and refuses a
// segment whose record header no longer matches its footer entry.
func TestReadSealedRecords(t *testing.T) {
	fs := vfs.NewMem()
	h, b := writeClosed(t, fs, 128<<10, 7)
	n, gen := h.created[0], h.gens[0]
	seg, err := OpenSegmentForRead(fs, "/segs", n, gen, devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	if info := seg.Info(); info.Number != n || info.Generation != gen {
		t.Fatalf("Info() = %+v", info)
	}
	recs, err := ReadSealedRecords(seg, h.sealed[n], b)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ScanSegment(fs, SegmentPath("/segs", n), devio.DirectOff, b)
	if err != nil || len(res.Records) != len(recs) || len(recs) == 0 {
		t.Fatalf("sealed records %d, scan %d (%v)", len(recs), len(res.Records), err)
	}
	for i, r := range res.Records {
		if recs[i].Header.ID != r.Header.ID || recs[i].Offset != r.Offset || recs[i].HeaderCRC != r.HeaderCRC ||
			len(recs[i].Header.ShardCRCs) != len(r.Header.ShardCRCs) {
			t.Fatalf("record %d: %+v, scanned %+v", i, recs[i], r)
		}
	}
	seg.Release()
	// Damage the second record's header: the segment is refused as a whole.
	copyFile(t, fs, SegmentPath("/segs", n), SegmentPath("/segs", n)+".bad", h.sealed[n], func(buf []byte) {
		buf[recs[1].Offset+100] ^= 0xff
	})
	if err := fs.Rename(SegmentPath("/segs", n)+".bad", SegmentPath("/segs", n)); err != nil {
		t.Fatal(err)
	}
	seg, err = OpenSegmentForRead(fs, "/segs", n, gen, devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Release()
	var ce *CorruptionError
	if _, err := ReadSealedRecords(seg, h.sealed[n], b); !errors.As(err, &ce) || ce.Offset != recs[1].Offset {
		t.Fatalf("damaged header: %v", err)
	}
}

// TestSealOlderThan: an active segment whose first record is older than the age asked is
// rotated and sealed with what it holds (the next append starts a new segment); a younger one,
// or one with no record, is left alone; a non-positive age is refused.
func TestSealOlderThan(t *testing.T) {
	fs := vfs.NewMem()
	w, h, _ := newTestWriter(t, fs, 1<<20)
	defer w.Close()
	if err := w.SealOlderThan(0); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("age 0: %v", err)
	}
	if err := w.SealOlderThan(time.Nanosecond); err != nil { // no segment yet
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := w.Append([]*Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.SealOlderThan(time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil { // waits for everything queued before it
		t.Fatal(err)
	}
	h.mu.Lock()
	sealed := len(h.sealed)
	h.mu.Unlock()
	if sealed != 0 {
		t.Fatalf("a young segment was sealed")
	}
	time.Sleep(2 * time.Millisecond)
	if err := w.SealOlderThan(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := w.Append([]*Record{testRecord(2)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	first := h.created[0]
	if _, ok := h.sealed[first]; !ok {
		t.Fatalf("segment %d not sealed (sealed: %v)", first, h.sealed)
	}
	last := h.published[len(h.published)-1]
	if last.Segment == first {
		t.Fatalf("the append after the seal went to the sealed segment %d", first)
	}
}

// TestOnFlightReportsEveryRecord: with OnFlight set, every appended record is reported in
// exactly one flight, each flight's steps in pipeline order (appended, issued, written, synced
// under SyncAlways, published), and the bytes add up to the records written.
func TestOnFlightReportsEveryRecord(t *testing.T) {
	var (
		mu      sync.Mutex
		timings []FlightTiming
	)
	w, _, _ := newTestWriterWith(t, vfs.NewMem(), 64<<10, func(o *Options) {
		o.OnFlight = func(ft FlightTiming) {
			mu.Lock()
			timings = append(timings, ft)
			mu.Unlock()
		}
	})
	var wg sync.WaitGroup
	const appenders, each = 4, 6
	for g := 0; g < appenders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if err := w.Append([]*Record{testRecord(g*100 + i)}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	records, bytes := 0, int64(0)
	for i, ft := range timings {
		records += ft.Records
		bytes += ft.Bytes
		if ft.Appended.IsZero() || ft.Issued.Before(ft.Appended) || ft.Written.Before(ft.Issued) ||
			ft.Synced.Before(ft.Written) || ft.Published.Before(ft.Synced) || ft.Batch < 1 {
			t.Fatalf("flight %d: steps out of order or missing: %+v", i, ft)
		}
	}
	if records != appenders*each || bytes != int64(appenders*each)*testLayout.RecordBytes() {
		t.Fatalf("flights report %d records of %d bytes, want %d of %d", records, bytes, appenders*each, int64(appenders*each)*testLayout.RecordBytes())
	}
}
