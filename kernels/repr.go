package kernels

import (
	"math"
	"slices"
	"sync"

	"github.com/ucm-go/ucm/internal/reuse"
)

// Representation kernels: what a sparse-attention method keeps of a block's keys so that a
// decode step can score the block without loading it. They run on one block's staged K for one
// layer, [tokens][heads][dim] elements of a DType, token-major and contiguous (see KShape), at
// dump time, and write float32. The sidecar payloads (sidecar.go) store their output.
//
// NaN in the keys propagates: a mean, min, max or merged row that saw a NaN is NaN. Accumulation
// is in float64, so a mean of identical keys is exactly the key, whatever the dtype.

// Limits of a representation kernel's input shape. They bound every allocation a kernel or a
// sidecar decoder makes and fit the sidecar header's 16-bit fields.
const (
	// MaxBlockTokens is the largest block (tokens per block) a kernel or sidecar accepts.
	MaxBlockTokens = 1 << 15
	// MaxHeads is the most heads: KV heads of K, query heads of ReduceGQA and ReduceStrided.
	MaxHeads = 1024
	// MaxDim is the largest head dimension.
	MaxDim = 4096
	// MaxHeadElems bounds heads × dim, the elements of one token's keys.
	MaxHeadElems = 1 << 16
)

// KShape is the shape of one block's staged K for one layer: Tokens rows of Heads × Dim
// elements, token-major and contiguous ([tokens][heads][dim]). Tokens may be less than the
// block size for the last, partial block of a sequence.
type KShape struct {
	Tokens, Heads, Dim int
}

// Elems is Tokens·Heads·Dim.
func (s KShape) Elems() int { return s.Tokens * s.Heads * s.Dim }

// Validate checks the shape against the limits (1 ≤ Tokens ≤ MaxBlockTokens, 1 ≤ Heads ≤
// MaxHeads, 1 ≤ Dim ≤ MaxDim, Heads·Dim ≤ MaxHeadElems) and returns ErrInvalid naming the field
// at fault.
func (s KShape) Validate() error {
	switch {
	case s.Tokens < 1 || s.Tokens > MaxBlockTokens:
		return errorf(ErrInvalid, "K shape: tokens %d not in [1, %d]", s.Tokens, MaxBlockTokens)
	case s.Heads < 1 || s.Heads > MaxHeads:
		return errorf(ErrInvalid, "K shape: heads %d not in [1, %d]", s.Heads, MaxHeads)
	case s.Dim < 1 || s.Dim > MaxDim:
		return errorf(ErrInvalid, "K shape: dim %d not in [1, %d]", s.Dim, MaxDim)
	case s.Heads*s.Dim > MaxHeadElems:
		return errorf(ErrInvalid, "K shape: heads×dim %d×%d over %d", s.Heads, s.Dim, MaxHeadElems)
	}
	return nil
}

// checkK validates the shape, the dtype and the byte length of k.
func checkK(what string, k []byte, dt DType, s KShape) error {
	if err := s.Validate(); err != nil {
		return errorf(ErrInvalid, "%s: %s", what, plain(err))
	}
	if !dt.Valid() {
		return errorf(ErrInvalid, "%s: K dtype %v", what, dt)
	}
	if len(k) != s.Elems()*dt.Size() {
		return errorf(ErrInvalid, "%s: K is %d bytes, shape [%d][%d][%d] of %v is %d", what, len(k), s.Tokens, s.Heads, s.Dim, dt, s.Elems()*dt.Size())
	}
	return nil
}

func checkDst(what, name string, n, want int) error {
	if n != want {
		return errorf(ErrInvalid, "%s: %s has %d elements, want %d", what, name, n, want)
	}
	return nil
}

