package sparse

import (
	"fmt"
	"math"
	"sync"

	"github.com/ucm-go/ucm/internal/par"
	"github.com/ucm-go/ucm/kernels"
)

// Retrieval over a caller's representation matrix: the computation of UCM's CPU retrieval
// modules (ESA's retrieval_backend), without a store or a method's hooks. The caller keeps
// the rows; a call reads them in place.

// MaxRetrieveElems bounds every length a retrieval takes (rows × dim, batch × width, batch ×
// k): 2^31 elements, as the C ABI's sizes.
const MaxRetrieveElems = 1 << 31

// DotArgs is one ESA retrieval: for each of the Batch = len(Q)/Dim query rows, the K rows of
// Data (rows of Dim float32) among that row's candidates with the largest dot product with it.
type DotArgs struct {
	Q    []float32 // Batch × Dim query rows
	Data []float32 // the representation rows, Dim each (read in place, never written)
	Dim  int
	// Cand holds Batch rows of Width candidate row numbers of Data; -1 is no candidate (a
	// padding entry). nil: every row of Data is a candidate of every query row (Width is then
	// ignored).
	Cand  []int32
	Width int
	K     int
	// The results: Batch rows of K entries each. Row b's first Count[b] = min(K, its
	// candidates) entries are candidate row numbers and their scores, score descending, ties to
	// the earlier candidate in the row, NaN after every number; the rest are -1 and -Inf.
	// Count may be nil.
	Idx    []int32
	Scores []float32
	Count  []int64
}

// Batch is the number of query rows (0 when Dim is not positive).
func (a *DotArgs) Batch() int {
	if a.Dim <= 0 {
		return 0
	}
	return len(a.Q) / a.Dim
}

// Check validates a's shapes and candidates: every error wraps ErrInvalid and names the field,
// or the row and column of a candidate outside [-1, rows of Data).
func (a *DotArgs) Check() error {
	if a.Dim <= 0 || a.Dim > MaxRetrieveElems {
		return fmt.Errorf("dot retrieval: dim %d: want 1 … %d: %w", a.Dim, MaxRetrieveElems, ErrInvalid)
	}
	if len(a.Q)%a.Dim != 0 || len(a.Data)%a.Dim != 0 {
		return fmt.Errorf("dot retrieval: q of %d and data of %d values: not whole rows of dim %d: %w", len(a.Q), len(a.Data), a.Dim, ErrInvalid)
	}
	if len(a.Data) > MaxRetrieveElems {
		return fmt.Errorf("dot retrieval: data of %d values: more than %d: %w", len(a.Data), MaxRetrieveElems, ErrInvalid)
	}
	b, rows := a.Batch(), len(a.Data)/a.Dim
	if a.K < 0 || int64(a.K)*int64(b) > MaxRetrieveElems {
		return fmt.Errorf("dot retrieval: topk %d for %d rows: %w", a.K, b, ErrInvalid)
	}
	if len(a.Idx) < b*a.K || len(a.Scores) < b*a.K {
		return fmt.Errorf("dot retrieval: outputs of %d indices and %d scores for %d rows of topk %d: %w", len(a.Idx), len(a.Scores), b, a.K, ErrInvalid)
	}
	if a.Count != nil && len(a.Count) < b {
		return fmt.Errorf("dot retrieval: count of %d for %d rows: %w", len(a.Count), b, ErrInvalid)
	}
	if a.Cand == nil {
		return nil
	}
	if a.Width < 0 || int64(a.Width)*int64(b) != int64(len(a.Cand)) {
		return fmt.Errorf("dot retrieval: %d candidates: not %d rows of width %d: %w", len(a.Cand), b, a.Width, ErrInvalid)
	}
	for i, c := range a.Cand {
		if c < -1 || int(c) >= rows {
			return fmt.Errorf("dot retrieval: candidate %d (row %d, column %d): outside [-1, %d): %w", c, i/a.Width, i%a.Width, rows, ErrInvalid)
		}
	}
	return nil
}

