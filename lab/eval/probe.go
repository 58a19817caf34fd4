package eval

// Probes: reference selections from statistics of the blocks' keys, to find out which
// representation a method would need before building its sidecar. Like the oracle they read
// every key (they are not methods); unlike it they score a block only from what a sidecar
// could hold (its mean key, per-channel variances, principal directions, 4-token rows,
// per-channel bounds) or from an exact per-block quantity (its largest logit, its log-sum-exp)
// to measure what knowing it would be worth. Every probe selects per KV head as head_score
// softmax does: per query head, a softmax over the candidates of the block's estimated logit,
// the shares summed over the KV head's query heads, top-k per KV head.

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/sparse"
)

// ProbePrefix starts the name of a probe among Options.Methods: "probe-<estimator>" or
// "probe-<estimator>:<option>,<option>…". Estimators of a block's logit for a query head (the
// logit of a block being log-mean-exp of q·k/√D over its tokens):
//
//	exact      the block's log-mean-exp itself (the ceiling of any logit estimate)
//	max        the block's largest q·k/√D
//	mean       q·k̄/√D of the mean key (ESA's sidecar; = ESA head_score softmax, head_select kv)
//	gauss      mean + var/2 of the block's logits (a Gaussian's log-mean-exp: full covariance)
//	diag       mean + Σ_d q_d²·var_d/(2D) (per-channel variances)
//	rank       mean + Σ_i λ_i (q·u_i)²/(2D) over the top R principal directions (option R=n)
//	merge      log-mean-exp over the 4-token mean rows (= KVStar merge 4, no pruning, softmax, kv)
//	mergediag  merge with each row's per-channel variance term (as diag)
//	quest      Quest's bound Σ_d max(q_d·lo_d, q_d·hi_d)/√D
//	minterp    mean + A·(quest − mean) (option A=x)
//	qinterp    the same from the bounds' midpoint instead of the mean
//	anchor     log-mean-exp over R anchor keys (Anchors, fitted queries) and the mean of the rest
//	amax       the largest logit of the R anchor keys
//	lquest     mean + A·Σ_{i<R} (Quest's bound − mean) along the fitted queries' top R
//	           principal directions (a learned Quest: per-block min/max of the keys projected)
//	lowrank    log-mean-exp of the tokens' logits, each token's deviation from the mean key
//	           kept as R coefficients on the fitted low-rank factors (QueryFit.LowK, LowQ);
//	           option A>0 scores by the largest such logit instead
//	qlowrank   the same on the fitted queries' principal directions; option C=c adds to each
//	           token's logit c × half the variance of q⊥·r/√D for its residual r off the R
//	           directions taken in a random direction (‖q⊥‖²‖r‖²/(D−R)/D: one more value a token)
//
// anchor, amax, lquest, lowrank and qlowrank need Options.Fit (queries fitted on training text).
//
// Options: cap (the estimate capped at the exact max), qcap (capped at Quest's bound), T=x (the
// logits times x before the softmax), pool (the k·KVHeads best (head, block) pairs over every
// KV head instead of k per head).
const ProbePrefix = "probe-"

// probeSpec is a parsed probe name.
type probeSpec struct {
	est                    string
	rank                   int
	beta, alpha            float64
	pool, capMax, capQuest bool
	carry                  float64
	resid                  float64
}