// scratch holds a kernel's temporaries; kernels take one from scratchPool and return it, so
// they do not allocate in steady state.
type scratch struct {
	row    []float32
	f32    []float32
	acc    []float64
	acc2   []float64
	sorted []float64
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch   { return scratchPool.Get().(*scratch) }
func putScratch(sc *scratch) { scratchPool.Put(sc) }

// ESAPool computes ESA's block representations of one layer: mean[h][d] is the mean over the
// block's tokens of K[t][h][d], max[h][d] their maximum ([heads][dim] each). Either output may
// be nil (not computed); a non-nil one must have Heads·Dim elements. A partial block is pooled
// over the tokens it has. Mean of identical keys is exactly the key; max ≥ mean elementwise.
func ESAPool(mean, max []float32, k []byte, dt DType, s KShape) error {
	return esaPool(mean, max, k, dt, s)
}

func esaPool(mean, mx []float32, k []byte, dt DType, s KShape) error {
	const what = "ESA pool"
	if err := checkK(what, k, dt, s); err != nil {
		return err
	}
	n := s.Heads * s.Dim
	if mean == nil && mx == nil {
		return errorf(ErrInvalid, "%s: no output", what)
	}
	if mean != nil {
		if err := checkDst(what, "mean", len(mean), n); err != nil {
			return err
		}
	}
	if mx != nil {
		if err := checkDst(what, "max", len(mx), n); err != nil {
			return err
		}
	}
	sc := getScratch()
	defer putScratch(sc)
	sc.row = reuse.Grow(sc.row, n)
	row := sc.row
	var acc []float64
	if mean != nil {
		sc.acc = reuse.Grow(sc.acc, n)
		acc = sc.acc
	}
	stride := n * dt.Size()
	for t := range s.Tokens {
		decodeRow(row, k[t*stride:(t+1)*stride], dt)
		if acc != nil {
			acc := acc[:len(row)]
			for i, v := range row {
				acc[i] += float64(v)
			}
		}
		if mx != nil {
			if t == 0 {
				copy(mx, row)
				continue
			}
			mx := mx[:len(row)]
			for i, v := range row {
				mx[i] = max(mx[i], v) // NaN propagates
			}
		}
	}
	if mean != nil {
		tokens := float64(s.Tokens)
		for i, a := range acc {
			mean[i] = float32(a / tokens)
		}
	}
	return nil
}

// QuestMinMax computes Quest's block representation of one layer: dst holds [2][heads][dim],
// first the per-channel minimum over the block's tokens, then the per-channel maximum. dst must
// have 2·Heads·Dim elements.
func QuestMinMax(dst []float32, k []byte, dt DType, s KShape) error {
	const what = "Quest min/max"
	if err := checkK(what, k, dt, s); err != nil {
		return err
	}
	n := s.Heads * s.Dim
	if err := checkDst(what, "dst", len(dst), 2*n); err != nil {
		return err
	}
	lo, hi := dst[:n], dst[n:2*n]
	stride := n * dt.Size()
	decodeRow(lo, k[:stride], dt)
	copy(hi, lo)
	sc := getScratch()
	defer putScratch(sc)
	sc.row = reuse.Grow(sc.row, n)
	row := sc.row
	for t := 1; t < s.Tokens; t++ {
		decodeRow(row, k[t*stride:(t+1)*stride], dt)
		lo, hi := lo[:len(row)], hi[:len(row)]
		for i, v := range row {
			lo[i] = min(lo[i], v) // NaN propagates
			hi[i] = max(hi[i], v)
		}
	}
	return nil
}

// QuestBound is Quest's upper bound on q·k for any key k of a block whose per-channel minimum
// and maximum are lo and hi: Σ_d max(q_d·lo_d, q_d·hi_d), accumulated in float64. For several
// heads pass the [heads][dim] slices flattened: the bound is then the sum of the per-head
// bounds. It returns NaN when lo or hi is shorter than q.
func QuestBound(q, lo, hi []float32) float32 {
	if len(lo) < len(q) || len(hi) < len(q) {
		return float32(math.NaN())
	}
	lo, hi = lo[:len(q)], hi[:len(q)]
	var s float64
	for i, x := range q {
		a, b := x*lo[i], x*hi[i]
		if b > a {
			a = b
		}
		s += float64(a)
	}
	return float32(s)
}

// KVStarParams configures KVStar's compressed block representation (docs/sparse-sources.md
// §5).
type KVStarParams struct {
	// BlockSize is the tokens of a full block: a multiple of Merge, at most MaxBlockTokens.
	BlockSize int
	// PruneRatio is the fraction of each head's channels kept, in (0, 1]: d' =
	// round(dim·PruneRatio) (ties to even, as Python's round), at least 1. A ratio ≥ 0.98
	// keeps every channel (no pruning), as UCM does.
	PruneRatio float64
	// Merge is the number of consecutive tokens averaged into one row, ≥ 1.
	Merge int
}

// noPruneRatio is the ratio from which KVStar keeps every channel (docs/sparse-sources.md §5).
const noPruneRatio = 0.98

// Validate checks the parameters for keys of head dimension dim and returns ErrInvalid naming
// the field at fault.
func (p KVStarParams) Validate(dim int) error {
	switch {
	case p.BlockSize < 1 || p.BlockSize > MaxBlockTokens:
		return errorf(ErrInvalid, "KVStar: block size %d not in [1, %d]", p.BlockSize, MaxBlockTokens)
	case p.Merge < 1 || p.Merge > p.BlockSize:
		return errorf(ErrInvalid, "KVStar: merge %d not in [1, block size %d]", p.Merge, p.BlockSize)
	case p.BlockSize%p.Merge != 0:
		return errorf(ErrInvalid, "KVStar: block size %d not a multiple of merge %d", p.BlockSize, p.Merge)
	case !(p.PruneRatio > 0 && p.PruneRatio <= 1):
		return errorf(ErrInvalid, "KVStar: prune ratio %v not in (0, 1]", p.PruneRatio)
	case dim < 1 || dim > MaxDim:
		return errorf(ErrInvalid, "KVStar: dim %d not in [1, %d]", dim, MaxDim)
	case p.KeptDims(dim) < 1:
		return errorf(ErrInvalid, "KVStar: prune ratio %v keeps no channel of %d", p.PruneRatio, dim)
	}
	return nil
}

// KeptDims is d', the channels kept per head of dim: dim when PruneRatio ≥ 0.98, else
// round(dim·PruneRatio) with ties to even.
func (p KVStarParams) KeptDims(dim int) int {
	if p.PruneRatio >= noPruneRatio {
		return dim
	}
	return int(math.RoundToEven(float64(dim) * p.PruneRatio))
}

// Rows is the merged rows of a block of the given tokens, ⌈tokens/Merge⌉ (BlockSize/Merge for
// a full block), or 0 for invalid parameters.
func (p KVStarParams) Rows(tokens int) int {
	if p.Merge < 1 || tokens < 0 {
		return 0
	}
	return (tokens + p.Merge - 1) / p.Merge
}

// KVStar computes KVStar's representation of one layer of one block (docs/sparse-sources.md
// §5, per block):
//
//   - channels ([heads][d'], ascending within each head): each head's d' channels with the
//     largest mean |k| over this block's tokens, ties to the lower channel (a NaN mean ranks
//     last); all channels 0…dim−1 when PruneRatio ≥ 0.98. Channels are chosen per block, so a
//     block's sidecar is self-contained (UCM chooses them over the n blocks extracted together).
//   - dst ([Rows(tokens)][heads][d']): row m is the mean over tokens m·Merge … m·Merge+Merge−1
//     of the kept channels. A partial last block (tokens < BlockSize) has ⌈tokens/Merge⌉ rows,
//     its last row averaging the tokens it has.
//
// s.Tokens must be at most p.BlockSize. With Merge 1 and no pruning, dst is the keys in float32.
func KVStar(dst []float32, channels []uint16, k []byte, dt DType, s KShape, p KVStarParams) error {
	const what = "KVStar"
	if err := checkK(what, k, dt, s); err != nil {
		return err
	}
	if err := p.Validate(s.Dim); err != nil {
		return err
	}
	if s.Tokens > p.BlockSize {
		return errorf(ErrInvalid, "%s: %d tokens in a block of %d", what, s.Tokens, p.BlockSize)
	}
	kept := p.KeptDims(s.Dim)
	rows := p.Rows(s.Tokens)
	n := s.Heads * s.Dim
	if err := checkDst(what, "channels", len(channels), s.Heads*kept); err != nil {
		return err
	}
	if err := checkDst(what, "dst", len(dst), rows*s.Heads*kept); err != nil {
		return err
	}
	prune := kept < s.Dim

	sc := getScratch()
	defer putScratch(sc)
	sc.row = reuse.Grow(sc.row, n)
	sc.acc = reuse.Grow(sc.acc, n) // group sums
	row, group := sc.row, sc.acc
	var abs []float64
	if prune {
		sc.acc2 = reuse.Grow(sc.acc2, n)
		abs = sc.acc2
	}
	// Without pruning the merged rows go straight to dst; with it, to a full-width buffer
	// gathered once the channels are known.
	merged := dst
	if prune {
		sc.f32 = reuse.Grow(sc.f32, rows*n)
		merged = sc.f32
	}
	stride := n * dt.Size()
	m := 0
	for t := range s.Tokens {
		decodeRow(row, k[t*stride:(t+1)*stride], dt)
		g := group[:len(row)]
		for i, v := range row {
			g[i] += float64(v)
		}
		if prune {
			a := abs[:len(row)]
			for i, v := range row {
				a[i] += math.Abs(float64(v))
			}
		}
		if (t+1)%p.Merge == 0 || t == s.Tokens-1 {
			cnt := float64(t - m*p.Merge + 1)
			out := merged[m*n : (m+1)*n]
			for i, v := range g {
				out[i] = float32(v / cnt)
				g[i] = 0
			}
			m++
		}
	}
	if !prune {
		for h := range s.Heads {
			for d := range s.Dim {
				channels[h*s.Dim+d] = uint16(d)
			}
		}
		return nil
	}
	sc.sorted = reuse.Grow(sc.sorted, s.Dim)
	sorted := sc.sorted
	for h := range s.Heads {
		keepTop(channels[h*kept:(h+1)*kept], abs[h*s.Dim:(h+1)*s.Dim], sorted)
	}
	for r := range rows {
		for h := range s.Heads {
			src := merged[r*n+h*s.Dim : r*n+(h+1)*s.Dim]
			out := dst[(r*s.Heads+h)*kept : (r*s.Heads+h+1)*kept]
			for j, c := range channels[h*kept : (h+1)*kept] {
				out[j] = src[c]
			}
		}
	}
	return nil
}

// keepTop writes to ch, in ascending order, the len(ch) channels with the largest sums, ties
// to the lower channel, NaN ranking below every number. sorted is scratch of len(sums).
//
// Instead of sorting channels by (sum, channel), it sorts the sums alone to find the
// threshold τ, the len(ch)-th largest, then takes in channel order every channel above τ and
// the lowest channels equal to τ.
func keepTop(ch []uint16, sums, sorted []float64) {
	copy(sorted, sums)
	slices.Sort(sorted) // ascending, NaNs first
	tau := sorted[len(sums)-len(ch)]
	nan := tau != tau
	above := func(x float64) bool { return x > tau || nan && x == x }
	equal := func(x float64) bool { return x == tau || nan && x != x }
	ties := len(ch)
	for _, x := range sums {
		if above(x) {
			ties--
		}
	}
	j := 0
	for d, x := range sums {
		if above(x) || ties > 0 && equal(x) {
			if !above(x) {
				ties--
			}
			ch[j] = uint16(d)
			j++
		}
	}
}

// ReduceGQA prepares grouped-query-attention queries for per-KV-head scoring: q is
// [qHeads][dim], dst [kvHeads][dim], and dst head j is the mean of the G = qHeads/kvHeads
// contiguous query heads jG … jG+G−1 (the heads sharing KV head j). qHeads must be a multiple
// of kvHeads.
func ReduceGQA(dst, q []float32, qHeads, kvHeads, dim int) error {
	if kvHeads < 1 || qHeads < kvHeads || qHeads%kvHeads != 0 || dim < 1 || qHeads > MaxHeads || dim > MaxDim {
		return errorf(ErrInvalid, "GQA reduction: %d query heads onto %d KV heads of dim %d", qHeads, kvHeads, dim)
	}
	if len(q) != qHeads*dim || len(dst) != kvHeads*dim {
		return errorf(ErrInvalid, "GQA reduction: q has %d elements (want %d), dst %d (want %d)", len(q), qHeads*dim, len(dst), kvHeads*dim)
	}
	g := qHeads / kvHeads
	for j := range kvHeads {
		out := dst[j*dim : (j+1)*dim]
		for d := range out {
			var s float64
			for i := range g {
				s += float64(q[(j*g+i)*dim+d])
			}
			out[d] = float32(s / float64(g))
		}
	}
	return nil
}

// ReduceStrided is MLA's optional query-head reduction (reduction_head_num r): q is
// [heads][dim], dst [heads/r][dim], and dst head j is the mean of the r heads j + i·heads/r,
// i = 0 … r−1 (torch: q.view(r, heads/r, dim).mean(0)). heads must be a multiple of r.
func ReduceStrided(dst, q []float32, heads, r, dim int) error {
	if r < 1 || heads < r || heads%r != 0 || dim < 1 || heads > MaxHeads || dim > MaxDim {
		return errorf(ErrInvalid, "strided reduction: %d heads by %d of dim %d", heads, r, dim)
	}
	out := heads / r
	if len(q) != heads*dim || len(dst) != out*dim {
		return errorf(ErrInvalid, "strided reduction: q has %d elements (want %d), dst %d (want %d)", len(q), heads*dim, len(dst), out*dim)
	}
	for j := range out {
		o := dst[j*dim : (j+1)*dim]
		for d := range o {
			var s float64
			for i := range r {
				s += float64(q[(j+i*out)*dim+d])
			}
			o[d] = float32(s / float64(r))
		}
	}
	return nil
}
