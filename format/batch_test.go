package format

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// sampleBatchHeader is a batch of 3 blocks of 2 unaligned shards (stride 8192): header 4096,
// runs 2 × 3 × 8192, commit 4096; extent 57344.
func sampleBatchHeader() *BatchHeader {
	return &BatchHeader{Segment: 7, Generation: 0x1122334455667788, FirstSeq: 100,
		Layout: Layout{Shards: 2, TensorsPerShard: 2, ShardBytes: 5000},
		IDs:    []BlockID{testID(0x10), testID(0x20), testID(0x30)}}
}

func sampleBatchCommit(h *BatchHeader, headerCRC uint32) *BatchCommit {
	n, l := len(h.IDs), h.Layout.Shards
	c := &BatchCommit{Segment: h.Segment, Generation: h.Generation, FirstSeq: h.FirstSeq, Blocks: n, Shards: l,
		HeaderCRC: headerCRC, ShardCRCs: make([]uint32, n*l)}
	for i := range l {
		for b := range n {
			c.ShardCRCs[i*n+b] = 0xC0000000 | uint32(i)<<8 | uint32(b)
		}
	}
	return c
}

func encodeBatchHeader(t testing.TB, h *BatchHeader) ([]byte, uint32) {
	t.Helper()
	buf := make([]byte, BatchHeaderSize(len(h.IDs)))
	crc, err := EncodeBatchHeader(buf, h)
	if err != nil {
		t.Fatal(err)
	}
	return buf, crc
}

func encodeBatchCommit(t testing.TB, c *BatchCommit) []byte {
	t.Helper()
	buf := make([]byte, BatchCommitSize(c.Blocks, c.Shards))
	if err := EncodeBatchCommit(buf, c); err != nil {
		t.Fatal(err)
	}
	return buf
}

func TestBatchGeometry(t *testing.T) {
	h := sampleBatchHeader()
	if BatchHeaderSize(3) != 4096 || BatchCommitSize(3, 2) != 4096 || h.ExtentBytes() != 4096+2*3*8192+4096 {
		t.Fatalf("sizes: H %d C %d extent %d", BatchHeaderSize(3), BatchCommitSize(3, 2), h.ExtentBytes())
	}
	// Layer-major: the three blocks' shard 0, then their shard 1.
	want := map[[2]int]int64{{0, 0}: 4096, {1, 0}: 4096 + 8192, {2, 0}: 4096 + 2*8192, {0, 1}: 4096 + 3*8192, {2, 1}: 4096 + 5*8192}
	for bi, off := range want {
		if got := h.ShardOffset(bi[0], bi[1]); got != off {
			t.Fatalf("ShardOffset(%d, %d) = %d, want %d", bi[0], bi[1], got, off)
		}
	}
	if h.CommitOffset() != 4096+6*8192 || h.CommitOffset()+BatchCommitSize(3, 2) != h.ExtentBytes() {
		t.Fatalf("commit at %d", h.CommitOffset())
	}
	// Where the header and commit block grow past one page.
	for _, c := range []struct {
		got, want int64
	}{
		{BatchHeaderSize(1), 4096}, {BatchHeaderSize(248), 4096}, {BatchHeaderSize(249), 8192},
		{BatchHeaderSize(MaxBatchBlocks), AlignUp(128 + 16*MaxBatchBlocks)},
		{BatchCommitSize(1, 1), 4096}, {BatchCommitSize(1008, 1), 4096}, {BatchCommitSize(1009, 1), 8192},
		{BatchCommitSize(35, 80), AlignUp(64 + 4*35*80)},
	} {
		if c.got != c.want {
			t.Fatalf("size %d, want %d", c.got, c.want)
		}
	}
}

