package kernels

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// refView is an independent, element-by-element model of a registered cache: where element
// (tensor, block, token, head, dim) of layer l lives in its memory.
type refView struct {
	spec             CacheSpec
	heads, h0        int
	t, b, s, h, d    int64 // element strides
	es               int64
	tensors, layers  int
	offs             []int64
	shard, tensorLen int64
}

func newRefView(spec CacheSpec, offs []int64) refView {
	if spec.Layout == LayoutMLA && spec.KVHeads == 0 {
		spec.KVHeads = 1
	}
	shape := spec.Shape()
	st := spec.Strides
	if st == nil {
		st = make([]int64, len(shape))
		acc := int64(1)
		for i := len(shape) - 1; i >= 0; i-- {
			st[i] = acc
			acc *= int64(shape[i])
		}
	}
	r := refView{spec: spec, heads: spec.KVHeads, es: int64(spec.DType.Size()), tensors: spec.Layout.Tensors(), layers: len(offs), offs: offs}
	if spec.TP.Size > 1 {
		r.heads = spec.KVHeads / spec.TP.Size
		r.h0 = spec.TP.Rank * r.heads
	}
	switch spec.Layout {
	case LayoutFlashAttn, LayoutReRoPE:
		r.t, r.b, r.s, r.h, r.d = st[0], st[1], st[2], st[3], st[4]
	case LayoutFlashInfer:
		r.b, r.t, r.s, r.h, r.d = st[0], st[1], st[2], st[3], st[4]
	case LayoutMLA:
		r.b, r.s, r.d = st[0], st[1], st[2]
	}
	r.tensorLen = int64(spec.BlockSize*r.heads*spec.HeadDim) * r.es
	r.shard = r.tensorLen * int64(r.tensors)
	return r
}

// each calls fn for every element of block b's shard in layer l: its byte offset in the
// layer's memory and in the record shard.
func (r refView) each(l, b int, fn func(dev, rec int64)) {
	for t := 0; t < r.tensors; t++ {
		for s := 0; s < r.spec.BlockSize; s++ {
			for h := 0; h < r.heads; h++ {
				for d := 0; d < r.spec.HeadDim; d++ {
					dev := r.offs[l] + (int64(t)*r.t+int64(b)*r.b+int64(s)*r.s+int64(r.h0+h)*r.h+int64(d)*r.d)*r.es
					rec := ((int64(t)*int64(r.spec.BlockSize)+int64(s))*int64(r.heads)+int64(h))*int64(r.spec.HeadDim)*r.es + int64(d)*r.es
					fn(dev, rec)
				}
			}
		}
	}
}

// refGather builds the block-major records of blocks from the layers' memories.
func (r refView) refGather(mems [][]byte, blocks []int) []byte {
	out := make([]byte, int64(len(blocks))*int64(r.layers)*r.shard)
	for j, b := range blocks {
		for l := 0; l < r.layers; l++ {
			base := (int64(j)*int64(r.layers) + int64(l)) * r.shard
			r.each(l, b, func(dev, rec int64) { copy(out[base+rec:base+rec+r.es], mems[l][dev:dev+r.es]) })
		}
	}
	return out
}

// refScatter writes block-major records into the layers' memories.
func (r refView) refScatter(mems [][]byte, blocks []int, recs []byte) {
	for j, b := range blocks {
		for l := 0; l < r.layers; l++ {
			base := (int64(j)*int64(r.layers) + int64(l)) * r.shard
			r.each(l, b, func(dev, rec int64) { copy(mems[l][dev:dev+r.es], recs[base+rec:base+rec+r.es]) })
		}
	}
}

// layerOf extracts layer l's shards from block-major records (the layer-major buffer).
func (r refView) layerOf(recs []byte, n, l int) []byte {
	out := make([]byte, 0, int64(n)*r.shard)
	for j := 0; j < n; j++ {
		base := (int64(j)*int64(r.layers) + int64(l)) * r.shard
		out = append(out, recs[base:base+r.shard]...)
	}
	return out
}

type regCase struct {
	name string
	spec CacheSpec
}