// parseProbe parses a probe name (with ProbePrefix); unknown estimators and options are errors.
func parseProbe(name string) (*probeSpec, error) {
	est, args, _ := strings.Cut(strings.TrimPrefix(name, ProbePrefix), ":")
	ps := &probeSpec{est: est, beta: 1}
	switch est {
	case "exact", "max", "mean", "gauss", "diag", "rank", "merge", "mergediag", "quest", "minterp", "qinterp":
	case "outlier", "norm", "kmeans", "anchor", "amax":
		ps.rank = 4
	case "lquest":
		ps.rank, ps.alpha = 8, 1
	case "lowrank", "qlowrank":
		ps.rank = 4
	case "hash", "hashrms":
	default:
		return nil, fmt.Errorf("%w: %s: unknown probe estimator %q", sparse.ErrInvalid, name, est)
	}
	for _, a := range strings.Split(args, ",") {
		k, v, _ := strings.Cut(a, "=")
		var err error
		switch k {
		case "":
		case "R":
			ps.rank, err = strconv.Atoi(v)
			if err == nil && (ps.rank < 1 || ps.rank > probeRank && (est == "rank" || ps.rank > 16 && est != "lquest" && est != "lowrank" && est != "qlowrank")) {
				err = fmt.Errorf("want 1…%d (rank), 1…16 (mixtures)", probeRank)
			}
		case "T":
			ps.beta, err = strconv.ParseFloat(v, 64)
		case "A":
			ps.alpha, err = strconv.ParseFloat(v, 64)
		case "carry":
			ps.carry, err = strconv.ParseFloat(v, 64)
		case "C":
			ps.resid, err = strconv.ParseFloat(v, 64)
		case "pool":
			ps.pool = true
		case "cap":
			ps.capMax = true
		case "qcap":
			ps.capQuest = true
		default:
			err = fmt.Errorf("unknown option")
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: option %q: %v", sparse.ErrInvalid, name, a, err)
		}
	}
	return ps, nil
}

// probeRank is the principal directions a probe's statistics keep.
const probeRank = 4

// probeMerge is the tokens of a probe's merged rows.
const probeMerge = 4

// probeStats are one full block's key statistics for one KV head (what a sidecar could hold).
type probeStats struct {
	mu     []float64   // mean key
	vr     []float64   // per-channel variance
	u      [][]float64 // principal directions of the centred keys
	lam    []float64   // their variances
	rows   [][]float64 // merged rows (means of 4 tokens)
	rvar   [][]float64 // per-channel variance within each merged row
	lo, hi []float64   // per-channel minimum and maximum
	keys   [][]float64 // the block's keys
	codes  [][]byte    // the keys' hash codes (GSA On-Device's sidecar, seed 1, head-dim bits)
	norms  []float64   // the keys' norms
	mix    map[string]*mixRows
	sample [][]float32 // fitted queries of the block's layer and KV head (QueryFit.Sample)
	basis  [][]float64 // their principal directions (QueryFit.Basis)
	plo    []float64   // per principal direction, the keys' smallest projection
	phi    []float64   // and their largest
	pmu    []float64   // and the mean key's
	lowK   [][]float64 // fitted low-rank key factors (QueryFit.LowK, or Basis for qlowrank)
	lowQ   [][]float64 // and query factors
	lowC   [][]float64 // per key, its deviation from the mean on lowK (lazily)
	lowR   [][]float64 // per key and rank r, ‖deviation‖² − Σ_{i<r} coefficient² (qlowrank)
}

// lowCoefs computes (once) each key's deviation from the block mean on the low-rank factors.
func (s *probeStats) lowCoefs() {
	if s.lowC != nil {
		return
	}
	for _, k := range s.keys {
		c := make([]float64, len(s.lowK))
		var nn float64
		for d, kd := range k {
			nn += (kd - s.mu[d]) * (kd - s.mu[d])
		}
		rr := make([]float64, len(s.lowK)+1)
		rr[0] = nn
		for i, u := range s.lowK {
			for d, kd := range k {
				c[i] += u[d] * (kd - s.mu[d])
			}
			rr[i+1] = max(rr[i]-c[i]*c[i], 0)
		}
		s.lowC, s.lowR = append(s.lowC, c), append(s.lowR, rr)
	}
}

