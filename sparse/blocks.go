package sparse

import (
	"fmt"
	"math"
	mathbits "math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/reuse"
	"github.com/ucm-go/ucm/kernels"
	"gopkg.in/yaml.v3"
)

// The block-scoring methods: Quest, ESA, GSA, KVStar MultiStep and GSA On-Device share one
// decode path (blockMethod.AttentionBegin): split the context into windows and candidates,
// load one layer's sidecar part of every candidate, score each part, take the top-K, rewrite
// the block table. They differ in the sidecar kind and the scoring function. Selection never
// reads a block's K/V.

// SelectStats counts what a method's selections did.
type SelectStats struct {
	// Selections is the decode attention calls restricted to selected blocks; Dense those
	// attended densely because the windows and budget covered the context (or a rollback layer).
	Selections, Dense int64
	// Candidates is the blocks scored; Missing those without a usable sidecar (absent, corrupt
	// or of another spec): they score +Inf and are kept first within the budget ([DECISION]).
	Candidates, Missing int64
	// Held is the selections reused within a retrieval stride instead of recomputed.
	Held int64
	// Reused is the decode calls of skip-hash layers that took an earlier layer's selection.
	Reused int64
	// Uncached is the candidates scored without a representation-pool entry (the pool full, or
	// no pool): loaded and verified at every step.
	Uncached int64
}

// stepState is one selection's query state and scratch.
type stepState struct {
	q     []float32 // the token's queries, [QHeads][HeadDim]
	qr    []float32 // GQA-reduced queries, [KVHeads][HeadDim]
	codes []byte    // query hash codes, [KVHeads][code bytes] (MLA: [QHeads/r][code bytes])
	// mla is the MLA query codes as lookup tables (GSA On-Device on MLA).
	mla    kernels.HammingTable
	vals   []float32 // a part's values
	ch     []uint16  // a part's channels
	scores []float64
	idx    []int
	keys   []uint64 // selectTopK's scratch
	sel    []int
	ids    []engine.BlockID
	pos    []int
	parts  []byte
	// perHead, when set, receives a candidate's per-query-head logits, score/√D (head_score:
	// softmax); heads holds them for every candidate, [candidates][QHeads].
	perHead []float32
	heads   []float32
	// Per candidate: pool entry (-1 none), row to fill, usable, row, rows of data, int8 scale.
	ent     []int32
	need    []bool
	ok      []bool
	rowRefs [][]byte
	aux     []int32
	scale   []float32
	loadIdx []int  // candidates loaded this step
	scratch []byte // their rows
	tmp     []float32
	qg      []float32 // KVStar: a head's query at the block's channels
	// head_select kv: per KV head scores of every block, [KVHeads][n]; perKV receives a
	// candidate's (scoreRow), kvTmp its storage.
	kvScores []float64
	perKV    []float64
	kvTmp    []float64
	// head_score softmax: the heads' maximum logits and their sums of exponentials.
	mx, z []float32
}

// softmaxScores turns the candidates' per-head logits (st.heads, [candidates][QHeads], rows of
// unscored candidates −∞) into each block's estimated share of attention: per query head, a
// softmax over the scored candidates of its logits (whose maxima scoreCandidates kept in
// st.mx), then the sum over heads (head_score: softmax, a UCM-Go option). The exponentials and
// their per-head sums are one kernels.ExpColumns pass over st.heads (float32, SIMD); a NaN
// logit counts as no attention. Unscored (+∞) candidates stay +∞.
func (m *blockMethod) softmaxScores(st *stepState) {
	hq, n, g := m.shape.QHeads, len(st.scores), m.shape.QHeads/m.shape.KVHeads
	mx, z := st.mx[:hq], st.z[:hq]
	for h := range mx {
		if math.IsInf(float64(mx[h]), -1) { // no finite logit: every value is −∞ or NaN
			mx[h] = 0
		}
		z[h] = 0
	}
	heads := st.heads[:len(st.pos)*hq]
	_ = kernels.ExpColumns(heads, mx, z) // whole rows of hq columns by construction
	for h := range z {
		if z[h] > 0 {
			z[h] = 1 / z[h]
		}
	}
	for j, i := range st.pos {
		if math.IsInf(st.scores[i], 1) {
			continue
		}
		var sum float32
		for h, e := range heads[j*hq : (j+1)*hq] {
			sum += e * z[h]
		}
		st.scores[i] = float64(sum)
	}
	if !m.perKV {
		return
	}
	// head_select kv: each KV head's score is the sum of its query heads' shares. The
	// candidates go in tiles, so that a tile's rows of st.heads stay in the first-level cache
	// while every KV head's row of st.kvScores is written in order.
	scored := st.idx[:0] // the candidates' indexes j into st.pos that were scored
	for j, i := range st.pos {
		if !math.IsInf(st.scores[i], 1) {
			scored = append(scored, j)
		}
	}
	st.idx = scored
	const tile = 64
	for t0 := 0; t0 < len(scored); t0 += tile {
		js := scored[t0:min(t0+tile, len(scored))]
		for kv := range m.shape.KVHeads {
			row, zg := st.kvScores[kv*n:(kv+1)*n], z[kv*g:(kv+1)*g]
			if g == 1 {
				zk := zg[0]
				for _, j := range js {
					row[st.pos[j]] = float64(heads[j*hq+kv] * zk)
				}
				continue
			}
			for _, j := range js {
				var s float64
				for h, e := range heads[j*hq+kv*g : j*hq+(kv+1)*g] {
					s += float64(e * zg[h])
				}
				row[st.pos[j]] = s
			}
		}
	}
}

