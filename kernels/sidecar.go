package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/ucm-go/ucm/internal/crc32c"
)

// Sidecar payloads: the bytes of one block's representation of one kind, for every layer of
// the block. The storage engine keeps one sidecar record per (block, kind) made of equal parts
// (engine.DumpSidecars, parts = layers) and loads one part of many blocks into one contiguous
// array (engine.LoadSidecars): this file defines those bytes.
//
// A payload is Layers parts of PartBytes each, layer-major: layer L's part is at L·PartBytes
// (LayerRange), computable from the SidecarSpec alone, and its size does not depend on the
// block's token count. Every part is self-describing and verifiable alone: a 64-byte header
// (with its layer index and its own CRC), then the layer's data, zero-padded to a multiple of
// 8 bytes.
//
// Part header (little-endian):
//
//	offset size field
//	     0    4 magic "UCRP"
//	     4    2 version (1)
//	     6    2 kind (SidecarKind)
//	     8    1 element dtype of stored values (DType: 1 float16, 2 bfloat16, 5 float32; 0 for hash codes)
//	     9    1 input dtype: the dtype of the K the kernels read
//	    10    2 layers
//	    12    2 kv heads
//	    14    2 head dim of the input K
//	    16    2 block size (tokens of a full block)
//	    18    2 tokens of this block (≤ block size; less only for a partial last block)
//	    20    2 rows of the layer's data (derived; see the kinds)
//	    22    2 cols per row and head (derived)
//	    24    4 part bytes, header included (derived, a multiple of 8)
//	    28    2 merge (KVStar; else 0)
//	    30    2 hash bits of encoder 0 (hash; else 0)
//	    32    8 prune ratio, float64 bits (KVStar; else 0)
//	    40    8 seed (hash; else 0): encoder 0 has this seed, encoder 1 seed+1
//	    48    2 rope dim: input dims of encoder 1, the last ones of each head (MLA; else 0)
//	    50    2 rope bits: hash bits of encoder 1 (MLA; else 0)
//	    52    4 projection fingerprint (hash; else 0): see SidecarHeader.Fingerprint
//	    56    2 layer: this part's layer index
//	    58    2 reserved, zero
//	    60    4 CRC-32C (Castagnoli) of bytes 0..59
//
// All parts of a payload have the same header but for the layer (and so the CRC). Layer data
// by kind (values are elements of the element dtype, little-endian; padding rows are all-zero
// bytes):
//
//	1 ESA mean   [heads][dim] mean of K over the block's tokens            rows 1, cols dim
//	2 ESA max    [heads][dim] max of K over the block's tokens             rows 1, cols dim
//	3 Quest      [2][heads][dim]: per-channel min, then max                rows 2, cols dim
//	4 KVStar     channels [heads][d'] uint16 ascending, zero-padded to 8 bytes, then
//	             values [bs/merge][heads][d'] merged rows; rows ⌈tokens/merge⌉ and later are
//	             zero                                                      rows bs/merge, cols d'
//	5 hash       codes [bs][heads][c] bytes (c = Σ hash bits/8 of the encoders, LSB first);
//	             rows tokens and later are zero                            rows bs, cols c
//
// The engine's per-part checksums cover the bytes; the header's CRC makes a part's header
// verifiable without them. Only full blocks have block ids (the hasher chains full blocks
// only; a trailing partial block has no id and is never stored), so stored sidecars normally
// have tokens = block size.
//
// Decoding never panics, bounds every length before allocating (a payload is at most
// MaxSidecarBytes) and rejects non-canonical bytes (nonzero reserved fields and padding,
// channel tables out of order, parts whose headers disagree) with ErrCorrupt.

// SidecarKind says which representation a sidecar payload holds. The numbering is part of the
// on-disk format (it is the format.SidecarKind of the record): do not renumber.
type SidecarKind uint16

// Sidecar kinds.
const (
	// SidecarESAMean is ESA's mean-pooled keys per block and head.
	SidecarESAMean SidecarKind = 1
	// SidecarESAMax is ESA's max-pooled keys per block and head.
	SidecarESAMax SidecarKind = 2
	// SidecarQuest is Quest's per-channel key minimum and maximum per block and head.
	SidecarQuest SidecarKind = 3
	// SidecarKVStar is KVStar's channel-pruned, token-merged keys and kept channels.
	SidecarKVStar SidecarKind = 4
	// SidecarHash is GSA On-Device's per-token key hash codes.
	SidecarHash SidecarKind = 5
)

