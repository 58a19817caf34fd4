package sparse

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ucm-go/ucm/kernels"
)

// dotRef is DotTopK by brute force: float64 dot products, a stable sort by score descending.
func dotRef(a *DotArgs) (idx [][]int32, scores [][]float64) {
	b, d := a.Batch(), a.Dim
	rows := len(a.Data) / d
	for r := range b {
		var cand []int32
		if a.Cand == nil {
			for i := range rows {
				cand = append(cand, int32(i))
			}
		} else {
			for _, c := range a.Cand[r*a.Width : (r+1)*a.Width] {
				if c >= 0 {
					cand = append(cand, c)
				}
			}
		}
		sc := make([]float64, len(cand))
		for i, c := range cand {
			for j := range d {
				sc[i] += float64(a.Q[r*d+j]) * float64(a.Data[int(c)*d+j])
			}
		}
		order := make([]int, len(cand))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(x, y int) bool { return sc[order[x]] > sc[order[y]] })
		n := min(a.K, len(cand))
		var ri []int32
		var rs []float64
		for _, o := range order[:n] {
			ri, rs = append(ri, cand[o]), append(rs, sc[o])
		}
		idx, scores = append(idx, ri), append(scores, rs)
	}
	return idx, scores
}

// randDotArgs draws a retrieval whose dot products are exact in float32 (small integers), with
// many equal scores so that the tie rule decides, candidates with -1 padding, duplicates and
// runs of consecutive rows, or no candidate list.
func randDotArgs(r *rand.Rand) *DotArgs {
	d := []int{1, 5, 8, 16, 40, 64}[r.IntN(6)]
	rows := 1 + r.IntN(60)
	if r.IntN(8) == 0 {
		rows = 2500 // several chunks of candidates
	}
	b := 1 + r.IntN(4)
	a := &DotArgs{Dim: d, Q: make([]float32, b*d), Data: make([]float32, rows*d), K: r.IntN(rows + 5)}
	for i := range a.Q {
		a.Q[i] = float32(r.IntN(5) - 2)
	}
	for i := range a.Data {
		a.Data[i] = float32(r.IntN(3) - 1)
	}
	if r.IntN(5) > 0 {
		a.Width = r.IntN(rows + 20)
		a.Cand = make([]int32, b*a.Width)
		for i := range a.Cand {
			switch r.IntN(6) {
			case 0:
				a.Cand[i] = -1
			case 1, 2:
				if i > 0 && int(a.Cand[i-1]) < rows-1 && a.Cand[i-1] >= 0 {
					a.Cand[i] = a.Cand[i-1] + 1
					continue
				}
				fallthrough
			default:
				a.Cand[i] = int32(r.IntN(rows))
			}
		}
	}
	a.Idx = make([]int32, b*a.K)
	a.Scores = make([]float32, b*a.K)
	a.Count = make([]int64, b)
	return a
}

// TestDotTopK: DotTopK equals the brute-force reference exactly (indices, scores, counts and
// the -1/-Inf padding) with one worker and with several.
func TestDotTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for it := range 300 {
		a := randDotArgs(r)
		wantIdx, wantSc := dotRef(a)
		for _, workers := range []int{1, 3} {
			for i := range a.Idx {
				a.Idx[i], a.Scores[i] = 77, 77
			}
			if err := DotTopK(a, workers); err != nil {
				t.Fatalf("case %d: %v", it, err)
			}
			for row := range a.Batch() {
				n := len(wantIdx[row])
				if a.Count[row] != int64(n) {
					t.Fatalf("case %d workers %d row %d: count %d, want %d", it, workers, row, a.Count[row], n)
				}
				for i := range a.K {
					gi, gs := a.Idx[row*a.K+i], a.Scores[row*a.K+i]
					if i >= n {
						if gi != -1 || !math.IsInf(float64(gs), -1) {
							t.Fatalf("case %d row %d: padding %d = (%d, %v)", it, row, i, gi, gs)
						}
						continue
					}
					if gi != wantIdx[row][i] || float64(gs) != wantSc[row][i] {
						t.Fatalf("case %d workers %d row %d (dim %d, width %d, k %d): entry %d = (%d, %v), want (%d, %v)",
							it, workers, row, a.Dim, a.Width, a.K, i, gi, gs, wantIdx[row][i], wantSc[row][i])
					}
				}
			}
		}
	}
}

