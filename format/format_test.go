package format

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func testID(b byte) BlockID {
	var id BlockID
	for i := range id {
		id[i] = b + byte(i)
	}
	return id
}

func sampleSegmentHeader() *SegmentHeader {
	h := &SegmentHeader{Number: 7, Generation: 0x1122334455667788, CreatedNano: 1_700_000_000_000_000_000}
	for i := range h.Instance {
		h.Instance[i] = byte(0xA0 + i)
	}
	for i := range h.Schema {
		h.Schema[i] = byte(i * 3)
	}
	return h
}

func sampleRecordHeader() *RecordHeader {
	l := Layout{Shards: 3, TensorsPerShard: 2, ShardBytes: 5000}
	return &RecordHeader{Type: RecordBlock, ID: testID(1), Segment: 7, Generation: 0x1122334455667788, Seq: 42,
		Layout: l, ShardCRCs: []uint32{0xdeadbeef, 1, 0xffffffff}}
}

func sampleFooter() (uint64, uint64, int64, []FooterEntry) {
	l := Layout{Shards: 3, TensorsPerShard: 2, ShardBytes: 5000}
	e := []FooterEntry{
		{ID: testID(1), Offset: 4096, Length: l.RecordBytes(), Seq: 42, HeaderCRC: 0xabcdef01, Type: RecordBlock},
		{ID: testID(2), Offset: 4096 + l.RecordBytes(), Length: l.RecordBytes(), Seq: 43, HeaderCRC: 0x12345678, Type: RecordBlock},
	}
	return 7, 0x1122334455667788, 4096 + 2*l.RecordBytes(), e
}

// golden compares got with testdata/name, rewriting it under -update. The golden files pin
// the on-disk bytes: a diff here is a format change and needs a Version bump.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run go test ./format -update once to create it)", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: encoded bytes differ from the golden file: the on-disk format changed; bump Version", name)
	}
}

func TestSegmentHeaderGoldenAndRoundTrip(t *testing.T) {
	h := sampleSegmentHeader()
	buf := make([]byte, SegmentHeaderSize)
	if err := EncodeSegmentHeader(buf, h); err != nil {
		t.Fatal(err)
	}
	golden(t, "segment_header.golden", buf)
	got, err := DecodeSegmentHeader(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got != *h {
		t.Fatalf("round trip: got %+v want %+v", got, *h)
	}
}

func TestRecordHeaderGoldenAndRoundTrip(t *testing.T) {
	h := sampleRecordHeader()
	buf := make([]byte, RecordHeaderSize)
	crc, err := EncodeRecordHeader(buf, h)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "record_header.golden", buf)
	got, crc2, err := DecodeRecordHeader(buf)
	if err != nil {
		t.Fatal(err)
	}
	if crc != crc2 || got.ID != h.ID || got.Seq != h.Seq || got.Layout != h.Layout || got.Segment != h.Segment ||
		got.Generation != h.Generation || len(got.ShardCRCs) != 3 || got.ShardCRCs[2] != 0xffffffff {
		t.Fatalf("round trip: got %+v want %+v", got, h)
	}
}

func TestFooterGoldenAndRoundTrip(t *testing.T) {
	seg, gen, end, entries := sampleFooter()
	buf, err := EncodeFooter(seg, gen, end, entries)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "footer.golden", buf)
	fileSize := end + int64(len(buf))
	tr, err := DecodeTrailer(buf, fileSize)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Count != 2 || tr.DataEnd != end || tr.Segment != seg || tr.Generation != gen {
		t.Fatalf("trailer %+v", tr)
	}
	got, err := DecodeFooterEntries(buf, tr)
	if err != nil {
		t.Fatal(err)
	}
	for i := range entries {
		if got[i] != entries[i] {
			t.Fatalf("entry %d: got %+v want %+v", i, got[i], entries[i])
		}
	}
}

// TestEveryBitFlipDetected flips every bit of every encoded structure: decoding must fail with
// ErrCorrupt (the checksums cover every byte) and never panic.
func TestEveryBitFlipDetected(t *testing.T) {
	seg := make([]byte, SegmentHeaderSize)
	if err := EncodeSegmentHeader(seg, sampleSegmentHeader()); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, RecordHeaderSize)
	if _, err := EncodeRecordHeader(rec, sampleRecordHeader()); err != nil {
		t.Fatal(err)
	}
	s, g, end, entries := sampleFooter()
	foot, err := EncodeFooter(s, g, end, entries)
	if err != nil {
		t.Fatal(err)
	}
	decodeFoot := func(b []byte) error {
		tr, err := DecodeTrailer(b, end+int64(len(b)))
		if err != nil {
			return err
		}
		_, err = DecodeFooterEntries(b, tr)
		return err
	}
	cases := []struct {
		name   string
		buf    []byte
		decode func([]byte) error
		// covered is the byte range every flip in which must be detected.
		covered int
	}{
		{"segment header", seg, func(b []byte) error { _, err := DecodeSegmentHeader(b); return err }, len(seg)},
		{"record header", rec, func(b []byte) error { _, _, err := DecodeRecordHeader(b); return err }, len(rec)},
		// The footer's padding between the entries and the trailer is not checksummed.
		{"footer entries", foot, decodeFoot, len(entries) * FooterEntrySize},
	}
	for _, c := range cases {
		for i := 0; i < c.covered; i++ {
			for bit := 0; bit < 8; bit++ {
				c.buf[i] ^= 1 << bit
				err := c.decode(c.buf)
				c.buf[i] ^= 1 << bit
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s: flip of byte %d bit %d: err %v, want ErrCorrupt", c.name, i, bit, err)
				}
			}
		}
	}
	// And the trailer itself.
	tr := foot[len(foot)-TrailerSize:]
	for i := range tr {
		tr[i] ^= 0x10
		if err := decodeFoot(foot); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("trailer flip at %d: %v", i, err)
		}
		tr[i] ^= 0x10
	}
}

