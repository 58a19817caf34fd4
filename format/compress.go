package format

import (
	"fmt"
	"sync"

	"github.com/pierrec/lz4/v4"
)

// Compressed records (compression 1 = lz4, 2 = lz4 after a 16-bit byte-plane split).
//
// The record header is the same 4 KiB header as for raw records, except that the table at
// offset 128 has one 12-byte entry per shard and the payload bytes field (offset 64) is
// align4k(sum of stored lengths):
//
//	offset        size field
//	128 + 12×i       4 CRC32C of shard i's raw bytes (what Load returns; uint32 LE)
//	128 + 12×i + 4   4 stored length of shard i (uint32 LE, [1, ShardBytes])
//	128 + 12×i + 8   4 CRC32C of shard i's stored bytes (what is on disk; uint32 LE)
//
// With MaxCompressedShards = 330 the table ends at 128 + 12×330 = 4088, below the header CRC.
// Blocks with more shards are always stored raw.
//
// The payload starts right after the header. Stored shards are packed back to back, in shard
// order, with no per-shard alignment; zeros pad the end to a multiple of 4096:
//
//	record: | header (4096) | stored 0 | stored 1 | ... | stored n-1 | zeros to align4k |
//	StoredOffset(i) = 4096 + sum of stored lengths of shards [0, i)
//	PayloadBytes    = align4k(sum of stored lengths)
//
// A stored shard is either an lz4 block (github.com/pierrec/lz4/v4 block format, no frame)
// that decodes to exactly ShardBytes bytes, or, when lz4 does not make it smaller, the shard's
// raw bytes (stored length == ShardBytes). For compression 2 the lz4 block holds the shard
// after the byte-plane split: for a shard of 2m bytes b[0..2m), plane[j] = b[2j+1] (high
// bytes of the little-endian 16-bit values) and plane[m+j] = b[2j] (low bytes); ShardBytes must
// be even. A shard stored raw is never transformed.
//
// Part of the on-disk format: do not change without bumping Version.
const (
	compressedEntrySize = 12
	// MaxCompressedShards is the most shards a compressed record may have: its 12-byte
	// per-shard table must end before the header CRC at 4092.
	MaxCompressedShards = (headerCRCOffset - recOffShardCRCs) / compressedEntrySize
)

// StoredPayloadBytes is the on-disk payload size of a record with layout l stored with c (and,
// when compressed, stored lengths lens).
func StoredPayloadBytes(l Layout, c Compression, lens []uint32) int64 {
	if c == CompressionNone {
		return l.PayloadBytes()
	}
	var sum int64
	for _, n := range lens {
		sum += int64(n)
	}
	return AlignUp(sum)
}

// StoredOffset is the offset of shard i's stored bytes from the start of the payload.
func StoredOffset(l Layout, c Compression, lens []uint32, i int) int64 {
	if c == CompressionNone {
		return int64(i) * l.ShardStride()
	}
	var off int64
	for _, n := range lens[:i] {
		off += int64(n)
	}
	return off
}

// StoredLen is the number of bytes shard i occupies on disk (without padding).
func StoredLen(l Layout, c Compression, lens []uint32, i int) int64 {
	if c == CompressionNone {
		return l.ShardBytes
	}
	return int64(lens[i])
}

// CheckStored reports (wrapping kind, ErrInvalid or ErrCorrupt) whether a record with layout l
// may be stored with c and these stored lengths and checksums: the layout is assumed valid.
func CheckStored(kind error, l Layout, c Compression, lens, crcs []uint32) error {
	if p := storedProblem(l, c, lens, crcs); p != "" {
		return errorf(kind, "%s", p)
	}
	return nil
}

func storedProblem(l Layout, c Compression, lens, crcs []uint32) string {
	switch {
	case !c.known():
		return fmt.Sprintf("field compression: unknown %d", c)
	case c == CompressionNone:
		if lens != nil || crcs != nil {
			return "stored lengths given for an uncompressed record"
		}
		return ""
	case l.Shards > MaxCompressedShards:
		return fmt.Sprintf("field shards: %d compressed shards, at most %d", l.Shards, MaxCompressedShards)
	case len(lens) != l.Shards || len(crcs) != l.Shards:
		return fmt.Sprintf("%d stored lengths and %d stored checksums for %d shards", len(lens), len(crcs), l.Shards)
	case c == CompressionLZ4Planes && l.ShardBytes%2 != 0:
		return fmt.Sprintf("field compression: byte planes need an even shard size, not %d", l.ShardBytes)
	}
	var sum int64
	for i, n := range lens {
		if n < 1 || int64(n) > l.ShardBytes {
			return fmt.Sprintf("shard %d: field stored length: %d out of range [1, %d]", i, n, l.ShardBytes)
		}
		if c == CompressionPacked && int64(n) != l.ShardBytes {
			return fmt.Sprintf("shard %d: field stored length: %d in a packed record of %d-byte shards", i, n, l.ShardBytes)
		}
		sum += int64(n)
	}
	if AlignUp(sum) > MaxPayloadBytes {
		return fmt.Sprintf("stored lengths sum to %d, over %d", sum, MaxPayloadBytes)
	}
	return ""
}