// blockMethod is the shared implementation; see the constructors in methods.go.
type blockMethod struct {
	Base
	name  string
	shape Shape
	src   SidecarSource
	spec  kernels.SidecarSpec
	encs  []*kernels.HashEncoder // GSA On-Device
	// mlaReduce > 0: GSA On-Device on MLA, the query heads reduced by this reduction_head_num,
	// hashed one by one and compared with the single latent head (hashPrepare).
	mlaReduce int
	fp        uint32
	keep      func(n, seqLen int) (init, local, k int)
	stride    int
	rollback  map[int]bool
	// skipHash layers reuse the selection of the nearest earlier layer of the same decode step
	// (GSA On-Device's skip_hash_layers); lastSel is that selection, by request ID.
	skipHash map[int]bool
	lastSel  map[string]*stepSel
	// lag: a step attends the selection retrieved at the previous step (retrieval_lag 1).
	lag bool
	// workers, with lag, bounds the retrievals running in the background (ESA's asynchronous
	// retrieval engine, retrieval_workers); nil: each step retrieves synchronously.
	workers chan struct{}
	// softmaxHeads: score blocks by Σ over query heads of their softmax share (head_score).
	softmaxHeads bool
	prepare      func(st *stepState) error
	// gsa: score by distance (GSA) rather than dot product (ESA) on the same rows; meanDist:
	// GSA On-Device's block distance is the mean over tokens rather than the minimum.
	gsa, meanDist bool
	rowKind       rowKind
	rowBytes      int
	pool          *reprPool // nil: no pool (Env.ReprPoolBytes < 0)
	// pf loads the attended blocks and prefetches predicted ones (Env.Blocks; prefetch_method.go).
	pf *methodPrefetch
	// accessScore: GSA 002's query-free score from access counts (block_score: access_count);
	// access holds the counts by request and layer.
	accessScore bool
	access      map[string][]int32
	// perKV: each KV head selects its own blocks (head_select kv).
	perKV bool

	states sync.Pool // *stepState
	mu     sync.Mutex
	held   map[string]*heldSel // by request ID and layer
	stats  struct{ selections, dense, candidates, missing, held, reused, uncached atomic.Int64 }
}

// stepSel is the latest selection of a request's decode step: its step, context blocks and
// blocks (with head_select kv, per KV head too).
type stepSel struct {
	step, n int
	sel     []int
	heads   [][]int
}

// heldSel is a selection kept for a retrieval stride, and the queries gathered meanwhile.
type heldSel struct {
	group    int
	pending  *retrieval // the retrieval submitted at step group (asynchronous lag)
	middle   []int      // selected candidates
	middleKV [][]int    // per KV head (head_select kv)
	qsum     []float64
	qn       int
}

func (m *blockMethod) Name() string { return m.name }

// Stats returns the method's counters.
func (m *blockMethod) Stats() SelectStats {
	return SelectStats{Selections: m.stats.selections.Load(), Dense: m.stats.dense.Load(), Candidates: m.stats.candidates.Load(),
		Missing: m.stats.missing.Load(), Held: m.stats.held.Load(), Reused: m.stats.reused.Load(), Uncached: m.stats.uncached.Load()}
}