func TestRecordHeaderRejectsForgedLengths(t *testing.T) {
	// A header with a valid checksum but lengths out of range must still be rejected: lengths are
	// checked before they size anything.
	for _, l := range []Layout{
		{Shards: 0, TensorsPerShard: 1, ShardBytes: 1},
		{Shards: MaxShards + 1, TensorsPerShard: 1, ShardBytes: 1},
		{Shards: 1, TensorsPerShard: 1, ShardBytes: MaxShardBytes + 1},
		{Shards: 960, TensorsPerShard: 1, ShardBytes: MaxShardBytes},
		{Shards: 1, TensorsPerShard: 3, ShardBytes: 4096},
	} {
		h := sampleRecordHeader()
		h.Layout = l
		if err := l.Validate(); !errors.Is(err, ErrInvalid) {
			t.Fatalf("layout %+v: Validate = %v", l, err)
		}
		buf := make([]byte, RecordHeaderSize)
		h.ShardCRCs = make([]uint32, max(0, min(l.Shards, MaxShards)))
		if _, err := EncodeRecordHeader(buf, h); !errors.Is(err, ErrInvalid) {
			t.Fatalf("layout %+v: encode = %v", l, err)
		}
	}
}

func TestDecodeShortAndZeroInput(t *testing.T) {
	for _, n := range []int{0, 1, 63, 4095} {
		b := make([]byte, n)
		if _, err := DecodeSegmentHeader(b); !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
		if _, _, err := DecodeRecordHeader(b); !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
		if _, err := DecodeTrailer(b, int64(n)); !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
	}
	zero := make([]byte, Alignment)
	if !IsZeroBlock(zero) {
		t.Fatal("zero block")
	}
	if _, _, err := DecodeRecordHeader(zero); !errors.Is(err, ErrCorrupt) {
		t.Fatal(err)
	}
}

func TestLayoutGeometry(t *testing.T) {
	l := Layout{Shards: 80, TensorsPerShard: 2, ShardBytes: 65536}
	if l.BlockBytes() != 80*65536 || l.ShardStride() != 65536 || l.RecordBytes() != 4096+80*65536 || l.ShardOffset(2) != 4096+2*65536 {
		t.Fatal("geometry of an aligned layout")
	}
	u := Layout{Shards: 3, TensorsPerShard: 1, ShardBytes: 5000}
	if u.ShardStride() != 8192 || u.PayloadBytes() != 3*8192 {
		t.Fatal("unaligned shards are padded to the alignment")
	}
}

func TestParseBlockID(t *testing.T) {
	id := testID(9)
	got, err := ParseBlockID(id.String())
	if err != nil || got != id {
		t.Fatal(got, err)
	}
	for _, bad := range []string{"", "zz", id.String()[:30] + "zz"} {
		if _, err := ParseBlockID(bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
}

func FuzzDecodeRecordHeader(f *testing.F) {
	buf := make([]byte, RecordHeaderSize)
	if _, err := EncodeRecordHeader(buf, sampleRecordHeader()); err != nil {
		f.Fatal(err)
	}
	f.Add(buf)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, _, err := DecodeRecordHeader(b)
		if err != nil {
			return
		}
		// A header that decodes re-encodes to the same bytes.
		out := make([]byte, RecordHeaderSize)
		if _, err := EncodeRecordHeader(out, &h); err != nil {
			t.Fatalf("decoded header does not re-encode: %v", err)
		}
		if len(h.ShardCRCs) != h.Layout.Shards {
			t.Fatal("shard table length")
		}
	})
}

func FuzzDecodeFooter(f *testing.F) {
	s, g, end, entries := sampleFooter()
	foot, _ := EncodeFooter(s, g, end, entries)
	f.Add(foot, end+int64(len(foot)))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		tr, err := DecodeTrailer(b, size)
		if err != nil {
			return
		}
		es, err := DecodeFooterEntries(b, tr)
		if err != nil {
			return
		}
		for _, e := range es {
			if e.Offset+e.Length > tr.DataEnd {
				t.Fatal("entry past data end accepted")
			}
		}
	})
}
