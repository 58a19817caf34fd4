package sparse

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// TestTopKDesc compares topKDesc with a stable sort by score descending (NaN last) over
// scores with many ties, NaNs, infinities and both zeros, for every k from 0 past the length.
func TestTopKDesc(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	values := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0, float32(math.Copysign(0, -1)), 1, -1, 2.5}
	var keys []uint64
	for it := range 400 {
		m := r.IntN(70)
		scores := make([]float32, m)
		for i := range scores {
			if r.IntN(2) == 0 {
				scores[i] = values[r.IntN(len(values))]
			} else {
				scores[i] = float32(r.NormFloat64())
			}
		}
		want := make([]int, m)
		for i := range want {
			want[i] = i
		}
		sort.SliceStable(want, func(a, b int) bool {
			x, y := scores[want[a]], scores[want[b]]
			if x != x || y != y {
				return y != y && x == x
			}
			return x > y
		})
		for _, k := range []int{0, 1, r.IntN(m + 1), m - 1, m, m + 3, -2} {
			pos := make([]int32, m+4)
			sc := make([]float32, m+4)
			got := topKDesc(pos, sc, scores, k, &keys)
			if wk := min(max(k, 0), m); got != wk {
				t.Fatalf("case %d k %d: %d entries, want %d", it, k, got, wk)
			}
			for i := range got {
				w := want[i]
				if int(pos[i]) != w || math.Float32bits(sc[i]) != math.Float32bits(scores[w]) {
					t.Fatalf("case %d (m %d) k %d: entry %d = (%d, %v), want (%d, %v); scores %v", it, m, k, i, pos[i], sc[i], w, scores[w], scores)
				}
			}
		}
	}
}
