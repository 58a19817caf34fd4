package ucmhash

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
)

// HashMeta is what seeds the chain. It is rendered as "model:tp_size:dtype:rank" (UTF-8,
// decimal integers), exactly like UCM's RequestHasher meta string.
type HashMeta struct {
	// Model is the model name or path, e.g. "Qwen/Qwen2.5-7B-Instruct".
	Model string
	// TPSize is the tensor-parallel world size.
	TPSize int
	// DType is the dtype text of the meta string. To get UCM's ids (engine.HashSchemeUCMPickle) it
	// must be what UCM's connector renders: str() of vLLM's model_config.dtype, a torch.dtype,
	// e.g. "torch.bfloat16" or "torch.float16". A plain "bfloat16" is another meta and gives
	// other ids, so blocks UCM dumped would all miss. (The Python package's RequestHasher,
	// connector/python/ucmgo, takes the torch.dtype itself.)
	DType string
	// Rank is the tensor-parallel rank whose meta seeds the chain. UCM's scheduler hashes with
	// rank 0 and workers of non-MLA models derive their ids with Hasher.ForRank.
	Rank int
}

// metaBytes renders the meta string for the given rank.
func (m HashMeta) metaBytes(rank int) []byte {
	b := make([]byte, 0, len(m.Model)+len(m.DType)+24)
	b = append(b, m.Model...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(m.TPSize), 10)
	b = append(b, ':')
	b = append(b, m.DType...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(rank), 10)
	return b
}

// ucmGoSeedPrefix prefixes the meta in engine.HashSchemeUCMGo's seed.
const ucmGoSeedPrefix = "UCMHASHSEED"

// ucmPickleSeed is the string UCM pickles and hashes to obtain its seed.
const ucmPickleSeed = "UCM_HASH_SEED"

// Hasher turns token ids into chained BlockIDs under one HashMeta and engine.HashScheme. It is
// immutable after NewHasher and safe for concurrent use.
type Hasher struct {
	meta        HashMeta
	scheme      engine.HashScheme
	blockTokens int
	metaBytes   []byte // meta rendered with meta.Rank
	seed        engine.BlockID
	bufs        sync.Pool // *[]byte scratch buffers, prefixed with metaBytes for engine.HashSchemeUCMPickle
}

// NewHasher returns a Hasher for meta and scheme that hashes blocks of blockTokens tokens.
// The error for blockTokens < 1, an unknown scheme, a negative TPSize or Rank, or a Rank not
// below a positive TPSize wraps format.ErrInvalid.
func NewHasher(meta HashMeta, scheme engine.HashScheme, blockTokens int) (*Hasher, error) {
	if blockTokens < 1 {
		return nil, fmt.Errorf("hasher: block tokens %d (want >= 1): %w", blockTokens, format.ErrInvalid)
	}
	if meta.TPSize < 0 || meta.Rank < 0 || (meta.TPSize > 0 && meta.Rank >= meta.TPSize) {
		return nil, fmt.Errorf("hasher: rank %d of tp size %d: %w", meta.Rank, meta.TPSize, format.ErrInvalid)
	}
	if scheme != engine.HashSchemeUCMGo && scheme != engine.HashSchemeUCMPickle {
		return nil, fmt.Errorf("hasher: unknown hash scheme %d: %w", int(scheme), format.ErrInvalid)
	}
	h := &Hasher{meta: meta, scheme: scheme, blockTokens: blockTokens, metaBytes: meta.metaBytes(meta.Rank)}
	switch scheme {
	case engine.HashSchemeUCMGo:
		b := make([]byte, 0, len(ucmGoSeedPrefix)+len(h.metaBytes))
		b = append(append(b, ucmGoSeedPrefix...), h.metaBytes...)
		h.seed = md5.Sum(b)
	case engine.HashSchemeUCMPickle:
		b := append([]byte(nil), h.metaBytes...)
		b = appendPickleStr(b, ucmPickleSeed)
		h.seed = md5.Sum(b)
	}
	return h, nil
}

// Meta returns the meta the Hasher was built with.
func (h *Hasher) Meta() HashMeta { return h.meta }

// Scheme returns the Hasher's scheme.
func (h *Hasher) Scheme() engine.HashScheme { return h.scheme }

// BlockTokens returns the number of tokens per block.
func (h *Hasher) BlockTokens() int { return h.blockTokens }