// strideCases returns explicit stride variants for a spec: HND order and padded strides.
func strideCases(spec CacheSpec) []regCase {
	nb, bs, h, d := int64(spec.NumBlocks), int64(spec.BlockSize), int64(spec.KVHeads), int64(spec.HeadDim)
	var out []regCase
	switch spec.Layout {
	case LayoutFlashAttn, LayoutReRoPE:
		hnd := spec
		// Memory order [T, NB, H, BS, D]: token and head swapped.
		hnd.Strides = []int64{nb * h * bs * d, h * bs * d, d, bs * d, 1}
		out = append(out, regCase{"hnd", hnd})
		pad := spec
		// Each head padded to d+3 elements, each block padded by 5 elements.
		pad.Strides = []int64{nb * (bs*h*(d+3) + 5), bs*h*(d+3) + 5, h * (d + 3), d + 3, 1}
		out = append(out, regCase{"padded", pad})
	case LayoutFlashInfer:
		hnd := spec
		hnd.Strides = []int64{2 * h * bs * d, h * bs * d, d, bs * d, 1}
		out = append(out, regCase{"hnd", hnd})
		// The K/V dimension outermost: [2, NB, ...] in memory, i.e. flash order seen through
		// FlashInfer's shape.
		swapped := spec
		swapped.Strides = []int64{bs * h * d, nb * bs * h * d, h * d, d, 1}
		out = append(out, regCase{"kv-outer", swapped})
	case LayoutMLA:
		pad := spec
		pad.Strides = []int64{bs*(d+8) + 64, d + 8, 1}
		out = append(out, regCase{"padded", pad})
	}
	return out
}

func allCases() []regCase {
	var out []regCase
	for _, layout := range []KVLayout{LayoutFlashAttn, LayoutFlashInfer, LayoutMLA, LayoutReRoPE} {
		for _, dt := range []DType{Float16, BFloat16, Float8E4M3, Float8E5M2, Float32} {
			tps := []TPSlice{{}, {Size: 2, Rank: 0}, {Size: 2, Rank: 1}, {Size: 4, Rank: 3}}
			heads, dim := 4, 8
			if layout == LayoutMLA {
				tps = []TPSlice{{}}
				heads, dim = 1, 12 // kv_lora_rank 8 + rope 4
			}
			for _, tp := range tps {
				spec := CacheSpec{Layout: layout, DType: dt, NumBlocks: 9, BlockSize: 4, KVHeads: heads, HeadDim: dim, TP: tp}
				name := fmt.Sprintf("%v/%v/tp%d.%d", layout, dt, tp.Size, tp.Rank)
				out = append(out, regCase{name + "/contig", spec})
				for _, sc := range strideCases(spec) {
					out = append(out, regCase{name + "/" + sc.name, sc.spec})
				}
			}
		}
	}
	return out
}

// setup allocates layers regions for spec, the regions of some layers sharing one allocation
// at different offsets, fills them with random bytes and registers them.
func setupPaged(t testing.TB, d *Device, spec CacheSpec, layers int, seed uint64) (*PagedKV, [][]byte, []int64) {
	t.Helper()
	size, err := spec.RegionBytes()
	if err != nil {
		t.Fatal(err)
	}
	var regs []LayerRegion
	var mems [][]byte
	var offs []int64
	// Layers 0 and 1 share an allocation (layer 1 at an odd offset), the rest have their own.
	shared := mustAlloc(t, d, "shared", 2*size+7)
	for l := 0; l < layers; l++ {
		m, off := shared, int64(0)
		switch {
		case l == 1:
			off = size + 7
		case l > 1:
			m = mustAlloc(t, d, fmt.Sprintf("layer%d", l), size+3)
			off = 3
		}
		b := memBytes(m)
		copy(b, testRandomBytes(len(b), seed+uint64(l)))
		regs = append(regs, LayerRegion{Name: fmt.Sprintf("model.layers.%d", l), Mem: m, Offset: off})
		mems = append(mems, b)
		offs = append(offs, off)
	}
	p, err := Register(spec, regs)
	if err != nil {
		t.Fatal(err)
	}
	return p, mems, offs
}