// scoreScratch holds a retrieval's candidate scores (Batch × Width); rowScratch one row's
// top-k working memory. Both are pooled across calls.
type (
	scoreScratch struct{ scores []float32 }
	rowScratch   struct {
		row  []float32 // the row's valid candidates' scores
		cols []int32   // their columns
		keys []uint64
		pos  []int32
		sc   []float32
	}
)

var (
	scoreScratchPool = sync.Pool{New: func() any { return new(scoreScratch) }}
	rowScratchPool   = sync.Pool{New: func() any { return new(rowScratch) }}
)

// dotGrain is the candidates a worker scores per claim: 1,024 rows of 1,024 floats are 4 MiB,
// enough to amortise a claim, few enough to balance two workers on a busy machine.
const dotGrain = 1024

// DotTopK runs the retrieval a describes on the calling goroutine and up to workers-1 helpers
// (internal/par: the candidates of all rows in chunks, then the rows' top-k). It checks a
// first (DotArgs.Check) and writes nothing when that fails. Scores are float32 sums in the
// order kernels.DotsF32 takes: they differ from a float64 sum by rounding only.
func DotTopK(a *DotArgs, workers int) error {
	if err := a.Check(); err != nil {
		return err
	}
	b, d := a.Batch(), a.Dim
	if b == 0 {
		return nil
	}
	rows := len(a.Data) / d
	width := a.Width
	if a.Cand == nil {
		width = rows
	}
	s := scoreScratchPool.Get().(*scoreScratch)
	defer scoreScratchPool.Put(s)
	s.scores = resize(s.scores, b*width)
	cand := func(i int) int32 {
		if a.Cand == nil {
			return int32(i % width)
		}
		return a.Cand[i]
	}
	par.Chunks(b*width, dotGrain, workers, func(lo, hi int) {
		for i := lo; i < hi; {
			c := cand(i)
			if c < 0 {
				i++
				continue
			}
			// A run of consecutive rows of Data within one query row: one kernel call.
			e := i + 1
			for e < hi && e%width != 0 && cand(e) == c+int32(e-i) {
				e++
			}
			qr := i / width
			_ = kernels.DotsF32(s.scores[i:e], a.Q[qr*d:(qr+1)*d], a.Data[int(c)*d:(int(c)+e-i)*d], d, 0, d)
			i = e
		}
	})
	// The rows' top-k, one row per claim.
	par.Chunks(b, 1, workers, func(lo, hi int) {
		rs := rowScratchPool.Get().(*rowScratch)
		defer rowScratchPool.Put(rs)
		for r := lo; r < hi; r++ {
			rs.row, rs.cols = rs.row[:0], rs.cols[:0]
			for j := range width {
				if cand(r*width+j) >= 0 {
					rs.row = append(rs.row, s.scores[r*width+j])
					rs.cols = append(rs.cols, int32(j))
				}
			}
			rs.pos = resize(rs.pos, min(a.K, len(rs.row)))
			rs.sc = resize(rs.sc, len(rs.pos))
			n := topKDesc(rs.pos, rs.sc, rs.row, a.K, &rs.keys)
			idx, sc := a.Idx[r*a.K:(r+1)*a.K], a.Scores[r*a.K:(r+1)*a.K]
			for i := range n {
				idx[i], sc[i] = cand(r*width+int(rs.cols[rs.pos[i]])), rs.sc[i]
			}
			for i := n; i < a.K; i++ {
				idx[i], sc[i] = -1, float32(math.Inf(-1))
			}
			if a.Count != nil {
				a.Count[r] = int64(n)
			}
		}
	})
	return nil
}

