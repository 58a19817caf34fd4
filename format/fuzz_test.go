package format

import (
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
