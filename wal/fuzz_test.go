package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// fuzzLayouts are the record layouts FuzzScanSegment writes: one with unchecksummed shard
// padding (16 KiB records), one without (8 KiB records).
var fuzzLayouts = [2]format.Layout{
	{Shards: 3, TensorsPerShard: 1, ShardBytes: 5000},
	{Shards: 1, TensorsPerShard: 2, ShardBytes: 4096},
}

const fuzzMaxRecords = 8

// fuzzSegment is a segment written by the Writer, kept as bytes.
type fuzzSegment struct {
	data []byte
	recs []*Record // as written: id, offset, seq, header crc, shard crcs
}

type fuzzSegmentKey struct {
	n      int
	sealed bool
	layout int
}

var (
	fuzzSegMu    sync.Mutex
	fuzzSegCache = map[fuzzSegmentKey]*fuzzSegment{}
)

// fuzzRecord is record i of a fuzz segment: its payload bytes are never zero, so zeroing any
// byte of a shard changes it.
func fuzzRecord(l format.Layout, i int) *Record {
	var id format.BlockID
	copy(id[:], fmt.Sprintf("fuzz-%011d", i))
	r := &Record{ID: id, Layout: l, ShardCRCs: make([]uint32, l.Shards), Buf: devio.AlignedBuffer(int(l.RecordBytes()))}
	for sh := 0; sh < l.Shards; sh++ {
		off := l.ShardOffset(sh)
		b := r.Buf[off : off+l.ShardBytes]
		for j := range b {
			b[j] = byte(i*7+sh*13+j)%251 + 1
		}
		r.ShardCRCs[sh] = format.Checksum(b)
	}
	return r
}

// buildFuzzSegment writes n records with the Writer's append path to segment 1 of a fresh
// MemFS, seals it if asked (else leaves it as a crash would), and returns the file's bytes.
// The generation and creation time are fixed, so the bytes are deterministic.
func buildFuzzSegment(t testing.TB, b devio.Backend, k fuzzSegmentKey) *fuzzSegment {
	fuzzSegMu.Lock()
	defer fuzzSegMu.Unlock()
	if s := fuzzSegCache[k]; s != nil {
		return s
	}
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/segs", 0o755); err != nil {
		t.Fatal(err)
	}
	hooks := &recHooks{sealed: map[uint64]int64{}}
	w := &Writer{opts: Options{FS: fs, Dir: "/segs", SegmentSize: 1 << 30, Sync: SyncAlways, Backend: b, Hooks: hooks,
		Direct: devio.DirectOff, Logger: slog.New(slog.DiscardHandler)}, next: 2}
	seg, err := CreateSegment(fs, "/segs", 1, devio.DirectOff,
		&format.SegmentHeader{Number: 1, Generation: 0x0123456789abcdef, CreatedNano: 1_700_000_000_000_000_000}, "")
	if err != nil {
		t.Fatal(err)
	}
	w.active = seg
	s := &fuzzSegment{}
	for i := 0; i < k.n; i++ {
		r := fuzzRecord(fuzzLayouts[k.layout], i)
		if err := w.writeRunSync(seg, []*Record{r}); err != nil {
			t.Fatal(err)
		}
		r.Buf = nil
		s.recs = append(s.recs, r)
	}
	if k.sealed {
		if err := w.seal(seg); err != nil {
			t.Fatal(err)
		}
	}
	seg.Release()
	s.data = readAll(t, fs, seg.Path())
	fuzzSegCache[k] = s
	return s
}

// writeRunSync writes recs to the end of seg and publishes them, without the committer and
// publisher goroutines: the append path of a Writer built by hand.
func (w *Writer) writeRunSync(seg *Segment, recs []*Record) error {
	if w.flights == nil {
		w.flights, w.slots = make(chan *flight, maxFlights), make(chan struct{}, maxFlights)
	}
	r := &request{recs: recs, remaining: len(recs), done: make(chan error, 1)}
	owners := make([]*request, len(recs))
	for i := range owners {
		owners[i] = r
	}
	if err := w.issue(seg, recs, owners); err != nil {
		return err
	}
	f := <-w.flights
	<-f.written
	w.settle([]*flight{f})
	w.last = nil
	return <-r.done
}

func readAll(t testing.TB, fs vfs.FS, path string) []byte {
	t.Helper()
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, st.Size())
	if _, err := f.ReadAt(buf, 0); err != nil && !(errors.Is(err, io.EOF) && len(buf) == 0) {
		t.Fatal(err)
	}
	return buf
}