// MaxDotArgs is one GSA offload selection (UCM's gsa_offload_ops CalKpreAndTopk, for one
// request and layer): the query heads averaged per KV head group, each block scored
// Σ_h max_m q̄_h·r_{b,h,m} over its representation rows, and the blocks chosen in UCM's order.
type MaxDotArgs struct {
	Q []float32 // QHeads × Dim: read, never written (UCM replaces the rows by their means)
	// Reprs holds the blocks' rows, block-major: Blocks × KVHeads × M × Dim (UCM's kpre cache,
	// [slots][kv head][numKrepre][head size]).
	Reprs                   []float32
	QHeads, KVHeads, M, Dim int
	K                       int // the selection's length (UCM's topk_lens entry)
	Init, Local             int // the leading and trailing windows always kept (UCM: 1 and 2)
	// Out receives the selection (MaxDotTopK says how many entries).
	Out []int32
}

// Blocks is the number of blocks in Reprs (0 when a shape is not positive).
func (a *MaxDotArgs) Blocks() int {
	per := a.KVHeads * a.M * a.Dim
	if a.KVHeads <= 0 || a.M <= 0 || a.Dim <= 0 {
		return 0
	}
	return len(a.Reprs) / per
}

// maxDotLen is how many entries MaxDotTopK writes for n blocks (UCM's TopKImpl).
func (a *MaxDotArgs) maxDotLen(n int) int {
	switch {
	case n == 0 || a.K == 0:
		return 0
	case a.Init+a.Local >= n || a.K >= n:
		return n
	}
	return a.Init + a.Local + max(a.K-a.Init-a.Local, 0)
}

// Check validates a's shapes: every error wraps ErrInvalid and names the field.
func (a *MaxDotArgs) Check() error {
	if a.QHeads <= 0 || a.KVHeads <= 0 || a.M <= 0 || a.Dim <= 0 || a.QHeads%a.KVHeads != 0 || a.QHeads > kernels.MaxHeads {
		return fmt.Errorf("maxdot retrieval: %d query heads over %d KV heads, %d rows of %d per head: %w", a.QHeads, a.KVHeads, a.M, a.Dim, ErrInvalid)
	}
	if int64(a.QHeads)*int64(a.Dim) > MaxRetrieveElems || len(a.Q) != a.QHeads*a.Dim {
		return fmt.Errorf("maxdot retrieval: q of %d values: want %d heads × %d: %w", len(a.Q), a.QHeads, a.Dim, ErrInvalid)
	}
	per := int64(a.KVHeads) * int64(a.M) * int64(a.Dim)
	if per > MaxRetrieveElems || len(a.Reprs) > MaxRetrieveElems || int64(len(a.Reprs))%per != 0 {
		return fmt.Errorf("maxdot retrieval: reprs of %d values: not whole blocks of %d: %w", len(a.Reprs), per, ErrInvalid)
	}
	if a.K < 0 || a.Init < 0 || a.Local < 0 {
		return fmt.Errorf("maxdot retrieval: topk %d, windows %d and %d: %w", a.K, a.Init, a.Local, ErrInvalid)
	}
	if n := a.maxDotLen(a.Blocks()); len(a.Out) < n {
		return fmt.Errorf("maxdot retrieval: out of %d for %d entries: %w", len(a.Out), n, ErrInvalid)
	}
	return nil
}