// projBounds computes (once) the keys' projections' bounds on the fitted basis.
func (s *probeStats) projBounds() {
	if s.plo != nil {
		return
	}
	n := len(s.basis)
	s.plo, s.phi, s.pmu = make([]float64, n), make([]float64, n), make([]float64, n)
	for i, u := range s.basis {
		s.plo[i], s.phi[i] = math.Inf(1), math.Inf(-1)
		for _, k := range s.keys {
			var x float64
			for d, kd := range k {
				x += u[d] * kd
			}
			s.plo[i], s.phi[i] = min(s.plo[i], x), max(s.phi[i], x)
		}
		for d, md := range s.mu {
			s.pmu[i] += u[d] * md
		}
	}
}

// mixRows are a block's representative rows and their weights (Σ w = 1): the block's logit is
// estimated as log Σ_i w_i·exp(q·row_i/√D).
type mixRows struct {
	rows [][]float64
	w    []float64
}

// mixture returns (once) the block's rows of a mixture estimator with r rows: "outlier" keeps
// the r−1 keys farthest from the block's mean as they are (weight 1/bs each) and the mean of
// the others; "norm" the same with the keys of largest norm; "kmeans" r centroids of k-means
// (farthest-point seeding, 10 iterations) weighted by their sizes.
func (s *probeStats) mixture(kind string, r int) *mixRows {
	key := fmt.Sprintf("%s/%d", kind, r)
	if m := s.mix[key]; m != nil {
		return m
	}
	bs, hd := len(s.keys), len(s.mu)
	r = min(r, bs)
	dist := func(a, b []float64) float64 {
		var x float64
		for d := range a {
			x += (a[d] - b[d]) * (a[d] - b[d])
		}
		return x
	}
	m := &mixRows{}
	switch kind {
	case "anchor", "amax":
		idx := Anchors(s.keys, s.sample, r)
		rest := make([]float64, hd)
		for i, k := range s.keys {
			if slices.Contains(idx, i) {
				continue
			}
			for d := range hd {
				rest[d] += k[d] / float64(bs-len(idx))
			}
		}
		for _, i := range idx {
			m.rows, m.w = append(m.rows, s.keys[i]), append(m.w, 1/float64(bs))
		}
		if bs > len(idx) {
			m.rows, m.w = append(m.rows, rest), append(m.w, float64(bs-len(idx))/float64(bs))
		}
	case "outlier", "norm":
		zero := make([]float64, hd)
		idx := make([]int, bs)
		for i := range idx {
			idx[i] = i
		}
		ref := s.mu
		if kind == "norm" {
			ref = zero
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(dist(s.keys[b], ref), dist(s.keys[a], ref)) })
		rest := make([]float64, hd)
		for j, i := range idx {
			if j < r-1 {
				m.rows, m.w = append(m.rows, s.keys[i]), append(m.w, 1/float64(bs))
				continue
			}
			for d := range hd {
				rest[d] += s.keys[i][d] / float64(bs-r+1)
			}
		}
		m.rows, m.w = append(m.rows, rest), append(m.w, float64(bs-r+1)/float64(bs))
	case "kmeans":
		cent := [][]float64{slices.Clone(s.keys[0])}
		for len(cent) < r {
			best, bi := -1.0, 0
			for i, k := range s.keys {
				dm := math.Inf(1)
				for _, c := range cent {
					dm = min(dm, dist(k, c))
				}
				if dm > best {
					best, bi = dm, i
				}
			}
			cent = append(cent, slices.Clone(s.keys[bi]))
		}
		assign := make([]int, bs)
		for range 10 {
			for i, k := range s.keys {
				bd := math.Inf(1)
				for c, ce := range cent {
					if d := dist(k, ce); d < bd {
						bd, assign[i] = d, c
					}
				}
			}
			cnt := make([]int, r)
			for c := range cent {
				clear(cent[c])
			}
			for i, k := range s.keys {
				cnt[assign[i]]++
				for d := range hd {
					cent[assign[i]][d] += k[d]
				}
			}
			for c := range cent {
				for d := range hd {
					if cnt[c] > 0 {
						cent[c][d] /= float64(cnt[c])
					}
				}
			}
			if m.w = m.w[:0]; true {
				for c := range cent {
					m.w = append(m.w, float64(cnt[c])/float64(bs))
				}
			}
		}
		m.rows = cent
	}
	if s.mix == nil {
		s.mix = map[string]*mixRows{}
	}
	s.mix[key] = m
	return m
}

