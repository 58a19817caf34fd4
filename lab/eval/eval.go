// Package eval measures sparse attention on the small real model (lab/model): it decodes
// held-out text with each method selecting blocks from sidecars computed from the model's own
// K, teacher-forced, against full attention, and reports what a user of a method loses:
// attention-mass recall of the selected blocks, each layer's attention output error, next-token
// top-1 agreement, KL divergence and perplexity. ucm-lab eval sparse runs it.
package eval

import (
	"context"
	"crypto/md5"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/model"
	"github.com/ucm-go/ucm/sparse"
	"gopkg.in/yaml.v3"
)

// Options shape an evaluation.
type Options struct {
	// Model is the model decoded.
	Model *model.Model
	// Windows are the texts: each is prefilled densely for its first Prefill tokens, then
	// decoded token by token (teacher-forced) to its last token; the predictions of positions
	// Prefill … len−2 are scored against the next byte.
	Windows [][]byte
	Prefill int
	// BlockSizes, Budgets (fraction of a context's blocks attended, windows included) and
	// Methods (registry names) span the runs: every method at every budget and block size.
	BlockSizes []int
	Budgets    []float64
	Methods    []string
	// Init and Local are the leading and trailing window blocks every method keeps (the
	// current block is in the local window); 0 means 1.
	Init, Local int
	// DenseLayers attend densely under every method (as GSA On-Device's rollback layers, or
	// Quest leaving its first layers dense); the kept fraction counts them as whole.
	DenseLayers []int
	// LayerBudgets, when set, gives the reference selections (oracles and probes, not the
	// methods) a budget per layer instead of Budgets' (one value per layer; layers left dense
	// are ignored): to measure what spreading a budget unevenly over layers would be worth.
	// Results keep Budgets' value as their Budget.
	LayerBudgets []float64
	// Fit is the queries fitted on training text (FitQueries), for the probes and methods
	// that learn their representation from them; nil when none is run.
	Fit *QueryFit
	// Progress, when set, is told of each finished run.
	Progress func(r Result)
}

// Result is one (method, block size, budget) run over every window, or the dense baseline
// (Method "dense").
type Result struct {
	// Method is the method's registry name (with its variant), "oracle" or "dense".
	Method string `json:"method"`
	// BlockSize is the tokens per KV block; Budget the fraction of blocks attended asked for
	// (the nominal budget: layers left dense, the windows and a method's rounding make the
	// attended fraction differ).
	BlockSize int     `json:"block_tokens"`
	Budget    float64 `json:"budget"`
	// Positions is the decode positions scored.
	Positions int `json:"positions"`
	// Attended is the fraction of the run's (block, layer, KV head) units actually attended:
	// over every decode position of every window, the blocks attended in each layer by each KV
	// head (every block in a layer left dense; the windows included) over the context's blocks
	// times layers times KV heads. It is what a budget costs, where Budget is what was asked.
	Attended float64 `json:"attended_fraction"`
	// AttendedSparse is Attended over the layers not left dense (Options.DenseLayers) only:
	// what the budget costs in a layer that selects, comparable with LatencyResult.Attended.
	AttendedSparse float64 `json:"attended_fraction_sparse_layers"`
	// Kept is the mean over (position, layer) of the fraction of the context's blocks attended
	// (averaged over KV heads): Attended with every step weighted alike, whatever its context.
	Kept float64 `json:"kept_fraction"`
	// Recall is the mean share of full attention's probability mass (the run's own query over
	// its own cache) falling in the attended blocks, over positions, layers and query heads.
	Recall float64 `json:"attention_mass_recall"`
	// MinRecall is the lowest per-(position, layer) recall.
	MinRecall float64 `json:"min_recall"`
	// LayerRelErr is, per layer, the mean of ‖o_sparse − o_full‖ / ‖o_full‖ of the attention
	// output for the same query and cache.
	LayerRelErr []float64 `json:"layer_rel_err"`
	// Top1 is the share of positions whose argmax equals full attention's.
	Top1 float64 `json:"top1_agreement"`
	// KL is the mean KL(full ‖ sparse) of the next-token distributions, in nats.
	KL float64 `json:"kl_nats"`
	// PPL is exp(mean NLL of the next byte); DensePPL the same for full attention; PPLChange
	// PPL/DensePPL − 1.
	PPL       float64 `json:"ppl"`
	DensePPL  float64 `json:"dense_ppl"`
	PPLChange float64 `json:"ppl_change"`
	// SelectMicros is the mean wall time of one layer's selection (AttentionBegin), in µs.
	SelectMicros float64 `json:"select_us_per_layer"`
}

