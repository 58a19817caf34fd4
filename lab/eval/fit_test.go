package eval

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

func randMat(rng *rand.Rand, n int) [][]float64 {
	a := zeros(n)
	for i := range n {
		for j := range n {
			a[i][j] = rng.NormFloat64()
		}
	}
	return a
}

// TestSymEigen: A·v = λ·v for every returned pair, the vectors orthonormal, the values
// descending (a random symmetric matrix with positive and negative eigenvalues).
func TestSymEigen(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 12
	b := randMat(rng, n)
	a := zeros(n)
	for i := range n {
		for j := range n {
			a[i][j] = b[i][j] + b[j][i]
		}
	}
	vals, vecs := symEigen(cloneMat(a))
	for r := range n {
		if r > 0 && vals[r] > vals[r-1] {
			t.Fatalf("eigenvalues not descending: %v", vals)
		}
		for i := range n {
			var av float64
			for j := range n {
				av += a[i][j] * vecs[r][j]
			}
			if math.Abs(av-vals[r]*vecs[r][i]) > 1e-9 {
				t.Fatalf("pair %d: (A·v)[%d] = %v, λ·v = %v", r, i, av, vals[r]*vecs[r][i])
			}
		}
		for s := range n {
			var d float64
			for i := range n {
				d += vecs[r][i] * vecs[s][i]
			}
			if want := float64(b2i(r == s)); math.Abs(d-want) > 1e-9 {
				t.Fatalf("v%d·v%d = %v", r, s, d)
			}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// anchorObjective is the brute-force objective Anchors maximises greedily: Σ_s max_i q_s·k_i.
func anchorObjective(keys [][]float64, sample [][]float32, idx []int) float64 {
	var sum float64
	for _, q := range sample {
		best := math.Inf(-1)
		for _, i := range idx {
			var x float64
			for d := range q {
				x += float64(q[d]) * keys[i][d]
			}
			best = max(best, x)
		}
		sum += best
	}
	return sum
}

// TestAnchorsGreedy: every pick of Anchors is, among the keys not yet picked, the one that
// raises the objective most (recomputed from scratch), the picks are distinct, and asking for
// more anchors than keys returns every key.
func TestAnchorsGreedy(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const bs, hd, S = 16, 8, 40
	keys := make([][]float64, bs)
	for i := range keys {
		keys[i] = make([]float64, hd)
		for d := range keys[i] {
			keys[i][d] = rng.NormFloat64()
		}
	}
	sample := make([][]float32, S)
	for s := range sample {
		sample[s] = make([]float32, hd)
		for d := range sample[s] {
			sample[s][d] = float32(rng.NormFloat64() + 0.5)
		}
	}
	got := Anchors(keys, sample, 5)
	if len(got) != 5 {
		t.Fatalf("%d anchors", len(got))
	}
	for j := range got {
		chosen := anchorObjective(keys, sample, got[:j+1])
		for c := range keys {
			if slices.Contains(got[:j+1], c) {
				continue
			}
			if alt := anchorObjective(keys, sample, append(slices.Clone(got[:j]), c)); alt > chosen+1e-9 {
				t.Fatalf("pick %d: key %d gives %v, key %d (chosen) %v", j, c, alt, got[j], chosen)
			}
		}
	}
	all := Anchors(keys, sample, 99)
	slices.Sort(all)
	if len(all) != bs || len(slices.Compact(all)) != bs {
		t.Fatalf("anchors beyond the keys: %v", all)
	}
}

// TestLowRankFactors: at full rank the factorisation is exact for any q and d; the mean
// squared error of the rank-r form over queries and deviations drawn from the fitted
// distributions does not grow with r and is what the truncated spectrum predicts at r = 0.
func TestLowRankFactors(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 6
	gq, gd := randMat(rng, n), randMat(rng, n) // q = gq·z, d = gd·z
	cov := func(g [][]float64) [][]float64 {
		c := zeros(n)
		for i := range n {
			for j := range n {
				for k := range n {
					c[i][j] += g[i][k] * g[j][k]
				}
			}
		}
		return c
	}
	eig, basis := symEigen(cov(gq))
	lk, lq := lowRank(eig, basis, cov(gd))
	draw := func(g [][]float64) []float64 {
		z, v := make([]float64, n), make([]float64, n)
		for i := range z {
			z[i] = rng.NormFloat64()
		}
		for i := range n {
			for k := range n {
				v[i] += g[i][k] * z[k]
			}
		}
		return v
	}
	dot := func(a, b []float64) (x float64) {
		for i := range a {
			x += a[i] * b[i]
		}
		return x
	}
	mse := make([]float64, n+1)
	const trials = 4000
	for range trials {
		q, d := draw(gq), draw(gd)
		exact, approx := dot(q, d), 0.0
		mse[0] += exact * exact / trials
		for r := range n {
			approx += dot(lq[r], q) * dot(lk[r], d)
			mse[r+1] += (exact - approx) * (exact - approx) / trials
		}
		if math.Abs(exact-approx) > 1e-8*(1+math.Abs(exact)) {
			t.Fatalf("full rank: q·d = %v, factorised %v", exact, approx)
		}
	}
	for r := 1; r <= n; r++ {
		if mse[r] > mse[r-1]*1.05 { // sampling noise only
			t.Fatalf("mean squared error grows with rank: %v", mse)
		}
	}
}

// TestTrainStreamIsTheComplement: the training stream and the held-out stream split the
// corpus's files between them, each in path order.
func TestTrainStreamIsTheComplement(t *testing.T) {
	dir := t.TempDir()
	var held, train [][]byte
	for i := range 120 {
		rel := filepath.ToSlash(filepath.Join("p", string(rune('a'+i%26)), "f"+string(rune('a'+i/26))+".go"))
		body := []byte(rel + "\n")
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, rel), body, 0o644); err != nil {
			t.Fatal(err)
		}
		if IsHeldOut(rel) {
			held = append(held, body)
		} else {
			train = append(train, body)
		}
	}
	h, nh, err := HeldOutStream(dir)
	if err != nil {
		t.Fatal(err)
	}
	tr, nt, err := TrainStream(dir)
	if err != nil {
		t.Fatal(err)
	}
	if nh != len(held) || nt != len(train) || nh+nt != 120 || nh == 0 {
		t.Fatalf("held out %d (want %d), train %d (want %d)", nh, len(held), nt, len(train))
	}
	for _, b := range held {
		if bytes.Contains(tr, b) || !bytes.Contains(h, b) {
			t.Fatalf("held-out file %q in the training stream", b)
		}
	}
	for _, b := range train {
		if !bytes.Contains(tr, b) || bytes.Contains(h, b) {
			t.Fatalf("training file %q in the held-out stream", b)
		}
	}
}

// TestFitProbes: FitQueries gives every layer and KV head its sample and factors; the
// full-rank low-rank probe (every token's logit, refactorised) selects as the exact probe
// does, and the fitted probes run; without a fit they are refused.
func TestFitProbes(t *testing.T) {
	m := loadModel(t)
	cfg := m.Config()
	train := testWindow(t, 200)
	f, err := FitQueries(m, [][]byte{train[:96], train[100:196]}, 48, 50)
	if err != nil {
		t.Fatal(err)
	}
	for l := range cfg.Layers {
		for kv := range cfg.KVHeads {
			if len(f.Sample[l][kv]) != 50 || len(f.Basis[l][kv]) != cfg.HeadDim || len(f.LowK[l][kv]) != cfg.HeadDim || len(f.LowQ[l][kv]) != cfg.HeadDim {
				t.Fatalf("layer %d kv %d: %d samples, %d directions", l, kv, len(f.Sample[l][kv]), len(f.Basis[l][kv]))
			}
		}
	}
	full := "probe-lowrank:R=" + strconv.Itoa(cfg.HeadDim)
	o := Options{Model: m, Windows: [][]byte{testWindow(t, 140)}, Prefill: 100, BlockSizes: []int{8}, Budgets: []float64{0.4},
		Methods: []string{"probe-exact", full, "probe-qlowrank:R=" + strconv.Itoa(cfg.HeadDim) + ",C=1", "probe-anchor:R=2", "probe-lquest:R=4", "probe-qlowrank:R=4,C=1"}, Fit: f}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	exact := res[1]
	for _, lr := range res[2:4] { // full rank: every token's logit, no residual left
		if math.Abs(exact.Recall-lr.Recall) > 1e-9 || exact.Top1 != lr.Top1 || math.Abs(exact.KL-lr.KL) > 1e-12 {
			t.Fatalf("%s: %+v, probe-exact: %+v", lr.Method, lr, exact)
		}
	}
	for _, r := range res[4:] {
		if !(r.Recall > 0 && r.Recall < 1 && r.Top1 > 0.3) {
			t.Fatalf("%s: %+v", r.Method, r)
		}
	}
	o.Fit, o.Methods = nil, []string{"probe-anchor"}
	if _, err := Run(context.Background(), o); err == nil {
		t.Fatal("a fitted probe ran without a fit")
	}
	if !NeedsFit("probe-lquest:R=4") || NeedsFit("probe-max") || NeedsFit("ESA") {
		t.Fatal("NeedsFit")
	}
}
