package format

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
)

// RecordBatch holds N blocks of one layout stored layer-major: shard i of every block of the
// batch lies in one contiguous run, so a layer-wise dump writes, and a layer-wise load reads,
// one run per layer. Only segments with FeatureBatchRecords hold batch records.
//
// A batch record (an "extent") is a header, L layer runs of N shard slots and a commit block:
//
//	| header H | run 0: shard 0 of B0 | B1 | … | B(N-1) | run 1: shard 1 of B0 | … | run L-1 | commit C |
//	  H = BatchHeaderSize(N) = align4k(128 + 16·N)            C = BatchCommitSize(N, L) = align4k(64 + 4·N·L)
//	  S = Layout.ShardStride();  shard i of block b at H + (i·N + b)·S;  run i at H + i·N·S
//	  extent = H + L·N·S + C  (ExtentBytes)
//
// The header is written when the batch is opened, the runs as the layers arrive, the commit
// block last. A batch counts only when its commit block is valid and matches its header
// (DecodeBatchCommit); otherwise the whole extent is dead bytes. Batches are never compressed.
const RecordBatch RecordType = 3

// Limits of a batch record, checked before anything is sized from a header read from disk.
const (
	// MaxBatchBlocks is the most blocks one batch record may hold.
	MaxBatchBlocks = 4096
	// MaxBatchExtent bounds a batch record's whole extent (header, runs and commit block):
	// 1 GiB, the bound a single record's payload has (MaxPayloadBytes), so that a footer entry
	// of either kind fits the same length check. A writer splits larger batches, and a batch
	// must also fit in one segment.
	MaxBatchExtent = MaxPayloadBytes
)

// Batch header: the first BatchHeaderSize(N) bytes of a batch record. Bytes 0–7 are laid out as
// a record header's, so a scanner tells the two apart by the type byte at offset 6.
//
//	offset size field
//	     0    4 magic "UCMR"
//	     4    2 format version (uint16 LE, = Version)
//	     6    1 record type (3 = batch)
//	     7    1 compression (0: batches are never compressed)
//	     8    8 segment number (uint64 LE; must equal the segment's)
//	    16    8 segment generation (uint64 LE; must equal the segment's)
//	    24    8 first sequence number (uint64 LE; block b has sequence number first + b)
//	    32    4 blocks N (uint32 LE, [1, 4096])
//	    36    4 shards L (uint32 LE, [1, 960])
//	    40    4 tensors per shard (uint32 LE)
//	    44    8 shard bytes (uint64 LE, raw bytes of one shard)
//	    52    8 extent bytes (uint64 LE, = H + L·N·align4k(shard bytes) + C, ≤ 1 GiB)
//	    60   64 zero (reserved)
//	   124    4 CRC32C of bytes [0, 124) followed by the id table (uint32 LE): the header CRC
//	   128 16·N block ids, in the batch's order (b = 0 .. N-1; none zero, no repeats)
//	     …      zero to H
//
// Batch commit block: the last BatchCommitSize(N, L) bytes of the extent, written after every
// run. It repeats the header's identity so that a commit block left over from an older batch or
// segment file never validates a new header.
//
//	offset size field
//	     0    8 magic "UCMBATCH"
//	     8    8 segment number (uint64 LE)
//	    16    8 segment generation (uint64 LE)
//	    24    8 first sequence number (uint64 LE)
//	    32    4 blocks N (uint32 LE)
//	    36    4 shards L (uint32 LE)
//	    40    4 header CRC (uint32 LE; the batch header's CRC at its offset 124)
//	    44   16 zero (reserved)
//	    60    4 CRC32C of bytes [0, 60) followed by the shard CRC table (uint32 LE)
//	    64 4·N·L CRC32C of each shard's raw bytes (uint32 LE each), layer-major: shard i of
//	            block b at 64 + 4·(i·N + b)
//	     …      zero to C
//
// Part of the on-disk format: do not change without bumping Version.
const (
	batchFixedSize      = 128
	batchOffSegment     = 8
	batchOffGeneration  = 16
	batchOffFirstSeq    = 24
	batchOffBlocks      = 32
	batchOffShards      = 36
	batchOffTensors     = 40
	batchOffShardBytes  = 44
	batchOffExtent      = 52
	batchOffReserved    = 60
	batchOffCRC         = 124
	batchOffIDs         = 128
	commitMagic         = "UCMBATCH"
	commitFixedSize     = 64
	commitOffSegment    = 8
	commitOffGeneration = 16
	commitOffFirstSeq   = 24
	commitOffBlocks     = 32
	commitOffShards     = 36
	commitOffHeaderCRC  = 40
	commitOffReserved   = 44
	commitOffCRC        = 60
	commitOffTable      = 64
)