func TestGatherScatterEveryLayout(t *testing.T) {
	const layers = 3
	rng := rand.New(rand.NewPCG(1, 2))
	d := newTestDevice(t, SimOptions{})
	s := mustStream(t, d)
	for ci, c := range allCases() {
		t.Run(c.name, func(t *testing.T) {
			p, mems, offs := setupPaged(t, d, c.spec, layers, uint64(ci)*16)
			ref := newRefView(p.Spec(), offs)
			rec := p.Record()
			if rec.ShardBytes != ref.shard || rec.Shards != layers || rec.TensorsPerShard != c.spec.Layout.Tensors() || rec.BlockBytes() != int64(layers)*ref.shard {
				t.Fatalf("record layout %+v, reference shard %d", rec, ref.shard)
			}
			// Random ids with repeats for gathers.
			n := 1 + rng.IntN(12)
			blocks := make([]int, n)
			for i := range blocks {
				blocks[i] = rng.IntN(c.spec.NumBlocks)
			}
			want := ref.refGather(mems, blocks)
			got := make([]byte, len(want))
			if err := p.GatherBlocks(s, blocks, got); err != nil {
				t.Fatal(err)
			}
			l := rng.IntN(layers)
			gotLayer := make([]byte, int64(n)*rec.ShardBytes)
			if err := p.GatherLayer(s, l, blocks, gotLayer); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("GatherBlocks %v differs from the reference", blocks)
			}
			if !bytes.Equal(gotLayer, ref.layerOf(want, n, l)) {
				t.Fatalf("GatherLayer %d %v differs from the reference", l, blocks)
			}

			// Scatter distinct ids (a random subset in random order) into fresh memories and
			// compare every byte of them with the reference scatter: the elements written,
			// and the padding and other heads left alone.
			perm := rng.Perm(c.spec.NumBlocks)[:1+rng.IntN(c.spec.NumBlocks)]
			recs := testRandomBytes(len(perm)*int(rec.BlockBytes()), uint64(ci))
			q, qmems, _ := setupPaged(t, d, c.spec, layers, uint64(ci)*16+8)
			wantMems := make([][]byte, layers)
			copies := map[uintptr][]byte{} // layers sharing an allocation share its copy
			for i, m := range qmems {
				if copies[addrOf(m)] == nil {
					copies[addrOf(m)] = append([]byte(nil), m...)
				}
				wantMems[i] = copies[addrOf(m)]
			}
			ref.refScatter(wantMems, perm, recs)
			if err := q.ScatterBlocks(s, perm, recs); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			for i := range qmems {
				if !bytes.Equal(qmems[i], wantMems[i]) {
					t.Fatalf("ScatterBlocks %v: layer %d memory differs from the reference", perm, i)
				}
			}
			// Layer-wise scatter of new bytes, then a gather of them back.
			layerRecs := testRandomBytes(len(perm)*int(rec.ShardBytes), uint64(ci)+99)
			if err := q.ScatterLayer(s, l, perm, layerRecs); err != nil {
				t.Fatal(err)
			}
			back := make([]byte, len(layerRecs))
			if err := q.GatherLayer(s, l, perm, back); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, layerRecs) {
				t.Fatal("ScatterLayer then GatherLayer differs")
			}
		})
	}
}

func TestTemplateCoalesces(t *testing.T) {
	for _, c := range []struct {
		spec  CacheSpec
		loops int
		run   int64
	}{
		// vLLM flash: K and V of a block are one run each.
		{CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: 4, BlockSize: 16, KVHeads: 8, HeadDim: 128}, 1, 16 * 8 * 128 * 2},
		// FlashInfer: a block's K and V are one run.
		{CacheSpec{Layout: LayoutFlashInfer, DType: Float16, NumBlocks: 4, BlockSize: 16, KVHeads: 8, HeadDim: 128}, 0, 2 * 16 * 8 * 128 * 2},
		{CacheSpec{Layout: LayoutMLA, DType: BFloat16, NumBlocks: 4, BlockSize: 64, HeadDim: 576}, 0, 64 * 576 * 2},
		{CacheSpec{Layout: LayoutReRoPE, DType: Float8E4M3, NumBlocks: 4, BlockSize: 16, KVHeads: 8, HeadDim: 128}, 1, 16 * 8 * 128},
		// A TP slice: per tensor and token, the rank's heads are one run.
		{CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: 4, BlockSize: 16, KVHeads: 8, HeadDim: 128, TP: TPSlice{Size: 2, Rank: 1}}, 2, 4 * 128 * 2},
	} {
		p, err := Register(c.spec, []LayerRegion{{Mem: mustAlloc(t, newTestDevice(t, SimOptions{}), "m", mustRegion(t, c.spec))}})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.tmpl.loops) != c.loops || p.tmpl.run != c.run {
			t.Fatalf("%v tp %v: copyTemplate %+v, want %d loops around %d-byte runs", c.spec.Layout, c.spec.TP, p.tmpl, c.loops, c.run)
		}
	}
}

