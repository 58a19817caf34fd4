package kernels

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"
	"sync"
)

// KVLayout is how an inference engine shapes one layer's paged KV cache tensor.
type KVLayout uint8

// The layouts. The numbering may be recorded in schemas: do not renumber.
const (
	// LayoutFlashAttn is vLLM's FlashAttention layout, [2, num_blocks, block_size, kv_heads,
	// head_dim]: all K blocks, then all V blocks.
	LayoutFlashAttn KVLayout = 1
	// LayoutFlashInfer is FlashInfer's layout, [num_blocks, 2, block_size, kv_heads, head_dim]:
	// a block's K and V are adjacent.
	LayoutFlashInfer KVLayout = 2
	// LayoutMLA is multi-head latent attention (DeepSeek-V2), [num_blocks, block_size,
	// kv_lora_rank + rope_dim]: one latent tensor; HeadDim is kv_lora_rank + rope_dim and
	// KVHeads is 1.
	LayoutMLA KVLayout = 3
	// LayoutReRoPE is the ReRoPE variant, [3, num_blocks, block_size, kv_heads, head_dim]: K
	// with rotary embedding applied, V, and K without it (K_rot, V, K_raw).
	LayoutReRoPE KVLayout = 4
)

// String returns "flash_attn", "flashinfer", "mla", "rerope" or "layout(N)".
func (l KVLayout) String() string {
	switch l {
	case LayoutFlashAttn:
		return "flash_attn"
	case LayoutFlashInfer:
		return "flashinfer"
	case LayoutMLA:
		return "mla"
	case LayoutReRoPE:
		return "rerope"
	}
	return fmt.Sprintf("layout(%d)", uint8(l))
}

// ParseKVLayout accepts the String names and "flash", "flash_attention", "vllm",
// "flash_infer", "rerope3" (case-insensitive).
func ParseKVLayout(s string) (KVLayout, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "flash_attn", "flash", "flash_attention", "flashattention", "vllm":
		return LayoutFlashAttn, nil
	case "flashinfer", "flash_infer":
		return LayoutFlashInfer, nil
	case "mla":
		return LayoutMLA, nil
	case "rerope", "rerope3":
		return LayoutReRoPE, nil
	}
	return 0, errorf(ErrInvalid, "unknown KV layout %q", s)
}

// Tensors is the number of tensors a block holds per layer: 2 (K, V), 1 (MLA) or 3 (ReRoPE:
// K_rot, V, K_raw); 0 for an unknown layout.
func (l KVLayout) Tensors() int {
	switch l {
	case LayoutFlashAttn, LayoutFlashInfer:
		return 2
	case LayoutMLA:
		return 1
	case LayoutReRoPE:
		return 3
	}
	return 0
}

// Registration limits, checked before anything is sized from a spec.
const (
	// MaxKVLayers is the most layers a registration may have (the store's shard limit).
	MaxKVLayers = 960
	// MaxKVShardBytes bounds one layer's record bytes per block (the store's shard limit).
	MaxKVShardBytes = 256 << 20
	maxNumBlocks    = 1 << 31
	maxBlockSize    = 1 << 20
	maxKVHeads      = 1 << 16
	maxHeadDim      = 1 << 20
	maxStride       = 1 << 48
)

// TPSlice selects the heads a record holds when the registered tensor holds more heads than
// one tensor-parallel rank's record: with Size n > 1 the record holds heads
// [Rank·KVHeads/n, (Rank+1)·KVHeads/n) of the tensor. Leave it zero when the tensor already is
// one rank's slice, as in a normal tensor-parallel deployment (each rank registers its own
// kv_heads/tp heads, and its records hold all of them).
type TPSlice struct {
	Size int
	Rank int
}

// CacheSpec is the shape of every layer's paged KV cache tensor in a registration.
type CacheSpec struct {
	Layout KVLayout
	DType  DType
	// NumBlocks is the number of paged blocks: engine block ids index [0, NumBlocks).
	NumBlocks int
	// BlockSize is the tokens per block.
	BlockSize int
	// KVHeads is the heads in the registered tensor. MLA has no heads dimension: 0 or 1.
	KVHeads int
	// HeadDim is the elements per head (MLA: kv_lora_rank + rope_dim).
	HeadDim int
	// Strides are the tensor's element strides, one per dimension of the layout's shape in the
	// layout's order (what torch's Tensor.stride() returns); nil means contiguous. They may
	// describe any non-overlapping view, for example vLLM's HND order ([2, num_blocks,
	// kv_heads, block_size, head_dim] in memory) or layers interleaved in one allocation.
	// Overlap is refused: with the dimensions sorted by stride, each stride must exceed the
	// span of the smaller ones (dimensions of size 1 are ignored).
	Strides []int64
	// TP selects a head slice for the records (see TPSlice).
	TP TPSlice
}

