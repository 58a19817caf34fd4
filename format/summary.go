package format

import (
	"bytes"
	"encoding/binary"
)

// Segment summary: a file written beside a sealed segment of a shared tier, by the instance
// that owns it, before the segment is first published. It carries everything another
// instance's foreign index needs about every record of the segment (where it is, its layout,
// its checksums, its batch), so that indexing a published segment is one read of one small
// file instead of the footer and one record header per record. It is a cache of what the
// segment's footer and headers say: a reader that finds it missing, of another segment or
// generation, or failing any check, reads the footer and headers instead. A summary that lies
// cannot give wrong bytes: every load checks the payload against the checksums it names.
//
//	0:        header                      SummaryHeaderSize bytes
//	          entry 0 .. entry n-1        variable, back to back
//
// Header (SummaryHeaderSize = 128 bytes):
//
//	offset size field
//	     0    8 magic "UCMGOSUM"
//	     8    4 summary version (uint32 LE; SummaryVersion)
//	    12    4 entry count n (uint32 LE)
//	    16   16 instance id of the segment's owner
//	    32   32 schema fingerprint of the owner's store
//	    64    8 segment number (uint64 LE)
//	    72    8 segment generation (uint64 LE)
//	    80    8 segment file size in bytes, footer included (uint64 LE)
//	    88    8 entry bytes: the size of the file after the header (uint64 LE)
//	    96    4 CRC32C of the entry bytes (uint32 LE)
//	   100   24 zero (written zero, ignored by readers of this version)
//	   124    4 CRC32C of header bytes [0, 124) (uint32 LE)
//
// Entry (SummaryEntryFixed + shards × 4 bytes, or shards × 12 when compressed): one per block
// or sidecar, in the order of the segment (a batch record gives one entry per block).
//
//	offset size field
//	     0   16 block id
//	    16    8 record offset in the segment (uint64 LE, Alignment-aligned; a batch's offset)
//	    24    8 sequence number (uint64 LE)
//	    32    4 record header CRC32C (uint32 LE; a batch: the batch header's)
//	    36    1 record type (1 = block, 2 = sidecar, 3 = block of a batch)
//	    37    1 compression (record header byte 7; 0 for a batch)
//	    38    2 sidecar kind (uint16 LE; 0 unless a sidecar)
//	    40    4 shards (uint32 LE, [1, MaxShards]; compressed: [1, MaxCompressedShards])
//	    44    4 tensors per shard (uint32 LE)
//	    48    8 shard bytes (uint64 LE)
//	    56    4 blocks of the batch (uint32 LE; 0 unless a batch, else [1, MaxBatchBlocks])
//	    60    4 position in the batch (uint32 LE; < blocks of the batch)
//	    64      shards × { raw CRC32C }, or compressed: shards × { raw CRC32C, stored length,
//	            stored CRC32C } (uint32 LE each)
//
// Part of the on-disk format: do not change without bumping SummaryVersion.
const (
	SummaryHeaderSize = 128
	SummaryEntryFixed = 64
	SummaryVersion    = 1
	// MaxSummaryBytes bounds a summary file; a reader refuses a larger one before reading it.
	MaxSummaryBytes = 256 << 20
	// SummaryExt is the file-name extension of a summary beside its segment.
	SummaryExt = ".sum"

	sumMagic        = "UCMGOSUM"
	sumOffVersion   = 8
	sumOffCount     = 12
	sumOffInstance  = 16
	sumOffSchema    = 32
	sumOffSegment   = 64
	sumOffGen       = 72
	sumOffSize      = 80
	sumOffBodyBytes = 88
	sumOffBodyCRC   = 96
	sumOffCRC       = 124

	seOffOffset      = 16
	seOffSeq         = 24
	seOffHeaderCRC   = 32
	seOffType        = 36
	seOffCompression = 37
	seOffKind        = 38
	seOffShards      = 40
	seOffTensors     = 44
	seOffShardBytes  = 48
	seOffBatchBlocks = 56
	seOffBatchPos    = 60
)

