package sparse

import (
	"context"
	"errors"
	"math"
	"slices"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/reuse"
)

// How a block-scoring method (GSA, ESA) loads the blocks it attends when the host gives it a
// BlockLoader (Env.Blocks): after choosing a decode step's blocks it acquires their shards from
// its Prefetcher (resident ones at once, the rest waited for or loaded), drops from the step the
// blocks that fail to load (Attention.LoadFailed), and submits the blocks its scores predict for
// the next steps:
//
//   - with retrieval_lag 1 (ESA) the selection just computed is the one the next step attends:
//     it is the prediction, exact;
//   - otherwise (GSA 000's "step N's top-K predicts N+1 and N+2") the step's selection is
//     predicted, and the candidates ranked next, (prefetch_ahead − 1) × k of them, are
//     prefetched speculatively: a selection drifts by a few blocks a step, and the runners-up
//     are where it drifts to.
//
// Predicted shards are protected from eviction for prefetch_ahead decode steps; speculative
// ones are not, and are evicted first until an attention call uses them.

// PrefetchConfig is the prefetch engine's keys (GSA 002, sources §3B; eviction from GSA 000).
type PrefetchConfig struct {
	// Workers is prefetch_workers (4): loads run at once.
	Workers int
	// MaxPending is max_pending_prefetch (64): tasks queued at most.
	MaxPending int
	// Ahead is prefetch_ahead (2): steps a prediction covers; the prediction holds the top
	// Ahead × k blocks of the step's ranking, protected from eviction for Ahead steps. 0
	// predicts nothing: the attended blocks are loaded on demand (and cached).
	Ahead int
	// CacheSize is prefetch_cache_size (1000): block shards (one layer of one block) resident.
	CacheSize int
	// Eviction is eviction_policy (UCM-Go key; lru, score or hybrid; default lru).
	Eviction string
}

func defaultPrefetch() PrefetchConfig {
	return PrefetchConfig{Workers: 4, MaxPending: 64, Ahead: 2, CacheSize: 1000, Eviction: "lru"}
}

func (c *PrefetchConfig) prefetchFields() []field {
	return []field{
		intField(&c.Workers, "prefetch_workers"),
		intField(&c.MaxPending, "max_pending_prefetch"),
		intField(&c.Ahead, "prefetch_ahead"),
		intField(&c.CacheSize, "prefetch_cache_size"),
		stringField(&c.Eviction, "eviction_policy"),
	}
}

func (c *PrefetchConfig) validatePrefetch(prefix string) error {
	switch {
	case c.Workers < 1 || c.Workers > MaxPrefetchWorkers:
		return configErr(prefix+".prefetch_workers", "%d: want a count in [1, %d]", c.Workers, MaxPrefetchWorkers)
	case c.MaxPending < 1 || c.MaxPending > MaxPrefetchPending:
		return configErr(prefix+".max_pending_prefetch", "%d: want a count in [1, %d]", c.MaxPending, MaxPrefetchPending)
	case c.Ahead < 0 || c.Ahead > 64:
		return configErr(prefix+".prefetch_ahead", "%d: want a step count in [0, 64]", c.Ahead)
	case c.CacheSize < 1 || c.CacheSize > MaxPrefetchCache:
		return configErr(prefix+".prefetch_cache_size", "%d: want a block count in [1, %d]", c.CacheSize, MaxPrefetchCache)
	}
	if _, err := ParseEvictionPolicy(c.Eviction); err != nil {
		return configErr(prefix+".eviction_policy", "%q: want lru, score or hybrid", c.Eviction)
	}
	return nil
}

// options are the Prefetcher's options for this configuration.
func (c *PrefetchConfig) options(loader BlockLoader, shardBytes int) (PrefetchOptions, error) {
	pol, err := ParseEvictionPolicy(c.Eviction)
	return PrefetchOptions{Loader: loader, ShardBytes: shardBytes, Workers: c.Workers, MaxPending: c.MaxPending,
		CacheBlocks: c.CacheSize, Eviction: pol}, err
}

// methodPrefetch is a method's prefetch engine and its per-request batch positions.
type methodPrefetch struct {
	p     *Prefetcher
	ahead int
	// pos is each request's position in the last step's batch (ExecuteBegin), for priorities.
	pos map[string]int
}

// prefetchPlan is what a selection tells the prefetch engine: the logical blocks predicted for
// the next steps and every block's normalised score.
type prefetchPlan struct {
	next  []int     // predicted: protected for prefetch_ahead steps
	extra []int     // the ranking's runners-up: speculative
	score []float64 // by logical block, in [0, 1]; nil: 1 for all
}

func (pl *prefetchPlan) scoreOf(b int) float64 {
	if b < len(pl.score) {
		return pl.score[b]
	}
	return 1
}

// setupPrefetch gives m a prefetch engine when the host loads blocks through it.
func (m *blockMethod) setupPrefetch(c *PrefetchConfig, env Env) error {
	if env.Blocks == nil {
		return nil
	}
	opts, err := c.options(env.Blocks, env.ShardBytes)
	if err != nil {
		return err
	}
	p, err := NewPrefetcher(opts)
	if err != nil {
		return err
	}
	m.pf = &methodPrefetch{p: p, ahead: c.Ahead, pos: map[string]int{}}
	return nil
}

// Prefetcher is the method's prefetch engine, nil when the host loads no blocks through it.
func (m *blockMethod) Prefetcher() *Prefetcher {
	if m.pf == nil {
		return nil
	}
	return m.pf.p
}

// Close stops the prefetch engine.
func (m *blockMethod) Close() error {
	if m.pf == nil {
		return nil
	}
	return m.pf.p.Close()
}

