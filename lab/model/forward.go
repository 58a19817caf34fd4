package model

import (
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ucm-go/ucm/kernels"
)

// Hooks are optional callbacks into a forward step, for sparse attention and analysis. A nil
// *Hooks or nil field does nothing.
type Hooks struct {
	// Queries, when set, is called once per layer with the step's queries after RoPE:
	// q[t·QDim + h·HeadDim + d] for token t (at positions[t]) and query head h. q is only valid
	// during the call.
	Queries func(layer int, positions []int, q []float32)
	// SelectBlocks, when set, is called for a one-token step (decode) once per layer and
	// chooses the logical blocks (indexes into seq.Blocks) the step attends to; q is that
	// token's queries after RoPE ([Heads·HeadDim], valid during the call). The block holding
	// the current position is always attended (added when missing); indexes out of range or
	// beyond the current position's block are ErrInvalid. Returning nil attends to all.
	// Multi-token steps (prefill) always attend densely.
	SelectBlocks func(layer int, position int, q []float32, seq *Sequence) []int
	// SelectHeadBlocks, when set and SelectBlocks is not, is SelectBlocks per KV head: it
	// returns [KVHeads] selections, each one's query heads attending its blocks (the current
	// block added) — per-head sparse attention. A nil result, or a nil head, attends to all;
	// a result of another length is ErrInvalid.
	SelectHeadBlocks func(layer int, position int, q []float32, seq *Sequence) [][]int
	// BeforeAttention, when set, is called in every layer before its attention reads the
	// cache's K/V of earlier positions. A connector that loads stored blocks layer by layer
	// waits there for the layer to be resident, so the compute of a layer overlaps the loads of
	// the next ones. An error ends the step and is returned (the cache may hold the step's K/V
	// of the layers before).
	BeforeAttention func(layer int) error
}

// Forward runs tokens (byte values for the byte-level model) at positions through the model
// with seq's K/V in c, writes the tokens' K/V into c through seq's slot mapping, and returns
// the logits, [len(tokens)][Vocab] row-major.
//
// positions must be contiguous (positions[i] = positions[0] + i) and start at or before
// seq.Len (a step may recompute a tail), and seq's block table must cover them (Reserve grows
// it): the tokens attend to positions [0, positions[i]] of the sequence. A prefill is one call
// with many tokens, a decode step one call with one; both compute bit-identical logits, and so
// does any split of a prompt into chunks or any assignment of physical blocks.
func (m *Model) Forward(c *KVCache, seq *Sequence, tokens []int, positions []int) ([]float32, error) {
	return m.ForwardHooks(c, seq, tokens, positions, nil)
}