// String returns "esa-mean", "esa-max", "quest", "kvstar", "hash" or "sidecar-kind(N)".
func (k SidecarKind) String() string {
	switch k {
	case SidecarESAMean:
		return "esa-mean"
	case SidecarESAMax:
		return "esa-max"
	case SidecarQuest:
		return "quest"
	case SidecarKVStar:
		return "kvstar"
	case SidecarHash:
		return "hash"
	}
	return fmt.Sprintf("sidecar-kind(%d)", uint16(k))
}

// Valid reports whether k is one of the defined kinds.
func (k SidecarKind) Valid() bool { return k >= SidecarESAMean && k <= SidecarHash }

// Payload constants.
const (
	// SidecarHeaderSize is the bytes of the header at the start of every part of a payload.
	SidecarHeaderSize = 64
	// SidecarVersion is the payload format version this package writes and reads.
	SidecarVersion = 1
	// MaxSidecarBytes bounds a payload (every part).
	MaxSidecarBytes = 1 << 30
	// MaxLayers is the most layers a sidecar covers.
	MaxLayers = 4096
)

var sidecarMagic = [4]byte{'U', 'C', 'R', 'P'}

const (
	scOffVersion  = 4
	scOffKind     = 6
	scOffElem     = 8
	scOffInput    = 9
	scOffLayers   = 10
	scOffHeads    = 12
	scOffDim      = 14
	scOffBlock    = 16
	scOffTokens   = 18
	scOffRows     = 20
	scOffCols     = 22
	scOffStride   = 24
	scOffMerge    = 28
	scOffHashBits = 30
	scOffRatio    = 32
	scOffSeed     = 40
	scOffRopeDim  = 48
	scOffRopeBits = 50
	scOffFinger   = 52
	scOffLayer    = 56
	scOffReserved = 58
	scOffCRC      = 60
)

// SidecarSpec is what a store fixes for every sidecar of one kind: the model's shape and the
// kind's parameters. It alone determines the payload's size and every layer's offset.
type SidecarSpec struct {
	Kind SidecarKind
	// Layers, Heads (KV heads), Dim (head dim of K) and BlockSize (tokens of a full block).
	Layers, Heads, Dim, BlockSize int
	// Elem is the element type of stored values for the float kinds (ESA, Quest, KVStar):
	// Float16, BFloat16 or Float32 (DefaultSidecarElem picks one losslessly for min and max);
	// 0 for SidecarHash.
	Elem DType
	// PruneRatio and Merge are KVStar's parameters (see KVStarParams); 0 for other kinds.
	PruneRatio float64
	Merge      int
	// HashBits, Seed, RopeDim and RopeBits are SidecarHash's encoders: encoder 0 hashes the
	// first Dim−RopeDim elements of each head into HashBits bits with seed Seed; when RopeDim >
	// 0 (MLA: kv_lora_rank then qk_rope_head_dim), encoder 1 hashes the last RopeDim into
	// RopeBits bits with seed Seed+1; a token's code is encoder 0's then encoder 1's. 0 for
	// other kinds.
	HashBits int
	Seed     uint64
	RopeDim  int
	RopeBits int
}

// DefaultSidecarElem is the stored element type that represents every min, max and mean of
// keys of dtype input exactly or within one rounding and never overflows: Float16 for Float16
// and the float8 types (their values are all float16 values), BFloat16 for BFloat16, Float32
// for Float32.
func DefaultSidecarElem(input DType) DType {
	switch input {
	case BFloat16:
		return BFloat16
	case Float32:
		return Float32
	}
	return Float16
}

func (s SidecarSpec) kvstar() KVStarParams {
	return KVStarParams{BlockSize: s.BlockSize, PruneRatio: s.PruneRatio, Merge: s.Merge}
}