// Shape is the tensor's shape in the layout's order, with KVHeads defaulted for MLA.
func (c CacheSpec) Shape() []int {
	switch c.Layout {
	case LayoutFlashAttn:
		return []int{2, c.NumBlocks, c.BlockSize, c.KVHeads, c.HeadDim}
	case LayoutFlashInfer:
		return []int{c.NumBlocks, 2, c.BlockSize, c.KVHeads, c.HeadDim}
	case LayoutReRoPE:
		return []int{3, c.NumBlocks, c.BlockSize, c.KVHeads, c.HeadDim}
	case LayoutMLA:
		return []int{c.NumBlocks, c.BlockSize, c.HeadDim}
	}
	return nil
}

// RecordLayout is the store record a registration maps to: a block's record is one shard per
// layer (shard i = layer i), each shard TensorsPerShard tensors (K then V; MLA: the latent;
// ReRoPE: K_rot, V, K_raw) of TensorBytes each, back to back, each tensor token-major
// [token][head][dim] over the record's heads (the TP slice). Its first three fields are the
// engine's Layout (format.Layout) for the store.
type RecordLayout struct {
	Shards          int   `json:"shards"`
	TensorsPerShard int   `json:"tensors_per_shard"`
	ShardBytes      int64 `json:"shard_bytes"`
	// TensorBytes is block_size × record heads × head_dim × dtype size.
	TensorBytes int64 `json:"tensor_bytes"`
	// Heads is the heads a record holds: KVHeads, or KVHeads/TP.Size with a TP slice.
	Heads int `json:"heads"`
}

// BlockBytes is a whole block's record: Shards × ShardBytes.
func (r RecordLayout) BlockBytes() int64 { return int64(r.Shards) * r.ShardBytes }

// LayerRegion is where one layer's cache tensor lives: device memory and the byte offset of
// the tensor's element 0 in it.
type LayerRegion struct {
	// Name names the layer in errors (for example vLLM's layer name); default "layer i".
	Name   string
	Mem    *Memory
	Offset int64
}

// PagedKV is a validated registration of per-layer paged KV caches: it maps engine block ids
// to the bytes of each layer and gathers and scatters blocks between the caches and staging
// buffers in the RecordLayout (see GatherBlocks and friends). It is immutable and safe for
// concurrent use; the transfers it enqueues follow their streams' ordering.
type PagedKV struct {
	spec   CacheSpec
	dev    *Device
	layers []pagedLayer
	rec    RecordLayout
	es     int64 // element size
	// blockStride is the bytes between consecutive blocks of a layer's tensor; headOff is the
	// byte offset of the record's first head within a block.
	blockStride int64
	headOff     int64
	tmpl        copyTemplate
	seen        sync.Pool // *[]uint64 bitsets of NumBlocks bits, for the duplicate check
}

type pagedLayer struct {
	name string
	mem  *Memory
	off  int64
}

