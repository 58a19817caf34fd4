package kernels

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeStore keeps layer shards by (block id, layer), as a layer-wise store would.
type fakeStore struct {
	mu     sync.Mutex
	shards map[[2]int][]byte
}

func newFakeStore() *fakeStore { return &fakeStore{shards: map[[2]int][]byte{}} }

func (f *fakeStore) dumper(blocks []int) DumpFunc {
	return func(ctx context.Context, layer int, shards [][]byte) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		for j, b := range blocks {
			f.shards[[2]int{b, layer}] = append([]byte(nil), shards[j]...)
		}
		return nil
	}
}

func (f *fakeStore) loader(blocks []int) LoadFunc {
	return func(ctx context.Context, layer int, shards [][]byte) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		for j, b := range blocks {
			s, ok := f.shards[[2]int{b, layer}]
			if !ok {
				return fmt.Errorf("block %d layer %d not stored", b, layer)
			}
			copy(shards[j], s)
		}
		return nil
	}
}

func isDone(ls *layerState) bool {
	select {
	case <-ls.done:
		return true
	default:
		return false
	}
}

func pipeSetup(t *testing.T, layers int) (*Device, *PagedKV, [][]byte, *PagedKV, [][]byte, refView) {
	t.Helper()
	d := newTestDevice(t, SimOptions{})
	spec := CacheSpec{Layout: LayoutFlashAttn, DType: BFloat16, NumBlocks: 16, BlockSize: 4, KVHeads: 2, HeadDim: 8}
	src, smems, offs := setupPaged(t, d, spec, layers, 10)
	dst, dmems, _ := setupPaged(t, d, spec, layers, 20)
	return d, src, smems, dst, dmems, newRefView(spec, offs)
}

