package sparse

import (
	"encoding/binary"
	"fmt"
	"math"
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
}

// scoreFunc scores one decoded candidate: the layer's part (verified header h) and the query
// state prepared for the step; higher is better.
type scoreFunc func(st *stepState, h *kernels.SidecarHeader, part []byte) (float64, error)

// stepState is one selection's query state and scratch.
type stepState struct {
	q      []float32 // the token's queries, [QHeads][HeadDim]
	qr     []float32 // GQA-reduced queries, [KVHeads][HeadDim]
	codes  []byte    // query hash codes, [KVHeads][code bytes]
	vals   []float32 // a part's values
	ch     []uint16  // a part's channels
	scores []float64
	idx    []int
	sel    []int
	ids    []engine.BlockID
	pos    []int
	parts  []byte
	// perHead, when set, receives a candidate's per-query-head scores (head_score: softmax);
	// heads holds them for every candidate, [candidates][QHeads].
	perHead []float64
	heads   []float64
}

// softmaxScores turns the candidates' per-head scores (st.heads) into each block's estimated
// share of attention: per query head, a softmax over the scored candidates of score/√D, then
// the sum over heads (head_score: softmax, a UCM-Go option). Unscored (+∞) candidates stay +∞.
func (m *blockMethod) softmaxScores(st *stepState) {
	hq := m.shape.QHeads
	scale := 1 / math.Sqrt(float64(m.shape.HeadDim))
	sum := make([]float64, len(st.pos))
	for h := range hq {
		mx := math.Inf(-1)
		for j, i := range st.pos {
			if !math.IsInf(st.scores[i], 1) {
				mx = max(mx, st.heads[j*hq+h]*scale)
			}
		}
		var z float64
		for j, i := range st.pos {
			if !math.IsInf(st.scores[i], 1) {
				e := math.Exp(st.heads[j*hq+h]*scale - mx)
				st.heads[j*hq+h] = e
				z += e
			}
		}
		for j, i := range st.pos {
			if !math.IsInf(st.scores[i], 1) && z > 0 {
				sum[j] += st.heads[j*hq+h] / z
			}
		}
	}
	for j, i := range st.pos {
		if !math.IsInf(st.scores[i], 1) {
			st.scores[i] = sum[j]
		}
	}
}

// blockMethod is the shared implementation; see the constructors in methods.go.
type blockMethod struct {
	Base
	name     string
	shape    Shape
	src      SidecarSource
	spec     kernels.SidecarSpec
	encs     []*kernels.HashEncoder // GSA On-Device
	fp       uint32
	keep     func(n, seqLen int) (init, local, k int)
	stride   int
	rollback map[int]bool
	// lag: a step attends the selection retrieved at the previous step (retrieval_lag 1).
	lag bool
	// softmaxHeads: score blocks by Σ over query heads of their softmax share (head_score).
	softmaxHeads bool
	prepare      func(st *stepState) error
	score        scoreFunc

	pool  sync.Pool // *stepState
	mu    sync.Mutex
	held  map[string]*heldSel // by request ID and layer
	stats struct{ selections, dense, candidates, missing, held atomic.Int64 }
}

// heldSel is a selection kept for a retrieval stride, and the queries gathered meanwhile.
type heldSel struct {
	group  int
	middle []int // selected candidates
	qsum   []float64
	qn     int
}

func (m *blockMethod) Name() string { return m.name }

// Stats returns the method's counters.
func (m *blockMethod) Stats() SelectStats {
	return SelectStats{Selections: m.stats.selections.Load(), Dense: m.stats.dense.Load(), Candidates: m.stats.candidates.Load(),
		Missing: m.stats.missing.Load(), Held: m.stats.held.Load()}
}

// SidecarSpec is the representation the method reads; parts of another spec are misses.
func (m *blockMethod) SidecarSpec() kernels.SidecarSpec { return m.spec }