// probeKey names a block's statistics.
type probeKey struct{ layer, block, kv int }

// stats computes (once) the statistics of logical block b of layer for KV head kv from r.kbuf.
func (r *run) stats(layer, b, kv int) *probeStats {
	k := probeKey{layer, b, kv}
	if s := r.probeCache[k]; s != nil {
		return s
	}
	cfg := r.m.Config()
	hd, kvd := cfg.HeadDim, cfg.KVDim()
	s := &probeStats{mu: make([]float64, hd), vr: make([]float64, hd)}
	keys := make([][]float64, r.bs)
	for t := range r.bs {
		p := b*r.bs + t
		keys[t] = make([]float64, hd)
		for d := range hd {
			keys[t][d] = float64(r.kbuf[p*kvd+kv*hd+d])
			s.mu[d] += keys[t][d] / float64(r.bs)
		}
	}
	s.lo, s.hi = slices.Clone(keys[0]), slices.Clone(keys[0])
	for _, key := range keys {
		for d := range hd {
			x := key[d] - s.mu[d]
			s.vr[d] += x * x / float64(r.bs)
			s.lo[d], s.hi[d] = min(s.lo[d], key[d]), max(s.hi[d], key[d])
		}
	}
	// covariance and its top eigenvectors (power iteration with deflation)
	cov := make([][]float64, hd)
	for i := range cov {
		cov[i] = make([]float64, hd)
		for j := range hd {
			for _, key := range keys {
				cov[i][j] += (key[i] - s.mu[i]) * (key[j] - s.mu[j]) / float64(r.bs)
			}
		}
	}
	for range probeRank {
		v := make([]float64, hd)
		for i := range v {
			v[i] = 1 / math.Sqrt(float64(hd)) * (1 + 0.01*float64(i))
		}
		var lam float64
		for range 60 {
			w := make([]float64, hd)
			for i := range hd {
				for j := range hd {
					w[i] += cov[i][j] * v[j]
				}
			}
			var nn float64
			for _, x := range w {
				nn += x * x
			}
			nn = math.Sqrt(nn)
			if nn == 0 {
				break
			}
			lam = nn
			for i := range w {
				v[i] = w[i] / nn
			}
		}
		s.u, s.lam = append(s.u, v), append(s.lam, lam)
		for i := range hd {
			for j := range hd {
				cov[i][j] -= lam * v[i] * v[j]
			}
		}
	}
	const merge = probeMerge
	for m0 := 0; m0 < r.bs; m0 += merge {
		row, rv := make([]float64, hd), make([]float64, hd)
		for t := m0; t < m0+merge; t++ {
			for d := range hd {
				row[d] += keys[t][d] / merge
			}
		}
		for t := m0; t < m0+merge; t++ {
			for d := range hd {
				x := keys[t][d] - row[d]
				rv[d] += x * x / merge
			}
		}
		s.rows, s.rvar = append(s.rows, row), append(s.rvar, rv)
	}
	s.keys = keys
	if r.fit != nil {
		s.sample, s.basis = r.fit.Sample[layer][kv], r.fit.Basis[layer][kv]
		s.lowK, s.lowQ = r.fit.LowK[layer][kv], r.fit.LowQ[layer][kv]
		if r.probe.est == "qlowrank" {
			s.lowK, s.lowQ = s.basis, s.basis
		}
	}
	if r.hashEnc == nil {
		r.hashEnc, _ = kernels.NewHashEncoder(hd, hd&^7, 1)
	}
	for _, key := range keys {
		kf := make([]float32, hd)
		var nn float64
		for d, x := range key {
			kf[d] = float32(x)
			nn += x * x
		}
		c := make([]byte, r.hashEnc.CodeBytes())
		_ = r.hashEnc.Hash(c, kf)
		s.codes, s.norms = append(s.codes, c), append(s.norms, math.Sqrt(nn))
	}
	r.probeCache[k] = s
	return s
}

