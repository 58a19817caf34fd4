package sparse

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// Block selection (sources §3A, §3B, §4): which logical blocks of a context a decode step attends.
// Scores are higher-is-better float64 (Hamming distances are negated); the order of a top-K is
// score descending, ties to the lower block index, NaN below every number (sources §0
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

// SelectTopK is select_topk_blocks of sources §3A over a context of n = len(scores) blocks: the
// init leading and local trailing blocks, and the k best-scoring blocks between them (all of
// them when fewer), ascending. When the windows cover the context (n − local ≤ init) every
// block is selected. init, local and k below 0 count as 0.
func SelectTopK(scores []float64, init, local, k int) []int {
	return selectTopK(nil, nil, scores, init, local, k)
}

// selectTopK is SelectTopK appending to dst[:0], with *keys (when not nil) as scratch.
func selectTopK(dst []int, keys *[]uint64, scores []float64, init, local, k int) []int {
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
		var scratch []uint64
		if keys == nil {
			keys = &scratch
		}
		dst = appendTopK(dst, keys, scores, s, e, k)
	}
	for i := e; i < n; i++ {
		dst = append(dst, i)
	}
	return dst
}

// orderKey maps a score to a key whose unsigned order is better's order of scores: NaN lowest,
// −0 equal to +0, otherwise the order of the float64 values.
func orderKey(x float64) uint64 {
	b := math.Float64bits(x + 0)              // −0 + 0 = +0
	key := b ^ (uint64(int64(b)>>63) | 1<<63) // negative: all bits flipped; else the sign set
	if x != x {
		key = 0
	}
	return key
}

// appendTopK appends to dst, ascending, the k (0 < k < e − s) best blocks of s … e−1 by
// scores (ties to the lower index). It finds the k-th best key by a radix select (O(m) for m =
// e − s blocks) and then scans the keys in block order, so the result needs no sort: the blocks
// with a better key, and the lowest-indexed ones with the k-th key itself. *keys is scratch.
func appendTopK(dst []int, keys *[]uint64, scores []float64, s, e, k int) []int {
	m := e - s
	buf := resize(*keys, 2*m)
	*keys = buf
	ks, work := buf[:m], buf[m:2*m]
	and, or := ^uint64(0), uint64(0)
	for i, x := range scores[s:e] {
		key := orderKey(x)
		ks[i] = key
		and, or = and&key, or|key
	}
	t, above := kthLargest(ks, work, and, or, k)
	ties := k - above
	for i, key := range ks {
		switch {
		case key > t:
			dst = append(dst, s+i)
		case key == t && ties > 0:
			dst = append(dst, s+i)
			ties--
		}
	}
	return dst
}

// radixBits is the bits kthLargest counts by in a round: 2,048 counters (8 KiB) split a
// thousand scores' keys into buckets of a few keys in one round.
const radixBits = 11

// kthLargest returns the k-th largest t of the keys src (1 ≤ k ≤ len(src); and, or: the AND
// and the OR of them all) and how many keys are larger than t, using work (len(src)) as
// scratch: a radix select. Each round takes radixBits bits from the highest one in which the
// remaining keys differ, counts the keys by them, finds the value holding the k-th largest
// (the keys of higher values are all larger than t), and keeps only the keys with it: at most
// six rounds over shrinking data, whatever the distribution; the last few keys are sorted.
func kthLargest(src, work []uint64, and, or uint64, k int) (t uint64, above int) {
	a := src
	for and != or {
		if len(a) <= 32 && len(a) < len(src) { // a few left: sort them
			slices.Sort(a)
			t = a[len(a)-k]
			for _, x := range a[len(a)-k+1:] {
				if x > t {
					above++
				}
			}
			return t, above
		}
		// The radixBits bits from the highest one that differs.
		shift := max(63-bits.LeadingZeros64(and^or)-(radixBits-1), 0)
		const mask = 1<<radixBits - 1
		var count [1 << radixBits]int32
		for _, x := range a {
			count[x>>shift&mask]++
		}
		d := mask
		for ; d > 0 && int(count[d]) < k; d-- {
			k -= int(count[d])
			above += int(count[d])
		}
		// Keep the keys with digit d, from src into work in the first round, then in place
		// (a branch: the kept keys are usually a few of many, so it is well predicted).
		j := 0
		and, or = ^uint64(0), 0
		for _, x := range a {
			if int(x>>shift&mask) == d {
				work[j] = x
				and, or = and&x, or|x
				j++
			}
		}
		a = work[:j]
	}
	return and, above
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

// TopKLen is compute_topk_len of sources §3A: the blocks kept of a context of blockLen blocks,
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

// GSA002Size is the blocks GSA 002 keeps of B (sources §3B): min(max(minBlocks, ⌊B·ratio⌋), B).
func GSA002Size(b, minBlocks int, ratio float64) int {
	return min(max(minBlocks, int(float64(b)*ratio)), b)
}

// GSA002Select is GSA 002's selection (sources §3B): the init leading and local trailing blocks
// are required, and the best GSA002Size − |required| of the others (clamped to how many there
// are, [DECISION]) are added; ascending.
func GSA002Select(scores []float64, init, local, minBlocks int, ratio float64) []int {
	b := len(scores)
	init = min(max(init, 0), b)
	local = min(max(local, 0), b-init)
	r := GSA002Size(b, minBlocks, ratio) - init - local
	return SelectTopK(scores, init, local, max(r, 0))
}

// RewriteBlockTable is the block-table rewrite of sources §3A: for the logical blocks sel of a
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
