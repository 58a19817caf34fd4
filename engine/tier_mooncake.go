package engine

import (
	"fmt"

	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// The mooncake tier (tiers.KindMooncake, docs/mooncake.md): a cache tier in a Mooncake Store
// pool, between the memory tier and the disk tiers. Its part of the engine is here:
//
//   - loads try it after the memory tier and before the disk tiers (one batch per load batch);
//     a hit backfills the memory tier, a disk hit is written to the pool (promotion);
//   - dumps are written through to it once durable below (asynchronously: a dump never waits
//     for the pool);
//   - lookups count blocks the pool holds (other instances' too);
//   - sidecars are not stored in the pool (they stay in the memory and disk tiers).
//
// A pool that is down is skipped (tiers.MooncakeTier); nothing here waits for it.

// ErrMooncakeNotBuilt is returned (wrapped, naming the tier) by Open for a configuration with a
// mooncake tier in a binary built without the `mooncake` build tag.
var ErrMooncakeNotBuilt = tiers.ErrMooncakeNotBuilt

// Seams for tests: whether Mooncake is linked in, and how the tier's pool client is set up.
var (
	mooncakeBuilt    = tiers.MooncakeBuilt
	openMooncakePool = tiers.OpenMooncakePool
)

// checkMooncakeTier is openTiers' step for the mooncake tier: it fails when this binary cannot
// open one, before Open does any work; the client is set up at the end of Open (openMooncake).
func (e *Engine) checkMooncakeTier(c tiers.Config) error {
	if !mooncakeBuilt {
		return fmt.Errorf("open %s: tier %q (kind %s): %w", e.dir, c.Name, c.Kind, ErrMooncakeNotBuilt)
	}
	e.mcCfg = c
	return nil
}

// openMooncake sets up the mooncake tier's client, once the schema is final (its fingerprint is
// in every object key and header). A master that does not answer does not fail Open: the tier
// starts down and joins when the master answers.
func (e *Engine) openMooncake() error {
	if e.mcCfg.Kind != tiers.KindMooncake || e.opts.ReadOnly || e.opts.LookupOnly {
		return nil
	}
	pool, err := openMooncakePool(*e.mcCfg.Mooncake)
	if err != nil {
		return fmt.Errorf("open %s: tier %q: %w", e.dir, e.mcCfg.Name, err)
	}
	mc, err := tiers.NewMooncakeTier(e.mcCfg.Name, *e.mcCfg.Mooncake, pool, e.opts.Layout, e.fingerprint, e.opts.Logger)
	if err != nil {
		_ = pool.Close()
		return fmt.Errorf("open %s: %w: %w", e.dir, ErrInvalidArgument, err)
	}
	if !mc.Up() {
		e.opts.Logger.Error("ucm: mooncake tier down at open: skipped until its master answers", "tier", e.mcCfg.Name,
			"master", e.mcCfg.Mooncake.MasterServerAddress)
	}
	e.mc = mc
	return nil
}

// closeMooncake stops the mooncake tier (queued write-throughs are dropped).
func (e *Engine) closeMooncake() {
	if e.mc != nil {
		if err := e.mc.Close(); err != nil {
			e.opts.Logger.Warn("ucm: mooncake tier: close", "tier", e.mcCfg.Name, "err", err)
		}
		e.mc = nil
	}
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

// MooncakeStats returns the mooncake tier's counters, and false without one.
func (e *Engine) MooncakeStats() (tiers.MooncakeStats, bool) {
	if e.mc == nil {
		return tiers.MooncakeStats{}, false
	}
	return e.mc.Stats(), true
}

// FlushMooncake waits until every write-through to the mooncake tier queued so far is written
// (or dropped); without a mooncake tier it returns at once.
func (e *Engine) FlushMooncake() {
	if e.mc != nil {
		e.mc.Flush()
	}
}

// mooncakeLoad is loadBatch's first step with a mooncake tier: it loads from the pool the
// blocks of ids[lo:hi] the memory tier does not hold and reports which it served (nil without
// a mooncake tier). Blocks it did not serve are left to the memory and disk tiers.
func (e *Engine) mooncakeLoad(t *Task, shard int, dst [][]byte, lo, hi int, want int64) []bool {
	if e.mc == nil {
		return nil
	}
	ask := make([]bool, hi-lo)
	some := false
	for i := lo; i < hi; i++ {
		id := t.ids[i]
		if id.IsZero() || int64(len(dst[i])) != want || (e.mem != nil && e.mem.Contains(id)) {
			continue // bad input is reported by loadBatch; memory hits are served there
		}
		ask[i-lo], some = true, true
	}
	if !some {
		return nil
	}
	var crcs [][]uint32
	if e.mem != nil && shard == AllShards {
		crcs = make([][]uint32, hi-lo)
	}
	hits := e.mc.Get(t.ids[lo:hi], shard, dst[lo:hi], ask, crcs)
	for k, hit := range hits {
		if !hit {
			continue
		}
		id := t.ids[lo+k]
		e.countLoaded(shard)
		for _, dt := range e.tiers {
			if dt.lru != nil {
				dt.lru.Touch(id)
			}
		}
		if crcs != nil && crcs[k] != nil {
			// Backfill the memory tier, as a disk hit does, with the checksums the bytes
			// were just checked against.
			e.mem.Put(id, dst[lo+k], crcs[k])
		}
	}
	return hits
}

// mooncakeBackfill writes a block loaded from a disk tier to the pool (a promotion).
func (e *Engine) mooncakeBackfill(id BlockID, block []byte, crcs []uint32) {
	if e.mc != nil {
		e.mc.Put(id, block, crcs)
	}
}

// mooncakeWrite writes dumped records through to the pool, once durable below.
func (e *Engine) mooncakeWrite(recs []*wal.Record) {
	if e.mc == nil {
		return
	}
	for _, rec := range recs {
		if b := e.blockBytes(rec); b != nil {
			e.mc.Put(rec.ID, b, rec.ShardCRCs)
		}
	}
}

// mooncakeLookup sets hits[i] for the misses the pool holds.
func (e *Engine) mooncakeLookup(ids []BlockID, hits []bool) {
	if e.mc == nil {
		return
	}
	ask := make([]bool, len(ids))
	some := false
	for i, h := range hits {
		ask[i], some = !h, some || !h
	}
	if !some {
		return
	}
	for i, in := range e.mc.Contains(ids, ask) {
		hits[i] = hits[i] || in
	}
}

// mooncakePrefix extends a leading run of n stored blocks of ids with the blocks the pool
// holds, and the own blocks after them, alternately, until neither adds one.
func (e *Engine) mooncakePrefix(ids []BlockID, n int) int {
	if e.mc == nil || n >= len(ids) {
		return n
	}
	n0 := n
	in := e.mc.Contains(ids[n0:], nil)
	for n < len(ids) {
		start := n
		for n < len(ids) && in[n-n0] {
			n++
		}
		if own, err := e.ix.PrefixLen(ids[n:]); err == nil {
			n += own
		}
		if n == start {
			break
		}
	}
	return n
}