// Validate checks the spec and returns ErrInvalid naming the field at fault.
func (s SidecarSpec) Validate() error {
	switch {
	case !s.Kind.Valid():
		return errorf(ErrInvalid, "sidecar: kind %d", uint16(s.Kind))
	case s.Layers < 1 || s.Layers > MaxLayers:
		return errorf(ErrInvalid, "sidecar %v: layers %d not in [1, %d]", s.Kind, s.Layers, MaxLayers)
	case s.BlockSize < 1 || s.BlockSize > MaxBlockTokens:
		return errorf(ErrInvalid, "sidecar %v: block size %d not in [1, %d]", s.Kind, s.BlockSize, MaxBlockTokens)
	}
	if err := (KShape{Tokens: s.BlockSize, Heads: s.Heads, Dim: s.Dim}).Validate(); err != nil {
		return errorf(ErrInvalid, "sidecar %v: %s", s.Kind, plain(err))
	}
	if s.Kind == SidecarHash {
		if s.Elem != 0 || s.PruneRatio != 0 || s.Merge != 0 {
			return errorf(ErrInvalid, "sidecar %v: element dtype %v, prune ratio %v, merge %d must be 0", s.Kind, s.Elem, s.PruneRatio, s.Merge)
		}
		d0 := s.Dim - s.RopeDim
		if s.RopeDim < 0 || d0 < 1 {
			return errorf(ErrInvalid, "sidecar %v: rope dim %d of head dim %d", s.Kind, s.RopeDim, s.Dim)
		}
		if err := checkHashPart(d0, s.HashBits); err != nil {
			return errorf(ErrInvalid, "sidecar %v: encoder 0: %v", s.Kind, err)
		}
		if s.RopeDim == 0 && s.RopeBits != 0 {
			return errorf(ErrInvalid, "sidecar %v: rope bits %d without a rope dim", s.Kind, s.RopeBits)
		}
		if s.RopeDim > 0 {
			if err := checkHashPart(s.RopeDim, s.RopeBits); err != nil {
				return errorf(ErrInvalid, "sidecar %v: encoder 1 (rope): %v", s.Kind, err)
			}
		}
	} else {
		if s.Elem != Float16 && s.Elem != BFloat16 && s.Elem != Float32 {
			return errorf(ErrInvalid, "sidecar %v: element dtype %v (want float16, bfloat16 or float32)", s.Kind, s.Elem)
		}
		if s.HashBits != 0 || s.Seed != 0 || s.RopeDim != 0 || s.RopeBits != 0 {
			return errorf(ErrInvalid, "sidecar %v: hash fields must be 0", s.Kind)
		}
		if s.Kind == SidecarKVStar {
			if err := s.kvstar().Validate(s.Dim); err != nil {
				return errorf(ErrInvalid, "sidecar %v: %s", s.Kind, plain(err))
			}
		} else if s.PruneRatio != 0 || s.Merge != 0 {
			return errorf(ErrInvalid, "sidecar %v: prune ratio %v and merge %d must be 0", s.Kind, s.PruneRatio, s.Merge)
		}
	}
	if n := int64(s.Layers) * s.partBytes(); n > MaxSidecarBytes {
		return errorf(ErrInvalid, "sidecar %v: %d layers of %d bytes exceed %d bytes", s.Kind, s.Layers, s.partBytes(), MaxSidecarBytes)
	}
	return nil
}

func checkHashPart(dim, hbits int) error {
	switch {
	case dim > MaxHashDim:
		return fmt.Errorf("input dim %d over %d", dim, MaxHashDim)
	case hbits < 8 || hbits%8 != 0 || hbits > dim:
		return fmt.Errorf("hash bits %d: want a multiple of 8 in [8, %d]", hbits, dim)
	}
	return nil
}

// Rows is the rows of one layer's data: 1 (ESA), 2 (Quest: min, max), BlockSize/Merge
// (KVStar), BlockSize (hash).
func (s SidecarSpec) Rows() int {
	switch s.Kind {
	case SidecarQuest:
		return 2
	case SidecarKVStar:
		if s.Merge < 1 {
			return 0
		}
		return s.BlockSize / s.Merge
	case SidecarHash:
		return s.BlockSize
	}
	return 1
}

// Cols is the values (or code bytes) of one row of one head: Dim (ESA, Quest), d' (KVStar),
// the code bytes (HashBits+RopeBits)/8 (hash).
func (s SidecarSpec) Cols() int {
	switch s.Kind {
	case SidecarKVStar:
		return s.kvstar().KeptDims(s.Dim)
	case SidecarHash:
		return (s.HashBits + s.RopeBits) / 8
	}
	return s.Dim
}

func pad8(n int64) int64 { return (n + 7) &^ 7 }

// channelBytes is the KVStar channel table's size in a part, padded to 8 (0 for other kinds).
func (s SidecarSpec) channelBytes() int64 {
	if s.Kind != SidecarKVStar {
		return 0
	}
	return pad8(2 * int64(s.Heads) * int64(s.Cols()))
}

func (s SidecarSpec) elemSize() int64 {
	if s.Kind == SidecarHash {
		return 1
	}
	return int64(s.Elem.Size())
}

// valueCount is the values (or code bytes) of one layer: Rows·Heads·Cols.
func (s SidecarSpec) valueCount() int64 { return int64(s.Rows()) * int64(s.Heads) * int64(s.Cols()) }

// dataBytes is the bytes of one layer's data, unpadded.
func (s SidecarSpec) dataBytes() int64 { return s.channelBytes() + s.valueCount()*s.elemSize() }

