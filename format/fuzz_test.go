package format

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

// FuzzRecordRoundTrip encodes a record header from arbitrary fields. The encoder must accept
// exactly the valid ones (ErrInvalid otherwise); what it accepts must decode to the same fields
// and checksum; and flipping any bits of any single byte of the encoding must fail decoding with
// ErrCorrupt (the header checksum covers all 4 KiB).
//
// Memory is bounded whatever the input: the shard count is reduced to [0, MaxShards+1] before
// the checksum table is allocated, and the header is always RecordHeaderSize bytes.
func FuzzRecordRoundTrip(f *testing.F) {
	h := sampleRecordHeader()
	f.Add(h.ID[:], h.Segment, h.Generation, h.Seq, uint16(h.Layout.Shards), uint32(h.Layout.TensorsPerShard), uint32(h.Layout.ShardBytes), uint32(0xdeadbeef), byte(RecordBlock), uint16(0), byte(1))
	f.Add([]byte("0123456789abcdef"), uint64(1), uint64(0), uint64(0), uint16(1), uint32(1), uint32(1), uint32(0), byte(RecordBlock), uint16(4095), byte(0x80))
	f.Add([]byte{}, uint64(1<<63), uint64(1<<64-1), uint64(1<<64-1), uint16(MaxShards), uint32(2), uint32(65536), uint32(7), byte(RecordBlock), uint16(4092), byte(0xff))
	f.Add([]byte{1}, uint64(9), uint64(9), uint64(9), uint16(80), uint32(3), uint32(3*128*64*2), uint32(1), byte(RecordBlock), uint16(128+4*79), byte(2))
	// Invalid: segment 0, zero shards, too many shards, tensors not dividing shard bytes,
	// payload over 1 GiB, wrong type.
	f.Add([]byte{2}, uint64(0), uint64(1), uint64(1), uint16(1), uint32(1), uint32(4096), uint32(1), byte(RecordBlock), uint16(0), byte(1))
	f.Add([]byte{3}, uint64(1), uint64(1), uint64(1), uint16(0), uint32(1), uint32(4096), uint32(1), byte(RecordBlock), uint16(0), byte(1))
	f.Add([]byte{4}, uint64(1), uint64(1), uint64(1), uint16(MaxShards+1), uint32(1), uint32(4096), uint32(1), byte(RecordBlock), uint16(0), byte(1))
	f.Add([]byte{5}, uint64(1), uint64(1), uint64(1), uint16(2), uint32(3), uint32(4096), uint32(1), byte(RecordBlock), uint16(0), byte(1))
	f.Add([]byte{6}, uint64(1), uint64(1), uint64(1), uint16(8), uint32(1), uint32(MaxShardBytes), uint32(1), byte(RecordBlock), uint16(0), byte(1))
	f.Add([]byte{7}, uint64(1), uint64(1), uint64(1), uint16(1), uint32(1), uint32(4096), uint32(1), byte(2), uint16(0), byte(1))
	f.Fuzz(func(t *testing.T, id []byte, seg, gen, seq uint64, shards uint16, tensors, shardBytes, crcSeed uint32, typ byte, flipAt uint16, flipMask byte) {
		h := &RecordHeader{Type: RecordType(typ), Compression: CompressionNone, Segment: seg, Generation: gen, Seq: seq,
			Layout: Layout{Shards: int(shards) % (MaxShards + 2), TensorsPerShard: int(tensors), ShardBytes: int64(shardBytes)}}
		copy(h.ID[:], id)
		h.ShardCRCs = make([]uint32, h.Layout.Shards)
		for i := range h.ShardCRCs {
			h.ShardCRCs[i] = crcSeed*uint32(2*i+1) ^ uint32(i)<<24
		}
		buf := make([]byte, RecordHeaderSize)
		crc, err := EncodeRecordHeader(buf, h)
		valid := h.Layout.Validate() == nil && seg != 0 && h.Type == RecordBlock
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("encode error does not wrap ErrInvalid: %v", err)
			}
			if valid {
				t.Fatalf("valid header %+v refused: %v", h, err)
			}
			return
		}
		if !valid {
			t.Fatalf("invalid header %+v encoded", h)
		}
		if got := binary.LittleEndian.Uint32(buf[headerCRCOffset:]); got != crc {
			t.Fatalf("returned crc %#x, stored %#x", crc, got)
		}

		got, crc2, err := DecodeRecordHeader(buf)
		if err != nil {
			t.Fatalf("encoded header does not decode: %v", err)
		}
		if crc2 != crc || got.Type != h.Type || got.Compression != h.Compression || got.ID != h.ID || got.Segment != h.Segment ||
			got.Generation != h.Generation || got.Seq != h.Seq || got.Layout != h.Layout || !slices.Equal(got.ShardCRCs, h.ShardCRCs) {
			t.Fatalf("round trip:\n got %+v crc %#x\nwant %+v crc %#x", got, crc2, *h, crc)
		}
		// Bytes past the header are ignored; a short buffer is corrupt.
		if got2, crc3, err := DecodeRecordHeader(append(slices.Clone(buf), 0xAA, 0x55)); err != nil || crc3 != crc || got2.Seq != h.Seq {
			t.Fatalf("decode with trailing bytes: %v", err)
		}
		if _, _, err := DecodeRecordHeader(buf[:int(flipAt)%RecordHeaderSize]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode of %d bytes: %v, want ErrCorrupt", int(flipAt)%RecordHeaderSize, err)
		}

		mask := flipMask
		if mask == 0 {
			mask = 1
		}
		at := int(flipAt) % RecordHeaderSize
		buf[at] ^= mask
		if _, _, err := DecodeRecordHeader(buf); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d ^= %#02x: decode = %v, want ErrCorrupt", at, mask, err)
		}
	})
}

