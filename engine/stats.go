package engine

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of the engine's counters and space accounting.
type Stats struct {
	// Space, exact, from the index's segment table.
	Blocks    int64 // blocks stored
	LiveBytes int64 // on-disk bytes of stored records
	FileBytes int64 // bytes of all segment files (live + dead + headers and footers)
	Segments  int

	// Partly dumped blocks held in memory.
	StagingBlocks int
	StagingBytes  int64
	// StagingPeakBytes and StagingPeakBlocks are the high-water marks of StagingBytes and of
	// the blocks holding staging memory since Open: what layer-wise dumps needed at most of
	// Options.MaxStagingBytes.
	StagingPeakBytes  int64
	StagingPeakBlocks int64
	// StagingWaits counts the layer runs that found staging memory taken and waited for it
	// (backpressure: engine/staging.go) rather than starting at once.
	StagingWaits int64
	// BatchOpenBlocks counts the blocks of layer-wise dumps written as batch records
	// (engine/batchdump.go) whose last layer has not been written and which no other dump has
	// stored meanwhile: partly dumped, not visible, held on disk rather than in staging memory.
	BatchOpenBlocks int

	DumpTasks    int64
	DumpedBlocks int64 // blocks written to the log
	DumpedBytes  int64
	// BatchRecords counts the layer-major batch records layer-wise dumps committed
	// (engine/batchdump.go): their blocks are in DumpedBlocks too.
	BatchRecords int64
	DedupedDumps int64 // dumps of blocks already stored or in flight (not written again)
	// DumpSyncs counts the fdatasyncs of the dump writer's segments (group commits, batch
	// commits, seals; none under SyncNone but the seals): DumpedBytes / DumpSyncs is what one
	// flush covers, the interval a durable baseline (fio --fdatasync) should flush at.
	DumpSyncs    int64
	FailedBlocks int64 // blocks whose layer-wise dump failed on a shard
	// Compression (Options.Compression, or a disk tier's): CompressedBlocks records were stored
	// compressed, CompressSkipped were compressed but stored raw (saving below
	// CompressMinSaving) — dumps and relocations into a compressing tier both count;
	// StoredPayloadBytes is the on-disk payload of all dumped blocks (DumpedBytes/StoredPayloadBytes
	// is the achieved ratio, padding included).
	CompressedBlocks   int64
	CompressSkipped    int64
	StoredPayloadBytes int64
	LoadTasks          int64
	LoadedBlocks       int64 // whole blocks loaded and verified
	LoadedShards       int64 // single shards loaded and verified
	LoadedBytes        int64
	LoadMisses         int64 // blocks a load did not find
	// CorruptReads counts loads that found bytes failing a check; each is reported as a miss
	// and dropped from the index.
	CorruptReads int64
	// CallerBufferChanged counts block loads whose bytes failed their checksum in the caller's
	// memory but verified when read again into the engine's (ErrBufferChanged): the caller
	// changed the buffer during the load. Those blocks stay stored.
	CallerBufferChanged int64
	// MissingSegmentReads counts loads whose segment file was gone.
	MissingSegmentReads int64
	ReadErrors          int64 // loads failed by the file system
	StagingExpired      int64 // partly dumped blocks discarded after TaskTimeout
	Lookups             int64 // ids looked up
	LookupHits          int64
	// Tiers.
	MemoryHits      int64 // loads served from the memory tier, without touching disk
	EvictedBlocks   int64 // blocks evicted from a disk tier (demoted or dropped)
	SegmentsRetired int64 // segments retired by reclamation (their files deleted or kept for reuse)
	// SegmentsRecycled counts segments created in a retired segment's file instead of a new
	// one (Options.RecycleSegments).
	SegmentsRecycled int64
	Promotions       int64 // blocks moved up to the first disk tier after a lower-tier hit or Prefetch
	// Sidecars (engine/sidecar.go): Sidecars stored now (from the index); DumpedSidecars written
	// since Open; loaded parts served from the memory tier (SidecarMemoryHits) or read from
	// disk (SidecarDiskReads), and asked-for parts not found (SidecarMisses).
	Sidecars                                            int64
	DumpedSidecars, SidecarMemoryHits, SidecarDiskReads int64
	SidecarMisses                                       int64
	RelocationsLost                                     int64 // relocated copies not published because the block changed meanwhile
	// Sharing is the state of the shared tiers (zero without one).
	Sharing SharingStats
}

