package wal

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// testSidecar is a packed sidecar record of block i, kind kind, with parts parts of 300 bytes.
func testSidecar(i int, kind format.SidecarKind, parts int) *Record {
	id := testRecord(i).ID
	l := format.Layout{Shards: parts, TensorsPerShard: 1, ShardBytes: 300}
	r := &Record{ID: id, Kind: kind, Layout: l, Compression: format.CompressionPacked,
		Buf: devio.AlignedBuffer(int(format.RecordHeaderSize + format.AlignUp(int64(parts)*300)))}
	for p := 0; p < parts; p++ {
		b := r.Buf[format.RecordHeaderSize+p*300 : format.RecordHeaderSize+(p+1)*300]
		for j := range b {
			b[j] = byte(i + p*3 + j + int(kind))
		}
		c := format.Checksum(b)
		r.ShardCRCs, r.StoredCRCs, r.StoredLens = append(r.ShardCRCs, c), append(r.StoredCRCs, c), append(r.StoredLens, 300)
	}
	return r
}

// TestSidecarRecordsWrittenScannedAndListed: sidecar records go through the writer beside
// blocks; the segment carries FeatureSidecars, the footer lists each record's type and kind,
// and a scan (what recovery runs) decodes and verifies them, and re-seals them identically.
func TestSidecarRecordsWrittenScannedAndListed(t *testing.T) {
	fs := vfs.NewMem()
	w, h, b := newTestWriter(t, fs, 1<<20)
	recs := []*Record{testRecord(1), testSidecar(1, 5, 4), testRecord(2), testSidecar(2, 5, 4), testSidecar(2, 63, 1)}
	if err := w.Append(recs); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if len(h.created) != 1 {
		t.Fatalf("%d segments", len(h.created))
	}
	n := h.created[0]
	res, err := ScanSegment(fs, SegmentPath("/segs", n), devio.DirectOff, b)
	if err != nil || res.Stop != nil || !res.Sealed {
		t.Fatalf("scan: %v stop %v sealed %v", err, res.Stop, res.Sealed)
	}
	if res.Header.Features != format.FeatureSidecars {
		t.Fatalf("segment features %#x, want FeatureSidecars", res.Header.Features)
	}
	seg, err := OpenSegmentForRead(fs, "/segs", n, h.gens[0], devio.DirectOff, b)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Release()
	entries, err := ReadFooter(seg, h.sealed[n], b)
	if err != nil || len(entries) != len(recs) || len(res.Records) != len(recs) {
		t.Fatalf("footer %d entries (%v), scan %d records, wrote %d", len(entries), err, len(res.Records), len(recs))
	}
	for i, r := range recs {
		got := res.Records[i].Header
		if got.ID != r.ID || got.Kind != r.Kind || got.Type != r.Type() || entries[i].Kind != r.Kind || entries[i].Type != r.Type() {
			t.Fatalf("record %d: scanned %v/%d, footer %v/%d, wrote %v/%d", i, got.Type, got.Kind, entries[i].Type, entries[i].Kind, r.Type(), r.Kind)
		}
		if r.Kind != 0 && (got.Compression != format.CompressionPacked || got.Layout != r.Layout || r.Size() != got.RecordBytes()) {
			t.Fatalf("sidecar %d: header %+v, record of %d bytes", i, got, r.Size())
		}
	}
	// A sidecar of four 300-byte parts takes one page of payload.
	if recs[1].Size() != 2*format.Alignment {
		t.Fatalf("packed sidecar record of %d bytes", recs[1].Size())
	}
}
