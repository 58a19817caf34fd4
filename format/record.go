package format

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Limits that bound every length read from disk before it sizes anything.
const (
	// MaxShards is the most shards a block may have: the per-shard checksum table must fit in
	// the record header.
	MaxShards = 960
	// MaxTensorsPerShard bounds the informational tensor count of a shard.
	MaxTensorsPerShard = 1 << 16
	// MaxShardBytes bounds the raw size of one shard (256 MiB).
	MaxShardBytes = 256 << 20
	// MaxPayloadBytes bounds the on-disk payload of one record (1 GiB).
	MaxPayloadBytes = 1 << 30
)

// Layout is how a block's bytes are organised: Shards shards of ShardBytes each, a shard being
// the unit a connector moves in one call (one layer, for a layer-wise connector) and holding
// TensorsPerShard tensors of equal size (K and V: 2; MLA: 1; ReRoPE: 3).
type Layout struct {
	Shards          int
	TensorsPerShard int
	ShardBytes      int64
}

// Validate reports whether the layout is encodable, wrapping ErrInvalid with the field at fault.
func (l Layout) Validate() error {
	switch {
	case l.Shards < 1 || l.Shards > MaxShards:
		return errorf(ErrInvalid, "layout: shards %d out of range [1, %d]", l.Shards, MaxShards)
	case l.TensorsPerShard < 1 || l.TensorsPerShard > MaxTensorsPerShard:
		return errorf(ErrInvalid, "layout: tensors per shard %d out of range [1, %d]", l.TensorsPerShard, MaxTensorsPerShard)
	case l.ShardBytes < 1 || l.ShardBytes > MaxShardBytes:
		return errorf(ErrInvalid, "layout: shard bytes %d out of range [1, %d]", l.ShardBytes, MaxShardBytes)
	case l.ShardBytes%int64(l.TensorsPerShard) != 0:
		return errorf(ErrInvalid, "layout: shard bytes %d not a multiple of tensors per shard %d", l.ShardBytes, l.TensorsPerShard)
	case int64(l.Shards)*l.ShardStride() > MaxPayloadBytes:
		return errorf(ErrInvalid, "layout: payload %d bytes exceeds %d", int64(l.Shards)*l.ShardStride(), MaxPayloadBytes)
	}
	return nil
}

// BlockBytes is the raw size of a whole block: Shards × ShardBytes.
func (l Layout) BlockBytes() int64 { return int64(l.Shards) * l.ShardBytes }

// ShardStride is the distance between the starts of consecutive shards in a record's payload:
// ShardBytes rounded up to Alignment, so every shard can be read on its own with O_DIRECT.
func (l Layout) ShardStride() int64 { return AlignUp(l.ShardBytes) }

// PayloadBytes is the on-disk size of a record's payload: Shards × ShardStride.
func (l Layout) PayloadBytes() int64 { return int64(l.Shards) * l.ShardStride() }

// RecordBytes is the on-disk size of a whole record: header plus payload.
func (l Layout) RecordBytes() int64 { return RecordHeaderSize + l.PayloadBytes() }

// ShardOffset is the offset of shard i's bytes from the start of the record.
func (l Layout) ShardOffset(i int) int64 { return RecordHeaderSize + int64(i)*l.ShardStride() }

// RecordType says what a record holds.
type RecordType uint8

const (
	// RecordBlock holds the KV bytes of one block.
	RecordBlock RecordType = 1
	// RecordSidecar holds one representation of a block (a SidecarKind): Layout.Shards equal
	// parts (one per layer for the kernels' representations), stored packed
	// (CompressionPacked). Only segments with FeatureSidecars hold sidecar records.
	RecordSidecar RecordType = 2
)

// SidecarKind names a kind of representation stored beside blocks (ESA mean-pooled keys, hash
// codes, ...). The numbering is chosen by the producer (package kernels documents its kinds);
// the log only requires it in [1, MaxSidecarKind]. A block record has kind 0.
type SidecarKind uint16

