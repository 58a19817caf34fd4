package engine

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Lookup reports for each id whether the block is stored (exact, per block). A block is
// visible once its dump task has completed successfully.
func (e *Engine) Lookup(ids []BlockID) []bool {
	hits := make([]bool, len(ids))
	if e.life.Closing() {
		return hits
	}
	if err := e.ix.Has(ids, hits); err != nil {
		e.opts.Logger.Warn("ucm: lookup failed; reporting misses", "err", err)
		clear(hits)
	}
	e.lookupForeign(ids, hits)
	e.lookupCaches(ids, hits)
	e.stats.countLookup(hits)
	return hits
}

// lookupForeign sets hits[i] for the ids among the misses that the foreign index holds
// (blocks other instances published on a shared tier).
func (e *Engine) lookupForeign(ids []BlockID, hits []bool) {
	if e.share == nil || e.share.ForeignIndex() == nil {
		return
	}
	var miss []int
	for i, h := range hits {
		if !h {
			miss = append(miss, i)
		}
	}
	if len(miss) == 0 {
		return
	}
	sub := make([]BlockID, len(miss))
	for k, i := range miss {
		sub[k] = ids[i]
	}
	subHits := make([]bool, len(sub))
	tailed := false
	_, err := e.share.Lookup(func() (bool, error) {
		if err := e.share.ForeignIndex().Has(sub, subHits); err != nil {
			return false, err
		}
		for k, i := range miss {
			hits[i] = subHits[k]
		}
		if e.share.OverlayHas(ids, hits) {
			return true, nil
		}
		if tailed {
			return false, nil
		}
		// Blocks another instance on this host dumped since: its publication log has them.
		tailed = true
		e.share.TailPublogs(true)
		return e.share.OverlayHas(ids, hits), nil
	})
	if err != nil {
		for _, i := range miss {
			hits[i] = false
		}
		e.opts.Logger.Warn("ucm: foreign lookup failed; reporting misses", "err", err)
	}
}

// LookupPrefix returns the length of the leading run of stored blocks in ids: the number of
// blocks a scheduler can load instead of recomputing (UCM's lookup_on_prefix returns this
// minus one). Like Lookup it is served from memory.
func (e *Engine) LookupPrefix(ids []BlockID) int {
	if e.life.Closing() {
		return 0
	}
	n, err := e.ix.PrefixLen(ids)
	if err != nil {
		e.opts.Logger.Warn("ucm: prefix lookup failed; reporting no hits", "err", err)
		return 0
	}
	if e.share != nil && e.share.ForeignIndex() != nil {
		// The leading run may alternate between own and foreign blocks.
		for n < len(ids) {
			f, err := e.share.ForeignIndex().PrefixLen(ids[n:])
			if err != nil || f == 0 {
				break
			}
			n += f
			own, err := e.ix.PrefixLen(ids[n:])
			if err != nil {
				break
			}
			n += own
		}
	}
	if e.share != nil && e.share.ForeignIndex() != nil && n < len(ids) {
		n = e.share.PublishedPrefix(ids, n)
	}
	// No recency change: a lookup does not know where the blocks are (the membership answers
	// it); the load of the prefix that follows touches their segments.
	return e.cachedPrefix(ids, n)
}

// Load reads whole blocks into dst: dst[i] receives block ids[i], Layout().BlockBytes() bytes.
// Every shard's checksum is verified before the block is reported loaded. A block that is not
// stored fails with ErrNotFound; one whose bytes fail a check (checksum, header, missing
// segment) fails with ErrCorrupt or ErrNotFound and is dropped from the index (a miss, counted in
// Stats, never garbage). The contents of dst[i] for a failed block are unspecified. dst must
// not be touched until the task is done; buffers aligned to 4 KiB whose shard size is a
// multiple of 4 KiB are read into directly, others through a bounce buffer.
func (e *Engine) Load(ids []BlockID, dst [][]byte) *Task {
	return e.load(ids, AllShards, oneSpanEach(dst))
}

// LoadShard reads shard `shard` of each block into dst[i] (Layout().ShardBytes bytes), as a
// layer-wise connector does; only that shard is read and verified.
func (e *Engine) LoadShard(ids []BlockID, shard int, dst [][]byte) *Task {
	if shard < 0 || shard >= e.opts.Layout.Shards {
		return failedTask(ids, fmt.Errorf("shard %d out of range [0, %d): %w", shard, e.opts.Layout.Shards, ErrInvalidArgument))
	}
	return e.load(ids, shard, oneSpanEach(dst))
}

// LoadSpans is Load (shard == AllShards) or LoadShard into memory in pieces: dst[i] lists, in
// order, the spans that block ids[i] (or its shard) is read into, as a connector whose K and V
// live in separate tensors passes them; their lengths must add up to the block's (or shard's)
// bytes. When every piece is 4 KiB-aligned (address and length) and the layout's shards are
// multiples of 4 KiB, an uncompressed block is read from disk straight into its pieces (one
// vectored request) and checksummed there; otherwise, and for blocks served by the memory or
// mooncake tier or stored compressed, it is read into a staging buffer and copied into the
// pieces once verified. Everything else is as Load and LoadShard.
func (e *Engine) LoadSpans(ids []BlockID, shard int, dst [][][]byte) *Task {
	if shard != AllShards && (shard < 0 || shard >= e.opts.Layout.Shards) {
		return failedTask(ids, fmt.Errorf("shard %d out of range [0, %d): %w", shard, e.opts.Layout.Shards, ErrInvalidArgument))
	}
	return e.load(ids, shard, asSpans(dst))
}