// probeSelect selects per KV head by the probe's estimated logits, softmax shares summed over
// the group's query heads.
func (r *run) probeSelect(layer, pos int, q []float32) [][]int {
	cfg := r.m.Config()
	n, T, G, hd, kvd := pos/r.bs+1, pos+1, cfg.Heads/cfg.KVHeads, cfg.HeadDim, cfg.KVDim()
	init, local := min(r.init, n), min(r.local, n-min(r.init, n))
	k := sparse.BudgetBlocks(n, r.budget(layer)) - init - local
	if init+local+max(k, 0) >= n {
		return nil
	}
	ps := r.probe
	variant, rank, beta, pool, capmax, qcap, alpha := ps.est, ps.rank, ps.beta, ps.pool, ps.capMax, ps.capQuest, ps.alpha
	sc := 1 / math.Sqrt(float64(hd))
	var out [][]int
	masses := make([][]float64, cfg.KVHeads)
	for g := range cfg.KVHeads {
		mass := make([]float64, n)
		masses[g] = mass
		for h := g * G; h < (g+1)*G; h++ {
			qh := q[h*hd : (h+1)*hd]
			L := make([]float64, n)
			mx := math.Inf(-1)
			for b := init; b < n-local; b++ {
				s := r.stats(layer, b, g)
				var m float64
				for d := range hd {
					m += float64(qh[d]) * s.mu[d]
				}
				m *= sc
				var l, lmax, qb float64
				for d := range hd {
					qb += max(float64(qh[d])*s.lo[d], float64(qh[d])*s.hi[d])
				}
				qb *= sc
				lmax = math.Inf(-1)
				for t := range r.bs {
					p := b*r.bs + t
					var x float64
					for d := range hd {
						x += float64(qh[d]) * float64(r.kbuf[p*kvd+g*hd+d])
					}
					lmax = max(lmax, x*sc)
				}
				switch variant {
				case "max":
					l = lmax
				case "quest":
					l = qb
				case "minterp": // mean key + α (Quest bound − mean)
					l = m + alpha*(qb-m)
				case "qinterp": // Quest midpoint + α (Quest bound − midpoint)
					var mid float64
					for d := range hd {
						mid += float64(qh[d]) * (s.lo[d] + s.hi[d]) / 2
					}
					mid *= sc
					l = mid + alpha*(qb-mid)
				case "mean":
					l = m
				case "exact", "gauss":
					var sum, sq, lse float64
					lmx := math.Inf(-1)
					ls := make([]float64, r.bs)
					for t := range r.bs {
						p := b*r.bs + t
						var x float64
						for d := range hd {
							x += float64(qh[d]) * float64(r.kbuf[p*kvd+g*hd+d])
						}
						ls[t] = x * sc
						sum += ls[t]
						sq += ls[t] * ls[t]
						lmx = max(lmx, ls[t])
					}
					for _, x := range ls {
						lse += math.Exp(x - lmx)
					}
					mean := sum / float64(r.bs)
					if variant == "exact" {
						l = lmx + math.Log(lse) - math.Log(float64(r.bs))
					} else {
						l = mean + (sq/float64(r.bs)-mean*mean)/2
					}
				case "diag":
					var v float64
					for d := range hd {
						v += float64(qh[d]) * float64(qh[d]) * s.vr[d]
					}
					l = m + v*sc*sc/2
				case "rank":
					var v float64
					for i := range rank {
						var x float64
						for d := range hd {
							x += float64(qh[d]) * s.u[i][d]
						}
						v += s.lam[i] * x * x
					}
					l = m + v*sc*sc/2
				case "hash", "hashrms":
					c := make([]byte, r.hashEnc.CodeBytes())
					_ = r.hashEnc.Hash(c, qh)
					var qn, rms float64
					for _, x := range qh {
						qn += float64(x) * float64(x)
					}
					qn = math.Sqrt(qn)
					for _, nn := range s.norms {
						rms += nn * nn / float64(len(s.norms))
					}
					rms = math.Sqrt(rms)
					lmx := math.Inf(-1)
					ls := make([]float64, len(s.codes))
					for t, kc := range s.codes {
						nt := s.norms[t]
						if variant == "hashrms" {
							nt = rms
						}
						ls[t] = qn * nt * math.Cos(math.Pi*float64(kernels.Hamming(c, kc))/float64(8*len(c))) * sc
						lmx = max(lmx, ls[t])
					}
					var z float64
					for _, x := range ls {
						z += math.Exp(x - lmx)
					}
					l = lmx + math.Log(z/float64(len(ls)))
				case "amax":
					mr := s.mixture(variant, rank)
					l = math.Inf(-1)
					for _, row := range mr.rows[:min(rank, len(mr.rows))] {
						var x float64
						for d := range hd {
							x += float64(qh[d]) * row[d]
						}
						l = max(l, x*sc)
					}
				case "lowrank", "qlowrank": // log-mean-exp of the low-rank logits
					s.lowCoefs()
					qt := make([]float64, rank)
					for i := range rank {
						for d := range hd {
							qt[i] += float64(qh[d]) * s.lowQ[i][d]
						}
					}
					var qperp float64 // ‖q‖² off the first rank directions (orthonormal: qlowrank)
					if ps.resid > 0 {
						for _, x := range qh {
							qperp += float64(x) * float64(x)
						}
						for _, x := range qt {
							qperp -= x * x
						}
						qperp = max(qperp, 0)
					}
					ls := make([]float64, len(s.lowC))
					lmx := math.Inf(-1)
					for t, c := range s.lowC {
						x := m / sc
						for i := range rank {
							x += qt[i] * c[i]
						}
						ls[t] = x * sc
						if ps.resid > 0 && hd > rank { // C·half the variance of q⊥·r for a residual r of random direction
							ls[t] += ps.resid * qperp * s.lowR[t][rank] * sc * sc / float64(2*(hd-rank))
						}
						lmx = max(lmx, ls[t])
					}
					var z float64
					for _, x := range ls {
						z += math.Exp(x - lmx)
					}
					l = lmx + math.Log(z/float64(len(ls)))
					if alpha > 0 { // A>0: the largest low-rank logit instead
						l = lmx
					}
				case "lquest":
					s.projBounds()
					var add float64
					for i := range min(rank, len(s.basis)) {
						var x float64
						for d := range hd {
							x += float64(qh[d]) * s.basis[i][d]
						}
						add += max(x*s.plo[i], x*s.phi[i]) - x*s.pmu[i]
					}
					l = m + alpha*add*sc
				case "outlier", "norm", "kmeans", "anchor":
					mr := s.mixture(variant, rank)
					lmx := math.Inf(-1)
					ls := make([]float64, len(mr.rows))
					for i, row := range mr.rows {
						var x float64
						for d := range hd {
							x += float64(qh[d]) * row[d]
						}
						ls[i] = x * sc
						lmx = max(lmx, ls[i])
					}
					var z float64
					for i, x := range ls {
						z += mr.w[i] * math.Exp(x-lmx)
					}
					l = lmx + math.Log(z)
				case "merge", "mergediag":
					lmx := math.Inf(-1)
					ls := make([]float64, len(s.rows))
					for i, row := range s.rows {
						var x, v float64
						for d := range hd {
							x += float64(qh[d]) * row[d]
							v += float64(qh[d]) * float64(qh[d]) * s.rvar[i][d]
						}
						ls[i] = x * sc
						if variant == "mergediag" {
							ls[i] += v * sc * sc / 2
						}
						lmx = max(lmx, ls[i])
					}
					var z float64
					for _, x := range ls {
						z += math.Exp(x - lmx)
					}
					l = lmx + math.Log(z/float64(len(ls)))
				}
				if capmax {
					l = min(l, lmax)
				}
				if qcap {
					l = min(l, qb)
				}
				L[b] = l * beta
				mx = max(mx, l*beta)
			}
			var z float64
			for b := init; b < n-local; b++ {
				L[b] = math.Exp(L[b] - mx)
				z += L[b]
			}
			for b := init; b < n-local; b++ {
				mass[b] += L[b] / z
			}
		}
		_ = T
		if ps.carry > 0 { // the previous step's attention over its attended blocks
			for b, w := range r.carried[probeKey{layer, 0, g}] {
				if b >= init && b < n-local {
					mass[b] += ps.carry * w
				}
			}
		}
		out = append(out, sparse.SelectTopK(mass, init, local, k))
	}
	if pool { // the heads' k·KVHeads best (head, block) pairs
		type hb struct {
			g, b int
			m    float64
		}
		var all []hb
		for g, mass := range masses {
			for b := init; b < n-local; b++ {
				all = append(all, hb{g, b, mass[b]})
			}
		}
		slices.SortStableFunc(all, func(x, y hb) int { return cmp.Compare(y.m, x.m) })
		for g := range out {
			out[g] = nil
			for b := range init {
				out[g] = append(out[g], b)
			}
			for b := n - local; b < n; b++ {
				out[g] = append(out[g], b)
			}
		}
		for _, x := range all[:min(len(all), k*cfg.KVHeads)] {
			out[x.g] = append(out[x.g], x.b)
		}
		for g := range out {
			slices.Sort(out[g])
		}
	}
	if ps.carry > 0 {
		r.carryAttention(layer, pos, q, out)
	}
	return out
}