// TestDotTopKFloat: on Gaussian data at ESA's row widths, every returned score is its
// candidate's dot product within float32 rounding, the scores descend, and every candidate left
// out scores no better than the last one kept (up to rounding).
func TestDotTopKFloat(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, d := range []int{1024, 136} {
		rows, b, k := 700, 2, 50
		a := &DotArgs{Dim: d, Q: make([]float32, b*d), Data: make([]float32, rows*d), K: k,
			Idx: make([]int32, b*k), Scores: make([]float32, b*k)}
		for i := range a.Q {
			a.Q[i] = float32(r.NormFloat64())
		}
		for i := range a.Data {
			a.Data[i] = float32(r.NormFloat64())
		}
		if err := DotTopK(a, 2); err != nil {
			t.Fatal(err)
		}
		for row := range b {
			dot := func(c int32) (s, mag float64) {
				for j := range d {
					p := float64(a.Q[row*d+j]) * float64(a.Data[int(c)*d+j])
					s, mag = s+p, mag+math.Abs(p)
				}
				return
			}
			kept := map[int32]bool{}
			for i := range k {
				c, sc := a.Idx[row*k+i], a.Scores[row*k+i]
				kept[c] = true
				want, mag := dot(c)
				if math.Abs(float64(sc)-want) > 1e-5*mag {
					t.Fatalf("d %d row %d entry %d: score %v, want %v", d, row, i, sc, want)
				}
				if i > 0 && sc > a.Scores[row*k+i-1] {
					t.Fatalf("d %d row %d: scores not descending at %d", d, row, i)
				}
			}
			last := float64(a.Scores[row*k+k-1])
			for c := range int32(rows) {
				if s, mag := dot(c); !kept[c] && s > last+1e-5*mag {
					t.Fatalf("d %d row %d: candidate %d (%v) left out, last kept %v", d, row, c, s, last)
				}
			}
		}
	}
}

// TestDotTopKRefusesBadArguments: each bad shape or candidate is ErrInvalid naming what is
// wrong, and nothing is written.
func TestDotTopKRefusesBadArguments(t *testing.T) {
	good := func() *DotArgs {
		return &DotArgs{Dim: 4, Q: make([]float32, 8), Data: make([]float32, 12), Cand: []int32{0, 1, 2, -1}, Width: 2, K: 2,
			Idx: []int32{9, 9, 9, 9}, Scores: make([]float32, 4), Count: make([]int64, 2)}
	}
	for _, c := range []struct {
		name string
		mod  func(a *DotArgs)
		want string
	}{
		{"dim", func(a *DotArgs) { a.Dim = 0 }, "dim 0"},
		{"q rows", func(a *DotArgs) { a.Q = a.Q[:7] }, "not whole rows"},
		{"topk", func(a *DotArgs) { a.K = -1 }, "topk -1"},
		{"outputs", func(a *DotArgs) { a.Scores = a.Scores[:3] }, "outputs"},
		{"count", func(a *DotArgs) { a.Count = a.Count[:1] }, "count of 1"},
		{"width", func(a *DotArgs) { a.Width = 3 }, "width 3"},
		{"candidate past the rows", func(a *DotArgs) { a.Cand[3] = 3 }, "candidate 3 (row 1, column 1): outside [-1, 3)"},
		{"candidate below -1", func(a *DotArgs) { a.Cand[2] = -2 }, "candidate -2 (row 1, column 0)"},
	} {
		a := good()
		c.mod(a)
		err := DotTopK(a, 2)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want ErrInvalid saying %q", c.name, err, c.want)
		}
		if a.Idx[0] != 9 {
			t.Fatalf("%s: output written", c.name)
		}
	}
	if err := DotTopK(good(), 2); err != nil {
		t.Fatal(err)
	}
}

// maxDotRef is MaxDotTopK by brute force, from UCM's TopKImpl: float64 means and dots (exact
// on the test's dyadic values), a stable sort of the middle blocks.
func maxDotRef(a *MaxDotArgs) []int32 {
	n, d := a.Blocks(), a.Dim
	if n == 0 || a.K == 0 {
		return nil
	}
	var out []int32
	if a.Init+a.Local >= n || a.K >= n {
		for i := range n {
			out = append(out, int32(i))
		}
		return out
	}
	g := a.QHeads / a.KVHeads
	score := make([]float64, n)
	for b := range n {
		for h := range a.KVHeads {
			best := math.Inf(-1)
			for m := range a.M {
				var s float64
				for i := range d {
					var q float64
					for j := range g {
						q += float64(a.Q[(h*g+j)*d+i])
					}
					s += q / float64(g) * float64(a.Reprs[((b*a.KVHeads+h)*a.M+m)*d+i])
				}
				best = math.Max(best, s)
			}
			score[b] += best
		}
	}
	for i := range a.Init {
		out = append(out, int32(i))
	}
	for i := n - a.Local; i < n; i++ {
		out = append(out, int32(i))
	}
	var mid []int
	for i := a.Init; i < n-a.Local; i++ {
		mid = append(mid, i)
	}
	sort.SliceStable(mid, func(x, y int) bool { return score[mid[x]] > score[mid[y]] })
	for _, i := range mid[:max(a.K-a.Init-a.Local, 0)] {
		out = append(out, int32(i))
	}
	return out
}