func (e *Engine) load(ids []BlockID, shard int, dst []spans) *Task {
	if len(dst) != len(ids) {
		return failedTask(ids, fmt.Errorf("load: %d ids but %d buffers: %w", len(ids), len(dst), ErrInvalidArgument))
	}
	if e.opts.LookupOnly {
		return failedTask(ids, errLookupOnly)
	}
	var queued time.Time
	if e.opts.OnLoad != nil {
		queued = time.Now()
	}
	return e.startTask(ids, e.metrics.loadLatency, func(t *Task) {
		e.runLoad(t, shard, dst, queued)
		e.stats.countLoad(t)
	})
}

// blockRead is the I/O plan of one block of a load.
type blockRead struct {
	i    int
	loc  index.Location
	seg  *wal.Segment
	tier tiers.Disk
	// foreign: the block is another instance's (a foreign index entry): its segment is not
	// in this instance's recency; a hit is promoted into its faster tiers.
	foreign bool
	// pieces: the payload is read straight into the caller's pieces (LoadSpans): ops after
	// the header are one per piece, verified as spans.
	pieces bool
	// callerDst: the block's destination buffer is the caller's memory (not a staging
	// buffer): bytes read or decoded into it are checked there, where the caller can change
	// them during the load.
	callerDst bool
	header    []byte // whole-block loads: the record header, to check the id
	bounce    []byte // payload read here when dst cannot take it directly
	// Compressed records: bounce holds the stored bytes read; winOff is the file offset of
	// bounce[0] (single-shard loads read an aligned window).
	winOff int64
	opLo   int // ops[opLo:opHi] belong to this block
	opHi   int
}

func (e *Engine) runLoad(t *Task, shard int, dst []spans, queued time.Time) {
	want := e.opts.Layout.BlockBytes()
	if shard != AllShards {
		want = e.opts.Layout.ShardBytes
	}
	// Plan and issue in batches of at most QueueDepth blocks, so a cancelled task stops early
	// and a huge load does not pin every segment at once.
	batch := max(1, e.opts.QueueDepth)
	// Reads planned per block: one, and a header read for whole blocks (more for a block
	// read into several pieces, which the slices then grow for).
	opsPer := 1
	if shard == AllShards {
		opsPer = 2
	}
	flat := make([][]byte, len(t.ids))
	stamps := tiers.NextStamps(len(t.ids))
	for lo := 0; lo < len(t.ids); lo += batch {
		hi := min(len(t.ids), lo+batch)
		if t.cancelled() {
			for i := lo; i < len(t.ids); i++ {
				t.errs[i] = blockErr(ErrTimeout, t.ids[i], "load cancelled")
			}
			return
		}
		b := loadBatch{e: e, t: t, shard: shard, want: want, dst: dst, flat: flat, lo: lo, hi: hi, from: -1, stamps: stamps,
			reads: make([]blockRead, 0, hi-lo), ops: make([]devio.Op, 0, opsPer*(hi-lo))}
		b.run(queued)
	}
}

// loadBatch is the state of a load's batch: blocks ids[lo:hi] of task t, read into dst[lo:hi].
// A batch runs in steps (run): check (bad input fails its block), serveFromCaches (the cache
// chain, fastest first), planRead for each block still pending (locate it on disk, pin its
// segment, plan its reads), readDisk (submit, wait), finishReads (verify; finishHit: the
// bookkeeping of a disk hit and the backfill of the caches).
//
// flat[i] is block i's memory as one buffer, for the paths that need one (the cache tiers,
// compressed records, memory that cannot take O_DIRECT): the caller's buffer when dst[i] is one
// piece, else a staging buffer, taken when first needed and copied into the pieces once the
// block is verified.
type loadBatch struct {
	e      *Engine
	t      *Task
	shard  int   // AllShards or the shard loaded
	want   int64 // bytes per block: a block's or a shard's
	dst    []spans
	flat   [][]byte
	lo, hi int
	// stamps is the first of the task's recency stamps (tiers.NextStamps), one per block: see
	// stamp.
	stamps uint64

	served  []bool // served[i-lo]: block i was served by a cache tier
	staging []int  // blocks whose flat buffer is a staging buffer
	reads   []blockRead
	ops     []devio.Op
	timing  LoadTiming

	// The batch's disk locations, taken in one index pass when the first block needs the
	// disk (locate): locs[k] is block from+k's; from is -1 until the pass is taken.
	locs     []index.Location
	found    []bool
	from     int
	indexErr error
}