// MaxDotTopK runs the selection a describes on the calling goroutine and up to workers-1
// helpers (blocks in chunks) and returns how many entries of a.Out it wrote, as UCM does:
// none for no block or K 0; every block 0 … n−1 when the windows cover them or K ≥ n; else
// the Init leading blocks, the Local trailing ones, then the K − Init − Local best of the
// blocks between (score descending, ties to the lower block, NaN last) — Init + Local entries
// even when K is smaller. The means are UCM's: the group's rows summed in head order, then
// times float32(1/g); a head's maximum ignores NaN (fmax) and starts at −MaxFloat32.
func MaxDotTopK(a *MaxDotArgs, workers int) (int, error) {
	if err := a.Check(); err != nil {
		return 0, err
	}
	n, d := a.Blocks(), a.Dim
	out := a.maxDotLen(n)
	if out == 0 {
		return 0, nil
	}
	if a.Init+a.Local >= n || a.K >= n {
		for i := range n {
			a.Out[i] = int32(i)
		}
		return n, nil
	}
	g := a.QHeads / a.KVHeads
	inv := float32(1) / float32(g)
	qbar := make([]float32, a.KVHeads*d)
	for h := range a.KVHeads {
		m := qbar[h*d : (h+1)*d]
		copy(m, a.Q[h*g*d:(h*g+1)*d])
		for j := 1; j < g; j++ {
			for i, x := range a.Q[(h*g+j)*d : (h*g+j+1)*d] {
				m[i] += x
			}
		}
		for i := range m {
			m[i] *= inv
		}
	}
	ss := scoreScratchPool.Get().(*scoreScratch)
	defer scoreScratchPool.Put(ss)
	ss.scores = resize(ss.scores, n)
	scores := ss.scores
	rows := a.KVHeads * a.M
	per := rows * d
	// qrows holds each of a block's KVHeads × M rows' query (its head's mean), so that one
	// DotsF32 call (query stride Dim) scores a whole block's rows.
	qrows := qbar
	if a.M > 1 {
		qrows = make([]float32, per)
		for r := range rows {
			copy(qrows[r*d:(r+1)*d], qbar[(r/a.M)*d:(r/a.M+1)*d])
		}
	}
	perHead := func(b int, dots []float32) float32 {
		_ = kernels.DotsF32(dots, qrows, a.Reprs[b*per:(b+1)*per], d, d, d)
		var s float32
		for h := range a.KVHeads {
			best := -float32(math.MaxFloat32)
			for _, x := range dots[h*a.M : (h+1)*a.M] {
				if x > best { // fmax: a NaN never wins
					best = x
				}
			}
			s += best
		}
		return s
	}
	par.Chunks(n, max(1, (1<<20)/per), workers, func(lo, hi int) {
		dots := make([]float32, rows)
		if a.M > 1 {
			for b := lo; b < hi; b++ {
				scores[b] = perHead(b, dots)
			}
			return
		}
		// One row per head: a block's score is the dot of its KVHeads × Dim values with the
		// means end to end, the same sum in another order, at one call for the chunk. A score
		// that is not finite (a NaN or infinite product) is taken again head by head, where
		// fmax drops a NaN head and -Inf counts as -MaxFloat32.
		_ = kernels.DotsF32(scores[lo:hi], qbar, a.Reprs[lo*per:hi*per], per, 0, per)
		for b := lo; b < hi; b++ {
			if x := scores[b]; x-x != 0 {
				scores[b] = perHead(b, dots)
			}
		}
	})
	w := 0
	for i := range a.Init {
		a.Out[w] = int32(i)
		w++
	}
	for i := n - a.Local; i < n; i++ {
		a.Out[w] = int32(i)
		w++
	}
	if mid := a.K - a.Init - a.Local; mid > 0 {
		rs := rowScratchPool.Get().(*rowScratch)
		defer rowScratchPool.Put(rs)
		rs.pos, rs.sc = resize(rs.pos, mid), resize(rs.sc, mid)
		topKDesc(rs.pos, rs.sc, scores[a.Init:n-a.Local], mid, &rs.keys)
		for _, p := range rs.pos {
			a.Out[w] = p + int32(a.Init)
			w++
		}
	}
	return w, nil
}

// SoftmaxArgs is one KVStar retrieval (UCM's kvstar_retrieve AsyncRetrieveByCPU): each query
// head of each token against every representation row, a softmax per (token, head) over all
// rows, and each block scored by the probability mass of its rows summed over tokens and heads.
type SoftmaxArgs struct {
	Q []byte // fp16 (little-endian) Tokens × QHeads × QDim: the query group
	// Reprs holds fp16 Blocks × M × KVHeads × Dim: the blocks' representation rows.
	Reprs []byte
	// Channels (KVHeads × Dim, or nil) names for each KV head the query channel behind each of
	// the Dim kept dimensions (UCM's dPrunedIndex); nil: QDim must equal Dim.
	Channels                              []int64
	Tokens, QHeads, QDim, KVHeads, M, Dim int
	K                                     int
	Idx                                   []int64 // out: min(K, Blocks) block ids
}