// TestMaxDotTopK: MaxDotTopK equals the reference exactly, for group sizes 1 to 8, several
// rows per head, ties, UCM's windows and others, and the edge cases (no block, K 0, K ≥ n,
// windows covering the blocks, K below the windows); the query is not modified.
func TestMaxDotTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for it := range 400 {
		kv := 1 + r.IntN(4)
		g := []int{1, 2, 4, 8}[r.IntN(4)]
		a := &MaxDotArgs{QHeads: kv * g, KVHeads: kv, M: 1 + r.IntN(3), Dim: []int{1, 8, 16, 24}[r.IntN(4)],
			Init: 1, Local: 2}
		if r.IntN(4) == 0 {
			a.Init, a.Local = r.IntN(3), r.IntN(3)
		}
		n := r.IntN(40)
		a.K = []int{0, 1, 2, 3, 4, r.IntN(n + 3), n, n + 1}[r.IntN(8)]
		a.Q = make([]float32, a.QHeads*a.Dim)
		for i := range a.Q {
			a.Q[i] = float32(r.IntN(5) - 2)
		}
		a.Reprs = make([]float32, n*kv*a.M*a.Dim)
		for i := range a.Reprs {
			a.Reprs[i] = float32(r.IntN(3) - 1)
		}
		q0 := slices.Clone(a.Q)
		want := maxDotRef(a)
		a.Out = make([]int32, len(want)+2)
		a.Out[len(want)] = 99
		got, err := MaxDotTopK(a, 1+r.IntN(3))
		if err != nil {
			t.Fatalf("case %d: %v", it, err)
		}
		if !slices.Equal(a.Out[:got], want) || a.Out[len(want)] != 99 {
			t.Fatalf("case %d (n %d, k %d, windows %d/%d, g %d, m %d): %v, want %v", it, n, a.K, a.Init, a.Local, g, a.M, a.Out[:got], want)
		}
		if !slices.Equal(a.Q, q0) {
			t.Fatalf("case %d: q modified", it)
		}
	}
	bad := &MaxDotArgs{QHeads: 3, KVHeads: 2, M: 1, Dim: 4}
	if _, err := MaxDotTopK(bad, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("3 heads over 2: %v", err)
	}
	short := &MaxDotArgs{QHeads: 2, KVHeads: 2, M: 1, Dim: 1, Q: []float32{1, 1}, Reprs: make([]float32, 20), K: 5, Init: 1, Local: 2, Out: make([]int32, 4)}
	if _, err := MaxDotTopK(short, 1); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "out of 4 for 5") {
		t.Fatalf("short out: %v", err)
	}
}

// softmaxRef is SoftmaxTopK's block scores in float64 from the same fp16 values.
func softmaxRef(a *SoftmaxArgs) []float64 {
	f16 := func(b []byte, i int) float64 {
		return float64(kernels.Float16ToFloat32(uint16(b[2*i]) | uint16(b[2*i+1])<<8))
	}
	n, g, d := a.Blocks(), a.QHeads/a.KVHeads, a.Dim
	s := n * a.M
	scores := make([]float64, n)
	for x := range a.Tokens {
		for hq := range a.QHeads {
			h := hq / g
			y := make([]float64, s)
			mx := math.Inf(-1)
			for r := range s {
				for i := range d {
					c := i
					if a.Channels != nil {
						c = int(a.Channels[h*d+i])
					}
					y[r] += f16(a.Q, (x*a.QHeads+hq)*a.QDim+c) * f16(a.Reprs, (r*a.KVHeads+h)*d+i)
				}
				mx = math.Max(mx, y[r])
			}
			var sum float64
			for r := range y {
				y[r] = math.Exp(y[r] - mx)
				sum += y[r]
			}
			for r := range y {
				scores[r/a.M] += y[r] / sum
			}
		}
	}
	return scores
}