// partBytes is the bytes of one part: header, data, padding to 8.
func (s SidecarSpec) partBytes() int64 { return SidecarHeaderSize + pad8(s.dataBytes()) }

// PartBytes is the size of one layer's part, header included, a multiple of 8 (0 for an
// invalid spec). It is the same for every layer and every block of the spec.
func (s SidecarSpec) PartBytes() int {
	if s.Validate() != nil {
		return 0
	}
	return int(s.partBytes())
}

// PayloadBytes is the size of a whole payload, Layers·PartBytes (0 for an invalid spec).
func (s SidecarSpec) PayloadBytes() int {
	if s.Validate() != nil {
		return 0
	}
	return s.Layers * int(s.partBytes())
}

// LayerRange is the byte range [off, off+n) of layer's part within a payload of this spec:
// off = layer·PartBytes, n = PartBytes. It returns ErrInvalid for an invalid spec and
// ErrOutOfRange for a layer outside [0, Layers).
func (s SidecarSpec) LayerRange(layer int) (off, n int, err error) {
	if err := s.Validate(); err != nil {
		return 0, 0, err
	}
	if layer < 0 || layer >= s.Layers {
		return 0, 0, errorf(ErrOutOfRange, "sidecar %v: layer %d of %d", s.Kind, layer, s.Layers)
	}
	pb := int(s.partBytes())
	return layer * pb, pb, nil
}

// HashEncoders builds the hash encoders of a SidecarHash spec: encoder 0, and encoder 1 when
// RopeDim > 0. It returns ErrInvalid for other kinds or an invalid spec.
func (s SidecarSpec) HashEncoders() ([]*HashEncoder, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.Kind != SidecarHash {
		return nil, errorf(ErrInvalid, "sidecar %v: no hash encoders", s.Kind)
	}
	e0, err := NewHashEncoder(s.Dim-s.RopeDim, s.HashBits, s.Seed)
	if err != nil {
		return nil, err
	}
	if s.RopeDim == 0 {
		return []*HashEncoder{e0}, nil
	}
	e1, err := NewHashEncoder(s.RopeDim, s.RopeBits, s.Seed+1)
	if err != nil {
		return nil, err
	}
	return []*HashEncoder{e0, e1}, nil
}

// HashFingerprint combines the fingerprints of a hash sidecar's encoders: encoder 0's
// Fingerprint when there is one, else the CRC-32C of every encoder's fingerprint
// (little-endian, in order).
func HashFingerprint(encs ...*HashEncoder) uint32 {
	if len(encs) == 1 && encs[0] != nil {
		return encs[0].fp
	}
	var b []byte
	for _, e := range encs {
		if e != nil {
			b = binary.LittleEndian.AppendUint32(b, e.fp)
		}
	}
	return crc32c.Checksum(b)
}

// SidecarHeader is a payload's header: the spec, and what is particular to the block.
type SidecarHeader struct {
	SidecarSpec
	// Input is the dtype of the K the kernels read.
	Input DType
	// Tokens is the tokens of the block, in [1, BlockSize].
	Tokens int
	// Fingerprint is HashFingerprint of the encoders that made a hash sidecar's codes (0 for
	// other kinds): a reader compares it with its own encoders' before comparing codes.
	Fingerprint uint32
}

// validate checks the header's own fields beyond the spec.
func (h *SidecarHeader) validate() error {
	if err := h.SidecarSpec.Validate(); err != nil {
		return err
	}
	switch {
	case !h.Input.Valid():
		return errorf(ErrInvalid, "sidecar %v: input dtype %v", h.Kind, h.Input)
	case h.Tokens < 1 || h.Tokens > h.BlockSize:
		return errorf(ErrInvalid, "sidecar %v: tokens %d not in [1, block size %d]", h.Kind, h.Tokens, h.BlockSize)
	case h.Kind != SidecarHash && h.Fingerprint != 0:
		return errorf(ErrInvalid, "sidecar %v: fingerprint %#x must be 0", h.Kind, h.Fingerprint)
	}
	return nil
}

// ValidRows is the rows of each layer's data that hold this block's values; the rest are
// zero: ⌈Tokens/Merge⌉ (KVStar), Tokens (hash), Rows otherwise.
func (h *SidecarHeader) ValidRows() int {
	switch h.Kind {
	case SidecarKVStar:
		return h.kvstar().Rows(h.Tokens)
	case SidecarHash:
		return h.Tokens
	}
	return h.Rows()
}