func mustRegion(t testing.TB, spec CacheSpec) int64 {
	t.Helper()
	n, err := spec.RegionBytes()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestFlatRunsMerge(t *testing.T) {
	// FlashInfer, consecutive ids, block-major: one run per layer per stretch of ids.
	spec := CacheSpec{Layout: LayoutFlashInfer, DType: Float16, NumBlocks: 16, BlockSize: 4, KVHeads: 2, HeadDim: 8}
	d := newTestDevice(t, SimOptions{})
	p, mems, offs := setupPaged(t, d, spec, 1, 5)
	s := mustStream(t, d)
	blocks := []int{3, 4, 5, 6, 9, 10}
	got := make([]byte, int64(len(blocks))*p.Record().BlockBytes())
	if err := p.GatherBlocks(s, blocks, got); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, newRefView(spec, offs).refGather(mems, blocks)) {
		t.Fatal("merged gather differs")
	}
}

// The table of run offsets and the loop walk (what templates with more than maxTemplateRuns
// runs use) copy the same bytes, for every layout, dtype, TP slice and stride case.
func TestTemplateWalkMatchesTable(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	s := mustStream(t, d)
	for ci, c := range allCases() {
		p, mems, offs := setupPaged(t, d, c.spec, 2, uint64(ci)*16+3)
		if len(p.tmpl.loops) > 0 && p.tmpl.offs == nil {
			t.Fatalf("%s: no run table for %d loops", c.name, len(p.tmpl.loops))
		}
		var regs []LayerRegion
		for _, l := range p.layers {
			regs = append(regs, LayerRegion{Name: l.name, Mem: l.mem, Offset: l.off})
		}
		walk, err := Register(p.Spec(), regs)
		if err != nil {
			t.Fatal(err)
		}
		walk.tmpl.offs = nil
		blocks := []int{5, 0, 8, 2}
		want := newRefView(p.Spec(), offs).refGather(mems, blocks)
		for _, q := range []*PagedKV{p, walk} {
			got := make([]byte, len(want))
			if err := q.GatherBlocks(s, blocks, got); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: gather (run table %v) differs from the reference", c.name, q.tmpl.offs != nil)
			}
			// Scatter the records back over zeroed memory: the record's elements return.
			for _, m := range mems {
				clear(m)
			}
			if err := q.ScatterBlocks(s, blocks, got); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if again := newRefView(p.Spec(), offs).refGather(mems, blocks); !bytes.Equal(again, want) {
				t.Fatalf("%s: scatter (run table %v) did not restore the blocks", c.name, q.tmpl.offs != nil)
			}
		}
	}
	// Per-element runs of a large shard fall back to the walk.
	spec := CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: 2, BlockSize: 64, KVHeads: 4, HeadDim: 32}
	spec.Strides = []int64{2 * 64 * 4 * 32, 64 * 4 * 32, 4, 1, 64 * 4} // dim outermost in memory
	p, err := Register(spec, []LayerRegion{{Mem: mustAlloc(t, d, "m", mustRegion(t, spec))}})
	if err != nil {
		t.Fatal(err)
	}
	if p.tmpl.offs != nil || p.tmpl.run != 2 {
		t.Fatalf("template %d-byte runs, table of %d: want 2-byte runs and no table", p.tmpl.run, len(p.tmpl.offs))
	}
}