// Oracle names the reference selection Run accepts among the methods: the blocks holding the
// most full-attention mass (summed over query heads) within the same windows and budget. It
// reads every key, so it is the ceiling a sidecar-based method can approach, not a method.
const Oracle = "oracle"

// OracleKV is the oracle per KV head: each KV head keeps the blocks holding the most of its
// query heads' full-attention mass (the ceiling of head_select kv).
const OracleKV = "oracle+kv"

// MethodConfig is the configuration the evaluation runs a method with at a budget and block
// size: budget as the fraction of blocks kept, windows included; init and local windows of
// the given blocks; GSA without its min_blocks floor; GSA On-Device with init·block size sink
// and local·block size recent tokens and codes of head-dim bits, seed 1; other keys at their
// defaults (KVStar's retrieval_stride 8, prune 0.5, merge 4).
//
// A name may carry a variant: "+softmax" (ESA and Quest: head_score softmax) or "+lag" (ESA:
// retrieval_lag 1).
func MethodConfig(name string, budget float64, blockSize, init, local int) (sparse.MethodConfig, error) {
	base, variants, _ := strings.Cut(name, "+")
	// key=value variants are the method's own configuration keys, parsed as its block.
	var keys []string
	for _, v := range strings.Split(variants, "+") {
		if k, val, ok := strings.Cut(v, "="); ok {
			keys = append(keys, k+": "+val)
		}
	}
	var node *yaml.Node
	if len(keys) > 0 {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte("{"+strings.Join(keys, ", ")+"}"), &doc); err != nil || len(doc.Content) != 1 {
			return nil, fmt.Errorf("%w: %s: variants %q: %v", sparse.ErrInvalid, name, keys, err)
		}
		node = doc.Content[0]
	}
	cfg, err := sparse.ParseMethodConfig(base, node)
	if err != nil {
		return nil, err
	}
	perKV := false
	for _, variant := range strings.Split(variants, "+") {
		if variant == "" || strings.Contains(variant, "=") {
			continue
		}
		if variant == "kv" { // head_select kv: every method has it
			perKV = true
			continue
		}
		switch c := cfg.(type) {
		case *sparse.ESAConfig:
			switch variant {
			case "lag":
				c.RetrievalLag = 1
			case "int8":
				c.ReprDType = "int8"
			case "max":
				c.Pool = "max"
			default:
				c.HeadScore = variant
			}
		case *sparse.QuestConfig:
			c.HeadScore = variant
		case *sparse.KVStarConfig:
			c.HeadScore = variant
		default:
			return nil, fmt.Errorf("%w: %s has no variant %q", sparse.ErrInvalid, base, variant)
		}
	}
	switch cfg.(type) {
	case *sparse.BlendConfig:
		return nil, fmt.Errorf("%w: Blend selects tokens to recompute, not blocks: ucm-lab eval blend measures it", sparse.ErrInvalid)
	case *sparse.ReRoPEConfig:
		return nil, fmt.Errorf("%w: ReRoPE selects no blocks", sparse.ErrInvalid)
	}
	if perKV {
		switch c := cfg.(type) {
		case *sparse.QuestConfig:
			c.HeadSelect = "kv"
		case *sparse.ESAConfig:
			c.HeadSelect = "kv"
		case *sparse.GSAConfig:
			c.HeadSelect = "kv"
		case *sparse.KVStarConfig:
			c.HeadSelect = "kv"
		case *sparse.GSAOnDeviceConfig:
			c.HeadSelect = "kv"
		}
	}
	win := func(w *sparse.WindowConfig) { w.InitWindow, w.LocalWindow, w.Budget = init, local, budget }
	switch c := cfg.(type) {
	case *sparse.QuestConfig:
		win(&c.WindowConfig)
	case *sparse.ESAConfig:
		win(&c.WindowConfig)
	case *sparse.GSAConfig:
		win(&c.WindowConfig)
		c.MinBlocks = 0
	case *sparse.KVStarConfig:
		win(&c.WindowConfig)
	case *sparse.GSAOnDeviceConfig:
		c.SinkTokens, c.RecentTokens, c.Budget, c.HashBits, c.HashSeed = init*blockSize, local*blockSize, budget, 0, 1
	}
	return cfg, cfg.Validate()
}