// putHeader writes the 64-byte header of layer's part of a validated h to b.
func putHeader(b []byte, h *SidecarHeader, layer int) {
	le := binary.LittleEndian
	b = b[:SidecarHeaderSize]
	clear(b)
	copy(b, sidecarMagic[:])
	le.PutUint16(b[scOffVersion:], SidecarVersion)
	le.PutUint16(b[scOffKind:], uint16(h.Kind))
	b[scOffElem] = byte(h.Elem)
	b[scOffInput] = byte(h.Input)
	le.PutUint16(b[scOffLayers:], uint16(h.Layers))
	le.PutUint16(b[scOffHeads:], uint16(h.Heads))
	le.PutUint16(b[scOffDim:], uint16(h.Dim))
	le.PutUint16(b[scOffBlock:], uint16(h.BlockSize))
	le.PutUint16(b[scOffTokens:], uint16(h.Tokens))
	le.PutUint16(b[scOffRows:], uint16(h.Rows()))
	le.PutUint16(b[scOffCols:], uint16(h.Cols()))
	le.PutUint32(b[scOffStride:], uint32(h.partBytes()))
	le.PutUint16(b[scOffMerge:], uint16(h.Merge))
	le.PutUint16(b[scOffHashBits:], uint16(h.HashBits))
	le.PutUint64(b[scOffRatio:], math.Float64bits(h.PruneRatio))
	le.PutUint64(b[scOffSeed:], h.Seed)
	le.PutUint16(b[scOffRopeDim:], uint16(h.RopeDim))
	le.PutUint16(b[scOffRopeBits:], uint16(h.RopeBits))
	le.PutUint32(b[scOffFinger:], h.Fingerprint)
	le.PutUint16(b[scOffLayer:], uint16(layer))
	le.PutUint32(b[scOffCRC:], crc32c.Checksum(b[:scOffCRC]))
}

// DecodeSidecarHeader decodes and verifies the header at the start of b, a part (at least
// SidecarHeaderSize bytes; the data need not follow), and returns it with the part's layer.
// Bad magic, version, checksum or fields return ErrCorrupt naming the field.
func DecodeSidecarHeader(b []byte) (h SidecarHeader, layer int, err error) {
	if len(b) < SidecarHeaderSize {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: %d bytes, want %d", len(b), SidecarHeaderSize)
	}
	le := binary.LittleEndian
	if [4]byte(b[:4]) != sidecarMagic {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: magic %q", b[:4])
	}
	if got, want := le.Uint32(b[scOffCRC:]), crc32c.Checksum(b[:scOffCRC]); got != want {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: checksum %#x, computed %#x", got, want)
	}
	if v := le.Uint16(b[scOffVersion:]); v != SidecarVersion {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: version %d (this build reads %d)", v, SidecarVersion)
	}
	if r := le.Uint16(b[scOffReserved:]); r != 0 {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: reserved bytes %#x", r)
	}
	h = SidecarHeader{
		SidecarSpec: SidecarSpec{
			Kind:       SidecarKind(le.Uint16(b[scOffKind:])),
			Layers:     int(le.Uint16(b[scOffLayers:])),
			Heads:      int(le.Uint16(b[scOffHeads:])),
			Dim:        int(le.Uint16(b[scOffDim:])),
			BlockSize:  int(le.Uint16(b[scOffBlock:])),
			Elem:       DType(b[scOffElem]),
			PruneRatio: math.Float64frombits(le.Uint64(b[scOffRatio:])),
			Merge:      int(le.Uint16(b[scOffMerge:])),
			HashBits:   int(le.Uint16(b[scOffHashBits:])),
			Seed:       le.Uint64(b[scOffSeed:]),
			RopeDim:    int(le.Uint16(b[scOffRopeDim:])),
			RopeBits:   int(le.Uint16(b[scOffRopeBits:])),
		},
		Input:       DType(b[scOffInput]),
		Tokens:      int(le.Uint16(b[scOffTokens:])),
		Fingerprint: le.Uint32(b[scOffFinger:]),
	}
	if err := h.validate(); err != nil {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: %s", plain(err))
	}
	if rows, cols, pb := int(le.Uint16(b[scOffRows:])), int(le.Uint16(b[scOffCols:])), int64(le.Uint32(b[scOffStride:])); rows != h.Rows() || cols != h.Cols() || pb != h.partBytes() {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: rows/cols/part bytes %d/%d/%d, the fields give %d/%d/%d", rows, cols, pb, h.Rows(), h.Cols(), h.partBytes())
	}
	layer = int(le.Uint16(b[scOffLayer:]))
	if layer >= h.Layers {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar header: layer %d of %d", layer, h.Layers)
	}
	return h, layer, nil
}