// Compressor compresses shards. It holds lz4 state and scratch memory and is not safe for
// concurrent use; GetCompressor/PutCompressor pool them.
type Compressor struct {
	lz     lz4.Compressor
	planes []byte
}

var compressors = sync.Pool{New: func() any { return new(Compressor) }}

// GetCompressor returns a pooled Compressor.
func GetCompressor() *Compressor { return compressors.Get().(*Compressor) }

// PutCompressor returns c to the pool.
func PutCompressor(c *Compressor) { compressors.Put(c) }

// CompressShard stores src (one shard's raw bytes) for compression code into dst, which must
// hold at least len(src) bytes, and returns the stored length: less than len(src) for an lz4
// block, len(src) when compressing did not make it smaller and src was copied raw.
func (c *Compressor) CompressShard(code Compression, dst, src []byte) int {
	dst = dst[:len(src)]
	in := src
	if code == CompressionLZ4Planes && len(src)%2 == 0 {
		c.planes = splitPlanes(c.planes, src)
		in = c.planes
	} else if code != CompressionLZ4 && code != CompressionLZ4Planes {
		return copy(dst, src)
	}
	if len(src) > 1 {
		// A destination one byte short of the input makes lz4 give up on anything that would
		// not shrink; (0, nil) and an error both mean "store raw".
		if n, err := c.lz.CompressBlock(in, dst[:len(src)-1]); err == nil && n > 0 && n < len(src) {
			return n
		}
	}
	return copy(dst, src)
}

// splitPlanes writes the byte planes of src (even length) into buf, grown as needed.
func splitPlanes(buf, src []byte) []byte {
	m := len(src) / 2
	if cap(buf) < len(src) {
		buf = make([]byte, len(src))
	}
	buf = buf[:len(src)]
	hi, lo := buf[:m], buf[m:]
	for j := 0; j < m; j++ {
		hi[j] = src[2*j+1]
		lo[j] = src[2*j]
	}
	return buf
}

// joinPlanes interleaves byte planes (as splitPlanes writes them) back into dst.
func joinPlanes(dst, planes []byte) {
	m := len(dst) / 2
	hi, lo := planes[:m], planes[m:2*m]
	for j := 0; j < m; j++ {
		dst[2*j] = lo[j]
		dst[2*j+1] = hi[j]
	}
}

// UnpackShard checks and decodes one stored shard of a record stored with code: the CRC32C
// of stored must equal storedCRC, it must decode to exactly len(dst) bytes, written to dst,
// whose CRC32C must equal rawCRC. scratch is used for byte planes: it needs len(dst) bytes
// for CompressionLZ4Planes (else it may be nil). Every failure wraps ErrCorrupt and names
// the shard; it never panics, whatever stored holds.
func UnpackShard(code Compression, shard int, stored []byte, storedCRC, rawCRC uint32, dst, scratch []byte) error {
	if got := Checksum(stored); got != storedCRC {
		return errorf(ErrCorrupt, "shard %d stored checksum: stored %#08x, computed %#08x", shard, storedCRC, got)
	}
	switch {
	case len(stored) == len(dst):
		copy(dst, stored)
	case len(stored) > len(dst) || len(stored) == 0:
		return errorf(ErrCorrupt, "shard %d: stored length %d out of range [1, %d]", shard, len(stored), len(dst))
	case code == CompressionLZ4:
		if n, err := lz4.UncompressBlock(stored, dst); err != nil || n != len(dst) {
			return errorf(ErrCorrupt, "shard %d: lz4 block decodes to %d bytes, want %d (%v)", shard, n, len(dst), err)
		}
	case code == CompressionLZ4Planes:
		if len(dst)%2 != 0 || len(scratch) < len(dst) {
			return errorf(ErrCorrupt, "shard %d: byte planes of %d bytes (scratch %d)", shard, len(dst), len(scratch))
		}
		if n, err := lz4.UncompressBlock(stored, scratch[:len(dst)]); err != nil || n != len(dst) {
			return errorf(ErrCorrupt, "shard %d: lz4 block decodes to %d bytes, want %d (%v)", shard, n, len(dst), err)
		}
		joinPlanes(dst, scratch[:len(dst)])
	default:
		return errorf(ErrCorrupt, "shard %d: compression %v", shard, code)
	}
	if got := Checksum(dst); got != rawCRC {
		return errorf(ErrCorrupt, "shard %d checksum: stored %#08x, computed %#08x", shard, rawCRC, got)
	}
	return nil
}