// TestSoftmaxTopK: the ids are the reference's best min(K, n) up to float32 rounding (a
// swap only between scores within 1e-5 of each other), in descending order by the reference
// scores up to the same rounding, with and without channels, for GQA groups of 1 to 8 heads;
// one worker and three agree exactly.
func TestSoftmaxTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	f16 := func(n int, scale float64) []byte {
		b := make([]byte, 2*n)
		for i := range n {
			h := kernels.Float32ToFloat16(float32(r.NormFloat64() * scale))
			b[2*i], b[2*i+1] = byte(h), byte(h>>8)
		}
		return b
	}
	for it := range 120 {
		kv := 1 + r.IntN(3)
		// Groups of 4 and 8 and dims a multiple of 8 take the two-row kernel, even M the
		// four-column block sums; the other shapes the portable loops.
		g := []int{1, 2, 3, 4, 8}[r.IntN(5)]
		a := &SoftmaxArgs{Tokens: 1 + r.IntN(3), QHeads: kv * g, KVHeads: kv, M: 1 + r.IntN(4), Dim: []int{8, 16, 20, 64, 72}[r.IntN(5)]}
		a.QDim = a.Dim
		if r.IntN(2) == 0 {
			a.QDim = a.Dim + r.IntN(9)
			a.Channels = make([]int64, kv*a.Dim)
			for h := range kv {
				for i, c := range r.Perm(a.QDim)[:a.Dim] {
					a.Channels[h*a.Dim+i] = int64(c)
				}
			}
		}
		n := 1 + r.IntN(60)
		a.Q = f16(a.Tokens*a.QHeads*a.QDim, 0.7)
		a.Reprs = f16(n*a.M*kv*a.Dim, 0.7)
		a.K = r.IntN(n + 3)
		a.Idx = make([]int64, min(a.K, n))
		got, err := SoftmaxTopK(a, 1)
		if err != nil {
			t.Fatalf("case %d: %v", it, err)
		}
		if got != min(a.K, n) {
			t.Fatalf("case %d: %d ids, want %d", it, got, min(a.K, n))
		}
		one := slices.Clone(a.Idx)
		if _, err := SoftmaxTopK(a, 3); err != nil || !slices.Equal(a.Idx, one) {
			t.Fatalf("case %d: three workers %v, one %v (%v)", it, a.Idx, one, err)
		}
		ref := softmaxRef(a)
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(x, y int) bool { return ref[order[x]] > ref[order[y]] })
		const tol = 1e-5
		kept := map[int64]bool{}
		for i, b := range a.Idx[:got] {
			kept[b] = true
			if ref[b] < ref[order[i]]-tol {
				t.Fatalf("case %d: entry %d is block %d (%v), the reference's is %d (%v)", it, i, b, ref[b], order[i], ref[order[i]])
			}
		}
		if got > 0 {
			last := ref[order[got-1]]
			for b := range n {
				if !kept[int64(b)] && ref[b] > last+tol {
					t.Fatalf("case %d: block %d (%v) left out, the k-th scores %v", it, b, ref[b], last)
				}
			}
		}
	}
	bad := &SoftmaxArgs{Tokens: 1, QHeads: 2, KVHeads: 2, M: 1, Dim: 2, QDim: 3, Q: make([]byte, 12), Reprs: make([]byte, 16),
		Channels: []int64{0, 1, 2, 3}, K: 1, Idx: make([]int64, 1)}
	if _, err := SoftmaxTopK(bad, 1); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "channel 3 (KV head 1, column 1)") {
		t.Fatalf("bad channel: %v", err)
	}
	bad.Channels = nil
	if _, err := SoftmaxTopK(bad, 1); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no channels") {
		t.Fatalf("dims without channels: %v", err)
	}
}