// Sidecar is one block's representation of one kind across every layer, decoded.
type Sidecar struct {
	SidecarHeader
	// Values holds the float kinds' values, [Layers][Rows][Heads][Cols]: ESA [layers][1][heads]
	// [dim]; Quest [layers][2][heads][dim] (min, then max); KVStar [layers][BlockSize/Merge]
	// [heads][d'], rows from ValidRows on zero. Nil for SidecarHash.
	Values []float32
	// Channels holds KVStar's kept channels, [Layers][Heads][d'], ascending per head. Nil for
	// other kinds.
	Channels []uint16
	// Codes holds SidecarHash's codes, [Layers][BlockSize][Heads][c], rows from Tokens on zero.
	// Nil for other kinds.
	Codes []byte
}

// EncodeSidecar appends the payload of s to dst. Stored values are rounded to s.Elem; a
// finite value that overflows it is ErrOutOfRange; a malformed s (header fields, slice
// lengths, channels not ascending or ≥ Dim, nonzero padding rows) is ErrInvalid.
func EncodeSidecar(dst []byte, s *Sidecar) ([]byte, error) {
	h := &s.SidecarHeader
	if err := h.validate(); err != nil {
		return dst, err
	}
	per := int(h.valueCount())
	perC := 0
	var nv, nb int
	switch h.Kind {
	case SidecarHash:
		nb = h.Layers * per
	case SidecarKVStar:
		perC = h.Heads * h.Cols()
		fallthrough
	default:
		nv = h.Layers * per
	}
	if len(s.Values) != nv || len(s.Channels) != h.Layers*perC || len(s.Codes) != nb {
		return dst, errorf(ErrInvalid, "sidecar %v: %d values, %d channels, %d code bytes; want %d, %d, %d", h.Kind, len(s.Values), len(s.Channels), len(s.Codes), nv, h.Layers*perC, nb)
	}
	start := len(dst)
	dst = append(dst, make([]byte, h.Layers*int(h.partBytes()))...)
	out := dst[start:]
	for l := range h.Layers {
		off, n, _ := h.LayerRange(l)
		part := out[off : off+n]
		putHeader(part, h, l)
		var err error
		switch h.Kind {
		case SidecarHash:
			err = h.putCodes(part, s.Codes[l*per:(l+1)*per])
		case SidecarKVStar:
			err = h.putChannels(part, s.Channels[l*perC:(l+1)*perC])
			if err == nil {
				err = h.putValues(part, s.Values[l*per:(l+1)*per])
			}
		default:
			err = h.putValues(part, s.Values[l*per:(l+1)*per])
		}
		if err != nil {
			return dst[:start], fmt.Errorf("sidecar %v: layer %d: %w", h.Kind, l, err)
		}
	}
	return dst, nil
}

// plain is err's message without the package error it wraps, for rewrapping as another kind.
func plain(err error) string {
	m := err.Error()
	for _, k := range []error{ErrInvalid, ErrOutOfRange, ErrCorrupt} {
		m = strings.TrimPrefix(m, k.Error()+": ")
	}
	return m
}

// rowValues is the values of one row of a layer's data (all heads).
func (s *SidecarSpec) rowValues() int { return s.Heads * s.Cols() }

// putValues encodes one layer's values (Rows·Heads·Cols) into part after its header and
// channel table.
func (h *SidecarHeader) putValues(part []byte, v []float32) error {
	valid := h.ValidRows() * h.rowValues()
	for i, x := range v[valid:] {
		if x != 0 || math.Signbit(float64(x)) {
			return errorf(ErrInvalid, "value %d of padding row %d is %v, not zero", i%h.rowValues(), (valid+i)/h.rowValues(), x)
		}
	}
	vals := part[SidecarHeaderSize+h.channelBytes():]
	es := int(h.elemSize())
	encodeRow(vals[:valid*es], v[:valid], h.Elem)
	if h.Elem == Float32 {
		return nil
	}
	inf := uint16(0x7c00) // float16
	if h.Elem == BFloat16 {
		inf = 0x7f80
	}
	for i, x := range v[:valid] {
		if binary.LittleEndian.Uint16(vals[i*es:])&0x7fff == inf && !math.IsInf(float64(x), 0) {
			return errorf(ErrOutOfRange, "value %d (%v) overflows %v", i, x, h.Elem)
		}
	}
	return nil
}

// putChannels writes one layer's KVStar channel table after the part's header.
func (h *SidecarHeader) putChannels(part []byte, ch []uint16) error {
	tab := part[SidecarHeaderSize:]
	for i, c := range ch {
		binary.LittleEndian.PutUint16(tab[2*i:], c)
	}
	if err := h.checkChannels(tab); err != nil {
		return errorf(ErrInvalid, "%v", err)
	}
	return nil
}