func TestBlockIDs(t *testing.T) {
	spec := CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: 8, BlockSize: 2, KVHeads: 2, HeadDim: 4}
	d := newTestDevice(t, SimOptions{})
	p, _, _ := setupPaged(t, d, spec, 3, 1)
	s := mustStream(t, d)
	bb, sb := p.Record().BlockBytes(), p.Record().ShardBytes
	for _, ids := range [][]int{{0, 8}, {-1}, {1, 2, 1 << 40}} {
		err := p.GatherBlocks(s, ids, make([]byte, int64(len(ids))*bb))
		if !errors.Is(err, ErrOutOfRange) || !strings.Contains(err.Error(), "block id") {
			t.Fatalf("gather %v: %v", ids, err)
		}
		if err := p.ScatterLayer(s, 0, ids, make([]byte, int64(len(ids))*sb)); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("scatter %v: %v", ids, err)
		}
	}
	// Repeats: gathers copy each occurrence, scatters refuse them and name both positions.
	if err := p.GatherBlocks(s, []int{3, 3}, make([]byte, 2*bb)); err != nil {
		t.Fatal(err)
	}
	err := p.ScatterBlocks(s, []int{1, 3, 5, 3}, make([]byte, 4*bb))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "positions 1 and 3") {
		t.Fatalf("scatter with a repeat: %v", err)
	}
	// The duplicate check's bitset is cleared after use.
	if err := p.ScatterBlocks(s, []int{3, 1}, make([]byte, 2*bb)); err != nil {
		t.Fatal(err)
	}
	if err := p.GatherBlocks(s, []int{1}, make([]byte, bb-1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("short buffer: %v", err)
	}
	if err := p.GatherLayer(s, 3, []int{1}, make([]byte, sb)); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("layer out of range: %v", err)
	}
	if err := p.GatherBlocks(s, nil, nil); err != nil {
		t.Fatalf("empty gather: %v", err)
	}
	other := newTestDevice(t, SimOptions{})
	if err := p.GatherBlocks(mustStream(t, other), []int{1}, make([]byte, bb)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("stream of another device: %v", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	// A freed layer memory is refused at enqueue time.
	if err := d.Free(p.layers[2].mem); err != nil {
		t.Fatal(err)
	}
	if err := p.GatherBlocks(s, []int{1}, make([]byte, bb)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "model.layers.2") {
		t.Fatalf("freed layer: %v", err)
	}
}

func TestRegisterErrors(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	good := CacheSpec{Layout: LayoutFlashAttn, DType: BFloat16, NumBlocks: 4, BlockSize: 4, KVHeads: 4, HeadDim: 8}
	size := mustRegion(t, good)
	m := mustAlloc(t, d, "kv", size)
	one := []LayerRegion{{Name: "attn0", Mem: m}}
	mod := func(f func(*CacheSpec)) CacheSpec { s := good; f(&s); return s }
	for _, c := range []struct {
		spec   CacheSpec
		layers []LayerRegion
		kind   error
		field  string
	}{
		{mod(func(s *CacheSpec) { s.Layout = 9 }), one, ErrInvalid, "layout"},
		{mod(func(s *CacheSpec) { s.DType = 0 }), one, ErrInvalid, "dtype"},
		{mod(func(s *CacheSpec) { s.NumBlocks = 0 }), one, ErrInvalid, "num_blocks"},
		{mod(func(s *CacheSpec) { s.BlockSize = -1 }), one, ErrInvalid, "block_size"},
		{mod(func(s *CacheSpec) { s.KVHeads = 0 }), one, ErrInvalid, "kv_heads"},
		{mod(func(s *CacheSpec) { s.HeadDim = maxHeadDim + 1 }), one, ErrInvalid, "head_dim"},
		{mod(func(s *CacheSpec) { s.Layout, s.HeadDim = LayoutMLA, 8 }), one, ErrInvalid, "kv_heads"},
		{mod(func(s *CacheSpec) { s.TP = TPSlice{Size: 3} }), one, ErrInvalid, "tp.size"},
		{mod(func(s *CacheSpec) { s.TP = TPSlice{Size: 2, Rank: 2} }), one, ErrInvalid, "tp.rank"},
		{mod(func(s *CacheSpec) { s.TP = TPSlice{Rank: 1} }), one, ErrInvalid, "tp.rank"},
		{mod(func(s *CacheSpec) { s.Layout, s.KVHeads, s.TP = LayoutMLA, 1, TPSlice{Size: 2} }), one, ErrInvalid, "tp.size"},
		{mod(func(s *CacheSpec) { s.Strides = []int64{1, 2, 3} }), one, ErrInvalid, "strides"},
		{mod(func(s *CacheSpec) { s.Strides = []int64{512, 128, 32, 8, 0} }), one, ErrInvalid, "strides"},
		{mod(func(s *CacheSpec) { s.Strides = []int64{512, 128, 32, 8, -1} }), one, ErrInvalid, "strides"},
		// Heads overlapping: head stride 4 < head_dim 8.
		{mod(func(s *CacheSpec) { s.Strides = []int64{512, 128, 32, 4, 1} }), one, ErrInvalid, "overlap"},
		// K and V aliased.
		{mod(func(s *CacheSpec) { s.Strides = []int64{128, 128, 32, 8, 1} }), one, ErrInvalid, "overlap"},
		{mod(func(s *CacheSpec) { s.Strides = []int64{1 << 47, 1 << 47, 32, 8, 1} }), one, ErrInvalid, "strides"},
		{mod(func(s *CacheSpec) { s.NumBlocks, s.BlockSize, s.KVHeads, s.HeadDim = 1, 1<<17, 1<<10, 1<<10 }), one, ErrInvalid, "record"},
		{good, nil, ErrInvalid, "no layers"},
		{good, make([]LayerRegion, MaxKVLayers+1), ErrInvalid, "layers"},
		{good, []LayerRegion{{Name: "attn0", Mem: m}, {Name: "attn1"}}, ErrInvalid, `layer 1 ("attn1"): memory`},
		{good, []LayerRegion{{Name: "attn0", Mem: m, Offset: 2}}, ErrOutOfRange, `layer 0 ("attn0"): region too small`},
		{good, []LayerRegion{{Mem: m, Offset: -1}}, ErrOutOfRange, `layer 0 ("layer 0")`},
		{good, []LayerRegion{{Mem: mustAlloc(t, d, "small", size-1)}}, ErrOutOfRange, `"small"`},
		{good, []LayerRegion{{Mem: m}, {Mem: mustAlloc(t, newTestDevice(t, SimOptions{Name: "gpu1"}), "x", size)}}, ErrInvalid, "gpu1"},
	} {
		_, err := Register(c.spec, c.layers)
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("spec %+v, %d layers: %v, want %v naming %q", c.spec, len(c.layers), err, c.kind, c.field)
		}
	}
	if _, err := Register(good, one); err != nil {
		t.Fatal(err)
	}
	// MLA accepts kv_heads 0 as 1.
	mla := CacheSpec{Layout: LayoutMLA, DType: Float16, NumBlocks: 2, BlockSize: 4, HeadDim: 12}
	if _, err := Register(mla, []LayerRegion{{Mem: m}}); err != nil {
		t.Fatal(err)
	}
	freed := mustAlloc(t, d, "freed", size)
	_ = d.Free(freed)
	if _, err := Register(good, []LayerRegion{{Mem: freed}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "freed") {
		t.Fatalf("freed memory: %v", err)
	}
}

func TestParseKVLayout(t *testing.T) {
	for _, l := range []KVLayout{LayoutFlashAttn, LayoutFlashInfer, LayoutMLA, LayoutReRoPE} {
		got, err := ParseKVLayout(strings.ToUpper(l.String()))
		if err != nil || got != l {
			t.Fatalf("%v: %v %v", l, got, err)
		}
	}
	if _, err := ParseKVLayout("nhd"); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if KVLayout(0).Tensors() != 0 || KVLayout(7).String() != "layout(7)" {
		t.Fatal("unknown layout")
	}
}

func TestRecordLayoutOfSpec(t *testing.T) {
	spec := CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: 256, BlockSize: 16, KVHeads: 8, HeadDim: 128, TP: TPSlice{Size: 2, Rank: 1}}
	r, err := spec.Record(32)
	if err != nil {
		t.Fatal(err)
	}
	want := RecordLayout{Shards: 32, TensorsPerShard: 2, ShardBytes: 2 * 16 * 4 * 128 * 2, TensorBytes: 16 * 4 * 128 * 2, Heads: 4}
	if r != want {
		t.Fatalf("%+v, want %+v", r, want)
	}
	if _, err := spec.Record(0); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}