// SharingStats is what an instance knows of the other instances on its shared tiers
// (docs/sharing.md).
type SharingStats struct {
	ForeignSegments int   // other instances' published segments in the foreign index
	ForeignBlocks   int64 // their blocks
	ForeignHits     int64 // loads served from another instance's segment
	// Refreshes counts reads of the other instances' manifests (every interval); RefreshErrors
	// the manifests, listings and segments that could not be read or indexed.
	Refreshes, RefreshErrors         int64
	SegmentsIndexed, SegmentsDropped int64 // foreign segments indexed and forgotten since Open
	// ManifestsPublished counts manifests this instance wrote; PublishErrors the failures.
	ManifestsPublished, PublishErrors int64
	// VisibilityLatency is the mean time from another instance first publishing a segment to
	// this instance indexing it, over the VisibilitySamples segments published since this
	// instance opened (clocks of both hosts); segments published before are indexed at Open and
	// not counted.
	VisibilityLatency time.Duration
	VisibilitySamples int64
	// LeaseHeld: this instance holds a shared tier's reclaimer lease (it enforces the tier's
	// global capacity); SharedUsed is the published bytes of every instance it last counted;
	// ReclaimRounds its passes that retired segments (above the high watermark, or for room
	// instances asked for). RetiredOnRequest counts this instance's segments retired because a
	// reclaimer asked.
	LeaseHeld                                   bool
	SharedUsed, ReclaimRounds, RetiredOnRequest int64
	// Instances presumed gone (their manifest unchanged for SharedOwnerTimeout): ReclaimedOfGone
	// counts their segments this instance, as reclaimer, took out of their manifests, and
	// UnlinkedOfGone the files of those it deleted after the grace period; ReclaimedWhileGone
	// counts this instance's own segments a reclaimer took while it was presumed gone, which it
	// retired when it saw its rewritten manifest.
	ReclaimedOfGone, UnlinkedOfGone, ReclaimedWhileGone int64
	// Local copies of other instances' blocks (loads of them are then served here): cached in
	// the memory tier after a load (CopiedToMemory), copied into this instance's own first disk
	// tier by promotion after a hit or Prefetch (CopiedToDisk).
	CopiedToMemory, CopiedToDisk int64
	// LogRecords counts the blocks this instance learned from other instances' publication
	// logs before their segment was published; LogAppendErrors the appends to its own logs that
	// failed (those blocks became visible with their segment's manifest instead).
	LogRecords, LogAppendErrors int64
	// Indexing progress: SegmentsListed is how many segments the other instances' manifests
	// (of this store's schema) listed when last read; ForeignSegments of them are indexed
	// (indexing runs in the background: lookups answer for what is indexed so far).
	// IndexedFromSummary and IndexedFromHeaders count the segments indexed since Open from
	// their summary (one read) and from their footer and record headers (no summary, or one
	// of another generation or unusable: SummariesDamaged counts those); IndexedRecords the
	// blocks and sidecars they held.
	SegmentsListed                                           int
	IndexedFromSummary, IndexedFromHeaders, SummariesDamaged int64
	IndexedRecords                                           int64
	// Admission on shared tiers with a capacity (docs/tiers.md): SharedShare is the part of the
	// capacity granted to this instance now, SharedHeld the bytes it holds against it (segments,
	// their reservations, files under grace, namespace files), SharedAsked what it asks for.
	SharedShare, SharedHeld, SharedAsked int64
}

// counters are the engine's live counters.
type counters struct {
	dumpTasks, dumpedBlocks, dumpedBytes, dedupedDumps, failedBlocks         atomic.Int64
	loadTasks, loadedBlocks, loadedShards, loadedBytes, loadMisses           atomic.Int64
	corruptReads, missingSegmentReads, readErrors, stagingExpired            atomic.Int64
	stagingWaits, callerBufferChanged                                        atomic.Int64
	lookups, lookupHits                                                      atomic.Int64
	memoryHits, evictedBlocks, segmentsRetired, segmentsRecycled, promotions atomic.Int64
	relocationsLost, batchRecords, dumpSyncs                                 atomic.Int64
	compressedBlocks, compressSkipped, storedPayloadBytes                    atomic.Int64
	dumpedSidecars, sidecarMemoryHits, sidecarDiskReads, sidecarMisses       atomic.Int64
}

func (c *counters) snapshot() Stats {
	return Stats{
		DumpTasks: c.dumpTasks.Load(), DumpedBlocks: c.dumpedBlocks.Load(), DumpedBytes: c.dumpedBytes.Load(),
		DedupedDumps: c.dedupedDumps.Load(), FailedBlocks: c.failedBlocks.Load(), BatchRecords: c.batchRecords.Load(),
		DumpSyncs: c.dumpSyncs.Load(),
		LoadTasks: c.loadTasks.Load(), LoadedBlocks: c.loadedBlocks.Load(), LoadedShards: c.loadedShards.Load(),
		LoadedBytes: c.loadedBytes.Load(), LoadMisses: c.loadMisses.Load(),
		CorruptReads: c.corruptReads.Load(), CallerBufferChanged: c.callerBufferChanged.Load(), MissingSegmentReads: c.missingSegmentReads.Load(),
		ReadErrors: c.readErrors.Load(), StagingExpired: c.stagingExpired.Load(), StagingWaits: c.stagingWaits.Load(),
		Lookups: c.lookups.Load(), LookupHits: c.lookupHits.Load(),
		MemoryHits: c.memoryHits.Load(), EvictedBlocks: c.evictedBlocks.Load(), SegmentsRetired: c.segmentsRetired.Load(), SegmentsRecycled: c.segmentsRecycled.Load(),
		Promotions: c.promotions.Load(), RelocationsLost: c.relocationsLost.Load(),
		CompressedBlocks: c.compressedBlocks.Load(), CompressSkipped: c.compressSkipped.Load(),
		StoredPayloadBytes: c.storedPayloadBytes.Load(),
		DumpedSidecars:     c.dumpedSidecars.Load(), SidecarMemoryHits: c.sidecarMemoryHits.Load(),
		SidecarDiskReads: c.sidecarDiskReads.Load(), SidecarMisses: c.sidecarMisses.Load(),
	}
}

// countLoad counts a finished load task and its misses.
func (c *counters) countLoad(t *Task) {
	c.loadTasks.Add(1)
	for _, err := range t.errs {
		if err != nil && isNotFound(err) {
			c.loadMisses.Add(1)
		}
	}
}

func (c *counters) countLookup(hits []bool) {
	c.lookups.Add(int64(len(hits)))
	n := 0
	for _, h := range hits {
		if h {
			n++
		}
	}
	c.lookupHits.Add(int64(n))
}
