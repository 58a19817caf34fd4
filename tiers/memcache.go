package tiers

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// checkChunk is how many bytes Get copies before it checksums them: small enough that the
// checksum reads them from cache, large enough that the loop costs nothing.
const checkChunk = 64 << 10

// ID is a block's identity: 16 opaque bytes (the MD5 chain hash of its tokens).
type ID = format.BlockID

// memKey names a cached item: a block (kind 0) or one of its sidecars.
type memKey struct {
	id   ID
	kind format.SidecarKind
}

// MemCache is the memory tier: a host-DRAM LRU cache of whole blocks, and of blocks' sidecars,
// with a byte capacity shared by both.
// It is safe for concurrent use. Every block is cached with the checksums of its parts (its
// shards), and Get verifies the bytes it copies against them: memory is not trusted more
// than a disk. Cached blocks are immutable: Put stores a private copy and a
// re-Put replaces the entry with a new copy, so a Get that raced with a Put, Remove or
// eviction of the same block copies one complete version of it, never a mix.
//
// Lookups and recency updates take one short mutex; the copy of the bytes in Get runs outside
// it, so many readers copy large blocks in parallel.
//
// The buffers of evicted and replaced items are reused by later Puts of the same size, once no
// Get copies from them any more (a reader count per item): a full cache turns over its blocks
// without allocating, zeroing and first touching a new buffer per Put (on the development VMs a
// first touch of fresh memory cost more than the copy itself). At most freeBudget bytes wait
// for reuse beside the capacity.
type MemCache struct {
	name     string
	mu       sync.Mutex
	capacity int64
	bytes    int64
	entries  map[memKey]*memEntry
	// sidecars holds the kinds cached per block (bit k for kind k), so that Remove drops a
	// block's sidecars with it.
	sidecars map[ID]uint64
	nside    int      // sidecar entries
	root     memEntry // sentinel of the recency list: root.next most recent, root.prev least

	// free holds buffers of unlinked items for reuse, by length; freeBytes their total, at
	// most freeBudget(capacity).
	free      map[int][][]byte
	freeBytes int64

	hits, misses, evictions, inserts, corrupt, reused uint64
}

type memEntry struct {
	key        memKey
	data       []byte
	crcs       []uint32 // format.Checksum of each of len(crcs) equal parts of data
	prev, next *memEntry
	// readers counts the lookups copying from data; linked is false once the item left the
	// cache. data goes back to the free list when both are done. Guarded by MemCache.mu.
	readers int
	linked  bool
}

// minReuseBytes is the smallest buffer worth keeping for reuse, and populating before the first
// copy into it (devio.Populate); smaller items (most sidecars) are left to the garbage
// collector, and their pages to be faulted in by the copy.
const minReuseBytes = 64 << 10

// freeBudget bounds the bytes of unlinked items' buffers a cache of capacity keeps for reuse:
// enough for the Puts of a few tasks in flight, a small share of the capacity.
func freeBudget(capacity int64) int64 { return min(capacity/16, 64<<20) }

// MemCacheStats is a snapshot of a MemCache, taken atomically.
type MemCacheStats struct {
	Capacity  int64  // bytes the cache may hold
	Bytes     int64  // data bytes of the cached blocks; never above Capacity
	Blocks    int    // cached blocks
	Sidecars  int    // cached sidecars (their bytes count in Bytes)
	Hits      uint64 // Gets that copied data
	Misses    uint64 // Gets that returned false (absent block or out-of-range read)
	Evictions uint64 // blocks dropped to make room for a Put (not Remove, not replacement)
	Inserts   uint64 // Puts that cached their block
	Corrupt   uint64 // Gets that found bytes not matching their checksum (the block was dropped)
	Reused    uint64 // Puts that copied into the buffer of an item no longer cached
	FreeBytes int64  // bytes of such buffers waiting for reuse (beside Bytes, not counted in it)
}

