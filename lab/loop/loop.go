// Package loop is the reference connector loop: a small serving loop around the byte-level
// model (lab/model) that embeds the engine the way UCM's vLLM connector does. Per
// request it hashes the prompt's full blocks (UCM's chained block ids), asks the store for the
// longest stored prefix, loads those blocks layer by layer through the staging layer (package
// kernels) into the model's paged KV cache, computes only the rest of the prompt, and dumps the
// new blocks layer by layer with the representations sparse attention scans (sidecars)
// computed from their staged K.
//
// The loop is what the engine's figures are judged on: prefill tokens saved and time to first
// token with and without the store (Replay), and the guarantee that a prefix hit changes
// nothing the model computes: logits are bit-identical with and without the store.
package loop

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ucm-go/ucm/connector/ucmhash"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/model"
)

// ErrInvalid is wrapped by every error about a bad option or argument.
var ErrInvalid = errors.New("loop: invalid argument")

// Defaults of Options.
const (
	DefaultBlockSize = 16
	// DefaultMaxContext is the longest sequence (prompt and generated tokens) a request may
	// reach, when the model's own limit is not smaller.
	DefaultMaxContext = 1024
	// DefaultSequences is how many sequences' blocks the paged cache holds at once.
	DefaultSequences = 2
)

// Options configure a Server.
type Options struct {
	// Model is the model served (required).
	Model *model.Model
	// ModelName names the model in the store's schema and in the block ids' hash meta
	// (required with a Store): blocks of another model must never be hits.
	ModelName string
	// Store is the engine blocks are looked up in, loaded from and dumped to; nil serves
	// without a store (every prompt token computed). Its layout must be StoreLayout's.
	Store *engine.Engine
	// BlockSize is the tokens per KV block (default 16).
	BlockSize int
	// MaxContext bounds a sequence (default min(1024, the model's context)).
	MaxContext int
	// Sequences is how many sequences the paged cache can hold at once (default 2).
	Sequences int
	// Sidecars are the representations computed from every dumped block's K and stored beside
	// it: Kind and the kind's parameters (Elem, PruneRatio, Merge, HashBits, Seed); Layers,
	// Heads, Dim and BlockSize are the model's and are filled in.
	Sidecars []kernels.SidecarSpec
	// Device is the simulated device's options (its link model: bandwidth, latency).
	Device kernels.SimOptions
	// StagingBuffers is the layers in flight through staging (kernels.PipelineOptions.Buffers;
	// default 2).
	StagingBuffers int
	// LoadPolicy says when a stored prefix is loaded rather than computed (default
	// LoadWhenFaster).
	LoadPolicy LoadPolicy
}

// Server serves requests one at a time on one paged KV cache. It is not safe for concurrent
// use.
type Server struct {
	opts     Options
	m        *model.Model
	cfg      model.Config
	cache    *model.KVCache
	dev      *kernels.Device
	mems     []*kernels.Memory
	paged    *kernels.PagedKV
	pl       *kernels.Pipeline
	stream   *kernels.Stream
	hasher   *ucmhash.Hasher
	sidecars []kernels.SidecarSpec
	store    *engine.Engine
	costs    prefillCosts
}

// StoreSchema is the schema a store for this model and block size must have: the model's name,
// its fp16 KV cache in vLLM's FlashAttention layout, one rank.
func StoreSchema(modelName string, blockSize int) engine.Schema {
	return engine.Schema{Model: modelName, DType: "float16", KVLayout: "flash_attn", TPSize: 1, BlockTokens: blockSize}
}

// StoreLayout is the record layout of the model's blocks: one shard per layer holding K then V
// of block size × KV heads × head dim fp16 values each.
func StoreLayout(cfg model.Config, blockSize int) (engine.Layout, error) {
	rec, err := cacheSpec(cfg, 1, blockSize).Record(cfg.Layers)
	if err != nil {
		return engine.Layout{}, fmt.Errorf("%w: store layout: %v", ErrInvalid, err)
	}
	return engine.Layout{Shards: rec.Shards, TensorsPerShard: rec.TensorsPerShard, ShardBytes: rec.ShardBytes}, nil
}

func cacheSpec(cfg model.Config, numBlocks, blockSize int) kernels.CacheSpec {
	return kernels.CacheSpec{Layout: kernels.LayoutFlashAttn, DType: kernels.Float16, NumBlocks: numBlocks, BlockSize: blockSize,
		KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim}
}