// CanonicalMethod spells a method name as the registry does (with its variant), or "oracle";
// unknown names and variants are errors.
func CanonicalMethod(name string) (string, error) {
	if strings.EqualFold(name, Oracle) {
		return Oracle, nil
	}
	if strings.EqualFold(name, OracleKV) {
		return OracleKV, nil
	}
	if strings.HasPrefix(name, ProbePrefix) {
		if _, err := parseProbe(name); err != nil {
			return "", err
		}
		return name, nil
	}
	cfg, err := MethodConfig(name, 0.5, 16, 1, 1)
	if err != nil {
		return "", err
	}
	if _, variants, ok := strings.Cut(name, "+"); ok {
		return cfg.Method() + "+" + variants, nil
	}
	return cfg.Method(), nil
}

// sidecarSpecer is implemented by the block-scoring methods.
type sidecarSpecer interface{ SidecarSpec() kernels.SidecarSpec }

// Run evaluates every configuration and returns the dense baseline first (per block size),
// then a Result per (block size, method, budget).
func Run(ctx context.Context, o Options) ([]Result, error) {
	cfg := o.Model.Config()
	o.Init, o.Local = max(o.Init, 1), max(o.Local, 1)
	if len(o.LayerBudgets) > 0 && len(o.LayerBudgets) != cfg.Layers {
		return nil, fmt.Errorf("%w: eval: %d layer budgets for %d layers", sparse.ErrInvalid, len(o.LayerBudgets), cfg.Layers)
	}
	for _, b := range o.LayerBudgets {
		if !(b > 0 && b <= 1) {
			return nil, fmt.Errorf("%w: eval: layer budget %v: want (0, 1]", sparse.ErrInvalid, b)
		}
	}
	if len(o.Windows) == 0 || o.Prefill < 1 {
		return nil, fmt.Errorf("%w: eval: %d windows, prefill %d", sparse.ErrInvalid, len(o.Windows), o.Prefill)
	}
	for i, w := range o.Windows {
		if len(w) < o.Prefill+2 || len(w) > cfg.MaxCtx+1 {
			return nil, fmt.Errorf("%w: eval: window %d has %d bytes: want [prefill+2, context+1] = [%d, %d]", sparse.ErrInvalid, i, len(w), o.Prefill+2, cfg.MaxCtx+1)
		}
	}
	// The dense reference: logits of every decode position of every window. Dense attention
	// does not depend on the block size (the model attends positions in order whatever the
	// paging), so one run serves every block size.
	dense := make([][][]float32, len(o.Windows))
	for wi, w := range o.Windows {
		var err error
		if dense[wi], err = decodeRun(ctx, o.Model, w, o.Prefill, 16, nil, nil); err != nil {
			return nil, err
		}
	}
	var out []Result
	for _, bs := range o.BlockSizes {
		snaps := make([]prefillSnap, len(o.Windows))
		base := Result{Method: "dense", BlockSize: bs, Budget: 1, Attended: 1, AttendedSparse: 1, Kept: 1, Recall: 1, MinRecall: 1, Top1: 1, LayerRelErr: make([]float64, cfg.Layers)}
		var nll float64
		for wi, w := range o.Windows {
			for i, lg := range dense[wi] {
				nll += -logSoftmax(lg)[w[o.Prefill+i+1]]
				base.Positions++
			}
		}
		base.PPL = math.Exp(nll / float64(base.Positions))
		base.DensePPL = base.PPL
		out = append(out, base)
		if o.Progress != nil {
			o.Progress(base)
		}
		for _, name := range o.Methods {
			for _, budget := range o.Budgets {
				r, err := runMethod(ctx, o, name, budget, bs, dense, snaps)
				if err != nil {
					return out, fmt.Errorf("%s at %.0f%%, %d-token blocks: %w", name, 100*budget, bs, err)
				}
				r.DensePPL = base.PPL
				r.PPLChange = r.PPL/base.PPL - 1
				out = append(out, r)
				if o.Progress != nil {
					o.Progress(r)
				}
			}
		}
	}
	return out, nil
}

