package sparse

import (
	"fmt"
	"math"
	"slices"
)

// Block selection (spec §3A, §3B, §4): which logical blocks of a context a decode step attends.
// Scores are higher-is-better float64 (Hamming distances are negated); the order of a top-K is
// score descending, ties to the lower block index, NaN below every number (spec §0
// [DECISION]), so every selection has one right answer that a brute-force sort reproduces.

// better reports whether block i with score a ranks before block j with score b.
func better(a float64, i int, b float64, j int) bool {
	an, bn := a != a, b != b
	switch {
	case an != bn:
		return bn // a number before NaN
	case !an && a != b:
		return a > b
	}
	return i < j
}

// SelectTopK is select_topk_blocks of spec §3A over a context of n = len(scores) blocks: the
// init leading and local trailing blocks, and the k best-scoring blocks between them (all of
// them when fewer), ascending. When the windows cover the context (n − local ≤ init) every
// block is selected. init, local and k below 0 count as 0.
func SelectTopK(scores []float64, init, local, k int) []int {
	return selectTopK(nil, nil, scores, init, local, k)
}

// selectTopK is SelectTopK appending to dst[:0] with idx as scratch.
func selectTopK(dst, idx []int, scores []float64, init, local, k int) []int {
	n := len(scores)
	init, local, k = max(init, 0), max(local, 0), max(k, 0)
	s, e := init, n-local
	dst = dst[:0]
	if e <= s {
		for i := range n {
			dst = append(dst, i)
		}
		return dst
	}
	k = min(k, e-s)
	for i := range s {
		dst = append(dst, i)
	}
	if k == e-s {
		for i := s; i < e; i++ {
			dst = append(dst, i)
		}
	} else if k > 0 {
		idx = idx[:0]
		for i := s; i < e; i++ {
			idx = append(idx, i)
		}
		top := topK(idx, scores, k)
		slices.Sort(top)
		dst = append(dst, top...)
	}
	for i := e; i < n; i++ {
		dst = append(dst, i)
	}
	return dst
}

// topK reorders idx so that its first k entries are the k best blocks by scores, and returns
// them (in no particular order). It partially sorts with a bounded heap: O(m log k).
func topK(idx []int, scores []float64, k int) []int {
	if k >= len(idx) {
		return idx
	}
	// Min-heap on "better" of the first k entries: the root is the worst kept.
	h := idx[:k]
	worse := func(a, b int) bool { return better(scores[b], b, scores[a], a) }
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= k {
				return
			}
			m := l
			if r := l + 1; r < k && worse(h[r], h[l]) {
				m = r
			}
			if !worse(h[m], h[i]) {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	for _, j := range idx[k:] {
		if better(scores[j], j, scores[h[0]], h[0]) {
			h[0] = j
			down(0)
		}
	}
	return h
}

// TopKLen is compute_topk_len of spec §3A: the blocks kept of a context of blockLen blocks,
// int((blockLen − init − local)·ratio) + init + local, or blockLen when the windows cover it.
// It is non-decreasing in blockLen and never exceeds it (for ratio in [0, 1]).
func TopKLen(blockLen, init, local int, ratio float64) int {
	sparse := blockLen - init - local
	if sparse <= 0 {
		return blockLen
	}
	return int(float64(sparse)*ratio) + init + local
}

// BudgetBlocks is the blocks a budget keeps of n, windows included: ⌊n·budget⌋ (with a
// tolerance of 1e-9 for ratios like 0.3 that are not exact in binary), within [0, n].
func BudgetBlocks(n int, budget float64) int {
	return max(0, min(n, int(math.Floor(float64(n)*budget+1e-9))))
}

// GSA002Size is the blocks GSA 002 keeps of B (spec §3B): min(max(minBlocks, ⌊B·ratio⌋), B).
func GSA002Size(b, minBlocks int, ratio float64) int {
	return min(max(minBlocks, int(float64(b)*ratio)), b)
}

// GSA002Select is GSA 002's selection (spec §3B): the init leading and local trailing blocks
// are required, and the best GSA002Size − |required| of the others (clamped to how many there
// are, [DECISION]) are added; ascending.
func GSA002Select(scores []float64, init, local, minBlocks int, ratio float64) []int {
	b := len(scores)
	init = min(max(init, 0), b)
	local = min(max(local, 0), b-init)
	r := GSA002Size(b, minBlocks, ratio) - init - local
	return SelectTopK(scores, init, local, max(r, 0))
}

// RewriteBlockTable is the block-table rewrite of spec §3A: for the logical blocks sel of a
// context of seqLen tokens in blocks of bs (ascending, unique, each below ⌈seqLen/bs⌉), the
// new table is table[sel[i]] and the new seq_len the tokens of the selected blocks, the last
// block counting only the tokens it has ([DECISION]). table must cover the context.
func RewriteBlockTable(table, sel []int, seqLen, bs int) ([]int, int, error) {
	if bs < 1 || seqLen < 0 {
		return nil, 0, fmt.Errorf("%w: rewrite: seq_len %d, block size %d", ErrInvalid, seqLen, bs)
	}
	n := (seqLen + bs - 1) / bs
	if len(table) < n {
		return nil, 0, fmt.Errorf("%w: rewrite: a table of %d blocks for %d tokens of %d", ErrInvalid, len(table), seqLen, bs)
	}
	out := make([]int, len(sel))
	tokens := 0
	for i, b := range sel {
		if b < 0 || b >= n || i > 0 && b <= sel[i-1] {
			return nil, 0, fmt.Errorf("%w: rewrite: selection %d (block %d) not ascending in [0, %d)", ErrInvalid, i, b, n)
		}
		out[i] = table[b]
		tokens += min(bs, seqLen-b*bs)
	}
	return out, tokens, nil
}
