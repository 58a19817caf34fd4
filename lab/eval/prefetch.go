package eval

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/loop"
	"github.com/ucm-go/ucm/lab/model"
	"github.com/ucm-go/ucm/sparse"
)

// The prefetch evaluation: how much of the time a decode step would wait for the KV of its
// selected blocks the prefetch engine hides. Each window's prefill blocks (and their sidecars)
// are dumped to a real engine; decoding then runs with a method that loads every attended
// block's shard through its Prefetcher (engine LoadShard) into a cache the size of a few
// steps' selections, so that a step finds resident what the previous steps loaded or
// predicted and waits for the rest (the stall). The same decode with prefetch_ahead 0 (no
// prediction: the misses are loaded on demand) is the reference the stall is compared with.
// The loaded bytes are checked against the model's own cache at every step.

// PrefetchRun is one configuration: a method (GSA, or ESA+lag: ESA with retrieval_lag 1) and
// its prefetch_ahead.
type PrefetchRun struct {
	Method string
	Ahead  int
}

// PrefetchOptions shape a prefetch evaluation.
type PrefetchOptions struct {
	// Model, Windows and Prefill as in Options: each window's first Prefill tokens are stored,
	// the rest decoded teacher-forced.
	Model   *model.Model
	Windows [][]byte
	Prefill int
	// BlockSize, Budget (fraction of a context's blocks attended, windows included), Init and
	// Local (window blocks) configure every run.
	BlockSize     int
	Budget        float64
	Init, Local   int
	Runs          []PrefetchRun
	Workers       int
	Eviction      string
	CacheFactor   float64 // prefetch_cache_size = CacheFactor × the shards one step attends
	Dir           string  // where the stores' temporary directory is created ("": the system's)
	EngineOptions func(*engine.Options)
}

// PrefetchResult is one run over every window.
type PrefetchResult struct {
	Method   string `json:"method"`
	Ahead    int    `json:"prefetch_ahead"`
	Eviction string `json:"eviction"`
	Cache    int    `json:"cache_shards"`
	// Steps is the decode steps; Shards the stored block shards attended (all layers).
	Steps  int   `json:"steps"`
	Shards int64 `json:"shards_attended"`
	// Hits were resident, InFlight waited for a prefetch already loading, Misses loaded on
	// demand; Prefetched is the shards the workers loaded.
	Hits       int64 `json:"hits"`
	InFlight   int64 `json:"in_flight"`
	Misses     int64 `json:"misses"`
	Failed     int64 `json:"failed"`
	Prefetched int64 `json:"prefetched"`
	// StallMicros is the mean time per decode step spent waiting for loads; StepMicros the
	// mean wall time of a step's forward pass (the stall included).
	StallMicros float64 `json:"stall_us_per_step"`
	StepMicros  float64 `json:"step_us"`
	// Hidden is 1 − Stall / Stall of the same method with prefetch_ahead 0 (nil without that
	// run).
	Hidden *float64 `json:"hidden_fraction,omitempty"`
}