// run is one decode of one window under one method.
type run struct {
	m      *model.Model
	cache  *model.KVCache
	seq    model.Sequence
	method sparse.SparseMethod
	spec   kernels.SidecarSpec
	src    *sparse.MapSidecars
	req    sparse.Request
	bs     int
	step   int
	res    *Result
	// oracleKV: the oracle selects per KV head.
	oracleKV bool
	// probe: selection by key statistics (probe.go), instead of the oracle.
	probe        *probeSpec
	probeCache   map[probeKey]*probeStats
	fit          *QueryFit
	layerBudgets []float64
	carried      map[probeKey]map[int]float64 // by layer and KV head: block → attention share
	hashEnc      *kernels.HashEncoder
	// init and local are the oracle's windows; denseLayers attend densely.
	init, local int
	denseLayers []int
	// hookErr is the first error of a selection (the model's hook cannot return one).
	hookErr error
	// accumulators
	attended, attendedSparse   attendance
	keptSum, recallSum, layerN float64
	layerErr                   []float64
	selTime                    time.Duration
	selN                       int
	kbuf, vbuf                 []float32
	probs                      []float64
}

// prefillSnap keeps a window's prefilled cache (for one block size), so that the runs of every
// method and budget start from it instead of computing the prefill again. Prefill is dense
// and deterministic: a copy is what a recomputation would give.
type prefillSnap struct {
	layers [][]byte
	blocks []int
}

// prefill computes tokens' K/V into cache (positions 0…) or copies them from the snapshot of
// an earlier identical prefill; a nil snapshot always computes.
func (s *prefillSnap) prefill(m *model.Model, cache *model.KVCache, seq *model.Sequence, tokens []byte) error {
	if s != nil && s.layers != nil && slices.Equal(s.blocks, seq.Blocks) {
		for l, b := range s.layers {
			copy(cache.Layer(l), b)
		}
		seq.Len = len(tokens)
		return nil
	}
	toks, pos := make([]int, len(tokens)), make([]int, len(tokens))
	for i, t := range tokens {
		toks[i], pos[i] = int(t), i
	}
	if _, err := m.Forward(cache, seq, toks, pos); err != nil {
		return err
	}
	if s != nil {
		s.layers, s.blocks = make([][]byte, cache.Layers()), slices.Clone(seq.Blocks)
		for l := range s.layers {
			s.layers[l] = slices.Clone(cache.Layer(l))
		}
	}
	return nil
}

