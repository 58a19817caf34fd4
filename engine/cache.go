package engine

import (
	"errors"
	"fmt"

	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// The cache chain: the tiers.Cache tiers in front of the disk tiers (the memory tier, the
// Mooncake tier), fastest first, in e.caches. Every path that reads or writes blocks routes over
// the chain here, without knowing the kinds in it:
//
//   - loads (loadBatch.serveFromCaches) ask each cache in turn for the blocks no faster cache
//     served; a block one serves is put into the caches before it (backfill), with the
//     checksums its bytes were checked against; a block read from disk is put into every
//     cache (loadBatch.finishHit);
//   - dumps are written through (writeThrough): to the caches that are not Inclusive (shared
//     with other instances) beside the disk write, to the inclusive ones once durable on disk;
//   - Lookup, LookupPrefix and Prefetch ask the caches that are not Inclusive for the blocks
//     the indexes do not hold (lookupCaches, cachedPrefix);
//   - a block dropped from the disk tiers is removed from every cache (uncache);
//   - TierStats reports each cache's accounting (with the disk tiers': Engine.chain).
//
// A new kind of cache is a tiers.Cache implementation and one case in tiers.OpenCache (opened by
// openTiers, or by openCaches when it needs the final schema).

// cacheOptions is what tiers.OpenCache needs of the engine (the layout and fingerprint are
// final once the schema is checked).
func (e *Engine) cacheOptions() tiers.CacheOptions {
	return tiers.CacheOptions{Layout: e.opts.Layout, Fingerprint: e.fingerprint, Logger: e.opts.Logger, OpenPool: openMooncakePool}
}

// openCaches opens the cache tiers whose objects carry the schema's fingerprint, once it is
// final, and appends them to the chain after the memory tier (openTiers); a store opened
// ReadOnly or LookupOnly loads nothing and opens none. Validate orders the configured tiers
// fastest first.
func (e *Engine) openCaches() error {
	if e.opts.ReadOnly || e.opts.LookupOnly {
		return nil
	}
	opened := len(e.caches)
	for _, cfg := range e.laterCaches {
		c, err := tiers.OpenCache(cfg, e.cacheOptions())
		if errors.Is(err, tiers.ErrInvalidConfig) {
			err = fmt.Errorf("open %s: %w: %w", e.dir, ErrInvalidArgument, err)
		} else if err != nil {
			err = fmt.Errorf("open %s: %w", e.dir, err)
		}
		if err != nil {
			for _, c := range e.caches[opened:] {
				_ = c.Close()
			}
			e.caches = e.caches[:opened]
			return err
		}
		e.caches = append(e.caches, c)
	}
	return nil
}

// backfill puts block id (its bytes and shard checksums) into the caches before caches[upTo]:
// the caches faster than the one that served it, or every cache after a disk hit.
func (e *Engine) backfill(id BlockID, block []byte, crcs []uint32, upTo int) {
	for _, c := range e.caches[:upTo] {
		c.Put(id, block, crcs)
	}
}

// writeThrough puts dumped records into the caches whose Inclusive is inclusive. The engine
// calls it twice per write (writeRecords): with false beside the disk write, with true once
// the records are durable. An inclusive cache holds only what the index does, so it must not
// get a block before the block is stored; a cache that is not inclusive (Mooncake's pool) is
// shared with other instances, keyed by content, and checks every load, so a block whose disk
// write then fails is still the right bytes for its id there, and putting it at once takes
// the put out of the dump's path instead of after it.
func (e *Engine) writeThrough(recs []*wal.Record, inclusive bool) {
	for _, c := range e.caches {
		if c.Inclusive() != inclusive {
			continue
		}
		if bp, ok := c.(tiers.BatchPutter); ok {
			// Queued together: written through in one batch (Mooncake's pool).
			var (
				ids  []BlockID
				data [][]byte
				crcs [][]uint32
			)
			for _, rec := range recs {
				if b := e.blockBytes(rec); b != nil {
					ids, data, crcs = append(ids, rec.ID), append(data, b), append(crcs, rec.ShardCRCs)
				}
			}
			if len(ids) > 0 {
				bp.PutBatch(ids, data, crcs)
			}
			continue
		}
		for _, rec := range recs {
			if b := e.blockBytes(rec); b != nil {
				c.Put(rec.ID, b, rec.ShardCRCs)
			}
		}
	}
}

// payloadLender returns the cache that lends the payloads of dumped blocks
// (tiers.PayloadLender), or nil.
func (e *Engine) payloadLender() tiers.PayloadLender {
	for _, c := range e.caches {
		if l, ok := c.(tiers.PayloadLender); ok {
			return l
		}
	}
	return nil
}

// sharesCaches reports whether the chain holds a cache that is not inclusive.
func (e *Engine) sharesCaches() bool {
	for _, c := range e.caches {
		if !c.Inclusive() {
			return true
		}
	}
	return false
}

// uncache removes block id from every cache (it was dropped from the disk tiers).
func (e *Engine) uncache(id BlockID) {
	for _, c := range e.caches {
		c.Remove(id)
	}
}

// lookupCaches sets hits[i] for the misses a cache that is not inclusive holds.
func (e *Engine) lookupCaches(ids []BlockID, hits []bool) {
	for _, c := range e.caches {
		if c.Inclusive() {
			continue
		}
		ask := make([]bool, len(ids))
		some := false
		for i, h := range hits {
			ask[i], some = !h, some || !h
		}
		if !some {
			return
		}
		for i, in := range c.Lookup(ids, ask) {
			hits[i] = hits[i] || in
		}
	}
}

// cachedPrefix extends a leading run of n stored blocks of ids with the blocks the caches that
// are not inclusive hold, and the own blocks after them, alternately, until neither adds one.
func (e *Engine) cachedPrefix(ids []BlockID, n int) int {
	if n >= len(ids) {
		return n
	}
	n0 := n
	var held [][]bool // held[k][i-n0]: the k-th such cache holds ids[i]
	for _, c := range e.caches {
		if !c.Inclusive() {
			held = append(held, c.Lookup(ids[n0:], nil))
		}
	}
	if len(held) == 0 {
		return n
	}
	cached := func(i int) bool {
		for _, in := range held {
			if in[i-n0] {
				return true
			}
		}
		return false
	}
	for n < len(ids) {
		start := n
		for n < len(ids) && cached(n) {
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

// closeCaches closes the caches (at Close, once no task runs). They stay in the chain: a
// closed cache misses and drops what it is given, and its statistics remain readable.
func (e *Engine) closeCaches() {
	for _, c := range e.caches {
		if err := c.Close(); err != nil {
			e.opts.Logger.Warn("ucm: cache tier: close", "tier", c.Name(), "err", err)
		}
	}
}