// Seed returns the chain's seed: the parent of the first block.
func (h *Hasher) Seed() engine.BlockID { return h.seed }

// BlockIDs returns one id per full block of tokens, chained from parent (nil = the seed), so a
// caller can extend a chain incrementally: BlockIDs(a‖b, nil) equals BlockIDs(a, nil) followed
// by BlockIDs(b, &last) when len(a) is a multiple of the block size. A trailing partial block
// is ignored; fewer than BlockTokens tokens yield nil.
func (h *Hasher) BlockIDs(tokens []uint32, parent *engine.BlockID) []engine.BlockID {
	n := len(tokens) / h.blockTokens
	if n == 0 {
		return nil
	}
	prev := h.seed
	if parent != nil {
		prev = *parent
	}
	ids := make([]engine.BlockID, n)
	bp := h.getBuf()
	buf := *bp
	for i := range ids {
		blk := tokens[i*h.blockTokens : (i+1)*h.blockTokens]
		switch h.scheme {
		case engine.HashSchemeUCMPickle:
			buf = appendPickleBlock(buf[:len(h.metaBytes)], &prev, blk)
		default:
			buf = append(buf[:0], prev[:]...)
			for _, t := range blk {
				buf = binary.LittleEndian.AppendUint32(buf, t)
			}
		}
		prev = md5.Sum(buf)
		ids[i] = prev
	}
	*bp = buf
	h.bufs.Put(bp)
	return ids
}

// ForRank re-hashes a rank-0 id for a non-MLA TP rank with UCM's semantics:
// MD5(meta(rank) ‖ id), where meta(rank) is the Hasher's meta string with rank substituted.
// Rank 0 (and every rank of an MLA model, which loads the rank-0 blocks; callers simply do not
// call ForRank there) keeps the id unchanged. The same rule applies under both schemes. rank
// should lie in [0, TPSize); it is not checked here.
func (h *Hasher) ForRank(id engine.BlockID, rank int) engine.BlockID {
	if rank == 0 {
		return id
	}
	var arr [128]byte
	b := arr[:0]
	b = append(b, h.meta.Model...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(h.meta.TPSize), 10)
	b = append(b, ':')
	b = append(b, h.meta.DType...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(rank), 10)
	b = append(b, id[:]...)
	return md5.Sum(b)
}

// getBuf returns a scratch buffer sized for one block; for engine.HashSchemeUCMPickle it already
// holds the meta prefix.
func (h *Hasher) getBuf() *[]byte {
	if bp, ok := h.bufs.Get().(*[]byte); ok {
		return bp
	}
	var b []byte
	switch h.scheme {
	case engine.HashSchemeUCMPickle:
		b = make([]byte, 0, len(h.metaBytes)+pickleBlockMaxLen(h.blockTokens))
		b = append(b, h.metaBytes...)
	default:
		b = make([]byte, 0, format.BlockIDSize+4*h.blockTokens)
	}
	return &b
}

// Minimal pickle protocol-5 encoder, byte-identical to CPython's C pickler (_pickle) for the
// only values UCM's RequestHasher pickles: a str, and a 2-tuple (16-byte bytes, tuple of
// non-negative ints < 2^32).
const (
	pkProto           = 0x80
	pkFrame           = 0x95
	pkShortBinUnicode = 0x8c
	pkBinUnicode      = 'X'
	pkShortBinBytes   = 'C'
	pkBinInt1         = 'K'
	pkBinInt2         = 'M'
	pkBinInt          = 'J'
	pkLong1           = 0x8a
	pkEmptyTuple      = ')'
	pkTuple1          = 0x85
	pkTuple2          = 0x86
	pkTuple3          = 0x87
	pkMark            = '('
	pkTuple           = 't'
	pkMemoize         = 0x94
	pkStop            = '.'

	pkFrameHeaderSize = 9         // FRAME opcode + 8-byte little-endian length
	pkFrameSizeMin    = 4         // CPython drops the header of frames shorter than this
	pkFrameSizeTarget = 64 * 1024 // CPython commits a frame at an object boundary past this
)

// pickleFramer tracks CPython's framing state while appending to a buffer. start is the offset
// of the current frame's reserved header, or -1 when no frame is open (CPython opens one lazily
// on the next write).
type pickleFramer struct{ start int }