// decodeRun prefills w[:prefill] densely and decodes w[prefill:len−1] one token at a time with
// hooks, returning each decode step's logits.
func decodeRun(ctx context.Context, m *model.Model, w []byte, prefill, bs int, r *run, snap *prefillSnap) ([][]float32, error) {
	cfg := m.Config()
	cache, err := model.NewKVCache(cfg, (len(w)+bs-1)/bs, bs)
	if err != nil {
		return nil, err
	}
	var seq model.Sequence
	if err := seq.Reserve(cache, len(w)); err != nil {
		return nil, err
	}
	if err := snap.prefill(m, cache, &seq, w[:prefill]); err != nil {
		return nil, err
	}
	var hooks *model.Hooks
	if r != nil {
		r.m, r.cache, r.seq, r.bs = m, cache, seq, bs
		if err := r.prefillSidecars(prefill); err != nil {
			return nil, err
		}
		hooks = &model.Hooks{SelectHeadBlocks: r.selectBlocks}
	}
	var out [][]float32
	for p := prefill; p < len(w)-1; p++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s := &seq
		if r != nil {
			s = &r.seq
			r.step = p - prefill
		}
		lg, err := m.ForwardHooks(cache, s, []int{int(w[p])}, []int{p}, hooks)
		if err != nil {
			return nil, err
		}
		if r != nil {
			if r.hookErr != nil {
				return nil, r.hookErr
			}
			if (p+1)%bs == 0 { // block p/bs just filled: store its sidecar
				if err := r.addSidecar(p / bs); err != nil {
					return nil, err
				}
			}
		}
		out = append(out, lg)
	}
	return out, nil
}

func runMethod(ctx context.Context, o Options, name string, budget float64, bs int, dense [][][]float32, snaps []prefillSnap) (Result, error) {
	cfg := o.Model.Config()
	res := Result{Method: name, BlockSize: bs, Budget: budget, MinRecall: 1, LayerRelErr: make([]float64, cfg.Layers)}
	var mc sparse.MethodConfig
	var probe *probeSpec
	if strings.HasPrefix(name, ProbePrefix) {
		var err error
		if probe, err = parseProbe(name); err != nil {
			return res, err
		}
		if bs%probeMerge != 0 || bs < 2 {
			return res, fmt.Errorf("%w: %s: blocks of %d tokens: probes need a multiple of %d", sparse.ErrInvalid, name, bs, probeMerge)
		}
		if probe.needsFit() && o.Fit == nil {
			return res, fmt.Errorf("%w: %s: needs queries fitted on training text (Options.Fit)", sparse.ErrInvalid, name)
		}
	} else if name != Oracle && name != OracleKV {
		var err error
		if mc, err = MethodConfig(name, budget, bs, o.Init, o.Local); err != nil {
			return res, err
		}
	}
	var nll, kl float64
	var top1 int
	var keptSum, recallSum, layerN float64
	var att, attSparse attendance
	var selTime time.Duration
	var selN int
	for wi, w := range o.Windows {
		r := &run{src: &sparse.MapSidecars{}, res: &res, layerErr: make([]float64, cfg.Layers), init: o.Init, local: o.Local,
			denseLayers: o.DenseLayers, req: sparse.Request{ID: fmt.Sprintf("window-%d", wi)}, oracleKV: name == OracleKV,
			probe: probe, probeCache: map[probeKey]*probeStats{}, fit: o.Fit, layerBudgets: o.LayerBudgets}
		if mc != nil {
			m, err := sparse.New(mc, sparse.Env{Role: sparse.RoleWorker, Sidecars: r.src,
				Shape: sparse.Shape{Layers: cfg.Layers, QHeads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, BlockSize: bs}})
			if err != nil {
				return res, err
			}
			ss, ok := m.(sidecarSpecer)
			if !ok {
				return res, fmt.Errorf("%w: %s does not select from sidecars", sparse.ErrInvalid, name)
			}
			r.method, r.spec = m, ss.SidecarSpec()
		}
		logits, err := decodeRun(ctx, o.Model, w, o.Prefill, bs, r, &snaps[wi])
		if err != nil {
			return res, err
		}
		for i, lg := range logits {
			d := dense[wi][i]
			if model.Argmax(lg) == model.Argmax(d) {
				top1++
			}
			ls, ld := logSoftmax(lg), logSoftmax(d)
			nll += -ls[w[o.Prefill+i+1]]
			for j := range ld {
				kl += math.Exp(ld[j]) * (ld[j] - ls[j])
			}
			res.Positions++
		}
		keptSum += r.keptSum
		att.units += r.attended.units
		att.total += r.attended.total
		attSparse.units += r.attendedSparse.units
		attSparse.total += r.attendedSparse.total
		recallSum += r.recallSum
		layerN += r.layerN
		for l, e := range r.layerErr {
			res.LayerRelErr[l] += e
		}
		selTime += r.selTime
		selN += r.selN
	}
	n := float64(res.Positions)
	res.Top1 = float64(top1) / n
	res.KL = kl / n
	res.PPL = math.Exp(nll / n)
	res.Kept = keptSum / layerN
	res.Attended = att.fraction()
	res.AttendedSparse = attSparse.fraction()
	res.Recall = recallSum / layerN
	for l := range res.LayerRelErr {
		res.LayerRelErr[l] /= n
	}
	if selN > 0 {
		res.SelectMicros = float64(selTime.Microseconds()) / float64(selN)
	}
	return res, nil
}