// run loads the batch and reports its timing (Options.OnLoad).
func (b *loadBatch) run(queued time.Time) {
	e := b.e
	if e.opts.OnLoad != nil {
		b.timing = LoadTiming{Blocks: b.hi - b.lo, Queued: queued, Start: time.Now()}
		defer func() {
			b.timing.Done = time.Now()
			if b.timing.Submitted.IsZero() {
				b.timing.Submitted, b.timing.Read = b.timing.Done, b.timing.Done // nothing read from disk
			}
			e.opts.OnLoad(b.timing)
		}()
	}
	defer b.releaseStaging()
	b.check()
	b.serveFromCaches()
	b.touchServed()
	for i := b.lo; i < b.hi; i++ {
		if b.pending(i) {
			b.planRead(i)
		}
	}
	b.readDisk()
	b.finishReads()
}

// check fails the blocks whose input is bad (a zero id, a buffer of the wrong size) and points
// flat at the caller's buffer where it is one piece.
func (b *loadBatch) check() {
	t := b.t
	b.served = make([]bool, b.hi-b.lo)
	for i := b.lo; i < b.hi; i++ {
		if len(b.dst[i]) == 1 {
			b.flat[i] = b.dst[i][0]
		}
		id := t.ids[i]
		if id.IsZero() {
			t.errs[i] = fmt.Errorf("load: zero block id at position %d: %w", i, ErrInvalidArgument)
			continue
		}
		if n := b.dst[i].size(); n != b.want {
			t.errs[i] = blockErr(ErrInvalidArgument, id, "load buffer is %d bytes, want %d", n, b.want)
		}
	}
}

// stamp is block i's recency stamp: the task's stamps run from its last block (the oldest) to
// its first, so that a prompt's prefix, loaded in chain order, leaves every parent's segment at
// least as recent as its children's (victimSegments).
func (b *loadBatch) stamp(i int) uint64 { return b.stamps + uint64(len(b.t.ids)-1-i) }

// touchServed has the disk segments of the blocks a cache served touched (a hit in a cache is
// a use of the block: its disk copy stays as recent), where a disk tier keeps recency. Finding
// their segments takes an index pass (half a microsecond a block), so the toucher does it in
// the background; when it is behind, hits go untouched (recency is a hint).
func (b *loadBatch) touchServed() {
	e := b.e
	if !e.keepsRecency {
		return
	}
	var req touchReq
	for i := b.lo; i < b.hi; i++ {
		if b.served[i-b.lo] {
			req.ids = append(req.ids, b.t.ids[i])
			req.stamps = append(req.stamps, b.stamp(i))
		}
	}
	if len(req.ids) == 0 {
		return
	}
	select {
	case e.touches <- req:
	default:
	}
}

// touchQueue bounds the batches of cache hits waiting for the toucher.
const touchQueue = 256

// touchReq is a batch of cache hits: block ids[i] was used at stamps[i].
type touchReq struct {
	ids    []BlockID
	stamps []uint64
}

// toucher touches the disk segments of the cache hits touchServed queues, until the engine
// stops.
func (e *Engine) toucher() {
	defer e.bg.Done()
	for {
		var req touchReq
		select {
		case <-e.stop:
			return
		case req = <-e.touches:
		}
		locs, found := make([]index.Location, len(req.ids)), make([]bool, len(req.ids))
		if err := e.ix.GetMany(req.ids, locs, found); err != nil {
			continue // recency is a hint
		}
		for k, loc := range locs {
			if t := e.tierOf(loc.Segment); found[k] && t != nil && !isForeign(loc.Segment) {
				t.Recency().Touch(loc.Segment, recordSlot(loc, e.opts.Layout), req.stamps[k])
			}
		}
	}
}

// recordSlot is the record slot (tiers.Slots) of the block at loc in its segment: its offset in
// whole-block record sizes plus its place in a batch record. Records smaller than a whole
// block (compressed ones, sidecars) can share a slot: the slots are a hint.
func recordSlot(loc index.Location, l Layout) uint64 {
	return uint64(loc.Offset/l.RecordBytes()) + uint64(loc.BatchPos)
}

// pending reports whether block i is still to be loaded: neither failed nor served by a cache.
func (b *loadBatch) pending(i int) bool { return b.t.errs[i] == nil && !b.served[i-b.lo] }

// flatOf returns block i's memory as one buffer, taking a staging buffer when dst[i] is
// several pieces.
func (b *loadBatch) flatOf(i int) []byte {
	if b.flat[i] == nil {
		b.flat[i] = b.e.pool.Get(int(b.want))
		b.staging = append(b.staging, i)
	}
	return b.flat[i]
}

// releaseStaging returns the batch's staging buffers to the pool.
func (b *loadBatch) releaseStaging() {
	for _, i := range b.staging {
		b.e.pool.Put(b.flat[i])
		b.flat[i] = nil
	}
}

// scatter copies block i, read into its staging buffer rather than its pieces, into them.
func (b *loadBatch) scatter(i int) {
	if len(b.dst[i]) > 1 {
		b.dst[i].scatter(b.flat[i])
	}
}