func TestPipelineRoundTrip(t *testing.T) {
	base := runtime.NumGoroutine()
	const layers = 6
	d, src, smems, dst, dmems, ref := pipeSetup(t, layers)
	pl, err := NewPipeline(src, PipelineOptions{Buffers: 3, MaxBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	d2h, h2d := mustStream(t, d), mustStream(t, d)
	store := newFakeStore()
	blocks := []int{5, 0, 9, 15, 3}
	dump, err := pl.Dump(context.Background(), d2h, blocks, store.dumper(blocks))
	if err != nil {
		t.Fatal(err)
	}
	for l := layers - 1; l >= 0; l-- { // any order
		if err := dump.SaveLayer(l, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := dump.Finish(); err != nil {
		t.Fatal(err)
	}
	// Load into the other registration, scattered to other block ids.
	lpl, err := NewPipeline(dst, PipelineOptions{Buffers: 2, MaxBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	load, err := lpl.Load(context.Background(), h2d, blocks, store.loader(blocks))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < layers; i++ {
		if err := load.WaitLayer(i); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < i; j++ {
			if !isDone(load.layers[j]) {
				t.Fatalf("layer %d resident before layer %d", i, j)
			}
		}
	}
	if err := load.Wait(); err != nil {
		t.Fatal(err)
	}
	want := ref.refGather(smems, blocks)
	if got := ref.refGather(dmems, blocks); !bytes.Equal(got, want) {
		t.Fatal("blocks loaded through the pipelines differ from the ones dumped")
	}
	_ = load.Close()
	_ = dump.Close()
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lpl.Close(); err != nil {
		t.Fatal(err)
	}
	_ = d2h.Close()
	_ = h2d.Close()
	checkNoLeak(t, base)
}

func TestPipelineWaitLayerDoesNotWaitForNext(t *testing.T) {
	base := runtime.NumGoroutine()
	const layers = 4
	d, src, smems, dst, dmems, ref := pipeSetup(t, layers)
	_ = src
	s := mustStream(t, d)
	pl, err := NewPipeline(dst, PipelineOptions{Buffers: 2, MaxBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	blocks := []int{1, 2}
	want := ref.refGather(smems, blocks)
	release := make(chan struct{})
	load, err := pl.Load(context.Background(), s, blocks, func(ctx context.Context, layer int, shards [][]byte) error {
		if layer == 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for j := range blocks {
			off := (int64(j)*layers + int64(layer)) * ref.shard
			copy(shards[j], want[off:off+ref.shard])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := load.WaitLayer(0); err != nil {
		t.Fatal(err)
	}
	// Layer 0 is resident while layer 1's loader is still blocked.
	if isDone(load.layers[1]) {
		t.Fatal("layer 1 done before its loader was released")
	}
	got := ref.refGather(dmems, blocks)
	for j := range blocks {
		off := (int64(j)*layers + 0) * ref.shard
		if !bytes.Equal(got[off:off+ref.shard], want[off:off+ref.shard]) {
			t.Fatalf("layer 0 of block %d not resident after WaitLayer(0)", blocks[j])
		}
	}
	close(release)
	if err := load.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := ref.refGather(dmems, blocks); !bytes.Equal(got, want) {
		t.Fatal("loaded bytes differ")
	}
	_ = load.Close()
	_ = pl.Close()
	_ = s.Close()
	checkNoLeak(t, base)
}

func TestPipelineErrors(t *testing.T) {
	base := runtime.NumGoroutine()
	const layers = 6
	d, _, smems, dst, dmems, ref := pipeSetup(t, layers)
	s := mustStream(t, d)
	pl, err := NewPipeline(dst, PipelineOptions{Buffers: 3, MaxBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	blocks := []int{7, 3, 11}
	want := ref.refGather(smems, blocks)
	boom := errors.New("segment missing")
	var running, peak atomic.Int32
	load, err := pl.Load(context.Background(), s, blocks, func(ctx context.Context, layer int, shards [][]byte) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if layer == 2 {
			return boom
		}
		if layer > 2 {
			<-ctx.Done() // later loaders are cancelled
			return ctx.Err()
		}
		for j := range blocks {
			off := (int64(j)*layers + int64(layer)) * ref.shard
			copy(shards[j], want[off:off+ref.shard])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < layers; i++ {
		err := load.WaitLayer(i)
		switch {
		case i < 2 && err != nil:
			t.Fatalf("layer %d: %v", i, err)
		case i >= 2 && !errors.Is(err, boom):
			t.Fatalf("layer %d: %v, want the error of layer 2", i, err)
		}
	}
	if err := load.Wait(); !errors.Is(err, boom) || !strings.Contains(err.Error(), "layer 2") {
		t.Fatalf("Wait: %v", err)
	}
	if p := peak.Load(); p > 3 {
		t.Fatalf("%d loaders ran at once with 3 buffers", p)
	}
	got := ref.refGather(dmems, blocks)
	for j := range blocks {
		for l := 0; l < 2; l++ {
			off := (int64(j)*layers + int64(l)) * ref.shard
			if !bytes.Equal(got[off:off+ref.shard], want[off:off+ref.shard]) {
				t.Fatalf("layer %d not resident after a later layer failed", l)
			}
		}
	}
	_ = load.Close()

	// A loader that panics fails its layer.
	load, err = pl.Load(context.Background(), s, blocks, func(ctx context.Context, layer int, shards [][]byte) error {
		panic("bad loader")
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := load.WaitLayer(0); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("panicking loader: %v", err)
	}
	_ = load.Close()

	// Close while loaders block on their context: every layer fails with context.Canceled and
	// nothing is left running.
	started := make(chan struct{}, layers)
	load, err = pl.Load(context.Background(), s, blocks, func(ctx context.Context, layer int, shards [][]byte) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := load.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < layers; i++ {
		if err := load.WaitLayer(i); !errors.Is(err, context.Canceled) {
			t.Fatalf("layer %d after Close: %v", i, err)
		}
	}
	// A cancelled parent context fails the load the same way.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	load, err = pl.Load(ctx, s, blocks, store0)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	// Every buffer came back.
	if n := len(pl.free); n != 3 {
		t.Fatalf("%d of 3 buffers free", n)
	}

	// Bad arguments.
	if _, err := pl.Load(context.Background(), s, []int{1, 1}, store0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("repeated ids: %v", err)
	}
	if _, err := pl.Load(context.Background(), s, []int{1, 2, 3, 4, 5}, store0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("too many blocks: %v", err)
	}
	if _, err := pl.Load(context.Background(), s, []int{99}, store0); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("bad id: %v", err)
	}
	if _, err := pl.Load(context.Background(), s, blocks, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nil loader: %v", err)
	}
	if err := load.WaitLayer(layers); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("WaitLayer out of range: %v", err)
	}
	if _, err := NewPipeline(dst, PipelineOptions{MaxBlocks: 0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no max blocks: %v", err)
	}
	if _, err := NewPipeline(dst, PipelineOptions{MaxBlocks: 1, Buffers: 65}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("too many buffers: %v", err)
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pl.Load(context.Background(), s, blocks, store0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("load on a closed pipeline: %v", err)
	}
	_ = s.Close()
	checkNoLeak(t, base)
}

func store0(ctx context.Context, layer int, shards [][]byte) error { return nil }

func TestPipelineLoadOnFailedStream(t *testing.T) {
	base := runtime.NumGoroutine()
	const layers = 3
	d, _, _, dst, _, _ := pipeSetup(t, layers)
	s := mustStream(t, d)
	pl, err := NewPipeline(dst, PipelineOptions{MaxBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	// A failed operation on the stream before the load: its scatters are skipped and every
	// layer reports the stream's error.
	gate := make(chan struct{})
	_ = s.Launch("gate", func() error { <-gate; return errors.New("kernel fault") })
	load, err := pl.Load(context.Background(), s, []int{1}, store0)
	if err != nil {
		t.Fatal(err)
	}
	close(gate)
	for i := 0; i < layers; i++ {
		if err := load.WaitLayer(i); err == nil || !strings.Contains(err.Error(), "kernel fault") {
			t.Fatalf("layer %d: %v", i, err)
		}
	}
	_ = load.Close()
	_ = pl.Close()
	_ = s.Close()
	checkNoLeak(t, base)
}

func TestPipelineDump(t *testing.T) {
	base := runtime.NumGoroutine()
	const layers = 5
	d, src, smems, _, _, ref := pipeSetup(t, layers)
	compute, d2h := mustStream(t, d), mustStream(t, d)
	pl, err := NewPipeline(src, PipelineOptions{Buffers: 2, MaxBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	blocks := []int{2, 2, 6} // repeats are fine for gathers
	store := newFakeStore()
	dump, err := pl.Dump(context.Background(), d2h, blocks, store.dumper(blocks))
	if err != nil {
		t.Fatal(err)
	}
	// Each layer's "forward" rewrites its KV on the compute stream; the dump of that layer
	// must see the new bytes, not the old ones.
	ev, _ := d.NewEvent()
	for l := 0; l < layers; l++ {
		_ = compute.Launch("forward", func() error {
			time.Sleep(time.Millisecond)
			ref.each(l, 6, func(dev, rec int64) { smems[l][dev] = byte(l + 1) })
			return nil
		})
		_ = compute.Record(ev)
		if err := dump.SaveLayer(l, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := dump.SaveLayer(1, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("saved twice: %v", err)
	}
	if err := dump.Finish(); err != nil {
		t.Fatal(err)
	}
	for l := 0; l < layers; l++ {
		s := store.shards[[2]int{6, l}]
		for k := int64(0); k < int64(len(s)); k += ref.es {
			if s[k] != byte(l+1) {
				t.Fatalf("layer %d dumped before its forward finished", l)
			}
		}
	}
	if err := dump.SaveLayer(0, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("save after Finish: %v", err)
	}

	// A failing dumper fails its layer and the layers not yet handed over; never-saved layers
	// fail Finish with ErrInvalid.
	boom := errors.New("disk full")
	dump, err = pl.Dump(context.Background(), d2h, blocks, func(ctx context.Context, layer int, shards [][]byte) error {
		if layer == 1 {
			return boom
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = dump.SaveLayer(0, nil)
	_ = dump.SaveLayer(1, nil)
	if err := dump.WaitLayer(1); !errors.Is(err, boom) {
		t.Fatalf("layer 1: %v", err)
	}
	_ = dump.SaveLayer(2, nil)
	if err := dump.WaitLayer(2); !errors.Is(err, boom) {
		t.Fatalf("layer 2 after layer 1 failed: %v", err)
	}
	if err := dump.WaitLayer(0); err != nil {
		t.Fatalf("layer 0: %v", err)
	}
	if err := dump.Finish(); !errors.Is(err, boom) {
		t.Fatalf("Finish: %v", err)
	}
	if err := dump.WaitLayer(4); !errors.Is(err, ErrInvalid) {
		t.Fatalf("never-saved layer: %v", err)
	}

	// Close with dumpers blocked on their context.
	dump, err = pl.Dump(context.Background(), d2h, blocks, func(ctx context.Context, layer int, shards [][]byte) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = dump.SaveAll(nil)
	if err := dump.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < layers; i++ {
		if err := dump.WaitLayer(i); !errors.Is(err, context.Canceled) {
			t.Fatalf("layer %d after Close: %v", i, err)
		}
	}
	if n := len(pl.free); n != 2 {
		t.Fatalf("%d of 2 buffers free", n)
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	_ = compute.Close()
	_ = d2h.Close()
	checkNoLeak(t, base)
}

func TestPipelineCloseCancelsActive(t *testing.T) {
	base := runtime.NumGoroutine()
	d, src, _, _, _, _ := pipeSetup(t, 3)
	s := mustStream(t, d)
	pl, err := NewPipeline(src, PipelineOptions{MaxBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	block := func(ctx context.Context, layer int, shards [][]byte) error { <-ctx.Done(); return ctx.Err() }
	load, _ := pl.Load(context.Background(), s, []int{0}, block)
	dump, _ := pl.Dump(context.Background(), s, []int{1}, block)
	_ = dump.SaveLayer(0, nil)
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := load.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("load after pipeline Close: %v", err)
	}
	if err := dump.WaitLayer(0); !errors.Is(err, context.Canceled) {
		t.Fatalf("dump after pipeline Close: %v", err)
	}
	_ = s.Close()
	checkNoLeak(t, base)
}
