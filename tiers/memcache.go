package tiers

import (
	"sync"

	"github.com/ucm-go/ucm/format"
)

// ID is a block's identity: 16 opaque bytes (the MD5 chain hash of its tokens).
type ID = format.BlockID

// MemCache is the memory tier: a host-DRAM LRU cache of whole blocks with a byte capacity.
// It is safe for concurrent use. Cached blocks are immutable: Put stores a private copy and a
// re-Put replaces the entry with a new copy, so a Get that raced with a Put, Remove or
// eviction of the same block copies one complete version of it, never a mix.
//
// Lookups and recency updates take one short mutex; the copy of the bytes in Get runs outside
// it, so many readers copy large blocks in parallel.
type MemCache struct {
	mu       sync.Mutex
	capacity int64
	bytes    int64
	entries  map[ID]*memEntry
	root     memEntry // sentinel of the recency list: root.next most recent, root.prev least

	hits, misses, evictions, inserts uint64
}

type memEntry struct {
	id         ID
	data       []byte
	prev, next *memEntry
}

// MemCacheStats is a snapshot of a MemCache, taken atomically.
type MemCacheStats struct {
	Capacity  int64  // bytes the cache may hold
	Bytes     int64  // data bytes of the cached blocks; never above Capacity
	Blocks    int    // cached blocks
	Hits      uint64 // Gets that copied data
	Misses    uint64 // Gets that returned false (absent block or out-of-range read)
	Evictions uint64 // blocks dropped to make room for a Put (not Remove, not replacement)
	Inserts   uint64 // Puts that cached their block
}

// NewMemCache returns an empty cache that holds at most capacity bytes of block data
// (a capacity <= 0 caches only empty blocks).
func NewMemCache(capacity int64) *MemCache {
	if capacity < 0 {
		capacity = 0
	}
	c := &MemCache{capacity: capacity, entries: make(map[ID]*memEntry)}
	c.root.next, c.root.prev = &c.root, &c.root
	return c
}

// Put caches a copy of data as block id, most recently used, evicting least recently used
// blocks until it fits; the caller may reuse data as soon as Put returns. A re-Put replaces the
// cached block. A block larger than the capacity is not cached (and any older version of it
// is removed, so a Get never returns stale bytes for id).
func (c *MemCache) Put(id ID, data []byte) {
	size := int64(len(data))
	if size > c.capacity { // capacity never changes: no lock needed
		c.Remove(id)
		return
	}
	e := &memEntry{id: id, data: append(make([]byte, 0, len(data)), data...)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.entries[id]; old != nil {
		c.unlinkLocked(old)
	}
	for c.bytes+size > c.capacity {
		c.unlinkLocked(c.root.prev)
		c.evictions++
	}
	c.entries[id] = e
	c.bytes += size
	c.pushFrontLocked(e)
	c.inserts++
}

// Get copies len(dst) bytes of block id, from offset off, into dst, marks the block most
// recently used and returns true. It returns false, leaving dst untouched and the recency
// unchanged, when the block is not cached or [off, off+len(dst)) is not inside it.
func (c *MemCache) Get(id ID, off int64, dst []byte) bool {
	c.mu.Lock()
	e := c.entries[id]
	if e == nil || off < 0 || off > int64(len(e.data)) || int64(len(dst)) > int64(len(e.data))-off {
		c.misses++
		c.mu.Unlock()
		return false
	}
	c.hits++
	if c.root.next != e {
		c.removeFromListLocked(e)
		c.pushFrontLocked(e)
	}
	data := e.data // immutable; stays valid after eviction while we hold it
	c.mu.Unlock()
	copy(dst, data[off:])
	return true
}

// Contains reports whether block id is cached, without changing its recency or the counters.
func (c *MemCache) Contains(id ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[id] != nil
}

// Remove drops block id from the cache if it is there. Gets already copying it finish with
// the complete old bytes; later Gets miss.
func (c *MemCache) Remove(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[id]; e != nil {
		c.unlinkLocked(e)
	}
}

// Stats returns a consistent snapshot of the cache's counters.
func (c *MemCache) Stats() MemCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return MemCacheStats{
		Capacity: c.capacity, Bytes: c.bytes, Blocks: len(c.entries),
		Hits: c.hits, Misses: c.misses, Evictions: c.evictions, Inserts: c.inserts,
	}
}

// unlinkLocked removes e from the map, the list and the byte count.
func (c *MemCache) unlinkLocked(e *memEntry) {
	delete(c.entries, e.id)
	c.removeFromListLocked(e)
	c.bytes -= int64(len(e.data))
}

func (c *MemCache) removeFromListLocked(e *memEntry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

func (c *MemCache) pushFrontLocked(e *memEntry) {
	e.prev = &c.root
	e.next = c.root.next
	e.next.prev = e
	c.root.next = e
}
