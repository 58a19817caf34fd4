package sparse

import "fmt"

// GSA 002's query-free block score (sources §3B, block_score: access_count):
// score[i] = 0.5·access_count[i] + linspace(0.1, 1.0, B)[i], B the context's blocks and
// access_count[i] the decode steps of this request and layer whose selection held block i
// ([DECISION]: 002 keeps an access history without saying what increments it; windows count).
// It reads no sidecar: the selection favours recent blocks and then keeps what it chose.

// accessWeight is 002's weight of the access count.
const accessWeight = 0.5

func accessKey(req string, layer int) string { return fmt.Sprintf("%s\x00%d", req, layer) }

// accessScores writes 002's score of every block of a context of n blocks into scores.
func (m *blockMethod) accessScores(a *Attention, scores []float64, n int) {
	m.mu.Lock()
	counts := m.access[accessKey(a.Request.ID, a.Layer)]
	m.mu.Unlock()
	for i := range n {
		s := Linspace(0.1, 1.0, n, i)
		if i < len(counts) {
			s += accessWeight * float64(counts[i])
		}
		scores[i] = s
	}
}

// countAccess adds one access to each selected block of the call.
func (m *blockMethod) countAccess(a *Attention, sel []int, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.access == nil {
		m.access = map[string][]int32{}
	}
	key := accessKey(a.Request.ID, a.Layer)
	c := m.access[key]
	if len(c) < n {
		c = append(c, make([]int32, n-len(c))...)
	}
	for _, b := range sel {
		c[b]++
	}
	m.access[key] = c
}

// Linspace is element i of torch.linspace(lo, hi, n): lo + (hi − lo)·i/(n − 1), lo when n = 1,
// computed as torch does (from the nearer end), so that both ends are exact.
func Linspace(lo, hi float64, n, i int) float64 {
	if n <= 1 {
		return lo
	}
	step := (hi - lo) / float64(n-1)
	if i < n/2 {
		return lo + step*float64(i)
	}
	return hi - step*float64(n-1-i)
}