// ExecuteBegin records the requests' batch positions (their prefetch priorities).
func (m *blockMethod) ExecuteBegin(out *SchedulerOutput) error {
	if m.pf == nil || out == nil {
		return nil
	}
	m.mu.Lock()
	clear(m.pf.pos)
	for i, r := range out.Requests {
		if r != nil {
			m.pf.pos[r.ID] = i
		}
	}
	m.mu.Unlock()
	return nil
}

// attendLoaded acquires the shards of the attended blocks sel (ascending logical blocks) of a
// decode call, leaves out those that fail, rewrites the call, and submits the plan's
// prediction. The shards are released by AttentionFinished (Restore).
func (m *blockMethod) attendLoaded(a *Attention, sel []int, plan *prefetchPlan) error {
	p := m.pf.p
	p.AdvanceTo(int64(a.Step))
	bids := a.Request.BlockIDs
	var ids []engine.BlockID
	var scores []float64
	var at []int // position in sel of each id
	for j, b := range sel {
		if b < len(bids) {
			ids = append(ids, bids[b])
			scores = append(scores, plan.scoreOf(b))
			at = append(at, j)
		}
	}
	a.LoadFailed, a.LoadErr = nil, nil
	lease := p.Acquire(context.Background(), a.Layer, ids, scores)
	kv := make([][]byte, len(sel))
	failed := make([]bool, len(sel))
	var errs []error
	for i, j := range at {
		if err := lease.Errs[i]; err != nil {
			failed[j] = true
			a.LoadFailed = append(a.LoadFailed, sel[j])
			errs = append(errs, err)
			continue
		}
		kv[j] = lease.Bufs[i]
	}
	if len(errs) > 0 {
		a.LoadErr = errors.Join(errs...)
		keep, keepKV := make([]int, 0, len(sel)), make([][]byte, 0, len(sel))
		for j, b := range sel {
			if !failed[j] {
				keep, keepKV = append(keep, b), append(keepKV, kv[j])
			}
		}
		sel, kv = keep, keepKV
	}
	if err := a.Rewrite(sel, m.shape.BlockSize); err != nil {
		lease.Release()
		return err
	}
	a.KV, a.release = kv, lease.Release
	if m.pf.ahead > 0 {
		m.submitPlan(a, plan)
	}
	return nil
}

// submitPlan queues the predicted blocks of a call (best effort: a full queue or a closed
// engine only costs the next step a demand load).
func (m *blockMethod) submitPlan(a *Attention, plan *prefetchPlan) {
	m.mu.Lock()
	prio := PriorityForPosition(m.pf.pos[a.Request.ID])
	m.mu.Unlock()
	if ids, scores := plan.stored(a.Request.BlockIDs, plan.next); len(ids) > 0 {
		_ = m.pf.p.Submit(a.Request.ID, a.Layer, ids, scores, prio, int64(a.Step+m.pf.ahead))
	}
	if ids, scores := plan.stored(a.Request.BlockIDs, plan.extra); len(ids) > 0 {
		_ = m.pf.p.SubmitSpeculative(a.Request.ID, a.Layer, ids, scores, prio)
	}
}

// stored returns the ids and scores of the blocks with a stored id.
func (pl *prefetchPlan) stored(bids []engine.BlockID, blocks []int) ([]engine.BlockID, []float64) {
	var ids []engine.BlockID
	var scores []float64
	for _, b := range blocks {
		if b < len(bids) {
			ids = append(ids, bids[b])
			scores = append(scores, pl.scoreOf(b))
		}
	}
	return ids, scores
}

// planFrom fills plan from a step's scores (candidates init … n−local) and its selection sel:
// the selection and the next best candidates, (ahead − 1) × k of them; scores min-max
// normalised over the scored candidates (windows and unscored blocks 1).
func (m *blockMethod) planFrom(plan *prefetchPlan, st *stepState, scores []float64, sel []int, n, init, local, k int) {
	plan.score = reuse.Grow(plan.score, n)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := init; i < n-local; i++ {
		if s := scores[i]; !math.IsInf(s, 0) && !math.IsNaN(s) {
			lo, hi = min(lo, s), max(hi, s)
		}
	}
	for i := range n {
		s := 1.0
		if i >= init && i < n-local {
			switch v := scores[i]; {
			case math.IsNaN(v) || math.IsInf(v, -1):
				s = 0
			case math.IsInf(v, 1) || hi <= lo:
				s = 1
			default:
				s = (v - lo) / (hi - lo)
			}
		}
		plan.score[i] = s
	}
	plan.next, plan.extra = append(plan.next[:0], sel...), plan.extra[:0]
	extra := (m.pf.ahead - 1) * k
	if m.lag || extra <= 0 || n-local-init <= len(sel)-init-local {
		return
	}
	st.idx = st.idx[:0]
	for i := init; i < n-local; i++ {
		if _, in := slices.BinarySearch(sel, i); !in {
			st.idx = append(st.idx, i)
		}
	}
	plan.extra = append(plan.extra[:0], topK(st.idx, scores, min(extra, len(st.idx)))...)
	slices.Sort(plan.extra)
}

// withoutBlocks returns each head's selection without the blocks drop (those that failed to
// load), reusing heads when there are none.
func withoutBlocks(heads [][]int, drop []int) [][]int {
	if len(drop) == 0 || heads == nil {
		return heads
	}
	out := make([][]int, len(heads))
	for i, hs := range heads {
		out[i] = slices.DeleteFunc(slices.Clone(hs), func(b int) bool { return slices.Contains(drop, b) })
	}
	return out
}