// BatchHeaderSize is the on-disk size H of the header of a batch of n blocks:
// align4k(128 + 16·n).
func BatchHeaderSize(n int) int64 { return AlignUp(batchOffIDs + BlockIDSize*int64(n)) }

// BatchCommitSize is the on-disk size C of the commit block of a batch of n blocks of shards
// shards each: align4k(64 + 4·n·shards).
func BatchCommitSize(n, shards int) int64 { return AlignUp(commitOffTable + 4*int64(n)*int64(shards)) }

// BatchHeader is the decoded header of a batch record.
type BatchHeader struct {
	Segment    uint64
	Generation uint64
	// FirstSeq is block 0's sequence number; block b has FirstSeq + b.
	FirstSeq uint64
	// Layout is every block's layout.
	Layout Layout
	// IDs are the batch's blocks in their order: block b is IDs[b]; N = len(IDs).
	IDs []BlockID
}

// ExtentBytes is the on-disk size of the whole batch record: H + L·N·S + C.
func (h *BatchHeader) ExtentBytes() int64 {
	n := len(h.IDs)
	return BatchHeaderSize(n) + int64(h.Layout.Shards)*int64(n)*h.Layout.ShardStride() + BatchCommitSize(n, h.Layout.Shards)
}

// BatchBlockBytes is block b's share of the extent of a batch record of n blocks of layout l:
// its Shards × ShardStride bytes plus an equal share of the header and the commit block, block
// 0 taking the remainder of the division, so that the shares of a batch's n blocks sum to its
// extent exactly. It is what a segment's live bytes count for the block.
func BatchBlockBytes(n, b int, l Layout) int64 {
	meta := BatchHeaderSize(n) + BatchCommitSize(n, l.Shards)
	share := meta / int64(n)
	if b == 0 {
		share = meta - int64(n-1)*share
	}
	return l.PayloadBytes() + share
}

// ShardOffset is the offset of shard i of block b (b in [0, N), i in [0, L)) from the start of
// the batch record: H + (i·N + b)·S. Each shard fills the first ShardBytes of its ShardStride
// slot; the rest of the slot is zero.
func (h *BatchHeader) ShardOffset(b, i int) int64 {
	n := len(h.IDs)
	return BatchHeaderSize(n) + (int64(i)*int64(n)+int64(b))*h.Layout.ShardStride()
}

// CommitOffset is the offset of the commit block from the start of the batch record:
// ExtentBytes − C.
func (h *BatchHeader) CommitOffset() int64 {
	return h.ExtentBytes() - BatchCommitSize(len(h.IDs), h.Layout.Shards)
}

// batchProblem describes what makes h unencodable ("" if nothing), after the block count and
// the layout have been checked.
func batchProblem(h *BatchHeader) string {
	n := len(h.IDs)
	if h.Segment == 0 {
		return "field segment: 0"
	}
	if h.FirstSeq > math.MaxUint64-uint64(n-1) {
		return fmt.Sprintf("field first seq: %d + %d overflows", h.FirstSeq, n-1)
	}
	if e := h.ExtentBytes(); e > MaxBatchExtent {
		return fmt.Sprintf("field extent bytes: %d exceeds %d", e, MaxBatchExtent)
	}
	return idsProblem(h.IDs)
}

// idsProblem describes a zero or repeated id in a batch's id table ("" if none).
func idsProblem(ids []BlockID) string {
	seen := make(map[BlockID]int, len(ids))
	for b, id := range ids {
		if id.IsZero() {
			return fmt.Sprintf("field ids: block %d has the zero id", b)
		}
		if prev, ok := seen[id]; ok {
			return fmt.Sprintf("field ids: blocks %d and %d are both %s", prev, b, id)
		}
		seen[id] = b
	}
	return ""
}