// serveFromCaches asks each cache tier in turn, fastest first, for the pending blocks; a block
// one serves is backfilled into the caches before it.
func (b *loadBatch) serveFromCaches() {
	e, t, n := b.e, b.t, b.hi-b.lo
	for k, c := range e.caches {
		ask := make([]bool, n)
		some := false
		for i := b.lo; i < b.hi; i++ {
			if b.pending(i) {
				ask[i-b.lo], some = true, true
			}
		}
		if !some {
			return
		}
		var crcs [][]uint32
		if k > 0 && b.shard == AllShards {
			crcs = make([][]uint32, n) // for the backfill of the caches before c
		}
		hits, err := c.Load(t.ids[b.lo:b.hi], b.shard, ask, func(j int) []byte { return b.flatOf(b.lo + j) }, crcs)
		if err != nil {
			// Cached bytes changed under us: those blocks were dropped from the cache; they
			// are loaded from the tiers below.
			e.opts.Logger.Error("ucm: cache tier: cached bytes failed their checksums; loading from the tiers below", "tier", c.Name(), "err", err)
		}
		for j, hit := range hits {
			if !hit {
				continue
			}
			i := b.lo + j
			b.served[j] = true
			b.scatter(i)
			e.countLoaded(b.shard)
			if c.Kind() == tiers.KindMemory {
				e.stats.memoryHits.Add(1)
			}
			if crcs != nil && crcs[j] != nil {
				// With the checksums the bytes were just checked against, as a disk hit does.
				e.backfill(t.ids[i], b.flat[i], crcs[j], k)
			}
		}
	}
}

// locate returns block i's disk location: from the batch's index pass (one iterator in key
// order rather than a point lookup per block: a layer-wise load asks for the same run of
// blocks at every layer), taken when the first block needs the disk, for it and the blocks
// after it (blocks served from a cache cost no index lookup). If the pass failed, each block
// is looked up on its own, which reports the error per block.
func (b *loadBatch) locate(i int) (index.Location, bool, error) {
	e, ids := b.e, b.t.ids
	if b.from < 0 {
		b.from = i
		b.locs, b.found = make([]index.Location, b.hi-i), make([]bool, b.hi-i)
		if b.shard != AllShards {
			b.indexErr = e.locateRun(ids[i:b.hi], b.locs, b.found) // shared with the list's other layers
		} else {
			b.indexErr = e.ix.GetMany(ids[i:b.hi], b.locs, b.found)
		}
	}
	if b.indexErr != nil {
		return e.ix.Get(ids[i])
	}
	return b.locs[i-b.from], b.found[i-b.from], nil
}

// planRead locates block i on disk (this instance's index, then the foreign one), pins its
// segment and appends the reads of its bytes to the batch; a block that cannot be read fails.
func (b *loadBatch) planRead(i int) {
	e, t, l := b.e, b.t, b.e.opts.Layout
	id := t.ids[i]
	loc, ok, err := b.locate(i)
	if err == nil && !ok {
		loc, ok = e.share.GetTailing(id)
	}
	if err != nil || !ok {
		if err == nil {
			err = blockErr(ErrNotFound, id, "load")
		}
		t.errs[i] = err
		return
	}
	if loc.Layout != l {
		t.errs[i] = e.dropBroken(id, loc, fmt.Errorf("index layout %+v differs from the store's %+v: %w", loc.Layout, l, ErrCorrupt))
		return
	}
	seg, loc, tier, err := e.acquireLatest(id, loc)
	if err != nil {
		var ce *wal.CorruptionError
		if errors.Is(err, wal.ErrSegmentGone) || errors.As(err, &ce) {
			t.errs[i] = e.dropBroken(id, loc, err)
		} else {
			// A transient failure to open the segment: the block stays indexed.
			e.stats.readErrors.Add(1)
			t.errs[i] = blockErr(wrapIO(err), id, "open segment %d", loc.Segment)
		}
		return
	}
	r := blockRead{i: i, loc: loc, seg: seg, tier: tier, foreign: isForeign(loc.Segment), callerDst: len(b.dst[i]) == 1}
	if r.tier != nil && !r.foreign {
		r.tier.Recency().Pin(loc.Segment) // not chosen for eviction while read
	}
	b.appendReads(&r)
	b.reads = append(b.reads, r)
}

// appendReads appends to the batch the reads of block r.i's bytes from its pinned segment:
// straight into the caller's pieces, into its flat buffer, or into a bounce buffer (compressed
// records, memory that cannot take O_DIRECT); finishRead verifies them.
func (b *loadBatch) appendReads(r *blockRead) {
	e, shard, l, loc, dst := b.e, b.shard, b.e.opts.Layout, r.loc, b.dst[r.i]
	r.opLo = len(b.ops)
	f := r.seg.File()
	first := max(shard, 0) // the first shard read
	// A block of its own record has a header to check; a block of a batch record does not
	// (its shard checksums come from the index, as for every block).
	header := func() {
		if shard == AllShards && !loc.IsBatch() {
			r.header = e.pool.Get(format.RecordHeaderSize)
			b.ops = append(b.ops, devio.Op{File: f, Buf: r.header, Off: loc.Offset})
		}
	}
	direct := l.ShardStride() == l.ShardBytes && dst.aligned()
	switch {
	case loc.Compression == format.CompressionNone && len(dst) > 1 && direct:
		// Straight into the caller's pieces: consecutive ops, merged by the backend into one
		// vectored request.
		r.pieces = true
		header()
		b.ops = appendShardReads(b.ops, f, loc, first, dst)
	case loc.Compression != format.CompressionNone:
		// Read the stored bytes into a bounce buffer: the whole payload, or the aligned window
		// around one packed shard; finishRead decodes them into flat[i].
		b.flatOf(r.i)
		header()
		lo, hi := compressedWindow(loc, shard)
		r.bounce, r.winOff = e.pool.Get(int(hi-lo)), lo
		b.ops = append(b.ops, devio.Op{File: f, Buf: r.bounce, Off: lo})
	default:
		// The shards read (all, or one) laid out as a record's payload holds them.
		buf := b.flatOf(r.i)
		if l.ShardStride() != l.ShardBytes || !devio.IsAligned(buf) {
			n := int64(1)
			if shard == AllShards {
				n = int64(l.Shards)
			}
			r.bounce = e.pool.Get(int(n * l.ShardStride()))
			buf = r.bounce
		}
		header()
		b.ops = appendShardReads(b.ops, f, loc, first, [][]byte{buf})
	}
	r.opHi = len(b.ops)
}