func writeFile(t testing.TB, fs vfs.FS, path string, data []byte) {
	t.Helper()
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	// vfs.File.Write may modify the slice it is given (MemFS scrambles it): write a copy.
	if _, err := f.Write(slices.Clone(data)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// Mutations applied by FuzzScanSegment.
const (
	mutNone = iota
	mutTruncate
	mutZeroRange
	mutZeroBlock
	mutFlipBits
	mutAppendGarbage
	mutTruncateAppend
	mutCount
)

// mutate applies mutation kind to a copy of data. It returns the new bytes and the lowest
// offset whose byte may differ from data (len(data) when nothing changed).
func mutate(data []byte, kind int, off uint32, length uint16, extra []byte) ([]byte, int) {
	size := len(data)
	out := slices.Clone(data)
	first := size
	if size == 0 {
		// A segment created and never written (its header goes out with the first records):
		// only appending can change it.
		if kind == mutAppendGarbage || kind == mutTruncateAppend {
			out = append(out, garbage(extra, length)...)
		}
		return out, 0
	}
	at := func(o uint32) int { return int(o % uint32(size)) }
	switch kind {
	case mutTruncate:
		cut := int(off % uint32(size+1))
		return out[:cut], cut
	case mutZeroRange:
		lo := at(off)
		hi := min(size, lo+int(length)%(3*format.Alignment)+1)
		for i := lo; i < hi; i++ {
			if out[i] != 0 {
				first = min(first, i)
				out[i] = 0
			}
		}
	case mutZeroBlock:
		lo := at(off) &^ (format.Alignment - 1)
		hi := min(size, lo+format.Alignment)
		for i := lo; i < hi; i++ {
			if out[i] != 0 {
				first = min(first, i)
				out[i] = 0
			}
		}
	case mutFlipBits:
		// At most three single-bit flips: CRC32C detects every error of up to 3 bits in the
		// lengths checksummed here, so a record that still decodes must be intact.
		flips := []uint32{off}
		for i := 0; i+4 <= len(extra) && len(flips) < 3; i += 4 {
			flips = append(flips, binary.LittleEndian.Uint32(extra[i:]))
		}
		for _, f := range flips {
			bit := int(f % uint32(size*8))
			out[bit/8] ^= 1 << (bit % 8)
		}
		for i := range out {
			if out[i] != data[i] {
				first = i
				break
			}
		}
	case mutAppendGarbage:
		out = append(out, garbage(extra, length)...)
	case mutTruncateAppend:
		cut := int(off % uint32(size+1))
		out = append(out[:cut], garbage(extra, length)...)
		first = cut
	}
	return out, first
}

// garbage is extra (at most 3 blocks of it), optionally padded with zeros to an Alignment
// boundary (length bit 0) so that it ends a block-aligned file.
func garbage(extra []byte, length uint16) []byte {
	g := slices.Clone(extra[:min(len(extra), 3*format.Alignment)])
	if length&1 != 0 {
		g = append(g, make([]byte, format.AlignUp(int64(len(g)))-int64(len(g)))...)
	}
	return g
}

// checkPrefix checks that got is a prefix of want: same ids, offsets, sequence numbers and
// checksums, in order.
func checkPrefix(t *testing.T, what string, got []ScannedRecord, want []*Record) {
	t.Helper()
	if len(got) > len(want) {
		t.Fatalf("%s: %d records, only %d written", what, len(got), len(want))
	}
	for i, r := range got {
		w := want[i]
		if r.Header.ID != w.ID || r.Offset != w.Offset || r.Header.Seq != w.Seq || r.HeaderCRC != w.HeaderCRC ||
			r.Header.Segment != 1 || r.Header.Layout != w.Layout || !slices.Equal(r.Header.ShardCRCs, w.ShardCRCs) {
			t.Fatalf("%s: record %d is %s at %d seq %d, wrote %s at %d seq %d", what, i, r.Header.ID, r.Offset, r.Header.Seq, w.ID, w.Offset, w.Seq)
		}
	}
}

func isCorruption(err error) bool {
	var ce *CorruptionError
	return errors.As(err, &ce) && errors.Is(err, format.ErrCorrupt)
}

// FuzzScanSegment writes a segment of up to 8 records with the Writer, sealed or left
// unsealed as a crash leaves it, mutates it (truncation, zeroed range or block, bit flips,
// appended garbage) and scans it. The scan never panics and returns a prefix of what was
// written, ending in a clean end or a *CorruptionError wrapping format.ErrCorrupt; a sealed
// segment is either reported sealed with every record or reports why not; a segment header
// only fails to decode when the mutation touched it. RecoverSegment then leaves a file that
// rescans sealed with the same records.
func FuzzScanSegment(f *testing.F) {
	b, err := devio.NewBackend(devio.EnginePsync, 4, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { b.Close() })
	// flags: bit 0 sealed, bit 1 layout.
	f.Add(uint8(3), uint8(0), uint8(mutNone), uint32(0), uint16(0), []byte(nil))
	f.Add(uint8(3), uint8(1), uint8(mutNone), uint32(0), uint16(0), []byte(nil))
	f.Add(uint8(0), uint8(1), uint8(mutNone), uint32(0), uint16(0), []byte(nil))
	f.Add(uint8(4), uint8(0), uint8(mutTruncate), uint32(4096+16384*2+5000), uint16(0), []byte(nil))
	f.Add(uint8(4), uint8(1), uint8(mutTruncate), uint32(4096+16384*3), uint16(0), []byte(nil))
	f.Add(uint8(5), uint8(2), uint8(mutZeroRange), uint32(4096+8192*2+100), uint16(64), []byte(nil))
	f.Add(uint8(5), uint8(3), uint8(mutZeroBlock), uint32(4096+8192*4), uint16(0), []byte(nil))
	f.Add(uint8(6), uint8(0), uint8(mutFlipBits), uint32((4096+16384+4096+10)*8), uint16(0), []byte{1, 2, 3, 4})
	f.Add(uint8(6), uint8(1), uint8(mutFlipBits), uint32((4096+16384*6+100)*8+3), uint16(0), []byte(nil))
	f.Add(uint8(2), uint8(0), uint8(mutFlipBits), uint32((4096+5000+7)*8), uint16(0), []byte(nil)) // shard padding
	f.Add(uint8(2), uint8(0), uint8(mutFlipBits), uint32(20*8), uint16(0), []byte(nil))            // segment header
	f.Add(uint8(2), uint8(0), uint8(mutAppendGarbage), uint32(0), uint16(1), []byte("UCMR garbage"))
	f.Add(uint8(2), uint8(1), uint8(mutAppendGarbage), uint32(0), uint16(1), []byte("UCMGOFTR"))
	f.Add(uint8(7), uint8(2), uint8(mutTruncateAppend), uint32(4096+8192*3), uint16(1), []byte{0xff})
	f.Add(uint8(7), uint8(3), uint8(mutTruncate), uint32(100), uint16(0), []byte(nil))
	f.Fuzz(func(t *testing.T, n, flags, kind uint8, off uint32, length uint16, extra []byte) {
		k := fuzzSegmentKey{n: int(n) % (fuzzMaxRecords + 1), sealed: flags&1 != 0, layout: int(flags>>1) & 1}
		seg := buildFuzzSegment(t, b, k)
		data, first := mutate(seg.data, int(kind)%mutCount, off, length, extra)

		fs := vfs.NewMem()
		if err := fs.MkdirAll("/segs", 0o755); err != nil {
			t.Fatal(err)
		}
		path := SegmentPath("/segs", 1)
		writeFile(t, fs, path, data)
		res, err := ScanSegment(fs, path, devio.DirectOff, b)
		if err != nil {
			if !isCorruption(err) {
				t.Fatalf("scan error is not a *CorruptionError wrapping ErrCorrupt: %v", err)
			}
			if first >= format.SegmentHeaderSize {
				t.Fatalf("scan failed though the segment header is intact (first change at %d): %v", first, err)
			}
			return
		}
		if res.FileSize != int64(len(data)) {
			t.Fatalf("file size %d, wrote %d", res.FileSize, len(data))
		}
		checkPrefix(t, "scan", res.Records, seg.recs)
		wantEnd := int64(format.SegmentHeaderSize)
		if len(res.Records) > 0 {
			last := res.Records[len(res.Records)-1]
			wantEnd = last.Offset + last.Length()
		}
		if res.ValidEnd != wantEnd {
			t.Fatalf("valid end %d, records end at %d", res.ValidEnd, wantEnd)
		}
		if res.Stop != nil && !isCorruption(res.Stop) {
			t.Fatalf("stop is not a *CorruptionError wrapping ErrCorrupt: %v", res.Stop)
		}
		// Every record lying wholly before the first changed byte is found.
		intact := 0
		for _, r := range seg.recs {
			if r.Offset+r.Layout.RecordBytes() <= int64(first) {
				intact++
			}
		}
		if len(res.Records) < intact {
			t.Fatalf("%d records returned, %d lie before the first change at %d (stop %v)", len(res.Records), intact, first, res.Stop)
		}
		switch {
		case res.Sealed:
			if !k.sealed {
				t.Fatalf("unsealed segment scanned as sealed")
			}
			if len(res.Records) != len(seg.recs) || res.Stop != nil || !res.HasFooter {
				t.Fatalf("sealed with %d of %d records, stop %v, footer %v", len(res.Records), len(seg.recs), res.Stop, res.HasFooter)
			}
		case res.HasFooter:
			// A footer ends the file but a record before it is bad: corruption.
			if !k.sealed {
				t.Fatalf("unsealed segment has a footer")
			}
			if res.Stop == nil {
				t.Fatalf("footer present, not sealed, no stop reason (%d records, valid end %d)", len(res.Records), res.ValidEnd)
			}
		case k.sealed && first == len(seg.data) && len(data) == len(seg.data):
			t.Fatalf("untouched sealed segment not recognised as sealed (stop %v)", res.Stop)
		}
		if first == len(data) && len(data) == len(seg.data) && len(res.Records) != len(seg.recs) {
			t.Fatalf("untouched segment: %d of %d records (stop %v)", len(res.Records), len(seg.recs), res.Stop)
		}

		// Recovery as for a segment whose seal never completed: cut after the valid prefix and
		// seal. The result rescans sealed with the same records.
		rec, err := RecoverSegment(fs, path, 1, devio.DirectOff, b, false)
		if err != nil {
			t.Fatalf("recover: %v", err)
		}
		if !rec.Sealed || len(rec.Records) != len(res.Records) {
			t.Fatalf("recover: sealed %v, %d records, scan had %d", rec.Sealed, len(rec.Records), len(res.Records))
		}
		again, err := ScanSegment(fs, path, devio.DirectOff, b)
		if err != nil {
			t.Fatalf("rescan after recovery: %v", err)
		}
		if !again.Sealed || again.Stop != nil || len(again.Records) != len(res.Records) || again.FileSize != rec.FileSize ||
			again.FileSize != res.ValidEnd+format.FooterSize(len(res.Records)) {
			t.Fatalf("rescan after recovery: sealed %v stop %v, %d records (want %d), size %d (recover said %d)",
				again.Sealed, again.Stop, len(again.Records), len(res.Records), again.FileSize, rec.FileSize)
		}
		checkPrefix(t, "rescan after recovery", again.Records, seg.recs)
		if res.Sealed && again.FileSize != int64(len(data)) {
			t.Fatalf("recovery of a sealed segment changed its size from %d to %d", len(data), again.FileSize)
		}
	})
}

// TestScanSealedWithCorruptFooterEntries: ScanSegment checks a footer's trailer but not the
// entries' checksum the trailer holds, so a sealed segment whose footer entries are damaged
// scans as Sealed ("a valid footer ends the file"), RecoverSegment leaves it as is, and the
// damage is only found by a reader of the entries (ucm-tool verify).
func TestScanSealedWithCorruptFooterEntries(t *testing.T) {
	b, err := devio.NewBackend(devio.EnginePsync, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	seg := buildFuzzSegment(t, b, fuzzSegmentKey{n: 2, sealed: true})
	dataEnd := seg.recs[1].Offset + seg.recs[1].Layout.RecordBytes()
	data, _ := mutate(seg.data, mutFlipBits, uint32(dataEnd+20)*8, 0, nil) // entry 0's offset field
	fs := vfs.NewMem()
	writeFile(t, fs, "/s", data)
	res, err := ScanSegment(fs, "/s", devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	tr, terr := format.DecodeTrailer(data[len(data)-format.TrailerSize:], int64(len(data)))
	_, eerr := format.DecodeFooterEntries(data[dataEnd:], tr)
	if terr != nil || eerr == nil {
		t.Fatalf("test setup: trailer %v, entries %v", terr, eerr)
	}
	if res.Sealed {
		t.Fatalf("sealed segment with corrupt footer entries (%v) scanned as Sealed", eerr)
	}
}
