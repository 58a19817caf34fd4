package engine

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// ErrExists is returned by Create for a block that is already stored.
var ErrExists = errors.New("ucm: block exists")

// AllShards as a shard index means the whole block.
const AllShards = -1

// inflightDump is a block on its way into the log; later dumps of the same id wait for it
// instead of writing it again.
type inflightDump struct {
	done chan struct{}
	err  error
	once sync.Once
	// batch is the layer-wise batch the block is part of (engine/batchdump.go), nil for a
	// block record on its way.
	batch *layerBatch
}

// inflightLocked returns the dump of id in flight that another dump of it must wait for, nil
// if there is none. A block of an open layer-wise batch is not waited for: its last layers may
// never come (a connector that gave the request up), and nothing would end the wait before
// TaskTimeout. The other dump writes the block on its own instead (a block record, or its own
// staging slot): the batch, if it commits later, indexes its own copy of the same bytes over it.
// A batch whose commit is under way is waited for.
func (e *Engine) inflightLocked(id BlockID) *inflightDump {
	d := e.mu.inflight[id]
	if d != nil && d.batch != nil && !d.batch.committing {
		return nil
	}
	return d
}

func newInflight() *inflightDump { return &inflightDump{done: make(chan struct{})} }

// finish records the dump's outcome and releases its waiters; later calls do nothing.
func (d *inflightDump) finish(err error) {
	d.once.Do(func() {
		d.err = err
		close(d.done)
	})
}

// stagingSlot assembles a block dumped shard by shard (layer-wise), or created with Create
// (V0), until it is complete. A slot is published only when every shard has arrived intact;
// a failed shard turns it into a tombstone that fails the block's other shards.
type stagingSlot struct {
	// flight completes with the block's outcome: when it is published (appended by whichever
	// dump completes it, or by Commit) or discarded. Whole-block dumps that find the block in
	// assembly wait on it.
	flight   *inflightDump
	rec      *wal.Record
	claimed  []bool // shard has been (or is being) copied in
	arrived  int    // shards copied in
	attempts int    // shard dumps seen, failed ones included
	pending  int    // copies in progress
	v0       bool   // created by Create: published by Commit only
	failed   error
	dropped  bool
	created  time.Time
}

// Dump stores whole blocks: src[i] is block ids[i], Layout().BlockBytes() bytes, shard-major.
// The task completes when every block is durable (per the sync policy) and visible to Lookup,
// or has failed; src must not change until then. A block already stored, or being dumped by
// another task, is written once: the other dump's outcome is this one's. A block created with
// Create is filled but published only by Commit.
func (e *Engine) Dump(ids []BlockID, src [][]byte) *Task {
	return e.dump(ids, AllShards, oneSpanEach(src))
}

// DumpShard stores shard `shard` of each block (a layer-wise dump): src[i] is
// Layout().ShardBytes bytes. A block becomes visible only when all its shards have arrived and
// are durable. A list of new blocks is written layer-major as batch records, each call writing
// its layer's run straight from src (batchdump.go); other lists, and stores with a memory or
// Mooncake tier, compression or Options.StageLayerWise, assemble whole blocks in staging
// memory. The task of the shard that completes a block (or the list) completes when it is
// durable; the others complete once their bytes are written or copied (src may then be
// reused). A shard that fails (wrong size, a write error) fails the whole block, or the whole
// list of a batch: it is never published with holes, and its other shards' dumps fail with
// ErrBlockFailed. Blocks left incomplete are discarded after TaskTimeout.
func (e *Engine) DumpShard(ids []BlockID, shard int, src [][]byte) *Task {
	if shard < 0 || shard >= e.opts.Layout.Shards {
		return failedTask(ids, fmt.Errorf("shard %d out of range [0, %d): %w", shard, e.opts.Layout.Shards, ErrInvalidArgument))
	}
	return e.dump(ids, shard, oneSpanEach(src))
}