// NewMemCache returns an empty cache, the memory tier named name, that holds at most capacity
// bytes of block data (a capacity <= 0 caches only empty blocks).
func NewMemCache(name string, capacity int64) *MemCache {
	if capacity < 0 {
		capacity = 0
	}
	c := &MemCache{name: name, capacity: capacity, entries: make(map[memKey]*memEntry), sidecars: make(map[ID]uint64),
		free: make(map[int][][]byte)}
	c.root.next, c.root.prev = &c.root, &c.root
	return c
}

// Put caches a copy of data as block id, most recently used, evicting least recently used
// blocks until it fits; the caller may reuse data as soon as Put returns. crcs are the
// format.Checksum of data's len(crcs) equal parts (a block's shards), which Get verifies; data
// that does not split into len(crcs) equal parts is not cached. A re-Put replaces the cached
// block. A block larger than the capacity is not cached (and any older version of it is
// removed, so a Get never returns stale bytes for id).
func (c *MemCache) Put(id ID, data []byte, crcs []uint32) { c.put(memKey{id, 0}, data, crcs) }

// PutSidecar caches a copy of block id's sidecar of kind (a valid sidecar kind), as Put does
// for blocks: crcs are the checksums of its len(crcs) equal parts. The sidecar shares the
// capacity and the recency list with blocks, and Remove(id) drops it.
func (c *MemCache) PutSidecar(id ID, kind format.SidecarKind, data []byte, crcs []uint32) {
	if format.ValidSidecarKind(kind) {
		c.put(memKey{id, kind}, data, crcs)
	}
}

func (c *MemCache) put(k memKey, data []byte, crcs []uint32) {
	size := int64(len(data))
	if size > c.capacity || len(crcs) == 0 || len(data)%len(crcs) != 0 { // capacity never changes: no lock needed
		c.mu.Lock()
		if old := c.entries[k]; old != nil {
			c.unlinkLocked(old)
		}
		c.mu.Unlock()
		return
	}
	buf := c.takeFree(len(data))
	if buf == nil {
		buf = make([]byte, len(data))
		if len(buf) >= minReuseBytes {
			devio.Populate(buf) // one system call instead of a fault per page of the copy
		}
	}
	copy(buf, data)
	e := &memEntry{key: k, data: buf, crcs: append([]uint32(nil), crcs...), linked: true}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.entries[k]; old != nil {
		c.unlinkLocked(old)
	}
	for c.bytes+size > c.capacity {
		c.unlinkLocked(c.root.prev)
		c.evictions++
	}
	c.entries[k] = e
	if k.kind != 0 {
		c.sidecars[k.id] |= 1 << k.kind
		c.nside++
	}
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
	return c.get(memKey{id, 0}, off, dst, false)
}

// GetSidecar copies part `part` of block id's sidecar of kind into dst, verified as Get
// verifies, and returns true; it misses (false, nil) when the sidecar is not cached, has no
// such part, or its parts are not exactly len(dst) bytes.
func (c *MemCache) GetSidecar(id ID, kind format.SidecarKind, part int, dst []byte) (bool, error) {
	if part < 0 || len(dst) == 0 {
		return false, nil
	}
	return c.get(memKey{id, kind}, int64(part)*int64(len(dst)), dst, true)
}