// EncodeBatchHeader writes h into dst, which must be exactly BatchHeaderSize(len(h.IDs)) bytes;
// every byte of dst is overwritten (the padding after the id table with zeros). It returns the
// header CRC (what the commit block and the footer entry record). An unencodable header (block
// count outside [1, MaxBatchBlocks], invalid layout, segment 0, sequence numbers that overflow,
// an extent over MaxBatchExtent, a zero or repeated id) is an error wrapping ErrInvalid.
func EncodeBatchHeader(dst []byte, h *BatchHeader) (uint32, error) {
	n := len(h.IDs)
	if n < 1 || n > MaxBatchBlocks {
		return 0, errorf(ErrInvalid, "batch header: field blocks: %d out of range [1, %d]", n, MaxBatchBlocks)
	}
	if want := BatchHeaderSize(n); int64(len(dst)) != want {
		return 0, errorf(ErrInvalid, "batch header buffer: %d bytes, want %d for %d blocks", len(dst), want, n)
	}
	if err := h.Layout.Validate(); err != nil {
		return 0, fmt.Errorf("batch header: %w", err)
	}
	if p := batchProblem(h); p != "" {
		return 0, errorf(ErrInvalid, "batch header: %s", p)
	}
	clear(dst)
	copy(dst, recMagic)
	le := binary.LittleEndian
	le.PutUint16(dst[recOffVersion:], Version)
	dst[recOffType] = byte(RecordBatch)
	dst[recOffCompress] = byte(CompressionNone)
	le.PutUint64(dst[batchOffSegment:], h.Segment)
	le.PutUint64(dst[batchOffGeneration:], h.Generation)
	le.PutUint64(dst[batchOffFirstSeq:], h.FirstSeq)
	le.PutUint32(dst[batchOffBlocks:], uint32(n))
	le.PutUint32(dst[batchOffShards:], uint32(h.Layout.Shards))
	le.PutUint32(dst[batchOffTensors:], uint32(h.Layout.TensorsPerShard))
	le.PutUint64(dst[batchOffShardBytes:], uint64(h.Layout.ShardBytes))
	le.PutUint64(dst[batchOffExtent:], uint64(h.ExtentBytes()))
	for b, id := range h.IDs {
		copy(dst[batchOffIDs+BlockIDSize*b:], id[:])
	}
	crc := batchHeaderCRC(dst, n)
	le.PutUint32(dst[batchOffCRC:], crc)
	return crc, nil
}

// batchHeaderCRC is the CRC32C of bytes [0, 124) followed by the id table of n blocks.
func batchHeaderCRC(src []byte, n int) uint32 {
	return ChecksumUpdate(Checksum(src[:batchOffCRC]), src[batchOffIDs:batchOffIDs+BlockIDSize*n])
}

// PeekBatchHeader reads what a scanner needs from the first 128 bytes of a batch record (it has
// read one Alignment block and found type 3 at offset 6) to read the rest of the header: the
// block count n, bounded to [1, MaxBatchBlocks], and the header's size BatchHeaderSize(n). It
// checks the magic, version, type and block count, not the CRC (which covers the id table):
// DecodeBatchHeader does. Failures wrap ErrCorrupt naming the field; it never panics.
func PeekBatchHeader(src []byte) (n int, headerBytes int64, err error) {
	if len(src) < batchFixedSize {
		return 0, 0, errorf(ErrCorrupt, "batch header: %d bytes, want at least %d", len(src), batchFixedSize)
	}
	if !bytes.Equal(src[:len(recMagic)], []byte(recMagic)) {
		return 0, 0, errorf(ErrCorrupt, "batch header: field magic: %q is not %q", src[:len(recMagic)], recMagic)
	}
	le := binary.LittleEndian
	if v := le.Uint16(src[recOffVersion:]); v != Version {
		return 0, 0, errorf(ErrCorrupt, "batch header: field version: %d, this build reads %d", v, Version)
	}
	if t := RecordType(src[recOffType]); t != RecordBatch {
		return 0, 0, errorf(ErrCorrupt, "batch header: field type: %d, want %d (batch)", t, RecordBatch)
	}
	blocks := le.Uint32(src[batchOffBlocks:])
	if blocks < 1 || blocks > MaxBatchBlocks {
		return 0, 0, errorf(ErrCorrupt, "batch header: field blocks: %d out of range [1, %d]", blocks, MaxBatchBlocks)
	}
	return int(blocks), BatchHeaderSize(int(blocks)), nil
}