// DumpSpans is Dump (shard == AllShards) or DumpShard from memory in pieces: src[i] lists,
// in order, the spans whose bytes concatenated are block ids[i] (or its shard), as a
// connector whose K and V live in separate tensors passes them. The pieces are copied once,
// into the record (or the block's staging slot), and checksummed as they are; their lengths
// must add up to the block's (or shard's) bytes. Everything else is as Dump and DumpShard.
func (e *Engine) DumpSpans(ids []BlockID, shard int, src [][][]byte) *Task {
	if shard != AllShards && (shard < 0 || shard >= e.opts.Layout.Shards) {
		return failedTask(ids, fmt.Errorf("shard %d out of range [0, %d): %w", shard, e.opts.Layout.Shards, ErrInvalidArgument))
	}
	return e.dump(ids, shard, asSpans(src))
}

func (e *Engine) dump(ids []BlockID, shard int, src []spans) *Task {
	if len(src) != len(ids) {
		return failedTask(ids, fmt.Errorf("dump: %d ids but %d buffers: %w", len(ids), len(src), ErrInvalidArgument))
	}
	if err := e.spaceError(); err != nil {
		// The store's file system is full (reserve.go): refused before anything is written.
		return failedTask(ids, fmt.Errorf("dump: %w", err))
	}
	if e.opts.ReadOnly || e.opts.LookupOnly {
		return failedTask(ids, fmt.Errorf("dump: store opened read-only or lookup-only: %w", ErrInvalidArgument))
	}
	if err := e.ix.Failed(); err != nil {
		// The index can no longer record blocks (Pebble failed a write: a full disk, an I/O
		// error): refuse at once rather than write segments nothing will point at. Loads are
		// still served; reopening the store recovers it.
		return failedTask(ids, fmt.Errorf("dump: the index failed; reopen the store: %w", wrapIO(err)))
	}
	return e.startTask(ids, e.metrics.dumpLatency, func(t *Task) {
		e.runDump(t, shard, src)
		e.stats.dumpTasks.Add(1)
	})
}

// startTask runs work as a task in its own goroutine, unless the engine is closing, and
// observes its latency.
func (e *Engine) startTask(ids []BlockID, latency prometheus.Histogram, work func(*Task)) *Task {
	if !e.life.Enter() {
		return failedTask(ids, ErrClosed)
	}
	t := newTask(ids, e.opts.TaskTimeout)
	go func() {
		defer e.life.Done()
		defer t.finish()
		start := time.Now()
		work(t)
		latency.Observe(time.Since(start).Seconds())
	}()
	return t
}

func (e *Engine) runDump(t *Task, shard int, src []spans) {
	if shard != AllShards && e.batchable() && !t.cancelled() && e.dumpLayerBatch(t, shard, src) {
		return
	}
	l := e.opts.Layout
	want := l.BlockBytes()
	if shard != AllShards {
		want = l.ShardBytes
	}
	type waiter struct {
		i int
		d *inflightDump
	}
	var (
		recs    []*wal.Record
		owners  []int
		flights []*inflightDump
		waits   []waiter
	)
	// Checksums, copies and compression: CPU work, through the gate (see cpuGate).
	e.cpu.enter()
	for i, id := range t.ids {
		if i > 0 {
			e.cpu.yield()
		}
		switch {
		case t.cancelled():
			t.errs[i] = blockErr(ErrTimeout, id, "dump cancelled")
			continue
		case id.IsZero():
			t.errs[i] = fmt.Errorf("dump: zero block id at position %d: %w", i, ErrInvalidArgument)
			continue
		case src[i].size() != want:
			err := blockErr(ErrInvalidArgument, id, "dump buffer is %d bytes, want %d", src[i].size(), want)
			if shard != AllShards {
				e.failSlot(id, err)
			}
			t.errs[i] = err
			continue
		}
		var (
			rec    *wal.Record
			flight *inflightDump
			wait   *inflightDump
			err    error
		)
		if shard == AllShards {
			rec, flight, wait, err = e.claimWhole(id, src[i])
		} else {
			rec, flight, wait, err = e.stageShard(id, shard, src[i])
		}
		switch {
		case err != nil:
			t.errs[i] = err
		case wait != nil:
			waits = append(waits, waiter{i, wait})
		case rec != nil:
			recs = append(recs, rec)
			owners = append(owners, i)
			flights = append(flights, flight)
		}
	}
	e.compressRecords(recs)
	e.cpu.leave()
	for k, err := range e.writeRecords(recs, flights) {
		if err != nil {
			t.errs[owners[k]] = err
		}
	}
	for _, w := range waits {
		<-w.d.done
		t.errs[w.i] = w.d.err
		e.stats.dedupedDumps.Add(1)
	}
}