// readDisk submits the batch's planned reads, each to its tier's backend, and waits for them;
// per-op errors are examined by finishReads.
func (b *loadBatch) readDisk() {
	e := b.e
	if len(b.ops) == 0 {
		return
	}
	var owner []tiers.Disk // built only when the tiers use more than one backend
	tierOf := func(o int) tiers.Disk {
		if owner == nil {
			owner = make([]tiers.Disk, len(b.ops))
			for k := range b.reads {
				for i := b.reads[k].opLo; i < b.reads[k].opHi; i++ {
					owner[i] = b.reads[k].tier
				}
			}
		}
		return owner[o]
	}
	if e.opts.OnLoad != nil {
		b.timing.Reads = len(b.ops)
		for _, op := range b.ops {
			b.timing.Bytes += int64(len(op.Buf))
		}
		b.timing.Submitted = time.Now()
	}
	_ = e.submit(b.ops, tierOf)
	if e.opts.OnLoad != nil {
		b.timing.Read = time.Now()
	}
}

// finishReads verifies every block read from disk, releases what its read held and, for a
// block loaded, does the bookkeeping of a disk hit (finishHit).
func (b *loadBatch) finishReads() {
	e, t := b.e, b.t
	for k := range b.reads {
		r := &b.reads[k]
		id := t.ids[r.i]
		t.errs[r.i] = e.finishRead(r, id, b.shard, b.flat[r.i], b.ops[r.opLo:r.opHi])
		if t.errs[r.i] == nil {
			e.countLoaded(b.shard)
			if !r.pieces {
				b.scatter(r.i)
			}
		}
		r.seg.Release()
		if r.tier != nil {
			if !r.foreign {
				var stamp uint64 // 0: not loaded, no touch
				if t.errs[r.i] == nil {
					stamp = b.stamp(r.i)
				}
				r.tier.Recency().Unpin(r.loc.Segment, recordSlot(r.loc, e.opts.Layout), stamp)
			}
			if t.errs[r.i] == nil {
				b.finishHit(r)
			}
		}
		if r.header != nil {
			e.pool.Put(r.header)
		}
		if r.bounce != nil {
			e.pool.Put(r.bounce)
		}
	}
}

// finishHit is the bookkeeping of block r loaded from disk: sharing's access counts, a
// promotion from a lower tier (or another instance's), and the backfill of every cache tier.
func (b *loadBatch) finishHit(r *blockRead) {
	e, id := b.e, b.t.ids[r.i]
	if r.foreign {
		e.share.NoteForeignHit()
	}
	if e.share != nil {
		e.share.NoteAccess(r.loc.Segment)
	}
	if r.tier.Pos() > 0 || (r.foreign && !e.tiers[0].Shared()) {
		e.wantPromotion(id)
	}
	if b.shard != AllShards || len(e.caches) == 0 {
		return
	}
	block := b.flat[r.i]
	if r.pieces {
		block = b.flatOf(r.i)
		b.dst[r.i].gather(block)
	}
	// The next load of it needs no disk.
	e.backfill(id, block, r.loc.ShardCRCs, len(e.caches))
	if r.foreign && e.mem != nil {
		e.share.NoteCopiedToMemory()
	}
}

// maxFollow bounds how many times acquireLatest follows a block that moved.
const maxFollow = 3

// acquireLatest pins the segment loc, id's index entry, points into. A segment retired after
// the entry was read is not a miss when compaction or eviction moved the block meanwhile: the
// entry is read again and followed (up to maxFollow times). It returns the segment pinned, the
// entry it belongs to and the segment's tier, or the error of the last attempt.
func (e *Engine) acquireLatest(id BlockID, loc index.Location) (*wal.Segment, index.Location, tiers.Disk, error) {
	return e.acquireFollowing(id, 0, loc)
}

// acquireInTier pins segment n and returns it with its tier. The tier is looked up before the
// pin: a segment retired, or an alias forgotten, just after it was pinned stays readable, but
// its number no longer names a tier.
func (e *Engine) acquireInTier(n uint64) (*wal.Segment, tiers.Disk, error) {
	t := e.tierOf(n)
	seg, err := e.acquireSegment(n)
	if err != nil {
		return nil, nil, err
	}
	if t == nil {
		t = e.tierOf(n) // known only since the lookup
	}
	return seg, t, nil
}