// GetSidecars is GetSidecar for many blocks: for each i with found[i] false, it copies part
// `part` of block ids[i]'s sidecar of kind into dst[i·n : (i+1)·n], n = len(dst)/len(ids), and
// sets found[i] when it did. It takes the cache's mutex once per batch of blocks rather than
// once per block, and checks each part's bytes as it copies them, as Get does. It returns the
// number of hits and, when parts failed their checksums (those blocks' sidecars are dropped
// and left not found), an error joining one error per block that wraps format.ErrCorrupt.
// len(found) must equal len(ids) and len(dst) be a multiple of len(ids); otherwise nothing is
// copied.
func (c *MemCache) GetSidecars(kind format.SidecarKind, part int, ids []ID, dst []byte, found []bool) (hits int, err error) {
	if len(ids) == 0 || len(found) != len(ids) || len(dst) == 0 || len(dst)%len(ids) != 0 || part < 0 {
		return 0, nil
	}
	n := int64(len(dst) / len(ids))
	off := int64(part) * n
	const batch = 64 // lookups per lock hold: short holds, few lock round trips
	var (
		es   [batch]*memEntry
		at   [batch]int
		errs []error
	)
	for lo := 0; lo < len(ids); lo += batch {
		hi := min(lo+batch, len(ids))
		k := 0
		c.mu.Lock()
		for i := lo; i < hi; i++ {
			if found[i] {
				continue
			}
			if e := c.lookupLocked(memKey{ids[i], kind}, off, n, true); e != nil {
				es[k], at[k] = e, i
				k++
			}
		}
		c.mu.Unlock()
		// Three parts at a time in one pass (copy and checksum together), the rest one by one.
		j := 0
		for ; j+3 <= k; j += 3 {
			var d, src [3][]byte
			for x := range d {
				i := at[j+x]
				d[x], src[x] = dst[int64(i)*n:int64(i+1)*n], es[j+x].data[off:off+n]
			}
			var crcs [3]uint32
			crcs[0], crcs[1], crcs[2] = copyCheck3(d[0], src[0], d[1], src[1], d[2], src[2])
			for x, e := range es[j : j+3] {
				if want := e.crcs[part]; crcs[x] != want {
					errs = append(errs, c.dropCorrupt(e, part, crcs[x], want))
					continue
				}
				found[at[j+x]] = true
				hits++
			}
		}
		for ; j < k; j++ {
			i := at[j]
			if err := c.check(es[j], off, dst[int64(i)*n:int64(i+1)*n]); err != nil {
				errs = append(errs, err)
				continue
			}
			found[i] = true
			hits++
		}
		c.mu.Lock()
		for _, e := range es[:k] {
			c.releaseLocked(e)
		}
		c.mu.Unlock()
		clear(es[:k])
	}
	return hits, errors.Join(errs...)
}

// get copies [off, off+len(dst)) of item k; with onePart the range must be exactly one part.
func (c *MemCache) get(k memKey, off int64, dst []byte, onePart bool) (bool, error) {
	c.mu.Lock()
	e := c.lookupLocked(k, off, int64(len(dst)), onePart)
	c.mu.Unlock()
	if e == nil {
		return false, nil
	}
	defer c.release(e)
	if err := c.check(e, off, dst); err != nil {
		return false, err
	}
	return true, nil
}

// lookupLocked returns item k when [off, off+n) is a run of whole parts of it (exactly one with
// onePart), counting a hit, marking it most recently used and counting the caller as a reader
// of it (the caller calls release when done with its data); otherwise it counts a miss and
// returns nil.
func (c *MemCache) lookupLocked(k memKey, off, n int64, onePart bool) *memEntry {
	e := c.entries[k]
	var unit int64
	if e != nil {
		unit = int64(len(e.data) / len(e.crcs))
	}
	if e == nil || off < 0 || off > int64(len(e.data)) || n > int64(len(e.data))-off ||
		(unit > 0 && (off%unit != 0 || n%unit != 0)) || (onePart && n != unit) {
		c.misses++
		return nil
	}
	c.hits++ // undone by check if a part fails its checksum
	e.readers++
	if c.root.next != e {
		c.removeFromListLocked(e)
		c.pushFrontLocked(e)
	}
	return e
}

// check copies [off, off+len(dst)) of e, found by lookupLocked, into dst and verifies each part
// against its checksum as it goes. A mismatch drops e, turns its hit into a miss and returns
// an error wrapping format.ErrCorrupt naming the block and part.
func (c *MemCache) check(e *memEntry, off int64, dst []byte) error {
	// e.data and e.crcs are immutable and stay valid after eviction while we are counted as a
	// reader of e (its buffer is reused only once its last reader released it).
	unit := int64(len(e.data) / len(e.crcs))
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
			return c.dropCorrupt(e, part, crc, e.crcs[part])
		}
	}
	return nil
}