// checkChannels verifies the channel table at the start of tab: each head's channels
// ascending and below Dim, the table's padding zero.
func (s *SidecarSpec) checkChannels(tab []byte) error {
	cols := s.Cols()
	for hd := range s.Heads {
		prev := -1
		for j := range cols {
			c := int(binary.LittleEndian.Uint16(tab[2*(hd*cols+j):]))
			if c >= s.Dim || c <= prev {
				return fmt.Errorf("head %d: channels not ascending below %d at %d (%d)", hd, s.Dim, j, c)
			}
			prev = c
		}
	}
	if !allZero(tab[2*s.Heads*cols : s.channelBytes()]) {
		return fmt.Errorf("channel table padding not zero")
	}
	return nil
}

// putCodes copies one layer's hash codes into part after its header.
func (h *SidecarHeader) putCodes(part []byte, codes []byte) error {
	valid := h.ValidRows() * h.rowValues()
	for i, b := range codes[valid:] {
		if b != 0 {
			return errorf(ErrInvalid, "code byte %d of padding row %d is %#x, not zero", i%h.rowValues(), (valid+i)/h.rowValues(), b)
		}
	}
	copy(part[SidecarHeaderSize:], codes)
	return nil
}

// DecodeSidecar decodes a whole payload. b must be exactly the payload (Layers parts whose
// headers agree, each with its layer index in order); anything malformed is ErrCorrupt.
func DecodeSidecar(b []byte) (*Sidecar, error) {
	h, layer, err := DecodeSidecarHeader(b)
	if err != nil {
		return nil, err
	}
	if want := int64(h.Layers) * h.partBytes(); int64(len(b)) != want {
		return nil, errorf(ErrCorrupt, "sidecar %v: %d bytes, the header gives %d", h.Kind, len(b), want)
	}
	if layer != 0 {
		return nil, errorf(ErrCorrupt, "sidecar %v: first part is layer %d", h.Kind, layer)
	}
	s := &Sidecar{SidecarHeader: h}
	per := int(h.valueCount())
	perC := 0
	switch h.Kind {
	case SidecarHash:
		s.Codes = make([]byte, h.Layers*per)
	case SidecarKVStar:
		perC = h.Heads * h.Cols()
		s.Channels = make([]uint16, h.Layers*perC)
		fallthrough
	default:
		s.Values = make([]float32, h.Layers*per)
	}
	for l := range h.Layers {
		off, n, _ := h.LayerRange(l)
		part := b[off : off+n]
		if l > 0 {
			hl, ll, err := DecodeSidecarHeader(part)
			if err != nil {
				return nil, fmt.Errorf("sidecar %v: layer %d: %w", h.Kind, l, err)
			}
			// The bytes too: a ratio of -0 equals 0 but would not encode back to this part.
			if hl != h || ll != l || !bytes.Equal(part[:scOffLayer], b[:scOffLayer]) {
				return nil, errorf(ErrCorrupt, "sidecar %v: part %d's header (layer %d) differs from part 0's", h.Kind, l, ll)
			}
		}
		var v []float32
		var ch []uint16
		var codes []byte
		switch h.Kind {
		case SidecarHash:
			codes = s.Codes[l*per : (l+1)*per]
		case SidecarKVStar:
			ch = s.Channels[l*perC : (l+1)*perC]
			fallthrough
		default:
			v = s.Values[l*per : (l+1)*per]
		}
		if err := h.decodeData(v, ch, codes, part); err != nil {
			return nil, errorf(ErrCorrupt, "sidecar %v: layer %d: %v", h.Kind, l, err)
		}
	}
	return s, nil
}

// DecodeSidecarPart decodes one part (one layer of one block: the LayerRange bytes of a
// payload, or one block's slot of engine.LoadSidecars) on its own, as the top-K scan does with
// the parts of many blocks, and returns its header and layer. values ([Rows][Heads][Cols],
// float kinds) and channels ([Heads][Cols], KVStar) receive the data when not nil and must then
// have exactly those lengths (ErrInvalid otherwise); hash codes are read in place,
// part[SidecarHeaderSize:][:Rows·Heads·Cols]. Everything, data included, is verified:
// malformed parts are ErrCorrupt.
func DecodeSidecarPart(part []byte, values []float32, channels []uint16) (h SidecarHeader, layer int, err error) {
	h, layer, err = DecodeSidecarHeader(part)
	if err != nil {
		return SidecarHeader{}, 0, err
	}
	if int64(len(part)) != h.partBytes() {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar %v part: %d bytes, the header gives %d", h.Kind, len(part), h.partBytes())
	}
	wantV, wantC := int(h.valueCount()), 0
	switch h.Kind {
	case SidecarHash:
		wantV = 0
	case SidecarKVStar:
		wantC = h.Heads * h.Cols()
	}
	if values != nil && len(values) != wantV || channels != nil && len(channels) != wantC {
		return SidecarHeader{}, 0, errorf(ErrInvalid, "sidecar %v part: %d values and %d channels, want %d and %d", h.Kind, len(values), len(channels), wantV, wantC)
	}
	if err := h.decodeData(values, channels, nil, part); err != nil {
		return SidecarHeader{}, 0, errorf(ErrCorrupt, "sidecar %v part of layer %d: %v", h.Kind, layer, err)
	}
	return h, layer, nil
}