// entry reads an index entry: block id's (kind 0) or its sidecar of kind.
func (e *Engine) entry(id BlockID, kind format.SidecarKind) (index.Location, bool, error) {
	if kind == 0 {
		return e.ix.Get(id)
	}
	return e.ix.GetSidecar(id, kind)
}

// entryLike reads again the entry loc was read from: this instance's index, or, for another
// instance's segment, the foreign index (the manifests, then for a block the publication logs'
// overlay). A block another instance published moves from its overlay alias to its manifest
// alias when a manifest lists its segment; the overlay forgets the segment then.
func (e *Engine) entryLike(id BlockID, kind format.SidecarKind, loc index.Location) (index.Location, bool, error) {
	if !isForeign(loc.Segment) {
		return e.entry(id, kind)
	}
	if kind == 0 {
		now, ok := e.share.Get(id)
		return now, ok, nil
	}
	if e.share == nil || e.share.ForeignIndex() == nil {
		return index.Location{}, false, nil
	}
	return e.share.ForeignIndex().GetSidecar(id, kind)
}

// acquireFollowing is acquireLatest for any entry, block id's (kind 0) or its sidecar of kind:
// the entry is read again when loc's segment is gone.
func (e *Engine) acquireFollowing(id BlockID, kind format.SidecarKind, loc index.Location) (*wal.Segment, index.Location, tiers.Disk, error) {
	for attempt := 0; ; attempt++ {
		seg, t, err := e.acquireInTier(loc.Segment)
		if err == nil {
			e.atSeam(seamSegmentPinned, id)
		}
		if err == nil || !errors.Is(err, wal.ErrSegmentGone) || attempt == maxFollow {
			return seg, loc, t, err
		}
		now, ok, gerr := e.entryLike(id, kind, loc)
		if gerr != nil || !ok || (now.Segment == loc.Segment && now.Offset == loc.Offset) {
			return nil, loc, nil, err
		}
		loc = now
	}
}

// finishRead checks one block's completed reads and copies bounced bytes into dst.
func (e *Engine) finishRead(r *blockRead, id BlockID, shard int, dst []byte, ops []devio.Op) error {
	l := e.opts.Layout
	for _, op := range ops {
		if op.Err != nil && wal.IsGone(op.Err) {
			// Deleted under an open descriptor (ESTALE on a distributed file system): a miss.
			return e.dropBroken(id, r.loc, fmt.Errorf("load from segment %d offset %d: %w: %w", r.loc.Segment, r.loc.Offset, wal.ErrSegmentGone, op.Err))
		}
		if op.Err != nil && shortRead(op.Err) && cutShort(r.seg, r.loc) {
			return e.dropBroken(id, r.loc, truncatedRecord(r.loc, op.Err))
		}
		if op.Err != nil {
			e.stats.readErrors.Add(1)
			return blockErr(wrapIO(op.Err), id, "load from segment %d offset %d", r.loc.Segment, r.loc.Offset)
		}
	}
	h := format.RecordHeader{ID: id, Layout: l, ShardCRCs: r.loc.ShardCRCs}
	if r.loc.Compression != format.CompressionNone {
		return e.finishCompressed(r, id, shard, dst, ops)
	}
	if shard == AllShards {
		if r.header != nil {
			if err := checkHeader(id, r.loc, r.header); err != nil {
				return e.dropBroken(id, r.loc, err)
			}
			ops = ops[1:]
		}
		if r.pieces {
			if err := verifySpans(&h, opBufs(ops), 0, l.Shards); err != nil {
				return e.checkFailed(r, id, shard, err, true)
			}
			return nil
		}
		payload := dst // read straight into it (its shards are strides apart) or bounced
		if r.bounce != nil {
			payload = r.bounce
		}
		if err := wal.VerifyShards(&h, payload, 0, l.Shards); err != nil {
			return e.checkFailed(r, id, shard, err, r.bounce == nil && r.callerDst)
		}
		if r.bounce != nil {
			for sh := 0; sh < l.Shards; sh++ {
				off := int64(sh) * l.ShardStride()
				copy(dst[int64(sh)*l.ShardBytes:], payload[off:off+l.ShardBytes])
			}
		}
		return nil
	}
	if r.pieces {
		if err := verifySpans(&h, opBufs(ops), shard, 1); err != nil {
			return e.checkFailed(r, id, shard, err, true)
		}
		return nil
	}
	buf := ops[0].Buf // one shard: one op
	if err := wal.VerifyShards(&h, buf, shard, 1); err != nil {
		return e.checkFailed(r, id, shard, err, r.bounce == nil && r.callerDst)
	}
	if r.bounce != nil {
		copy(dst, buf[:l.ShardBytes])
	}
	return nil
}