// Register validates a registration of len(layers) layers sharing spec and returns its
// PagedKV. Every problem is reported with the field or layer at fault: shape, dtype, layout,
// strides and TP slices wrap ErrInvalid; a tensor that does not fit its region (region too
// small, offset out of it) wraps ErrOutOfRange.
func Register(spec CacheSpec, layers []LayerRegion) (*PagedKV, error) {
	spec.Strides = append([]int64(nil), spec.Strides...)
	if spec.Layout == LayoutMLA && spec.KVHeads == 0 {
		spec.KVHeads = 1
	}
	g, err := spec.derive()
	if err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	switch {
	case len(layers) == 0:
		return nil, errorf(ErrInvalid, "register: no layers")
	case len(layers) > MaxKVLayers:
		return nil, errorf(ErrInvalid, "register: %d layers exceed %d", len(layers), MaxKVLayers)
	}
	p := &PagedKV{spec: spec, es: int64(spec.DType.Size()), rec: g.rec, blockStride: g.blockStride, headOff: g.headOff, tmpl: g.tmpl}
	p.rec.Shards = len(layers)
	for i, l := range layers {
		name := l.Name
		if name == "" {
			name = fmt.Sprintf("layer %d", i)
		}
		where := fmt.Sprintf("register: layer %d (%q)", i, name)
		if l.Mem == nil {
			return nil, errorf(ErrInvalid, "%s: memory: nil", where)
		}
		if p.dev == nil {
			p.dev = l.Mem.dev
		} else if l.Mem.dev != p.dev {
			return nil, errorf(ErrInvalid, "%s: memory: %v is on device %q, layer 0 on %q", where, l.Mem, l.Mem.dev.opts.Name, p.dev.opts.Name)
		}
		if _, err := l.Mem.bytesFor(p.dev); err != nil {
			return nil, fmt.Errorf("%s: memory: %w", where, err)
		}
		if l.Offset < 0 || l.Offset > l.Mem.size || g.extent > l.Mem.size-l.Offset {
			return nil, errorf(ErrOutOfRange, "%s: region too small: the tensor spans %d bytes from offset %d, %v", where, g.extent, l.Offset, l.Mem)
		}
		p.layers = append(p.layers, pagedLayer{name: name, mem: l.Mem, off: l.Offset})
	}
	words := (spec.NumBlocks + 63) / 64
	p.seen.New = func() any { b := make([]uint64, words); return &b }
	return p, nil
}

// Spec is the registration's spec (with MLA's KVHeads defaulted to 1).
func (p *PagedKV) Spec() CacheSpec {
	s := p.spec
	s.Strides = append([]int64(nil), s.Strides...)
	return s
}

// Layers is the number of registered layers (the record's shards).
func (p *PagedKV) Layers() int { return len(p.layers) }

// Record is the store record layout the registration maps to.
func (p *PagedKV) Record() RecordLayout { return p.rec }

// Device is the device the caches live on.
func (p *PagedKV) Device() *Device { return p.dev }

// RegionBytes is the bytes a layer's region must span from its offset for the spec's tensor
// (the contiguous tensor size when Strides is nil), or the spec's validation error.
func (c CacheSpec) RegionBytes() (int64, error) {
	if c.Layout == LayoutMLA && c.KVHeads == 0 {
		c.KVHeads = 1
	}
	g, err := c.derive()
	if err != nil {
		return 0, err
	}
	return g.extent, nil
}

// Record is the record layout a registration of layers layers with this spec maps to, or the
// spec's validation error.
func (c CacheSpec) Record(layers int) (RecordLayout, error) {
	if c.Layout == LayoutMLA && c.KVHeads == 0 {
		c.KVHeads = 1
	}
	g, err := c.derive()
	if err != nil {
		return RecordLayout{}, err
	}
	if layers < 1 || layers > MaxKVLayers {
		return RecordLayout{}, errorf(ErrInvalid, "layers %d outside [1, %d]", layers, MaxKVLayers)
	}
	g.rec.Shards = layers
	return g.rec, nil
}

// specGeometry is what validating a spec derives.
type specGeometry struct {
	rec         RecordLayout
	extent      int64 // bytes from element 0 to the end of the last element
	blockStride int64
	headOff     int64
	tmpl        copyTemplate
}

// tensorDim is one dimension of a tensor view: its size and its element stride.
type tensorDim struct {
	n      int64
	stride int64
}