// claimWhole prepares the record of a whole-block dump, unless the block is stored already
// (nothing to do), being dumped (wait for that), or created with Create (fill its slot).
func (e *Engine) claimWhole(id BlockID, src spans) (rec *wal.Record, flight, wait *inflightDump, err error) {
	e.mu.Lock()
	if d := e.inflightLocked(id); d != nil {
		e.mu.Unlock()
		return nil, nil, d, nil
	}
	if s := e.mu.staging[id]; s != nil {
		slotFlight, v0 := s.flight, s.v0
		e.mu.Unlock()
		// A layer-wise or V0 block in assembly: deliver every shard to it.
		l := e.opts.Layout
		for sh := 0; sh < l.Shards; sh++ {
			r, f, w, err := e.stageShard(id, sh, src.sub(int64(sh)*l.ShardBytes, l.ShardBytes))
			if err != nil || r != nil || w != nil {
				return r, f, w, err
			}
		}
		if v0 {
			return nil, nil, nil, nil // staged; Commit publishes it
		}
		// Another dump is still copying a shard in and will publish the block: this dump is
		// done when that one is.
		return nil, nil, slotFlight, nil
	}
	flight = newInflight()
	e.mu.inflight[id] = flight
	e.mu.Unlock()
	if e.ix.Contains(id) {
		// Stored already: do not write it again.
		e.mu.Lock()
		delete(e.mu.inflight, id)
		e.mu.Unlock()
		flight.finish(nil)
		e.stats.dedupedDumps.Add(1)
		return nil, nil, nil, nil
	}
	l := e.opts.Layout
	if one := src.contiguous(); one != nil && devio.IsAligned(one) && l.ShardStride() == l.ShardBytes {
		// The caller's buffer is the on-disk payload: write it in place, no copy. The task
		// contract keeps src unchanged until the dump completes; if a caller breaks it, the
		// checksums computed here no longer match and loads report a miss, never the bytes.
		rec = &wal.Record{ID: id, Layout: l, ShardCRCs: make([]uint32, l.Shards), Buf: e.pool.Get(format.RecordHeaderSize), Payload: one, PayloadBorrowed: true}
		for sh := 0; sh < l.Shards; sh++ {
			rec.ShardCRCs[sh] = format.Checksum(one[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes])
		}
		return rec, flight, nil, nil
	}
	rec = e.newDumpRecord(id)
	for sh := 0; sh < l.Shards; sh++ {
		fillShard(rec, l, sh, src.sub(int64(sh)*l.ShardBytes, l.ShardBytes))
	}
	return rec, flight, nil, nil
}