// checkFailed handles block id's bytes failing a check (cause) after a read. Bytes checked in
// the engine's own buffers (inCaller false) are what the medium holds: the block is dropped
// (dropBroken). Bytes checked in the caller's memory may have been changed there during the
// load (two loads into one buffer, a piece listed twice in LoadSpans): the block is read again
// into the engine's buffers and checked there, and dropped only if it fails there too. If it
// passes, it stays stored, and this load of it still fails, with ErrBufferChanged: the
// caller's buffer cannot be trusted to hold it.
func (e *Engine) checkFailed(r *blockRead, id BlockID, shard int, cause error, inCaller bool) error {
	if !inCaller {
		return e.dropBroken(id, r.loc, cause)
	}
	l, loc := e.opts.Layout, r.loc
	f := r.seg.File()
	again := blockRead{i: r.i, loc: loc, seg: r.seg, tier: r.tier, foreign: r.foreign}
	var ops []devio.Op
	if shard == AllShards && !loc.IsBatch() {
		again.header = e.pool.Get(format.RecordHeaderSize)
		defer e.pool.Put(again.header)
		ops = append(ops, devio.Op{File: f, Buf: again.header, Off: loc.Offset})
	}
	if loc.Compression != format.CompressionNone {
		lo, hi := compressedWindow(loc, shard)
		again.bounce, again.winOff = e.pool.Get(int(hi-lo)), lo
		ops = append(ops, devio.Op{File: f, Buf: again.bounce, Off: lo})
	} else {
		n := int64(1)
		if shard == AllShards {
			n = int64(l.Shards)
		}
		again.bounce = e.pool.Get(int(n * l.ShardStride()))
		ops = appendShardReads(ops, f, loc, max(shard, 0), [][]byte{again.bounce})
	}
	defer e.pool.Put(again.bounce)
	want := l.BlockBytes()
	if shard != AllShards {
		want = l.ShardBytes
	}
	out := e.pool.Get(int(want))
	defer e.pool.Put(out)
	_ = e.submit(ops, func(int) tiers.Disk { return r.tier }) // per-op errors: finishRead's
	if err := e.finishRead(&again, id, shard, out, ops); err != nil {
		return err // corrupt on the medium too (dropped), or the read again failed
	}
	e.stats.callerBufferChanged.Add(1)
	e.opts.Logger.Warn("ucm: a loaded block failed its checksum in the caller's buffer but verifies when read again; "+
		"the caller changed its buffer during the load (two loads into one buffer?); the block is kept",
		"block", id, "segment", loc.Segment, "offset", loc.Offset, "err", cause)
	return blockErr(ErrBufferChanged, id, "its bytes changed in the caller's memory during the load (%v); the stored block verifies and is kept", cause)
}

// compressedWindow is the part of a compressed record's segment file a load reads: the whole
// payload, or for one shard the aligned window around its packed bytes.
func compressedWindow(loc index.Location, shard int) (lo, hi int64) {
	if shard == AllShards {
		return loc.ShardOffset(0), loc.ShardOffset(0) + loc.PayloadBytes()
	}
	_, n := loc.ShardExtent(shard)
	return loc.ShardOffset(shard) &^ (format.Alignment - 1), format.AlignUp(loc.ShardOffset(shard) + n)
}