// ForwardHooks is Forward with hooks (see Hooks).
func (m *Model) ForwardHooks(c *KVCache, seq *Sequence, tokens []int, positions []int, h *Hooks) ([]float32, error) {
	cfg := m.cfg
	T := len(tokens)
	if err := m.checkStep(c, seq, tokens, positions); err != nil {
		return nil, err
	}
	slots, err := seq.SlotMapping(c, positions)
	if err != nil {
		return nil, err
	}
	// Every position attended ([0, last]) must map to a valid block.
	last := positions[T-1]
	for lb := 0; lb <= last/c.blockSize; lb++ {
		if b := seq.Blocks[lb]; b < 0 || b >= c.numBlocks {
			return nil, invalid("block table entry %d is block %d, not in [0, %d)", lb, b, c.numBlocks)
		}
	}

	d := cfg.DModel
	x := make([]float32, T*d)
	for t, tok := range tokens {
		copy(x[t*d:(t+1)*d], m.embed[tok*d:(tok+1)*d])
	}
	cos, sin := ropeTables(cfg, positions)
	hbuf := make([]float32, T*d)
	q := make([]float32, T*cfg.QDim())
	k := make([]float32, T*cfg.KVDim())
	v := make([]float32, T*cfg.KVDim())
	att := make([]float32, T*cfg.QDim())
	gate := make([]float32, T*cfg.FFNDim)
	up := make([]float32, T*cfg.FFNDim)
	proj := make([]float32, T*d)
	for li := range m.layers {
		l := &m.layers[li]
		rmsNorm(hbuf, x, l.attnNorm, d, cfg.NormEps)
		matmul(q, hbuf, l.wq, T, d, cfg.QDim())
		matmul(k, hbuf, l.wk, T, d, cfg.KVDim())
		matmul(v, hbuf, l.wv, T, d, cfg.KVDim())
		rope(q, cos, sin, T, cfg.Heads, cfg.HeadDim)
		rope(k, cos, sin, T, cfg.KVHeads, cfg.HeadDim)
		writeKV(c, li, slots, k, v)
		if h != nil && h.Queries != nil {
			h.Queries(li, positions, q)
		}
		var sel [][]int // per KV head; nil: dense
		if T == 1 && h != nil && (h.SelectBlocks != nil || h.SelectHeadBlocks != nil) {
			if sel, err = m.stepSelection(h, li, positions[0], q, seq, positions[0]/c.blockSize); err != nil {
				return nil, err
			}
		}
		if h != nil && h.BeforeAttention != nil {
			if err := h.BeforeAttention(li); err != nil {
				return nil, err
			}
		}
		m.attention(att, q, c, li, seq, positions, sel)
		matmul(proj, att, l.wo, T, cfg.QDim(), d)
		addTo(x, proj)
		rmsNorm(hbuf, x, l.ffnNorm, d, cfg.NormEps)
		matmul(gate, hbuf, l.gate, T, d, cfg.FFNDim)
		matmul(up, hbuf, l.up, T, d, cfg.FFNDim)
		for i, g := range gate {
			gate[i] = silu(g) * up[i]
		}
		matmul(proj, gate, l.down, T, cfg.FFNDim, d)
		addTo(x, proj)
	}
	rmsNorm(hbuf, x, m.norm, d, cfg.NormEps)
	logits := make([]float32, T*cfg.Vocab)
	matmul(logits, hbuf, m.output, T, d, cfg.Vocab)
	seq.Len = max(seq.Len, last+1)
	return logits, nil
}

// checkStep checks a step's arguments: as many positions as tokens (at least one), contiguous
// and starting at or before seq.Len; tokens in the vocabulary; a cache of the model's shape.
func (m *Model) checkStep(c *KVCache, seq *Sequence, tokens, positions []int) error {
	cfg := m.cfg
	T := len(tokens)
	if T == 0 || len(positions) != T {
		return invalid("%d tokens at %d positions", T, len(positions))
	}
	if c == nil || seq == nil {
		return invalid("nil cache or sequence")
	}
	if c.Layers() != cfg.Layers || c.kvHeads != cfg.KVHeads || c.headDim != cfg.HeadDim {
		return invalid("cache of %d layers × %d KV heads × %d does not fit the model's %d × %d × %d",
			c.Layers(), c.kvHeads, c.headDim, cfg.Layers, cfg.KVHeads, cfg.HeadDim)
	}
	if seq.Len < 0 || positions[0] < 0 || positions[0] > seq.Len {
		return invalid("first position %d with %d positions cached", positions[0], seq.Len)
	}
	for i, p := range positions {
		if p != positions[0]+i {
			return invalid("positions not contiguous at %d: %d after %d", i, p, positions[0])
		}
	}
	for i, t := range tokens {
		if t < 0 || t >= cfg.Vocab {
			return invalid("token %d at %d not in [0, %d)", t, i, cfg.Vocab)
		}
	}
	return nil
}