// BenchmarkSoftmaxTopK: KVStar's retrieval at sparse_bench.py's kvstar-1024 shape (1,024 blocks
// of M 32 rows, 8 KV heads of 64 kept channels, 32 query heads of 128, one token, top 307) on
// one worker.
func BenchmarkSoftmaxTopK(b *testing.B) {
	r := rand.New(rand.NewPCG(51, 52))
	const n, m, kv, dp, qh, d = 1024, 32, 8, 64, 32, 128
	f16 := func(c int) []byte {
		out := make([]byte, 2*c)
		for i := range c {
			h := kernels.Float32ToFloat16(float32(r.NormFloat64()))
			out[2*i], out[2*i+1] = byte(h), byte(h>>8)
		}
		return out
	}
	a := &SoftmaxArgs{Q: f16(qh * d), Reprs: f16(n * m * kv * dp), Tokens: 1, QHeads: qh, QDim: d, KVHeads: kv, M: m, Dim: dp,
		K: 307, Idx: make([]int64, 307), Channels: make([]int64, kv*dp)}
	for h := range kv {
		for i, c := range r.Perm(d)[:dp] {
			a.Channels[h*dp+i] = int64(c)
		}
	}
	for b.Loop() {
		if _, err := SoftmaxTopK(a, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMaxDotTopKNonFinite: a head's dot that is NaN or infinite counts as UCM's per-head fmax
// counts it (a NaN head is dropped for -MaxFloat32, a -Inf head is -MaxFloat32), whichever path
// scores the block; ties keep the lower block first.
func TestMaxDotTopKNonFinite(t *testing.T) {
	const d = 16
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	heads := [][2]float32{{1, 1}, {nan, 0.25}, {-1, -1}, {-inf, 1}, {2, 2}, {inf, -inf}, {0.5, 0.5}, {0, 0}}
	a := &MaxDotArgs{QHeads: 2, KVHeads: 2, M: 1, Dim: d, K: 7, Q: make([]float32, 2*d), Reprs: make([]float32, len(heads)*2*d)}
	for i := range a.Q {
		a.Q[i] = 1
	}
	for b, hv := range heads {
		for h, v := range hv {
			row := a.Reprs[(2*b+h)*d : (2*b+h+1)*d]
			if v != v || v-v != 0 { // one non-finite element in an otherwise zero row
				row[3] = v
				continue
			}
			for i := range row {
				row[i] = v
			}
		}
	}
	want := []int32{5, 4, 0, 6, 7, 2, 1}
	for _, workers := range []int{1, 3} {
		a.Out = make([]int32, 8)
		got, err := MaxDotTopK(a, workers)
		if err != nil || !slices.Equal(a.Out[:got], want) {
			t.Fatalf("%d workers: %v (%v), want %v", workers, a.Out[:got], err, want)
		}
	}
}

// BenchmarkMaxDotTopK: one decode step of GSA's offload selection at sparse_bench.py's gsa-1024
// shape (32 layers, each 1,024 blocks of 8 KV heads × 128 float32 under 32 query heads, top
// 307) on 1 and 2 workers, over 128 MiB of representations that no cache holds between steps.
// Each run also times a pass of the kernel's own best path over the same bytes on as many
// goroutines (one DotsF32 call per chunk: every block one row of 1,024 values against one
// query), the read floor of the same run, and reports the ratio (x-read):
//
//	go test -run '^$' -bench MaxDotTopK -benchtime 40x ./sparse/
func BenchmarkMaxDotTopK(b *testing.B) {
	r := rand.New(rand.NewPCG(61, 62))
	const layers, n, kv, qh, d, k = 32, 1024, 8, 32, 128, 307
	reprs := make([][]float32, layers)
	for l := range reprs {
		reprs[l] = make([]float32, n*kv*d)
		for i := range reprs[l] {
			reprs[l][i] = float32(r.NormFloat64())
		}
	}
	q := make([]float32, qh*d)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			// Each worker takes every workers-th layer, as a Retriever's workers take the
			// tasks of a step's layers; the read pass is divided the same way.
			outs := make([][]int32, layers)
			for l := range outs {
				outs[l] = make([]int32, n)
			}
			wide := make([]float32, kv*d)
			dots := make([][]float32, workers)
			for w := range dots {
				dots[w] = make([]float32, n)
			}
			each := func(fn func(w, l int)) {
				var wg sync.WaitGroup
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for l := w; l < layers; l += workers {
							fn(w, l)
						}
					}()
				}
				wg.Wait()
			}
			var step, read time.Duration
			for b.Loop() {
				t0 := time.Now()
				each(func(w, l int) {
					a := &MaxDotArgs{Q: q, Reprs: reprs[l], QHeads: qh, KVHeads: kv, M: 1, Dim: d, K: k, Init: 1, Local: 2, Out: outs[l]}
					if _, err := MaxDotTopK(a, 1); err != nil {
						panic(err)
					}
				})
				t1 := time.Now()
				each(func(w, l int) {
					_ = kernels.DotsF32(dots[w], wide, reprs[l], kv*d, 0, kv*d)
				})
				step += t1.Sub(t0)
				read += time.Since(t1)
			}
			b.ReportMetric(float64(read.Microseconds())/float64(b.N)/1e3, "read-ms")
			b.ReportMetric(float64(step)/float64(read), "x-read")
		})
	}
}