// DecodeBatchHeader checks and decodes a batch header; src must hold at least its
// BatchHeaderSize(N) bytes (PeekBatchHeader tells how many). In order it checks the magic,
// version, type and block count (PeekBatchHeader), the length of src, the header CRC, then
// compression 0, the layout's fields, the segment number (not 0), the first sequence number
// (no overflow), the extent bytes (recomputed from N and the layout, at most MaxBatchExtent),
// the reserved bytes and padding (zero) and the ids (none zero, no repeats). Any failure
// returns an error wrapping ErrCorrupt that names the field. It does not check the segment
// number or generation against a segment: the caller knows which segment it read. It returns
// the header CRC. It never panics and allocates only the id table, bounded by MaxBatchBlocks.
func DecodeBatchHeader(src []byte) (BatchHeader, uint32, error) {
	var h BatchHeader
	n, size, err := PeekBatchHeader(src)
	if err != nil {
		return h, 0, err
	}
	if int64(len(src)) < size {
		return h, 0, errorf(ErrCorrupt, "batch header: %d bytes, want %d for %d blocks", len(src), size, n)
	}
	src = src[:size]
	le := binary.LittleEndian
	crc := batchHeaderCRC(src, n)
	if stored := le.Uint32(src[batchOffCRC:]); stored != crc {
		return h, 0, errorf(ErrCorrupt, "batch header: field crc: stored %#08x, computed %#08x", stored, crc)
	}
	if c := Compression(src[recOffCompress]); c != CompressionNone {
		return h, 0, errorf(ErrCorrupt, "batch header: field compression: %v, batches are not compressed", c)
	}
	shards := le.Uint32(src[batchOffShards:])
	tensors := le.Uint32(src[batchOffTensors:])
	shardBytes := le.Uint64(src[batchOffShardBytes:])
	if shards < 1 || shards > MaxShards {
		return h, 0, errorf(ErrCorrupt, "batch header: field shards: %d out of range [1, %d]", shards, MaxShards)
	}
	if tensors < 1 || tensors > MaxTensorsPerShard {
		return h, 0, errorf(ErrCorrupt, "batch header: field tensors: %d out of range [1, %d]", tensors, MaxTensorsPerShard)
	}
	if shardBytes < 1 || shardBytes > MaxShardBytes {
		return h, 0, errorf(ErrCorrupt, "batch header: field shard bytes: %d out of range [1, %d]", shardBytes, MaxShardBytes)
	}
	h.Layout = Layout{Shards: int(shards), TensorsPerShard: int(tensors), ShardBytes: int64(shardBytes)}
	if err := h.Layout.Validate(); err != nil {
		return h, 0, errorf(ErrCorrupt, "batch header: %v", err)
	}
	h.Segment = le.Uint64(src[batchOffSegment:])
	h.Generation = le.Uint64(src[batchOffGeneration:])
	h.FirstSeq = le.Uint64(src[batchOffFirstSeq:])
	if h.Segment == 0 {
		return h, 0, errorf(ErrCorrupt, "batch header: field segment: 0")
	}
	if h.FirstSeq > math.MaxUint64-uint64(n-1) {
		return h, 0, errorf(ErrCorrupt, "batch header: field first seq: %d + %d overflows", h.FirstSeq, n-1)
	}
	// N ≤ 4096, L ≤ 960 and S ≤ 256 MiB: the extent is below 2^51, no overflow.
	extent := size + int64(shards)*int64(n)*h.Layout.ShardStride() + BatchCommitSize(n, int(shards))
	if stored := le.Uint64(src[batchOffExtent:]); stored != uint64(extent) || extent > MaxBatchExtent {
		return h, 0, errorf(ErrCorrupt, "batch header: field extent bytes: %d, blocks and layout imply %d (at most %d)", stored, extent, MaxBatchExtent)
	}
	if !IsZeroBlock(src[batchOffReserved:batchOffCRC]) {
		return h, 0, errorf(ErrCorrupt, "batch header: field reserved: bytes [%d, %d) not zero", batchOffReserved, batchOffCRC)
	}
	if end := batchOffIDs + BlockIDSize*n; !IsZeroBlock(src[end:]) {
		return h, 0, errorf(ErrCorrupt, "batch header: field padding: bytes [%d, %d) not zero", end, size)
	}
	h.IDs = make([]BlockID, n)
	for b := range h.IDs {
		copy(h.IDs[b][:], src[batchOffIDs+BlockIDSize*b:])
	}
	if p := idsProblem(h.IDs); p != "" {
		return h, 0, errorf(ErrCorrupt, "batch header: %s", p)
	}
	return h, crc, nil
}