// MaxSidecarKind bounds sidecar kinds so that the set of a block's kinds fits a 64-bit mask.
const MaxSidecarKind = 63

// MaxSidecarParts is the most parts a sidecar may have: its packed table must fit the header.
const MaxSidecarParts = MaxCompressedShards

// ValidSidecarKind reports whether k may name a sidecar.
func ValidSidecarKind(k SidecarKind) bool { return k >= 1 && k <= MaxSidecarKind }

// Compression says how a record's payload is stored (record header byte 7); see compress.go.
type Compression uint8

const (
	// CompressionNone stores each shard's raw bytes in its own ShardStride slot.
	CompressionNone Compression = 0
	// CompressionLZ4 stores each shard as an independent lz4 block (or raw when lz4 does not
	// make it smaller), packed back to back.
	CompressionLZ4 Compression = 1
	// CompressionLZ4Planes is CompressionLZ4 applied after a 16-bit byte-plane split of the
	// shard (all high bytes, then all low bytes): for fp16/bf16 KV.
	CompressionLZ4Planes Compression = 2
	// CompressionPacked stores every shard raw, packed back to back with the compressed
	// records' table (stored length = shard bytes, stored CRC = raw CRC): for sidecars, whose
	// parts are often far smaller than Alignment.
	CompressionPacked Compression = 3
)

// String returns "none", "lz4", "lz4-planes" or "compression(N)".
func (c Compression) String() string {
	switch c {
	case CompressionNone:
		return "none"
	case CompressionLZ4:
		return "lz4"
	case CompressionLZ4Planes:
		return "lz4-planes"
	case CompressionPacked:
		return "packed"
	}
	return fmt.Sprintf("compression(%d)", uint8(c))
}

func (c Compression) known() bool { return c <= CompressionPacked }

// Record header: the first Alignment bytes of every record; the payload follows at the next
// byte. Uncompressed (compression 0): shard i at RecordHeaderSize + i × ShardStride, each shard
// zero-padded to ShardStride. Compressed (1, 2): see compress.go for the table at 128 and the
// packed payload.
//
//	offset size field
//	     0    4 magic "UCMR"
//	     4    2 format version (uint16 LE, = Version)
//	     6    1 record type (1 = block, 2 = sidecar; 3 = batch, whose header differs from here
//	            on: see batch.go)
//	     7    1 compression (0 = none, 1 = lz4, 2 = lz4 after a 16-bit byte-plane split,
//	            3 = packed raw: sidecars)
//	     8   16 block id
//	    24    8 segment number (uint64 LE; must equal the segment's)
//	    32    8 segment generation (uint64 LE; must equal the segment's: rejects stale bytes)
//	    40    8 sequence number (uint64 LE, store-wide, increasing in write order)
//	    48    4 shards (uint32 LE, [1, 960])
//	    52    4 tensors per shard (uint32 LE)
//	    56    8 shard bytes (uint64 LE, raw bytes of one shard)
//	    64    8 payload bytes on disk (uint64 LE, = shards × align4k(shard bytes);
//	            compressed: align4k(sum of stored lengths))
//	    72    2 sidecar kind (uint16 LE; 0 for a block, [1, 63] for a sidecar)
//	    74   54 zero (reserved)
//	   128  4×n CRC32C of each shard's raw bytes (uint32 LE each, n = shards)
//	            compressed: 12×n, per shard raw CRC32C, stored length, stored CRC32C (compress.go)
//	     …      zero
//	  4092    4 CRC32C of bytes [0, 4092) (uint32 LE)
//
// Part of the on-disk format: do not change without bumping Version.
const (
	RecordHeaderSize = Alignment
	recMagic         = "UCMR"
	recOffVersion    = 4
	recOffType       = 6
	recOffCompress   = 7
	recOffID         = 8
	recOffSegment    = 24
	recOffGeneration = 32
	recOffSeq        = 40
	recOffShards     = 48
	recOffTensors    = 52
	recOffShardBytes = 56
	recOffPayload    = 64
	recOffKind       = 72
	recOffShardCRCs  = 128
)

