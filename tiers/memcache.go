package tiers

import (
	"fmt"
	"sync"

	"github.com/ucm-go/ucm/format"
)

// checkChunk is how many bytes Get copies before it checksums them: small enough that the
// checksum reads them from cache, large enough that the loop costs nothing.
const checkChunk = 64 << 10

// ID is a block's identity: 16 opaque bytes (the MD5 chain hash of its tokens).
type ID = format.BlockID

// MemCache is the memory tier: a host-DRAM LRU cache of whole blocks with a byte capacity.
// It is safe for concurrent use. Every block is cached with the checksums of its parts (its
// shards), and Get verifies the bytes it copies against them: memory is not trusted more
// than a disk. Cached blocks are immutable: Put stores a private copy and a
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

	hits, misses, evictions, inserts, corrupt uint64
}

type memEntry struct {
	id         ID
	data       []byte
	crcs       []uint32 // format.Checksum of each of len(crcs) equal parts of data
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
	Corrupt   uint64 // Gets that found bytes not matching their checksum (the block was dropped)
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
// blocks until it fits; the caller may reuse data as soon as Put returns. crcs are the
// format.Checksum of data's len(crcs) equal parts (a block's shards), which Get verifies; data
// that does not split into len(crcs) equal parts is not cached. A re-Put replaces the cached
// block. A block larger than the capacity is not cached (and any older version of it is
// removed, so a Get never returns stale bytes for id).
func (c *MemCache) Put(id ID, data []byte, crcs []uint32) {
	size := int64(len(data))
	if size > c.capacity || len(crcs) == 0 || len(data)%len(crcs) != 0 { // capacity never changes: no lock needed
		c.Remove(id)
		return
	}
	e := &memEntry{id: id, data: append(make([]byte, 0, len(data)), data...), crcs: append([]uint32(nil), crcs...)}
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

// Get copies len(dst) bytes of block id, from offset off, into dst, verifying every part it
// copies against its checksum, marks the block most recently used and returns true. It
// returns false, leaving dst untouched and the recency unchanged, when the block is not cached
// or [off, off+len(dst)) is not a run of whole parts of it. When a part's bytes do not match
// their checksum the block is dropped from the cache and Get returns false with an error
// wrapping format.ErrCorrupt that names the block and part; dst then holds unverified bytes
// (the caller reads the block from a lower tier).
func (c *MemCache) Get(id ID, off int64, dst []byte) (bool, error) {
	c.mu.Lock()
	e := c.entries[id]
	var unit int64
	if e != nil {
		unit = int64(len(e.data) / len(e.crcs))
	}
	if e == nil || off < 0 || off > int64(len(e.data)) || int64(len(dst)) > int64(len(e.data))-off ||
		(unit > 0 && (off%unit != 0 || int64(len(dst))%unit != 0)) {
		c.misses++
		c.mu.Unlock()
		return false, nil
	}
	c.hits++ // undone below if a part fails its checksum
	if c.root.next != e {
		c.removeFromListLocked(e)
		c.pushFrontLocked(e)
	}
	c.mu.Unlock()
	// e.data and e.crcs are immutable and stay valid after eviction while we hold e.
	for p := int64(0); p*unit < int64(len(dst)); p++ {
		part := int(off/unit + p)
		src, to := e.data[int64(part)*unit:int64(part+1)*unit], dst[p*unit:(p+1)*unit]
		var crc uint32
		for a := 0; a < len(src); a += checkChunk {
			b := min(a+checkChunk, len(src))
			copy(to[a:b], src[a:b])
			crc = format.ChecksumUpdate(crc, to[a:b])
		}
		if crc != e.crcs[part] {
			c.mu.Lock()
			if c.entries[id] == e {
				c.unlinkLocked(e)
			}
			c.hits--
			c.corrupt++
			c.misses++
			c.mu.Unlock()
			return false, fmt.Errorf("memory tier: block %s part %d: checksum %08x, want %08x: %w", id, part, crc, e.crcs[part], format.ErrCorrupt)
		}
	}
	return true, nil
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
		Hits: c.hits, Misses: c.misses, Evictions: c.evictions, Inserts: c.inserts, Corrupt: c.corrupt,
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