// Summary is a decoded segment summary.
type Summary struct {
	Instance   InstanceID
	Schema     Fingerprint
	Segment    uint64
	Generation uint64
	Size       int64 // the segment file's size
	Entries    []SummaryEntry
}

// SummaryEntry describes one block or sidecar of a summarized segment: what an index entry of
// it holds.
type SummaryEntry struct {
	ID          BlockID
	Offset      int64
	Seq         uint64
	HeaderCRC   uint32
	Type        RecordType // RecordBlock, RecordSidecar, or RecordBatch for a block of a batch
	Kind        SidecarKind
	Layout      Layout
	Compression Compression
	ShardCRCs   []uint32
	StoredLens  []uint32 // compressed only
	StoredCRCs  []uint32 // compressed only
	BatchBlocks int      // RecordBatch only
	BatchPos    int
}

func summaryEntrySize(shards int, c Compression) int {
	if c != CompressionNone {
		return SummaryEntryFixed + 12*shards
	}
	return SummaryEntryFixed + 4*shards
}

// summaryEntryProblem describes what is inconsistent in e for a segment of size bytes ("" if
// nothing).
func summaryEntryProblem(e *SummaryEntry, size int64) string {
	if err := e.Layout.Validate(); err != nil {
		return err.Error()
	}
	shards := e.Layout.Shards
	switch {
	case e.Offset < SegmentHeaderSize || e.Offset%Alignment != 0 || e.Offset+RecordHeaderSize > size:
		return "field offset: not an aligned record offset inside the segment"
	case len(e.ShardCRCs) != shards:
		return "shard checksums: not one per shard"
	case e.Compression == CompressionNone && (e.StoredLens != nil || e.StoredCRCs != nil):
		return "stored lengths of a raw record"
	case e.Compression != CompressionNone && (len(e.StoredLens) != shards || len(e.StoredCRCs) != shards || shards > MaxCompressedShards):
		return "field compression: stored lengths not one per shard"
	case e.Compression > CompressionPacked:
		return "field compression: unknown code"
	}
	switch e.Type {
	case RecordBlock:
		if e.Kind != 0 || e.BatchBlocks != 0 || e.BatchPos != 0 {
			return "block with a kind or a batch"
		}
	case RecordSidecar:
		if !ValidSidecarKind(e.Kind) || e.BatchBlocks != 0 || e.BatchPos != 0 {
			return "field kind: not a valid sidecar kind, or a sidecar in a batch"
		}
	case RecordBatch:
		if e.Kind != 0 || e.Compression != CompressionNone || e.BatchBlocks < 1 || e.BatchBlocks > MaxBatchBlocks || e.BatchPos < 0 || e.BatchPos >= e.BatchBlocks {
			return "field batch: position, blocks, kind or compression out of range"
		}
	default:
		return "field type: unknown record type"
	}
	return ""
}

