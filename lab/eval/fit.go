package eval

// QueryFit: what a learned block representation is fitted to. A block's largest logit is
// max_t q·k_t over its keys; which keys matter depends on where the model's queries point,
// and that is a property of the model (per layer and KV head), not of the text. FitQueries
// samples the queries the model produces on training text (train.py's training files, never
// the held-out ones the evaluation decodes), and the representations built from them (the
// probes "anchor" and "lquest", sparse's anchor sidecars) choose per block what best predicts
// the largest logit of such queries.

import (
	"fmt"
	"math"
	"slices"

	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/model"
	"github.com/ucm-go/ucm/sparse"
)

// QueryFit holds, per layer and KV head, a sample of the model's queries (after RoPE) on
// training text and the eigenbasis of their second moment E[q·qᵀ].
type QueryFit struct {
	// HeadDim is each query's length.
	HeadDim int
	// Sample[layer][kv] are queries of the KV head's query heads, HeadDim values each.
	Sample [][][][]float32
	// Basis[layer][kv] are the unit eigenvectors of the queries' second moment, largest
	// eigenvalue first; Eig[layer][kv] the eigenvalues.
	Basis [][][][]float64
	Eig   [][][]float64
	// LowK[layer][kv] and LowQ[layer][kv] are a rank-HeadDim factorisation of q·d, d a key's
	// deviation from its 16-token block's mean, ordered by what each rank adds: q·d ≈
	// Σ_{i<r} (LowQ_i·q)(LowK_i·d) is, for every r, the rank-r bilinear form of least mean
	// squared error over the fitted queries and the training text's key deviations (the SVD
	// of Σq^½·Cd^½; Σq = E[q·qᵀ], Cd = E[d·dᵀ]).
	LowK, LowQ [][][][]float64
}

// FitQueries prefills each training window densely and keeps, per layer and KV head, the
// queries of positions from on (the decode regime the evaluation measures: long contexts),
// every query head of the KV head's group; samples of them, evenly strided, form Sample.
func FitQueries(m *model.Model, windows [][]byte, from, samples int) (*QueryFit, error) {
	cfg := m.Config()
	hd, G := cfg.HeadDim, cfg.Heads/cfg.KVHeads
	if samples < 1 || len(windows) == 0 {
		return nil, fmt.Errorf("%w: fit: %d samples from %d windows", sparse.ErrInvalid, samples, len(windows))
	}
	all := make([][][][]float32, cfg.Layers)  // [layer][kv] → queries
	cdev := make([][][][]float64, cfg.Layers) // [layer][kv] → Σ d·dᵀ of key deviations
	cdevN := make([][]float64, cfg.Layers)
	for l := range cdev {
		cdev[l], cdevN[l] = make([][][]float64, cfg.KVHeads), make([]float64, cfg.KVHeads)
		for kv := range cdev[l] {
			cdev[l][kv] = zeros(hd)
		}
	}
	for l := range all {
		all[l] = make([][][]float32, cfg.KVHeads)
	}
	for wi, w := range windows {
		if len(w) > cfg.MaxCtx || len(w) <= from {
			return nil, fmt.Errorf("%w: fit: window %d has %d bytes: want (%d, %d]", sparse.ErrInvalid, wi, len(w), from, cfg.MaxCtx)
		}
		cache, err := model.NewKVCache(cfg, (len(w)+15)/16, 16)
		if err != nil {
			return nil, err
		}
		var seq model.Sequence
		if err := seq.Reserve(cache, len(w)); err != nil {
			return nil, err
		}
		toks, pos := make([]int, len(w)), make([]int, len(w))
		for i, t := range w {
			toks[i], pos[i] = int(t), i
		}
		hooks := &model.Hooks{Queries: func(layer int, positions []int, q []float32) {
			for t, p := range positions {
				if p < from {
					continue
				}
				for h := range cfg.Heads {
					off := t*cfg.Heads*hd + h*hd
					all[layer][h/G] = append(all[layer][h/G], slices.Clone(q[off:off+hd]))
				}
			}
		}}
		if _, err := m.ForwardHooks(cache, &seq, toks, pos, hooks); err != nil {
			return nil, fmt.Errorf("fit: window %d: %w", wi, err)
		}
		addKeyDeviations(cdev, cdevN, cache, &seq, len(w))
	}
	f := &QueryFit{HeadDim: hd, Sample: make([][][][]float32, cfg.Layers), Basis: make([][][][]float64, cfg.Layers), Eig: make([][][]float64, cfg.Layers),
		LowK: make([][][][]float64, cfg.Layers), LowQ: make([][][][]float64, cfg.Layers)}
	for l := range all {
		f.Sample[l] = make([][][]float32, cfg.KVHeads)
		f.Basis[l] = make([][][]float64, cfg.KVHeads)
		f.Eig[l] = make([][]float64, cfg.KVHeads)
		for kv, qs := range all[l] {
			mom := make([][]float64, hd)
			for i := range mom {
				mom[i] = make([]float64, hd)
			}
			for _, q := range qs {
				for i := range hd {
					for j := range hd {
						mom[i][j] += float64(q[i]) * float64(q[j]) / float64(len(qs))
					}
				}
			}
			f.Eig[l][kv], f.Basis[l][kv] = symEigen(cloneMat(mom))
			cd := cloneMat(cdev[l][kv])
			for i := range cd {
				for j := range cd[i] {
					cd[i][j] /= max(cdevN[l][kv], 1)
				}
			}
			lk, lq := lowRank(f.Eig[l][kv], f.Basis[l][kv], cd)
			f.LowK[l] = append(f.LowK[l], lk)
			f.LowQ[l] = append(f.LowQ[l], lq)
			n := min(samples, len(qs))
			for i := range n {
				f.Sample[l][kv] = append(f.Sample[l][kv], qs[i*len(qs)/n])
			}
		}
	}
	return f, nil
}