func TestBatchHeaderGoldenAndRoundTrip(t *testing.T) {
	h := sampleBatchHeader()
	buf, crc := encodeBatchHeader(t, h)
	golden(t, "batch_header.golden", buf)
	if stored := binary.LittleEndian.Uint32(buf[batchOffCRC:]); stored != crc {
		t.Fatalf("returned crc %#x, stored %#x", crc, stored)
	}
	n, size, err := PeekBatchHeader(buf[:128])
	if err != nil || n != 3 || size != 4096 {
		t.Fatalf("peek: %d %d %v", n, size, err)
	}
	got, crc2, err := DecodeBatchHeader(buf)
	if err != nil {
		t.Fatal(err)
	}
	if crc2 != crc || got.Segment != h.Segment || got.Generation != h.Generation || got.FirstSeq != h.FirstSeq ||
		got.Layout != h.Layout || !slices.Equal(got.IDs, h.IDs) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, *h)
	}
	// A record-header decoder handed a batch header says what it is.
	if _, _, err := DecodeRecordHeader(buf); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "batch") {
		t.Fatalf("DecodeRecordHeader of a batch header: %v", err)
	}
	// And the batch decoders refuse a record header by its type.
	rec := make([]byte, RecordHeaderSize)
	if _, err := EncodeRecordHeader(rec, sampleRecordHeader()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := PeekBatchHeader(rec); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "field type") {
		t.Fatalf("PeekBatchHeader of a record header: %v", err)
	}
}

// TestBatchHeaderMultiPage: a header whose id table spans pages (N = 300, H = 8192) round-trips,
// Peek sizes it from the first 128 bytes, and a source shorter than H is refused.
func TestBatchHeaderMultiPage(t *testing.T) {
	h := sampleBatchHeader()
	h.Layout = Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 4096}
	h.IDs = make([]BlockID, 300)
	for b := range h.IDs {
		h.IDs[b] = testID(1)
		binary.BigEndian.PutUint16(h.IDs[b][:], uint16(b))
	}
	buf, crc := encodeBatchHeader(t, h)
	n, size, err := PeekBatchHeader(buf[:128])
	if err != nil || n != 300 || size != 8192 || int64(len(buf)) != size {
		t.Fatalf("peek: %d %d %v", n, size, err)
	}
	if _, _, err := DecodeBatchHeader(buf[:Alignment]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decode of the first page only: %v", err)
	}
	got, crc2, err := DecodeBatchHeader(append(slices.Clone(buf), 0xAA))
	if err != nil || crc2 != crc || !slices.Equal(got.IDs, h.IDs) {
		t.Fatalf("decode: %v", err)
	}
	if h.ExtentBytes() != 8192+4*300*4096+AlignUp(64+4*300*4) {
		t.Fatalf("extent %d", h.ExtentBytes())
	}
}

func TestBatchHeaderEncodeRejects(t *testing.T) {
	dupe := sampleBatchHeader()
	dupe.IDs[2] = dupe.IDs[0]
	cases := map[string]struct {
		mutate func(h *BatchHeader)
		field  string
	}{
		"no blocks":         {func(h *BatchHeader) { h.IDs = nil }, "field blocks"},
		"too many blocks":   {func(h *BatchHeader) { h.IDs = make([]BlockID, MaxBatchBlocks+1) }, "field blocks"},
		"bad layout":        {func(h *BatchHeader) { h.Layout.TensorsPerShard = 3 }, "layout"},
		"zero shards":       {func(h *BatchHeader) { h.Layout.Shards = 0 }, "layout"},
		"segment 0":         {func(h *BatchHeader) { h.Segment = 0 }, "field segment"},
		"seq overflow":      {func(h *BatchHeader) { h.FirstSeq = math.MaxUint64 - 1 }, "field first seq"},
		"extent over bound": {func(h *BatchHeader) { h.Layout = Layout{Shards: 64, TensorsPerShard: 1, ShardBytes: 8 << 20} }, "field extent bytes"},
		"zero id":           {func(h *BatchHeader) { h.IDs[1] = BlockID{} }, "field ids"},
		"repeated id":       {func(h *BatchHeader) { h.IDs = dupe.IDs }, "field ids"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h := sampleBatchHeader()
			c.mutate(h)
			buf := make([]byte, BatchHeaderSize(max(1, min(len(h.IDs), MaxBatchBlocks))))
			_, err := EncodeBatchHeader(buf, h)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("encode: %v, want ErrInvalid naming %q", err, c.field)
			}
		})
	}
	// The last sequence number may be MaxUint64 itself.
	h := sampleBatchHeader()
	h.FirstSeq = math.MaxUint64 - 2
	encodeBatchHeader(t, h)
	// A buffer of another size.
	for _, n := range []int64{0, 4095, 4097, 8192} {
		if _, err := EncodeBatchHeader(make([]byte, n), sampleBatchHeader()); !errors.Is(err, ErrInvalid) {
			t.Fatalf("buffer of %d bytes: %v", n, err)
		}
	}
}