// RunPrefetch runs every configuration over every window.
func RunPrefetch(ctx context.Context, o PrefetchOptions) ([]PrefetchResult, error) {
	cfg := o.Model.Config()
	o.Init, o.Local = max(o.Init, 1), max(o.Local, 1)
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.Eviction == "" {
		o.Eviction = "lru"
	}
	if o.CacheFactor == 0 {
		o.CacheFactor = 2
	}
	bs := o.BlockSize
	switch {
	case len(o.Windows) == 0 || o.Prefill < bs || bs < 1:
		return nil, fmt.Errorf("%w: prefetch eval: %d windows, prefill %d, block size %d", sparse.ErrInvalid, len(o.Windows), o.Prefill, bs)
	case !(o.Budget > 0 && o.Budget <= 1) || !(o.CacheFactor > 0):
		return nil, fmt.Errorf("%w: prefetch eval: budget %v, cache factor %v", sparse.ErrInvalid, o.Budget, o.CacheFactor)
	}
	for i, w := range o.Windows {
		if len(w) < o.Prefill+2 || len(w) > cfg.MaxCtx+1 {
			return nil, fmt.Errorf("%w: prefetch eval: window %d has %d bytes", sparse.ErrInvalid, i, len(w))
		}
	}
	// A fresh directory (in Dir, or the system's), removed at the end: a decoded block's id
	// names only its run, so stores must not outlive one evaluation.
	dir, err := os.MkdirTemp(o.Dir, "ucm-prefetch-eval-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := make([]PrefetchResult, len(o.Runs))
	stall := make([]time.Duration, len(o.Runs))
	step := make([]time.Duration, len(o.Runs))
	for ri, r := range o.Runs {
		out[ri] = PrefetchResult{Method: r.Method, Ahead: r.Ahead, Eviction: o.Eviction}
	}
	for wi, w := range o.Windows {
		st, err := newPrefetchStore(filepath.Join(dir, fmt.Sprint("window-", wi)), o, w)
		if err != nil {
			return nil, err
		}
		for ri, r := range o.Runs {
			if err := st.decode(ctx, o, r, w, &out[ri], &stall[ri], &step[ri]); err != nil {
				st.close()
				return nil, fmt.Errorf("%s ahead %d, window %d: %w", r.Method, r.Ahead, wi, err)
			}
		}
		st.close()
	}
	base := map[string]time.Duration{}
	for ri, r := range o.Runs {
		if r.Ahead == 0 {
			base[r.Method] = stall[ri]
		}
	}
	for ri := range out {
		res := &out[ri]
		if res.Steps > 0 {
			res.StallMicros = float64(stall[ri].Microseconds()) / float64(res.Steps)
			res.StepMicros = float64(step[ri].Microseconds()) / float64(res.Steps)
		}
		if b, ok := base[res.Method]; ok && b > 0 {
			h := 1 - float64(stall[ri])/float64(b)
			res.Hidden = &h
		}
	}
	return out, nil
}

// prefetchStore is one window's store: its prefill blocks and their sidecars, and the
// prefilled cache every run starts from.
type prefetchStore struct {
	e      *engine.Engine
	m      *model.Model
	ids    []engine.BlockID
	snap   prefillSnap
	spec   kernels.SidecarSpec
	shard  int
	layers int
	runs   int // decode runs so far (their blocks' ids)
}

func (s *prefetchStore) close() { _ = s.e.Close() }

func newPrefetchStore(dir string, o PrefetchOptions, w []byte) (*prefetchStore, error) {
	cfg := o.Model.Config()
	bs := o.BlockSize
	layout, err := loop.StoreLayout(cfg, bs)
	if err != nil {
		return nil, err
	}
	eo := engine.Options{Layout: layout, Schema: loop.StoreSchema("ucm-prefetch-eval", bs)}
	if o.EngineOptions != nil {
		o.EngineOptions(&eo)
	}
	e, err := engine.Open(dir, eo)
	if err != nil {
		return nil, err
	}
	s := &prefetchStore{e: e, m: o.Model, shard: int(layout.ShardBytes), layers: cfg.Layers,
		spec: kernels.SidecarSpec{Kind: kernels.SidecarESAMean, Layers: cfg.Layers, Heads: cfg.KVHeads, Dim: cfg.HeadDim, BlockSize: bs, Elem: kernels.Float16}}
	cache, err := model.NewKVCache(cfg, (len(w)+bs-1)/bs, bs)
	if err != nil {
		s.close()
		return nil, err
	}
	var seq model.Sequence
	if err := seq.Reserve(cache, len(w)); err != nil {
		s.close()
		return nil, err
	}
	if err := s.snap.prefill(o.Model, cache, &seq, w[:o.Prefill]); err != nil {
		s.close()
		return nil, err
	}
	if s.ids, err = s.storeBlocks(cache, seq.Blocks, 0, o.Prefill/bs, "prefill"); err != nil {
		s.close()
		return nil, err
	}
	// Read every stored block once, so that no run pays for a cold page cache.
	bufs := make([][]byte, len(s.ids))
	for i := range bufs {
		bufs[i] = make([]byte, int(layout.BlockBytes()))
	}
	if err := e.Load(s.ids, bufs).Wait(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// shardOf is layer l's shard (K then V) of cache block pb, as the store holds it.
func shardOf(cache *model.KVCache, l, pb int) []byte {
	bs := cache.BlockSize()
	n := bs * cache.KVHeads() * cache.HeadDim() * 2
	k, v := cache.Offset(0, pb*bs), cache.Offset(1, pb*bs)
	t := cache.Layer(l)
	return append(append(make([]byte, 0, 2*n), t[k:k+n]...), t[v:v+n]...)
}

// storeBlocks dumps logical blocks [from, to) of the cache (physical blocks table) and their
// ESA sidecars under ids named by prefix (a decoded block's K depends on the run's selections:
// each run stores its own) and returns the ids.
func (s *prefetchStore) storeBlocks(cache *model.KVCache, table []int, from, to int, prefix string) ([]engine.BlockID, error) {
	var ids []engine.BlockID
	var recs, sides [][]byte
	for b := from; b < to; b++ {
		id := blockID(prefix, b)
		rec := make([]byte, 0, s.layers*s.shard)
		w, err := kernels.NewSidecarWriter(s.spec, kernels.Float16)
		if err != nil {
			return nil, err
		}
		if err := w.Begin(cache.BlockSize()); err != nil {
			return nil, err
		}
		for l := range s.layers {
			sh := shardOf(cache, l, table[b])
			rec = append(rec, sh...)
			if err := w.AddLayer(l, sh[:len(sh)/2]); err != nil {
				return nil, err
			}
		}
		p, err := w.AppendPayload(nil)
		if err != nil {
			return nil, err
		}
		ids, recs, sides = append(ids, id), append(recs, rec), append(sides, p)
	}
	if err := s.e.Dump(ids, recs).Wait(); err != nil {
		return nil, err
	}
	if err := s.e.DumpSidecars(engine.SidecarKind(s.spec.Kind), s.layers, ids, sides).Wait(); err != nil {
		return nil, err
	}
	return ids, nil
}

// decode runs one configuration over the window and adds its counts to res.
func (s *prefetchStore) decode(ctx context.Context, o PrefetchOptions, r PrefetchRun, w []byte, res *PrefetchResult, stall, stepTime *time.Duration) error {
	cfg := o.Model.Config()
	bs := o.BlockSize
	mc, err := MethodConfig(r.Method, o.Budget, bs, o.Init, o.Local)
	if err != nil {
		return err
	}
	var pc *sparse.PrefetchConfig
	switch c := mc.(type) {
	case *sparse.GSAConfig:
		pc = &c.PrefetchConfig
	case *sparse.ESAConfig:
		pc = &c.PrefetchConfig
	default:
		return fmt.Errorf("%w: %s has no prefetch engine (GSA, ESA)", sparse.ErrInvalid, r.Method)
	}
	maxBlocks := (len(w) + bs - 1) / bs
	perStep := max(1, int(float64(maxBlocks)*o.Budget)) * cfg.Layers
	pc.Ahead, pc.Workers, pc.Eviction = r.Ahead, o.Workers, o.Eviction
	pc.CacheSize = max(1, int(o.CacheFactor*float64(perStep)))
	res.Cache = pc.CacheSize
	meth, err := sparse.New(mc, sparse.Env{Role: sparse.RoleWorker, Sidecars: s.e, Blocks: sparse.EngineBlocks{Engine: s.e}, ShardBytes: s.shard,
		Shape: sparse.Shape{Layers: cfg.Layers, QHeads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, BlockSize: bs}})
	if err != nil {
		return err
	}
	defer meth.Close()
	pf := meth.(interface{ Prefetcher() *sparse.Prefetcher }).Prefetcher()
	cache, err := model.NewKVCache(cfg, maxBlocks, bs)
	if err != nil {
		return err
	}
	var seq model.Sequence
	if err := seq.Reserve(cache, len(w)); err != nil {
		return err
	}
	if err := s.snap.prefill(o.Model, cache, &seq, w[:o.Prefill]); err != nil {
		return err
	}
	s.runs++
	req := sparse.Request{ID: "r", BlockIDs: slices.Clone(s.ids)}
	var hookErr error
	stepN := 0
	hooks := &model.Hooks{SelectBlocks: func(layer, pos int, q []float32, sq *model.Sequence) []int {
		if hookErr != nil {
			return nil
		}
		n := pos/bs + 1
		req.BlockTable, req.NumComputedTokens, req.NumOutputTokens = sq.Blocks[:n], pos, stepN+1
		a := &sparse.Attention{Layer: layer, LayerName: fmt.Sprintf("model.layers.%d.self_attn", layer), Phase: sparse.PhaseDecode,
			Step: stepN, Request: &req, Q: q, BlockTable: sq.Blocks[:n], SeqLen: pos + 1}
		if err := meth.AttentionBegin(a); err != nil {
			hookErr = err
			return nil
		}
		sel := a.Selected
		if sel == nil {
			sel = make([]int, n)
			for i := range sel {
				sel[i] = i
			}
		}
		if a.LoadErr != nil {
			hookErr = a.LoadErr
		}
		for j, b := range sel {
			if b < len(req.BlockIDs) {
				res.Shards++
				if !bytes.Equal(a.KV[j], shardOf(cache, layer, sq.Blocks[b])) {
					hookErr = fmt.Errorf("%w: layer %d block %d: the loaded shard is not the cache's", sparse.ErrInvalid, layer, b)
				}
			}
		}
		sel = slices.Clone(sel)
		if err := meth.AttentionFinished(a); err != nil && hookErr == nil {
			hookErr = err
		}
		return sel
	}}
	before := pf.Stats()
	for p := o.Prefill; p < len(w)-1; p++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := o.Model.ForwardHooks(cache, &seq, []int{int(w[p])}, []int{p}, hooks); err != nil {
			return err
		}
		*stepTime += time.Since(t0)
		if hookErr != nil {
			return hookErr
		}
		seq.Len = p + 1
		if (p+1)%bs == 0 { // a block filled: the connector stores it (outside the timed step)
			ids, err := s.storeBlocks(cache, seq.Blocks, (p+1)/bs-1, (p+1)/bs, fmt.Sprintf("run %d", s.runs))
			if err != nil {
				return err
			}
			req.BlockIDs = append(req.BlockIDs, ids...)
		}
		stepN++
		res.Steps++
	}
	pf.WaitForCompletion(req.ID, 0)
	after := pf.Stats()
	res.Hits += after.Hits - before.Hits
	res.InFlight += after.InFlight - before.InFlight
	res.Misses += after.Misses - before.Misses
	res.Failed += after.Failed - before.Failed
	res.Prefetched += after.Prefetched - before.Prefetched
	*stall += after.Stall - before.Stall
	return nil
}

// ParsePrefetchRun parses "GSA@2" or "ESA+lag@1" (method, then prefetch_ahead).
func ParsePrefetchRun(s string) (PrefetchRun, error) {
	name, ahead, ok := strings.Cut(s, "@")
	var r PrefetchRun
	if !ok {
		return r, fmt.Errorf("%w: prefetch run %q: want method@ahead (GSA@2, ESA+lag@1)", sparse.ErrInvalid, s)
	}
	if _, err := fmt.Sscanf(ahead, "%d", &r.Ahead); err != nil || r.Ahead < 0 || r.Ahead > 64 {
		return r, fmt.Errorf("%w: prefetch run %q: ahead %q", sparse.ErrInvalid, s, ahead)
	}
	n, err := CanonicalMethod(name)
	if err != nil {
		return r, err
	}
	r.Method = n
	return r, nil
}
