package model

import (
	"errors"
	"fmt"
	"slices"
)

// RecomputeFunc chooses, in one layer of ForwardRecompute, which of the step's tokens are
// computed further. rows are the indexes (into the step's tokens, ascending) of the tokens
// computed in this layer so far; fresh is their K as this layer just computed it (after RoPE,
// [len(rows)][KVHeads·HeadDim]) and cached the K the cache held at their slots before this
// layer wrote it, decoded from fp16 (same shape); both are valid during the call only. It
// returns the rows that go on through this layer's attention and MLP and into the next
// layers: an ascending subset of rows (rows itself to keep them all). Blend's HKVD selection
// (package sparse) is one.
type RecomputeFunc func(layer int, rows []int, fresh, cached []float32) ([]int, error)

// ForwardRecompute runs tokens at positions as Forward does, except that only some tokens are
// computed in each layer: CacheBlend's selective recompute. The cache must already hold, at
// the positions of tokens it will not compute, the K/V to reuse (loaded from a store and
// RoPE-corrected to these positions); seq.Len counts them.
//
// In every layer the tokens still computed get their Q/K/V; pick (nil: keep them all) then
// chooses which of them go on; the fresh K/V of every token computed in the layer are written
// to the cache (a token dropped in this layer keeps its fresh K/V here: they cost nothing
// more and are closer to full recompute than the reused ones); the tokens kept attend, with
// the causal mask, to every position up to their own, reused or fresh, and go through the
// layer's MLP. Tokens dropped keep, in later layers, the K/V the cache holds.
//
// It returns the logits of the tokens computed through the last layer, [len(rows)][Vocab],
// and their rows (indexes into tokens; what vLLM's execute_finished reads logits at). With
// pick keeping every token the logits equal Forward's bit for bit, and so do the logits of the
// kept tokens whenever the reused K/V equal what full recompute writes.
func (m *Model) ForwardRecompute(c *KVCache, seq *Sequence, tokens, positions []int, pick RecomputeFunc) ([]float32, []int, error) {
	cfg := m.cfg
	T := len(tokens)
	if err := m.checkStep(c, seq, tokens, positions); err != nil {
		return nil, nil, err
	}
	slots, err := seq.SlotMapping(c, positions)
	if err != nil {
		return nil, nil, err
	}
	last := positions[T-1]
	for lb := 0; lb <= last/c.blockSize; lb++ {
		if b := seq.Blocks[lb]; b < 0 || b >= c.numBlocks {
			return nil, nil, invalid("block table entry %d is block %d, not in [0, %d)", lb, b, c.numBlocks)
		}
	}
	d, kvd := cfg.DModel, cfg.KVDim()
	x := make([]float32, T*d) // the residual stream of every token; rows no longer computed go stale
	for t, tok := range tokens {
		copy(x[t*d:(t+1)*d], m.embed[tok*d:(tok+1)*d])
	}
	rows := make([]int, T)
	for i := range rows {
		rows[i] = i
	}
	allCos, allSin := ropeTables(cfg, positions)
	half := cfg.HeadDim / 2
	for li := range m.layers {
		l := &m.layers[li]
		n := len(rows)
		xs := make([]float32, n*d) // the computed rows, compacted
		for i, r := range rows {
			copy(xs[i*d:(i+1)*d], x[r*d:(r+1)*d])
		}
		cos, sin := make([]float32, n*half), make([]float32, n*half)
		rslots, rpos := make([]int, n), make([]int, n)
		for i, r := range rows {
			copy(cos[i*half:(i+1)*half], allCos[r*half:(r+1)*half])
			copy(sin[i*half:(i+1)*half], allSin[r*half:(r+1)*half])
			rslots[i], rpos[i] = slots[r], positions[r]
		}
		hbuf := make([]float32, n*d)
		q := make([]float32, n*cfg.QDim())
		k := make([]float32, n*kvd)
		v := make([]float32, n*kvd)
		rmsNorm(hbuf, xs, l.attnNorm, d, cfg.NormEps)
		matmul(q, hbuf, l.wq, n, d, cfg.QDim())
		matmul(k, hbuf, l.wk, n, d, kvd)
		matmul(v, hbuf, l.wv, n, d, kvd)
		rope(q, cos, sin, n, cfg.Heads, cfg.HeadDim)
		rope(k, cos, sin, n, cfg.KVHeads, cfg.HeadDim)
		keep := rows
		if pick != nil {
			cached := make([]float32, n*kvd)
			buf := c.layers[li]
			for i, s := range rslots {
				off := c.Offset(0, s)
				decodeF16(cached[i*kvd:(i+1)*kvd], buf[off:off+c.tokenBytes()])
			}
			keep, err = pick(li, slices.Clone(rows), k, cached)
			if err != nil {
				return nil, nil, err
			}
			if err := checkSubset(keep, rows); err != nil {
				return nil, nil, invalid("layer %d: recompute rows: %v", li, err)
			}
		}
		writeKV(c, li, rslots, k, v)
		// Compact to the rows kept: their queries, positions and residual rows.
		kn := len(keep)
		kq, kpos, kx := q, rpos, xs
		if kn != n {
			kq, kpos, kx = make([]float32, kn*cfg.QDim()), make([]int, kn), make([]float32, kn*d)
			j := 0
			for i, r := range rows {
				if j < kn && keep[j] == r {
					copy(kq[j*cfg.QDim():(j+1)*cfg.QDim()], q[i*cfg.QDim():(i+1)*cfg.QDim()])
					copy(kx[j*d:(j+1)*d], xs[i*d:(i+1)*d])
					kpos[j] = rpos[i]
					j++
				}
			}
		}
		att := make([]float32, kn*cfg.QDim())
		proj := make([]float32, kn*d)
		gate := make([]float32, kn*cfg.FFNDim)
		up := make([]float32, kn*cfg.FFNDim)
		hb := hbuf[:kn*d]
		m.attention(att, kq, c, li, seq, kpos, nil)
		matmul(proj, att, l.wo, kn, cfg.QDim(), d)
		addTo(kx, proj)
		rmsNorm(hb, kx, l.ffnNorm, d, cfg.NormEps)
		matmul(gate, hb, l.gate, kn, d, cfg.FFNDim)
		matmul(up, hb, l.up, kn, d, cfg.FFNDim)
		for i, g := range gate {
			gate[i] = silu(g) * up[i]
		}
		matmul(proj, gate, l.down, kn, cfg.FFNDim, d)
		addTo(kx, proj)
		for j, r := range keep {
			copy(x[r*d:(r+1)*d], kx[j*d:(j+1)*d])
		}
		rows = keep
	}
	n := len(rows)
	xs := make([]float32, n*d)
	for i, r := range rows {
		copy(xs[i*d:(i+1)*d], x[r*d:(r+1)*d])
	}
	hbuf := make([]float32, n*d)
	rmsNorm(hbuf, xs, m.norm, d, cfg.NormEps)
	logits := make([]float32, n*cfg.Vocab)
	matmul(logits, hbuf, m.output, n, d, cfg.Vocab)
	seq.Len = max(seq.Len, last+1)
	return logits, rows, nil
}

// checkSubset reports whether keep is a non-empty ascending subset of rows (ascending).
func checkSubset(keep, rows []int) error {
	if len(keep) == 0 {
		return errors.New("none kept (the step's logits need at least one token)")
	}
	j := 0
	for i, r := range keep {
		if i > 0 && r <= keep[i-1] {
			return fmt.Errorf("not ascending at %d", i)
		}
		for j < len(rows) && rows[j] < r {
			j++
		}
		if j == len(rows) || rows[j] != r {
			return fmt.Errorf("row %d was not computed in this layer", r)
		}
	}
	return nil
}