// BatchCommit is the decoded commit block of a batch record.
type BatchCommit struct {
	Segment    uint64
	Generation uint64
	FirstSeq   uint64
	// Blocks is N and Shards is L, as in the header.
	Blocks int
	Shards int
	// HeaderCRC is the CRC of the batch header this commit block completes.
	HeaderCRC uint32
	// ShardCRCs holds the CRC32C of each shard's raw bytes, layer-major: shard i of block b is
	// ShardCRCs[i·Blocks + b]; len == Blocks × Shards.
	ShardCRCs []uint32
}

// BlockCRCs returns block b's shard CRCs in shard order (a new slice of Shards entries), as a
// record header or an index location holds them. b must be in [0, Blocks).
func (c *BatchCommit) BlockCRCs(b int) []uint32 {
	out := make([]uint32, c.Shards)
	for i := range out {
		out[i] = c.ShardCRCs[i*c.Blocks+b]
	}
	return out
}

// EncodeBatchCommit writes c into dst, which must be exactly BatchCommitSize(c.Blocks,
// c.Shards) bytes; every byte of dst is overwritten. Blocks outside [1, MaxBatchBlocks],
// Shards outside [1, MaxShards], a table of another length or segment 0 is an error wrapping
// ErrInvalid.
func EncodeBatchCommit(dst []byte, c *BatchCommit) error {
	if c.Blocks < 1 || c.Blocks > MaxBatchBlocks {
		return errorf(ErrInvalid, "batch commit: field blocks: %d out of range [1, %d]", c.Blocks, MaxBatchBlocks)
	}
	if c.Shards < 1 || c.Shards > MaxShards {
		return errorf(ErrInvalid, "batch commit: field shards: %d out of range [1, %d]", c.Shards, MaxShards)
	}
	if len(c.ShardCRCs) != c.Blocks*c.Shards {
		return errorf(ErrInvalid, "batch commit: %d shard checksums for %d blocks of %d shards", len(c.ShardCRCs), c.Blocks, c.Shards)
	}
	if want := BatchCommitSize(c.Blocks, c.Shards); int64(len(dst)) != want {
		return errorf(ErrInvalid, "batch commit buffer: %d bytes, want %d", len(dst), want)
	}
	if c.Segment == 0 {
		return errorf(ErrInvalid, "batch commit: field segment: 0")
	}
	clear(dst)
	copy(dst, commitMagic)
	le := binary.LittleEndian
	le.PutUint64(dst[commitOffSegment:], c.Segment)
	le.PutUint64(dst[commitOffGeneration:], c.Generation)
	le.PutUint64(dst[commitOffFirstSeq:], c.FirstSeq)
	le.PutUint32(dst[commitOffBlocks:], uint32(c.Blocks))
	le.PutUint32(dst[commitOffShards:], uint32(c.Shards))
	le.PutUint32(dst[commitOffHeaderCRC:], c.HeaderCRC)
	for k, crc := range c.ShardCRCs {
		le.PutUint32(dst[commitOffTable+4*k:], crc)
	}
	le.PutUint32(dst[commitOffCRC:], commitCRC(dst, len(c.ShardCRCs)))
	return nil
}

