package eval

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ucm-go/ucm/connector/ucmhash"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/model"
	"github.com/ucm-go/ucm/sparse"
)

// SelectionMethods are the registry's methods that select blocks (what Run evaluates): every
// built method but Blend, which selects tokens to recompute (RunBlend), and ReRoPE, which
// changes the scores of every key instead.
func SelectionMethods() []string {
	var out []string
	for _, n := range sparse.Names() {
		if n != sparse.NameBlend && n != sparse.NameReRoPE {
			out = append(out, n)
		}
	}
	return out
}

// Source modes of RunBlend: how the reused chunks were computed before.
const (
	// SourceStandalone: each chunk prefilled alone, from position 0 (a RAG document store
	// computed once per document).
	SourceStandalone = "standalone"
	// SourceShuffled: the chunks prefilled together in a random order (each after other
	// chunks, at another offset).
	SourceShuffled = "shuffled"
)

// Selections of RunBlend.
const (
	SelectHKVD   = "hkvd"
	SelectRandom = "random"
)

// BlendOptions shape a Blend evaluation.
type BlendOptions struct {
	// Model is the model.
	Model *model.Model
	// Windows are the texts (context+1 bytes): the first len−1−Suffix tokens, whole chunks,
	// are the reused documents, the last Suffix tokens the fresh query; the predictions of the
	// Suffix positions are scored against the next byte.
	Windows [][]byte
	Suffix  int
	// BlockSize and ChunkSize (tokens; ChunkSize a multiple of BlockSize).
	BlockSize, ChunkSize int
	// Sources are the source modes (SourceStandalone, SourceShuffled).
	Sources []string
	// Ratios are the recompute ratios of the selecting layer.
	Ratios []float64
	// CheckLayer is the compute_meta layer that selects.
	CheckLayer int
	// NoCorrection adds, per source mode, a run at each ratio without position correction.
	NoCorrection bool
	// Selections are how the check layer picks the reused tokens recomputed: SelectHKVD
	// (Blend's), SelectRandom (the same count, uniformly: the baseline HKVD must beat); none
	// means SelectHKVD.
	Selections []string
	// Seed seeds the shuffled order.
	Seed uint64
	// Progress, when set, is told of each finished result.
	Progress func(r BlendResult)
}

// BlendResult is one (source mode, ratio, correction) run over every window, or the full
// recompute reference (Ratio 1, Source "full").
type BlendResult struct {
	// Source is the source mode ("full" for the reference).
	Source string `json:"source"`
	// Ratio is compute_meta's ratio at CheckLayer; Corrected says whether reused K were
	// rotated to their new positions.
	Ratio     float64 `json:"ratio"`
	Corrected bool    `json:"position_correction"`
	// Selection is SelectHKVD or SelectRandom.
	Selection string `json:"selection"`
	// Positions is the predictions scored; HitFraction the share of prompt tokens reused.
	Positions   int     `json:"positions"`
	HitFraction float64 `json:"hit_fraction"`
	// Recomputed is the share of reused tokens selected for recompute (what goes on after
	// the check layer); LayerWork the share of the reused tokens' layers (attention and MLP)
	// computed: every layer before the check layer computes them all. (The check layer also
	// projects every token's Q/K/V to compare K, ≈ 14 % of a layer's matmuls here.)
	Recomputed float64 `json:"recomputed_fraction"`
	LayerWork  float64 `json:"layer_work_fraction"`
	// Top1, KL (nats, KL(full ‖ blend)), PPL, DensePPL, PPLChange: as Result's, over the
	// query's predictions.
	Top1      float64 `json:"top1_agreement"`
	KL        float64 `json:"kl_nats"`
	PPL       float64 `json:"ppl"`
	DensePPL  float64 `json:"dense_ppl"`
	PPLChange float64 `json:"ppl_change"`
	// KLRecovered is the share of reusing without recompute's KL that this run's recompute
	// removes, 1 − KL / KL(ratio 0), against the run of the same source and correction at
	// ratio 0 (Ratios must hold 0; else, and for the reference, 0): what a selection buys over
	// no recompute, comparable between HKVD and random at the same ratio.
	KLRecovered float64 `json:"kl_recovered"`
	// PrefillMillis is the mean wall time of the prompt's prefill (the reference: full).
	PrefillMillis float64 `json:"prefill_ms"`
}

