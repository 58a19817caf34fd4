package sparse

import (
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
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
