package engine

import (
	"fmt"

	"github.com/ucm-go/ucm/tiers"
)

// The mooncake tier (tiers.KindMooncake, docs/mooncake.md): a tiers.Cache in a Mooncake Store
// pool, after the memory tier and before the disk tiers. The engine routes over it as over any
// cache (cache.go); tiers.OpenCache builds it once the schema is final (its fingerprint is in
// every object key and header); this file holds the check at Open, its statistics and Flush.
// Sidecars are not stored in the pool. A pool that is down is skipped (tiers.MooncakeTier);
// nothing waits for it.

// ErrMooncakeNotBuilt is returned (wrapped, naming the tier) by Open for a configuration with a
// mooncake tier in a binary built without the `mooncake` build tag.
var ErrMooncakeNotBuilt = tiers.ErrMooncakeNotBuilt

// Seams for tests: whether Mooncake is linked in, and how the tier's pool client is set up.
var (
	mooncakeBuilt    = tiers.MooncakeBuilt
	openMooncakePool = tiers.OpenMooncakePool
)

// checkMooncakeTier is openTiers' step for the mooncake tier: it fails when this binary cannot
// open one, before Open does any work; the tier is opened at the end of Open (openCaches).
func (e *Engine) checkMooncakeTier(c tiers.Config) error {
	if !mooncakeBuilt {
		return fmt.Errorf("open %s: tier %q (kind %s): %w", e.dir, c.Name, c.Kind, ErrMooncakeNotBuilt)
	}
	e.laterCaches = append(e.laterCaches, c)
	return nil
}

// mooncake returns the mooncake tier, or nil without one.
func (e *Engine) mooncake() *tiers.MooncakeTier {
	for _, c := range e.caches {
		if mc, ok := c.(*tiers.MooncakeTier); ok {
			return mc
		}
	}
	return nil
}

// withoutMooncake drops the mooncake tier from a tier list (the list the store records for
// tools: the pool holds nothing the index knows of).
func withoutMooncake(cfgs []tiers.Config) []tiers.Config {
	out := cfgs[:0:0]
	for _, c := range cfgs {
		if c.Kind != tiers.KindMooncake {
			out = append(out, c)
		}
	}
	return out
}

// MooncakeStats returns the mooncake tier's counters, and false without one (or in a store
// opened ReadOnly or LookupOnly, which does not open it).
func (e *Engine) MooncakeStats() (tiers.MooncakeStats, bool) {
	mc := e.mooncake()
	if mc == nil {
		return tiers.MooncakeStats{}, false
	}
	return mc.Stats(), true
}

// FlushMooncake waits until every write-through to the mooncake tier queued so far is written
// (or dropped); without a mooncake tier it returns at once.
func (e *Engine) FlushMooncake() {
	if mc := e.mooncake(); mc != nil {
		mc.Flush()
	}
}
