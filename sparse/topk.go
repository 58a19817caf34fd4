package sparse

import (
	"math"
	"slices"
)

// orderKey32 maps a float32 score to a key whose unsigned order is the order of scores: NaN
// lowest, −0 equal to +0, otherwise the order of the values (orderKey for float32).
func orderKey32(x float32) uint32 {
	b := math.Float32bits(x + 0)
	key := b ^ (uint32(int32(b)>>31) | 1<<31)
	if x != x {
		key = 0
	}
	return key
}

// topKDesc writes to pos[:k] the positions of the k best of scores in score order (score
// descending, ties to the lower position, NaN after every number) and to sc[:k] their scores;
// k is clamped to [0, len(scores)] and returned. keys is scratch (grown as needed).
//
// Each score becomes a key holding orderKey32 in its high half and the position's complement
// in its low half, so keys are distinct and their descending order is the result's order: a
// radix select (kthLargest) keeps the k largest in O(m), and only those k are sorted.
func topKDesc(pos []int32, sc []float32, scores []float32, k int, keys *[]uint64) int {
	m := len(scores)
	k = min(max(k, 0), m)
	if k == 0 {
		return 0
	}
	buf := resize(*keys, 2*m)
	*keys = buf
	ks := buf[:m]
	and, or := ^uint64(0), uint64(0)
	for i, x := range scores {
		key := uint64(orderKey32(x))<<32 | uint64(^uint32(i))
		ks[i] = key
		and, or = and&key, or|key
	}
	top := ks
	if k < m {
		t, _ := kthLargest(ks, buf[m:2*m], and, or, k)
		j := 0
		for _, key := range ks {
			if key >= t { // exactly k keys: they are distinct
				ks[j] = key
				j++
			}
		}
		top = ks[:j]
	}
	slices.Sort(top)
	for i := range k {
		p := ^uint32(top[len(top)-1-i])
		pos[i], sc[i] = int32(p), scores[p]
	}
	return k
}
