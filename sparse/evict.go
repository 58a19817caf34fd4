package sparse

import (
	"fmt"
	"strings"
)

// Eviction policies of the prefetch cache (GSA 000, sources §3A): when the cache is full and a
// block must be loaded, the resident entry with the lowest priority is evicted. Entries being
// loaded or in use by an attention call are never candidates; entries inside their
// prefetch_ahead protection are candidates only when nothing else is.

// EvictionPolicy names how the prefetch cache chooses a victim.
type EvictionPolicy int

// Eviction policies.
const (
	// EvictLRU evicts the least recently used entry (exact: an access counter, not a clock).
	EvictLRU EvictionPolicy = iota
	// EvictScore evicts the entry with the lowest selection score (ties: least recently used).
	EvictScore
	// EvictHybrid evicts the lowest 0.7·score + 0.3/(age+1), age in decode steps since the
	// entry's last use (ties: least recently used).
	EvictHybrid
)

// Hybrid weights (sources §3A: HybridEvictionPolicy's defaults).
const (
	hybridScoreWeight   = 0.7
	hybridRecencyWeight = 0.3
)

var evictionNames = []string{"lru", "score", "hybrid"}

// ParseEvictionPolicy parses a policy name: lru, score or hybrid (any case).
func ParseEvictionPolicy(s string) (EvictionPolicy, error) {
	for i, n := range evictionNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return EvictionPolicy(i), nil
		}
	}
	return 0, fmt.Errorf("%w: eviction policy %q (want %s)", ErrInvalid, s, strings.Join(evictionNames, ", "))
}

// String returns the policy's configuration name (lru, score, hybrid).
func (p EvictionPolicy) String() string {
	if p >= 0 && int(p) < len(evictionNames) {
		return evictionNames[p]
	}
	return fmt.Sprintf("EvictionPolicy(%d)", int(p))
}

// EvictionInfo is what a policy knows of a resident entry.
type EvictionInfo struct {
	// Score is the entry's normalised selection score in [0, 1] at its last selection or
	// prediction (1 for window blocks and blocks without a usable sidecar).
	Score float64
	// LastUse is the access counter at the entry's last use; LastStep the decode step clock then.
	LastUse  uint64
	LastStep int64
	// Unused marks a speculative prefetch no attention call has used yet: evicted first.
	Unused bool
}

// Priority is the entry's keep-priority at decode step now under policy p: the victim is the
// entry with the lowest, ties to the lowest LastUse.
func (p EvictionPolicy) Priority(e EvictionInfo, now int64) float64 {
	switch p {
	case EvictScore:
		return e.Score
	case EvictHybrid:
		age := float64(max(now-e.LastStep, 0))
		return hybridScoreWeight*e.Score + hybridRecencyWeight/(age+1)
	}
	return float64(e.LastUse)
}

// lowerPriority reports whether a is evicted before b at step now: an unused speculative entry
// before a used one, then by Priority.
func (p EvictionPolicy) lowerPriority(a, b EvictionInfo, now int64) bool {
	if a.Unused != b.Unused {
		return a.Unused
	}
	pa, pb := p.Priority(a, now), p.Priority(b, now)
	if pa != pb {
		return pa < pb
	}
	return a.LastUse < b.LastUse
}
