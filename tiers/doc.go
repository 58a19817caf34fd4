// Package tiers holds the building blocks of a store's tiers: the memory tier, disk tiers on
// local SSD, disk tiers shared by several instances on a distributed file system, and the
// Mooncake tier. Tiers are listed fastest first; package engine routes dumps, loads,
// promotion, demotion and reclamation over them and wires these blocks to wal and index.
//
// # Routing
//
// The tiers in front of the disk tiers are caches: each kind implements Cache (MemCache, the
// memory tier; MooncakeTier, the Mooncake tier), and the engine holds them as a chain, fastest
// first, which every path loops over without knowing the kinds in it. A load asks each cache
// in turn for the blocks no faster cache served, then reads the rest from the disk tiers; a
// block a cache serves is put into the faster caches, one read from disk into every cache
// (backfill), each with the shard checksums its bytes were just checked against. A dump is
// written through to every cache once it is durable on disk. Lookups ask the caches that are
// not Inclusive (filled by other instances too) for the blocks the index does not hold. A block
// dropped from the disk tiers is removed from every cache. The disk tiers implement Disk
// (LocalDisk, SharedDisk) and are routed, not probed: a block's index entry names its segment,
// and the engine's table of segments names the segment's Disk. Both families embed Tier, so
// the engine's tiers form one chain, caches then disks. A new kind is one file here
// implementing Cache or Disk and one case in OpenCache or OpenDisk.
// docs/tiers.md describes the whole (configuration, accounting, eviction, reclamation),
// docs/sharing.md the shared tiers, docs/mooncake.md the Mooncake tier.
//
// # Contents
//
//   - Config, Validate, PathFor: a tier's configuration (kind, paths, capacity, watermarks,
//     I/O and compression settings; the YAML names are the field tags), the checks of a tier
//     list (at most one memory tier and first, at most one Mooncake tier after it, at least
//     one disk tier, no path used twice or nested in another; a ConfigError wrapping
//     ErrInvalidConfig names the tier and the field), and the placement of segments across a
//     tier's paths (jump consistent hashing: adding a path moves about 1/(n+1) of them).
//   - Tier: what every kind shares (Name, Kind, Close).
//   - Disk, DiskOptions, DiskEnv, DiskUsage, OpenDisk, TierRoot, SegmentDir, LockFile,
//     ErrLocked: one disk tier (its segment directories, locks, I/O backend, writers,
//     admission, retirement and accounting) and what it needs from the engine; LocalDisk (a
//     local file system: retired files kept for reuse, a per-directory pool) and SharedDisk (a
//     file system several instances mount: its namespace, files never kept, admission by its
//     ShareAccount, sealing by age) implement it.
//   - Space, Recycler: the exact byte account of one disk tier and its admission of new
//     segments, drawing on a recycle pool.
//   - ShareAccount, ShareEnv, ShareConfig: one instance's admission account on a shared tier
//     with a capacity (its share granted by the lease holder, given back, asked for; as
//     holder, the grants to every instance), over plain manifests and a small environment
//     the engine provides.
//   - Recency, NextStamps, Slots: the recency of one disk tier's segments (a stamp and a pin
//     count per segment, and a bit per record slot of a segment loaded from), which orders
//     eviction's victim segments and says which of their blocks were loaded since.
//   - Cache, CacheStats, CacheOptions, OpenCache: what a cache tier in front of the disk tiers
//     guarantees (lookup, a verified load of whole blocks or shards, write-through and
//     backfill, removal, its accounting), and its construction by kind; MemCache and
//     MooncakeTier implement it.
//   - MemCache: the memory tier, a host-DRAM LRU of whole blocks and their sidecars.
//   - NamespaceDir, WriteManifest, ReadManifest, ListNamespaces, the publication log names,
//     Leaser: a shared tier's path layout, each instance's manifest of published segments,
//     and the reclaimer lease that elects the one instance enforcing the tier's capacity.
//   - MooncakeTier, MooncakePool, OpenMooncakePool: the Mooncake tier over a Mooncake Store
//     pool (the real client is built with the `mooncake` tag; without it OpenMooncakePool
//     returns ErrMooncakeNotBuilt).
//
// # Guarantees
//
//   - Exact accounting through retirement. A Disk's Space changes only by Admit (a
//     reservation), the engine's settling of a sealed segment, Released (after Unlink) and its
//     own pool: a LocalDisk's kept file stays in used bytes, marked pooled, until it is reused
//     (its bytes become the new segment's reservation) or deleted; a SharedDisk never keeps a
//     file. OpenDisk locks every path (namespace) outside the store directory, so a second
//     open of it fails with ErrLocked until the first closes.
//   - Exact capacity. Space counts the bytes of every segment file of a tier, active segments
//     at the size they may grow to. A segment for new dumps is admitted only if it fits within
//     the capacity; a segment for relocations (which reclamation needs to free space) only
//     while the tier is within it. So a tier never holds more than its capacity plus one
//     segment; a dump that finds no room waits for reclamation up to its deadline, then fails
//     with ErrNoSpace.
//   - Whole segments, least recently used first. Recency.Order lists a tier's segments by the
//     last write or load of any of their records, never one a load is reading (pinned). A load
//     stamps a prompt's blocks so that parents are at least as recent as their children
//     (NextStamps): after a load of a chain, its leaves' segments go before its root's.
//   - Memory is verified like a disk. MemCache keeps each block with the CRC32C of its shards
//     and checks the bytes it copies out against them; its capacity is exact at every instant;
//     cached blocks are immutable (Put stores a private copy), so a Get that races with a Put,
//     Remove or eviction of the same block copies one complete version, never a mix.
//   - Shared files are whole or absent. A manifest is written to a temporary name, synced,
//     renamed to a new name of its own and the directory synced, so a reader sees the old list
//     or the new one, whole; every manifest and lease is checked by CRC32C before any field is
//     used, and a manifest that fails a check is an error wrapping format.ErrCorrupt. Each
//     instance writes only inside its own namespace.
//   - Shares never sum beyond a shared capacity. A ShareAccount keeps grants and credits as
//     monotone counters, so whatever stale or missing manifests a lease holder reads, the
//     shares it grants never sum to more than the capacity less what every instance is counted
//     for; a request is answered once; a new holder grants nothing for two refresh intervals.
//   - Mooncake objects are checked. MooncakeTier.Load checks every byte it loads against the
//     checksums in the object's header, and the header against the block, schema and layout
//     asked for; anything else (absent, stale, foreign, damaged) is a miss, counted and logged.
//     A pool that is down makes the tier skipped (loads and lookups miss, write-throughs are
//     dropped, each counted), never the engine unusable.
//
// # Concurrency
//
// Space, ShareAccount, Recency, every Cache (MemCache, MooncakeTier) and every Disk (LocalDisk,
// SharedDisk; except SetCodec and SetAccount, called once at Open) are safe for concurrent
// use. Lock order: a LocalDisk's pool lock before its Space's; a Disk calls its DiskEnv with
// none of its locks held and never takes the engine's (which takes its reclamation lock, then
// its segments' lock, then its sharing state's). A Leaser keeps no state
// between calls: the lease is the file, and Hold's election tolerates contenders. Recency and MemCache
// hold one mutex for short, bounded steps (MemCache copies bytes outside it, so readers of
// large blocks copy in parallel); Recency.Order works in proportion to the segments it sorts. Space
// calls its Recycler without its own lock held. The manifest functions touch only the files
// they name; concurrent writers of one namespace are excluded by the namespace's LOCK, which
// the engine holds.
//
// # Example
//
// A disk tier of 1 TiB over two SSDs, with an 8 GiB memory tier in front and a shared tier
// below:
//
//	cfg := []tiers.Config{
//		{Name: "dram", Kind: tiers.KindMemory, Capacity: 8 << 30},
//		{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/mnt/nvme0/ucm", "/mnt/nvme1/ucm"},
//			Capacity: 1 << 40},
//		{Name: "shared", Kind: tiers.KindDisk, Paths: []string{"/mnt/3fs/ucm"}, Shared: true},
//	}
//	if err := tiers.Validate(cfg); err != nil { ... } // errors.Is(err, tiers.ErrInvalidConfig)
//	dir := tiers.PathFor(cfg[1].Paths, segment)        // where segment number `segment` lives
//
//	sp := tiers.NewSpace(1<<40, tiers.DefaultHighWatermark, tiers.DefaultLowWatermark)
//	rec := tiers.NewRecency()
//	rec.Written(segment)                 // records were written into segment
//	victims := rec.Order(sealed)         // least recently used first, pinned ones left out
package tiers