// stepSelection asks the hooks for a one-token step's blocks, per KV head (nil: dense).
func (m *Model) stepSelection(h *Hooks, li, pos int, q []float32, seq *Sequence, cur int) ([][]int, error) {
	kvh := m.cfg.KVHeads
	if h.SelectBlocks != nil {
		one, err := selectedBlocks(h.SelectBlocks(li, pos, q, seq), cur)
		if one == nil || err != nil {
			return nil, err
		}
		sel := make([][]int, kvh)
		for i := range sel {
			sel[i] = one
		}
		return sel, nil
	}
	hs := h.SelectHeadBlocks(li, pos, q, seq)
	if hs == nil {
		return nil, nil
	}
	if len(hs) != kvh {
		return nil, invalid("%d head selections for %d KV heads", len(hs), kvh)
	}
	sel := make([][]int, kvh)
	for i, s := range hs {
		var err error
		if sel[i], err = selectedBlocks(s, cur); err != nil {
			return nil, err
		}
	}
	return sel, nil
}

// selectedBlocks sorts and deduplicates a block selection and adds the current block.
func selectedBlocks(sel []int, cur int) ([]int, error) {
	if sel == nil {
		return nil, nil
	}
	out := append(make([]int, 0, len(sel)+1), sel...)
	out = append(out, cur)
	slices.Sort(out)
	out = slices.Compact(out)
	if out[0] < 0 || out[len(out)-1] > cur {
		return nil, invalid("selected blocks %v not in [0, %d]", sel, cur)
	}
	return out, nil
}

// Generate appends prompt to seq (reserving blocks from c as needed) and then n greedily
// decoded tokens, one at a time, and returns the n generated bytes (byte-level models only).
func (m *Model) Generate(c *KVCache, seq *Sequence, prompt []byte, n int) ([]byte, error) {
	if m.cfg.Vocab != 256 {
		return nil, invalid("Generate needs a byte-level model (vocab 256), not %d", m.cfg.Vocab)
	}
	if len(prompt) == 0 || n < 0 {
		return nil, invalid("prompt of %d bytes, %d to generate", len(prompt), n)
	}
	if err := seq.Reserve(c, seq.Len+len(prompt)+n); err != nil {
		return nil, err
	}
	toks := make([]int, len(prompt))
	pos := make([]int, len(prompt))
	for i, b := range prompt {
		toks[i], pos[i] = int(b), seq.Len+i
	}
	logits, err := m.Forward(c, seq, toks, pos)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, n)
	row := logits[len(logits)-m.cfg.Vocab:]
	for len(out) < n {
		next := Argmax(row)
		out = append(out, byte(next))
		if len(out) == n {
			break
		}
		row, err = m.Forward(c, seq, []int{next}, []int{seq.Len})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Argmax is the index of the largest value (the first of equals), or -1 for an empty slice.
func Argmax(row []float32) int {
	best := -1
	for i, v := range row {
		if best < 0 || v > row[best] {
			best = i
		}
	}
	return best
}

// ---------------------------------------------------------------------------------------------
// Kernels. Every output element is computed by the same sequence of float32 operations
// whatever the number of tokens in the step and however the work is split among goroutines,
// which is what makes chunked and token-by-token prefill bit-identical.

// workers is how many goroutines a kernel may use.
func workers() int { return runtime.GOMAXPROCS(0) }

// parallel runs fn over [0, n) in chunks of grain on up to workers() goroutines; fn gets a
// worker index in [0, workers()) for per-worker scratch. Small jobs run inline.
func parallel(n, grain int, fn func(w, lo, hi int)) {
	nw := min(workers(), (n+grain-1)/grain)
	if nw <= 1 {
		fn(0, 0, n)
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range nw {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(int64(grain))) - grain
				if lo >= n {
					return
				}
				fn(w, lo, min(lo+grain, n))
			}
		}()
	}
	wg.Wait()
}