// forgeBatchHeader applies mutate to an encoded sample header and re-seals its CRC, as a buggy
// or malicious writer could: the decoder must still refuse the field. (A block count the
// sample's bytes cannot checksum is left unsealed: Peek refuses it first.)
func forgeBatchHeader(t *testing.T, mutate func(b []byte)) []byte {
	t.Helper()
	buf, _ := encodeBatchHeader(t, sampleBatchHeader())
	mutate(buf)
	if n := int(binary.LittleEndian.Uint32(buf[batchOffBlocks:])); n >= 1 && n <= 3 {
		binary.LittleEndian.PutUint32(buf[batchOffCRC:], batchHeaderCRC(buf, n))
	}
	return buf
}

func TestBatchHeaderDecodeRejects(t *testing.T) {
	le := binary.LittleEndian
	cases := map[string]struct {
		mutate func(b []byte)
		field  string
	}{
		"magic":               {func(b []byte) { b[0] = 'X' }, "field magic"},
		"version":             {func(b []byte) { le.PutUint16(b[recOffVersion:], 2) }, "field version"},
		"type block":          {func(b []byte) { b[recOffType] = byte(RecordBlock) }, "field type"},
		"type unknown":        {func(b []byte) { b[recOffType] = 9 }, "field type"},
		"blocks 0":            {func(b []byte) { le.PutUint32(b[batchOffBlocks:], 0) }, "field blocks"},
		"blocks over max":     {func(b []byte) { le.PutUint32(b[batchOffBlocks:], MaxBatchBlocks+1) }, "field blocks"},
		"blocks huge":         {func(b []byte) { le.PutUint32(b[batchOffBlocks:], math.MaxUint32) }, "field blocks"},
		"blocks disagree":     {func(b []byte) { le.PutUint32(b[batchOffBlocks:], 2) }, "field extent bytes"},
		"resealed id change":  {func(b []byte) { b[batchOffIDs+20] ^= 1 }, ""},
		"compression":         {func(b []byte) { b[recOffCompress] = byte(CompressionLZ4) }, "field compression"},
		"shards 0":            {func(b []byte) { le.PutUint32(b[batchOffShards:], 0) }, "field shards"},
		"shards over max":     {func(b []byte) { le.PutUint32(b[batchOffShards:], MaxShards+1) }, "field shards"},
		"tensors 0":           {func(b []byte) { le.PutUint32(b[batchOffTensors:], 0) }, "field tensors"},
		"tensors over max":    {func(b []byte) { le.PutUint32(b[batchOffTensors:], MaxTensorsPerShard+1) }, "field tensors"},
		"shard bytes 0":       {func(b []byte) { le.PutUint64(b[batchOffShardBytes:], 0) }, "field shard bytes"},
		"shard bytes huge":    {func(b []byte) { le.PutUint64(b[batchOffShardBytes:], math.MaxUint64) }, "field shard bytes"},
		"tensors not divide":  {func(b []byte) { le.PutUint32(b[batchOffTensors:], 3) }, "layout"},
		"segment 0":           {func(b []byte) { le.PutUint64(b[batchOffSegment:], 0) }, "field segment"},
		"first seq overflows": {func(b []byte) { le.PutUint64(b[batchOffFirstSeq:], math.MaxUint64) }, "field first seq"},
		"extent":              {func(b []byte) { le.PutUint64(b[batchOffExtent:], 57344+4096) }, "field extent bytes"},
		"extent over bound": {func(b []byte) {
			// 3 blocks of 64 shards of 8 MiB: every field in range, the extent over 1 GiB.
			le.PutUint32(b[batchOffShards:], 64)
			le.PutUint32(b[batchOffTensors:], 1)
			le.PutUint64(b[batchOffShardBytes:], 8<<20)
			le.PutUint64(b[batchOffExtent:], uint64(4096+64*3*(8<<20)+4096))
		}, "field extent bytes"},
		"reserved":     {func(b []byte) { b[batchOffReserved+7] = 1 }, "field reserved"},
		"padding":      {func(b []byte) { b[4000] = 1 }, "field padding"},
		"padding end":  {func(b []byte) { b[4095] = 0x80 }, "field padding"},
		"zero id":      {func(b []byte) { clear(b[batchOffIDs+16 : batchOffIDs+32]) }, "field ids"},
		"repeated id":  {func(b []byte) { copy(b[batchOffIDs+32:batchOffIDs+48], b[batchOffIDs:batchOffIDs+16]) }, "field ids"},
		"not a header": {func(b []byte) { clear(b) }, "field magic"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			buf := forgeBatchHeader(t, c.mutate)
			_, _, err := DecodeBatchHeader(buf)
			if c.field == "" {
				if err != nil {
					t.Fatalf("re-sealed id change refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("decode: %v, want ErrCorrupt naming %q", err, c.field)
			}
		})
	}
	// A wrong CRC (not resealed), and short sources: under the 128 bytes Peek needs, and under H.
	buf, _ := encodeBatchHeader(t, sampleBatchHeader())
	buf[batchOffCRC+2] ^= 0x40
	if _, _, err := DecodeBatchHeader(buf); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "field crc") {
		t.Fatalf("decode with a wrong crc: %v", err)
	}
	buf[batchOffCRC+2] ^= 0x40
	for _, n := range []int{0, 1, 127, 128, 4095} {
		if _, _, err := DecodeBatchHeader(buf[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode of %d bytes: %v", n, err)
		}
	}
	for _, n := range []int{0, 1, 127} {
		if _, _, err := PeekBatchHeader(buf[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("peek of %d bytes: %v", n, err)
		}
	}
}

// TestBatchEveryBitFlipDetected flips every bit of an encoded batch header and commit block:
// decoding must fail with ErrCorrupt (the CRCs cover the fields and tables, the zero checks the
// reserved bytes and the padding).
func TestBatchEveryBitFlipDetected(t *testing.T) {
	h := sampleBatchHeader()
	hb, crc := encodeBatchHeader(t, h)
	cb := encodeBatchCommit(t, sampleBatchCommit(h, crc))
	for i := range hb {
		for bit := range 8 {
			hb[i] ^= 1 << bit
			_, _, err := DecodeBatchHeader(hb)
			hb[i] ^= 1 << bit
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("header: flip of byte %d bit %d: %v, want ErrCorrupt", i, bit, err)
			}
		}
	}
	for i := range cb {
		for bit := range 8 {
			cb[i] ^= 1 << bit
			_, err := DecodeBatchCommit(cb, h, crc)
			cb[i] ^= 1 << bit
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("commit: flip of byte %d bit %d: %v, want ErrCorrupt", i, bit, err)
			}
		}
	}
}