// RecordHeader is the decoded header of one record.
type RecordHeader struct {
	Type        RecordType
	Compression Compression
	// Kind is the sidecar kind of a RecordSidecar (0 for a block).
	Kind SidecarKind
	// ID is the block's id; for a sidecar, the id of the block it describes.
	ID         BlockID
	Segment    uint64
	Generation uint64
	Seq        uint64
	Layout     Layout
	// ShardCRCs holds the CRC32C of each shard's raw bytes; len == Layout.Shards.
	ShardCRCs []uint32
	// StoredLens and StoredCRCs describe a compressed record's packed shards (nil when
	// Compression is CompressionNone): the bytes shard i occupies on disk and their CRC32C. A
	// stored length equal to Layout.ShardBytes means the shard is stored raw.
	StoredLens []uint32
	StoredCRCs []uint32
}

// PayloadBytes is the on-disk size of the record's payload.
func (h *RecordHeader) PayloadBytes() int64 {
	return StoredPayloadBytes(h.Layout, h.Compression, h.StoredLens)
}

// RecordBytes is the on-disk size of the whole record: header plus payload.
func (h *RecordHeader) RecordBytes() int64 { return RecordHeaderSize + h.PayloadBytes() }

// EncodeRecordHeader writes h into dst, which must be exactly RecordHeaderSize bytes; every byte
// of dst is overwritten. It returns the header checksum (what a footer entry records).
func EncodeRecordHeader(dst []byte, h *RecordHeader) (uint32, error) {
	if len(dst) != RecordHeaderSize {
		return 0, errorf(ErrInvalid, "record header buffer: %d bytes, want %d", len(dst), RecordHeaderSize)
	}
	if err := h.Layout.Validate(); err != nil {
		return 0, err
	}
	if p := kindProblem(h.Type, h.Kind, h.Compression, h.Layout); p != "" {
		return 0, errorf(ErrInvalid, "record header %s: %s", h.ID, p)
	}
	if p := packedProblem(h.Compression, h.ShardCRCs, h.StoredCRCs); p != "" {
		return 0, errorf(ErrInvalid, "record header %s: %s", h.ID, p)
	}
	if err := CheckStored(ErrInvalid, h.Layout, h.Compression, h.StoredLens, h.StoredCRCs); err != nil {
		return 0, err
	}
	if len(h.ShardCRCs) != h.Layout.Shards {
		return 0, errorf(ErrInvalid, "record header: %d shard checksums for %d shards", len(h.ShardCRCs), h.Layout.Shards)
	}
	if h.Segment == 0 {
		return 0, errorf(ErrInvalid, "record header: segment number 0")
	}
	clear(dst)
	copy(dst, recMagic)
	le := binary.LittleEndian
	le.PutUint16(dst[recOffVersion:], Version)
	dst[recOffType] = byte(h.Type)
	dst[recOffCompress] = byte(h.Compression)
	le.PutUint16(dst[recOffKind:], uint16(h.Kind))
	copy(dst[recOffID:], h.ID[:])
	le.PutUint64(dst[recOffSegment:], h.Segment)
	le.PutUint64(dst[recOffGeneration:], h.Generation)
	le.PutUint64(dst[recOffSeq:], h.Seq)
	le.PutUint32(dst[recOffShards:], uint32(h.Layout.Shards))
	le.PutUint32(dst[recOffTensors:], uint32(h.Layout.TensorsPerShard))
	le.PutUint64(dst[recOffShardBytes:], uint64(h.Layout.ShardBytes))
	le.PutUint64(dst[recOffPayload:], uint64(h.PayloadBytes()))
	if h.Compression == CompressionNone {
		for i, c := range h.ShardCRCs {
			le.PutUint32(dst[recOffShardCRCs+4*i:], c)
		}
	} else {
		for i, c := range h.ShardCRCs {
			e := dst[recOffShardCRCs+compressedEntrySize*i:]
			le.PutUint32(e, c)
			le.PutUint32(e[4:], h.StoredLens[i])
			le.PutUint32(e[8:], h.StoredCRCs[i])
		}
	}
	crc := Checksum(dst[:headerCRCOffset])
	le.PutUint32(dst[headerCRCOffset:], crc)
	return crc, nil
}