// matmul computes out[t][o] = Σ_i x[t][i]·w[o][i] for x [T][in] and w [out][in] (torch's Linear
// weight). Rows of w are taken four at a time against two tokens at a time (each loaded value
// used four or two times), a block of 16 rows staying in cache while every token passes
// through it. Every element is the sequential sum over i, whichever kernel computes it.
func matmul(out, x, w []float32, T, in, outDim int) {
	const rowsPerTask = 16
	grain := 1
	if T*in < 1<<14 { // small steps (decode): bigger tasks, fewer goroutine hand-offs
		grain = 4
	}
	tasks := (outDim + rowsPerTask - 1) / rowsPerTask
	if T*in*outDim < 1<<16 {
		grain = tasks
	}
	parallel(tasks, grain, func(_, lo, hi int) {
		for o0 := lo * rowsPerTask; o0 < min(hi*rowsPerTask, outDim); o0 += rowsPerTask {
			o1 := min(o0+rowsPerTask, outDim)
			t := 0
			for ; t+2 <= T; t += 2 {
				xa, xb := x[t*in:(t+1)*in], x[(t+1)*in:(t+2)*in]
				oa, ob := out[t*outDim:(t+1)*outDim], out[(t+1)*outDim:(t+2)*outDim]
				o := o0
				for ; o+4 <= o1; o += 4 {
					r := dot2x4(xa, xb, w[o*in:(o+1)*in], w[(o+1)*in:(o+2)*in], w[(o+2)*in:(o+3)*in], w[(o+3)*in:(o+4)*in])
					copy(oa[o:o+4], r[:4])
					copy(ob[o:o+4], r[4:])
				}
				for ; o < o1; o++ {
					oa[o] = dot(xa, w[o*in:(o+1)*in])
					ob[o] = dot(xb, w[o*in:(o+1)*in])
				}
			}
			for ; t < T; t++ {
				xr := x[t*in : (t+1)*in]
				or := out[t*outDim : (t+1)*outDim]
				o := o0
				for ; o+4 <= o1; o += 4 {
					or[o], or[o+1], or[o+2], or[o+3] = dot4(xr, w[o*in:(o+1)*in], w[(o+1)*in:(o+2)*in], w[(o+2)*in:(o+3)*in], w[(o+3)*in:(o+4)*in])
				}
				for ; o < o1; o++ {
					or[o] = dot(xr, w[o*in:(o+1)*in])
				}
			}
		}
	})
}

// dot is the sequential sum Σ x[i]·y[i], i ascending: dot4 and dot2x4 compute each of their
// results the same way, so an element's value does not depend on which kernel computed it.
func dot(x, y []float32) float32 {
	y = y[:len(x)]
	var a float32
	for i, v := range x {
		a += v * y[i]
	}
	return a
}

// dot4 is dot of x with four rows (x loaded once for the four).
func dot4(x, y0, y1, y2, y3 []float32) (float32, float32, float32, float32) {
	n := len(x)
	y0, y1, y2, y3 = y0[:n], y1[:n], y2[:n], y3[:n]
	var a, b, c, d float32
	for i, v := range x {
		a += v * y0[i]
		b += v * y1[i]
		c += v * y2[i]
		d += v * y3[i]
	}
	return a, b, c, d
}

// dot2x4 is dot of two tokens' rows xa, xb with four weight rows: xa's four results, then xb's.
func dot2x4(xa, xb, y0, y1, y2, y3 []float32) (r [8]float32) {
	n := len(xa)
	xb, y0, y1, y2, y3 = xb[:n], y0[:n], y1[:n], y2[:n], y3[:n]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	for i, u := range xa {
		v := xb[i]
		w0, w1, w2, w3 := y0[i], y1[i], y2[i], y3[i]
		a0 += u * w0
		a1 += u * w1
		a2 += u * w2
		a3 += u * w3
		b0 += v * w0
		b1 += v * w1
		b2 += v * w2
		b3 += v * w3
	}
	return [8]float32{a0, a1, a2, a3, b0, b1, b2, b3}
}

// rmsNorm is out = x / sqrt(mean(x²) + eps) · w, row by row ([T][d]).
func rmsNorm(out, x, w []float32, d int, eps float32) {
	for r := 0; r < len(x); r += d {
		xr, or := x[r:r+d], out[r:r+d]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(d)+float64(eps)))
		for i, v := range xr {
			or[i] = v * inv * w[i]
		}
	}
}