// open reserves a frame header if no frame is open.
func (f *pickleFramer) open(b []byte) []byte {
	if f.start < 0 {
		f.start = len(b)
		b = append(b, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	return b
}

// commit closes the open frame: writes its header, or removes the reserved header when the
// frame is shorter than pkFrameSizeMin (as _Pickler_CommitFrame does).
func (f *pickleFramer) commit(b []byte) []byte {
	if f.start < 0 {
		return b
	}
	n := len(b) - f.start - pkFrameHeaderSize
	if n >= pkFrameSizeMin {
		binary.LittleEndian.PutUint64(b[f.start+1:], uint64(n))
	} else {
		b = append(b[:f.start], b[f.start+pkFrameHeaderSize:]...)
	}
	f.start = -1
	return b
}

// boundary is called where CPython's save() calls _Pickler_OpcodeBoundary, i.e. before saving
// each object: a frame that has reached the target size is committed.
func (f *pickleFramer) boundary(b []byte) []byte {
	if f.start >= 0 && len(b)-f.start-pkFrameHeaderSize >= pkFrameSizeTarget {
		return f.commit(b)
	}
	return b
}

// appendPickleStr appends pickle.dumps(s, protocol=5) to b. s must be valid UTF-8.
func appendPickleStr(b []byte, s string) []byte {
	f := pickleFramer{start: -1}
	b = append(b, pkProto, 5)
	b = f.open(b)
	if len(s) >= pkFrameSizeTarget {
		// _Pickler_write_bytes: a large payload bypasses framing; the open frame (empty here)
		// is committed first and framing resumes after the payload.
		b = f.commit(b)
		b = append(b, pkBinUnicode)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
		b = f.open(b)
	} else if len(s) < 256 {
		b = append(b, pkShortBinUnicode, byte(len(s)))
		b = append(b, s...)
	} else {
		b = append(b, pkBinUnicode)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	b = append(b, pkMemoize, pkStop)
	return f.commit(b)
}

// pickleBlockMaxLen bounds the length of appendPickleBlock's output for n tokens.
func pickleBlockMaxLen(n int) int {
	// proto 2, bytes 18+memo 1, mark 1, ints 7 each, tuple+memo 2, tuple2+memo+stop 3, and one
	// frame header per started 64 KiB.
	return 2 + 19 + 1 + 7*n + 5 + pkFrameHeaderSize*(2+7*n/pkFrameSizeTarget)
}

// appendPickleBlock appends pickle.dumps((parent_bytes, tuple(tokens)), protocol=5) to b.
func appendPickleBlock(b []byte, parent *engine.BlockID, tokens []uint32) []byte {
	f := pickleFramer{start: -1}
	b = append(b, pkProto, 5)
	b = f.open(b)
	b = append(b, pkShortBinBytes, format.BlockIDSize)
	b = append(b, parent[:]...)
	b = append(b, pkMemoize)
	// Inner tuple (save_tuple): () has no memo entry; 1-3 items use TUPLEn; longer ones MARK.
	switch n := len(tokens); {
	case n == 0:
		b = append(b, pkEmptyTuple)
	case n <= 3:
		for _, t := range tokens {
			b = f.boundary(b)
			b = f.open(b)
			b = appendPickleUint32(b, t)
		}
		b = append(b, pkTuple1+byte(n-1), pkMemoize)
	default:
		b = append(b, pkMark)
		for _, t := range tokens {
			b = f.boundary(b)
			b = f.open(b)
			b = appendPickleUint32(b, t)
		}
		b = append(b, pkTuple, pkMemoize)
	}
	b = append(b, pkTuple2, pkMemoize, pkStop)
	return f.commit(b)
}

// appendPickleUint32 appends the encoding save_long uses for a non-negative int < 2^32.
func appendPickleUint32(b []byte, t uint32) []byte {
	switch {
	case t < 1<<8:
		return append(b, pkBinInt1, byte(t))
	case t < 1<<16:
		return append(b, pkBinInt2, byte(t), byte(t>>8))
	case t < 1<<31:
		return append(b, pkBinInt, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	default:
		// LONG1: minimal two's-complement little-endian; bit 31 set needs a zero sign byte.
		return append(b, pkLong1, 5, byte(t), byte(t>>8), byte(t>>16), byte(t>>24), 0)
	}
}
