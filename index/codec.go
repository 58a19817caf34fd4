package index

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/ucm-go/ucm/format"
)

// Location is where a block's record lives and what is needed to verify a read of it without
// first reading the record header.
type Location struct {
	// Segment is the number of the segment file holding the record (> 0).
	Segment uint64
	// Offset is the byte offset of the record's start (its header) in the segment file (>= 0).
	Offset int64
	// Layout is the block's shard layout; it fixes the record's on-disk size.
	Layout format.Layout
	// Seq is the store-wide sequence number the record was written with.
	Seq uint64
	// HeaderCRC is the record header's checksum (what format.EncodeRecordHeader returned).
	HeaderCRC uint32
	// ShardCRCs holds the CRC32C of each shard's raw bytes; len == Layout.Shards.
	ShardCRCs []uint32
	// Compression is how the record's payload is stored. For a compressed record StoredLens
	// and StoredCRCs (len == Layout.Shards) give each shard's stored length and the CRC32C of
	// its stored bytes, so a single shard can be located and verified without reading the
	// record header; both are nil for CompressionNone.
	Compression format.Compression
	StoredLens  []uint32
	StoredCRCs  []uint32
	// BatchBlocks is N, the number of blocks of the batch record (format record type 3,
	// layer-major) that holds this block, or 0 for a block stored in a record of its own.
	// For a batch block Offset is the batch record's offset, Seq the batch's first sequence
	// number plus BatchPos, HeaderCRC the batch header's checksum, and Compression none.
	BatchBlocks int
	// BatchPos is the block's position b in its batch, in [0, BatchBlocks); 0 otherwise.
	BatchPos int
}

// IsBatch reports whether l is a block of a batch record.
func (l Location) IsBatch() bool { return l.BatchBlocks > 0 }

// RecordBytes is what the segment table's LiveBytes counts for the entry at l: for a record of
// its own its on-disk size (header plus padded payload); for a block of a batch its share of
// the batch's extent, Shards × ShardStride plus its share of the batch header and commit block
// (block 0 takes the remainder of the division), so that the shares of a batch's N blocks sum
// to its extent exactly.
func (l Location) RecordBytes() int64 {
	if l.IsBatch() {
		return format.BatchBlockBytes(l.BatchBlocks, l.BatchPos, l.Layout)
	}
	return format.RecordHeaderSize + format.StoredPayloadBytes(l.Layout, l.Compression, l.StoredLens)
}

// PayloadBytes is the on-disk size of the block's payload: of the record's, or for a block of
// a batch the size of its shards laid out as a record's payload (Shards × ShardStride), which
// is what a whole-block read of it assembles.
func (l Location) PayloadBytes() int64 {
	return format.StoredPayloadBytes(l.Layout, l.Compression, l.StoredLens)
}

// ShardExtent is where shard i's stored bytes lie in the block's payload (from its start) and
// how many there are (ShardBytes for a raw record). For a block of a batch, whose shards are
// not contiguous on disk, the offset is the shard's place in the payload a whole-block read
// assembles (i × ShardStride); use ShardOffset for where to read it.
func (l Location) ShardExtent(i int) (off, n int64) {
	return format.StoredOffset(l.Layout, l.Compression, l.StoredLens, i), format.StoredLen(l.Layout, l.Compression, l.StoredLens, i)
}

// ShardOffset is the absolute offset in the segment file of shard i's stored bytes: for a
// record of its own the record's offset plus the header plus the shard's offset in the
// payload (raw or compressed); for block b of a batch of N blocks
// Offset + H + (i·N + b)·ShardStride, H being the batch header's size. Every reader locates
// shards through it. i must be in [0, Layout.Shards).
func (l Location) ShardOffset(i int) int64 {
	if l.IsBatch() {
		return l.Offset + format.BatchHeaderSize(l.BatchBlocks) + (int64(i)*int64(l.BatchBlocks)+int64(l.BatchPos))*l.Layout.ShardStride()
	}
	return l.Offset + format.RecordHeaderSize + format.StoredOffset(l.Layout, l.Compression, l.StoredLens, i)
}