// shortRead reports whether a read of an indexed record ended early (at what the file system
// said was the end of the file).
func shortRead(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// cutShort reports whether seg's file now ends before loc's block does. An indexed record
// was written whole before it was published, so such a file was cut short since: corruption,
// not a transient failure worth keeping the entry for. A short read of a file that is long
// enough (a transient hiccup) is not.
func cutShort(seg *wal.Segment, loc index.Location) bool {
	st, err := seg.File().VFS().Stat()
	return err == nil && st.Size() < blockEnd(loc)
}

// blockEnd is where the last of loc's bytes ends in its segment file: the end of its record,
// or for a block of a batch record the end of its last shard.
func blockEnd(loc index.Location) int64 {
	if loc.IsBatch() {
		return loc.ShardOffset(loc.Layout.Shards-1) + loc.Layout.ShardStride()
	}
	return loc.Offset + loc.RecordBytes()
}

// truncatedRecord is the error of a record its segment file no longer holds whole.
func truncatedRecord(loc index.Location, cause error) error {
	return fmt.Errorf("%w: segment %d ends at or before %d, inside the record at offset %d: %w", ErrCorrupt, loc.Segment, blockEnd(loc), loc.Offset, cause)
}

// appendShardReads appends to ops the reads of shards first, first+1, ... of the block at loc
// into bufs: their concatenation is those shards as a record's payload holds them, shard
// first+k at k × ShardStride (pieces of a caller's memory, or one buffer). Every byte's file
// offset comes from loc.ShardOffset; a buffer is cut where the file offsets stop being
// contiguous (between the shards of a block of a batch record, which lie N × ShardStride
// apart), so a record of its own gets one op per buffer and a block of a batch one per shard
// (per piece within a shard). The ops of blocks adjacent in one batch continue each other and
// are merged by the backend.
func appendShardReads(ops []devio.Op, f *devio.File, loc index.Location, first int, bufs [][]byte) []devio.Op {
	stride := loc.Layout.ShardStride()
	var pos int64 // bytes of the shards placed so far
	for _, b := range bufs {
		for start := int64(0); start < int64(len(b)); {
			shard := first + int(pos/stride)
			in := pos % stride
			n := min(int64(len(b))-start, stride-in)
			off := loc.ShardOffset(shard) + in
			if k := len(ops) - 1; start > 0 && ops[k].Off+int64(len(ops[k].Buf)) == off {
				ops[k].Buf = b[start-int64(len(ops[k].Buf)) : start+n] // the same buffer, continued
			} else {
				ops = append(ops, devio.Op{File: f, Buf: b[start : start+n], Off: off})
			}
			start += n
			pos += n
		}
	}
	return ops
}

// countLoaded counts one successful block or shard load.
func (e *Engine) countLoaded(shard int) {
	if shard == AllShards {
		e.stats.loadedBlocks.Add(1)
		e.stats.loadedBytes.Add(e.opts.Layout.BlockBytes())
		return
	}
	e.stats.loadedShards.Add(1)
	e.stats.loadedBytes.Add(e.opts.Layout.ShardBytes)
}

// finishCompressed checks and decodes the stored bytes of a compressed record read into
// r.bounce: every stored shard's CRC, then, decompressed into dst, its raw CRC.
func (e *Engine) finishCompressed(r *blockRead, id BlockID, shard int, dst []byte, ops []devio.Op) error {
	l, loc := e.opts.Layout, &r.loc
	var scratch []byte
	if loc.Compression == format.CompressionLZ4Planes {
		scratch = e.pool.Get(int(l.ShardBytes))
		defer e.pool.Put(scratch)
	}
	if shard == AllShards {
		if err := checkHeader(id, r.loc, r.header); err != nil {
			return e.dropBroken(id, r.loc, err)
		}
		h := format.RecordHeader{ID: id, Layout: l, ShardCRCs: loc.ShardCRCs, Compression: loc.Compression, StoredLens: loc.StoredLens, StoredCRCs: loc.StoredCRCs}
		if err := format.VerifyPayload(&h, ops[1].Buf, dst, scratch); err != nil {
			return e.checkFailed(r, id, shard, err, r.callerDst)
		}
		return nil
	}
	_, n := loc.ShardExtent(shard)
	off := loc.ShardOffset(shard) - r.winOff
	stored := r.bounce[off : off+n]
	if err := format.UnpackShard(loc.Compression, shard, stored, loc.StoredCRCs[shard], loc.ShardCRCs[shard], dst, scratch); err != nil {
		return e.checkFailed(r, id, shard, err, r.callerDst)
	}
	return nil
}

// checkHeader checks that the record header read into header is the one loc was indexed
// with: it decodes, names block id, and has the index's header checksum and sequence number.
func checkHeader(id BlockID, loc index.Location, header []byte) error {
	rh, crc, err := format.DecodeRecordHeader(header[:format.RecordHeaderSize])
	switch {
	case err != nil:
		return err
	case rh.ID != id || crc != loc.HeaderCRC || rh.Seq != loc.Seq:
		return fmt.Errorf("%w: record header at offset %d holds block %s seq %d, index expects seq %d", ErrCorrupt, loc.Offset, rh.ID, rh.Seq, loc.Seq)
	}
	return nil
}

// dropBroken handles a block whose stored bytes cannot be served: it is counted, removed from
// the index (if the entry still points at the same place) so the connector recomputes and
// re-dumps it, and reported as a miss wrapping the cause.
func (e *Engine) dropBroken(id BlockID, loc index.Location, cause error) error {
	kind := ErrCorrupt
	if errors.Is(cause, wal.ErrSegmentGone) {
		kind = ErrNotFound
		e.stats.missingSegmentReads.Add(1)
	} else {
		e.stats.corruptReads.Add(1)
	}
	e.opts.Logger.Error("ucm: stored block unusable; dropped from the index", "block", id, "segment", loc.Segment, "offset", loc.Offset, "err", cause)
	if !e.opts.ReadOnly && isOverlay(loc.Segment) {
		e.share.DropOverlayBlock(id, loc, errors.Is(cause, wal.ErrSegmentGone))
	} else if !e.opts.ReadOnly && isForeign(loc.Segment) {
		// Another instance's block: forget this copy here; its owner's files are not ours.
		// Its sidecars leave the foreign index with it, and the memory tier after. A segment
		// gone means this view of its owner is older than the grace (a block compacted away
		// lives on in another segment): refresh now rather than at the next interval.
		if errors.Is(cause, wal.ErrSegmentGone) {
			defer e.share.Kick()
		}
		if e.share != nil && e.share.ForeignIndex() != nil {
			b := e.share.ForeignIndex().NewBatch()
			b.DeleteIf(id, loc)
			if err := e.share.ForeignIndex().Apply(b, false); err != nil {
				e.opts.Logger.Error("ucm: could not drop broken foreign block", "block", id, "err", err)
			}
			e.uncacheUnindexedSidecars([]BlockID{id})
		}
	} else if !e.opts.ReadOnly {
		b := e.ix.NewBatch()
		dropped := b.DeleteIf(id, loc)
		if err := e.ix.Apply(b, false); err != nil {
			e.opts.Logger.Error("ucm: could not drop broken block from the index", "block", id, "err", err)
		}
		if *dropped {
			e.uncache(id)
		}
	}
	if errors.Is(cause, kind) {
		return fmt.Errorf("block %s (segment %d offset %d): %w", id, loc.Segment, loc.Offset, cause)
	}
	return fmt.Errorf("block %s (segment %d offset %d): %w: %w", id, loc.Segment, loc.Offset, kind, cause)
}