func TestBatchCommitGoldenAndRoundTrip(t *testing.T) {
	h := sampleBatchHeader()
	_, crc := encodeBatchHeader(t, h)
	c := sampleBatchCommit(h, crc)
	buf := encodeBatchCommit(t, c)
	golden(t, "batch_commit.golden", buf)
	got, err := DecodeBatchCommit(buf, h, crc)
	if err != nil {
		t.Fatal(err)
	}
	if got.Segment != c.Segment || got.Generation != c.Generation || got.FirstSeq != c.FirstSeq || got.Blocks != 3 ||
		got.Shards != 2 || got.HeaderCRC != crc || !slices.Equal(got.ShardCRCs, c.ShardCRCs) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, *c)
	}
	// Block 1's shards in shard order: shard 0 at table index 1, shard 1 at index 3 + 1.
	if b1 := got.BlockCRCs(1); !slices.Equal(b1, []uint32{0xC0000001, 0xC0000101}) {
		t.Fatalf("BlockCRCs(1) = %#x", b1)
	}
	// Trailing bytes are ignored.
	if _, err := DecodeBatchCommit(append(slices.Clone(buf), 1, 2, 3), h, crc); err != nil {
		t.Fatal(err)
	}
}

// TestBatchCommitMustMatchHeader: a commit block that is valid on its own but belongs to another
// header (a torn batch over an older one, a recycled file, another segment) is refused.
func TestBatchCommitMustMatchHeader(t *testing.T) {
	h := sampleBatchHeader()
	_, crc := encodeBatchHeader(t, h)
	cases := map[string]struct {
		mutate func(c *BatchCommit)
		field  string
	}{
		"segment":    {func(c *BatchCommit) { c.Segment++ }, "field segment"},
		"generation": {func(c *BatchCommit) { c.Generation ^= 1 }, "field generation"},
		"first seq":  {func(c *BatchCommit) { c.FirstSeq++ }, "field first seq"},
		"header crc": {func(c *BatchCommit) { c.HeaderCRC ^= 0x100 }, "field header crc"},
		// A commit block written for another N or L (same size C): its CRC does not cover the
		// table the header implies.
		"other blocks": {func(c *BatchCommit) { c.Blocks = 2; c.ShardCRCs = c.ShardCRCs[:4] }, "field crc"},
		"other shards": {func(c *BatchCommit) { c.Shards = 1; c.ShardCRCs = c.ShardCRCs[:3] }, "field crc"},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			c := sampleBatchCommit(h, crc)
			m.mutate(c)
			buf := encodeBatchCommit(t, c)
			_, err := DecodeBatchCommit(buf, h, crc)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), m.field) {
				t.Fatalf("decode: %v, want ErrCorrupt naming %q", err, m.field)
			}
		})
	}
	// Counts forged under a valid CRC are refused by the counts themselves.
	le := binary.LittleEndian
	for _, f := range []struct {
		off   int
		field string
	}{{commitOffBlocks, "field blocks"}, {commitOffShards, "field shards"}} {
		buf := encodeBatchCommit(t, sampleBatchCommit(h, crc))
		le.PutUint32(buf[f.off:], 1)
		le.PutUint32(buf[commitOffCRC:], commitCRC(buf, 6))
		if _, err := DecodeBatchCommit(buf, h, crc); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), f.field) {
			t.Fatalf("forged %s: %v", f.field, err)
		}
	}
	// The same commit block is refused against a header with another id (another header CRC).
	other := sampleBatchHeader()
	other.IDs[1] = testID(0x77)
	_, otherCRC := encodeBatchHeader(t, other)
	if _, err := DecodeBatchCommit(encodeBatchCommit(t, sampleBatchCommit(h, crc)), other, otherCRC); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("commit of another header: %v", err)
	}
}

