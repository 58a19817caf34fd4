package format

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// sampleSummary has one of each kind of entry: a raw block, a compressed block, a sidecar and
// the two blocks of a batch.
func sampleSummary() *Summary {
	lay := Layout{Shards: 2, TensorsPerShard: 2, ShardBytes: 8192}
	var s Summary
	s.Instance[0], s.Instance[15] = 0xa1, 0x5e
	s.Schema[0], s.Schema[31] = 0x11, 0x22
	s.Segment, s.Generation, s.Size = 7, 0x1234, 1<<20
	id := func(b byte) BlockID { var i BlockID; i[0], i[15] = b, b^0xff; return i }
	s.Entries = []SummaryEntry{
		{ID: id(1), Offset: SegmentHeaderSize, Seq: 100, HeaderCRC: 0xdeadbeef, Type: RecordBlock, Layout: lay, ShardCRCs: []uint32{1, 2}},
		{ID: id(2), Offset: 8 * Alignment, Seq: 101, HeaderCRC: 0xcafe, Type: RecordBlock, Layout: lay, Compression: CompressionLZ4,
			ShardCRCs: []uint32{3, 4}, StoredLens: []uint32{100, 200}, StoredCRCs: []uint32{5, 6}},
		{ID: id(2), Offset: 12 * Alignment, Seq: 102, HeaderCRC: 0xf00d, Type: RecordSidecar, Kind: 3, Layout: Layout{Shards: 3, TensorsPerShard: 1, ShardBytes: 64},
			Compression: CompressionPacked, ShardCRCs: []uint32{7, 8, 9}, StoredLens: []uint32{64, 64, 64}, StoredCRCs: []uint32{7, 8, 9}},
		{ID: id(3), Offset: 16 * Alignment, Seq: 103, HeaderCRC: 0xabc, Type: RecordBatch, Layout: lay, ShardCRCs: []uint32{10, 11}, BatchBlocks: 2, BatchPos: 0},
		{ID: id(4), Offset: 16 * Alignment, Seq: 104, HeaderCRC: 0xabc, Type: RecordBatch, Layout: lay, ShardCRCs: []uint32{12, 13}, BatchBlocks: 2, BatchPos: 1},
	}
	return &s
}

func TestSummaryGoldenAndRoundTrip(t *testing.T) {
	s := sampleSummary()
	buf, err := EncodeSummary(s)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "summary.golden", buf)
	got, err := DecodeSummary(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, s)
	}
	empty := &Summary{Segment: 1, Generation: 2, Size: 1 << 16}
	eb, err := EncodeSummary(empty)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeSummary(eb); err != nil || len(got.Entries) != 0 || got.Segment != 1 {
		t.Fatalf("empty summary: %+v, %v", got, err)
	}
}

// Every single-byte change of a summary is caught (two checksums cover every byte), and every
// cut is too; neither panics.
func TestSummaryDamageIsCorrupt(t *testing.T) {
	buf, err := EncodeSummary(sampleSummary())
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		bad := bytes.Clone(buf)
		bad[i] ^= 0x40
		if _, err := DecodeSummary(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v, want ErrCorrupt", i, err)
		}
	}
	for n := range len(buf) {
		if _, err := DecodeSummary(buf[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut at %d: %v, want ErrCorrupt", n, err)
		}
	}
}

// An entry the checksums cover but whose fields are out of range (re-signed after the change)
// is refused, naming the entry.
func TestSummaryRefusesInconsistentEntries(t *testing.T) {
	cases := map[string]func(e *SummaryEntry){
		"offset unaligned":    func(e *SummaryEntry) { e.Offset++ },
		"offset past the end": func(e *SummaryEntry) { e.Offset = 1 << 20 },
		"batch position":      func(e *SummaryEntry) { e.Type, e.BatchBlocks, e.BatchPos = RecordBatch, 2, 2 },
		"sidecar kind 0":      func(e *SummaryEntry) { e.Type = RecordSidecar },
		"unknown type":        func(e *SummaryEntry) { e.Type = 9 },
		"unknown compression": func(e *SummaryEntry) { e.Compression = 9; e.StoredLens, e.StoredCRCs = []uint32{1, 1}, []uint32{1, 1} },
	}
	for name, mutate := range cases {
		s := sampleSummary()
		mutate(&s.Entries[0])
		if _, err := EncodeSummary(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: encode: %v, want ErrInvalid", name, err)
		}
		// The same entry written by hand, with valid checksums: the decoder refuses it too.
		good, err := EncodeSummary(sampleSummary())
		if err != nil {
			t.Fatal(err)
		}
		b := good[SummaryHeaderSize:]
		e := &s.Entries[0]
		le := binary.LittleEndian
		le.PutUint64(b[seOffOffset:], uint64(e.Offset))
		b[seOffType], b[seOffCompression] = byte(e.Type), byte(e.Compression)
		le.PutUint32(b[seOffBatchBlocks:], uint32(e.BatchBlocks))
		le.PutUint32(b[seOffBatchPos:], uint32(e.BatchPos))
		if e.Compression != CompressionNone {
			continue // the entry's size changes with it: covered by the fuzz target
		}
		resign(good)
		if _, err := DecodeSummary(good); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decode: %v, want ErrCorrupt", name, err)
		}
	}
}

// resign recomputes both checksums of a summary.
func resign(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[sumOffBodyCRC:], Checksum(b[SummaryHeaderSize:]))
	le.PutUint32(b[sumOffCRC:], Checksum(b[:sumOffCRC]))
}

// FuzzDecodeSummary: arbitrary bytes, re-signed so the checks past the checksums are reached,
// never panic; what decodes encodes back to the same bytes.
func FuzzDecodeSummary(f *testing.F) {
	good, err := EncodeSummary(sampleSummary())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, false)
	f.Add(good[:SummaryHeaderSize+70], true)
	f.Add([]byte(sumMagic), true)
	f.Fuzz(func(t *testing.T, b []byte, sign bool) {
		if sign && len(b) >= SummaryHeaderSize && len(b) <= MaxSummaryBytes {
			binary.LittleEndian.PutUint64(b[sumOffBodyBytes:], uint64(len(b)-SummaryHeaderSize))
			resign(b)
		}
		s, err := DecodeSummary(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := EncodeSummary(s)
		if err != nil {
			t.Fatalf("decoded summary does not encode: %v", err)
		}
		if !bytes.Equal(again[:sumOffVersion], b[:sumOffVersion]) || !bytes.Equal(again[sumOffCount:sumOffBodyCRC], b[sumOffCount:sumOffBodyCRC]) ||
			!bytes.Equal(again[SummaryHeaderSize:], b[SummaryHeaderSize:]) {
			t.Fatalf("re-encoding differs")
		}
	})
}