// blockID is a window's synthetic block id (a store would give the chained hash).
func blockID(req string, b int) engine.BlockID {
	return md5.Sum(fmt.Appendf(nil, "%s block %d", req, b))
}

// prefillSidecars stores the sidecars of the prefill's full blocks.
func (r *run) prefillSidecars(prefill int) error {
	for b := range prefill / r.bs {
		if err := r.addSidecar(b); err != nil {
			return err
		}
	}
	return nil
}

// addSidecar computes logical block b's sidecar from the cache's K and stores it (nothing for
// the oracle).
func (r *run) addSidecar(b int) error {
	if r.method == nil {
		return nil
	}
	w, err := kernels.NewSidecarWriter(r.spec, kernels.Float16)
	if err != nil {
		return err
	}
	if err := w.Begin(r.bs); err != nil {
		return err
	}
	tb := r.cache.KVHeads() * r.cache.HeadDim() * 2
	for l := range r.cache.Layers() {
		off := r.cache.Offset(0, r.seq.Blocks[b]*r.bs)
		if err := w.AddLayer(l, r.cache.Layer(l)[off:off+r.bs*tb]); err != nil {
			return err
		}
	}
	p, err := w.AppendPayload(nil)
	if err != nil {
		return err
	}
	id := blockID(r.req.ID, b)
	if err := r.src.Put(engine.SidecarKind(r.spec.Kind), id, r.cache.Layers(), p); err != nil {
		return err
	}
	if b != len(r.req.BlockIDs) {
		return fmt.Errorf("%w: sidecar of block %d after %d blocks", sparse.ErrInvalid, b, len(r.req.BlockIDs))
	}
	r.req.BlockIDs = append(r.req.BlockIDs, id)
	return nil
}

// selectBlocks is the model's SelectHeadBlocks hook: the method's selection for this layer
// and position, per KV head (the same for every head unless the method selects per head),
// measured against full attention on the same query and cache.
func (r *run) selectBlocks(layer, pos int, q []float32, seq *model.Sequence) [][]int {
	if r.hookErr != nil {
		return nil
	}
	r.fullAttention(layer, pos, q)
	if slices.Contains(r.denseLayers, layer) {
		r.measure(layer, pos, nil)
		return nil
	}
	if r.method == nil { // the oracle
		start := time.Now()
		var sel [][]int
		if r.probe != nil {
			sel = r.probeSelect(layer, pos, q)
		} else {
			sel = r.oracleSelect(layer, pos)
		}
		r.selTime += time.Since(start)
		r.selN++
		r.measure(layer, pos, sel)
		return sel
	}
	n := pos/r.bs + 1
	r.req.BlockTable, r.req.NumComputedTokens, r.req.NumOutputTokens = seq.Blocks[:n], pos, r.step+1
	a := &sparse.Attention{Layer: layer, LayerName: fmt.Sprintf("model.layers.%d.self_attn", layer), Phase: sparse.PhaseDecode,
		Step: r.step, Request: &r.req, Q: q, BlockTable: seq.Blocks[:n], SeqLen: pos + 1}
	start := time.Now()
	err := r.method.AttentionBegin(a)
	r.selTime += time.Since(start)
	r.selN++
	if err != nil {
		r.hookErr = fmt.Errorf("layer %d position %d: %w", layer, pos, err)
		return nil
	}
	var sel [][]int
	switch {
	case a.HeadSelected != nil:
		for _, h := range a.HeadSelected {
			sel = append(sel, slices.Clone(h))
		}
	case a.Selected != nil:
		sel = r.everyHead(slices.Clone(a.Selected))
	}
	if err := r.method.AttentionFinished(a); err != nil {
		r.hookErr = err
		return nil
	}
	r.measure(layer, pos, sel)
	return sel
}