func TestBatchCommitRejects(t *testing.T) {
	h := sampleBatchHeader()
	_, crc := encodeBatchHeader(t, h)
	enc := map[string]func(c *BatchCommit){
		"blocks 0":        func(c *BatchCommit) { c.Blocks, c.ShardCRCs = 0, nil },
		"blocks over max": func(c *BatchCommit) { c.Blocks = MaxBatchBlocks + 1 },
		"shards 0":        func(c *BatchCommit) { c.Shards, c.ShardCRCs = 0, nil },
		"shards over max": func(c *BatchCommit) { c.Shards = MaxShards + 1 },
		"table length":    func(c *BatchCommit) { c.ShardCRCs = c.ShardCRCs[:5] },
		"segment 0":       func(c *BatchCommit) { c.Segment = 0 },
	}
	for name, mutate := range enc {
		t.Run("encode "+name, func(t *testing.T) {
			c := sampleBatchCommit(h, crc)
			mutate(c)
			if err := EncodeBatchCommit(make([]byte, 4096), c); !errors.Is(err, ErrInvalid) {
				t.Fatalf("encode: %v, want ErrInvalid", err)
			}
		})
	}
	if err := EncodeBatchCommit(make([]byte, 8192), sampleBatchCommit(h, crc)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("encode into a buffer of another size: %v", err)
	}

	le := binary.LittleEndian
	good := encodeBatchCommit(t, sampleBatchCommit(h, crc))
	reseal := func(b []byte) { le.PutUint32(b[commitOffCRC:], commitCRC(b, 6)) }
	dec := map[string]struct {
		mutate func(b []byte)
		field  string
	}{
		"magic":        {func(b []byte) { b[7] = 'X' }, "field magic"},
		"crc":          {func(b []byte) { b[commitOffCRC+1] ^= 4 }, "field crc"},
		"table":        {func(b []byte) { b[commitOffTable+5] ^= 4 }, "field crc"},
		"reserved":     {func(b []byte) { b[commitOffReserved+3] = 1; reseal(b) }, "field reserved"},
		"padding":      {func(b []byte) { b[4000] = 1 }, "field padding"},
		"zeros":        {func(b []byte) { clear(b) }, "field magic"},
		"header block": {func(b []byte) { copy(b, "UCMR\x01\x00\x03\x00") }, "field magic"},
	}
	for name, c := range dec {
		t.Run("decode "+name, func(t *testing.T) {
			buf := slices.Clone(good)
			c.mutate(buf)
			_, err := DecodeBatchCommit(buf, h, crc)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("decode: %v, want ErrCorrupt naming %q", err, c.field)
			}
		})
	}
	for _, n := range []int{0, 63, 64, 4095} {
		if _, err := DecodeBatchCommit(good[:n], h, crc); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode of %d bytes: %v", n, err)
		}
	}
	// A header that is not one (no ids, too many shards) is the caller's mistake.
	for _, bad := range []*BatchHeader{{Layout: h.Layout}, {IDs: h.IDs, Layout: Layout{Shards: MaxShards + 1}}} {
		if _, err := DecodeBatchCommit(good, bad, crc); !errors.Is(err, ErrInvalid) {
			t.Fatalf("header %+v: %v", bad, err)
		}
	}
}