// newDumpRecord is newRecord for a whole block a dump copies in. When a cache writes dumps
// through from memory it lends (tiers.PayloadLender: Mooncake's pool, whose put slots are
// registered with its transfer engine) and the block is stored as copied (no compression, no
// padding between shards), the payload is a lent buffer: the write-through then puts the
// block from where this copy put it, instead of copying it again. Else, or when the lender
// has no buffer free, the payload is pooled.
func (e *Engine) newDumpRecord(id BlockID) *wal.Record {
	l := e.opts.Layout
	if lender := e.payloadLender(); lender != nil && e.tiers[0].Codec() == format.CompressionNone {
		if p := lender.LendPayload(); p != nil {
			if int64(len(p)) == l.PayloadBytes() {
				return &wal.Record{ID: id, Layout: l, ShardCRCs: make([]uint32, l.Shards),
					Buf: e.pool.Get(format.RecordHeaderSize), Payload: p, PayloadBorrowed: true}
			}
			lender.ReturnPayload(p)
		}
	}
	return e.newRecord(id)
}

// newRecord returns a record for id with pooled, aligned buffers: its header's and its raw
// payload's, apart (wal.Record's second form), so that a payload of 2^k bytes takes a buffer
// of 2^k bytes, not one of 2^(k+1) for the payload and the 4 KiB header together.
func (e *Engine) newRecord(id BlockID) *wal.Record {
	l := e.opts.Layout
	return &wal.Record{ID: id, Layout: l, ShardCRCs: make([]uint32, l.Shards),
		Buf: e.pool.Get(format.RecordHeaderSize), Payload: e.pool.Get(int(l.PayloadBytes()))}
}

// putRecord returns rec's buffers to the pool (its payload only if the engine owns it) and
// clears them: every record the engine builds or reads is released here.
func (e *Engine) putRecord(rec *wal.Record) {
	e.pool.Put(rec.Buf)
	e.releasePayload(rec)
	rec.Buf, rec.Payload, rec.PayloadBorrowed = nil, nil, false
}

// releasePayload lets go of rec's payload: back to the pool if it is the engine's, back to
// its lender if a cache lent it (newDumpRecord); a caller's buffer is left alone.
func (e *Engine) releasePayload(rec *wal.Record) {
	if !rec.PayloadBorrowed {
		e.pool.Put(rec.Payload)
	} else if lender := e.payloadLender(); lender != nil {
		lender.ReturnPayload(rec.Payload)
	}
}

// blockBytes returns rec's block bytes as one contiguous slice when its payload is laid out
// that way (shard size a multiple of 4 KiB), else nil.
func (e *Engine) blockBytes(rec *wal.Record) []byte {
	l := e.opts.Layout
	if rec.Compression != format.CompressionNone || l.ShardStride() != l.ShardBytes {
		return nil // the payload holds the stored form, or padding between shards
	}
	return rec.Payload[:l.BlockBytes()]
}

// fillShard copies shard sh into rec's payload, zeroes its padding and checksums what was
// copied (so the checksum covers exactly the bytes written, whatever the caller does to src).
func fillShard(rec *wal.Record, l Layout, sh int, src spans) {
	off := int64(sh) * l.ShardStride()
	dst := rec.Payload[off : off+l.ShardStride()]
	n := src.gather(dst)
	clear(dst[n:])
	rec.ShardCRCs[sh] = format.Checksum(dst[:n])
}

// shardCopyHook, when set (by tests only), runs in stageShard after a shard is claimed and
// before it is copied in: a test holds a shard "being copied" for as long as it needs.
var shardCopyHook atomic.Pointer[func(e *Engine, id BlockID, shard int)]