// Blocks is the number of blocks in Reprs (0 when a shape is not positive).
func (a *SoftmaxArgs) Blocks() int {
	if a.M <= 0 || a.KVHeads <= 0 || a.Dim <= 0 {
		return 0
	}
	return len(a.Reprs) / (2 * a.M * a.KVHeads * a.Dim)
}

// Check validates a's shapes and channels: every error wraps ErrInvalid and names the field,
// or the head and column of a channel outside [0, QDim).
func (a *SoftmaxArgs) Check() error {
	if a.Tokens < 0 || a.QHeads <= 0 || a.KVHeads <= 0 || a.QHeads%a.KVHeads != 0 || a.QHeads > kernels.MaxHeads ||
		a.QDim <= 0 || a.Dim <= 0 || a.M <= 0 {
		return fmt.Errorf("softmax retrieval: %d tokens of %d query heads of %d over %d KV heads, %d rows of %d per block: %w",
			a.Tokens, a.QHeads, a.QDim, a.KVHeads, a.M, a.Dim, ErrInvalid)
	}
	nq := int64(a.Tokens) * int64(a.QHeads) * int64(a.QDim)
	if nq > MaxRetrieveElems || int64(len(a.Q)) != 2*nq {
		return fmt.Errorf("softmax retrieval: q of %d bytes: want fp16 %d × %d × %d: %w", len(a.Q), a.Tokens, a.QHeads, a.QDim, ErrInvalid)
	}
	row := int64(a.M) * int64(a.KVHeads) * int64(a.Dim)
	if row > MaxRetrieveElems || int64(len(a.Reprs)) > 2*MaxRetrieveElems || int64(len(a.Reprs))%(2*row) != 0 {
		return fmt.Errorf("softmax retrieval: reprs of %d bytes: not whole fp16 blocks of %d × %d × %d: %w", len(a.Reprs), a.M, a.KVHeads, a.Dim, ErrInvalid)
	}
	n := a.Blocks()
	if int64(a.Tokens)*int64(a.QHeads)*int64(n) > MaxRetrieveElems {
		return fmt.Errorf("softmax retrieval: %d tokens × %d heads × %d blocks: more than %d: %w", a.Tokens, a.QHeads, n, int64(MaxRetrieveElems), ErrInvalid)
	}
	if a.K < 0 || len(a.Idx) < min(a.K, n) {
		return fmt.Errorf("softmax retrieval: topk %d with an output of %d: %w", a.K, len(a.Idx), ErrInvalid)
	}
	if a.Channels == nil {
		if a.QDim != a.Dim {
			return fmt.Errorf("softmax retrieval: query dim %d, representation dim %d and no channels: %w", a.QDim, a.Dim, ErrInvalid)
		}
		return nil
	}
	if len(a.Channels) != a.KVHeads*a.Dim {
		return fmt.Errorf("softmax retrieval: %d channels: want %d KV heads × %d: %w", len(a.Channels), a.KVHeads, a.Dim, ErrInvalid)
	}
	for i, c := range a.Channels {
		if c < 0 || c >= int64(a.QDim) {
			return fmt.Errorf("softmax retrieval: channel %d (KV head %d, column %d): outside [0, %d): %w", c, i/a.Dim, i%a.Dim, a.QDim, ErrInvalid)
		}
	}
	return nil
}

// softmaxSpan is the blocks whose rows SoftmaxTopK scores together (every KV head of them in
// turn while they are in cache: 128 KiB at KVStar's usual shape); softmaxGrain the blocks of a
// claim, a multiple of the span.
const softmaxSpan, softmaxGrain = 4, 32

