package index

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"os"
	"reflect"
	"testing"

	"github.com/ucm-go/ucm/format"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata")

func testLoc(seg uint64, off int64, shards int) Location {
	l := Location{
		Segment:   seg,
		Offset:    off,
		Layout:    format.Layout{Shards: shards, TensorsPerShard: 2, ShardBytes: 6144},
		Seq:       seg<<32 | uint64(off),
		HeaderCRC: uint32(seg*31 + uint64(off)),
		ShardCRCs: make([]uint32, shards),
	}
	for i := range l.ShardCRCs {
		l.ShardCRCs[i] = uint32(i)*2654435761 + uint32(seg)
	}
	return l
}

func TestLocationRoundTrip(t *testing.T) {
	for _, l := range []Location{
		testLoc(1, 0, 1),
		testLoc(7, 4096*1000, 61),
		testLoc(1<<40, 1<<40, format.MaxShards),
		{Segment: 3, Offset: 8192, Layout: format.Layout{Shards: 1, TensorsPerShard: 1, ShardBytes: 1}, ShardCRCs: []uint32{0xffffffff}},
	} {
		enc := EncodeLocation([]byte("prefix"), l)
		if !bytes.HasPrefix(enc, []byte("prefix")) {
			t.Fatalf("EncodeLocation clobbered dst")
		}
		enc = enc[len("prefix"):]
		if len(enc) != locationFixedSize+4*l.Layout.Shards {
			t.Fatalf("encoded %d bytes, want %d", len(enc), locationFixedSize+4*l.Layout.Shards)
		}
		got, err := DecodeLocation(enc)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !reflect.DeepEqual(got, l) {
			t.Fatalf("round trip: got %+v want %+v", got, l)
		}
		if got.RecordBytes() != l.Layout.RecordBytes() {
			t.Fatalf("RecordBytes")
		}
	}
}