// stageShard copies one shard into the block's staging slot. It returns the record to append
// when this shard completes a block that is not waiting for Commit.
func (e *Engine) stageShard(id BlockID, shard int, src spans) (rec *wal.Record, flight, wait *inflightDump, err error) {
	l := e.opts.Layout
	e.mu.Lock()
	if d := e.inflightLocked(id); d != nil {
		e.mu.Unlock()
		return nil, nil, d, nil
	}
	s := e.mu.staging[id]
	if s == nil {
		e.mu.Unlock()
		if e.ix.Contains(id) {
			e.stats.dedupedDumps.Add(1)
			return nil, nil, nil, nil
		}
		e.mu.Lock()
		if s = e.mu.staging[id]; s == nil {
			if d := e.inflightLocked(id); d != nil {
				e.mu.Unlock()
				return nil, nil, d, nil
			}
			if s, err = e.newSlotLocked(id, false); err != nil {
				e.mu.Unlock()
				return nil, nil, nil, err
			}
		}
	}
	s.attempts++
	if s.failed != nil {
		err := blockErr(ErrBlockFailed, id, "another shard of the block failed: %v", s.failed)
		e.retireTombstoneLocked(id, s)
		e.mu.Unlock()
		return nil, nil, nil, err
	}
	if s.claimed[shard] {
		e.mu.Unlock()
		return nil, nil, nil, nil // the same shard again: already staged
	}
	s.claimed[shard] = true
	s.pending++
	e.mu.Unlock()

	if h := shardCopyHook.Load(); h != nil {
		(*h)(e, id, shard)
	}
	fillShard(s.rec, l, shard, src)

	e.mu.Lock()
	defer e.mu.Unlock()
	s.pending--
	if s.dropped || s.failed != nil {
		if s.pending == 0 && s.rec != nil {
			if !s.dropped {
				e.releaseStagingLocked(s.rec.Size())
			}
			e.putRecord(s.rec)
			s.rec = nil
		}
		if s.failed != nil {
			return nil, nil, nil, blockErr(ErrBlockFailed, id, "another shard of the block failed: %v", s.failed)
		}
		return nil, nil, nil, blockErr(ErrTimeout, id, "staged block discarded before it was complete")
	}
	s.arrived++
	if s.arrived < l.Shards || s.v0 {
		return nil, nil, nil, nil
	}
	return e.publishSlotLocked(id, s)
}

// publishSlotLocked moves a complete slot from staging to the in-flight set and returns its
// record for appending.
func (e *Engine) publishSlotLocked(id BlockID, s *stagingSlot) (*wal.Record, *inflightDump, *inflightDump, error) {
	delete(e.mu.staging, id)
	e.releaseStagingLocked(s.rec.Size())
	flight := s.flight
	e.mu.inflight[id] = flight
	rec := s.rec
	s.rec = nil
	return rec, flight, nil, nil
}

// whyStaged says why a partly dumped block assembles in a staging slot in this store.
func (e *Engine) whyStaged(v0 bool) string {
	switch {
	case v0:
		return "blocks created for a V0 dump assemble in staging memory until their Commit"
	case e.opts.StageLayerWise:
		return "this store stages layer-wise dumps (stage_layer_wise)"
	case len(e.caches) > 0:
		return "this store writes blocks through to a memory or Mooncake tier, which take whole blocks"
	case e.tiers[0].Codec() != format.CompressionNone:
		return "this store compresses whole blocks"
	default:
		return "this layer-wise dump could not be written as a batch record (another dump of its blocks in flight, or a list that differs from an open one)"
	}
}

func (e *Engine) newSlotLocked(id BlockID, v0 bool) (*stagingSlot, error) {
	size := e.opts.Layout.RecordBytes()
	if !e.tryStagingLocked(size) {
		// No wait here: a slot is held until the block's other layers arrive, so a dump that
		// waited for one while its list's other slots are held could wait for itself
		// (docs/durability.md, "Staging memory").
		return nil, blockErr(ErrNoSpace, id, "staging memory for partly dumped blocks is full (%d of max_staging_bytes %d in use, %d more wanted); "+
			"%s, so the blocks of layer-wise dumps in flight must fit max_staging_bytes whole: raise it (Options.MaxStagingBytes)",
			e.mu.stagingBytes, e.opts.MaxStagingBytes, size, e.whyStaged(v0))
	}
	s := &stagingSlot{flight: newInflight(), rec: e.newRecord(id), claimed: make([]bool, e.opts.Layout.Shards), v0: v0, created: time.Now()}
	e.mu.staging[id] = s
	e.mu.stagingPeakBlocks = max(e.mu.stagingPeakBlocks, int64(len(e.mu.staging)))
	return s, nil
}