func addTo(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] += y[i]
	}
}

func silu(x float32) float32 { return float32(float64(x) / (1 + math.Exp(-float64(x)))) }

// ropeTables returns cos and sin [T][head_dim/2] of position·θ^(-2i/head_dim), computed in
// float64 and rounded to float32, as train.py does.
func ropeTables(cfg Config, positions []int) (cos, sin []float32) {
	half := cfg.HeadDim / 2
	inv := make([]float64, half)
	for i := range inv {
		inv[i] = 1 / math.Pow(float64(cfg.RopeTheta), float64(2*i)/float64(cfg.HeadDim))
	}
	cos = make([]float32, len(positions)*half)
	sin = make([]float32, len(positions)*half)
	for t, p := range positions {
		for i, f := range inv {
			s, c := math.Sincos(float64(p) * f)
			cos[t*half+i], sin[t*half+i] = float32(c), float32(s)
		}
	}
	return cos, sin
}

// rope rotates every head of x [T][heads][headDim] in place, NeoX style: the first half of a
// head pairs with the second (x1' = x1·cos − x2·sin, x2' = x2·cos + x1·sin).
func rope(x, cos, sin []float32, T, heads, headDim int) {
	half := headDim / 2
	for t := range T {
		c, s := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
		for h := range heads {
			base := (t*heads + h) * headDim
			x1, x2 := x[base:base+half], x[base+half:base+headDim]
			for i := range half {
				a, b := x1[i], x2[i]
				x1[i] = a*c[i] - b*s[i]
				x2[i] = b*c[i] + a*s[i]
			}
		}
	}
}

// writeKV stores the step's K and V ([T][kv_heads·head_dim]) as fp16 at their slots in layer li.
func writeKV(c *KVCache, li int, slots []int, k, v []float32) {
	buf := c.layers[li]
	n := c.kvHeads * c.headDim
	tb := c.tokenBytes()
	for t, slot := range slots {
		ko, vo := c.Offset(0, slot), c.Offset(1, slot)
		// Lengths match by construction: n elements, tb bytes.
		_ = kernels.EncodeFloat32(buf[ko:ko+tb], k[t*n:(t+1)*n], kernels.Float16)
		_ = kernels.EncodeFloat32(buf[vo:vo+tb], v[t*n:(t+1)*n], kernels.Float16)
	}
}