// dropCorrupt handles a part of e, found by lookupLocked, whose bytes do not match their
// checksum: it drops e, turns its hit into a miss and returns the error wrapping
// format.ErrCorrupt that names the block and part.
func (c *MemCache) dropCorrupt(e *memEntry, part int, got, want uint32) error {
	c.mu.Lock()
	if c.entries[e.key] == e {
		c.unlinkLocked(e)
	}
	c.hits--
	c.corrupt++
	c.misses++
	c.mu.Unlock()
	what := "block"
	if e.key.kind != 0 {
		what = fmt.Sprintf("sidecar %d of block", e.key.kind)
	}
	return fmt.Errorf("memory tier: %s %s part %d: checksum %08x, want %08x: %w", what, e.key.id, part, got, want, format.ErrCorrupt)
}

// Contains reports whether block id is cached, without changing its recency or the counters.
func (c *MemCache) Contains(id ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[memKey{id, 0}] != nil
}

// Name returns the tier's name (Cache).
func (c *MemCache) Name() string { return c.name }

// Kind returns KindMemory (Cache).
func (c *MemCache) Kind() Kind { return KindMemory }

// Inclusive returns true: the memory tier holds only blocks the engine put into it (Cache).
func (c *MemCache) Inclusive() bool { return true }

// Lookup reports for each ids[i] with want nil or want[i] whether block ids[i] is cached, as
// Contains does (Cache).
func (c *MemCache) Lookup(ids []ID, want []bool) []bool {
	out := make([]bool, len(ids))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		if want == nil || want[i] {
			out[i] = c.entries[memKey{id, 0}] != nil
		}
	}
	return out
}

// Load is Get for a batch of blocks (Cache): for each ids[i] with want nil or want[i] that is
// cached, it copies the whole block (shard < 0) or its shard `shard` (one of the parts its
// checksums cover) into dst(i), verifying every part, and reports it loaded; dst is called
// only for cached blocks. A block not cached, or whose dst(i) is not the size of the block (or
// shard), is a miss. crcs[i], when crcs is not nil and the whole block was loaded, receives
// the block's part checksums (shared with the cache: the caller must not change them). The
// error joins one error wrapping format.ErrCorrupt per block whose bytes failed their check
// (dropped from the cache, and missed).
func (c *MemCache) Load(ids []ID, shard int, want []bool, dst func(int) []byte, crcs [][]uint32) ([]bool, error) {
	hits := make([]bool, len(ids))
	var errs []error
	for i, id := range ids {
		if want != nil && !want[i] {
			continue
		}
		k := memKey{id, 0}
		var off, n int64
		c.mu.Lock()
		if e := c.entries[k]; e != nil {
			n = int64(len(e.data))
			if shard >= 0 {
				n /= int64(len(e.crcs))
				off = int64(shard) * n
			}
		}
		e := c.lookupLocked(k, off, n, shard >= 0) // counts the hit or the miss
		c.mu.Unlock()
		if e == nil {
			continue
		}
		buf := dst(i)
		if int64(len(buf)) != n {
			c.mu.Lock()
			c.hits--
			c.misses++
			c.mu.Unlock()
			c.release(e)
			continue
		}
		err := c.check(e, off, buf)
		c.release(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hits[i] = true
		if crcs != nil && shard < 0 {
			crcs[i] = e.crcs
		}
	}
	return hits, errors.Join(errs...)
}

// Usage returns the cache's accounting (Cache), from a snapshot of Stats.
func (c *MemCache) Usage() CacheStats {
	s := c.Stats()
	return CacheStats{Capacity: s.Capacity, Bytes: s.Bytes, Blocks: int64(s.Blocks), Hits: int64(s.Hits), Misses: int64(s.Misses),
		Evictions: int64(s.Evictions), Corrupt: int64(s.Corrupt)}
}

// Close does nothing: the memory tier holds no resources but its memory (Cache).
func (c *MemCache) Close() error { return nil }

// Remove drops block id, and every sidecar of it, from the cache if they are there. Gets
// already copying them finish with the complete old bytes; later Gets miss.
func (c *MemCache) Remove(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[memKey{id, 0}]; e != nil {
		c.unlinkLocked(e)
	}
	for kinds := c.sidecars[id]; kinds != 0; kinds &= kinds - 1 {
		if e := c.entries[memKey{id, format.SidecarKind(bits.TrailingZeros64(kinds))}]; e != nil {
			c.unlinkLocked(e)
		}
	}
}

// RemoveSidecar drops block id's sidecar of kind from the cache if it is there.
func (c *MemCache) RemoveSidecar(id ID, kind format.SidecarKind) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[memKey{id, kind}]; e != nil {
		c.unlinkLocked(e)
	}
}