// commitCRC is the CRC32C of bytes [0, 60) followed by a table of k shard CRCs.
func commitCRC(src []byte, k int) uint32 {
	return ChecksumUpdate(Checksum(src[:commitOffCRC]), src[commitOffTable:commitOffTable+4*k])
}

// DecodeBatchCommit checks and decodes the commit block of the batch whose decoded header is h
// and header CRC headerCRC; src must hold at least BatchCommitSize(N, L) bytes (read at
// h.CommitOffset()). In order it checks the length, the magic, the commit CRC, the reserved
// bytes and padding (zero), then that the segment, generation, first sequence number, N, L
// and header CRC equal the header's. Any failure wraps ErrCorrupt naming the field: a missing,
// torn or stale commit block, or one that belongs to another header, means the batch never
// committed and its extent is dead bytes. An h that is not a valid header (N or L out of range)
// is an error wrapping ErrInvalid. It never panics and allocates only the N·L table.
func DecodeBatchCommit(src []byte, h *BatchHeader, headerCRC uint32) (BatchCommit, error) {
	var c BatchCommit
	n, shards := len(h.IDs), h.Layout.Shards
	if n < 1 || n > MaxBatchBlocks || shards < 1 || shards > MaxShards {
		return c, errorf(ErrInvalid, "batch commit: header of %d blocks and %d shards", n, shards)
	}
	size := BatchCommitSize(n, shards)
	if int64(len(src)) < size {
		return c, errorf(ErrCorrupt, "batch commit: %d bytes, want %d", len(src), size)
	}
	src = src[:size]
	if !bytes.Equal(src[:len(commitMagic)], []byte(commitMagic)) {
		return c, errorf(ErrCorrupt, "batch commit: field magic: %q is not %q", src[:len(commitMagic)], commitMagic)
	}
	le := binary.LittleEndian
	k := n * shards
	if stored, crc := le.Uint32(src[commitOffCRC:]), commitCRC(src, k); stored != crc {
		return c, errorf(ErrCorrupt, "batch commit: field crc: stored %#08x, computed %#08x", stored, crc)
	}
	if !IsZeroBlock(src[commitOffReserved:commitOffCRC]) {
		return c, errorf(ErrCorrupt, "batch commit: field reserved: bytes [%d, %d) not zero", commitOffReserved, commitOffCRC)
	}
	if end := commitOffTable + 4*k; !IsZeroBlock(src[end:]) {
		return c, errorf(ErrCorrupt, "batch commit: field padding: bytes [%d, %d) not zero", end, size)
	}
	c.Segment = le.Uint64(src[commitOffSegment:])
	c.Generation = le.Uint64(src[commitOffGeneration:])
	c.FirstSeq = le.Uint64(src[commitOffFirstSeq:])
	blocks, ls := le.Uint32(src[commitOffBlocks:]), le.Uint32(src[commitOffShards:])
	c.HeaderCRC = le.Uint32(src[commitOffHeaderCRC:])
	switch {
	case c.Segment != h.Segment:
		return c, errorf(ErrCorrupt, "batch commit: field segment: %d, header's is %d", c.Segment, h.Segment)
	case c.Generation != h.Generation:
		return c, errorf(ErrCorrupt, "batch commit: field generation: %#x, header's is %#x", c.Generation, h.Generation)
	case c.FirstSeq != h.FirstSeq:
		return c, errorf(ErrCorrupt, "batch commit: field first seq: %d, header's is %d", c.FirstSeq, h.FirstSeq)
	case blocks != uint32(n):
		return c, errorf(ErrCorrupt, "batch commit: field blocks: %d, header's is %d", blocks, n)
	case ls != uint32(shards):
		return c, errorf(ErrCorrupt, "batch commit: field shards: %d, header's is %d", ls, shards)
	case c.HeaderCRC != headerCRC:
		return c, errorf(ErrCorrupt, "batch commit: field header crc: %#08x, header's is %#08x", c.HeaderCRC, headerCRC)
	}
	c.Blocks, c.Shards = n, shards
	c.ShardCRCs = make([]uint32, k)
	for j := range c.ShardCRCs {
		c.ShardCRCs[j] = le.Uint32(src[commitOffTable+4*j:])
	}
	return c, nil
}