// EncodeSummary returns the bytes of s. An entry that does not check (see DecodeSummary) is an
// error wrapping ErrInvalid naming it.
func EncodeSummary(s *Summary) ([]byte, error) {
	le := binary.LittleEndian
	n := SummaryHeaderSize
	for i := range s.Entries {
		e := &s.Entries[i]
		if p := summaryEntryProblem(e, s.Size); p != "" {
			return nil, errorf(ErrInvalid, "summary of segment %d: entry %d (%s): %s", s.Segment, i, e.ID, p)
		}
		n += summaryEntrySize(e.Layout.Shards, e.Compression)
	}
	if n > MaxSummaryBytes || len(s.Entries) > 1<<32-1 {
		return nil, errorf(ErrInvalid, "summary of segment %d: %d bytes, more than %d", s.Segment, n, MaxSummaryBytes)
	}
	buf := make([]byte, n)
	off := SummaryHeaderSize
	for i := range s.Entries {
		e := &s.Entries[i]
		b := buf[off:]
		copy(b, e.ID[:])
		le.PutUint64(b[seOffOffset:], uint64(e.Offset))
		le.PutUint64(b[seOffSeq:], e.Seq)
		le.PutUint32(b[seOffHeaderCRC:], e.HeaderCRC)
		b[seOffType] = byte(e.Type)
		b[seOffCompression] = byte(e.Compression)
		le.PutUint16(b[seOffKind:], uint16(e.Kind))
		le.PutUint32(b[seOffShards:], uint32(e.Layout.Shards))
		le.PutUint32(b[seOffTensors:], uint32(e.Layout.TensorsPerShard))
		le.PutUint64(b[seOffShardBytes:], uint64(e.Layout.ShardBytes))
		le.PutUint32(b[seOffBatchBlocks:], uint32(e.BatchBlocks))
		le.PutUint32(b[seOffBatchPos:], uint32(e.BatchPos))
		t := b[SummaryEntryFixed:]
		for k, c := range e.ShardCRCs {
			if e.Compression == CompressionNone {
				le.PutUint32(t[4*k:], c)
				continue
			}
			le.PutUint32(t[12*k:], c)
			le.PutUint32(t[12*k+4:], e.StoredLens[k])
			le.PutUint32(t[12*k+8:], e.StoredCRCs[k])
		}
		off += summaryEntrySize(e.Layout.Shards, e.Compression)
	}
	h := buf[:SummaryHeaderSize]
	copy(h, sumMagic)
	le.PutUint32(h[sumOffVersion:], SummaryVersion)
	le.PutUint32(h[sumOffCount:], uint32(len(s.Entries)))
	copy(h[sumOffInstance:], s.Instance[:])
	copy(h[sumOffSchema:], s.Schema[:])
	le.PutUint64(h[sumOffSegment:], s.Segment)
	le.PutUint64(h[sumOffGen:], s.Generation)
	le.PutUint64(h[sumOffSize:], uint64(s.Size))
	le.PutUint64(h[sumOffBodyBytes:], uint64(n-SummaryHeaderSize))
	le.PutUint32(h[sumOffBodyCRC:], Checksum(buf[SummaryHeaderSize:]))
	le.PutUint32(h[sumOffCRC:], Checksum(h[:sumOffCRC]))
	return buf, nil
}