// RequestFinished forgets the request's held selections.
func (m *blockMethod) RequestFinished(reqID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.held {
		if len(k) > len(reqID) && k[:len(reqID)] == reqID && k[len(reqID)] == 0 {
			delete(m.held, k)
		}
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
	if init+local+k >= n {
		m.stats.dense.Add(1)
		return nil
	}
	sel, err := m.selectBlocks(a, a.Q[len(a.Q)-qd:], n, init, local, k)
	if err != nil {
		return err
	}
	m.stats.selections.Add(1)
	return a.Rewrite(sel, bs)
}

func (m *blockMethod) state() *stepState {
	if st, ok := m.pool.Get().(*stepState); ok {
		return st
	}
	return &stepState{}
}

// selectBlocks chooses the blocks of one decode step of one layer.
func (m *blockMethod) selectBlocks(a *Attention, q []float32, n, init, local, k int) ([]int, error) {
	st := m.state()
	defer m.pool.Put(st)
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
			return heldSelection(h.middle, n, init, local), nil
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
	st.q = append(st.q[:0], q...)
	if err := m.prepare(st); err != nil {
		return nil, err
	}
	st.scores = reuse.Grow(st.scores, n)
	// Candidates with a stored id are loaded in one call; the rest (not stored yet) are misses.
	st.ids, st.pos = st.ids[:0], st.pos[:0]
	for i := init; i < n-local; i++ {
		if i < len(a.Request.BlockIDs) {
			st.ids = append(st.ids, a.Request.BlockIDs[i])
			st.pos = append(st.pos, i)
		} else {
			st.scores[i] = math.Inf(1)
			m.stats.missing.Add(1)
		}
	}
	m.stats.candidates.Add(int64(n - local - init))
	if len(st.ids) > 0 {
		pb := m.spec.PartBytes()
		st.parts = resize(st.parts, len(st.ids)*pb) // LoadSidecars writes every byte
		found, err := m.src.LoadSidecars(engine.SidecarKind(m.spec.Kind), a.Layer, st.ids, st.parts)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %d: load %v sidecars of %d blocks: %w", m.name, a.Layer, m.spec.Kind, len(st.ids), err)
		}
		hq := m.shape.QHeads
		if m.softmaxHeads {
			st.heads = resize(st.heads, len(st.pos)*hq)
		}
		for j, i := range st.pos {
			s := math.Inf(1)
			if m.softmaxHeads {
				st.perHead = st.heads[j*hq : (j+1)*hq]
			}
			if found[j] {
				if v, ok := m.scorePart(st, a.Layer, st.parts[j*pb:(j+1)*pb]); ok {
					s = v
				}
			}
			if math.IsInf(s, 1) {
				m.stats.missing.Add(1)
			}
			st.scores[i] = s
		}
		if m.softmaxHeads {
			m.softmaxScores(st)
		}
		st.perHead = nil
	}
	st.sel = selectTopK(st.sel, st.idx, st.scores[:n], init, local, k)
	sel := append([]int(nil), st.sel...)
	if m.lag {
		// This step attends the previous step's selection (ESA's asynchronous retrieval: the
		// retrieval of step N overlaps step N's attention and serves step N+1); the first step
		// has none and attends its own.
		prev, had := h.middle, h.group >= 0
		h.middle, h.group = append([]int(nil), sel[init:len(sel)-local]...), a.Step
		if had {
			m.stats.held.Add(1)
			return heldSelection(prev, n, init, local), nil
		}
		return sel, nil
	}
	if h != nil {
		h.middle = append(h.middle[:0], sel[init:len(sel)-local]...)
		h.addQuery(a.Q[len(a.Q)-len(q):])
	}
	return sel, nil
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

// scorePart verifies one candidate's part and scores it; false when the part is unusable
// (corrupt, another layer, another spec).
func (m *blockMethod) scorePart(st *stepState, layer int, part []byte) (float64, bool) {
	h, l, err := kernels.DecodeSidecarHeader(part)
	if err != nil || l != layer {
		return 0, false
	}
	if h.SidecarSpec != m.spec || m.encs != nil && h.Fingerprint != m.fp || h.Tokens < 1 {
		return 0, false
	}
	s, err := m.score(st, &h, part)
	if err != nil || math.IsNaN(s) {
		return 0, false
	}
	return s, true
}

// decodeValues verifies a float part and decodes its values (and KVStar's channels) into st.
func decodeValues(st *stepState, h *kernels.SidecarHeader, part []byte) error {
	st.vals = reuse.Grow(st.vals, h.Rows()*h.Heads*h.Cols())
	var ch []uint16
	if h.Kind == kernels.SidecarKVStar {
		st.ch = reuse.Grow(st.ch, h.Heads*h.Cols())
		ch = st.ch
	}
	_, _, err := kernels.DecodeSidecarPart(part, st.vals, ch)
	return err
}

// reduceQuery averages the query heads of each KV head's group (spec §2 [DECISION]).
func (m *blockMethod) reduceQuery(st *stepState) error {
	s := m.shape
	st.qr = reuse.Grow(st.qr, s.KVHeads*s.HeadDim)
	return kernels.ReduceGQA(st.qr, st.q, s.QHeads, s.KVHeads, s.HeadDim)
}

// questScore: Σ over query heads of Quest's bound Σ_d max(q_d·lo_d, q_d·hi_d) against the
// per-channel min and max of the query head's KV head.
func (m *blockMethod) questScore(st *stepState, h *kernels.SidecarHeader, part []byte) (float64, error) {
	if v, ok := fp16Values(h, part); ok {
		s := m.shape
		n := 2 * s.KVHeads * s.HeadDim
		g := s.QHeads / s.KVHeads
		var sum float64
		for qh := range s.QHeads {
			kv := qh / g
			lo := v[kv*s.HeadDim*2 : (kv+1)*s.HeadDim*2]
			hi := v[n+kv*s.HeadDim*2 : n+(kv+1)*s.HeadDim*2]
			b := float64(questBoundF16(st.q[qh*s.HeadDim:(qh+1)*s.HeadDim], lo, hi))
			if st.perHead != nil {
				st.perHead[qh] = b
			}
			sum += b
		}
		return sum, nil
	}
	if err := decodeValues(st, h, part); err != nil {
		return 0, err
	}
	s := m.shape
	n := s.KVHeads * s.HeadDim
	lo, hi := st.vals[:n], st.vals[n:2*n]
	g := s.QHeads / s.KVHeads
	var sum float64
	for qh := range s.QHeads {
		kv := qh / g
		b := float64(kernels.QuestBound(st.q[qh*s.HeadDim:(qh+1)*s.HeadDim], lo[kv*s.HeadDim:(kv+1)*s.HeadDim], hi[kv*s.HeadDim:(kv+1)*s.HeadDim]))
		if st.perHead != nil {
			st.perHead[qh] = b
		}
		sum += b
	}
	return sum, nil
}

// esaScore: Σ_h q̄_h · r_h (spec §2 [DECISION]).
func (m *blockMethod) esaScore(st *stepState, h *kernels.SidecarHeader, part []byte) (float64, error) {
	if st.perHead != nil { // per query head: q_h · r_{kv(h)}
		d, g := m.shape.HeadDim, m.shape.QHeads/m.shape.KVHeads
		v, ok := fp16Values(h, part)
		if !ok {
			if err := decodeValues(st, h, part); err != nil {
				return 0, err
			}
		}
		for qh := range m.shape.QHeads {
			kv := qh / g
			if ok {
				st.perHead[qh] = dotF16(st.q[qh*d:(qh+1)*d], v[2*kv*d:2*(kv+1)*d])
				continue
			}
			var s float64
			for i, r := range st.vals[kv*d : (kv+1)*d] {
				s += float64(st.q[qh*d+i]) * float64(r)
			}
			st.perHead[qh] = s
		}
		return 0, nil
	}
	if v, ok := fp16Values(h, part); ok {
		return dotF16(st.qr, v), nil
	}
	if err := decodeValues(st, h, part); err != nil {
		return 0, err
	}
	var sum float64
	for i, r := range st.vals {
		sum += float64(st.qr[i]) * float64(r)
	}
	return sum, nil
}

// gsaScore: −Σ_h ‖q̄_h − r_h‖₂ (spec §3A, the active code).
func (m *blockMethod) gsaScore(st *stepState, h *kernels.SidecarHeader, part []byte) (float64, error) {
	d := m.shape.HeadDim
	if v, ok := fp16Values(h, part); ok {
		t := f16()
		var sum float64
		for hd := range m.shape.KVHeads {
			var ss float64
			for i := hd * d; i < (hd+1)*d; i++ {
				x := float64(st.qr[i]) - float64(t[binary.LittleEndian.Uint16(v[2*i:])])
				ss += x * x
			}
			sum += math.Sqrt(ss)
		}
		return -sum, nil
	}
	if err := decodeValues(st, h, part); err != nil {
		return 0, err
	}
	var sum float64
	for hd := range m.shape.KVHeads {
		var ss float64
		for i := hd * d; i < (hd+1)*d; i++ {
			x := float64(st.qr[i]) - float64(st.vals[i])
			ss += x * x
		}
		sum += math.Sqrt(ss)
	}
	return -sum, nil
}

// kvstarScore: Σ_h max_m q̄_h[channels]·repr_{m,h} (spec §5 [DECISION]), over the merged rows
// the block has.
func (m *blockMethod) kvstarScore(st *stepState, h *kernels.SidecarHeader, part []byte) (float64, error) {
	d, dk, heads := m.shape.HeadDim, h.Cols(), h.Heads
	rows := h.ValidRows()
	if h.Elem == kernels.Float16 {
		// Channels (and every check) from the decoder; values read in place.
		st.ch = reuse.Grow(st.ch, heads*dk)
		if _, _, err := kernels.DecodeSidecarPart(part, nil, st.ch); err != nil {
			return 0, err
		}
		off := kernels.SidecarHeaderSize + (2*heads*dk+7)&^7
		t := f16()
		var sum float64
		for hd := range heads {
			qh := st.qr[hd*d : (hd+1)*d]
			ch := st.ch[hd*dk : (hd+1)*dk]
			best := math.Inf(-1)
			for r := range rows {
				v := part[off+2*(r*heads+hd)*dk : off+2*(r*heads+hd+1)*dk]
				var s float64
				for j, c := range ch {
					s += float64(qh[c]) * float64(t[binary.LittleEndian.Uint16(v[2*j:])])
				}
				best = max(best, s)
			}
			sum += best
		}
		return sum, nil
	}
	if err := decodeValues(st, h, part); err != nil {
		return 0, err
	}
	var sum float64
	for hd := range heads {
		qh := st.qr[hd*d : (hd+1)*d]
		ch := st.ch[hd*dk : (hd+1)*dk]
		best := math.Inf(-1)
		for r := range rows {
			v := st.vals[(r*heads+hd)*dk : (r*heads+hd+1)*dk]
			var s float64
			for j, c := range ch {
				s += float64(qh[c]) * float64(v[j])
			}
			best = max(best, s)
		}
		sum += best
	}
	return sum, nil
}

// hashPrepare reduces the query over GQA groups and hashes each KV head's query.
func (m *blockMethod) hashPrepare(st *stepState) error {
	if err := m.reduceQuery(st); err != nil {
		return err
	}
	c := kernels.HashCodeBytes(m.encs...)
	st.codes = reuse.Grow(st.codes, m.shape.KVHeads*c)
	d := m.shape.HeadDim
	for hd := range m.shape.KVHeads {
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

// hashScore: −(block distance), the block distance being the minimum (or mean) over the
// block's tokens of Σ_h Hamming(q_h, k_{t,h}) (spec §4 [DECISION]).
func (m *blockMethod) hashScore(mean bool) scoreFunc {
	return func(st *stepState, h *kernels.SidecarHeader, part []byte) (float64, error) {
		if _, _, err := kernels.DecodeSidecarPart(part, nil, nil); err != nil {
			return 0, err
		}
		row := h.Heads * h.Cols()
		codes := part[kernels.SidecarHeaderSize:][:h.Tokens*row]
		best, total := math.MaxInt, 0
		for t := range h.Tokens {
			dist := kernels.Hamming(st.codes, codes[t*row:(t+1)*row])
			total += dist
			best = min(best, dist)
		}
		if mean {
			return -float64(total) / float64(h.Tokens), nil
		}
		return -float64(best), nil
	}
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
	return &blockMethod{name: name, shape: env.Shape, src: env.Sidecars, spec: spec, stride: max(stride, 1)}, nil
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
			m.prepare = func(*stepState) error { return nil }
			m.score = m.questScore
			m.softmaxHeads = c.HeadScore == "softmax"
			return m, nil
		},
	})
	register(NameESA, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &ESAConfig{WindowConfig: windowDefaults(1, 2, 0.3, 1), Pool: "mean", HeadScore: "sum"}
			return c, parseFields(key, node, append(c.fields(), stringField(&c.Pool, "pool"), stringField(&c.HeadScore, "head_score"),
				intField(&c.RetrievalLag, "retrieval_lag")))
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
			m.prepare = m.reduceQuery
			m.score = m.esaScore
			m.softmaxHeads = c.HeadScore == "softmax"
			m.lag = c.RetrievalLag == 1
			return m, nil
		},
	})
	register(NameGSA, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &GSAConfig{WindowConfig: windowDefaults(1, 2, 0.3, 1), MinBlocks: 4}
			fs := append(c.fields(), intField(&c.MinBlocks, "min_blocks"),
				ignoredField("prefetch_workers", "max_pending_prefetch", "prefetch_ahead", "prefetch_cache_size"))
			return c, parseFields(key, node, fs)
		},
		build: func(cfg MethodConfig, env Env) (SparseMethod, error) {
			c := cfg.(*GSAConfig)
			m, err := newBlockMethod(NameGSA, env, floatSpec(kernels.SidecarESAMean, env.Shape), c.RetrievalStride)
			if err != nil {
				return nil, err
			}
			m.keep = func(n, _ int) (int, int, int) { return c.Keep(n) }
			m.prepare = m.reduceQuery
			m.score = m.gsaScore
			return m, nil
		},
	})
	register(NameKVStar, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &KVStarConfig{WindowConfig: windowDefaults(2, 4, 0.3, 8), PruneRatio: 0.5, Merge: 4}
			fs := append(c.fields(), floatField(&c.PruneRatio, "blk_repre_dim_prune_ratio"), intField(&c.Merge, "blk_repre_inner_token_merge"))
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
			m.prepare = m.reduceQuery
			m.score = m.kvstarScore
			return m, nil
		},
	})
	register(NameGSAOnDevice, factory{
		parse: func(key string, node *yaml.Node) (MethodConfig, error) {
			c := &GSAOnDeviceConfig{TopKTokens: 4096, SinkTokens: 64, RecentTokens: 512, HashSeed: 1, BlockDist: "min"}
			fs := []field{
				intField(&c.TopKTokens, "hash_topk_tokens", "topk_tokens"),
				intField(&c.SinkTokens, "sink_token"),
				intField(&c.RecentTokens, "recent_token"),
				intField(&c.HashBits, "hash_bits"),
				uintField(&c.HashSeed, "hash_seed"),
				intsField(&c.RollbackLayers, "rollback_layers"),
				floatField(&c.Budget, "budget"),
				stringField(&c.BlockDist, "block_dist"),
				ignoredField("skip_hash_layers", "reduction_head_num"),
			}
			return c, parseFields(key, node, fs)
		},
		build: func(cfg MethodConfig, env Env) (SparseMethod, error) {
			c := cfg.(*GSAOnDeviceConfig)
			spec := kernels.SidecarSpec{Kind: kernels.SidecarHash, Layers: env.Shape.Layers, Heads: env.Shape.KVHeads,
				Dim: env.Shape.HeadDim, BlockSize: env.Shape.BlockSize, HashBits: c.HashBits, Seed: c.HashSeed}
			if spec.HashBits == 0 {
				spec.HashBits = env.Shape.HeadDim &^ 7
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
			bs := env.Shape.BlockSize
			m.keep = func(n, seqLen int) (int, int, int) { return c.Keep(n, seqLen, bs) }
			m.prepare = m.hashPrepare
			m.score = m.hashScore(c.BlockDist == "mean")
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

// f16 is the float16 → float32 table of the fused scoring kernels (256 KiB).
var f16 = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = kernels.Float16ToFloat32(uint16(i))
	}
	return t
})

// fp16Values returns the fp16 value bytes of a verified float part (ESA or Quest, whose data
// is the values alone) after checking that its padding is zero, as DecodeSidecarPart does,
// so the scoring kernels can read the values in place; false for other element types.
func fp16Values(h *kernels.SidecarHeader, part []byte) ([]byte, bool) {
	if h.Elem != kernels.Float16 || h.Kind == kernels.SidecarKVStar || h.Kind == kernels.SidecarHash {
		return nil, false
	}
	n := kernels.SidecarHeaderSize + 2*h.Rows()*h.Heads*h.Cols()
	if len(part) < n {
		return nil, false
	}
	for _, b := range part[n:] {
		if b != 0 {
			return nil, false
		}
	}
	return part[kernels.SidecarHeaderSize:n], true
}

// dotF16 is Σ q[i]·v[i] over fp16 values v (little-endian), accumulated in float64.
func dotF16(q []float32, v []byte) float64 {
	t := f16()
	v = v[:2*len(q)]
	var s float64
	i := 0
	for ; i+4 <= len(q); i += 4 {
		w := binary.LittleEndian.Uint64(v[2*i:])
		s += float64(q[i]) * float64(t[uint16(w)])
		s += float64(q[i+1]) * float64(t[uint16(w>>16)])
		s += float64(q[i+2]) * float64(t[uint16(w>>32)])
		s += float64(q[i+3]) * float64(t[uint16(w>>48)])
	}
	for ; i < len(q); i++ {
		s += float64(q[i]) * float64(t[binary.LittleEndian.Uint16(v[2*i:])])
	}
	return s
}

// questBoundF16 is kernels.QuestBound over fp16 min and max values read in place: the same
// float32 products and float64 sum.
func questBoundF16(q []float32, lo, hi []byte) float32 {
	t := f16()
	lo, hi = lo[:2*len(q)], hi[:2*len(q)]
	var s float64
	i := 0
	for ; i+4 <= len(q); i += 4 {
		wl, wh := binary.LittleEndian.Uint64(lo[2*i:]), binary.LittleEndian.Uint64(hi[2*i:])
		x := q[i : i+4 : i+4]
		s += float64(max(x[0]*t[uint16(wl)], x[0]*t[uint16(wh)]))
		s += float64(max(x[1]*t[uint16(wl>>16)], x[1]*t[uint16(wh>>16)]))
		s += float64(max(x[2]*t[uint16(wl>>32)], x[2]*t[uint16(wh>>32)]))
		s += float64(max(x[3]*t[uint16(wl>>48)], x[3]*t[uint16(wh>>48)]))
	}
	for ; i < len(q); i++ {
		s += float64(max(q[i]*t[binary.LittleEndian.Uint16(lo[2*i:])], q[i]*t[binary.LittleEndian.Uint16(hi[2*i:])]))
	}
	return float32(s)
}
