package model

import (
	"github.com/ucm-go/ucm/kernels"
)

// KVCache is a paged KV cache as vLLM's FlashAttention backend lays it out: per layer one
// contiguous tensor [2, num_blocks, block_size, kv_heads, head_dim] of fp16 (little-endian),
// K (after RoPE) in the first half, V in the second. Blocks are handed out to sequences, whose
// block tables map logical block i (tokens [i·block_size, (i+1)·block_size)) to a physical
// block. The per-layer byte slices are exposed so that the staging layer can register them as
// device regions (Spec describes them as a kernels.CacheSpec) and gather or scatter blocks.
//
// A KVCache is not safe for concurrent use: one forward step at a time.
type KVCache struct {
	numBlocks, blockSize, kvHeads, headDim int
	layers                                 [][]byte
	free                                   []int // free physical blocks, a stack
}

// NewKVCache allocates a cache of numBlocks blocks of blockSize tokens for every layer of a
// model of config cfg (kv_heads and head_dim from cfg), all blocks free.
func NewKVCache(cfg Config, numBlocks, blockSize int) (*KVCache, error) {
	if numBlocks < 1 || blockSize < 1 || numBlocks > 1<<24 || blockSize > 1<<16 {
		return nil, invalid("cache of %d blocks of %d tokens", numBlocks, blockSize)
	}
	per := 2 * numBlocks * blockSize * cfg.KVDim() * 2
	if cfg.Layers < 1 || cfg.KVDim() < 1 || per/numBlocks/blockSize != 2*cfg.KVDim()*2 || int64(per)*int64(cfg.Layers) > 1<<36 {
		return nil, invalid("cache of %d blocks of %d tokens for %d layers of %d KV heads × %d is too large", numBlocks, blockSize, cfg.Layers, cfg.KVHeads, cfg.HeadDim)
	}
	c := &KVCache{numBlocks: numBlocks, blockSize: blockSize, kvHeads: cfg.KVHeads, headDim: cfg.HeadDim}
	c.layers = make([][]byte, cfg.Layers)
	for i := range c.layers {
		c.layers[i] = make([]byte, per)
	}
	c.free = make([]int, numBlocks)
	for i := range c.free {
		c.free[i] = numBlocks - 1 - i // block 0 is handed out first
	}
	return c, nil
}

// NumBlocks is the physical blocks per layer.
func (c *KVCache) NumBlocks() int { return c.numBlocks }

// BlockSize is the tokens per block.
func (c *KVCache) BlockSize() int { return c.blockSize }

// KVHeads is the key/value heads.
func (c *KVCache) KVHeads() int { return c.kvHeads }

// HeadDim is the elements per head.
func (c *KVCache) HeadDim() int { return c.headDim }

// DType is the element type: kernels.Float16.
func (c *KVCache) DType() kernels.DType { return kernels.Float16 }

// Layers is the number of layers.
func (c *KVCache) Layers() int { return len(c.layers) }

// Layer returns layer i's tensor, [2, num_blocks, block_size, kv_heads, head_dim] fp16. The
// slice aliases the cache: writes to it are what the model reads.
func (c *KVCache) Layer(i int) []byte { return c.layers[i] }

// Spec describes every layer's tensor for kernels.Register (contiguous, FlashAttention layout).
func (c *KVCache) Spec() kernels.CacheSpec {
	return kernels.CacheSpec{Layout: kernels.LayoutFlashAttn, DType: kernels.Float16,
		NumBlocks: c.numBlocks, BlockSize: c.blockSize, KVHeads: c.kvHeads, HeadDim: c.headDim}
}

// tokenBytes is one token's K (or V) in one layer.
func (c *KVCache) tokenBytes() int { return c.kvHeads * c.headDim * 2 }

// Offset returns the byte offset in a layer's tensor of slot's K (kv = 0) or V (kv = 1), head
// 0 element 0, where slot = block·block_size + offset in block, as in vLLM's slot mapping.
func (c *KVCache) Offset(kv, slot int) int {
	return (kv*c.numBlocks*c.blockSize + slot) * c.tokenBytes()
}

// FreeBlocks is the number of blocks not handed out.
func (c *KVCache) FreeBlocks() int { return len(c.free) }

// Alloc hands out n free blocks (ErrNoBlocks when fewer are free; then none is taken).
func (c *KVCache) Alloc(n int) ([]int, error) {
	if n < 0 || n > len(c.free) {
		return nil, invalidBlocks(n, len(c.free))
	}
	out := make([]int, n)
	for i := range out {
		out[i] = c.free[len(c.free)-1-i]
	}
	c.free = c.free[:len(c.free)-n]
	return out, nil
}

// Free returns blocks to the cache. Ids out of range are ErrInvalid and nothing is freed; the
// caller must not free a block twice or one a sequence still uses.
func (c *KVCache) Free(blocks []int) error {
	for _, b := range blocks {
		if b < 0 || b >= c.numBlocks {
			return invalid("block %d not in [0, %d)", b, c.numBlocks)
		}
	}
	c.free = append(c.free, blocks...)
	return nil
}

func invalidBlocks(n, free int) error {
	if n < 0 {
		return invalid("%d blocks", n)
	}
	return errorsJoin(ErrNoBlocks, "%d blocks asked, %d free", n, free)
}

// Sequence is one request's view of the cache: its block table (physical block of each
// logical block) and how many of its tokens have K/V in the cache.
type Sequence struct {
	// Blocks is the block table: Blocks[i] is the physical block holding positions
	// [i·block_size, (i+1)·block_size). The caller may set it directly (any physical blocks,
	// in any order) or let Reserve grow it from the cache's free blocks.
	Blocks []int
	// Len is the number of positions [0, Len) whose K/V are in the cache.
	Len int
}

// Reserve appends free blocks of c to the block table until it covers n positions.
func (s *Sequence) Reserve(c *KVCache, n int) error {
	need := (n+c.blockSize-1)/c.blockSize - len(s.Blocks)
	if need <= 0 {
		return nil
	}
	b, err := c.Alloc(need)
	if err != nil {
		return err
	}
	s.Blocks = append(s.Blocks, b...)
	return nil
}

// Release frees the sequence's blocks to c and empties it.
func (s *Sequence) Release(c *KVCache) error {
	if err := c.Free(s.Blocks); err != nil {
		return err
	}
	s.Blocks, s.Len = nil, 0
	return nil
}

// SlotMapping returns vLLM's slot mapping for positions: slot = Blocks[p/block_size]·block_size
// + p%block_size, the token-granular index into a layer's K (or V) half.
func (s *Sequence) SlotMapping(c *KVCache, positions []int) ([]int, error) {
	out := make([]int, len(positions))
	for i, p := range positions {
		slot, err := s.slot(c, p)
		if err != nil {
			return nil, err
		}
		out[i] = slot
	}
	return out, nil
}

func (s *Sequence) slot(c *KVCache, p int) (int, error) {
	if p < 0 {
		return 0, invalid("position %d", p)
	}
	lb := p / c.blockSize
	if lb >= len(s.Blocks) {
		return 0, errorsJoin(ErrNoBlocks, "position %d needs logical block %d, the block table has %d", p, lb, len(s.Blocks))
	}
	b := s.Blocks[lb]
	if b < 0 || b >= c.numBlocks {
		return 0, invalid("block table entry %d is block %d, not in [0, %d)", lb, b, c.numBlocks)
	}
	return b*c.blockSize + p%c.blockSize, nil
}