// validate reports whether l can be stored, wrapping format.ErrInvalid.
func (l Location) validate() error {
	if l.Segment == 0 {
		return fmt.Errorf("%w: location: segment number 0", format.ErrInvalid)
	}
	if l.Offset < 0 {
		return fmt.Errorf("%w: location: negative offset %d", format.ErrInvalid, l.Offset)
	}
	if err := l.Layout.Validate(); err != nil {
		return fmt.Errorf("location: %w", err)
	}
	if len(l.ShardCRCs) != l.Layout.Shards {
		return fmt.Errorf("%w: location: %d shard checksums for %d shards", format.ErrInvalid, len(l.ShardCRCs), l.Layout.Shards)
	}
	if err := format.CheckStored(format.ErrInvalid, l.Layout, l.Compression, l.StoredLens, l.StoredCRCs); err != nil {
		return fmt.Errorf("location: %w", err)
	}
	if err := checkBatch(l.BatchBlocks, l.BatchPos, l.Compression); err != "" {
		return fmt.Errorf("%w: location: %s", format.ErrInvalid, err)
	}
	return nil
}

// checkBatch says what is wrong with a location's batch fields (n blocks, position b, stored
// with c), "" when nothing is: n is 0 (a record of its own, b 0) or in [1, format.MaxBatchBlocks]
// with b in [0, n) and c none.
func checkBatch(n, b int, c format.Compression) string {
	switch {
	case n == 0 && b != 0:
		return fmt.Sprintf("batch position %d outside a batch", b)
	case n == 0:
		return ""
	case n < 0 || n > format.MaxBatchBlocks:
		return fmt.Sprintf("batch blocks %d out of range [1, %d]", n, format.MaxBatchBlocks)
	case b < 0 || b >= n:
		return fmt.Sprintf("batch position %d out of range [0, %d)", b, n)
	case c != format.CompressionNone:
		return fmt.Sprintf("batch block stored with compression %v", c)
	}
	return ""
}

// SegmentState is the lifecycle state of a segment in the segment table.
type SegmentState uint8

// Segment states. Part of the index's on-disk value format: do not renumber.
const (
	// SegmentActive is a segment still being appended to; after a crash its tail may be unclean.
	SegmentActive SegmentState = 1
	// SegmentSealed is a segment that will never be appended to again; every record in it must
	// be valid.
	SegmentSealed SegmentState = 2
	// SegmentQuarantined is a segment found corrupt; it is not served from.
	SegmentQuarantined SegmentState = 3
	// SegmentDeleting is a segment being reclaimed (evicted or compacted): no entry points into
	// it any more and its file is unlinked once its readers release it. Recovery finishes the
	// deletion, so a crash never brings its records back as unregistered files to adopt.
	SegmentDeleting SegmentState = 4
)