// SoftmaxTopK runs the retrieval a describes on the calling goroutine and up to workers-1
// helpers (the logits a span of blocks per claim, in memory order; then the softmax one token's
// KV head per claim) and returns how many ids it wrote to a.Idx:
// min(K, blocks), in score order (descending, ties to the lower block). Query head H reads KV
// head H/g (g = QHeads/KVHeads) through its channels; logits are float32 dot products of the
// fp16 values, unscaled (UCM's, no 1/√d); the softmax uses kernels.ExpColumns; a block's score
// is Σ_{token, head} Σ_{m<M} p(row). Each pair's share is kept apart and the shares are added
// in pair order, so the result does not depend on workers. UCM's module returns the same set
// in no defined order, its exponential an approximation of its own (near ties may swap).
func SoftmaxTopK(a *SoftmaxArgs, workers int) (int, error) {
	if err := a.Check(); err != nil {
		return 0, err
	}
	n := a.Blocks()
	k := min(a.K, n)
	if k == 0 {
		return 0, nil
	}
	g, d, s := a.QHeads/a.KVHeads, a.Dim, n*a.M
	pairs := a.Tokens * a.QHeads
	// The query heads as float32 through their channels: a token's KV head's g heads are
	// qs[(x·KVHeads + h)·g·d:], one run of d per head.
	qs := make([]float32, pairs*d)
	for x := range a.Tokens {
		for hq := range a.QHeads {
			base, h := (x*a.QHeads+hq)*a.QDim, hq/g
			for i := range d {
				c := i
				if a.Channels != nil {
					c = int(a.Channels[h*d+i])
				}
				qs[(x*a.QHeads+hq)*d+i] = kernels.Float16ToFloat32(uint16(a.Q[2*(base+c)]) | uint16(a.Q[2*(base+c)+1])<<8)
			}
		}
	}
	// The logits, in the order the rows lie in memory: a span of softmaxSpan blocks at a time
	// (every KV head of them), each token's KV head's g query heads against the span's rows of
	// that head, each fp16 row converted once for the group (kernels.DotsF16RowsMax). A token's
	// KV head's logits are rows of g columns (one per query head), y[(x·KVHeads + h)·s·g:]; the
	// columns' maxima over each span go to spanMax. The spans are the same whatever the
	// workers (a claim is whole spans), so each row is paired with the same neighbour in the
	// kernel and its sum is the same.
	y := make([]float32, pairs*s)
	spans := (n + softmaxSpan - 1) / softmaxSpan
	spanMax := make([]float32, spans*pairs)
	par.Chunks(n, softmaxGrain, workers, func(lo, hi int) {
		for b0 := lo; b0 < hi; b0 += softmaxSpan {
			b1 := min(b0+softmaxSpan, hi)
			r0, r1 := b0*a.M, b1*a.M
			mx := spanMax[b0/softmaxSpan*pairs:]
			for u := range a.Tokens * a.KVHeads {
				h := u % a.KVHeads
				yg := y[u*s*g:]
				_ = kernels.DotsF16RowsMax(yg[r0*g:r1*g], mx[u*g:(u+1)*g], qs[u*g*d:(u+1)*g*d], a.Reprs[2*(r0*a.KVHeads+h)*d:], g, d, d, a.KVHeads*d)
			}
		}
	})
	// The softmax of each token's query head over all rows, one token's KV head per claim: the
	// columns' exponentials and sums (kernels.ExpColumns), each block's rows summed
	// (kernels.SumRowBlocks), each block's share of each head's mass.
	share := make([]float32, pairs*n)
	par.Chunks(a.Tokens*a.KVHeads, 1, workers, func(lo, hi int) {
		bs := make([]float32, n*g)
		mx, sums := make([]float32, g), make([]float32, g)
		for u := lo; u < hi; u++ {
			for j := range mx {
				mx[j] = float32(math.Inf(-1))
			}
			for c := range spans {
				for j, v := range spanMax[c*pairs+u*g : c*pairs+(u+1)*g] {
					if v > mx[j] {
						mx[j] = v
					}
				}
			}
			yg := y[u*s*g : (u+1)*s*g]
			clear(sums)
			_ = kernels.ExpColumns(yg, mx, sums)
			_ = kernels.SumRowBlocks(bs, yg, g, a.M)
			for j := range g {
				inv := 1 / sums[j]
				out := share[(u*g+j)*n : (u*g+j+1)*n]
				for b := range out {
					out[b] = bs[b*g+j] * inv
				}
			}
		}
	})
	scores := make([]float32, n)
	for p := range pairs {
		for b, v := range share[p*n : (p+1)*n] {
			scores[b] += v
		}
	}
	pos := make([]int32, k)
	sc := make([]float32, k)
	var keys []uint64
	topKDesc(pos, sc, scores, k, &keys)
	for i, b := range pos {
		a.Idx[i] = int64(b)
	}
	return k, nil
}