// IsZeroBlock reports whether b is all zero bytes: what a never-written (preallocated or
// truncated-and-extended) region of a segment looks like. A scanner uses it to tell the clean
// end of a log from a torn record.
func IsZeroBlock(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// DecodeRecordHeader checks and decodes a record header (type 1 or 2). It checks the magic, that
// the type is not RecordBatch (a batch header, see DecodeBatchHeader), the header checksum, then
// every field's range; any failure returns an error wrapping ErrCorrupt that names
// the field. It does not check the segment number or generation against a segment: the caller
// knows which segment it read. It never panics and allocates only the shard checksum table,
// bounded by MaxShards.
func DecodeRecordHeader(src []byte) (RecordHeader, uint32, error) {
	var h RecordHeader
	if len(src) < RecordHeaderSize {
		return h, 0, errorf(ErrCorrupt, "record header: %d bytes, want %d", len(src), RecordHeaderSize)
	}
	src = src[:RecordHeaderSize]
	if !bytes.Equal(src[:len(recMagic)], []byte(recMagic)) {
		return h, 0, errorf(ErrCorrupt, "record header: field magic: %q is not %q", src[:len(recMagic)], recMagic)
	}
	// A batch header shares the first 8 bytes but keeps its CRC at 124, not 4092: say what it
	// is rather than report a checksum mismatch (a scanner dispatches on this byte first).
	if t := RecordType(src[recOffType]); t == RecordBatch {
		return h, 0, errorf(ErrCorrupt, "record header: field type: %d is a batch record (read it with DecodeBatchHeader)", t)
	}
	le := binary.LittleEndian
	crc := Checksum(src[:headerCRCOffset])
	if stored := le.Uint32(src[headerCRCOffset:]); stored != crc {
		return h, 0, errorf(ErrCorrupt, "record header: field crc: stored %#08x, computed %#08x", stored, crc)
	}
	if v := le.Uint16(src[recOffVersion:]); v != Version {
		return h, 0, errorf(ErrCorrupt, "record header: field version: %d, this build reads %d", v, Version)
	}
	h.Type = RecordType(src[recOffType])
	if h.Type != RecordBlock && h.Type != RecordSidecar {
		return h, 0, errorf(ErrCorrupt, "record header: field type: unknown %d", h.Type)
	}
	h.Kind = SidecarKind(le.Uint16(src[recOffKind:]))
	h.Compression = Compression(src[recOffCompress])
	if !h.Compression.known() {
		return h, 0, errorf(ErrCorrupt, "record header: field compression: unknown %d", h.Compression)
	}
	copy(h.ID[:], src[recOffID:])
	h.Segment = le.Uint64(src[recOffSegment:])
	h.Generation = le.Uint64(src[recOffGeneration:])
	h.Seq = le.Uint64(src[recOffSeq:])
	shards := le.Uint32(src[recOffShards:])
	tensors := le.Uint32(src[recOffTensors:])
	shardBytes := le.Uint64(src[recOffShardBytes:])
	payload := le.Uint64(src[recOffPayload:])
	if shards < 1 || shards > MaxShards {
		return h, 0, errorf(ErrCorrupt, "record header %s: field shards: %d out of range [1, %d]", h.ID, shards, MaxShards)
	}
	if tensors < 1 || tensors > MaxTensorsPerShard {
		return h, 0, errorf(ErrCorrupt, "record header %s: field tensors: %d out of range [1, %d]", h.ID, tensors, MaxTensorsPerShard)
	}
	if shardBytes < 1 || shardBytes > MaxShardBytes {
		return h, 0, errorf(ErrCorrupt, "record header %s: field shard bytes: %d out of range [1, %d]", h.ID, shardBytes, MaxShardBytes)
	}
	h.Layout = Layout{Shards: int(shards), TensorsPerShard: int(tensors), ShardBytes: int64(shardBytes)}
	if err := h.Layout.Validate(); err != nil {
		return h, 0, errorf(ErrCorrupt, "record header %s: %v", h.ID, err)
	}
	if p := kindProblem(h.Type, h.Kind, h.Compression, h.Layout); p != "" {
		return h, 0, errorf(ErrCorrupt, "record header %s: %s", h.ID, p)
	}
	if h.Compression == CompressionNone {
		if int64(payload) != h.Layout.PayloadBytes() || payload > MaxPayloadBytes {
			return h, 0, errorf(ErrCorrupt, "record header %s: field payload bytes: %d, layout implies %d", h.ID, payload, h.Layout.PayloadBytes())
		}
		h.ShardCRCs = make([]uint32, shards)
		for i := range h.ShardCRCs {
			h.ShardCRCs[i] = le.Uint32(src[recOffShardCRCs+4*i:])
		}
		return h, crc, nil
	}
	// Compressed: the shard count must fit the 12-byte table before anything is allocated.
	if shards > MaxCompressedShards {
		return h, 0, errorf(ErrCorrupt, "record header %s: field shards: %d compressed shards, at most %d", h.ID, shards, MaxCompressedShards)
	}
	h.ShardCRCs = make([]uint32, shards)
	h.StoredLens = make([]uint32, shards)
	h.StoredCRCs = make([]uint32, shards)
	for i := range h.ShardCRCs {
		e := src[recOffShardCRCs+compressedEntrySize*i:]
		h.ShardCRCs[i] = le.Uint32(e)
		h.StoredLens[i] = le.Uint32(e[4:])
		h.StoredCRCs[i] = le.Uint32(e[8:])
	}
	if p := storedProblem(h.Layout, h.Compression, h.StoredLens, h.StoredCRCs); p != "" {
		return h, 0, errorf(ErrCorrupt, "record header %s: %s", h.ID, p)
	}
	if p := packedProblem(h.Compression, h.ShardCRCs, h.StoredCRCs); p != "" {
		return h, 0, errorf(ErrCorrupt, "record header %s: %s", h.ID, p)
	}
	if want := h.PayloadBytes(); int64(payload) != want {
		return h, 0, errorf(ErrCorrupt, "record header %s: field payload bytes: %d, stored lengths imply %d", h.ID, payload, want)
	}
	return h, crc, nil
}

// kindProblem describes what is inconsistent between a record's type, sidecar kind and
// compression ("" if nothing): a block has kind 0; a sidecar has a valid kind, is packed and
// has at most MaxSidecarParts parts.
func kindProblem(t RecordType, k SidecarKind, c Compression, l Layout) string {
	switch t {
	case RecordBlock:
		if k != 0 {
			return fmt.Sprintf("field kind: %d on a block record", k)
		}
		if c == CompressionPacked {
			return "field compression: packed is for sidecar records"
		}
	case RecordSidecar:
		if !ValidSidecarKind(k) {
			return fmt.Sprintf("field kind: %d out of range [1, %d]", k, MaxSidecarKind)
		}
		if c != CompressionPacked {
			return fmt.Sprintf("field compression: sidecar records are packed, not %v", c)
		}
		if l.Shards > MaxSidecarParts {
			return fmt.Sprintf("field shards: %d sidecar parts, at most %d", l.Shards, MaxSidecarParts)
		}
	default:
		return fmt.Sprintf("field type: unknown %d", t)
	}
	return ""
}

// packedProblem describes a packed record whose stored checksums are not its raw ones.
func packedProblem(c Compression, raw, stored []uint32) string {
	if c != CompressionPacked {
		return ""
	}
	for i := range raw {
		if i >= len(stored) || raw[i] != stored[i] {
			return fmt.Sprintf("shard %d: packed record with stored checksum unlike its raw checksum", i)
		}
	}
	return ""
}