// SidecarSpec is the representation the method reads; parts of another spec are misses.
func (m *blockMethod) SidecarSpec() kernels.SidecarSpec { return m.spec }

// RequestFinished forgets the request's held selections, access counts and prefetch tasks,
// waits for its background retrievals and drops its references on the representation pool's
// entries.
func (m *blockMethod) RequestFinished(reqID string) {
	m.mu.Lock()
	var pending []*retrieval
	for k, h := range m.held {
		if len(k) > len(reqID) && k[:len(reqID)] == reqID && k[len(reqID)] == 0 {
			if h.pending != nil {
				pending = append(pending, h.pending)
			}
			delete(m.held, k)
		}
	}
	m.mu.Unlock()
	for _, t := range pending { // their pool references are the request's too
		<-t.done
	}
	if m.pool != nil {
		m.pool.finish(reqID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.lastSel, reqID)
	for k := range m.access {
		if len(k) > len(reqID) && k[:len(reqID)] == reqID && k[len(reqID)] == 0 {
			delete(m.access, k)
		}
	}
	if m.pf != nil {
		delete(m.pf.pos, reqID)
		m.pf.p.Forget(reqID)
	}
}

// AttentionBegin restricts a decode step's attention to the selected blocks (prefill and
// rollback layers stay dense).
func (m *blockMethod) AttentionBegin(a *Attention) error {
	if a.Phase != PhaseDecode || m.rollback[a.Layer] {
		if a.Phase == PhaseDecode {
			m.stats.dense.Add(1)
		}
		return nil
	}
	bs := m.shape.BlockSize
	if a.Request == nil || a.SeqLen < 1 || a.Layer < 0 || a.Layer >= m.shape.Layers {
		return fmt.Errorf("%w: %s: attention call without request, seq_len %d, layer %d", ErrInvalid, m.name, a.SeqLen, a.Layer)
	}
	qd := m.shape.QHeads * m.shape.HeadDim
	if len(a.Q) < qd || len(a.Q)%qd != 0 {
		return fmt.Errorf("%w: %s: %d query values, want a multiple of %d", ErrInvalid, m.name, len(a.Q), qd)
	}
	n := (a.SeqLen + bs - 1) / bs
	init, local, k := m.keep(n, a.SeqLen)
	var plan *prefetchPlan
	if m.pf != nil {
		plan = &prefetchPlan{}
	}
	if init+local+k >= n {
		m.stats.dense.Add(1)
		if m.pf == nil {
			return nil
		}
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		plan.next = all
		return m.attendLoaded(a, all, plan)
	}
	sel, heads, reused := m.reuseSelection(a, n)
	if !reused {
		var err error
		if sel, heads, err = m.selectBlocks(a, a.Q[len(a.Q)-qd:], n, init, local, k, plan); err != nil {
			return err
		}
		m.recordSelection(a, n, sel, heads)
	} else if plan != nil {
		plan.next = sel
	}
	m.stats.selections.Add(1)
	if m.accessScore {
		m.countAccess(a, sel, n)
	}
	if m.pf != nil {
		if err := m.attendLoaded(a, sel, plan); err != nil {
			return err
		}
		a.HeadSelected = withoutBlocks(heads, a.LoadFailed)
		return nil
	}
	if err := a.Rewrite(sel, bs); err != nil {
		return err
	}
	a.HeadSelected = heads
	return nil
}

// reuseSelection is, for a skip-hash layer, the selection an earlier layer of the same decode
// step of the request computed over the same n blocks; false when there is none (or the layer
// selects for itself).
func (m *blockMethod) reuseSelection(a *Attention, n int) ([]int, [][]int, bool) {
	if !m.skipHash[a.Layer] {
		return nil, nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	last := m.lastSel[a.Request.ID]
	if last == nil || last.step != a.Step || last.n != n {
		return nil, nil, false
	}
	m.stats.reused.Add(1)
	var heads [][]int // nil unless the layer selected per KV head
	for _, h := range last.heads {
		heads = append(heads, slices.Clone(h))
	}
	return slices.Clone(last.sel), heads, true
}

// recordSelection keeps a computed selection for the skip-hash layers after this one.
func (m *blockMethod) recordSelection(a *Attention, n int, sel []int, heads [][]int) {
	if m.lastSel == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastSel[a.Request.ID] = &stepSel{step: a.Step, n: n, sel: slices.Clone(sel), heads: heads}
}

func (m *blockMethod) state() *stepState {
	if st, ok := m.states.Get().(*stepState); ok {
		return st
	}
	return &stepState{}
}

// selectBlocks chooses the blocks of one decode step of one layer (with head_select kv, per KV
// head too); plan, when not nil, receives the prediction for the next steps.
func (m *blockMethod) selectBlocks(a *Attention, q []float32, n, init, local, k int, plan *prefetchPlan) ([]int, [][]int, error) {
	st := m.state()
	defer m.states.Put(st)
	var h *heldSel
	if m.stride > 1 || m.lag {
		m.mu.Lock()
		if m.held == nil {
			m.held = map[string]*heldSel{}
		}
		key := fmt.Sprintf("%s\x00%d", a.Request.ID, a.Layer)
		h = m.held[key]
		if h == nil {
			h = &heldSel{group: -1}
			m.held[key] = h
		}
		m.mu.Unlock()
	}
	if m.stride > 1 {
		group := a.Step / m.stride
		if h.group == group {
			h.addQuery(q)
			m.stats.held.Add(1)
			if m.perKV {
				sel, heads := heldHeads(h.middleKV, n, init, local)
				if plan != nil {
					plan.next = sel
				}
				return sel, heads, nil
			}
			sel := heldSelection(h.middle, n, init, local)
			if plan != nil {
				plan.next = sel
			}
			return sel, nil, nil
		}
		// A new stride window: retrieve with the previous window's queries (their mean; the
		// current query when there were none), then start gathering this window's.
		if h.qn > 0 {
			st.q = reuse.Grow(st.q, len(q))
			for i, s := range h.qsum {
				st.q[i] = float32(s / float64(h.qn))
			}
			q = append([]float32(nil), st.q...)
		}
		h.group, h.qn = group, 0
		clear(h.qsum)
	}
	if m.workers != nil {
		if sel, ok, err := m.laggedAsync(h, a, q, n, init, local, k); ok || err != nil {
			return sel, nil, err
		}
	}
	if err := m.scoreAll(st, a, q, n, init, local); err != nil {
		return nil, nil, err
	}
	if m.perKV {
		heads := make([][]int, m.shape.KVHeads)
		for kv := range heads {
			st.sel = selectTopK(st.sel, &st.keys, st.kvScores[kv*n:(kv+1)*n], init, local, k)
			heads[kv] = slices.Clone(st.sel)
		}
		if h != nil {
			h.middleKV = h.middleKV[:0]
			for _, hs := range heads {
				h.middleKV = append(h.middleKV, slices.Clone(hs[init:len(hs)-local]))
			}
			h.addQuery(a.Q[len(a.Q)-len(q):])
		}
		sel := unionSorted(heads)
		if plan != nil {
			plan.next = sel
		}
		return sel, heads, nil
	}
	st.sel = selectTopK(st.sel, &st.keys, st.scores[:n], init, local, k)
	sel := append([]int(nil), st.sel...)
	if plan != nil {
		m.planFrom(plan, st, st.scores[:n], sel, n, init, local, k)
	}
	if m.lag {
		// This step attends the previous step's selection (ESA's asynchronous retrieval: the
		// retrieval of step N overlaps step N's attention and serves step N+1); the first step
		// has none and attends its own.
		prev, had := h.middle, h.group >= 0
		h.middle, h.group = append([]int(nil), sel[init:len(sel)-local]...), a.Step
		if had {
			m.stats.held.Add(1)
			return heldSelection(prev, n, init, local), nil, nil
		}
		return sel, nil, nil
	}
	if h != nil {
		h.middle = append(h.middle[:0], sel[init:len(sel)-local]...)
		h.addQuery(a.Q[len(a.Q)-len(q):])
	}
	return sel, nil, nil
}

// retrieval is one background retrieval of ESA's asynchronous engine: the selected candidates
// of a step, or its error, once done is closed.
type retrieval struct {
	done   chan struct{}
	middle []int
	err    error
}

// laggedAsync is retrieval_lag 1 with the asynchronous engine: the step attends the selection
// of the retrieval the previous step submitted (waiting for it if it is still running) and
// submits its own query's retrieval, which runs in the background on one of the workers while
// the step attends, and serves the next step. The first step of a request and layer has none
// to attend: false, and the caller retrieves synchronously (as the synchronous lag does). Its
// results equal the synchronous lag's.
func (m *blockMethod) laggedAsync(h *heldSel, a *Attention, q []float32, n, init, local, k int) ([]int, bool, error) {
	if h.group < 0 {
		return nil, false, nil
	}
	if t := h.pending; t != nil {
		<-t.done
		h.pending = nil
		if t.err != nil {
			step := h.group
			h.group = -1 // start over: the next step retrieves synchronously
			return nil, false, fmt.Errorf("%s: layer %d: background retrieval of step %d: %w", m.name, a.Layer, step, t.err)
		}
		h.middle = t.middle
	}
	prev := h.middle
	t := &retrieval{done: make(chan struct{})}
	h.pending, h.group = t, a.Step
	// The worker gets its own copies: the caller may reuse the query and grow the block list.
	req := *a.Request
	req.BlockIDs = slices.Clone(req.BlockIDs)
	call := &Attention{Layer: a.Layer, LayerName: a.LayerName, Phase: a.Phase, Step: a.Step, Request: &req, SeqLen: a.SeqLen}
	go m.retrieve(t, call, slices.Clone(q), n, init, local, k)
	m.stats.held.Add(1)
	return heldSelection(prev, n, init, local), true, nil
}

// retrieve runs one background retrieval on a worker: score, take the top-K, and queue the
// selected blocks for prefetch at once (they serve the next step).
func (m *blockMethod) retrieve(t *retrieval, a *Attention, q []float32, n, init, local, k int) {
	defer close(t.done)
	m.workers <- struct{}{}
	defer func() { <-m.workers }()
	st := m.state()
	defer m.states.Put(st)
	if t.err = m.scoreAll(st, a, q, n, init, local); t.err != nil {
		return
	}
	st.sel = selectTopK(st.sel, &st.keys, st.scores[:n], init, local, k)
	t.middle = slices.Clone(st.sel[init : len(st.sel)-local])
	if m.pf != nil && m.pf.ahead > 0 {
		plan := &prefetchPlan{}
		m.planFrom(plan, st, st.scores[:n], st.sel, n, init, local, k)
		m.submitPlan(a, plan)
	}
}

// scoreAll scores the candidates init … n−local of a decode step for query q into st.scores
// (and, with head_select kv, st.kvScores).
func (m *blockMethod) scoreAll(st *stepState, a *Attention, q []float32, n, init, local int) error {
	st.q = append(st.q[:0], q...)
	if err := m.prepare(st); err != nil {
		return err
	}
	st.scores = reuse.Grow(st.scores, n)
	// Candidates with a stored id are scored from their rows; the rest (not stored yet) are
	// misses. The access-count score (GSA 002) reads no representation.
	st.pos = st.pos[:0]
	for i := init; i < n-local && !m.accessScore; i++ {
		if i < len(a.Request.BlockIDs) {
			st.pos = append(st.pos, i)
		} else {
			st.scores[i] = math.Inf(1)
			m.stats.missing.Add(1)
		}
	}
	m.stats.candidates.Add(int64(n - local - init))
	if m.perKV {
		st.kvScores = resize(st.kvScores, m.shape.KVHeads*n)
		for i := range st.kvScores {
			st.kvScores[i] = math.Inf(1)
		}
	}
	if m.accessScore {
		m.accessScores(a, st.scores[:n], n)
		return nil
	}
	return m.scoreCandidates(st, a)
}

func (h *heldSel) addQuery(q []float32) {
	if len(h.qsum) != len(q) {
		h.qsum = make([]float64, len(q))
		h.qn = 0
	}
	for i, v := range q {
		h.qsum[i] += float64(v)
	}
	h.qn++
}

// heldSelection is a held stride selection applied to a context of n blocks now: the windows,
// and the held candidates still between them.
func heldSelection(middle []int, n, init, local int) []int {
	out := make([]int, 0, init+local+len(middle))
	for i := range init {
		out = append(out, i)
	}
	for _, b := range middle {
		if b >= init && b < n-local {
			out = append(out, b)
		}
	}
	for i := max(init, n-local); i < n; i++ {
		out = append(out, i)
	}
	return out
}

// heldHeads is heldSelection per KV head, and their union.
func heldHeads(middle [][]int, n, init, local int) ([]int, [][]int) {
	heads := make([][]int, len(middle))
	for i, m := range middle {
		heads[i] = heldSelection(m, n, init, local)
	}
	return unionSorted(heads), heads
}

// unionSorted is the ascending union of ascending lists of non-negative blocks: marked in a
// bitmap, then collected in order (O(blocks + entries), no sort).
func unionSorted(lists [][]int) []int {
	n, total := 0, 0
	for _, l := range lists {
		if len(l) > 0 {
			n = max(n, l[len(l)-1]+1)
		}
		total += len(l)
	}
	mark := make([]uint64, (n+63)/64)
	for _, l := range lists {
		for _, b := range l {
			mark[b/64] |= 1 << (b % 64)
		}
	}
	out := make([]int, 0, min(n, total))
	for w, bitsOf := range mark {
		for ; bitsOf != 0; bitsOf &= bitsOf - 1 {
			out = append(out, w*64+mathbits.TrailingZeros64(bitsOf))
		}
	}
	return out
}

// scorePart verifies one candidate's part and scores it from a scratch row; false when the
// part is unusable (corrupt, another layer, another spec) or scores NaN.
func (m *blockMethod) scorePart(st *stepState, layer int, part []byte) (float64, bool) {
	st.scratch = resize(st.scratch, m.rowBytes)
	aux, scale, ok := m.fillRow(st, layer, part, st.scratch)
	if !ok {
		return 0, false
	}
	s := m.scoreRow(st, st.scratch, aux, scale)
	return s, s == s
}

// reduceQuery averages the query heads of each KV head's group (sources §2 [DECISION]).
func (m *blockMethod) reduceQuery(st *stepState) error {
	s := m.shape
	st.qr = reuse.Grow(st.qr, s.KVHeads*s.HeadDim)
	return kernels.ReduceGQA(st.qr, st.q, s.QHeads, s.KVHeads, s.HeadDim)
}

// hashPrepare reduces the query over GQA groups and hashes each KV head's query; on MLA it
// reduces the query heads by reduction_head_num (strided), hashes each of them and makes the
// codes st.mla's tables.
func (m *blockMethod) hashPrepare(st *stepState) error {
	heads, d := m.shape.KVHeads, m.shape.HeadDim
	if m.mlaReduce > 0 {
		heads = m.shape.QHeads / m.mlaReduce
		st.qr = reuse.Grow(st.qr, heads*d)
		if err := kernels.ReduceStrided(st.qr, st.q, m.shape.QHeads, m.mlaReduce, d); err != nil {
			return err
		}
	} else if err := m.reduceQuery(st); err != nil {
		return err
	}
	c := kernels.HashCodeBytes(m.encs...)
	st.codes = reuse.Grow(st.codes, heads*c)
	if err := m.hashHeads(st, heads, c); err != nil {
		return err
	}
	if m.mlaReduce > 0 {
		return st.mla.Reset(st.codes, heads)
	}
	return nil
}

// hashHeads hashes each of the heads queries of st.qr into c code bytes of st.codes.
func (m *blockMethod) hashHeads(st *stepState, heads, c int) error {
	d := m.shape.HeadDim
	for hd := range heads {
		x := st.qr[hd*d : (hd+1)*d]
		out := st.codes[hd*c : (hd+1)*c]
		for _, e := range m.encs {
			if err := e.Hash(out[:e.CodeBytes()], x[:e.InputDim()]); err != nil {
				return err
			}
			x, out = x[e.InputDim():], out[e.CodeBytes():]
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------------
// Registration of the block-scoring methods.

func floatSpec(kind kernels.SidecarKind, s Shape) kernels.SidecarSpec {
	return kernels.SidecarSpec{Kind: kind, Layers: s.Layers, Heads: s.KVHeads, Dim: s.HeadDim, BlockSize: s.BlockSize}
}

func newBlockMethod(name string, env Env, spec kernels.SidecarSpec, stride int) (*blockMethod, error) {
	if env.Role == RoleWorker && env.Sidecars == nil {
		return nil, fmt.Errorf("%w: %s: a worker needs a sidecar source", ErrInvalid, name)
	}
	if spec.Kind != kernels.SidecarHash {
		spec.Elem = env.SidecarElem
		if spec.Elem == 0 {
			spec.Elem = kernels.Float16
		}
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("%s: sidecar: %w", name, err)
	}
	m := &blockMethod{name: name, shape: env.Shape, src: env.Sidecars, spec: spec, stride: max(stride, 1)}
	m.setRows(false, env)
	return m, nil
}

// setRows chooses the method's row format (int8 rows: ESA's repr_dtype int8) and its
// representation pool of Env.ReprPoolBytes.
func (m *blockMethod) setRows(int8Rows bool, env Env) {
	m.rowKind, m.rowBytes = rowFormat(m.spec, int8Rows)
	m.pool = newReprPool(m.rowBytes, m.spec.Layers, env.ReprPoolBytes)
}

func windowDefaults(init, local int, ratio float64, stride int) WindowConfig {
	return WindowConfig{InitWindow: init, LocalWindow: local, SparseRatio: ratio, RetrievalStride: stride}
}

func init() {
	register(NameQuest, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &QuestConfig{WindowConfig: windowDefaults(1, 2, 0.3, 1), HeadScore: "sum"}
			return c, parseFields(key, node, append(c.fields(), stringField(&c.HeadScore, "head_score")))
		},
		build: func(cfg MethodConfig, env Env) (SparseMethod, error) {
			c := cfg.(*QuestConfig)
			m, err := newBlockMethod(NameQuest, env, floatSpec(kernels.SidecarQuest, env.Shape), c.RetrievalStride)
			if err != nil {
				return nil, err
			}
			m.keep = func(n, _ int) (int, int, int) { return c.Keep(n) }
			m.perKV = c.HeadSelect == "kv"
			m.prepare = func(*stepState) error { return nil }
			m.softmaxHeads = c.HeadScore == "softmax"
			return m, nil
		},
	})
	register(NameESA, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &ESAConfig{WindowConfig: windowDefaults(1, 2, 0.3, 1), Pool: "mean", HeadScore: "sum", ReprDType: "fp16", RetrievalWorkers: 4, PrefetchConfig: defaultPrefetch()}
			return c, parseFields(key, node, append(append(c.fields(), stringField(&c.Pool, "pool"), stringField(&c.HeadScore, "head_score"),
				intField(&c.RetrievalLag, "retrieval_lag"), intField(&c.RetrievalWorkers, "retrieval_workers"), stringField(&c.ReprDType, "repr_dtype")), c.prefetchFields()...))
		},
		build: func(cfg MethodConfig, env Env) (SparseMethod, error) {
			c := cfg.(*ESAConfig)
			kind := kernels.SidecarESAMean
			if c.Pool == "max" {
				kind = kernels.SidecarESAMax
			}
			m, err := newBlockMethod(NameESA, env, floatSpec(kind, env.Shape), c.RetrievalStride)
			if err != nil {
				return nil, err
			}
			m.keep = func(n, _ int) (int, int, int) { return c.Keep(n) }
			m.perKV = c.HeadSelect == "kv"
			m.prepare = m.reduceQuery
			m.softmaxHeads = c.HeadScore == "softmax"
			m.lag = c.RetrievalLag == 1
			if m.lag && c.RetrievalWorkers > 0 {
				m.workers = make(chan struct{}, c.RetrievalWorkers)
			}
			if c.ReprDType == "int8" {
				m.setRows(true, env)
			}
			return m, m.setupPrefetch(&c.PrefetchConfig, env)
		},
	})
	register(NameGSA, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &GSAConfig{WindowConfig: windowDefaults(1, 2, 0.3, 1), MinBlocks: 4, BlockScore: "distance", PrefetchConfig: defaultPrefetch()}
			fs := append(append(c.fields(), intField(&c.MinBlocks, "min_blocks"), stringField(&c.BlockScore, "block_score")),
				c.prefetchFields()...)
			return c, parseFields(key, node, fs)
		},
		build: func(cfg MethodConfig, env Env) (SparseMethod, error) {
			c := cfg.(*GSAConfig)
			m, err := newBlockMethod(NameGSA, env, floatSpec(kernels.SidecarESAMean, env.Shape), c.RetrievalStride)
			if err != nil {
				return nil, err
			}
			m.keep = func(n, _ int) (int, int, int) { return c.Keep(n) }
			m.perKV = c.HeadSelect == "kv"
			m.prepare = m.reduceQuery
			m.gsa = true
			m.accessScore = c.BlockScore == "access_count"
			return m, m.setupPrefetch(&c.PrefetchConfig, env)
		},
	})
	register(NameKVStar, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &KVStarConfig{WindowConfig: windowDefaults(2, 4, 0.3, 8), PruneRatio: 0.5, Merge: 4, HeadScore: "sum"}
			fs := append(c.fields(), floatField(&c.PruneRatio, "blk_repre_dim_prune_ratio"), intField(&c.Merge, "blk_repre_inner_token_merge"),
				stringField(&c.HeadScore, "head_score"))
			return c, parseFields(key, node, fs)
		},
		build: func(cfg MethodConfig, env Env) (SparseMethod, error) {
			c := cfg.(*KVStarConfig)
			spec := floatSpec(kernels.SidecarKVStar, env.Shape)
			spec.PruneRatio, spec.Merge = c.PruneRatio, c.Merge
			m, err := newBlockMethod(NameKVStar, env, spec, c.RetrievalStride)
			if err != nil {
				return nil, err
			}
			m.keep = func(n, _ int) (int, int, int) { return c.Keep(n) }
			m.perKV = c.HeadSelect == "kv"
			m.prepare = m.reduceQuery
			m.softmaxHeads = c.HeadScore == "softmax"
			return m, nil
		},
	})
	register(NameGSAOnDevice, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &GSAOnDeviceConfig{TopKTokens: 4096, SinkTokens: 64, RecentTokens: 512, HashSeed: 1, BlockDist: "min", ReductionHeads: 1}
			fs := []field{
				intField(&c.TopKTokens, "hash_topk_tokens", "topk_tokens"),
				intField(&c.SinkTokens, "sink_token"),
				intField(&c.RecentTokens, "recent_token"),
				intField(&c.HashBits, "hash_bits"),
				uintField(&c.HashSeed, "hash_seed"),
				intsField(&c.RollbackLayers, "rollback_layers", "vllm_hash_attention_rollback_layers"),
				floatField(&c.Budget, "budget"),
				stringField(&c.BlockDist, "block_dist"),
				stringField(&c.HeadSelect, "head_select"),
				intField(&c.KVLoraRank, "kv_lora_rank"),
				intField(&c.QKRopeHeadDim, "qk_rope_head_dim"),
				intField(&c.HashBitsKVLora, "hash_bits_kv_lora"),
				intField(&c.HashBitsQKRope, "hash_bits_qk_rope"),
				intField(&c.ReductionHeads, "reduction_head_num", "vllm_hash_attention_reduction_head_num"),
				layersField(&c.SkipHashLayers, "skip_hash_layers", "vllm_hash_attention_skip_layers"),
			}
			return c, parseFields(key, node, fs)
		},
		build: func(cfg MethodConfig, env Env) (SparseMethod, error) {
			c := cfg.(*GSAOnDeviceConfig)
			spec, err := c.HashSpec(env.Shape)
			if err != nil {
				return nil, err
			}
			m, err := newBlockMethod(NameGSAOnDevice, env, spec, 1)
			if err != nil {
				return nil, err
			}
			if m.encs, err = spec.HashEncoders(); err != nil {
				return nil, fmt.Errorf("%s: %w", NameGSAOnDevice, err)
			}
			m.fp = kernels.HashFingerprint(m.encs...)
			m.rollback = map[int]bool{}
			for _, l := range c.RollbackLayers {
				m.rollback[l] = true
			}
			if len(c.SkipHashLayers) > 0 {
				m.skipHash, m.lastSel = map[int]bool{}, map[string]*stepSel{}
				for _, l := range c.SkipHashLayers {
					m.skipHash[l] = true
				}
			}
			bs := env.Shape.BlockSize
			m.keep = func(n, seqLen int) (int, int, int) { return c.Keep(n, seqLen, bs) }
			m.prepare = m.hashPrepare
			m.meanDist = c.BlockDist == "mean"
			// MLA has one KV head: selecting per KV head is selecting per layer.
			m.perKV = c.HeadSelect == "kv" && !c.MLA()
			if c.MLA() {
				m.mlaReduce = c.ReductionHeads
			}
			return m, nil
		},
	})
}

// resize returns s with n elements, reusing its array when large enough; the contents are not
// cleared.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
