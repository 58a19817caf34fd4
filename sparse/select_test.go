package sparse

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// bruteTopK is the reference for SelectTopK's middle part: the k best of [s, e) by a full
// sort with the tie rule (score descending, NaN last, ties to the lower index).
func bruteTopK(scores []float64, s, e, k int) []int {
	idx := make([]int, 0, e-s)
	for i := s; i < e; i++ {
		idx = append(idx, i)
	}
	slices.SortFunc(idx, func(a, b int) int {
		x, y := scores[a], scores[b]
		switch {
		case math.IsNaN(x) && !math.IsNaN(y):
			return 1
		case !math.IsNaN(x) && math.IsNaN(y):
			return -1
		case !math.IsNaN(x) && x != y:
			return -cmp.Compare(x, y)
		}
		return cmp.Compare(a, b)
	})
	idx = idx[:min(k, len(idx))]
	slices.Sort(idx)
	return idx
}

// randomScores draws n scores: small integers (many ties), sometimes NaN or ±Inf.
func randomScores(r *rand.Rand, n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		switch r.IntN(20) {
		case 0:
			s[i] = math.NaN()
		case 1:
			s[i] = math.Inf(1 - 2*r.IntN(2))
		case 2:
			s[i] = math.Copysign(0, -1) // ties with +0
		case 3:
			s[i] = r.NormFloat64()
		default:
			s[i] = float64(r.IntN(6))
		}
	}
	return s
}

// checkSelection asserts every sources §10 selection property for one call.
func checkSelection(t *testing.T, scores []float64, init, local, k int) []int {
	t.Helper()
	n := len(scores)
	sel := SelectTopK(scores, init, local, k)
	for i := range sel {
		if sel[i] < 0 || sel[i] >= n || i > 0 && sel[i] <= sel[i-1] {
			t.Fatalf("n %d init %d local %d k %d: selection %v not ascending in range", n, init, local, k, sel)
		}
	}
	if n-local <= init {
		if len(sel) != n {
			t.Fatalf("windows cover the context (n %d, init %d, local %d) but %d selected", n, init, local, len(sel))
		}
		return sel
	}
	for i := range init {
		if !slices.Contains(sel, i) {
			t.Fatalf("init block %d missing from %v", i, sel)
		}
	}
	for i := n - local; i < n; i++ {
		if !slices.Contains(sel, i) {
			t.Fatalf("local block %d missing from %v", i, sel)
		}
	}
	if want := init + local + min(k, n-init-local); len(sel) != want {
		t.Fatalf("n %d init %d local %d k %d: %d selected, want %d", n, init, local, k, len(sel), want)
	}
	want := bruteTopK(scores, init, n-local, k)
	if got := sel[init : len(sel)-local]; !slices.Equal(got, want) {
		t.Fatalf("n %d init %d local %d k %d scores %v: middle %v, brute force %v", n, init, local, k, scores, got, want)
	}
	return sel
}

func TestSelectTopKProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		n := r.IntN(80)
		scores := randomScores(r, n)
		init, local, k := r.IntN(6), r.IntN(6), r.IntN(n+2)
		sel := checkSelection(t, scores, init, local, k)
		// Scores inside the fixed windows do not change the selection.
		moved := slices.Clone(scores)
		for i := range moved {
			if i < init || i >= n-local {
				moved[i] = r.NormFloat64() * 100
			}
		}
		if got := SelectTopK(moved, init, local, k); !slices.Equal(got, sel) {
			t.Fatalf("window scores changed the selection: %v → %v", sel, got)
		}
	}
}

// TestSelectTopKLarge: long contexts (the selection's quickselect path, sorted runs and
// all-equal runs included) against the brute force.
func TestSelectTopKLarge(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for it := range 200 {
		n := 17 + r.IntN(3000)
		scores := randomScores(r, n)
		switch it % 4 {
		case 1: // ascending: a bad case for naive pivots
			for i := range scores {
				scores[i] = float64(i)
			}
		case 2: // one value
			for i := range scores {
				scores[i] = -7
			}
		}
		checkSelection(t, scores, r.IntN(4), 1+r.IntN(4), r.IntN(n))
	}
}

func TestTopKLen(t *testing.T) {
	for _, init := range []int{0, 1, 2, 4} {
		for _, local := range []int{1, 2, 8} {
			for _, ratio := range []float64{0, 0.1, 0.3, 0.77, 1} {
				prev := 0
				for n := range 300 {
					got := TopKLen(n, init, local, ratio)
					if got > n || got < prev {
						t.Fatalf("TopKLen(%d, %d, %d, %v) = %d after %d: not monotone within [0, n]", n, init, local, ratio, got, prev)
					}
					if n > init+local {
						if want := int(float64(n-init-local)*ratio) + init + local; got != want {
							t.Fatalf("TopKLen(%d, %d, %d, %v) = %d, want %d", n, init, local, ratio, got, want)
						}
					} else if got != n {
						t.Fatalf("TopKLen(%d, %d, %d, %v) = %d, want all", n, init, local, ratio, got)
					}
					prev = got
				}
			}
		}
	}
}