// attention computes att [T][heads][headDim] for the step's queries against K/V read from the
// cache through seq's block table: token t attends to positions [0, positions[t]] (or, with
// sel, to the positions up to positions[t] of the selected logical blocks), in increasing
// position order. The K and V of every position attended are first decoded from fp16 once
// (exactly), then the work is split by (token, KV head): the query heads sharing a KV head read
// each K and V row once.
func (m *Model) attention(att, q []float32, c *KVCache, li int, seq *Sequence, positions []int, sel [][]int) {
	cfg := m.cfg
	T, hd, G, kvd := len(positions), cfg.HeadDim, cfg.Heads/cfg.KVHeads, cfg.KVDim()
	scale := float32(1 / math.Sqrt(float64(hd)))
	buf := c.layers[li]
	tb := c.tokenBytes()
	vBase := c.numBlocks * c.blockSize * tb
	last := positions[T-1]
	// With a block selection (one token), only its positions, per KV head; otherwise [0, last].
	headSel := make([][]int, cfg.KVHeads)
	for kh := range headSel {
		if sel != nil {
			headSel[kh] = attendedPositions(sel[kh], last, c.blockSize)
		}
	}
	npos := last + 1
	// A multi-token step decodes every K/V row it attends once, up front (the rows are shared by
	// many tokens); a one-token step decodes each row where it reads it, once anyway. Decoding is
	// exact, so both give the same values.
	var kf, vf []float32
	if T > 1 {
		kf = make([]float32, (last+1)*kvd)
		vf = make([]float32, (last+1)*kvd)
		parallel(npos, 256, func(_, lo, hi int) {
			for pos := lo; pos < hi; pos++ { // no selection with T > 1: positions [0, last]
				off := (seq.Blocks[pos/c.blockSize]*c.blockSize + pos%c.blockSize) * tb
				decodeF16(kf[pos*kvd:(pos+1)*kvd], buf[off:off+tb])
				decodeF16(vf[pos*kvd:(pos+1)*kvd], buf[vBase+off:vBase+off+tb])
			}
		})
	}
	tmps := make([][]float32, workers())
	scr := make([][]float32, workers())
	grain := max(1, 64/max(1, last/64))
	parallel(T*cfg.KVHeads, grain, func(w, lo, hi int) {
		for task := lo; task < hi; task++ {
			t, kh := task/cfg.KVHeads, task%cfg.KVHeads
			selected := headSel[kh]
			p := positions[t]
			n := p + 1
			if selected != nil {
				n = len(selected) // one token: p == last
			}
			if cap(scr[w]) < G*n {
				scr[w] = make([]float32, G*n)
			}
			scores := scr[w][:G*n]
			if tmps[w] == nil {
				tmps[w] = make([]float32, hd)
			}
			tmp := tmps[w]
			qh := q[(t*cfg.Heads+kh*G)*hd : (t*cfg.Heads+kh*G+G)*hd]
			for j := range n {
				pos := j
				if selected != nil {
					pos = selected[j]
				}
				var krow []float32
				if kf != nil {
					krow = kf[pos*kvd+kh*hd : pos*kvd+(kh+1)*hd]
				} else {
					off := (seq.Blocks[pos/c.blockSize]*c.blockSize+pos%c.blockSize)*tb + kh*hd*2
					decodeF16(tmp, buf[off:off+hd*2])
					krow = tmp
				}
				for g := range G {
					scores[g*n+j] = dot(qh[g*hd:(g+1)*hd], krow) * scale
				}
			}
			for g := range G {
				softmax(scores[g*n : (g+1)*n])
			}
			acc := att[(t*cfg.Heads+kh*G)*hd : (t*cfg.Heads+kh*G+G)*hd]
			clear(acc)
			for j := range n {
				pos := j
				if selected != nil {
					pos = selected[j]
				}
				var vrow []float32
				if vf != nil {
					vrow = vf[pos*kvd+kh*hd : pos*kvd+(kh+1)*hd]
				} else {
					off := vBase + (seq.Blocks[pos/c.blockSize]*c.blockSize+pos%c.blockSize)*tb + kh*hd*2
					decodeF16(tmp, buf[off:off+hd*2])
					vrow = tmp
				}
				for g := range G {
					wgt := scores[g*n+j]
					a := acc[g*hd : (g+1)*hd]
					for i, vv := range vrow {
						a[i] += wgt * vv
					}
				}
			}
		}
	})
}

// attendedPositions lists the positions up to p in the selected logical blocks, or nil for all.
func attendedPositions(sel []int, p, bs int) []int {
	if sel == nil {
		return nil
	}
	out := make([]int, 0, len(sel)*bs)
	for _, lb := range sel {
		for pos := lb * bs; pos < (lb+1)*bs && pos <= p; pos++ {
			out = append(out, pos)
		}
	}
	return out
}

// softmax normalizes s in place (max subtracted, exp in float64, sum in order).
func softmax(s []float32) {
	mx := s[0]
	for _, v := range s[1:] {
		mx = max(mx, v)
	}
	var sum float32
	for i, v := range s {
		e := float32(math.Exp(float64(v - mx)))
		s[i] = e
		sum += e
	}
	inv := 1 / sum
	for i := range s {
		s[i] *= inv
	}
}

var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = kernels.Float16ToFloat32(uint16(i))
	}
	return t
})

// decodeF16 converts len(dst) little-endian fp16 values of src to float32.
func decodeF16(dst []float32, src []byte) {
	tab := f16Table()
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = tab[uint16(src[2*i])|uint16(src[2*i+1])<<8]
	}
}
