package kernels

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ucm-go/ucm/internal/memcopy"
)

// Operations of memcopy.MinOp bytes or more copy their runs with memcopy.Stream: gathers and
// scatters of such sizes, per layer and whole blocks, still equal the reference, for the
// layouts whose runs are long enough (K and V runs, whole shards, merged runs of consecutive
// ids) and for a TP slice whose runs are short.
func TestLargeTransfers(t *testing.T) {
	d := newTestDevice(t, SimOptions{CopyThreads: 2})
	s := mustStream(t, d)
	for _, spec := range []CacheSpec{
		{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: 40, BlockSize: 16, KVHeads: 8, HeadDim: 128},
		{Layout: LayoutFlashInfer, DType: BFloat16, NumBlocks: 40, BlockSize: 16, KVHeads: 8, HeadDim: 128},
		{Layout: LayoutMLA, DType: Float16, NumBlocks: 40, BlockSize: 64, HeadDim: 576},
		{Layout: LayoutReRoPE, DType: Float8E4M3, NumBlocks: 40, BlockSize: 32, KVHeads: 8, HeadDim: 128},
		{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: 40, BlockSize: 16, KVHeads: 8, HeadDim: 128, TP: TPSlice{Size: 2, Rank: 1}},
	} {
		t.Run(fmt.Sprintf("%v/%v/tp%d", spec.Layout, spec.DType, spec.TP.Size), func(t *testing.T) {
			const layers = 3
			p, mems, offs := setupPaged(t, d, spec, layers, 11)
			ref := newRefView(p.Spec(), offs)
			rec := p.Record()
			blocks := []int{7, 8, 9, 10, 3, 39, 0, 21, 22, 5, 30, 31, 32, 33, 34, 35, 1, 2, 12, 14, 16, 18, 20, 24, 26}
			if int64(len(blocks))*rec.BlockBytes() < memcopy.MinOp {
				t.Fatalf("%d bytes: not a large operation", int64(len(blocks))*rec.BlockBytes())
			}
			want := ref.refGather(mems, blocks)
			got := make([]byte, len(want))
			if err := p.GatherBlocks(s, blocks, got); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("GatherBlocks differs from the reference")
			}
			// Scatter new records over cleared caches, then gather them back, whole and by layer.
			recs := testRandomBytes(len(want), 12)
			for _, m := range mems {
				clear(m)
			}
			if err := p.ScatterBlocks(s, blocks, recs); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if back := ref.refGather(mems, blocks); !bytes.Equal(back, recs) {
				t.Fatal("ScatterBlocks: the caches do not hold the records")
			}
			layer := make([]byte, int64(len(blocks))*rec.ShardBytes)
			if err := p.GatherLayer(s, 1, blocks, layer); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(layer, ref.layerOf(recs, len(blocks), 1)) {
				t.Fatal("GatherLayer differs from the scattered records")
			}
		})
	}
}