func (c CacheSpec) derive() (specGeometry, error) {
	var g specGeometry
	tensors := c.Layout.Tensors()
	if tensors == 0 {
		return g, errorf(ErrInvalid, "layout: unknown %v", c.Layout)
	}
	if !c.DType.Valid() {
		return g, errorf(ErrInvalid, "dtype: unknown %v", c.DType)
	}
	for _, f := range []struct {
		name   string
		v, max int
	}{{"num_blocks", c.NumBlocks, maxNumBlocks}, {"block_size", c.BlockSize, maxBlockSize}, {"kv_heads", c.KVHeads, maxKVHeads}, {"head_dim", c.HeadDim, maxHeadDim}} {
		if f.v < 1 || f.v > f.max {
			return g, errorf(ErrInvalid, "%s: %d outside [1, %d]", f.name, f.v, f.max)
		}
	}
	if c.Layout == LayoutMLA && c.KVHeads != 1 {
		return g, errorf(ErrInvalid, "kv_heads: %d, MLA has one latent head", c.KVHeads)
	}
	heads, h0 := c.KVHeads, 0
	switch tp := c.TP; {
	case tp.Size < 0:
		return g, errorf(ErrInvalid, "tp.size: %d is negative", tp.Size)
	case tp.Size <= 1:
		if tp.Rank != 0 {
			return g, errorf(ErrInvalid, "tp.rank: %d without a tp.size", tp.Rank)
		}
	case c.Layout == LayoutMLA:
		return g, errorf(ErrInvalid, "tp.size: %d: MLA's latent cache is not split across ranks", tp.Size)
	case c.KVHeads%tp.Size != 0:
		return g, errorf(ErrInvalid, "tp.size: %d does not divide kv_heads %d", tp.Size, c.KVHeads)
	case tp.Rank < 0 || tp.Rank >= tp.Size:
		return g, errorf(ErrInvalid, "tp.rank: %d outside [0, %d)", tp.Rank, tp.Size)
	default:
		heads = c.KVHeads / tp.Size
		h0 = tp.Rank * heads
	}
	shape := c.Shape()
	strides := c.Strides
	if strides == nil {
		strides = make([]int64, len(shape))
		acc := int64(1)
		for i := len(shape) - 1; i >= 0; i-- {
			strides[i] = acc
			var ok bool
			if acc, ok = mulCheck(acc, int64(shape[i])); !ok || acc > MaxAllocBytes {
				return g, errorf(ErrInvalid, "shape %v of %v spans more than %d bytes", shape, c.DType, int64(MaxAllocBytes))
			}
		}
	} else if len(strides) != len(shape) {
		return g, errorf(ErrInvalid, "strides: %d given for the %d dimensions of %v %v", len(strides), len(shape), c.Layout, shape)
	}
	dims := make([]tensorDim, len(shape))
	for i, n := range shape {
		dims[i] = tensorDim{n: int64(n), stride: strides[i]}
		if n > 1 && (strides[i] < 1 || strides[i] > maxStride) {
			return g, errorf(ErrInvalid, "strides: dimension %d stride %d outside [1, %d]", i, strides[i], int64(maxStride))
		}
	}
	// Overlap: sorted by stride, each dimension must step past everything the smaller ones
	// reach. extent is in elements: the last element's offset plus one.
	sorted := make([]tensorDim, 0, len(dims))
	for _, d := range dims {
		if d.n > 1 {
			sorted = append(sorted, d)
		}
	}
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].stride < sorted[j].stride })
	extent := int64(1)
	for _, d := range sorted {
		if d.stride < extent {
			return g, errorf(ErrInvalid, "strides: %v overlap (stride %d is inside the %d elements the smaller strides span)", strides, d.stride, extent)
		}
		span, ok := mulCheck(d.n-1, d.stride)
		if !ok || span > MaxAllocBytes-extent {
			return g, errorf(ErrInvalid, "strides: %v span more than %d elements", strides, int64(MaxAllocBytes))
		}
		extent += span
	}
	es := int64(c.DType.Size())
	if extent > MaxAllocBytes/es {
		return g, errorf(ErrInvalid, "shape %v of %v spans more than %d bytes", shape, c.DType, int64(MaxAllocBytes))
	}
	g.extent = extent * es

	// Logical dimensions: tensor, block, token, head, dim.
	var t, b, s, h, d tensorDim
	switch c.Layout {
	case LayoutFlashAttn, LayoutReRoPE:
		t, b, s, h, d = dims[0], dims[1], dims[2], dims[3], dims[4]
	case LayoutFlashInfer:
		b, t, s, h, d = dims[0], dims[1], dims[2], dims[3], dims[4]
	case LayoutMLA:
		b, s, d = dims[0], dims[1], dims[2]
		t, h = tensorDim{n: 1}, tensorDim{n: 1}
	}
	tensorBytes := int64(c.BlockSize) * int64(heads) * int64(c.HeadDim) * es
	shardBytes := tensorBytes * int64(tensors)
	if shardBytes > MaxKVShardBytes {
		return g, errorf(ErrInvalid, "record: a layer's shard of %d bytes (%d tensors × block_size %d × heads %d × head_dim %d × %d) exceeds %d",
			shardBytes, tensors, c.BlockSize, heads, c.HeadDim, es, MaxKVShardBytes)
	}
	g.rec = RecordLayout{TensorsPerShard: tensors, ShardBytes: shardBytes, TensorBytes: tensorBytes, Heads: heads}
	g.blockStride = b.stride * es
	g.headOff = int64(h0) * h.stride * es
	g.tmpl = newTemplate(es, []loopDim{
		{n: t.n, src: t.stride * es, dst: tensorBytes},
		{n: s.n, src: s.stride * es, dst: int64(heads) * d.n * es},
		{n: int64(heads), src: h.stride * es, dst: d.n * es},
		{n: d.n, src: d.stride * es, dst: es},
	})
	return g, nil
}