// chunkStore is the evaluation's store of chunk blocks: per block id, per layer, K then V of
// BlockSize tokens (fp16), K rotated to the chunk's own offsets.
type chunkStore map[engine.BlockID][][]byte

func (s chunkStore) present(ids []engine.BlockID) []bool {
	out := make([]bool, len(ids))
	for i, id := range ids {
		_, out[i] = s[id]
	}
	return out
}

// RunBlend evaluates Blend: per window, the reused chunks are computed as the source mode says
// and stored (K normalised to each chunk's own offsets, under position-independent chunk ids);
// the window is then prefilled once with full recompute (the reference) and once per (mode,
// ratio) by chunk matching, loading the matched K/V rotated to their new positions and
// recomputing the HKVD-selected tokens (Blend through ForwardRecompute).
func RunBlend(ctx context.Context, o BlendOptions) ([]BlendResult, error) {
	cfg := o.Model.Config()
	switch {
	case o.BlockSize < 1 || o.ChunkSize < o.BlockSize || o.ChunkSize%o.BlockSize != 0:
		return nil, fmt.Errorf("%w: eval blend: chunks of %d tokens in blocks of %d", sparse.ErrInvalid, o.ChunkSize, o.BlockSize)
	case o.CheckLayer < 0 || o.CheckLayer >= cfg.Layers:
		return nil, fmt.Errorf("%w: eval blend: check layer %d of %d", sparse.ErrInvalid, o.CheckLayer, cfg.Layers)
	case len(o.Windows) == 0 || o.Suffix < 1:
		return nil, fmt.Errorf("%w: eval blend: %d windows, suffix %d", sparse.ErrInvalid, len(o.Windows), o.Suffix)
	}
	for i, w := range o.Windows {
		n := len(w) - 1 - o.Suffix
		if n < o.ChunkSize || n%o.ChunkSize != 0 || len(w)-1 > cfg.MaxCtx {
			return nil, fmt.Errorf("%w: eval blend: window %d of %d bytes: want whole chunks of %d before a suffix of %d, at most %d in all", sparse.ErrInvalid, i, len(w), o.ChunkSize, o.Suffix, cfg.MaxCtx+1)
		}
	}
	for _, r := range o.Ratios {
		if !(r >= 0 && r <= 1) {
			return nil, fmt.Errorf("%w: eval blend: ratio %v", sparse.ErrInvalid, r)
		}
	}
	// The reference: full recompute of every window.
	full := make([][]float32, len(o.Windows))
	ref := BlendResult{Source: "full", Ratio: 1, Corrected: true, Selection: "all", Recomputed: 1, LayerWork: 1, Top1: 1}
	var nll float64
	var fullTime time.Duration
	for wi, w := range o.Windows {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cache, seq, err := newSeq(cfg, len(w)-1, o.BlockSize)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		lg, err := o.Model.Forward(cache, seq, toInts(w[:len(w)-1]), span(0, len(w)-1))
		if err != nil {
			return nil, err
		}
		fullTime += time.Since(t0)
		full[wi] = lg[(len(w)-1-o.Suffix)*cfg.Vocab:]
		for i := range o.Suffix {
			nll -= logSoftmax(full[wi][i*cfg.Vocab : (i+1)*cfg.Vocab])[w[len(w)-o.Suffix+i]]
			ref.Positions++
		}
	}
	ref.PPL = math.Exp(nll / float64(ref.Positions))
	ref.DensePPL = ref.PPL
	ref.PrefillMillis = float64(fullTime.Microseconds()) / 1e3 / float64(len(o.Windows))
	out := []BlendResult{ref}
	if o.Progress != nil {
		o.Progress(ref)
	}
	for _, mode := range o.Sources {
		if mode != SourceStandalone && mode != SourceShuffled {
			return out, fmt.Errorf("%w: eval blend: source mode %q", sparse.ErrInvalid, mode)
		}
		corrections := []bool{true}
		if o.NoCorrection {
			corrections = append(corrections, false)
		}
		sels := o.Selections
		if len(sels) == 0 {
			sels = []string{SelectHKVD}
		}
		for _, sel := range sels {
			if sel != SelectHKVD && sel != SelectRandom {
				return out, fmt.Errorf("%w: eval blend: selection %q", sparse.ErrInvalid, sel)
			}
		}
		stored := make([]storedChunks, len(o.Windows))
		for wi, w := range o.Windows {
			var err error
			if stored[wi], err = storeWindow(o, w, wi, mode); err != nil {
				return out, fmt.Errorf("eval blend: window %d, %s: %w", wi, mode, err)
			}
		}
		for _, corr := range corrections {
			for _, sel := range sels {
				for _, ratio := range o.Ratios {
					r := BlendResult{Source: mode, Ratio: ratio, Corrected: corr, Selection: sel, DensePPL: ref.PPL}
					var nll, kl, hits, recomputed, work float64
					var top1, prompt int
					var t time.Duration
					for wi, w := range o.Windows {
						if err := ctx.Err(); err != nil {
							return out, err
						}
						s, err := blendWindow(o, w, wi, stored[wi], ratio, corr, sel)
						if err != nil {
							return out, fmt.Errorf("eval blend: window %d, %s, ratio %v: %w", wi, mode, ratio, err)
						}
						t += s.elapsed
						hits += float64(s.hits)
						prompt += len(w) - 1
						recomputed += float64(s.selected)
						work += s.work
						for i := range o.Suffix {
							lg := s.logits[i*cfg.Vocab : (i+1)*cfg.Vocab]
							d := full[wi][i*cfg.Vocab : (i+1)*cfg.Vocab]
							if model.Argmax(lg) == model.Argmax(d) {
								top1++
							}
							ls, ld := logSoftmax(lg), logSoftmax(d)
							nll -= ls[w[len(w)-o.Suffix+i]]
							for j := range ld {
								kl += math.Exp(ld[j]) * (ld[j] - ls[j])
							}
							r.Positions++
						}
					}
					n := float64(r.Positions)
					r.Top1, r.KL, r.PPL = float64(top1)/n, kl/n, math.Exp(nll/n)
					r.PPLChange = r.PPL/ref.PPL - 1
					r.HitFraction = hits / float64(prompt)
					if hits > 0 {
						r.Recomputed, r.LayerWork = recomputed/hits, work/hits
					}
					r.PrefillMillis = float64(t.Microseconds()) / 1e3 / float64(len(o.Windows))
					out = append(out, r)
					if o.Progress != nil {
						o.Progress(r)
					}
				}
			}
		}
	}
	klRecovered(out)
	return out, nil
}