func TestGSA002(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		b := 1 + r.IntN(60)
		minBlocks, init, local := r.IntN(8), r.IntN(3), r.IntN(4)
		ratio := r.Float64()
		size := GSA002Size(b, minBlocks, ratio)
		if want := min(max(minBlocks, int(float64(b)*ratio)), b); size != want {
			t.Fatalf("GSA002Size(%d, %d, %v) = %d, want %d", b, minBlocks, ratio, size, want)
		}
		sel := GSA002Select(randomScores(r, b), init, local, minBlocks, ratio)
		req := min(init, b) + min(local, b-min(init, b))
		if size >= req && len(sel) != size {
			t.Fatalf("B %d size %d required %d: %d selected", b, size, req, len(sel))
		}
		if size < req && len(sel) != req {
			t.Fatalf("B %d size %d < required %d: %d selected", b, size, req, len(sel))
		}
	}
}

func TestBudgetBlocks(t *testing.T) {
	for _, c := range []struct {
		n      int
		budget float64
		want   int
	}{{10, 0.3, 3}, {64, 0.1, 6}, {64, 0.2, 12}, {64, 0.3, 19}, {100, 0.29, 29}, {7, 1, 7}, {7, 0, 0}} {
		if got := BudgetBlocks(c.n, c.budget); got != c.want {
			t.Errorf("BudgetBlocks(%d, %v) = %d, want %d", c.n, c.budget, got, c.want)
		}
	}
}

func TestRewriteBlockTable(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 1000 {
		bs := 1 + r.IntN(32)
		seqLen := 1 + r.IntN(500)
		n := (seqLen + bs - 1) / bs
		table := r.Perm(n + r.IntN(3))
		var sel []int
		for i := range n {
			if r.IntN(3) == 0 {
				sel = append(sel, i)
			}
		}
		got, tokens, err := RewriteBlockTable(table, sel, seqLen, bs)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for i, b := range sel {
			if got[i] != table[b] {
				t.Fatalf("new[%d] = %d, want old[%d] = %d", i, got[i], b, table[b])
			}
			for p := b * bs; p < (b+1)*bs; p++ {
				if p < seqLen {
					want++
				}
			}
		}
		if tokens != want {
			t.Fatalf("seq_len' = %d, want %d (tokens of the selected blocks)", tokens, want)
		}
	}
	if _, _, err := RewriteBlockTable([]int{0, 1}, []int{1, 0}, 32, 16); err == nil {
		t.Fatal("a descending selection was accepted")
	}
	if _, _, err := RewriteBlockTable([]int{0, 1}, []int{2}, 32, 16); err == nil {
		t.Fatal("a block beyond the context was accepted")
	}
	if _, tokens, _ := RewriteBlockTable([]int{5, 6, 7}, []int{0, 2}, 35, 16); tokens != 19 {
		t.Fatalf("partial last block: seq_len' %d, want 16 + 3", tokens)
	}
}

func TestOnDeviceKeep(t *testing.T) {
	c := &GSAOnDeviceConfig{TopKTokens: 256, SinkTokens: 64, RecentTokens: 96, BlockDist: "min"}
	for seqLen := 1; seqLen < 2000; seqLen += 7 {
		n := (seqLen + 15) / 16
		init, local, k := c.Keep(n, seqLen, 16)
		if seqLen <= 256 {
			if init+local+k != n {
				t.Fatalf("seq_len %d ≤ topk tokens: %d of %d blocks kept", seqLen, init+local+k, n)
			}
			continue
		}
		if init != 4 || local != 6 || init+local+k != 16 {
			t.Fatalf("seq_len %d: init %d local %d k %d, want 4, 6, 16 in all", seqLen, init, local, k)
		}
	}
}

func FuzzSelectTopK(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(1), uint8(2), uint8(3))
	f.Fuzz(func(t *testing.T, raw []byte, init, local, k uint8) {
		if len(raw) > 512 {
			return
		}
		scores := make([]float64, len(raw))
		for i, b := range raw {
			scores[i] = float64(b % 17)
			if b == 255 {
				scores[i] = math.NaN()
			}
		}
		checkSelection(t, scores, int(init%16), int(local%16), int(k))
	})
}

// BenchmarkTopK: one KV head's top-K of a 1,024-block context at a 10 % budget (the 99 best of
// 1,021 candidates), on softmax-share-like scores.
func BenchmarkTopK(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	scores := make([]float64, 1024)
	for i := range scores {
		scores[i] = math.Exp(r.NormFloat64()*3) / 1024
	}
	var dst []int
	var keys []uint64
	for range b.N {
		dst = selectTopK(dst, &keys, scores, 1, 2, 99)
	}
}

// TestUnionSorted: the union of ascending lists is their sorted, deduplicated concatenation.
func TestUnionSorted(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 300 {
		lists := make([][]int, r.IntN(6))
		var all []int
		for i := range lists {
			for b := range r.IntN(300) {
				if r.IntN(3) == 0 {
					lists[i] = append(lists[i], b)
				}
			}
			all = append(all, lists[i]...)
		}
		slices.Sort(all)
		want := slices.Compact(all)
		if got := unionSorted(lists); !slices.Equal(got, want) && len(got)+len(want) > 0 {
			t.Fatalf("union of %v: %v, want %v", lists, got, want)
		}
	}
}