// budget is the reference selections' budget in layer (Options.LayerBudgets).
func (r *run) budget(layer int) float64 {
	if layer < len(r.layerBudgets) {
		return r.layerBudgets[layer]
	}
	return r.res.Budget
}

// everyHead is one selection for every KV head.
func (r *run) everyHead(sel []int) [][]int {
	if sel == nil {
		return nil
	}
	out := make([][]int, r.m.Config().KVHeads)
	for i := range out {
		out[i] = sel
	}
	return out
}

// fullAttention computes, for the step's query q ([heads][head dim], after RoPE) against
// layer's cache up to pos, every query head's full-attention weights (r.probs, [heads][pos+1],
// normalised) and decodes V (r.vbuf).
func (r *run) fullAttention(layer, pos int, q []float32) {
	cfg := r.m.Config()
	T, hd, kvd, G := pos+1, cfg.HeadDim, cfg.KVDim(), cfg.Heads/cfg.KVHeads
	r.kbuf = slices.Grow(r.kbuf[:0], T*kvd)[:T*kvd]
	r.vbuf = slices.Grow(r.vbuf[:0], T*kvd)[:T*kvd]
	r.probs = slices.Grow(r.probs[:0], cfg.Heads*T)[:cfg.Heads*T]
	buf := r.cache.Layer(layer)
	tb := kvd * 2
	for p := range T {
		slot := r.seq.Blocks[p/r.bs]*r.bs + p%r.bs
		_ = kernels.DecodeFloat32(r.kbuf[p*kvd:(p+1)*kvd], buf[r.cache.Offset(0, slot):r.cache.Offset(0, slot)+tb], kernels.Float16)
		_ = kernels.DecodeFloat32(r.vbuf[p*kvd:(p+1)*kvd], buf[r.cache.Offset(1, slot):r.cache.Offset(1, slot)+tb], kernels.Float16)
	}
	scale := 1 / math.Sqrt(float64(hd))
	for h := range cfg.Heads {
		kv := h / G
		qh := q[h*hd : (h+1)*hd]
		pr := r.probs[h*T : (h+1)*T]
		mx := math.Inf(-1)
		for p := range T {
			var s float64
			k := r.kbuf[p*kvd+kv*hd : p*kvd+(kv+1)*hd]
			for d, x := range qh {
				s += float64(x) * float64(k[d])
			}
			pr[p] = s * scale
			mx = max(mx, s*scale)
		}
		var z float64
		for p := range pr {
			pr[p] = math.Exp(pr[p] - mx)
			z += pr[p]
		}
		for p := range pr {
			pr[p] /= z
		}
	}
}