// VerifyPayload checks every shard of a record whose payload (from its start, at least
// h.PayloadBytes() bytes) is in payload: raw records against the shard CRCs; compressed ones
// against the stored CRCs and, decoded, the raw CRCs. When block is non-nil (Layout.BlockBytes()
// bytes) the raw shards are written to it, shard-major. Compressed records need scratch:
// ShardBytes bytes when block is nil, plus ShardBytes for CompressionLZ4Planes.
func VerifyPayload(h *RecordHeader, payload, block, scratch []byte) error {
	l := h.Layout
	if int64(len(payload)) < h.PayloadBytes() || (block != nil && int64(len(block)) != l.BlockBytes()) {
		return errorf(ErrInvalid, "verify payload: %d payload bytes (need %d), block buffer %d", len(payload), h.PayloadBytes(), len(block))
	}
	if h.Compression != CompressionNone {
		var need int64
		if block == nil {
			need += l.ShardBytes // decoded shard
		}
		if h.Compression == CompressionLZ4Planes {
			need += l.ShardBytes // byte planes
		}
		if int64(len(scratch)) < need {
			return errorf(ErrInvalid, "verify payload: scratch of %d bytes, need %d", len(scratch), need)
		}
	}
	var off int64
	for i := 0; i < l.Shards; i++ {
		if h.Compression == CompressionNone {
			b := payload[int64(i)*l.ShardStride() : int64(i)*l.ShardStride()+l.ShardBytes]
			if got := Checksum(b); got != h.ShardCRCs[i] {
				return errorf(ErrCorrupt, "shard %d checksum: stored %#08x, computed %#08x", i, h.ShardCRCs[i], got)
			}
			if block != nil {
				copy(block[int64(i)*l.ShardBytes:], b)
			}
			continue
		}
		n := int64(h.StoredLens[i])
		var dst, planes []byte
		if block != nil {
			dst, planes = block[int64(i)*l.ShardBytes:int64(i+1)*l.ShardBytes], scratch
		} else {
			dst, planes = scratch[:l.ShardBytes], scratch[l.ShardBytes:]
		}
		if err := UnpackShard(h.Compression, i, payload[off:off+n], h.StoredCRCs[i], h.ShardCRCs[i], dst, planes); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// PackShards stores every shard of a block for code, packed back to back into dst (at least
// Shards × ShardBytes bytes): shard i's raw bytes are src[i×srcStride : i×srcStride+ShardBytes].
// It fills lens and crcs (Shards entries each) with each shard's stored length and stored
// CRC32C and returns the sum of the stored lengths.
//
// With minSaving > 0 it gives up early (ok false, lens and crcs partly filled) when the first
// eighth of the shards (at least one) saved less than minSaving of what they take in a
// raw record (ShardStride each, padding included): incompressible KV then costs an eighth of a
// compression, not a whole one.
func (c *Compressor) PackShards(code Compression, l Layout, src []byte, srcStride int64, dst []byte, lens, crcs []uint32, minSaving float64) (sum int64, ok bool) {
	probe := max(1, l.Shards/8)
	var off int64
	for i := 0; i < l.Shards; i++ {
		raw := src[int64(i)*srcStride : int64(i)*srcStride+l.ShardBytes]
		out := dst[off : off+l.ShardBytes]
		n := c.CompressShard(code, out, raw)
		lens[i] = uint32(n)
		crcs[i] = Checksum(out[:n])
		off += int64(n)
		if minSaving > 0 && i+1 == probe && probe < l.Shards {
			rawBytes := int64(probe) * l.ShardStride()
			if float64(rawBytes-off) < minSaving*float64(rawBytes) {
				return off, false
			}
		}
	}
	return off, true
}
