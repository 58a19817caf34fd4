package engine

import (
	"sync"
	"sync/atomic"

	"github.com/ucm-go/ucm/index"
)

// Locations of a layer-wise load's block list, shared by the loads of its other layers. A
// connector loads a request's blocks layer by layer with the same id list, every layer's load
// issued at once (UCM's start_load_kv): without sharing, each of the L loads looks the same
// ids up in the index, and at 16 KiB shards those lookups were a fifth of a load's CPU. The
// first load of a list looks it up (one index pass, index.GetMany); the loads of the list that
// arrive meanwhile wait for that pass, and later ones reuse it, as long as the index has
// committed no batch since it began (index.Mutations): so a reused location is exactly what
// a lookup would have returned, and anything that moved, evicted or added a block since makes
// the next load look again.

// runCacheEntries bounds the lists remembered: a few batches of requests in flight.
const runCacheEntries = 256

// runCache is the engine's cache of block lists' locations, by list (listKey).
type runCache struct {
	mu      sync.Mutex
	entries map[string]*runLocations
	order   []string // insertion order, for the bound
	// passes counts the index passes made, reuses the loads served by an earlier one.
	passes, reuses atomic.Int64
}

// runLocations is one list's index pass: valid while the index's mutation count is still
// mutations; ready is closed once locs, found and err are set.
type runLocations struct {
	mutations uint64
	ready     chan struct{}
	locs      []index.Location
	found     []bool
	err       error
}

// locateRun fills locs and found for ids (as index.GetMany does), from the pass of an earlier
// or concurrent load of the same list when the index has not changed since it began.
func (e *Engine) locateRun(ids []BlockID, locs []index.Location, found []bool) error {
	key := listKey(ids)
	m := e.ix.Mutations()
	c := &e.runs
	c.mu.Lock()
	r := c.entries[key]
	if r == nil || r.mutations != m {
		r = &runLocations{mutations: m, ready: make(chan struct{})}
		if c.entries == nil {
			c.entries = make(map[string]*runLocations)
		}
		if _, ok := c.entries[key]; !ok {
			c.order = append(c.order, key)
			if len(c.order) > runCacheEntries {
				delete(c.entries, c.order[0])
				c.order = c.order[1:]
			}
		}
		c.entries[key] = r
		c.mu.Unlock()
		c.passes.Add(1)
		r.locs, r.found = make([]index.Location, len(ids)), make([]bool, len(ids))
		r.err = e.ix.GetMany(ids, r.locs, r.found)
		close(r.ready)
		if r.err != nil { // not remembered: the next load looks again
			c.mu.Lock()
			if c.entries[key] == r {
				delete(c.entries, key)
			}
			c.mu.Unlock()
		}
	} else {
		c.mu.Unlock()
		c.reuses.Add(1)
		<-r.ready
	}
	if r.err != nil {
		return r.err
	}
	copy(locs, r.locs)
	copy(found, r.found)
	return nil
}