// decodeData verifies one part's data (len(part) == partBytes) and decodes it into the
// non-nil destinations.
func (h *SidecarHeader) decodeData(v []float32, ch []uint16, codes []byte, part []byte) error {
	data := part[SidecarHeaderSize:]
	if h.Kind == SidecarKVStar {
		if err := h.checkChannels(data); err != nil {
			return err
		}
		for i := range ch {
			ch[i] = binary.LittleEndian.Uint16(data[2*i:])
		}
	}
	vals := data[h.channelBytes():h.dataBytes()]
	valid := int64(h.ValidRows()*h.rowValues()) * h.elemSize()
	if !allZero(vals[valid:]) || !allZero(data[h.dataBytes():]) {
		return fmt.Errorf("padding rows or bytes not zero")
	}
	if i := signalingNaN(vals[:valid], h.Elem); i >= 0 {
		return fmt.Errorf("value %d is a signaling NaN, which no encoder writes", i)
	}
	switch {
	case h.Kind == SidecarHash:
		copy(codes, vals)
	case v != nil:
		decodeRow(v, vals, h.Elem)
	}
	return nil
}

// signalingNaN returns the index of the first signaling-NaN code among the float16 or bfloat16
// values b, or -1. The encoders write NaN only as a quiet NaN (Float32ToFloat16,
// Float32ToBFloat16), and a signaling one would not decode and encode back to the same bytes:
// such a code was not written here. It tests four values per 64-bit word (halfSignaling), 16
// per iteration, so that verifying a part costs about a read of it.
func signalingNaN(b []byte, elem DType) int {
	var mant, quiet uint64
	switch elem {
	case Float16:
		mant, quiet = 0x03ff*lanes16, 0x0200*lanes16
	case BFloat16:
		mant, quiet = 0x007f*lanes16, 0x0040*lanes16
	default:
		return -1
	}
	const top = 0x8000 * lanes16
	i := 0
	for w := b; len(w) >= 32; w = w[32:] {
		if (halfSignaling(binary.LittleEndian.Uint64(w), mant, quiet)|
			halfSignaling(binary.LittleEndian.Uint64(w[8:]), mant, quiet)|
			halfSignaling(binary.LittleEndian.Uint64(w[16:]), mant, quiet)|
			halfSignaling(binary.LittleEndian.Uint64(w[24:]), mant, quiet))&top != 0 {
			break // the word loop below finds which value
		}
		i += 32
	}
	for ; i+8 <= len(b); i += 8 {
		if s := halfSignaling(binary.LittleEndian.Uint64(b[i:]), mant, quiet) & top; s != 0 {
			return i/2 + bits.TrailingZeros64(s)/16
		}
	}
	for ; i+2 <= len(b); i += 2 {
		if halfSignaling(uint64(binary.LittleEndian.Uint16(b[i:])), mant, quiet)&top != 0 {
			return i / 2
		}
	}
	return -1
}

// lanes16 is 1 in each 16-bit lane of a 64-bit word.
const lanes16 = 0x0001_0001_0001_0001

// halfSignaling tests four little-endian 16-bit floats at once: bit 15 of a lane of the result
// is set exactly when that value is a signaling NaN (the other bits are meaningless). mant and
// quiet are the format's mantissa mask and quiet bit in every lane (float16 0x03ff and 0x0200,
// bfloat16 0x007f and 0x0040). With the sign cleared (a ≤ 0x7fff, so no sum leaves its lane),
// a + mant reaches bit 15 exactly when a is above the infinity code (exponent all ones,
// mantissa not zero: a NaN) and a + quiet exactly when a is at or above the first quiet NaN:
// a signaling NaN is the first without the second.
func halfSignaling(w, mant, quiet uint64) uint64 {
	a := w & (0x7fff * lanes16)
	return (a + mant) &^ (a + quiet)
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