// MaxDotBatch is a batch of GSA offload selections over one representation array (UCM's
// CalKpreAndTopk for one layer: each decode request's query against its own blocks).
type MaxDotBatch struct {
	Q []float32 // Batch × QHeads × Dim: the requests' queries (read, never written)
	// Reprs holds the blocks' rows, block-major: Blocks × KVHeads × M × Dim.
	Reprs                   []float32
	QHeads, KVHeads, M, Dim int
	// Cand holds Batch rows of Width block numbers of Reprs: a request's blocks are its row's
	// entries that are not -1, in order (positions in the selection are positions in that
	// list). nil: every block of Reprs, in order, for every request (Width is then ignored).
	Cand  []int32
	Width int
	// K holds each request's selection length (UCM's topk_lens); Init and Local the windows.
	K           []int32
	Init, Local int
	// Out holds Batch rows of OutWidth entries: row b's first Count[b] entries are request b's
	// selection in UCM's order (MaxDotTopK); the rest of the row is left as it was. Count may
	// be nil.
	Out      []int32
	OutWidth int
	Count    []int64
}

// Batch is the number of requests (0 when a shape is not positive).
func (b *MaxDotBatch) Batch() int {
	if b.QHeads <= 0 || b.Dim <= 0 {
		return 0
	}
	return len(b.Q) / (b.QHeads * b.Dim)
}

// row returns request i's MaxDotArgs over Reprs when its blocks are a run of consecutive
// blocks (or all), else over a gathered copy.
func (b *MaxDotBatch) row(i int) *MaxDotArgs {
	per, qn := b.KVHeads*b.M*b.Dim, b.QHeads*b.Dim
	a := &MaxDotArgs{Q: b.Q[i*qn : (i+1)*qn], QHeads: b.QHeads, KVHeads: b.KVHeads, M: b.M, Dim: b.Dim,
		K: int(b.K[i]), Init: b.Init, Local: b.Local, Out: b.Out[i*b.OutWidth : (i+1)*b.OutWidth]}
	if b.Cand == nil {
		a.Reprs = b.Reprs
		return a
	}
	var blocks []int32
	run := true
	for _, c := range b.Cand[i*b.Width : (i+1)*b.Width] {
		if c < 0 {
			continue
		}
		if len(blocks) > 0 && c != blocks[len(blocks)-1]+1 {
			run = false
		}
		blocks = append(blocks, c)
	}
	switch {
	case len(blocks) == 0:
		a.Reprs = nil
	case run:
		a.Reprs = b.Reprs[int(blocks[0])*per : (int(blocks[len(blocks)-1])+1)*per]
	default:
		a.Reprs = make([]float32, 0, len(blocks)*per)
		for _, c := range blocks {
			a.Reprs = append(a.Reprs, b.Reprs[int(c)*per:(int(c)+1)*per]...)
		}
	}
	return a
}

// blocksOf is how many blocks request i selects among.
func (b *MaxDotBatch) blocksOf(i int) int {
	if b.Cand == nil {
		return len(b.Reprs) / (b.KVHeads * b.M * b.Dim)
	}
	n := 0
	for _, c := range b.Cand[i*b.Width : (i+1)*b.Width] {
		if c >= 0 {
			n++
		}
	}
	return n
}