// klRecovered sets every Blend run's KLRecovered against the ratio-0 run of its source and
// correction (the first such run: at ratio 0 no selection recomputes anything).
func klRecovered(res []BlendResult) {
	for i := range res {
		r := &res[i]
		if r.Source == "full" {
			continue
		}
		for _, b := range res {
			if b.Source == r.Source && b.Corrected == r.Corrected && b.Ratio == 0 {
				if b.KL > 0 {
					r.KLRecovered = 1 - r.KL/b.KL
				}
				break
			}
		}
	}
}

// blendStats is one window's Blend prefill.
type blendStats struct {
	logits   []float32 // the suffix's rows
	hits     int       // tokens reused
	selected int       // reused tokens going on after the check layer
	work     float64   // reused tokens computed through attention and MLP, Σ over layers / layers
	elapsed  time.Duration
}

// blendWindow stores w's chunks as mode says, then prefills w by Blend at ratio.
// storedChunks is a window's chunks as a source mode stored them: the index and the blocks.
type storedChunks struct {
	ix    *sparse.ChunkIndex
	store chunkStore
}

// storeWindow computes and stores w's reused chunks as mode says: each alone
// (SourceStandalone) or all of them in a shuffled order (SourceShuffled).
func storeWindow(o BlendOptions, w []byte, wi int, mode string) (storedChunks, error) {
	cfg := o.Model.Config()
	prompt := toInts(w[:len(w)-1])
	h, err := ucmhash.NewHasher(ucmhash.HashMeta{Model: "ucm-go-small", TPSize: 1, DType: "float16"}, engine.HashSchemeUCMGo, o.BlockSize)
	if err != nil {
		return storedChunks{}, err
	}
	sc := storedChunks{store: chunkStore{}}
	if sc.ix, err = sparse.NewChunkIndex(h, o.ChunkSize); err != nil {
		return sc, err
	}
	rope := sparse.RoPE{Dim: cfg.HeadDim, Theta: float64(cfg.RopeTheta), Pairing: sparse.PairNeoX}
	nch := (len(prompt) - o.Suffix) / o.ChunkSize
	var sources [][]int
	switch mode {
	case SourceStandalone:
		for c := range nch {
			sources = append(sources, []int{c})
		}
	case SourceShuffled:
		rng := rand.New(rand.NewPCG(o.Seed, uint64(wi)))
		sources = append(sources, rng.Perm(nch))
	}
	for _, order := range sources {
		var toks []int
		for _, c := range order {
			toks = append(toks, prompt[c*o.ChunkSize:(c+1)*o.ChunkSize]...)
		}
		if err := storeSource(o.Model, sc.ix, sc.store, rope, toks, o.BlockSize); err != nil {
			return sc, err
		}
	}
	return sc, nil
}