// DecodeSummary checks and decodes a whole summary file. Any failed check (magic, version,
// either checksum, a length that does not match, an entry out of range) is an error wrapping
// ErrCorrupt naming the field and, for an entry, its position and block. It never panics;
// it allocates the entry table only after checking the count against the length, and each
// checksum table after checking its shard count.
func DecodeSummary(src []byte) (*Summary, error) {
	if len(src) < SummaryHeaderSize {
		return nil, errorf(ErrCorrupt, "summary: %d bytes, want at least %d", len(src), SummaryHeaderSize)
	}
	if len(src) > MaxSummaryBytes {
		return nil, errorf(ErrCorrupt, "summary: %d bytes, more than %d", len(src), MaxSummaryBytes)
	}
	h := src[:SummaryHeaderSize]
	if !bytes.Equal(h[:len(sumMagic)], []byte(sumMagic)) {
		return nil, errorf(ErrCorrupt, "summary: field magic: %q is not %q", h[:len(sumMagic)], sumMagic)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(h[sumOffCRC:]), Checksum(h[:sumOffCRC]); got != want {
		return nil, errorf(ErrCorrupt, "summary: field header crc: stored %#08x, computed %#08x", got, want)
	}
	if v := le.Uint32(h[sumOffVersion:]); v != SummaryVersion {
		return nil, errorf(ErrCorrupt, "summary: field version: %d, this build reads %d", v, SummaryVersion)
	}
	s := &Summary{Segment: le.Uint64(h[sumOffSegment:]), Generation: le.Uint64(h[sumOffGen:])}
	copy(s.Instance[:], h[sumOffInstance:])
	copy(s.Schema[:], h[sumOffSchema:])
	size := le.Uint64(h[sumOffSize:])
	if size > 1<<62 || size%Alignment != 0 {
		return nil, errorf(ErrCorrupt, "summary of segment %d: field segment size: %d not an aligned size", s.Segment, size)
	}
	s.Size = int64(size)
	body := src[SummaryHeaderSize:]
	if n := le.Uint64(h[sumOffBodyBytes:]); n != uint64(len(body)) {
		return nil, errorf(ErrCorrupt, "summary of segment %d: field entry bytes: %d, the file holds %d", s.Segment, n, len(body))
	}
	if got, want := le.Uint32(h[sumOffBodyCRC:]), Checksum(body); got != want {
		return nil, errorf(ErrCorrupt, "summary of segment %d: field entries crc: stored %#08x, computed %#08x", s.Segment, got, want)
	}
	count := int(le.Uint32(h[sumOffCount:]))
	if count > len(body)/(SummaryEntryFixed+4) {
		return nil, errorf(ErrCorrupt, "summary of segment %d: field count: %d entries cannot fit in %d bytes", s.Segment, count, len(body))
	}
	s.Entries = make([]SummaryEntry, count)
	off := 0
	for i := range s.Entries {
		e := &s.Entries[i]
		if len(body)-off < SummaryEntryFixed {
			return nil, errorf(ErrCorrupt, "summary of segment %d: entry %d: cut short at %d bytes", s.Segment, i, len(body)-off)
		}
		b := body[off:]
		copy(e.ID[:], b[:16])
		e.Offset = int64(le.Uint64(b[seOffOffset:]) & (1<<62 - 1)) // range-checked below
		if le.Uint64(b[seOffOffset:]) >= 1<<62 {
			return nil, errorf(ErrCorrupt, "summary of segment %d: entry %d (%s): field offset out of range", s.Segment, i, e.ID)
		}
		e.Seq = le.Uint64(b[seOffSeq:])
		e.HeaderCRC = le.Uint32(b[seOffHeaderCRC:])
		e.Type = RecordType(b[seOffType])
		e.Compression = Compression(b[seOffCompression])
		e.Kind = SidecarKind(le.Uint16(b[seOffKind:]))
		shards, tensors, shardBytes := le.Uint32(b[seOffShards:]), le.Uint32(b[seOffTensors:]), le.Uint64(b[seOffShardBytes:])
		blocks, pos := le.Uint32(b[seOffBatchBlocks:]), le.Uint32(b[seOffBatchPos:])
		if shards < 1 || shards > MaxShards || tensors > MaxTensorsPerShard || shardBytes > MaxShardBytes || blocks > MaxBatchBlocks || pos > MaxBatchBlocks {
			return nil, errorf(ErrCorrupt, "summary of segment %d: entry %d (%s): field layout or batch: out of range", s.Segment, i, e.ID)
		}
		e.Layout = Layout{Shards: int(shards), TensorsPerShard: int(tensors), ShardBytes: int64(shardBytes)}
		e.BatchBlocks, e.BatchPos = int(blocks), int(pos)
		sz := summaryEntrySize(int(shards), e.Compression)
		if len(b) < sz {
			return nil, errorf(ErrCorrupt, "summary of segment %d: entry %d (%s): %d shards need %d bytes, %d left", s.Segment, i, e.ID, shards, sz, len(b))
		}
		t := b[SummaryEntryFixed:sz]
		e.ShardCRCs = make([]uint32, shards)
		if e.Compression != CompressionNone {
			if shards > MaxCompressedShards {
				return nil, errorf(ErrCorrupt, "summary of segment %d: entry %d (%s): field shards: %d compressed", s.Segment, i, e.ID, shards)
			}
			e.StoredLens, e.StoredCRCs = make([]uint32, shards), make([]uint32, shards)
			for k := range e.ShardCRCs {
				e.ShardCRCs[k], e.StoredLens[k], e.StoredCRCs[k] = le.Uint32(t[12*k:]), le.Uint32(t[12*k+4:]), le.Uint32(t[12*k+8:])
			}
		} else {
			for k := range e.ShardCRCs {
				e.ShardCRCs[k] = le.Uint32(t[4*k:])
			}
		}
		if p := summaryEntryProblem(e, s.Size); p != "" {
			return nil, errorf(ErrCorrupt, "summary of segment %d: entry %d (%s): %s", s.Segment, i, e.ID, p)
		}
		off += sz
	}
	if off != len(body) {
		return nil, errorf(ErrCorrupt, "summary of segment %d: %d bytes after the last entry", s.Segment, len(body)-off)
	}
	return s, nil
}