// failSlot turns the block's slot (creating one if needed) into a tombstone: the block will
// not be published and its other shards' dumps fail.
func (e *Engine) failSlot(id BlockID, cause error) {
	stored := e.ix.Contains(id)
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.mu.staging[id]
	if s == nil {
		if stored || e.mu.inflight[id] != nil {
			return // a bad shard for a block already stored (or being written) changes nothing
		}
		s = &stagingSlot{flight: newInflight(), claimed: make([]bool, e.opts.Layout.Shards), created: time.Now()}
		e.mu.staging[id] = s
	} else if s.rec != nil && s.pending == 0 {
		e.releaseStagingLocked(s.rec.Size())
		e.putRecord(s.rec)
		s.rec = nil
	}
	if s.failed == nil {
		s.failed = cause
		s.flight.finish(blockErr(ErrBlockFailed, id, "a shard failed: %v", cause))
	}
	s.attempts++
	e.stats.failedBlocks.Add(1)
	e.retireTombstoneLocked(id, s)
}

// retireTombstoneLocked forgets a failed slot once every shard has been tried.
func (e *Engine) retireTombstoneLocked(id BlockID, s *stagingSlot) {
	if s.attempts >= e.opts.Layout.Shards && !s.v0 {
		e.dropSlotLocked(id, s, nil)
	}
}

// dropSlotLocked discards a slot; its buffer returns to the pool once no copy is using it, and
// dumps waiting for the block get cause.
func (e *Engine) dropSlotLocked(id BlockID, s *stagingSlot, cause error) {
	if e.mu.staging[id] == s {
		delete(e.mu.staging, id)
	}
	if cause == nil {
		cause = blockErr(ErrBlockFailed, id, "discarded before it was complete")
	}
	s.flight.finish(cause)
	s.dropped = true
	if s.rec != nil {
		e.releaseStagingLocked(s.rec.Size())
		if s.pending == 0 {
			e.putRecord(s.rec)
			s.rec = nil
		}
	}
}

// janitor discards staged blocks older than TaskTimeout.
func (e *Engine) janitor() {
	defer e.bg.Done()
	period := min(e.opts.TaskTimeout/4, time.Second)
	if period <= 0 {
		period = time.Second
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			return
		case now := <-tick.C:
			e.mu.Lock()
			for id, s := range e.mu.staging {
				if now.Sub(s.created) > e.opts.TaskTimeout {
					e.dropSlotLocked(id, s, blockErr(ErrTimeout, id, "partly dumped block expired after %v", e.opts.TaskTimeout))
					e.stats.stagingExpired.Add(1)
				}
			}
			e.expireLayerBatchesLocked(now, false, func(id BlockID) error {
				return blockErr(ErrTimeout, id, "layer-wise batch expired after %v with layers missing", e.opts.TaskTimeout)
			})
			e.mu.Unlock()
		}
	}
}

// Create reserves blocks for a V0 dump: data then arrives with Dump or DumpShard and the block
// is published by Commit(ids, true) or discarded by Commit(ids, false); until then Lookup does
// not see it. It returns one error per id: ErrExists for a block already stored or being
// created, ErrInvalidArgument for a zero id, ErrNoSpace when staging memory is full.
func (e *Engine) Create(ids []BlockID) []error {
	errs := make([]error, len(ids))
	if e.life.Closing() || e.opts.LookupOnly || e.opts.ReadOnly {
		cause := ErrClosed
		if !e.life.Closing() {
			cause = fmt.Errorf("create: store opened read-only or lookup-only: %w", ErrInvalidArgument)
		}
		for i := range errs {
			errs[i] = cause
		}
		return errs
	}
	for i, id := range ids {
		if id.IsZero() {
			errs[i] = fmt.Errorf("create: zero block id at position %d: %w", i, ErrInvalidArgument)
			continue
		}
		if e.ix.Contains(id) {
			errs[i] = blockErr(ErrExists, id, "create")
			continue
		}
		e.mu.Lock()
		if e.mu.staging[id] != nil || e.mu.inflight[id] != nil {
			errs[i] = blockErr(ErrExists, id, "create: block is being dumped")
		} else if _, err := e.newSlotLocked(id, true); err != nil {
			errs[i] = err
		}
		e.mu.Unlock()
	}
	return errs
}

