package loop

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/ucm-go/ucm/sparse"
)

func newBlend(t *testing.T, s *Server, ratio float64) *sparse.Blend {
	t.Helper()
	cfg := s.m.Config()
	c := sparse.DefaultBlendConfig()
	c.ChunkSize, c.RopeTheta, c.ComputeMeta = 32, float64(cfg.RopeTheta), map[int]float64{1: ratio}
	b, err := sparse.NewBlend(*c, sparse.Shape{Layers: cfg.Layers, QHeads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, BlockSize: testBlock})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPrefillBlend: chunks dumped from one prompt are found in the store when a second prompt
// holds them in another order, at other offsets (every chunk token reused); recomputing every
// reused token gives the logits of full recompute bit for bit; a chunk never dumped is not
// reused; a failed load computes everything.
func TestPrefillBlend(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	s := newServer(t, m, store)
	src := text(t, 4*32+40)
	d := [][]byte{src[0:32], src[32:64], src[64:96], src[96:128]}
	q1, q2 := src[128:148], src[148:168]
	ix, err := s.NewChunkIndex(32)
	if err != nil {
		t.Fatal(err)
	}
	b := newBlend(t, s, 1)
	if err := b.UseIndex(ix, store.Lookup); err != nil {
		t.Fatal(err)
	}
	// First prompt: d0 d1 d2, then a question; its chunks are dumped.
	p1 := slices.Concat(d[0], d[1], d[2], q1)
	r1, _, err := s.Prefill(ctx, p1)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.DumpChunks(ctx, r1, ix, b.RoPE(), 96)
	if err != nil || n != 96/testBlock {
		t.Fatalf("dumped %d blocks: %v", n, err)
	}
	if n, err := s.DumpChunks(ctx, r1, ix, b.RoPE(), 96); err != nil || n != 0 {
		t.Fatalf("second dump: %d blocks, %v", n, err)
	}
	if _, err := s.Finish(ctx, r1); err != nil {
		t.Fatal(err)
	}
	// Second prompt: d2 d0 d3 (d3 never stored), then another question.
	p2 := slices.Concat(d[2], d[0], d[3], q2)
	ref := newServer(t, m, nil)
	want, _, err := ref.Prefill(ctx, p2)
	if err != nil {
		t.Fatal(err)
	}
	r2, st, err := s.PrefillBlend(ctx, p2, 96, b)
	if err != nil {
		t.Fatal(err)
	}
	if st.HitTokens != 64 || st.ComputedTokens != len(p2)-64 || st.LoadFailed != nil {
		t.Fatalf("stats %+v: want d2 and d0 reused (64 tokens)", st)
	}
	if !sameBits(r2.Logits(), want.Logits()) {
		t.Fatal("recomputing every reused token is not full recompute")
	}
	if _, err := s.Finish(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if _, err := ref.Finish(ctx, want); err != nil {
		t.Fatal(err)
	}
	// At ratio 0.2 the logits move, a little.
	r3, st, err := s.PrefillBlend(ctx, p2, 96, newBlendIndexed(t, s, ix, 0.2))
	if err != nil || st.HitTokens != 64 {
		t.Fatalf("ratio 0.2: %+v %v", st, err)
	}
	if sameBits(r3.Logits(), want.Logits()) {
		t.Fatal("reusing K/V computed in another context changed nothing: the bit-identity check cannot fail")
	}
	if _, err := s.Finish(ctx, r3); err != nil {
		t.Fatal(err)
	}
	// A chunk indexed but not in the store, with a presence check that says it is: the load
	// fails and everything is computed, as full recompute.
	d3 := make([]int, len(d[3]))
	for i, c := range d[3] {
		d3[i] = int(c)
	}
	if _, _, err := ix.Add(d3); err != nil {
		t.Fatal(err)
	}
	lying := newBlend(t, s, 0)
	if err := lying.UseIndex(ix, nil); err != nil {
		t.Fatal(err)
	}
	r4, st, err := s.PrefillBlend(ctx, p2, 96, lying)
	if err != nil || st.LoadFailed == nil || st.HitTokens != 0 || !sameBits(r4.Logits(), want.Logits()) {
		t.Fatalf("a failed load: %+v %v", st, err)
	}
	if _, err := s.Finish(ctx, r4); err != nil {
		t.Fatal(err)
	}
	// Bad arguments.
	for _, end := range []int{-1, len(p2)} {
		if _, _, err := s.PrefillBlend(ctx, p2, end, b); !errors.Is(err, ErrInvalid) {
			t.Errorf("chunk end %d: %v", end, err)
		}
	}
	if _, _, err := ref.PrefillBlend(ctx, p2, 96, b); !errors.Is(err, ErrInvalid) {
		t.Errorf("no store: %v", err)
	}
	if _, err := ref.NewChunkIndex(32); !errors.Is(err, ErrInvalid) {
		t.Errorf("no store: %v", err)
	}
}

func newBlendIndexed(t *testing.T, s *Server, ix *sparse.ChunkIndex, ratio float64) *sparse.Blend {
	t.Helper()
	b := newBlend(t, s, ratio)
	if err := b.UseIndex(ix, s.store.Lookup); err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkBlendTTFT: time to first token of a 1,024-token prompt whose first 960 tokens are
// 15 stored 64-token chunks (stored from a prompt holding them in reverse order), by full
// recompute (a server without a store) and by PrefillBlend at HKVD ratios 0.15 and 0 (layer
// 1 selects). Reports TTFT per prompt (Finish, which frees the cache, untimed); "work" is the
// fraction of full recompute's token-layer passes Blend computes (the reused tokens' and the
// question's): the compute floor of its TTFT.
func BenchmarkBlendTTFT(b *testing.B) {
	m := loadModel(b)
	ctx := context.Background()
	store := openStore(b, m, b.TempDir())
	defer store.Close()
	s, err := NewServer(Options{Model: m, ModelName: "test-model", Store: store, BlockSize: testBlock, MaxContext: 1024, LoadPolicy: LoadAlways})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ref, err := NewServer(Options{Model: m, BlockSize: testBlock, MaxContext: 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer ref.Close()
	src := text(b, 1024)
	var reversed []byte
	for c := 14; c >= 0; c-- {
		reversed = append(reversed, src[c*64:(c+1)*64]...)
	}
	reversed = append(reversed, src[960:]...)
	ix, err := s.NewChunkIndex(64)
	if err != nil {
		b.Fatal(err)
	}
	cfg := m.Config()
	shape := sparse.Shape{Layers: cfg.Layers, QHeads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, BlockSize: testBlock}
	blend := func(ratio float64) *sparse.Blend {
		c := sparse.DefaultBlendConfig()
		c.RopeTheta, c.ComputeMeta = float64(cfg.RopeTheta), map[int]float64{1: ratio}
		bl, err := sparse.NewBlend(*c, shape)
		if err != nil {
			b.Fatal(err)
		}
		if err := bl.UseIndex(ix, store.Lookup); err != nil {
			b.Fatal(err)
		}
		return bl
	}
	r, _, err := s.Prefill(ctx, reversed)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.DumpChunks(ctx, r, ix, blend(0).RoPE(), 960); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Finish(ctx, r); err != nil {
		b.Fatal(err)
	}
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			r, _, err := ref.Prefill(ctx, src)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if _, err := ref.Finish(ctx, r); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	for _, ratio := range []float64{0.15, 0} {
		bl := blend(ratio)
		b.Run(fmt.Sprintf("blend-%.2f", ratio), func(b *testing.B) {
			var st PrefillStats
			for b.Loop() {
				var r *Request
				var err error
				if r, st, err = s.PrefillBlend(ctx, src, 960, bl); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if _, err := s.Finish(ctx, r); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			if st.HitTokens != 960 {
				b.Fatalf("reused %d tokens, want 960", st.HitTokens)
			}
			sel := math.Floor(960 * ratio)
			b.ReportMetric((960*(1+3*sel/960)/4+64)/1024, "work")
			b.ReportMetric(float64(st.Load.Microseconds())/1e3, "load-ms")
		})
	}
}