// symEigen returns the eigenvalues (descending) and unit eigenvectors of the symmetric matrix
// a (cyclic Jacobi rotations; a is overwritten).
func symEigen(a [][]float64) ([]float64, [][]float64) {
	n := len(a)
	v := make([][]float64, n) // columns are eigenvectors
	for i := range v {
		v[i] = make([]float64, n)
		v[i][i] = 1
	}
	for sweep := 0; sweep < 100; sweep++ {
		var off float64
		for i := range n {
			for j := i + 1; j < n; j++ {
				off += a[i][j] * a[i][j]
			}
		}
		if off < 1e-22 {
			break
		}
		for p := range n {
			for q := p + 1; q < n; q++ {
				if a[p][q] == 0 {
					continue
				}
				theta := (a[q][q] - a[p][p]) / (2 * a[p][q])
				t := math.Copysign(1, theta) / (math.Abs(theta) + math.Sqrt(theta*theta+1))
				c := 1 / math.Sqrt(t*t+1)
				s := t * c
				for k := range n { // columns p, q
					akp, akq := a[k][p], a[k][q]
					a[k][p], a[k][q] = c*akp-s*akq, s*akp+c*akq
				}
				for k := range n { // rows p, q
					apk, aqk := a[p][k], a[q][k]
					a[p][k], a[q][k] = c*apk-s*aqk, s*apk+c*aqk
				}
				for k := range n {
					vkp, vkq := v[k][p], v[k][q]
					v[k][p], v[k][q] = c*vkp-s*vkq, s*vkp+c*vkq
				}
			}
		}
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(x, y int) int {
		switch {
		case a[x][x] > a[y][y]:
			return -1
		case a[x][x] < a[y][y]:
			return 1
		}
		return 0
	})
	vals, vecs := make([]float64, n), make([][]float64, n)
	for r, i := range idx {
		vals[r] = a[i][i]
		vecs[r] = make([]float64, n)
		for k := range n {
			vecs[r][k] = v[k][i]
		}
	}
	return vals, vecs
}