// NewServer builds the paged cache, registers it with a simulated device, and checks that the
// store (if any) holds this model's blocks in this layout.
func NewServer(opts Options) (*Server, error) {
	if opts.Model == nil {
		return nil, fmt.Errorf("%w: no model", ErrInvalid)
	}
	cfg := opts.Model.Config()
	if opts.BlockSize == 0 {
		opts.BlockSize = DefaultBlockSize
	}
	if opts.MaxContext == 0 {
		opts.MaxContext = min(DefaultMaxContext, cfg.MaxCtx)
	}
	if opts.Sequences == 0 {
		opts.Sequences = DefaultSequences
	}
	switch {
	case opts.BlockSize < 1 || opts.BlockSize > 1024:
		return nil, fmt.Errorf("%w: block size %d outside [1, 1024]", ErrInvalid, opts.BlockSize)
	case opts.MaxContext < opts.BlockSize || opts.MaxContext > cfg.MaxCtx:
		return nil, fmt.Errorf("%w: max context %d outside [%d, %d] (block size, the model's context)", ErrInvalid, opts.MaxContext, opts.BlockSize, cfg.MaxCtx)
	case opts.Sequences < 1 || opts.Sequences > 64:
		return nil, fmt.Errorf("%w: sequences %d outside [1, 64]", ErrInvalid, opts.Sequences)
	case opts.Store != nil && opts.ModelName == "":
		return nil, fmt.Errorf("%w: a store needs the model's name", ErrInvalid)
	}
	s := &Server{opts: opts, m: opts.Model, cfg: cfg, store: opts.Store}
	blocksPerSeq := (opts.MaxContext + opts.BlockSize - 1) / opts.BlockSize
	var err error
	if s.cache, err = model.NewKVCache(cfg, blocksPerSeq*opts.Sequences, opts.BlockSize); err != nil {
		return nil, err
	}
	if err := s.register(blocksPerSeq); err != nil {
		s.Close()
		return nil, err
	}
	for _, sc := range opts.Sidecars {
		sc.Layers, sc.Heads, sc.Dim, sc.BlockSize = cfg.Layers, cfg.KVHeads, cfg.HeadDim, opts.BlockSize
		if sc.Elem == 0 && sc.Kind != kernels.SidecarHash {
			sc.Elem = kernels.DefaultSidecarElem(kernels.Float16)
		}
		if err := sc.Validate(); err != nil {
			s.Close()
			return nil, fmt.Errorf("sidecar %v: %w", sc.Kind, err)
		}
		s.sidecars = append(s.sidecars, sc)
	}
	if s.store != nil {
		want, err := StoreLayout(cfg, opts.BlockSize)
		if err != nil {
			s.Close()
			return nil, err
		}
		if got := s.store.Layout(); got != want {
			s.Close()
			return nil, fmt.Errorf("%w: the store's layout %+v is not the model's %+v (open it with StoreLayout)", ErrInvalid, got, want)
		}
		if s.hasher, err = ucmhash.NewHasher(ucmhash.HashMeta{Model: opts.ModelName, TPSize: 1, DType: "torch.float16"}, engine.HashSchemeUCMGo, opts.BlockSize); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// register adopts the cache's layers as device memory and builds the pipeline.
func (s *Server) register(blocksPerSeq int) error {
	var err error
	if s.dev, err = kernels.NewSimDevice(s.opts.Device); err != nil {
		return err
	}
	regions := make([]kernels.LayerRegion, s.cfg.Layers)
	for i := range regions {
		mem, err := s.dev.Adopt(fmt.Sprintf("kv layer %d", i), s.cache.Layer(i))
		if err != nil {
			return err
		}
		s.mems = append(s.mems, mem)
		regions[i] = kernels.LayerRegion{Name: fmt.Sprintf("model.layers.%d.self_attn", i), Mem: mem}
	}
	if s.paged, err = kernels.Register(s.cache.Spec(), regions); err != nil {
		return err
	}
	if s.pl, err = kernels.NewPipeline(s.paged, kernels.PipelineOptions{Buffers: s.opts.StagingBuffers, MaxBlocks: blocksPerSeq}); err != nil {
		return err
	}
	s.stream, err = s.dev.NewStream()
	return err
}

// Close releases the pipeline, the stream and the device (not the store).
func (s *Server) Close() {
	if s.pl != nil {
		_ = s.pl.Close()
	}
	if s.stream != nil {
		_ = s.stream.Close()
	}
	if s.dev != nil {
		_ = s.dev.Close()
	}
}

// Request is one sequence being served: its tokens so far and its place in the paged cache.
type Request struct {
	tokens []int
	seq    model.Sequence
	ids    []engine.BlockID // block ids of the full blocks hashed so far
	stored int              // leading full blocks known to be in the store
	last   []float32        // logits of the last position
	done   bool
}

// Tokens returns the request's tokens (prompt and generated).
func (r *Request) Tokens() []int { return r.tokens }

// Logits returns the logits of the last position ([Vocab]).
func (r *Request) Logits() []float32 { return r.last }

// PrefillStats says what one prefill cost.
type PrefillStats struct {
	PromptTokens int
	// HitTokens were loaded from the store, ComputedTokens computed by the model.
	HitTokens, ComputedTokens int
	// TTFT is from the request's arrival to its first token's logits: hashing, lookup, the
	// loads of the hit blocks and the compute of the rest. Load and Compute are its parts.
	TTFT, Load, Compute time.Duration
	// LoadFailed reports a load that failed and was recomputed instead: the first failed
	// block's error (or the load's, when it failed as a whole).
	LoadFailed error
	// FailedBlocks counts the hit blocks that could not be loaded (broken in any layer, or gone
	// since the lookup); the prompt is computed from the first of them on.
	FailedBlocks int
	// SkippedTokens were stored but computed: loading them was estimated to take longer
	// (LoadWhenFaster).
	SkippedTokens int
}

// Prefill starts a request with prompt (bytes are the model's tokens): it loads the longest
// stored prefix of its full blocks (at least one token is always computed, for the logits),
// computes the rest and returns the request with the logits of the prompt's last position.
func (s *Server) Prefill(ctx context.Context, prompt []byte) (*Request, PrefillStats, error) {
	start := time.Now()
	st := PrefillStats{PromptTokens: len(prompt)}
	if len(prompt) == 0 || len(prompt) > s.opts.MaxContext {
		return nil, st, fmt.Errorf("%w: prompt of %d tokens outside [1, %d]", ErrInvalid, len(prompt), s.opts.MaxContext)
	}
	r := &Request{tokens: make([]int, len(prompt))}
	for i, b := range prompt {
		r.tokens[i] = int(b)
	}
	if err := r.seq.Reserve(s.cache, len(r.tokens)); err != nil {
		return nil, st, err
	}
	bs := s.opts.BlockSize
	hit := 0
	if s.store != nil {
		r.ids = s.hasher.BlockIDs(tokensU32(r.tokens[:len(r.tokens)/bs*bs]), nil)
		// Leave at least the last token to compute: its logits are the answer.
		hit = min(s.store.LookupPrefix(r.ids), (len(r.tokens)-1)/bs)
		if hit > 0 && s.opts.LoadPolicy == LoadWhenFaster && !s.costs.worthLoading(hit, hit*bs, len(r.tokens)) {
			st.SkippedTokens, hit = hit*bs, 0
		}
	}
	logits, err := s.prefill(ctx, r, hit, &st)
	if err != nil {
		_ = r.seq.Release(s.cache)
		return nil, st, err
	}
	switch {
	case st.LoadFailed != nil:
	case st.HitTokens == 0:
		s.costs.compute.add(float64(st.ComputedTokens), st.Compute.Seconds()) // a compute alone
	default:
		s.costs.load.add(float64(st.HitTokens/bs), st.Load.Seconds())
	}
	r.seq.Len = len(r.tokens)
	r.last = logits[len(logits)-s.cfg.Vocab:]
	st.TTFT = time.Since(start)
	return r, st, nil
}

// prefill computes r's prompt after its first hit blocks, which are loaded layer by layer
// meanwhile: layer i's attention waits for layer i of the hit blocks to be resident, so the
// compute of each layer overlaps the loads of the next ones.
//
// A hit block that fails to load (broken on the medium, or evicted since the lookup) does not
// stop the load: every layer of every hit block is still read, so that the store finds, and
// drops, every broken block in one pass rather than those of the first failing layer only.
// The compute stops at the first failure it sees; once the load is done the prompt is
// computed from the first failed block on, over the blocks before it, which are resident in
// every layer. A load that fails as a whole (the store closed, ctx ended) computes everything.
func (s *Server) prefill(ctx context.Context, r *Request, hit int, st *PrefillStats) ([]float32, error) {
	bs := s.opts.BlockSize
	var (
		hooks *model.Hooks
		load  *kernels.LayerLoad
		fails *blockFailures
		t0    = time.Now()
	)
	if hit > 0 {
		ids := r.ids[:hit]
		fails = &blockFailures{first: hit}
		var err error
		load, err = s.pl.Load(ctx, s.stream, r.seq.Blocks[:hit], s.loadShardsTolerant(ids, fails))
		if err != nil {
			return nil, err
		}
		defer func() { _ = load.Close() }()
		hooks = &model.Hooks{BeforeAttention: func(layer int) error {
			err := load.WaitLayer(layer)
			if layer == s.cfg.Layers-1 || err != nil {
				st.Load = time.Since(t0) // until the last layer was resident (or one failed)
			}
			if err == nil && fails.any() {
				err = errBlocksFailed // computing on would be wasted: the prompt is computed again
			}
			return err
		}}
	}
	computeFrom := func(from int, hooks *model.Hooks) ([]float32, error) {
		r.seq.Len = from
		t0 := time.Now()
		defer func() { st.Compute += time.Since(t0) }()
		return s.m.ForwardHooks(s.cache, &r.seq, r.tokens[from:], positions(from, len(r.tokens)), hooks)
	}
	logits, err := computeFrom(hit*bs, hooks)
	if load != nil && ctx.Err() == nil && (err != nil || fails.any()) {
		loadErr := load.Wait() // every layer read: every broken hit block found
		st.Load = time.Since(t0)
		first, n, blockErr := fails.result()
		switch {
		case loadErr != nil:
			// The load failed as a whole: nothing after its failing layer is resident.
			hit, st.LoadFailed, st.FailedBlocks = 0, loadErr, n
		case n > 0:
			hit, st.LoadFailed, st.FailedBlocks = first, blockErr, n
		default:
			return nil, err // the compute's own failure
		}
		// The cache blocks from hit on hold what the failed load left: the compute overwrites
		// them.
		logits, err = computeFrom(hit*bs, nil)
	}
	if err != nil {
		return nil, err
	}
	r.stored = hit
	st.HitTokens = hit * bs
	st.ComputedTokens = len(r.tokens) - st.HitTokens
	return logits, nil
}

// errBlocksFailed stops a prefill's compute once a hit block has failed to load.
var errBlocksFailed = errors.New("loop: a hit block failed to load")

// blockFailures collects the hit blocks whose load failed, across the layers loaded at once.
type blockFailures struct {
	mu    sync.Mutex
	first int   // the lowest failed block (len(ids) while none)
	err   error // its error
	n     int   // blocks failed
	seen  map[int]bool
}

func (f *blockFailures) add(i int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen[i] {
		return
	}
	if f.seen == nil {
		f.seen = map[int]bool{}
	}
	f.seen[i] = true
	f.n++
	if i < f.first {
		f.first, f.err = i, err
	}
}

func (f *blockFailures) any() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n > 0
}

func (f *blockFailures) result() (first, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.first, f.n, f.err
}

// loadShardsTolerant is the pipeline's LoadFunc for a prefill's hit blocks: one engine
// LoadShard per layer, whose failed blocks are recorded in fails rather than failing the
// layer, so that every layer of every block is read. The layer fails only when the load
// failed as a whole (no block reported on its own, or ctx ended).
func (s *Server) loadShardsTolerant(ids []engine.BlockID, fails *blockFailures) kernels.LoadFunc {
	return func(ctx context.Context, layer int, shards [][]byte) error {
		t := s.store.LoadShard(ids, layer, shards)
		err := t.WaitContext(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		be := t.BlockErrors()
		if len(be) != len(ids) {
			return err
		}
		for i, e := range be {
			if e != nil {
				fails.add(i, fmt.Errorf("block %d (%s), layer %d: %w", i, ids[i], layer, e))
			}
		}
		return nil
	}
}

// loadShards is the pipeline's LoadFunc for blocks ids: one engine LoadShard per layer.
func (s *Server) loadShards(ids []engine.BlockID) kernels.LoadFunc {
	return func(ctx context.Context, layer int, shards [][]byte) error {
		return s.store.LoadShard(ids, layer, shards).WaitContext(ctx)
	}
}

// loadBlocks loads the blocks ids into the cache blocks dst, layer by layer through the
// pipeline, and waits for every layer.
func (s *Server) loadBlocks(ctx context.Context, ids []engine.BlockID, dst []int) error {
	l, err := s.pl.Load(ctx, s.stream, dst, s.loadShards(ids))
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	return l.Wait()
}

// Decode generates n tokens greedily after the request's last position and returns them.
func (s *Server) Decode(r *Request, n int) ([]byte, error) {
	if r.done {
		return nil, fmt.Errorf("%w: request finished", ErrInvalid)
	}
	out := make([]byte, 0, n)
	for range n {
		if len(r.tokens) >= s.opts.MaxContext {
			break
		}
		tok := model.Argmax(r.last)
		out = append(out, byte(tok))
		p := len(r.tokens)
		if err := r.seq.Reserve(s.cache, p+1); err != nil {
			return out, err
		}
		logits, err := s.m.Forward(s.cache, &r.seq, []int{tok}, []int{p})
		if err != nil {
			return out, err
		}
		r.tokens = append(r.tokens, tok)
		r.seq.Len = p + 1
		r.last = logits
	}
	return out, nil
}

// DumpStats says what storing a request's blocks cost.
type DumpStats struct {
	Blocks, Sidecars int
	Time             time.Duration
}

// Finish stores the request's full blocks that are not stored yet (prompt and generated
// tokens: the next turn of a conversation starts with them), layer by layer, with their
// sidecars, and frees its cache blocks.
func (s *Server) Finish(ctx context.Context, r *Request) (DumpStats, error) {
	var st DumpStats
	if r.done {
		return st, fmt.Errorf("%w: request finished", ErrInvalid)
	}
	r.done = true
	defer func() { _ = r.seq.Release(s.cache) }()
	if s.store == nil {
		return st, nil
	}
	start := time.Now()
	bs := s.opts.BlockSize
	full := len(r.tokens) / bs
	r.ids = s.hasher.BlockIDs(tokensU32(r.tokens[:full*bs]), nil)
	if r.stored >= full {
		return st, nil
	}
	ids, blocks := r.ids[r.stored:full], r.seq.Blocks[r.stored:full]
	writers, err := s.sidecarWriters(len(ids))
	if err != nil {
		return st, err
	}
	// The pipeline runs the callbacks of up to Buffers layers at once; a block's sidecar writers
	// take one layer at a time.
	var sideMu sync.Mutex
	d, err := s.pl.Dump(ctx, s.stream, blocks, func(ctx context.Context, layer int, shards [][]byte) error {
		sideMu.Lock()
		for k, ws := range writers {
			for j, w := range ws {
				if err := w.AddLayer(layer, shards[j][:s.paged.Record().TensorBytes]); err != nil {
					sideMu.Unlock()
					return fmt.Errorf("sidecar %v of block %s: %w", s.sidecars[k].Kind, ids[j], err)
				}
			}
		}
		sideMu.Unlock()
		return s.store.DumpShard(ids, layer, shards).WaitContext(ctx)
	})
	if err != nil {
		return st, err
	}
	err = errors.Join(d.SaveAll(nil), d.Finish())
	_ = d.Close()
	if err != nil {
		return st, fmt.Errorf("dump of %d blocks: %w", len(ids), err)
	}
	st.Blocks = len(ids)
	for k, ws := range writers {
		src := make([][]byte, len(ws))
		for j, w := range ws {
			if src[j], err = w.AppendPayload(nil); err != nil {
				return st, err
			}
		}
		kind := engine.SidecarKind(s.sidecars[k].Kind)
		if err := s.store.DumpSidecars(kind, s.cfg.Layers, ids, src).WaitContext(ctx); err != nil {
			return st, fmt.Errorf("sidecars %v: %w", s.sidecars[k].Kind, err)
		}
		st.Sidecars += len(ids)
	}
	st.Time = time.Since(start)
	return st, nil
}

// sidecarWriters returns, per configured sidecar kind, one writer per block, begun for a full
// block.
func (s *Server) sidecarWriters(n int) ([][]*kernels.SidecarWriter, error) {
	out := make([][]*kernels.SidecarWriter, len(s.sidecars))
	for k, spec := range s.sidecars {
		out[k] = make([]*kernels.SidecarWriter, n)
		for j := range n {
			w, err := kernels.NewSidecarWriter(spec, kernels.Float16)
			if err != nil {
				return nil, err
			}
			if err := w.Begin(s.opts.BlockSize); err != nil {
				return nil, err
			}
			out[k][j] = w
		}
	}
	return out, nil
}

func positions(from, to int) []int {
	p := make([]int, to-from)
	for i := range p {
		p[i] = from + i
	}
	return p
}

func tokensU32(t []int) []uint32 {
	out := make([]uint32, len(t))
	for i, v := range t {
		out[i] = uint32(v)
	}
	return out
}