// PruneSidecars drops the cached sidecars, of blocks ids (of every block when ids is nil), for
// which keep(id, kind) reports false, and returns how many it dropped. keep is called without
// the cache's mutex held, on the sidecars cached at the call; one cached again meanwhile may be
// dropped too (a later Get misses, never reads stale bytes).
func (c *MemCache) PruneSidecars(ids []ID, keep func(ID, format.SidecarKind) bool) int {
	var cached []memKey
	add := func(id ID, kinds uint64) {
		for ; kinds != 0; kinds &= kinds - 1 {
			cached = append(cached, memKey{id, format.SidecarKind(bits.TrailingZeros64(kinds))})
		}
	}
	c.mu.Lock()
	if ids == nil {
		for id, kinds := range c.sidecars {
			add(id, kinds)
		}
	} else {
		for _, id := range ids {
			add(id, c.sidecars[id])
		}
	}
	c.mu.Unlock()
	drop := cached[:0]
	for _, k := range cached {
		if !keep(k.id, k.kind) {
			drop = append(drop, k)
		}
	}
	if len(drop) == 0 {
		return 0
	}
	n := 0
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range drop {
		if e := c.entries[k]; e != nil {
			c.unlinkLocked(e)
			n++
		}
	}
	return n
}

// Stats returns a consistent snapshot of the cache's counters.
func (c *MemCache) Stats() MemCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return MemCacheStats{
		Capacity: c.capacity, Bytes: c.bytes, Blocks: len(c.entries) - c.nside, Sidecars: c.nside,
		Hits: c.hits, Misses: c.misses, Evictions: c.evictions, Inserts: c.inserts, Corrupt: c.corrupt,
		Reused: c.reused, FreeBytes: c.freeBytes,
	}
}

// unlinkLocked removes e from the map, the list and the byte count.
func (c *MemCache) unlinkLocked(e *memEntry) {
	delete(c.entries, e.key)
	if e.key.kind != 0 {
		c.nside--
		if kinds := c.sidecars[e.key.id] &^ (1 << e.key.kind); kinds != 0 {
			c.sidecars[e.key.id] = kinds
		} else {
			delete(c.sidecars, e.key.id)
		}
	}
	c.removeFromListLocked(e)
	c.bytes -= int64(len(e.data))
	e.linked = false
	c.recycleLocked(e)
}

// release ends a reader's use of e (found by lookupLocked).
func (c *MemCache) release(e *memEntry) {
	c.mu.Lock()
	c.releaseLocked(e)
	c.mu.Unlock()
}

func (c *MemCache) releaseLocked(e *memEntry) {
	e.readers--
	c.recycleLocked(e)
}

// recycleLocked puts e's buffer on the free list once e left the cache and nobody reads it,
// within the free budget.
func (c *MemCache) recycleLocked(e *memEntry) {
	if e.linked || e.readers > 0 || e.data == nil {
		return
	}
	b := e.data
	e.data = nil
	if len(b) < minReuseBytes || c.freeBytes+int64(len(b)) > freeBudget(c.capacity) {
		return
	}
	c.free[len(b)] = append(c.free[len(b)], b)
	c.freeBytes += int64(len(b))
}

// takeFree returns a buffer of n bytes from the free list, or nil.
func (c *MemCache) takeFree(n int) []byte {
	if n < minReuseBytes {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	list := c.free[n]
	if len(list) == 0 {
		return nil
	}
	b := list[len(list)-1]
	list[len(list)-1] = nil
	if len(list) == 1 {
		delete(c.free, n)
	} else {
		c.free[n] = list[:len(list)-1]
	}
	c.freeBytes -= int64(n)
	c.reused++
	return b
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
