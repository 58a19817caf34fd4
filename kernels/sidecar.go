package kernels

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"strings"
)

// Sidecar payloads: the bytes of one block's representation of one kind, for every layer of
// the block. The storage engine keeps one sidecar record per (block, kind) and treats the
// payload as opaque bytes; this file defines them.
//
// A payload is a fixed 64-byte header, then one part per layer, layer-major, each part
// LayerBytes long (a multiple of 8): layer L's part is at SidecarHeaderSize + L·LayerBytes,
// computable from the SidecarSpec alone (LayerRange), so the top-K scan can read layer L of many
// blocks without decoding (or reading) the rest. Parts have a fixed size for a spec whatever
// the block's token count. Stored as a format.RecordSidecar, the natural parts are the header
// followed by one part per layer.
//
// Header (little-endian):
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
//	    20    2 rows per layer part (derived; see the kinds)
//	    22    2 cols per row and head (derived)
//	    24    4 layer bytes: the size of one layer's part (derived, a multiple of 8)
//	    28    2 merge (KVStar; else 0)
//	    30    2 hash bits of the first (or only) hash part (hash; else 0)
//	    32    8 prune ratio, float64 bits (KVStar; else 0)
//	    40    8 seed (hash; else 0): part 0's encoder has this seed, part 1's seed+1
//	    48    2 rope dim: input dims of a second hash part, the last ones of each head (MLA; else 0)
//	    50    2 rope bits: hash bits of the second part (MLA; else 0)
//	    52    4 projection fingerprint (hash; else 0): see SidecarHeader.Fingerprint
//	    56    4 reserved, zero
//	    60    4 CRC-32C (Castagnoli) of bytes 0..59
//
// Layer parts by kind (values are elements of the element dtype, little-endian; "zero" padding
// rows are all-zero bytes):
//
//	1 ESA mean   [heads][dim] mean of K over the block's tokens            rows 1, cols dim
//	2 ESA max    [heads][dim] max of K over the block's tokens             rows 1, cols dim
//	3 Quest      [2][heads][dim]: per-channel min, then max                rows 2, cols dim
//	4 KVStar     channels [heads][d'] uint16 ascending, zero-padded to 8 bytes, then
//	             values [bs/merge][heads][d'] merged rows; rows ⌈tokens/merge⌉ and later are
//	             zero                                                      rows bs/merge, cols d'
//	5 hash       codes [bs][heads][c] bytes (c = Σ hash bits/8 of the parts, LSB-first bits);
//	             rows tokens and later are zero                            rows bs, cols c
//
// Every part is then zero-padded to LayerBytes. The engine's record checksums cover the
// payload; the header carries its own CRC so that a header read alone is verified. Only full
// blocks have block ids (DESIGN §3), so stored sidecars normally have tokens = block size.
//
// Decoding never panics, bounds every length before allocating (a payload is at most
// MaxSidecarBytes) and rejects non-canonical bytes (nonzero reserved fields and padding,
// channel tables out of order) with ErrCorrupt.

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
	// SidecarHeaderSize is the bytes of a sidecar payload's header.
	SidecarHeaderSize = 64
	// SidecarVersion is the payload format version this package writes and reads.
	SidecarVersion = 1
	// MaxSidecarBytes bounds a payload (header and every layer).
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
	scOffReserved = 56
	scOffCRC      = 60
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

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
	// HashBits, Seed, RopeDim and RopeBits are SidecarHash's encoders: part 0 hashes the first
	// Dim−RopeDim elements of each head into HashBits bits with seed Seed; when RopeDim > 0
	// (MLA: kv_lora_rank then qk_rope_head_dim), part 1 hashes the last RopeDim into RopeBits
	// bits with seed Seed+1. 0 for other kinds.
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
		return errorf(ErrInvalid, "sidecar %v: %v", s.Kind, err)
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
			return errorf(ErrInvalid, "sidecar %v: part 0: %v", s.Kind, err)
		}
		if s.RopeDim == 0 && s.RopeBits != 0 {
			return errorf(ErrInvalid, "sidecar %v: rope bits %d without a rope dim", s.Kind, s.RopeBits)
		}
		if s.RopeDim > 0 {
			if err := checkHashPart(s.RopeDim, s.RopeBits); err != nil {
				return errorf(ErrInvalid, "sidecar %v: part 1 (rope): %v", s.Kind, err)
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
				return errorf(ErrInvalid, "sidecar %v: %v", s.Kind, err)
			}
		} else if s.PruneRatio != 0 || s.Merge != 0 {
			return errorf(ErrInvalid, "sidecar %v: prune ratio %v and merge %d must be 0", s.Kind, s.PruneRatio, s.Merge)
		}
	}
	if n := int64(SidecarHeaderSize) + int64(s.Layers)*s.layerBytes(); n > MaxSidecarBytes {
		return errorf(ErrInvalid, "sidecar %v: %d layers of %d bytes exceed %d bytes", s.Kind, s.Layers, s.layerBytes(), MaxSidecarBytes)
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

// Rows is the rows of one layer's part: 1 (ESA), 2 (Quest: min, max), BlockSize/Merge
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

func (s SidecarSpec) layerBytes() int64 {
	return pad8(s.channelBytes() + s.valueCount()*s.elemSize())
}

// LayerBytes is the size of one layer's part, a multiple of 8 (0 for an invalid spec).
func (s SidecarSpec) LayerBytes() int {
	if s.Validate() != nil {
		return 0
	}
	return int(s.layerBytes())
}

// PayloadBytes is the size of a whole payload, SidecarHeaderSize + Layers·LayerBytes (0 for an
// invalid spec).
func (s SidecarSpec) PayloadBytes() int {
	if s.Validate() != nil {
		return 0
	}
	return SidecarHeaderSize + s.Layers*int(s.layerBytes())
}

// LayerRange is the byte range [off, off+n) of layer's part within a payload of this spec.
// It returns ErrInvalid for an invalid spec and ErrOutOfRange for a layer outside [0, Layers).
func (s SidecarSpec) LayerRange(layer int) (off, n int, err error) {
	if err := s.Validate(); err != nil {
		return 0, 0, err
	}
	if layer < 0 || layer >= s.Layers {
		return 0, 0, errorf(ErrOutOfRange, "sidecar %v: layer %d of %d", s.Kind, layer, s.Layers)
	}
	lb := int(s.layerBytes())
	return SidecarHeaderSize + layer*lb, lb, nil
}

// HashEncoders builds the hash encoders of a SidecarHash spec: part 0, and part 1 when RopeDim
// > 0. It returns ErrInvalid for other kinds or an invalid spec.
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

// HashFingerprint combines the fingerprints of a hash sidecar's encoders: part 0's
// Fingerprint for one part, else the CRC-32C of every part's fingerprint (little-endian, in
// order).
func HashFingerprint(parts ...*HashEncoder) uint32 {
	if len(parts) == 1 && parts[0] != nil {
		return parts[0].fp
	}
	var b []byte
	for _, p := range parts {
		if p != nil {
			b = binary.LittleEndian.AppendUint32(b, p.fp)
		}
	}
	return crc32.Checksum(b, castagnoli)
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

// validRows is the rows of a layer part that hold data for this block (the rest are zero).
func (h *SidecarHeader) validRows() int {
	switch h.Kind {
	case SidecarKVStar:
		return h.kvstar().Rows(h.Tokens)
	case SidecarHash:
		return h.Tokens
	}
	return h.Rows()
}

// putHeader writes the 64-byte header of a validated h to b.
func putHeader(b []byte, h *SidecarHeader) {
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
	le.PutUint32(b[scOffStride:], uint32(h.layerBytes()))
	le.PutUint16(b[scOffMerge:], uint16(h.Merge))
	le.PutUint16(b[scOffHashBits:], uint16(h.HashBits))
	le.PutUint64(b[scOffRatio:], math.Float64bits(h.PruneRatio))
	le.PutUint64(b[scOffSeed:], h.Seed)
	le.PutUint16(b[scOffRopeDim:], uint16(h.RopeDim))
	le.PutUint16(b[scOffRopeBits:], uint16(h.RopeBits))
	le.PutUint32(b[scOffFinger:], h.Fingerprint)
	le.PutUint32(b[scOffCRC:], crc32.Checksum(b[:scOffCRC], castagnoli))
}

// DecodeSidecarHeader decodes and verifies the header at the start of b (at least
// SidecarHeaderSize bytes; the layers need not follow). Bad magic, version, checksum or
// fields return ErrCorrupt naming the field.
func DecodeSidecarHeader(b []byte) (SidecarHeader, error) {
	if len(b) < SidecarHeaderSize {
		return SidecarHeader{}, errorf(ErrCorrupt, "sidecar header: %d bytes, want %d", len(b), SidecarHeaderSize)
	}
	le := binary.LittleEndian
	if [4]byte(b[:4]) != sidecarMagic {
		return SidecarHeader{}, errorf(ErrCorrupt, "sidecar header: magic %q", b[:4])
	}
	if got, want := le.Uint32(b[scOffCRC:]), crc32.Checksum(b[:scOffCRC], castagnoli); got != want {
		return SidecarHeader{}, errorf(ErrCorrupt, "sidecar header: checksum %#x, computed %#x", got, want)
	}
	if v := le.Uint16(b[scOffVersion:]); v != SidecarVersion {
		return SidecarHeader{}, errorf(ErrCorrupt, "sidecar header: version %d (this build reads %d)", v, SidecarVersion)
	}
	if r := le.Uint32(b[scOffReserved:]); r != 0 {
		return SidecarHeader{}, errorf(ErrCorrupt, "sidecar header: reserved bytes %#x", r)
	}
	h := SidecarHeader{
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
		return SidecarHeader{}, errorf(ErrCorrupt, "sidecar header: %s", plain(err))
	}
	if rows, cols, lb := int(le.Uint16(b[scOffRows:])), int(le.Uint16(b[scOffCols:])), int64(le.Uint32(b[scOffStride:])); rows != h.Rows() || cols != h.Cols() || lb != h.layerBytes() {
		return SidecarHeader{}, errorf(ErrCorrupt, "sidecar header: rows/cols/layer bytes %d/%d/%d, the fields give %d/%d/%d", rows, cols, lb, h.Rows(), h.Cols(), h.layerBytes())
	}
	return h, nil
}

// Sidecar is one block's representation of one kind across every layer, decoded.
type Sidecar struct {
	SidecarHeader
	// Values holds the float kinds' values, [Layers][Rows][Heads][Cols]: ESA [layers][1][heads]
	// [dim]; Quest [layers][2][heads][dim] (min, then max); KVStar [layers][BlockSize/Merge]
	// [heads][d'], rows from ⌈Tokens/Merge⌉ on zero. Nil for SidecarHash.
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
	var nv, nc, nb int
	switch h.Kind {
	case SidecarHash:
		nb = h.Layers * int(h.valueCount())
	case SidecarKVStar:
		nc = h.Layers * h.Heads * h.Cols()
		fallthrough
	default:
		nv = h.Layers * int(h.valueCount())
	}
	if len(s.Values) != nv || len(s.Channels) != nc || len(s.Codes) != nb {
		return dst, errorf(ErrInvalid, "sidecar %v: %d values, %d channels, %d code bytes; want %d, %d, %d", h.Kind, len(s.Values), len(s.Channels), len(s.Codes), nv, nc, nb)
	}
	start := len(dst)
	total := SidecarHeaderSize + h.Layers*int(h.layerBytes())
	dst = append(dst, make([]byte, total)...)
	out := dst[start:]
	putHeader(out, h)
	perLayerV, perLayerC, perLayerB := nv/h.Layers, nc/h.Layers, nb/h.Layers
	for l := range h.Layers {
		off, n, _ := h.LayerRange(l)
		part := out[off : off+n]
		var err error
		switch h.Kind {
		case SidecarHash:
			err = h.putCodes(part, s.Codes[l*perLayerB:(l+1)*perLayerB])
		case SidecarKVStar:
			err = h.putChannels(part, s.Channels[l*perLayerC:(l+1)*perLayerC])
			if err == nil {
				err = h.putValues(part, s.Values[l*perLayerV:(l+1)*perLayerV])
			}
		default:
			err = h.putValues(part, s.Values[l*perLayerV:(l+1)*perLayerV])
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

// rowValues is the values of one row of a part (all heads).
func (h *SidecarSpec) rowValues() int { return h.Heads * h.Cols() }

// putValues encodes one layer's values (Rows·Heads·Cols) into part after its channel table.
func (h *SidecarHeader) putValues(part []byte, v []float32) error {
	valid := h.validRows() * h.rowValues()
	for i, x := range v[valid:] {
		if x != 0 || math.Signbit(float64(x)) {
			return errorf(ErrInvalid, "value %d of padding row %d is %v, not zero", i%h.rowValues(), (valid+i)/h.rowValues(), x)
		}
	}
	vals := part[h.channelBytes():]
	es := int(h.elemSize())
	encodeRow(vals[:valid*es], v[:valid], h.Elem)
	if h.Elem == Float32 {
		return nil
	}
	for i, x := range v[:valid] {
		var inf bool
		if h.Elem == Float16 {
			inf = binary.LittleEndian.Uint16(vals[i*es:])&0x7fff == 0x7c00
		} else {
			inf = binary.LittleEndian.Uint16(vals[i*es:])&0x7fff == 0x7f80
		}
		if inf && !math.IsInf(float64(x), 0) {
			return errorf(ErrOutOfRange, "value %d (%v) overflows %v", i, x, h.Elem)
		}
	}
	return nil
}

// putChannels writes one layer's KVStar channel table.
func (h *SidecarHeader) putChannels(part []byte, ch []uint16) error {
	if err := h.checkChannels(ch); err != nil {
		return errorf(ErrInvalid, "%v", err)
	}
	for i, c := range ch {
		binary.LittleEndian.PutUint16(part[2*i:], c)
	}
	return nil
}

// checkChannels verifies that each head's channels are ascending and below Dim.
func (h *SidecarSpec) checkChannels(ch []uint16) error {
	cols := h.Cols()
	for hd := range h.Heads {
		row := ch[hd*cols : (hd+1)*cols]
		for j, c := range row {
			if int(c) >= h.Dim || j > 0 && c <= row[j-1] {
				return fmt.Errorf("head %d: channels not ascending below %d at %d (%d)", hd, h.Dim, j, c)
			}
		}
	}
	return nil
}

// putCodes copies one layer's hash codes into part.
func (h *SidecarHeader) putCodes(part []byte, codes []byte) error {
	valid := h.validRows() * h.rowValues()
	for i, b := range codes[valid:] {
		if b != 0 {
			return errorf(ErrInvalid, "code byte %d of padding row %d is %#x, not zero", i%h.rowValues(), (valid+i)/h.rowValues(), b)
		}
	}
	copy(part, codes)
	return nil
}

// DecodeSidecar decodes a whole payload. b must be exactly the payload (header and
// Layers·LayerBytes); anything malformed is ErrCorrupt.
func DecodeSidecar(b []byte) (*Sidecar, error) {
	h, err := DecodeSidecarHeader(b)
	if err != nil {
		return nil, err
	}
	if want := SidecarHeaderSize + int64(h.Layers)*h.layerBytes(); int64(len(b)) != want {
		return nil, errorf(ErrCorrupt, "sidecar %v: %d bytes, the header gives %d", h.Kind, len(b), want)
	}
	s := &Sidecar{SidecarHeader: h}
	per := int(h.valueCount())
	switch h.Kind {
	case SidecarHash:
		s.Codes = make([]byte, h.Layers*per)
	case SidecarKVStar:
		s.Channels = make([]uint16, h.Layers*h.Heads*h.Cols())
		fallthrough
	default:
		s.Values = make([]float32, h.Layers*per)
	}
	perC := h.Heads * h.Cols()
	for l := range h.Layers {
		off, n, _ := h.LayerRange(l)
		part := b[off : off+n]
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
		if err := h.decodeLayer(v, ch, codes, part, h.validRows()); err != nil {
			return nil, errorf(ErrCorrupt, "sidecar %v: layer %d: %v", h.Kind, l, err)
		}
	}
	return s, nil
}

// DecodeLayer decodes one layer's part (the LayerRange bytes of a payload of this spec), as
// the top-K scan does with the parts of many blocks, without the header: values
// ([Rows][Heads][Cols], float kinds) and channels ([Heads][Cols], KVStar) must have exactly
// those lengths, nil otherwise; hash codes are used as stored (part[:Rows·Heads·Cols]) and
// only verified here. Stored blocks are full (DESIGN §3); for a partial block the rows past its
// tokens (see SidecarHeader) are zero. Malformed parts are ErrCorrupt (the channel table, its
// padding, the part's padding), wrong slice lengths ErrInvalid.
func (s SidecarSpec) DecodeLayer(values []float32, channels []uint16, part []byte) error {
	if err := s.Validate(); err != nil {
		return err
	}
	wantV, wantC := int(s.valueCount()), 0
	switch s.Kind {
	case SidecarHash:
		wantV = 0
	case SidecarKVStar:
		wantC = s.Heads * s.Cols()
	}
	if len(values) != wantV || len(channels) != wantC {
		return errorf(ErrInvalid, "sidecar %v layer: %d values and %d channels, want %d and %d", s.Kind, len(values), len(channels), wantV, wantC)
	}
	if int64(len(part)) != s.layerBytes() {
		return errorf(ErrCorrupt, "sidecar %v layer: %d bytes, want %d", s.Kind, len(part), s.layerBytes())
	}
	var codes []byte
	if s.Kind == SidecarHash {
		codes = part[:s.valueCount()]
	}
	if err := s.decodeLayer(values, channels, codes, part, s.Rows()); err != nil {
		return errorf(ErrCorrupt, "sidecar %v layer: %v", s.Kind, err)
	}
	return nil
}

// decodeLayer decodes and verifies one part (len(part) == layerBytes) whose rows from
// validRows on must be zero. codes may alias part.
func (h *SidecarSpec) decodeLayer(v []float32, ch []uint16, codes []byte, part []byte, validRows int) error {
	used := h.channelBytes() + h.valueCount()*h.elemSize()
	if h.Kind == SidecarKVStar {
		for i := range ch {
			ch[i] = binary.LittleEndian.Uint16(part[2*i:])
		}
		if err := h.checkChannels(ch); err != nil {
			return err
		}
		if !allZero(part[2*len(ch) : h.channelBytes()]) {
			return fmt.Errorf("channel table padding not zero")
		}
	}
	validBytes := int64(validRows*h.rowValues()) * h.elemSize()
	data := part[h.channelBytes():used]
	if !allZero(data[validBytes:]) || !allZero(part[used:]) {
		return fmt.Errorf("padding rows or bytes not zero")
	}
	if h.Kind == SidecarHash {
		copy(codes, data)
		return nil
	}
	decodeRow(v, data, h.Elem)
	return nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