// Anchors returns r of keys' indexes (fewer when there are fewer keys), chosen greedily to
// maximise Σ_s max_i q_s·k_{a_i} over the sampled queries: the keys whose logits best stand
// for the block's largest logit under the model's queries (a facility-location greedy: each
// pick adds the most to the sampled queries' best logit).
func Anchors(keys [][]float64, sample [][]float32, r int) []int {
	r = min(r, len(keys))
	dots := make([][]float64, len(keys))
	for j, k := range keys {
		dots[j] = make([]float64, len(sample))
		for s, q := range sample {
			var x float64
			for d, kd := range k {
				x += float64(q[d]) * kd
			}
			dots[j][s] = x
		}
	}
	best := make([]float64, len(sample))
	for s := range best {
		best[s] = math.Inf(-1)
	}
	var out []int
	for len(out) < r {
		bj, bg := -1, math.Inf(-1)
		for j := range keys {
			if slices.Contains(out, j) {
				continue
			}
			var g float64
			for s, x := range dots[j] {
				g += max(best[s], x)
			}
			if g > bg {
				bj, bg = j, g
			}
		}
		out = append(out, bj)
		for s, x := range dots[bj] {
			best[s] = max(best[s], x)
		}
	}
	return out
}

// fitBlock is the block size the key deviations are fitted with.
const fitBlock = 16

// addKeyDeviations adds, per layer and KV head, Σ d·dᵀ of the deviations d of the cache's first
// n keys from their fitBlock-token block's mean (full blocks only) to cdev, and their count to n.
func addKeyDeviations(cdev [][][][]float64, cnt [][]float64, cache *model.KVCache, seq *model.Sequence, n int) {
	hd, kvh := cache.HeadDim(), cache.KVHeads()
	kvd := hd * kvh
	row := make([]float32, kvd)
	for l := range cdev {
		buf := cache.Layer(l)
		for b0 := 0; b0+fitBlock <= n; b0 += fitBlock {
			keys := make([][]float32, fitBlock)
			for t := range keys {
				p := b0 + t
				slot := seq.Blocks[p/cache.BlockSize()]*cache.BlockSize() + p%cache.BlockSize()
				off := cache.Offset(0, slot)
				_ = kernels.DecodeFloat32(row, buf[off:off+2*kvd], kernels.Float16)
				keys[t] = slices.Clone(row)
			}
			for kv := range kvh {
				mu := make([]float64, hd)
				for _, k := range keys {
					for d := range hd {
						mu[d] += float64(k[kv*hd+d]) / fitBlock
					}
				}
				c := cdev[l][kv]
				for _, k := range keys {
					for i := range hd {
						di := float64(k[kv*hd+i]) - mu[i]
						for j := range hd {
							c[i][j] += di * (float64(k[kv*hd+j]) - mu[j])
						}
					}
				}
				cnt[l][kv] += fitBlock
			}
		}
	}
}

// lowRank returns the factors of the least-squares low-rank bilinear form (QueryFit.LowK,
// LowQ) from the queries' second moment's eigen-decomposition (eig, basis) and the key
// deviations' covariance cd: with S = Σq^½ and X = S·Cd·S = Σ σ_i² u_i u_iᵀ, LowK_i = S·u_i and
// LowQ_i = S⁻¹·u_i (Σq's smallest eigenvalues floored at 1e-6 of its largest).
func lowRank(eig []float64, basis [][]float64, cd [][]float64) (lk, lq [][]float64) {
	n := len(eig)
	sq, isq := zeros(n), zeros(n)
	for r, v := range basis {
		l := max(eig[r], 1e-6*eig[0])
		for i := range n {
			for j := range n {
				sq[i][j] += math.Sqrt(l) * v[i] * v[j]
				isq[i][j] += v[i] * v[j] / math.Sqrt(l)
			}
		}
	}
	x := matMul(matMul(sq, cd), sq)
	_, us := symEigen(x)
	for _, u := range us {
		a, b := make([]float64, n), make([]float64, n)
		for i := range n {
			for j := range n {
				a[i] += sq[i][j] * u[j]
				b[i] += isq[i][j] * u[j]
			}
		}
		lk, lq = append(lk, a), append(lq, b)
	}
	return lk, lq
}

func zeros(n int) [][]float64 {
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
	}
	return m
}

func cloneMat(a [][]float64) [][]float64 {
	m := make([][]float64, len(a))
	for i := range a {
		m[i] = slices.Clone(a[i])
	}
	return m
}

func matMul(a, b [][]float64) [][]float64 {
	m := zeros(len(a))
	for i := range a {
		for k := range a {
			for j := range a {
				m[i][j] += a[i][k] * b[k][j]
			}
		}
	}
	return m
}
