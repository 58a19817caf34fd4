// Package engine is the public API of UCM-Go: an embedded, crash-consistent, log-structured
// store for the KV-cache blocks of LLM inference.
//
// A block is the KV (key and value tensors) of a fixed number of tokens, named by a 16-byte
// BlockID that the connector computes from the tokens as a chain (each id depends on its
// parent's), so equal prefixes give equal ids; connector/ucmhash implements UCM's schemes, and
// the engine treats ids as opaque, recording only the HashScheme in the Schema. Its bytes are
// organised by the store's Layout: Shards shards of ShardBytes each, a shard being what a
// connector moves in one call (one layer for a layer-wise connector). Open a store, ask which
// blocks it holds (Lookup, LookupPrefix), store blocks (Dump, DumpShard) and read them back
// (Load, LoadShard); dumps and loads are Tasks.
//
// The KV cache is a cache: losing the newest few blocks in a crash is acceptable, serving
// wrong bytes is not. Every guarantee below is of the form "a block is returned byte-identical
// or reported as a miss". docs/durability.md is the full contract and the tests that prove
// it; docs/format.md the bytes on disk; docs/tiers.md capacity, eviction and tiers;
// docs/sharing.md tiers shared by several instances.
//
// # Guarantees
//
// Visibility. A dumped block becomes visible to Lookup only once all its shards are written
// (durable, under SyncAlways), checksummed and indexed; it is never visible with holes. When a
// Dump task's Wait returns nil (for a layer-wise dump: the tasks of every layer), every block
// of the call is visible to Lookup, LookupPrefix and Load on this Engine, until it is evicted
// or found corrupt. A block visible to Lookup may
// still be a miss when loaded (evicted, or failing its checksums since); Lookup never reports
// a block that was not fully stored. On a shared tier, another instance on the same host finds
// the block at once, one on another host within Options.SharedRefreshInterval.
//
// Durability, per Options.SyncPolicy:
//
//	policy        a successful dump task means                  a crash (power loss) may lose
//	SyncAlways    written and fdatasynced, then indexed         nothing acknowledged
//	(default)
//	SyncInterval  written and indexed; synced every             blocks acknowledged since the
//	              SyncInterval (100 ms) or by Sync              last completed sync
//	SyncNone      as SyncInterval, without the periodic sync;   everything since the last seal,
//	              synced when a segment is sealed, by Sync,     Sync or Close
//	              and by Close (tests, tmpfs)
//
// Under every policy a crash never exposes a torn, partial or discarded block: Open scans the
// segments that were being written, cuts each at its first invalid record and seals it; index
// entries past the cut are dropped. SyncAlways is the default because group commit makes it
// cheap (concurrent dumps share one write submission and one fdatasync) and it is the only
// policy under which "the task succeeded" means "the block survives power loss".
//
// Loads verify, and fail closed. Load and LoadShard check every shard they return against its
// CRC32C (and a whole-block load the record header's block id, sequence number and checksum)
// before the task reports the block loaded. A block that is not stored fails with
// ErrNotFound; one whose bytes fail a check, or whose segment is gone, fails with ErrCorrupt
// or ErrNotFound, is counted in Stats (CorruptReads, MissingSegmentReads) and is dropped from
// the index, so the caller recomputes and dumps it again. Wrong bytes are never reported as
// loaded; the destination buffer of a failed block has unspecified contents. Bytes that fail
// their check
// in the caller's own memory but verify when read again into the engine's fail with
// ErrBufferChanged and stay stored (the caller changed its buffer during the load).
//
// Layer-wise dumps. DumpShard is called once per shard (layer) with the same list of blocks.
// A list of new blocks is written layer-major as batch records (in a store without a memory
// or Mooncake tier, compression or Options.StageLayerWise): each layer's task completes
// once its run is written, the task of the last layer once every block of the list is durable
// and visible; the blocks become visible together. A layer that fails, or never arrives within
// Options.TaskTimeout, discards the whole list: its blocks are never published, and the other
// layers' tasks fail with ErrBlockFailed wrapping the cause. Other layer-wise dumps assemble
// whole blocks in staging memory (bounded by Options.MaxStagingBytes) with the same rule.
//
// V0 dumps. Create reserves blocks; their bytes then arrive by Dump or DumpShard; Commit(ids,
// true) publishes them (durable and visible when it returns; a block with a shard missing or
// failed is discarded with ErrBlockFailed), Commit(ids, false) discards them. Until Commit,
// Lookup does not see them.
//
// Duplicates. A block already stored, or being dumped by another task, is written once: the
// other dump's outcome is this one's.
//
// Configuration. The Schema (model, dtype, KV layout, TP rank and size, block tokens, hash
// scheme) and the Layout are fingerprinted into the store and every segment header; Open with
// another fingerprint fails with ErrSchemaMismatch, because KV computed under another
// configuration has valid checksums too. Options hold every other setting, each with its
// documented default (the zero value); Options.Validate (run by Open) names the field at
// fault. The engine reads no configuration file: connector/ucmconfig turns UCM's YAML
// configuration into Options.
//
// One writer. Open locks the store directory: a second Open of it, in this process or another
// and by whatever path, fails with ErrLocked.
//
// Errors. Every error wraps at most one of the sentinel errors (ErrNotFound,
// ErrInvalidArgument, ErrNoSpace, ErrCorrupt, ErrClosed, ErrTimeout, ErrSchemaMismatch,
// ErrLocked, ErrBlockFailed, ErrBufferChanged, ErrIO) and names the block, path or field at
// fault; test with errors.Is. Bad input (a zero id, a buffer of the wrong size, a shard out of
// range) fails with ErrInvalidArgument and changes nothing stored. A failed write or fsync is
// never retried as if it had succeeded: the blocks concerned fail with ErrIO (ErrNoSpace on a
// full file system) and the engine goes on with a new segment. When the index itself can no
// longer be written, or the file system is full, dumps are refused (Failed says why) while
// loads and lookups go on.
//
// # Tasks
//
// Dump, DumpShard, Load, LoadShard and Prefetch return a *Task at once and do the work in the
// background. Wait blocks until the task is done and returns nil or an error joining each
// failed block's error; BlockErrors and Failed give them per block; Check does not block; Done
// and OnDone notify. Waiting does not consume the task: every method may be called any number
// of times, from any goroutine, and reports the same outcome. A task not done
// Options.TaskTimeout (default 30 s) after it started is cancelled by Wait: I/O not yet issued
// fails with ErrTimeout, I/O in flight is drained, and Wait returns only once no I/O of the
// task uses the caller's buffers. Until then the caller must not change a dump's source
// buffers nor touch a load's destination buffers.
//
// # Concurrency
//
// An Engine is safe for concurrent use by any number of goroutines; concurrent dumps are
// grouped into shared writes and syncs. Lookup and LookupPrefix read the index (and ask the
// Mooncake pool, with a Mooncake tier), never a segment. A load pins the segments it reads, so eviction and compaction (run in the background
// by the engine) never delete bytes under a reader; a block moved meanwhile is followed to its
// new place.
//
// # Close
//
// Close waits for running tasks, makes everything written durable (under every policy), seals
// the active segments and releases the directory lock. Blocks partly dumped (layers or V0
// shards still missing) are discarded. Tasks started after Close began fail with ErrClosed,
// and Lookup then reports misses. Close is idempotent. A process that exits without Close loses at most what its sync policy allows;
// the next Open recovers the rest.
//
// # Example
//
//	e, err := engine.Open(dir, engine.Options{
//		Layout: engine.Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 64 << 10},
//		Schema: engine.Schema{Model: "Qwen/Qwen2.5-14B", DType: "bfloat16", KVLayout: "mha",
//			TPRank: 0, TPSize: 1, BlockTokens: 16},
//	})
//	if err != nil { ... }
//	defer e.Close()
//	n := e.LookupPrefix(ids)                 // leading run of stored blocks
//	err = e.Load(ids[:n], dst[:n]).Wait()    // byte-exact, or per-block misses to recompute
//	err = e.Dump(ids[n:], src[n:]).Wait()    // nil: durable (SyncAlways) and visible
//
// Example (example_test.go) runs the same steps on a temporary directory.
package engine