// carryAttention keeps, per KV head, the share of its query heads' attention (summed) each
// attended block had in this step's sparse attention: what the attention over the attended
// blocks computes, for the next step's selection (option carry=λ).
func (r *run) carryAttention(layer, pos int, q []float32, sel [][]int) {
	cfg := r.m.Config()
	T, G, hd, kvd := pos+1, cfg.Heads/cfg.KVHeads, cfg.HeadDim, cfg.KVDim()
	sc := 1 / math.Sqrt(float64(hd))
	if r.carried == nil {
		r.carried = map[probeKey]map[int]float64{}
	}
	for g, blocks := range sel {
		blocks = append(slices.Clone(blocks), pos/r.bs)
		slices.Sort(blocks)
		blocks = slices.Compact(blocks)
		shares := map[int]float64{}
		for h := g * G; h < (g+1)*G; h++ {
			qh := q[h*hd : (h+1)*hd]
			var logits []float64
			var owner []int
			mx := math.Inf(-1)
			for _, b := range blocks {
				for p := b * r.bs; p < min((b+1)*r.bs, T); p++ {
					var x float64
					for d := range hd {
						x += float64(qh[d]) * float64(r.kbuf[p*kvd+g*hd+d])
					}
					logits, owner = append(logits, x*sc), append(owner, b)
					mx = max(mx, x*sc)
				}
			}
			var z float64
			for i := range logits {
				logits[i] = math.Exp(logits[i] - mx)
				z += logits[i]
			}
			for i, e := range logits {
				shares[owner[i]] += e / z
			}
		}
		r.carried[probeKey{layer, 0, g}] = shares
	}
}

// needsFit says whether the probe's estimator learns from QueryFit.
func (ps *probeSpec) needsFit() bool {
	return ps.est == "anchor" || ps.est == "amax" || ps.est == "lquest" || ps.est == "lowrank" || ps.est == "qlowrank"
}

// NeedsFit says whether a method name (as Options.Methods holds it) needs Options.Fit.
func NeedsFit(name string) bool {
	ps, err := parseProbe(name)
	return strings.HasPrefix(name, ProbePrefix) && err == nil && ps.needsFit()
}