func TestDecodeLocationRejects(t *testing.T) {
	good := EncodeLocation(nil, testLoc(5, 4096, 4))
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	le := binary.LittleEndian
	cases := map[string][]byte{
		"empty":       nil,
		"short":       good[:locationFixedSize-1],
		"truncated":   good[:len(good)-1],
		"trailing":    append(bytes.Clone(good), 0),
		"version":     mut(func(b []byte) []byte { b[0] = 2; return b }),
		"shards0":     mut(func(b []byte) []byte { le.PutUint32(b[locOffShards:], 0); return b }),
		"shardsHuge":  mut(func(b []byte) []byte { le.PutUint32(b[locOffShards:], 1<<31); return b }),
		"tensors0":    mut(func(b []byte) []byte { le.PutUint32(b[locOffTensors:], 0); return b }),
		"shardBytes0": mut(func(b []byte) []byte { le.PutUint64(b[locOffShardBytes:], 0); return b }),
		"shardBytesX": mut(func(b []byte) []byte { le.PutUint64(b[locOffShardBytes:], 1<<63); return b }),
		"segment0":    mut(func(b []byte) []byte { le.PutUint64(b[locOffSegment:], 0); return b }),
		"offsetNeg":   mut(func(b []byte) []byte { le.PutUint64(b[locOffOffset:], 1<<63); return b }),
	}
	for name, b := range cases {
		if _, err := DecodeLocation(b); !errors.Is(err, format.ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestSegmentMetaRoundTrip(t *testing.T) {
	for _, m := range []SegmentMeta{
		{Number: 1, Generation: 99, State: SegmentActive, Size: 4096},
		{Number: 1 << 60, Generation: 1<<64 - 1, State: SegmentSealed, Size: 1 << 40, LiveBytes: 1 << 39, LiveRecords: 12345},
		{Number: 3, State: SegmentQuarantined},
		{Number: 5, Generation: 7, State: SegmentDeleting, Size: 1 << 28},
	} {
		enc := EncodeSegmentMeta(nil, m)
		if len(enc) != segmentMetaSize {
			t.Fatalf("encoded %d bytes", len(enc))
		}
		got, err := DecodeSegmentMeta(enc)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v want %+v", got, m)
		}
	}
}

func TestDecodeSegmentMetaRejects(t *testing.T) {
	good := EncodeSegmentMeta(nil, SegmentMeta{Number: 4, Generation: 1, State: SegmentSealed, Size: 8192, LiveBytes: 8192, LiveRecords: 1})
	mut := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	le := binary.LittleEndian
	cases := map[string][]byte{
		"empty":     nil,
		"short":     good[:segmentMetaSize-1],
		"trailing":  append(bytes.Clone(good), 0),
		"version":   mut(func(b []byte) { b[0] = 0 }),
		"number0":   mut(func(b []byte) { le.PutUint64(b[segOffNumber:], 0) }),
		"state0":    mut(func(b []byte) { b[segOffState] = 0 }),
		"state9":    mut(func(b []byte) { b[segOffState] = 9 }),
		"sizeNeg":   mut(func(b []byte) { le.PutUint64(b[segOffSize:], 1<<63) }),
		"bytesNeg":  mut(func(b []byte) { le.PutUint64(b[segOffLiveBytes:], 1<<63) }),
		"recsNeg":   mut(func(b []byte) { le.PutUint64(b[segOffLiveRecords:], 1<<63) }),
		"recsNoB":   mut(func(b []byte) { le.PutUint64(b[segOffLiveBytes:], 0) }),
		"bytesNoRc": mut(func(b []byte) { le.PutUint64(b[segOffLiveRecords:], 0) }),
	}
	for name, b := range cases {
		if _, err := DecodeSegmentMeta(b); !errors.Is(err, format.ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestSegmentStateString(t *testing.T) {
	for s, want := range map[SegmentState]string{SegmentActive: "active", SegmentSealed: "sealed", SegmentQuarantined: "quarantined", SegmentDeleting: "deleting", 0: "state(0)", 200: "state(200)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", uint8(s), s.String(), want)
		}
	}
}

func FuzzDecodeLocation(f *testing.F) {
	f.Add(EncodeLocation(nil, testLoc(1, 0, 1)))
	f.Add(EncodeLocation(nil, testLoc(9, 1<<30, 80)))
	f.Add(EncodeLocation(nil, testLoc(2, 4096, format.MaxShards)))
	f.Add(EncodeLocation(nil, testCompressedLoc(3, 8192, 3)))
	f.Add(EncodeLocation(nil, testCompressedLoc(4, 0, format.MaxCompressedShards)))
	f.Add(EncodeLocation(nil, testBatchLoc(5, 4096, 1, 1, 0)))
	f.Add(EncodeLocation(nil, testBatchLoc(6, 1<<30, 80, 35, 34)))
	f.Add(EncodeLocation(nil, testBatchLoc(7, 0, format.MaxShards, format.MaxBatchBlocks, 4095)))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add(make([]byte, locationFixedSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := DecodeLocation(b)
		if err != nil {
			if !errors.Is(err, format.ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever decodes is a valid location and re-encodes to the same bytes.
		if err := l.validate(); err != nil {
			t.Fatalf("decoded an invalid location: %v", err)
		}
		if enc := EncodeLocation(nil, l); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", enc, b)
		}
	})
}

func FuzzDecodeSegmentMeta(f *testing.F) {
	f.Add(EncodeSegmentMeta(nil, SegmentMeta{Number: 1, Generation: 2, State: SegmentActive, Size: 4096}))
	f.Add(EncodeSegmentMeta(nil, SegmentMeta{Number: 77, Generation: 5, State: SegmentSealed, Size: 1 << 30, LiveBytes: 1 << 20, LiveRecords: 3}))
	f.Add([]byte{})
	f.Add(make([]byte, segmentMetaSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeSegmentMeta(b)
		if err != nil {
			if !errors.Is(err, format.ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if err := m.validate(); err != nil {
			t.Fatalf("decoded an invalid row: %v", err)
		}
		if enc := EncodeSegmentMeta(nil, m); !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", enc, b)
		}
	})
}

func testCompressedLoc(seg uint64, off int64, shards int) Location {
	l := testLoc(seg, off, shards)
	l.Compression = format.CompressionLZ4Planes
	l.StoredLens = make([]uint32, shards)
	l.StoredCRCs = make([]uint32, shards)
	for i := range l.StoredLens {
		l.StoredLens[i] = uint32(1000 + 37*i%5000)
		if i%3 == 2 {
			l.StoredLens[i] = uint32(l.Layout.ShardBytes) // stored raw
		}
		l.StoredCRCs[i] = uint32(i) * 0x01000193
	}
	return l
}

// TestCompressedLocation: a compressed record's location is a version-2 value that round
// trips, whose RecordBytes is the true on-disk size; raw locations stay version 1 and the
// version-1 seed corpus (the values older builds wrote) still decodes.
func TestCompressedLocation(t *testing.T) {
	for _, l := range []Location{testCompressedLoc(1, 0, 1), testCompressedLoc(9, 1<<30, 80), testCompressedLoc(2, 4096, format.MaxCompressedShards)} {
		enc := EncodeLocation(nil, l)
		if enc[0] != locationVersionCompressed || len(enc) != locFixedSizeCompressed+locEntrySizeCompressed*l.Layout.Shards {
			t.Fatalf("version %d, %d bytes", enc[0], len(enc))
		}
		got, err := DecodeLocation(enc)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, l) {
			t.Fatalf("round trip: got %+v want %+v", got, l)
		}
		var sum int64
		for _, n := range l.StoredLens {
			sum += int64(n)
		}
		if got.RecordBytes() != format.RecordHeaderSize+format.AlignUp(sum) {
			t.Fatalf("RecordBytes %d, stored %d", got.RecordBytes(), sum)
		}
		if off, n := got.ShardExtent(l.Layout.Shards - 1); off+n != sum {
			t.Fatalf("last shard extent %d+%d, stored %d", off, n, sum)
		}
	}
	if enc := EncodeLocation(nil, testLoc(1, 0, 3)); enc[0] != locationVersion {
		t.Fatalf("raw location written as version %d", enc[0])
	}
	good := EncodeLocation(nil, testCompressedLoc(5, 4096, 4))
	le := binary.LittleEndian
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for name, b := range map[string][]byte{
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"code0":     mut(func(b []byte) []byte { b[locOffCompression] = 0; return b }),
		"code9":     mut(func(b []byte) []byte { b[locOffCompression] = 9; return b }),
		"len0":      mut(func(b []byte) []byte { le.PutUint32(b[locFixedSizeCompressed+4:], 0); return b }),
		"lenOver":   mut(func(b []byte) []byte { le.PutUint32(b[locFixedSizeCompressed+4:], 6145); return b }),
		"tooMany":   mut(func(b []byte) []byte { le.PutUint32(b[locOffShards:], format.MaxCompressedShards+1); return b }),
		"v1 length": mut(func(b []byte) []byte { b[0] = locationVersion; return b }),
		"version 3": mut(func(b []byte) []byte { b[0] = 3; return b }),
	} {
		if _, err := DecodeLocation(b); !errors.Is(err, format.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	// Pinned bytes of a version-2 value (a format change shows up here).
	want, err := os.ReadFile("testdata/location_v2.golden")
	if *updateGolden {
		want = EncodeLocation(nil, testCompressedLoc(3, 8192, 3))
		err = os.WriteFile("testdata/location_v2.golden", want, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := EncodeLocation(nil, testCompressedLoc(3, 8192, 3)); !bytes.Equal(got, want) {
		t.Fatalf("location v2 bytes differ from testdata/location_v2.golden: the index value format changed")
	}
	if _, err := DecodeLocation(want); err != nil {
		t.Fatal(err)
	}
	// The version-1 values older builds wrote are pinned by the FuzzDecodeLocation seed corpus
	// (testdata/fuzz), which plain go test replays: they must still decode and re-encode.
}
