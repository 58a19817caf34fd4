package format

import (
	"bytes"
	"encoding/binary"

	"github.com/ucm-go/ucm/internal/crc32c"
)

// Alignment is the unit every structure in a segment file is aligned and padded to. Offsets
// and lengths of all I/O on segments are multiples of it, so segments can be read and written
// with O_DIRECT on devices with logical blocks of up to 4 KiB.
//
// Part of the on-disk format: changing it is a format version bump.
const Alignment = 4096

// Version is the segment and record format version written by this code. Decoders accept
// exactly this version: an older or newer file is reported, never guessed at.
const Version = 1

// Checksum returns the CRC32C (Castagnoli) of b, the checksum used throughout the format
// (internal/crc32c: hash/crc32's function, through ISA-L in builds with the `isal` tag).
func Checksum(b []byte) uint32 { return crc32c.Checksum(b) }

// ChecksumUpdate returns the CRC32C of the bytes checksummed into crc followed by b:
// ChecksumUpdate(Checksum(a), b) == Checksum(a+b), and ChecksumUpdate(0, b) == Checksum(b).
func ChecksumUpdate(crc uint32, b []byte) uint32 { return crc32c.Update(crc, b) }

// AlignUp rounds n up to a multiple of Alignment.
func AlignUp(n int64) int64 { return (n + Alignment - 1) &^ (Alignment - 1) }

// Segment header: the first Alignment bytes of every segment file.
//
//	offset size field
//	     0    8 magic "UCMGOSEG"
//	     8    4 format version (uint32 LE, = Version)
//	    12    4 feature flags (uint32 LE; every set bit must be known to the reader:
//	            bit 0 FeatureSidecars, bit 1 FeatureBatchRecords)
//	    16    8 segment number (uint64 LE, > 0, monotonic per store)
//	    24    8 generation (uint64 LE, random per segment file; records repeat it)
//	    32   16 instance id of the writer
//	    48    4 alignment (uint32 LE, = Alignment)
//	    52    4 reserved, zero
//	    56    8 created, Unix nanoseconds (int64 LE)
//	    64   32 schema fingerprint (SHA-256 of the store's schema)
//	    96 3996 zero
//	  4092    4 CRC32C of bytes [0, 4092) (uint32 LE)
//
// Part of the on-disk format: do not change without bumping Version.
const (
	SegmentHeaderSize = Alignment
	segMagic          = "UCMGOSEG"
	segOffVersion     = 8
	segOffFeatures    = 12
	segOffNumber      = 16
	segOffGeneration  = 24
	segOffInstance    = 32
	segOffAlignment   = 48
	segOffCreated     = 56
	segOffSchema      = 64
	headerCRCOffset   = Alignment - 4 // shared by segment and record headers
)

// Feature flags of a segment header. A reader refuses a segment carrying a flag it does not know.
const (
	// FeatureSidecars marks a segment that may hold sidecar records (RecordSidecar, kind at
	// record header offset 72, footer entry kind at offset 46). Every segment this version
	// writes carries it, so a build that predates sidecars refuses the segment by its flag
	// instead of misreading a sidecar record as a corrupt block; segments without it (written
	// before sidecars) are read as they always were.
	FeatureSidecars uint32 = 1 << 0
	// FeatureBatchRecords marks a segment that may hold batch records (RecordBatch: a batch
	// header, layer-major shard runs and a commit block; footer entries of type 3). A build that
	// predates batches refuses such a segment by its flag instead of reading a batch header as
	// a corrupt record; a segment without it never holds a batch, and its bytes are exactly
	// what they were before batches existed.
	FeatureBatchRecords uint32 = 1 << 1
	// KnownFeatures is the set of feature bits this version understands.
	KnownFeatures = FeatureSidecars | FeatureBatchRecords
)

// Fingerprint identifies the configuration that produced the bytes of a store (model, dtype,
// KV layout, TP rank and size, block size, hash scheme): a SHA-256 of its canonical text.
type Fingerprint [32]byte

// InstanceID identifies one engine instance (one store directory's owner) across machines.
type InstanceID [16]byte

// SegmentHeader is the decoded first block of a segment file.
type SegmentHeader struct {
	Number      uint64
	Generation  uint64
	Features    uint32
	Instance    InstanceID
	CreatedNano int64
	Schema      Fingerprint
}

// EncodeSegmentHeader writes h into dst, which must be exactly SegmentHeaderSize bytes;
// every byte of dst is overwritten.
func EncodeSegmentHeader(dst []byte, h *SegmentHeader) error {
	if len(dst) != SegmentHeaderSize {
		return errorf(ErrInvalid, "segment header buffer: %d bytes, want %d", len(dst), SegmentHeaderSize)
	}
	if h.Number == 0 {
		return errorf(ErrInvalid, "segment header: segment number 0")
	}
	if h.Features&^KnownFeatures != 0 {
		return errorf(ErrInvalid, "segment header: unknown feature flags %#x", h.Features&^KnownFeatures)
	}
	clear(dst)
	copy(dst, segMagic)
	le := binary.LittleEndian
	le.PutUint32(dst[segOffVersion:], Version)
	le.PutUint32(dst[segOffFeatures:], h.Features)
	le.PutUint64(dst[segOffNumber:], h.Number)
	le.PutUint64(dst[segOffGeneration:], h.Generation)
	copy(dst[segOffInstance:], h.Instance[:])
	le.PutUint32(dst[segOffAlignment:], Alignment)
	le.PutUint64(dst[segOffCreated:], uint64(h.CreatedNano))
	copy(dst[segOffSchema:], h.Schema[:])
	le.PutUint32(dst[headerCRCOffset:], Checksum(dst[:headerCRCOffset]))
	return nil
}

// DecodeSegmentHeader checks and decodes a segment header. Any failed check returns an error
// wrapping ErrCorrupt naming the field; it never panics, whatever src holds.
func DecodeSegmentHeader(src []byte) (SegmentHeader, error) {
	var h SegmentHeader
	if len(src) < SegmentHeaderSize {
		return h, errorf(ErrCorrupt, "segment header: %d bytes, want %d", len(src), SegmentHeaderSize)
	}
	src = src[:SegmentHeaderSize]
	if !bytes.Equal(src[:len(segMagic)], []byte(segMagic)) {
		return h, errorf(ErrCorrupt, "segment header: field magic: %q is not %q", src[:len(segMagic)], segMagic)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(src[headerCRCOffset:]), Checksum(src[:headerCRCOffset]); got != want {
		return h, errorf(ErrCorrupt, "segment header: field crc: stored %#08x, computed %#08x", got, want)
	}
	if v := le.Uint32(src[segOffVersion:]); v != Version {
		return h, errorf(ErrCorrupt, "segment header: field version: %d, this build reads %d", v, Version)
	}
	h.Features = le.Uint32(src[segOffFeatures:])
	if h.Features&^KnownFeatures != 0 {
		return h, errorf(ErrCorrupt, "segment header: field features: unknown flags %#x", h.Features&^KnownFeatures)
	}
	if a := le.Uint32(src[segOffAlignment:]); a != Alignment {
		return h, errorf(ErrCorrupt, "segment header: field alignment: %d, want %d", a, Alignment)
	}
	h.Number = le.Uint64(src[segOffNumber:])
	if h.Number == 0 {
		return h, errorf(ErrCorrupt, "segment header: field number: 0")
	}
	h.Generation = le.Uint64(src[segOffGeneration:])
	copy(h.Instance[:], src[segOffInstance:])
	h.CreatedNano = int64(le.Uint64(src[segOffCreated:]))
	copy(h.Schema[:], src[segOffSchema:])
	return h, nil
}