// mulCheck returns a×b for non-negative a and b, and false when it overflows int64.
func mulCheck(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > 1<<63-1 {
		return 0, false
	}
	return int64(lo), true
}

// loopDim is one loop of a block shard's copy: n steps of src bytes in the cache and dst bytes in
// the record.
type loopDim struct {
	n        int64
	src, dst int64
}

// copyTemplate is how one block's shard of one layer is copied: nested loops (outermost first)
// around a contiguous run of run bytes. A copyTemplate without loops is a single run. offs
// lists every run's offsets within the shard (cache side, record side) when there are at most
// maxTemplateRuns of them, so that the copy is one flat loop; otherwise the loops are walked.
type copyTemplate struct {
	run   int64
	loops []loopDim
	offs  []runOff
}

// runOff is one run of a copyTemplate: its byte offset from the shard's start in the cache
// (src) and in the record (dst).
type runOff struct{ src, dst int64 }

// maxTemplateRuns bounds a copyTemplate's table of run offsets (16 bytes each).
const maxTemplateRuns = 4096

// newTemplate merges the dimensions of a block's shard (outermost first, innermost with
// dst == es) into as few loops and as long a contiguous run as their strides allow.
func newTemplate(es int64, dims []loopDim) copyTemplate {
	var ds []loopDim
	for _, d := range dims {
		if d.n > 1 {
			ds = append(ds, d)
		}
	}
	// Merge an outer dimension into the inner one when it steps exactly over it on both sides.
	for i := len(ds) - 2; i >= 0; i-- {
		o, in := ds[i], ds[i+1]
		if o.src == in.n*in.src && o.dst == in.n*in.dst {
			ds[i] = loopDim{n: o.n * in.n, src: in.src, dst: in.dst}
			ds = append(ds[:i+1], ds[i+2:]...)
		}
	}
	t := copyTemplate{run: es}
	if k := len(ds) - 1; k >= 0 && ds[k].src == es && ds[k].dst == es {
		t.run = ds[k].n * es
		ds = ds[:k]
	}
	t.loops = ds
	runs := int64(1)
	for _, d := range ds {
		if runs *= d.n; runs > maxTemplateRuns {
			return t
		}
	}
	if len(ds) > 0 {
		t.offs = make([]runOff, 0, runs)
		t.offs = t.appendOffs(t.offs, 0, 0, 0)
	}
	return t
}

// appendOffs appends the offsets of the runs of loops k… starting at (src, dst).
func (t *copyTemplate) appendOffs(offs []runOff, src, dst int64, k int) []runOff {
	if k == len(t.loops) {
		return append(offs, runOff{src, dst})
	}
	l := t.loops[k]
	for i := int64(0); i < l.n; i++ {
		offs = t.appendOffs(offs, src+i*l.src, dst+i*l.dst, k+1)
	}
	return offs
}

// checkBlocks validates block ids: each in [0, NumBlocks) (ErrOutOfRange), and with unique
// set, no id twice (ErrInvalid), since scattering two records into one block would leave it
// depending on copy order.
func (p *PagedKV) checkBlocks(blocks []int, unique bool) error {
	for i, b := range blocks {
		if b < 0 || b >= p.spec.NumBlocks {
			return errorf(ErrOutOfRange, "block id %d at position %d outside [0, %d)", b, i, p.spec.NumBlocks)
		}
	}
	if !unique || len(blocks) < 2 {
		return nil
	}
	bp := p.seen.Get().(*[]uint64)
	seen := *bp
	var err error
	for i, b := range blocks {
		w, bit := b/64, uint64(1)<<(uint(b)%64)
		if seen[w]&bit != 0 {
			first := 0
			for blocks[first] != b {
				first++
			}
			err = errorf(ErrInvalid, "block id %d repeated at positions %d and %d: a scatter writes each block once", b, first, i)
			break
		}
		seen[w] |= bit
	}
	for _, b := range blocks {
		seen[b/64] = 0
	}
	p.seen.Put(bp)
	return err
}