// Check validates b's shapes, candidates and output room: every error wraps ErrInvalid and
// names the field, or the request (row) and column at fault.
func (b *MaxDotBatch) Check() error {
	if b.QHeads <= 0 || b.KVHeads <= 0 || b.M <= 0 || b.Dim <= 0 || b.QHeads%b.KVHeads != 0 || b.QHeads > kernels.MaxHeads {
		return fmt.Errorf("maxdot retrieval: %d query heads over %d KV heads, %d rows of %d per head: %w", b.QHeads, b.KVHeads, b.M, b.Dim, ErrInvalid)
	}
	qn := int64(b.QHeads) * int64(b.Dim)
	if qn > MaxRetrieveElems || len(b.Q) > MaxRetrieveElems || int64(len(b.Q))%qn != 0 {
		return fmt.Errorf("maxdot retrieval: q of %d values: not whole requests of %d heads × %d: %w", len(b.Q), b.QHeads, b.Dim, ErrInvalid)
	}
	per := int64(b.KVHeads) * int64(b.M) * int64(b.Dim)
	if per > MaxRetrieveElems || len(b.Reprs) > MaxRetrieveElems || int64(len(b.Reprs))%per != 0 {
		return fmt.Errorf("maxdot retrieval: reprs of %d values: not whole blocks of %d: %w", len(b.Reprs), per, ErrInvalid)
	}
	if b.Init < 0 || b.Local < 0 || b.Init > MaxRetrieveElems || b.Local > MaxRetrieveElems {
		return fmt.Errorf("maxdot retrieval: windows %d and %d: %w", b.Init, b.Local, ErrInvalid)
	}
	n, blocks := b.Batch(), int(int64(len(b.Reprs))/per)
	if len(b.K) != n {
		return fmt.Errorf("maxdot retrieval: %d topk lengths for %d requests: %w", len(b.K), n, ErrInvalid)
	}
	if b.OutWidth < 0 || int64(b.OutWidth)*int64(n) > MaxRetrieveElems || len(b.Out) < n*b.OutWidth {
		return fmt.Errorf("maxdot retrieval: out of %d for %d requests of width %d: %w", len(b.Out), n, b.OutWidth, ErrInvalid)
	}
	if b.Count != nil && len(b.Count) < n {
		return fmt.Errorf("maxdot retrieval: count of %d for %d requests: %w", len(b.Count), n, ErrInvalid)
	}
	if b.Cand != nil {
		if b.Width < 0 || int64(b.Width)*int64(n) != int64(len(b.Cand)) {
			return fmt.Errorf("maxdot retrieval: %d candidates: not %d requests of width %d: %w", len(b.Cand), n, b.Width, ErrInvalid)
		}
		for i, c := range b.Cand {
			if c < -1 || int(c) >= blocks {
				return fmt.Errorf("maxdot retrieval: block %d (request %d, column %d): outside [-1, %d): %w", c, i/b.Width, i%b.Width, blocks, ErrInvalid)
			}
		}
	}
	for i, k := range b.K {
		if k < 0 {
			return fmt.Errorf("maxdot retrieval: topk %d of request %d: %w", k, i, ErrInvalid)
		}
		a := MaxDotArgs{K: int(k), Init: b.Init, Local: b.Local}
		if need := a.maxDotLen(b.blocksOf(i)); need > b.OutWidth {
			return fmt.Errorf("maxdot retrieval: request %d selects %d entries (topk %d of %d blocks): its out row has %d: %w", i, need, k, b.blocksOf(i), b.OutWidth, ErrInvalid)
		}
	}
	return nil
}

// MaxDotBatchTopK runs MaxDotTopK for each request of b in turn (each on the calling goroutine
// and up to workers-1 helpers), writing the selections into b.Out's rows and their lengths
// into b.Count. It checks b first (MaxDotBatch.Check) and writes nothing when that fails.
func MaxDotBatchTopK(b *MaxDotBatch, workers int) error {
	if err := b.Check(); err != nil {
		return err
	}
	for i := range b.Batch() {
		n, err := MaxDotTopK(b.row(i), workers)
		if err != nil {
			return fmt.Errorf("maxdot retrieval: request %d: %w", i, err)
		}
		if b.Count != nil {
			b.Count[i] = int64(n)
		}
	}
	return nil
}