// String returns "active", "sealed", "quarantined", "deleting" or "state(N)" for an unknown value.
func (s SegmentState) String() string {
	switch s {
	case SegmentActive:
		return "active"
	case SegmentSealed:
		return "sealed"
	case SegmentQuarantined:
		return "quarantined"
	case SegmentDeleting:
		return "deleting"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

func (s SegmentState) valid() bool { return s >= SegmentActive && s <= SegmentDeleting }

// SegmentMeta is one row of the segment table.
type SegmentMeta struct {
	// Number is the segment's number (> 0), its file name and its key in the table.
	Number uint64
	// Generation is the random generation written in the segment's header and records.
	Generation uint64
	// State is the segment's lifecycle state.
	State SegmentState
	// Size is the bytes of the file that are accounted: header + records (+ footer once
	// sealed); for active segments the durable append offset as last recorded by the caller.
	Size int64
	// LiveBytes is the sum of RecordBytes of the records the index points at. Maintained by
	// Apply, never taken from the caller.
	LiveBytes int64
	// LiveSidecars is how many of LiveRecords are sidecar entries. Maintained by Apply.
	LiveSidecars int64
	// LiveRecords is the number of block and sidecar entries pointing into the segment. Maintained by
	// Apply, never taken from the caller.
	LiveRecords int64
}

// validate reports whether m can be stored by SetSegment, wrapping format.ErrInvalid.
func (m SegmentMeta) validate() error {
	switch {
	case m.Number == 0:
		return fmt.Errorf("%w: segment meta: number 0", format.ErrInvalid)
	case !m.State.valid():
		return fmt.Errorf("%w: segment %d: %v", format.ErrInvalid, m.Number, m.State)
	case m.Size < 0:
		return fmt.Errorf("%w: segment %d: negative size %d", format.ErrInvalid, m.Number, m.Size)
	}
	return nil
}

// Value format versions. Part of the index's on-disk format.
const (
	locationVersion = 1
	// locationVersionCompressed is the location of a compressed record; raw records keep
	// version 1, so stores written with compression off stay readable by older builds.
	locationVersionCompressed = 2
	// locationVersionBatch is the location of a block of a batch record (layer-major, format
	// record type 3): version 1's fields and the batch's block count and the block's position.
	locationVersionBatch = 3
	segmentMetaVersion   = 1
	// segmentMetaVersionSidecars is a segment meta value with a live sidecar count.
	segmentMetaVersionSidecars = 2
)

// Location value layout (version 1); see doc.go.
const (
	locOffVersion    = 0
	locOffSegment    = 1
	locOffOffset     = 9
	locOffSeq        = 17
	locOffHeaderCRC  = 25
	locOffShards     = 29
	locOffTensors    = 33
	locOffShardBytes = 37
	locOffShardCRCs  = 45
	// locationFixedSize is the size of a location value without its shard checksums.
	locationFixedSize = locOffShardCRCs
	// Version 2 (compressed records): the same 45 bytes, then the compression code, then a
	// 12-byte entry per shard: raw CRC32C, stored length, stored CRC32C.
	locOffCompression      = 45
	locFixedSizeCompressed = 46
	locEntrySizeCompressed = 12
	// Version 3 (blocks of a batch record): the same 45 bytes, then the batch's block count N
	// and the block's position b (uint32 each), then the shard checksums as in version 1.
	locOffBatchBlocks = 45
	locOffBatchPos    = 49
	locOffBatchCRCs   = 53
	locFixedSizeBatch = locOffBatchCRCs
)

// SegmentMeta value layout (version 1); see doc.go.
const (
	segOffVersion     = 0
	segOffNumber      = 1
	segOffGeneration  = 9
	segOffState       = 17
	segOffSize        = 18
	segOffLiveBytes   = 26
	segOffLiveRecords = 34
	// segmentMetaSize is the exact size of a version 1 segment meta value.
	segmentMetaSize = 42
	// Version 2: the live sidecar count follows.
	segOffLiveSidecars      = 42
	segmentMetaSizeSidecars = 50
)

// EncodeLocation appends the encoding of l to dst and returns the extended slice: version 1
// for a raw record, version 2 for a compressed one, version 3 for a block of a batch. It does not validate l (Batch.Put does);
// DecodeLocation accepts exactly what it produces for a valid l.
func EncodeLocation(dst []byte, l Location) []byte {
	n := len(dst)
	size := locationFixedSize + 4*len(l.ShardCRCs)
	if l.Compression != format.CompressionNone {
		size = locFixedSizeCompressed + locEntrySizeCompressed*len(l.ShardCRCs)
	} else if l.IsBatch() {
		size = locFixedSizeBatch + 4*len(l.ShardCRCs)
	}
	dst = append(dst, make([]byte, size)...)
	b := dst[n:]
	le := binary.LittleEndian
	b[locOffVersion] = locationVersion
	le.PutUint64(b[locOffSegment:], l.Segment)
	le.PutUint64(b[locOffOffset:], uint64(l.Offset))
	le.PutUint64(b[locOffSeq:], l.Seq)
	le.PutUint32(b[locOffHeaderCRC:], l.HeaderCRC)
	le.PutUint32(b[locOffShards:], uint32(l.Layout.Shards))
	le.PutUint32(b[locOffTensors:], uint32(l.Layout.TensorsPerShard))
	le.PutUint64(b[locOffShardBytes:], uint64(l.Layout.ShardBytes))
	if l.Compression != format.CompressionNone {
		b[locOffVersion] = locationVersionCompressed
		b[locOffCompression] = byte(l.Compression)
		for i, c := range l.ShardCRCs {
			e := b[locFixedSizeCompressed+locEntrySizeCompressed*i:]
			le.PutUint32(e, c)
			le.PutUint32(e[4:], l.StoredLens[i])
			le.PutUint32(e[8:], l.StoredCRCs[i])
		}
		return dst
	}
	crcs := b[locOffShardCRCs:]
	if l.IsBatch() {
		b[locOffVersion] = locationVersionBatch
		le.PutUint32(b[locOffBatchBlocks:], uint32(l.BatchBlocks))
		le.PutUint32(b[locOffBatchPos:], uint32(l.BatchPos))
		crcs = b[locOffBatchCRCs:]
	}
	for i, c := range l.ShardCRCs {
		le.PutUint32(crcs[4*i:], c)
	}
	return dst
}

// DecodeLocation decodes a location value. Any failed check (length, version, range of a
// field, layout validity) returns an error wrapping format.ErrCorrupt naming the field. It never
// panics and allocates only the shard checksum table, after checking the shard count against
// format.MaxShards and the value's length.
func DecodeLocation(src []byte) (Location, error) {
	var l Location
	if len(src) < locationFixedSize {
		return l, fmt.Errorf("%w: location value: %d bytes, want at least %d", format.ErrCorrupt, len(src), locationFixedSize)
	}
	v := src[locOffVersion]
	if v != locationVersion && v != locationVersionCompressed && v != locationVersionBatch {
		return l, fmt.Errorf("%w: location value: field version: %d, this build reads %d, %d and %d", format.ErrCorrupt, v, locationVersion, locationVersionCompressed, locationVersionBatch)
	}
	le := binary.LittleEndian
	shards := le.Uint32(src[locOffShards:])
	maxShards, want := uint32(format.MaxShards), locationFixedSize+4*int64(shards)
	switch v {
	case locationVersionCompressed:
		maxShards, want = format.MaxCompressedShards, locFixedSizeCompressed+locEntrySizeCompressed*int64(shards)
	case locationVersionBatch:
		want = locFixedSizeBatch + 4*int64(shards)
	}
	if shards < 1 || shards > maxShards {
		return l, fmt.Errorf("%w: location value: field shards: %d out of range [1, %d]", format.ErrCorrupt, shards, maxShards)
	}
	if int64(len(src)) != want {
		return l, fmt.Errorf("%w: location value: %d bytes, %d shards imply %d", format.ErrCorrupt, len(src), shards, want)
	}
	tensors := le.Uint32(src[locOffTensors:])
	if tensors > format.MaxTensorsPerShard {
		return l, fmt.Errorf("%w: location value: field tensors: %d out of range [1, %d]", format.ErrCorrupt, tensors, format.MaxTensorsPerShard)
	}
	shardBytes := le.Uint64(src[locOffShardBytes:])
	if shardBytes > format.MaxShardBytes {
		return l, fmt.Errorf("%w: location value: field shard bytes: %d out of range [1, %d]", format.ErrCorrupt, shardBytes, format.MaxShardBytes)
	}
	l.Layout = format.Layout{Shards: int(shards), TensorsPerShard: int(tensors), ShardBytes: int64(shardBytes)}
	if err := l.Layout.Validate(); err != nil {
		return Location{}, fmt.Errorf("%w: location value: %v", format.ErrCorrupt, err)
	}
	l.Segment = le.Uint64(src[locOffSegment:])
	if l.Segment == 0 {
		return Location{}, fmt.Errorf("%w: location value: field segment: 0", format.ErrCorrupt)
	}
	off := le.Uint64(src[locOffOffset:])
	if off > 1<<62 {
		return Location{}, fmt.Errorf("%w: location value: field offset: %d out of range", format.ErrCorrupt, off)
	}
	l.Offset = int64(off)
	l.Seq = le.Uint64(src[locOffSeq:])
	l.HeaderCRC = le.Uint32(src[locOffHeaderCRC:])
	if v == locationVersionBatch {
		n, b := le.Uint32(src[locOffBatchBlocks:]), le.Uint32(src[locOffBatchPos:])
		if n < 1 || n > format.MaxBatchBlocks {
			return Location{}, fmt.Errorf("%w: location value: field batch blocks: %d out of range [1, %d]", format.ErrCorrupt, n, format.MaxBatchBlocks)
		}
		if b >= n {
			return Location{}, fmt.Errorf("%w: location value: field batch position: %d out of range [0, %d)", format.ErrCorrupt, b, n)
		}
		l.BatchBlocks, l.BatchPos = int(n), int(b)
	}
	l.ShardCRCs = make([]uint32, shards)
	if v != locationVersionCompressed {
		crcs := src[locOffShardCRCs:]
		if v == locationVersionBatch {
			crcs = src[locOffBatchCRCs:]
		}
		for i := range l.ShardCRCs {
			l.ShardCRCs[i] = le.Uint32(crcs[4*i:])
		}
		return l, nil
	}
	l.Compression = format.Compression(src[locOffCompression])
	if l.Compression == format.CompressionNone {
		return Location{}, fmt.Errorf("%w: location value: field compression: 0 in a version 2 value", format.ErrCorrupt)
	}
	l.StoredLens = make([]uint32, shards)
	l.StoredCRCs = make([]uint32, shards)
	for i := range l.ShardCRCs {
		e := src[locFixedSizeCompressed+locEntrySizeCompressed*i:]
		l.ShardCRCs[i] = le.Uint32(e)
		l.StoredLens[i] = le.Uint32(e[4:])
		l.StoredCRCs[i] = le.Uint32(e[8:])
	}
	if err := format.CheckStored(format.ErrCorrupt, l.Layout, l.Compression, l.StoredLens, l.StoredCRCs); err != nil {
		return Location{}, fmt.Errorf("location value: %w", err)
	}
	return l, nil
}

// EncodeSegmentMeta appends the encoding of m to dst and returns the extended slice: version 1
// without live sidecars, version 2 with. It does not validate m; DecodeSegmentMeta accepts
// exactly what it produces for a valid m.
func EncodeSegmentMeta(dst []byte, m SegmentMeta) []byte {
	n := len(dst)
	size, version := segmentMetaSize, byte(segmentMetaVersion)
	if m.LiveSidecars != 0 {
		size, version = segmentMetaSizeSidecars, segmentMetaVersionSidecars
	}
	dst = append(dst, make([]byte, size)...)
	b := dst[n:]
	le := binary.LittleEndian
	b[segOffVersion] = version
	le.PutUint64(b[segOffNumber:], m.Number)
	le.PutUint64(b[segOffGeneration:], m.Generation)
	b[segOffState] = byte(m.State)
	le.PutUint64(b[segOffSize:], uint64(m.Size))
	le.PutUint64(b[segOffLiveBytes:], uint64(m.LiveBytes))
	le.PutUint64(b[segOffLiveRecords:], uint64(m.LiveRecords))
	if m.LiveSidecars != 0 {
		le.PutUint64(b[segOffLiveSidecars:], uint64(m.LiveSidecars))
	}
	return dst
}

// DecodeSegmentMeta decodes a segment meta value. Any failed check (length, version, state,
// negative counters, live bytes or records without the other) returns an error wrapping
// format.ErrCorrupt naming the field. It never panics and does not allocate.
func DecodeSegmentMeta(src []byte) (SegmentMeta, error) {
	var m SegmentMeta
	if len(src) < 1 {
		return m, fmt.Errorf("%w: segment meta value: empty", format.ErrCorrupt)
	}
	le := binary.LittleEndian
	switch v := src[segOffVersion]; {
	case v == segmentMetaVersion && len(src) == segmentMetaSize:
	case v == segmentMetaVersionSidecars && len(src) == segmentMetaSizeSidecars:
		m.LiveSidecars = int64(le.Uint64(src[segOffLiveSidecars:]))
	case v == segmentMetaVersion || v == segmentMetaVersionSidecars:
		return m, fmt.Errorf("%w: segment meta value: version %d in %d bytes", format.ErrCorrupt, v, len(src))
	default:
		return m, fmt.Errorf("%w: segment meta value: field version: %d, this build reads %d and %d", format.ErrCorrupt, v, segmentMetaVersion, segmentMetaVersionSidecars)
	}
	m.Number = le.Uint64(src[segOffNumber:])
	m.Generation = le.Uint64(src[segOffGeneration:])
	m.State = SegmentState(src[segOffState])
	m.Size = int64(le.Uint64(src[segOffSize:]))
	m.LiveBytes = int64(le.Uint64(src[segOffLiveBytes:]))
	m.LiveRecords = int64(le.Uint64(src[segOffLiveRecords:]))
	switch {
	case m.Number == 0:
		return SegmentMeta{}, fmt.Errorf("%w: segment meta value: field number: 0", format.ErrCorrupt)
	case !m.State.valid():
		return SegmentMeta{}, fmt.Errorf("%w: segment meta value %d: field state: unknown %d", format.ErrCorrupt, m.Number, uint8(m.State))
	case m.Size < 0:
		return SegmentMeta{}, fmt.Errorf("%w: segment meta value %d: field size: negative %d", format.ErrCorrupt, m.Number, m.Size)
	case m.LiveBytes < 0:
		return SegmentMeta{}, fmt.Errorf("%w: segment meta value %d: field live bytes: negative %d", format.ErrCorrupt, m.Number, m.LiveBytes)
	case m.LiveRecords < 0:
		return SegmentMeta{}, fmt.Errorf("%w: segment meta value %d: field live records: negative %d", format.ErrCorrupt, m.Number, m.LiveRecords)
	case (m.LiveBytes == 0) != (m.LiveRecords == 0):
		return SegmentMeta{}, fmt.Errorf("%w: segment meta value %d: live bytes %d with live records %d", format.ErrCorrupt, m.Number, m.LiveBytes, m.LiveRecords)
	case src[segOffVersion] == segmentMetaVersionSidecars && (m.LiveSidecars < 1 || m.LiveSidecars > m.LiveRecords):
		return SegmentMeta{}, fmt.Errorf("%w: segment meta value %d: field live sidecars: %d out of range [1, %d]", format.ErrCorrupt, m.Number, m.LiveSidecars, m.LiveRecords)
	}
	return m, nil
}
