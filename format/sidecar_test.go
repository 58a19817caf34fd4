package format

import (
	"errors"
	"testing"
)

func sampleSidecarHeader() *RecordHeader {
	l := Layout{Shards: 4, TensorsPerShard: 1, ShardBytes: 256}
	crcs := []uint32{0x01020304, 0x11121314, 0x21222324, 0x31323334}
	return &RecordHeader{Type: RecordSidecar, Kind: 5, Compression: CompressionPacked, ID: testID(1), Segment: 7,
		Generation: 0x1122334455667788, Seq: 43, Layout: l, ShardCRCs: crcs,
		StoredLens: []uint32{256, 256, 256, 256}, StoredCRCs: append([]uint32(nil), crcs...)}
}

func TestSidecarRecordHeaderGoldenAndRoundTrip(t *testing.T) {
	h := sampleSidecarHeader()
	buf := make([]byte, RecordHeaderSize)
	crc, err := EncodeRecordHeader(buf, h)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "record_header_sidecar.golden", buf)
	got, crc2, err := DecodeRecordHeader(buf)
	if err != nil {
		t.Fatal(err)
	}
	if crc != crc2 || got.Type != RecordSidecar || got.Kind != 5 || got.Compression != CompressionPacked || got.Layout != h.Layout ||
		got.ID != h.ID || got.Seq != h.Seq || len(got.ShardCRCs) != 4 || got.ShardCRCs[3] != 0x31323334 {
		t.Fatalf("round trip: got %+v want %+v", got, h)
	}
	// Four 256-byte parts packed: one aligned page of payload, not four.
	if got.PayloadBytes() != Alignment || got.RecordBytes() != 2*Alignment {
		t.Fatalf("payload %d record %d", got.PayloadBytes(), got.RecordBytes())
	}
	for i := range 4 {
		if off := StoredOffset(got.Layout, got.Compression, got.StoredLens, i); off != int64(256*i) {
			t.Fatalf("part %d at %d", i, off)
		}
	}
}

func TestSidecarSegmentHeaderGolden(t *testing.T) {
	h := sampleSegmentHeader()
	h.Features = FeatureSidecars
	buf := make([]byte, SegmentHeaderSize)
	if err := EncodeSegmentHeader(buf, h); err != nil {
		t.Fatal(err)
	}
	golden(t, "segment_header_sidecars.golden", buf)
	got, err := DecodeSegmentHeader(buf)
	if err != nil || got != *h {
		t.Fatalf("round trip: %+v %v", got, err)
	}
}

func TestSidecarFooterGolden(t *testing.T) {
	seg, gen, _, entries := sampleFooter()
	side := sampleSidecarHeader()
	entries = append(entries, FooterEntry{ID: testID(1), Offset: entries[1].Offset + entries[1].Length, Length: side.RecordBytes(),
		Seq: 44, HeaderCRC: 0x55667788, Type: RecordSidecar, Kind: 5})
	end := entries[2].Offset + entries[2].Length
	buf, err := EncodeFooter(seg, gen, end, entries)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "footer_sidecar.golden", buf)
	tr, err := DecodeTrailer(buf, end+int64(len(buf)))
	if err != nil {
		t.Fatal(err)
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

// TestSidecarHeaderInconsistencies: each way a type, kind and compression can disagree is
// refused when encoding (ErrInvalid) and when decoding bytes that claim it (ErrCorrupt).
func TestSidecarHeaderInconsistencies(t *testing.T) {
	cases := map[string]func(h *RecordHeader){
		"block with a kind":       func(h *RecordHeader) { *h = *sampleRecordHeader(); h.Kind = 3 },
		"block packed":            func(h *RecordHeader) { *h = *sampleSidecarHeader(); h.Type, h.Kind = RecordBlock, 0 },
		"sidecar kind 0":          func(h *RecordHeader) { h.Kind = 0 },
		"sidecar kind too large":  func(h *RecordHeader) { h.Kind = MaxSidecarKind + 1 },
		"sidecar not packed":      func(h *RecordHeader) { h.Compression, h.StoredLens, h.StoredCRCs = CompressionNone, nil, nil },
		"sidecar lz4":             func(h *RecordHeader) { h.Compression = CompressionLZ4 },
		"packed short part":       func(h *RecordHeader) { h.StoredLens[2] = 100 },
		"packed checksum differs": func(h *RecordHeader) { h.StoredCRCs[1]++ },
		"unknown type":            func(h *RecordHeader) { h.Type = 9 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			h := sampleSidecarHeader()
			mutate(h)
			buf := make([]byte, RecordHeaderSize)
			if _, err := EncodeRecordHeader(buf, h); !errors.Is(err, ErrInvalid) {
				t.Fatalf("encode: %v, want ErrInvalid", err)
			}
			// Forge the bytes: encode a valid header, then write the bad fields and re-seal it.
			good := sampleSidecarHeader()
			if _, err := EncodeRecordHeader(buf, good); err != nil {
				t.Fatal(err)
			}
			forge(buf, h)
			if _, _, err := DecodeRecordHeader(buf); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decode: %v, want ErrCorrupt", err)
			}
		})
	}
}

// forge writes h's type, kind, compression and packed table over an encoded header and
// recomputes its checksum, as a buggy or malicious writer could.
func forge(buf []byte, h *RecordHeader) {
	buf[recOffType] = byte(h.Type)
	buf[recOffCompress] = byte(h.Compression)
	buf[recOffKind] = byte(h.Kind)
	buf[recOffKind+1] = byte(h.Kind >> 8)
	for i := range h.ShardCRCs {
		e := buf[recOffShardCRCs+compressedEntrySize*i:]
		putLE32(e, h.ShardCRCs[i])
		if h.StoredLens != nil {
			putLE32(e[4:], h.StoredLens[i])
			putLE32(e[8:], h.StoredCRCs[i])
		}
	}
	putLE32(buf[headerCRCOffset:], Checksum(buf[:headerCRCOffset]))
}

func putLE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func TestFooterEntryKindMustMatchType(t *testing.T) {
	seg, gen, end, entries := sampleFooter()
	for _, bad := range []FooterEntry{{Type: RecordBlock, Kind: 2}, {Type: RecordSidecar, Kind: 0}, {Type: RecordSidecar, Kind: MaxSidecarKind + 1}, {Type: 7}} {
		e := append([]FooterEntry(nil), entries...)
		e[1].Type, e[1].Kind = bad.Type, bad.Kind
		buf, err := EncodeFooter(seg, gen, end, e)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := DecodeTrailer(buf, end+int64(len(buf)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeFooterEntries(buf, tr); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("type %d kind %d: %v, want ErrCorrupt", bad.Type, bad.Kind, err)
		}
	}
}
