package tiers

// Cache is a block cache in front of the disk tiers: a tier that holds copies of whole blocks,
// each with the CRC32C of its shards, and serves loads before the disk tiers are asked. The
// memory tier (MemCache) and the Mooncake tier (MooncakeTier) are the two kinds; package engine
// holds the store's caches as a chain, fastest first, and routes over it:
//
//   - a load asks each cache in turn for the blocks no faster cache served, then reads the rest
//     from the disk tiers; a block served by a cache is put into the caches before it, one read
//     from disk into every cache (backfill);
//   - a dump is written through to every cache: an Inclusive one once the dump is durable on
//     disk, one that is not beside the disk write (before it is durable, and even if it fails);
//   - a lookup asks the caches that are not Inclusive for the blocks the index does not hold;
//   - a block dropped from the disk tiers (evicted, or found broken) is removed from every cache.
//
// Sidecars are not part of the interface: only the memory tier caches them (MemCache's
// sidecar methods).
//
// A cache is never the only copy the engine relies on: every block it serves is verified
// against checksums (its own, taken at Put and carried with the block), so a miss costs a disk
// read, never wrong bytes. Anything a cache cannot serve correctly (absent, evicted, stale,
// damaged, its service down) is a miss.
//
// Implementations are safe for concurrent use. Name, Kind and Inclusive are constant. Close
// is called once, after which no other method but Name, Kind, Inclusive and Usage is called.
type Cache interface {
	// Tier: Name, Kind (KindMemory, KindMooncake) and Close (queued asynchronous Puts are
	// dropped).
	Tier
	// Inclusive reports whether the cache holds only blocks the engine put into it (write-
	// through and backfill of blocks stored in the disk tiers), so that the index answers
	// lookups for it. A cache other instances fill too (Mooncake's pool) is not inclusive:
	// lookups ask it for the blocks the index does not hold, and a dump's blocks are put into
	// it beside their disk write, so it may hold a block whose disk write then failed (its
	// bytes are still the block's: it checks every load).
	Inclusive() bool
	// Lookup reports, for each ids[i] with want nil or want[i], whether the cache holds the
	// block; the others are false. It is a hint: a later Load may still miss. It does not
	// change recency. A cache that cannot answer (its service down) reports false.
	Lookup(ids []ID, want []bool) []bool
	// Load loads, for each ids[i] with want nil or want[i], the whole block (shard < 0) or its
	// shard `shard` into dst(i), which returns the block's (or shard's) bytes of memory; dst
	// is called at most once per block, and only for a block the cache may hold. It returns
	// which blocks it loaded: every byte of those was copied and checked against the block's
	// shard checksums, and dst(i) holds the block complete. A block not loaded is a miss, and
	// its dst(i), if asked for, holds unspecified bytes. When crcs is not nil and whole
	// blocks are loaded, crcs[i] receives the shard checksums a loaded block's bytes were
	// checked against (for a backfill of faster caches). The error, nil or not, never makes a
	// block loaded: it reports blocks whose cached bytes failed their check (dropped from the
	// cache, each error wrapping format.ErrCorrupt and naming the block), for the caller to
	// log; a cache that logs such failures itself returns nil.
	Load(ids []ID, shard int, want []bool, dst func(i int) []byte, crcs [][]uint32) ([]bool, error)
	// Put stores block id (data: its shards back to back, crcs: their format.Checksum) in the
	// cache, replacing an older copy; the caller may reuse data and crcs when Put returns. Put
	// never fails and never blocks on the cache's service: a block the cache cannot take
	// (larger than it, shards that do not match crcs, no room, its service down) is not stored,
	// and a cache may store it asynchronously (a Load right after Put may miss).
	Put(id ID, data []byte, crcs []uint32)
	// Remove drops block id from the cache, so later Loads miss it; Loads already copying it
	// finish with complete bytes. A cache whose objects other instances share and read
	// (Mooncake's pool) keeps them: they are checked on every load and age out by the pool's
	// own eviction; its Remove does nothing.
	Remove(id ID)
	// Usage returns a snapshot of the cache's accounting.
	Usage() CacheStats
}

// BatchPutter is a Cache that takes several blocks at once: PutBatch is Put for each ids[i]
// (data[i], crcs[i]), with the blocks queued together so that an asynchronous writer moves
// them in one batch. The engine uses it for a dump's write-throughs when a cache has it.
type BatchPutter interface {
	PutBatch(ids []ID, data [][]byte, crcs [][]uint32)
}

// PayloadLender is a Cache that lends memory for the payload of a block about to be dumped, so
// that the block's write-through puts it from where the dump copied it, with no copy of its
// own (Mooncake's pool: the memory is registered with its transfer engine). The engine uses
// it for the dumps whose bytes it copies into a record anyway.
type PayloadLender interface {
	// LendPayload returns a 4 KiB-aligned buffer of one block's bytes (Layout.BlockBytes) for
	// the payload of a block record, or nil when the cache does not lend (its layout does not
	// allow it, it is down) or has no buffer free. It never blocks. A lent buffer given (at
	// most once) to Put or PutBatch as the block's data is put from where it is: the cache
	// holds it until that put is done, whatever the caller does meanwhile.
	LendPayload() []byte
	// ReturnPayload gives back a buffer LendPayload returned, once the caller is done with
	// it (the record is written or dropped), and reports whether p was one; any other p is
	// left alone. The buffer is reused once no put of it is pending either.
	ReturnPayload(p []byte) bool
}

// CacheStats is the accounting of a Cache, common to its kinds; each kind has more of its own
// (MemCacheStats, MooncakeStats). Fields a kind cannot know are 0.
type CacheStats struct {
	Capacity int64 // bytes the cache may hold (0: not known, as for a shared pool)
	Bytes    int64 // bytes of cached blocks (0: not known)
	Blocks   int64 // cached blocks (0: not known)
	// Hits and Misses count blocks (or shards) loaded and not; a kind may count more
	// requests in them (MemCache counts its sidecar reads).
	Hits, Misses int64
	Evictions    int64 // blocks dropped to make room
	// Corrupt counts cached blocks rejected on a load (bytes or header not those of the
	// block asked for): each was a miss.
	Corrupt int64
}

// Interface checks.
var (
	_ Cache = (*MemCache)(nil)
	_ Cache = (*MooncakeTier)(nil)
)