// Commit publishes (ok) or discards (!ok) blocks reserved by Create, and returns when they
// are durable and visible, or discarded. A block with shards missing, or a failed shard, is
// discarded and reported with ErrBlockFailed: it is never published with holes. An id that was
// not created is reported with ErrNotFound.
func (e *Engine) Commit(ids []BlockID, ok bool) error {
	if !e.life.Enter() {
		return ErrClosed
	}
	defer e.life.Done()
	var (
		errs    []error
		recs    []*wal.Record
		flights []*inflightDump
	)
	e.mu.Lock()
	for _, id := range ids {
		s := e.mu.staging[id]
		switch {
		case s == nil || !s.v0:
			errs = append(errs, blockErr(ErrNotFound, id, "commit: block was not created"))
		case !ok:
			e.dropSlotLocked(id, s, nil)
		case s.failed != nil:
			e.dropSlotLocked(id, s, nil)
			errs = append(errs, blockErr(ErrBlockFailed, id, "commit: a shard failed: %v", s.failed))
		case s.arrived < e.opts.Layout.Shards || s.pending > 0:
			errs = append(errs, blockErr(ErrBlockFailed, id, "commit: %d of %d shards dumped", s.arrived, e.opts.Layout.Shards))
			e.dropSlotLocked(id, s, nil)
		default:
			rec, flight, _, _ := e.publishSlotLocked(id, s)
			recs = append(recs, rec)
			flights = append(flights, flight)
		}
	}
	e.mu.Unlock()
	errs = append(errs, e.appendRecords(recs, flights)...)
	return errors.Join(errs...)
}

// appendRecords writes records claimed by this engine (each registered in inflight), completes
// their in-flight entries with the outcome, returns their buffers to the pool and returns one
// error per record (all nil on success).
func (e *Engine) appendRecords(recs []*wal.Record, flights []*inflightDump) []error {
	e.compressRecords(recs)
	return e.writeRecords(recs, flights)
}

// compressRecords compresses records for the first tier (per its codec).
func (e *Engine) compressRecords(recs []*wal.Record) {
	for _, rec := range recs {
		e.compressRecord(rec, e.tiers[0].Codec())
	}
}

// writeRecords is appendRecords once the records are compressed.
func (e *Engine) writeRecords(recs []*wal.Record, flights []*inflightDump) []error {
	if len(recs) == 0 {
		return nil
	}
	// The shared caches get the blocks beside the disk write (writeThrough); their copy
	// is done before the records' buffers go back to the pool below.
	var shared sync.WaitGroup
	if e.sharesCaches() {
		shared.Add(1)
		go func() {
			defer shared.Done()
			e.writeThrough(recs, false)
		}()
	}
	err := wrapIO(e.w.Append(recs))
	shared.Wait()
	errs := make([]error, len(recs))
	e.mu.Lock()
	for k, rec := range recs {
		delete(e.mu.inflight, rec.ID)
		if err != nil {
			errs[k] = blockErr(err, rec.ID, "dump")
		}
		flights[k].finish(errs[k])
	}
	e.mu.Unlock()
	if err == nil {
		// Write-through: the inclusive caches get the blocks once they are stored below.
		e.writeThrough(recs, true)
	}
	for _, rec := range recs {
		e.putRecord(rec)
	}
	if err == nil {
		e.stats.dumpedBlocks.Add(int64(len(recs)))
		e.stats.dumpedBytes.Add(int64(len(recs)) * e.opts.Layout.BlockBytes())
	}
	return errs
}