// oracleSelect is the best selection full attention allows at the run's budget: the windows
// and the blocks holding the most attention mass summed over query heads (it reads every K:
// a reference for the methods, not a method); per KV head over its query heads with oracleKV.
func (r *run) oracleSelect(layer, pos int) [][]int {
	cfg := r.m.Config()
	n, T, G := pos/r.bs+1, pos+1, cfg.Heads/cfg.KVHeads
	init, local := min(r.init, n), min(r.local, n-min(r.init, n))
	k := sparse.BudgetBlocks(n, r.budget(layer)) - init - local
	if init+local+max(k, 0) >= n {
		return nil
	}
	groups := 1
	if r.oracleKV {
		groups = cfg.KVHeads
	}
	var out [][]int
	for g := range groups {
		mass := make([]float64, n)
		for h := range cfg.Heads {
			if r.oracleKV && h/G != g {
				continue
			}
			for p, w := range r.probs[h*T : (h+1)*T] {
				mass[p/r.bs] += w
			}
		}
		out = append(out, sparse.SelectTopK(mass, init, local, k))
	}
	if !r.oracleKV {
		return r.everyHead(out[0])
	}
	return out
}

// measure compares attention over the selected blocks (nil: all) with full attention
// (fullAttention's weights): the share of full attention's mass in the selected blocks and
// the relative error of the output.
func (r *run) measure(layer, pos int, sel [][]int) {
	cfg := r.m.Config()
	n := pos/r.bs + 1
	T, hd, kvd, G := pos+1, cfg.HeadDim, cfg.KVDim(), cfg.Heads/cfg.KVHeads
	ins, kept := attendedBlocks(sel, n, cfg.KVHeads) // per KV head; summed over KV heads
	var mass, num, den float64
	full, part := make([]float64, hd), make([]float64, hd)
	for h := range cfg.Heads {
		kv := h / G
		in := ins[kv]
		pr := r.probs[h*T : (h+1)*T]
		var zin float64
		clear(full)
		clear(part)
		for p, w := range pr {
			v := r.vbuf[p*kvd+kv*hd : p*kvd+(kv+1)*hd]
			for d := range full {
				full[d] += w * float64(v[d])
			}
			if in[p/r.bs] {
				zin += w
				for d := range part {
					part[d] += w * float64(v[d])
				}
			}
		}
		mass += zin
		for d := range full {
			s := part[d] / zin
			num += (s - full[d]) * (s - full[d])
			den += full[d] * full[d]
		}
	}
	recall := mass / float64(cfg.Heads)
	r.recallSum += recall
	r.res.MinRecall = min(r.res.MinRecall, recall)
	r.keptSum += float64(kept) / float64(n*cfg.KVHeads)
	r.attended.add(kept, n*cfg.KVHeads)
	if !slices.Contains(r.denseLayers, layer) {
		r.attendedSparse.add(kept, n*cfg.KVHeads)
	}
	r.layerN++
	if den > 0 {
		r.layerErr[layer] += math.Sqrt(num / den)
	}
}

// attendance counts (block, layer, KV head) units: those attended and those in the context.
type attendance struct{ units, total int64 }

// add counts one (position, layer): attended of the total units of its context (the
// context's blocks times the KV heads).
func (a *attendance) add(attended, total int) {
	a.units += int64(attended)
	a.total += int64(total)
}

// attendedBlocks is a (position, layer)'s selection of n blocks over kvHeads KV heads as the
// model attends it: in[kv][b] when KV head kv attends block b (every block when sel is nil,
// else sel[kv]'s), and units, the (block, KV head) pairs attended (a block listed twice counts
// once).
func attendedBlocks(sel [][]int, n, kvHeads int) (in [][]bool, units int) {
	in = make([][]bool, kvHeads)
	for kv := range in {
		in[kv] = make([]bool, n)
		if sel == nil {
			for i := range in[kv] {
				in[kv][i] = true
			}
			units += n
			continue
		}
		for _, b := range sel[kv] {
			if !in[kv][b] {
				in[kv][b] = true
				units++
			}
		}
	}
	return in, units
}

// fraction is the share of the units counted that were attended (1 when none were counted).
func (a attendance) fraction() float64 {
	if a.total == 0 {
		return 1
	}
	return float64(a.units) / float64(a.total)
}

// logSoftmax returns log softmax(x) in float64.
func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = max(mx, float64(v))
	}
	var z float64
	for _, v := range x {
		z += math.Exp(float64(v) - mx)
	}
	lz := mx + math.Log(z)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - lz
	}
	return out
}