// blendWindow prefills w by Blend at ratio from the stored chunks sc.
func blendWindow(o BlendOptions, w []byte, wi int, sc storedChunks, ratio float64, corr bool, sel string) (blendStats, error) {
	cfg := o.Model.Config()
	var st blendStats
	prompt := toInts(w[:len(w)-1])
	docs := len(prompt) - o.Suffix
	bc := sparse.DefaultBlendConfig()
	bc.ChunkSize, bc.PositionCorrection, bc.RopeTheta = o.ChunkSize, corr, float64(cfg.RopeTheta)
	bc.ComputeMeta = map[int]float64{o.CheckLayer: ratio}
	b, err := sparse.NewBlend(*bc, sparse.Shape{Layers: cfg.Layers, QHeads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, BlockSize: o.BlockSize})
	if err != nil {
		return st, err
	}
	rope := b.RoPE()
	store := sc.store
	if err := b.UseIndex(sc.ix, store.present); err != nil {
		return st, err
	}
	// The Blend prefill: match, load the hits (K rotated to the new positions), recompute.
	t0 := time.Now()
	req := &sparse.Request{ID: fmt.Sprintf("window-%d", wi), PromptTokens: prompt}
	b.RequestBeginChunks(req.ID, prompt, docs)
	defer b.RequestFinished(req.ID)
	_, hit, src := b.Plan(req.ID)
	cache, seq, err := newSeq(cfg, len(prompt), o.BlockSize)
	if err != nil {
		return st, err
	}
	tb := cfg.KVDim() * 2
	kf := make([]float32, cfg.KVDim())
	for t, ok := range hit {
		if !ok {
			continue
		}
		st.hits++
		blk := store[src[t].Block]
		slot := seq.Blocks[t/o.BlockSize]*o.BlockSize + t%o.BlockSize
		for l := range cfg.Layers {
			layer := cache.Layer(l)
			so := src[t].Offset * tb
			kb, vb := blk[l][so:so+tb], blk[l][o.BlockSize*tb+so:o.BlockSize*tb+so+tb]
			if corr {
				if err := kernels.DecodeFloat32(kf, kb, kernels.Float16); err != nil {
					return st, err
				}
				if err := rope.Rotate(kf, t-src[t].RefPos); err != nil {
					return st, err
				}
				if err := kernels.EncodeFloat32(layer[cache.Offset(0, slot):cache.Offset(0, slot)+tb], kf, kernels.Float16); err != nil {
					return st, err
				}
			} else {
				copy(layer[cache.Offset(0, slot):], kb)
			}
			copy(layer[cache.Offset(1, slot):cache.Offset(1, slot)+tb], vb)
		}
	}
	seq.Len = len(prompt)
	pick := b.Pick(req)
	if sel == SelectRandom {
		rng := rand.New(rand.NewPCG(o.Seed, 1000+uint64(wi)))
		pick = func(layer int, rows []int, _, _ []float32) ([]int, error) {
			if layer != o.CheckLayer {
				return rows, nil
			}
			var cand []int
			for _, r := range rows {
				if hit[r] {
					cand = append(cand, r)
				}
			}
			k := int(float64(len(cand)) * ratio)
			chosen := map[int]bool{}
			for _, i := range rng.Perm(len(cand))[:k] {
				chosen[cand[i]] = true
			}
			var keep []int
			for _, r := range rows {
				if !hit[r] || chosen[r] {
					keep = append(keep, r)
				}
			}
			return keep, nil
		}
	}
	var layerRows []int // hit rows computed per layer
	logits, rows, err := o.Model.ForwardRecompute(cache, seq, prompt, span(0, len(prompt)), func(layer int, rows []int, fresh, cached []float32) ([]int, error) {
		keep, err := pick(layer, rows, fresh, cached)
		n := 0
		for _, r := range keep {
			if hit[r] {
				n++
			}
		}
		layerRows = append(layerRows, n)
		return keep, err
	})
	st.elapsed = time.Since(t0)
	if err != nil {
		return st, err
	}
	if len(rows) < o.Suffix || rows[len(rows)-o.Suffix] != docs {
		return st, fmt.Errorf("%w: the query's %d tokens were not all computed (rows %d…)", sparse.ErrInvalid, o.Suffix, rows[0])
	}
	st.logits = logits[(len(rows)-o.Suffix)*cfg.Vocab:]
	if len(layerRows) > 0 {
		st.selected = layerRows[len(layerRows)-1]
		for _, n := range layerRows {
			st.work += float64(n)
		}
		st.work /= float64(len(layerRows))
	}
	return st, nil
}