func TestBatchSegmentHeaderGolden(t *testing.T) {
	h := sampleSegmentHeader()
	h.Features = FeatureSidecars | FeatureBatchRecords
	buf := make([]byte, SegmentHeaderSize)
	if err := EncodeSegmentHeader(buf, h); err != nil {
		t.Fatal(err)
	}
	golden(t, "segment_header_batches.golden", buf)
	got, err := DecodeSegmentHeader(buf)
	if err != nil || got != *h {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// The next bit is still unknown: refused on both sides.
	h.Features |= 1 << 2
	if err := EncodeSegmentHeader(buf, h); !errors.Is(err, ErrInvalid) {
		t.Fatalf("encode with an unknown flag: %v", err)
	}
	le := binary.LittleEndian
	le.PutUint32(buf[segOffFeatures:], h.Features)
	le.PutUint32(buf[headerCRCOffset:], Checksum(buf[:headerCRCOffset]))
	if _, err := DecodeSegmentHeader(buf); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "features") {
		t.Fatalf("decode with an unknown flag: %v", err)
	}
}

// sampleBatchFooter is the sample footer's two block records followed by the sample batch.
func sampleBatchFooter(t testing.TB) (uint64, uint64, int64, []FooterEntry) {
	seg, gen, _, entries := sampleFooter()
	h := sampleBatchHeader()
	_, crc := encodeBatchHeader(t, h)
	off := entries[1].Offset + entries[1].Length
	entries = append(entries, FooterEntry{ID: h.IDs[0], Offset: off, Length: h.ExtentBytes(), Seq: h.FirstSeq, HeaderCRC: crc, Type: RecordBatch})
	return seg, gen, off + h.ExtentBytes(), entries
}

func TestBatchFooterGolden(t *testing.T) {
	seg, gen, end, entries := sampleBatchFooter(t)
	buf, err := EncodeFooter(seg, gen, end, entries)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "footer_batch.golden", buf)
	tr, err := DecodeTrailer(buf, end+int64(len(buf)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeFooterEntries(buf, tr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, entries) {
		t.Fatalf("entries:\n got %+v\nwant %+v", got, entries)
	}
}

func TestBatchFooterEntryRejects(t *testing.T) {
	for name, c := range map[string]struct {
		kind   SidecarKind
		length int64
		field  string
	}{
		"kind":            {kind: 1, length: 57344, field: "field kind"},
		"unaligned":       {length: 57344 + 512, field: "field length"},
		"under 3 pages":   {length: 2 * Alignment, field: "field length"},
		"over the extent": {length: MaxBatchExtent + Alignment, field: "field length"},
	} {
		t.Run(name, func(t *testing.T) {
			seg, gen, _, entries := sampleBatchFooter(t)
			e := &entries[2]
			e.Kind, e.Length = c.kind, c.length
			end := AlignUp(e.Offset + e.Length)
			buf, err := EncodeFooter(seg, gen, end, entries)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := DecodeTrailer(buf, end+int64(len(buf)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeFooterEntries(buf, tr); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("decode: %v, want ErrCorrupt naming %q", err, c.field)
			}
		})
	}
}
