package tiers

// Placeholder until the tierkit branch lands: the simplest correct LRU and memory cache.

import (
	"sync"

	"github.com/ucm-go/ucm/format"
)

// ID is a block id.
type ID = format.BlockID

// LRU placeholder.
type LRU struct {
	mu    sync.Mutex
	clock uint64
	m     map[ID]*lruEnt
}

type lruEnt struct {
	size   int64
	stamp  uint64
	pins   int
	parent *ID
}

// NewLRU placeholder.
func NewLRU() *LRU { return &LRU{m: map[ID]*lruEnt{}} }

// Add placeholder.
func (l *LRU) Add(id ID, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clock++
	if e := l.m[id]; e != nil {
		e.size, e.stamp = size, l.clock
		return
	}
	l.m[id] = &lruEnt{size: size, stamp: l.clock}
}

// Remove placeholder.
func (l *LRU) Remove(id ID) { l.mu.Lock(); delete(l.m, id); l.mu.Unlock() }

// Touch placeholder.
func (l *LRU) Touch(ids ...ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if e := l.m[id]; e != nil {
			l.clock++
			e.stamp = l.clock
		}
	}
}

// TouchChain placeholder.
func (l *LRU) TouchChain(chain []ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(chain) - 1; i >= 0; i-- {
		if e := l.m[chain[i]]; e != nil {
			l.clock++
			e.stamp = l.clock
		}
	}
}

// Pin placeholder.
func (l *LRU) Pin(id ID) {
	l.mu.Lock()
	if e := l.m[id]; e != nil {
		e.pins++
	}
	l.mu.Unlock()
}

// Unpin placeholder.
func (l *LRU) Unpin(id ID) {
	l.mu.Lock()
	if e := l.m[id]; e != nil && e.pins > 0 {
		e.pins--
	}
	l.mu.Unlock()
}

// Victims placeholder.
func (l *LRU) Victims(bytes int64) []ID {
	l.mu.Lock()
	defer l.mu.Unlock()
	type kv struct {
		id ID
		e  *lruEnt
	}
	var all []kv
	for id, e := range l.m {
		if e.pins == 0 {
			all = append(all, kv{id, e})
		}
	}
	for i := 1; i < len(all); i++ {
		for j := i; j > 0 && all[j].e.stamp < all[j-1].e.stamp; j-- {
			all[j], all[j-1] = all[j-1], all[j]
		}
	}
	var out []ID
	var got int64
	for _, x := range all {
		if got >= bytes {
			break
		}
		out = append(out, x.id)
		got += x.e.size
	}
	return out
}

// Len placeholder.
func (l *LRU) Len() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.m) }

// MemCacheStats placeholder.
type MemCacheStats struct {
	Capacity, Bytes                  int64
	Blocks                           int
	Hits, Misses, Evictions, Inserts int64
}

// MemCache placeholder.
type MemCache struct {
	mu    sync.Mutex
	st    MemCacheStats
	clock uint64
	m     map[ID]*memEnt
}

type memEnt struct {
	data  []byte
	stamp uint64
}

// NewMemCache placeholder.
func NewMemCache(capacity int64) *MemCache {
	return &MemCache{st: MemCacheStats{Capacity: capacity}, m: map[ID]*memEnt{}}
}

// Put placeholder.
func (c *MemCache) Put(id ID, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int64(len(data)) > c.st.Capacity {
		return
	}
	if e := c.m[id]; e != nil {
		c.st.Bytes -= int64(len(e.data))
		delete(c.m, id)
	}
	for c.st.Bytes+int64(len(data)) > c.st.Capacity {
		var old ID
		var oe *memEnt
		for k, e := range c.m {
			if oe == nil || e.stamp < oe.stamp {
				old, oe = k, e
			}
		}
		c.st.Bytes -= int64(len(oe.data))
		delete(c.m, old)
		c.st.Evictions++
	}
	c.clock++
	c.m[id] = &memEnt{data: append([]byte(nil), data...), stamp: c.clock}
	c.st.Bytes += int64(len(data))
	c.st.Inserts++
}

// Get placeholder.
func (c *MemCache) Get(id ID, off int64, dst []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[id]
	if e == nil || off < 0 || off+int64(len(dst)) > int64(len(e.data)) {
		c.st.Misses++
		return false
	}
	copy(dst, e.data[off:])
	c.clock++
	e.stamp = c.clock
	c.st.Hits++
	return true
}

// Contains placeholder.
func (c *MemCache) Contains(id ID) bool { c.mu.Lock(); defer c.mu.Unlock(); return c.m[id] != nil }

// Remove placeholder.
func (c *MemCache) Remove(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.m[id]; e != nil {
		c.st.Bytes -= int64(len(e.data))
		delete(c.m, id)
	}
}

// Stats placeholder.
func (c *MemCache) Stats() MemCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Blocks = len(c.m)
	return s
}