// storeSource prefills toks alone (from position 0), indexes them and stores each chunk's
// blocks, K rotated back to the chunk's own offsets.
func storeSource(m *model.Model, ix *sparse.ChunkIndex, store chunkStore, rope sparse.RoPE, toks []int, bs int) error {
	cfg := m.Config()
	cache, seq, err := newSeq(cfg, len(toks), bs)
	if err != nil {
		return err
	}
	if _, err := m.Forward(cache, seq, toks, span(0, len(toks))); err != nil {
		return err
	}
	_, ids, err := ix.Add(toks)
	if err != nil {
		return err
	}
	tb := cfg.KVDim() * 2
	chunk := ix.ChunkSize()
	kf := make([]float32, cfg.KVDim())
	for c, cids := range ids {
		for bi, id := range cids {
			if _, ok := store[id]; ok {
				continue // first writer wins, as in the engine
			}
			blk := make([][]byte, cfg.Layers)
			for l := range blk {
				blk[l] = make([]byte, 2*bs*tb)
				layer := cache.Layer(l)
				for i := range bs {
					p := c*chunk + bi*bs + i
					slot := seq.Blocks[p/bs]*bs + p%bs
					if err := kernels.DecodeFloat32(kf, layer[cache.Offset(0, slot):cache.Offset(0, slot)+tb], kernels.Float16); err != nil {
						return err
					}
					if err := rope.Rotate(kf, -(c * chunk)); err != nil { // to the chunk's own offsets
						return err
					}
					if err := kernels.EncodeFloat32(blk[l][i*tb:(i+1)*tb], kf, kernels.Float16); err != nil {
						return err
					}
					copy(blk[l][bs*tb+i*tb:bs*tb+(i+1)*tb], layer[cache.Offset(1, slot):cache.Offset(1, slot)+tb])
				}
			}
			store[id] = blk
		}
	}
	return nil
}

func newSeq(cfg model.Config, n, bs int) (*model.KVCache, *model.Sequence, error) {
	cache, err := model.NewKVCache(cfg, (n+bs-1)/bs, bs)
	if err != nil {
		return nil, nil, err
	}
	seq := &model.Sequence{}
	return cache, seq, seq.Reserve(cache, n)
}

func toInts(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

func span(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}