// FuzzDecodeBatchHeader: whatever the bytes, DecodeBatchHeader returns a header or an error
// wrapping ErrCorrupt, never panics, and allocates at most MaxBatchBlocks ids. A header it
// accepts agrees with PeekBatchHeader and re-encodes to exactly the bytes it was decoded from
// (the CRC, the reserved bytes and the padding leave no byte unchecked).
func FuzzDecodeBatchHeader(f *testing.F) {
	h := sampleBatchHeader()
	buf, _ := encodeBatchHeader(f, h)
	f.Add(buf)
	h.IDs = make([]BlockID, 300)
	for b := range h.IDs {
		h.IDs[b] = testID(byte(b))
		h.IDs[b][15] = byte(b >> 8)
	}
	big, _ := encodeBatchHeader(f, h)
	f.Add(big)
	rec := make([]byte, RecordHeaderSize)
	if _, err := EncodeRecordHeader(rec, sampleRecordHeader()); err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add(buf[:128])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, crc, err := DecodeBatchHeader(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decode error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		n, size, err := PeekBatchHeader(b)
		if err != nil || n != len(h.IDs) || size != BatchHeaderSize(n) {
			t.Fatalf("peek %d %d %v disagrees with decode of %d ids", n, size, err, len(h.IDs))
		}
		out := make([]byte, size)
		crc2, err := EncodeBatchHeader(out, &h)
		if err != nil {
			t.Fatalf("decoded header does not re-encode: %v", err)
		}
		if crc2 != crc || !bytes.Equal(out, b[:size]) {
			t.Fatal("decoded header re-encodes to other bytes")
		}
		if h.CommitOffset()+BatchCommitSize(n, h.Layout.Shards) != h.ExtentBytes() || h.ExtentBytes() > MaxBatchExtent {
			t.Fatalf("extent %d commit at %d", h.ExtentBytes(), h.CommitOffset())
		}
	})
}

// FuzzPeekBatchHeader: PeekBatchHeader never panics, and what it accepts is a block count in
// [1, MaxBatchBlocks] with its header size: a scanner can size its next read from it.
func FuzzPeekBatchHeader(f *testing.F) {
	buf, _ := encodeBatchHeader(f, sampleBatchHeader())
	f.Add(buf[:128])
	f.Add(buf[:127])
	f.Add(make([]byte, 128))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, size, err := PeekBatchHeader(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("peek error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if n < 1 || n > MaxBatchBlocks || size != BatchHeaderSize(n) || size > BatchHeaderSize(MaxBatchBlocks) {
			t.Fatalf("peek accepted %d blocks, %d header bytes", n, size)
		}
	})
}

// FuzzDecodeBatchCommit: against a header of any shape (N and L may be out of range), whatever
// the bytes, DecodeBatchCommit never panics; it refuses an impossible header with ErrInvalid and
// bad bytes with ErrCorrupt; what it accepts matches the header and re-encodes to its bytes.
func FuzzDecodeBatchCommit(f *testing.F) {
	h := sampleBatchHeader()
	_, crc := encodeBatchHeader(f, h)
	good := encodeBatchCommit(f, sampleBatchCommit(h, crc))
	f.Add(good, uint16(3), uint16(2), crc)
	f.Add(good, uint16(3), uint16(2), crc+1)
	f.Add(good, uint16(2), uint16(3), crc)
	f.Add(good, uint16(0), uint16(2), crc)
	f.Add(good[:100], uint16(3), uint16(2), crc)
	f.Fuzz(func(t *testing.T, b []byte, blocks, shards uint16, headerCRC uint32) {
		h := sampleBatchHeader()
		h.IDs = make([]BlockID, int(blocks)%(MaxBatchBlocks+2))
		h.Layout.Shards = int(shards) % (MaxShards + 2)
		n, l := len(h.IDs), h.Layout.Shards
		possible := n >= 1 && n <= MaxBatchBlocks && l >= 1 && l <= MaxShards
		c, err := DecodeBatchCommit(b, h, headerCRC)
		if err != nil {
			if possible && !errors.Is(err, ErrCorrupt) || !possible && !errors.Is(err, ErrInvalid) {
				t.Fatalf("header of %d blocks, %d shards: %v", n, l, err)
			}
			return
		}
		if !possible {
			t.Fatalf("commit accepted for a header of %d blocks, %d shards", n, l)
		}
		if c.Segment != h.Segment || c.Generation != h.Generation || c.FirstSeq != h.FirstSeq || c.Blocks != n ||
			c.Shards != l || c.HeaderCRC != headerCRC || len(c.ShardCRCs) != n*l {
			t.Fatalf("accepted commit %+v does not match its header", c)
		}
		out := make([]byte, BatchCommitSize(n, l))
		if err := EncodeBatchCommit(out, &c); err != nil || !bytes.Equal(out, b[:len(out)]) {
			t.Fatalf("decoded commit does not re-encode to its bytes: %v", err)
		}
	})
}
