package engine

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/par"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// SidecarKind names a kind of representation stored beside blocks (package kernels numbers
// the kinds it computes); valid kinds are [1, MaxSidecarKind].
type SidecarKind = format.SidecarKind

// MaxSidecarKind is the largest valid SidecarKind.
const MaxSidecarKind = format.MaxSidecarKind

// MaxSidecarParts is the most parts a sidecar may have (one per layer of the model).
const MaxSidecarParts = format.MaxSidecarParts

// maxSidecarBytes bounds one sidecar (all its parts): a representation is a small fraction of
// its block, and a sidecar is read whole when it is not in memory.
const maxSidecarBytes = 64 << 20

// Sidecars are small representations of a block (pooled keys, hash codes, channel bounds) that
// sparse-attention methods scan to choose which blocks a decode step loads. Each is a record of
// its own in the log (format.RecordSidecar), indexed under (block id, kind), written after its
// block and stored raw and packed: parts equal in size (one per layer) back to back, each with
// its own checksum, so a part is read and verified alone. The index never lets a sidecar
// outlive its block (index/sidecar.go); demotion and promotion move a block's sidecars with it;
// compaction copies them forward like blocks; the memory tier caches them under their own key.

// DumpSidecars stores the sidecar of kind for each block: src[i] is the sidecar of ids[i], made
// of parts equal parts (len(src[i]) a positive multiple of parts). A block being dumped is
// waited for (at most TaskTimeout); a block that is not stored fails with ErrNotFound, and a
// sidecar of that kind already stored for the block is kept (a block's representation is a
// function of its bytes) and counted as deduplicated. The task completes when every sidecar is
// durable and visible to LoadSidecars, or has failed; src must not change until then.
func (e *Engine) DumpSidecars(kind SidecarKind, parts int, ids []BlockID, src [][]byte) *Task {
	switch {
	case !format.ValidSidecarKind(kind):
		return failedTask(ids, fmt.Errorf("dump sidecars: kind %d out of range [1, %d]: %w", kind, MaxSidecarKind, ErrInvalidArgument))
	case parts < 1 || parts > MaxSidecarParts:
		return failedTask(ids, fmt.Errorf("dump sidecars: %d parts out of range [1, %d]: %w", parts, MaxSidecarParts, ErrInvalidArgument))
	case len(src) != len(ids):
		return failedTask(ids, fmt.Errorf("dump sidecars: %d ids but %d buffers: %w", len(ids), len(src), ErrInvalidArgument))
	case e.opts.ReadOnly || e.opts.LookupOnly:
		return failedTask(ids, fmt.Errorf("dump sidecars: store opened read-only or lookup-only: %w", ErrInvalidArgument))
	}
	if err := e.spaceError(); err != nil {
		return failedTask(ids, fmt.Errorf("dump sidecars: %w", err))
	}
	if err := e.ix.Failed(); err != nil {
		return failedTask(ids, fmt.Errorf("dump sidecars: the index failed; reopen the store: %w", wrapIO(err)))
	}
	return e.startTask(ids, e.metrics.dumpLatency, func(t *Task) { e.runDumpSidecars(t, kind, parts, src) })
}

func (e *Engine) runDumpSidecars(t *Task, kind SidecarKind, parts int, src [][]byte) {
	var (
		recs   []*wal.Record
		owners []int
	)
	for i, id := range t.ids {
		n := len(src[i])
		switch {
		case t.cancelled():
			t.errs[i] = blockErr(ErrTimeout, id, "dump sidecar cancelled")
			continue
		case id.IsZero():
			t.errs[i] = fmt.Errorf("dump sidecars: zero block id at position %d: %w", i, ErrInvalidArgument)
			continue
		case n == 0 || n%parts != 0 || n > maxSidecarBytes || int64(n/parts) > format.MaxShardBytes:
			t.errs[i] = blockErr(ErrInvalidArgument, id, "sidecar %d of %d bytes: not %d equal parts of at most %d bytes in all", kind, n, parts, maxSidecarBytes)
			continue
		}
		if err := e.awaitBlock(t, id); err != nil {
			t.errs[i] = err
			continue
		}
		if e.ix.HasSidecar(id, kind) {
			e.stats.dedupedDumps.Add(1)
			continue
		}
		recs = append(recs, e.sidecarRecord(id, kind, parts, src[i]))
		owners = append(owners, i)
	}
	if len(recs) == 0 {
		return
	}
	err := wrapIO(e.w.Append(recs))
	for k, rec := range recs {
		id := rec.ID
		switch {
		case err != nil:
			t.errs[owners[k]] = blockErr(err, id, "dump sidecar %d", kind)
		case !e.ix.HasSidecar(id, kind):
			// The block went (evicted, dropped) between the check and the publication: the
			// index refused a sidecar without its block; its record is dead space.
			t.errs[owners[k]] = blockErr(ErrNotFound, id, "dump sidecar %d: the block is no longer stored", kind)
		default:
			e.atSeam(seamSidecarRead, id)
			e.cacheSidecar(id, kind, rec.Payload[:rec.Layout.BlockBytes()], rec.ShardCRCs)
			e.stats.dumpedSidecars.Add(1)
		}
		e.putRecord(rec)
	}
}

// cacheSidecar puts a sidecar read or written under its index entry (here or in the foreign
// index) into the memory tier, if any, unless the entry went meanwhile. The memory tier serves
// sidecars without asking the index, so one cached after its block was dropped would outlive
// it: every removal deletes the index entry first and the cached copy after, so caching first
// and checking the entry after leaves no window in which an orphan stays cached.
func (e *Engine) cacheSidecar(id BlockID, kind SidecarKind, data []byte, crcs []uint32) {
	if e.mem == nil {
		return
	}
	e.mem.PutSidecar(id, kind, data, crcs)
	if !e.hasSidecar(id, kind) {
		e.mem.RemoveSidecar(id, kind)
	}
}

// uncacheUnindexedSidecars drops from the memory tier the cached sidecars, of blocks ids (of
// every block when ids is nil), that neither index holds any more. Removals from the foreign
// index call it after deleting the entries (the order cacheSidecar relies on); they do not
// drop every cached sidecar of the blocks, which this instance may hold in its own index too.
func (e *Engine) uncacheUnindexedSidecars(ids []BlockID) {
	if e.mem != nil {
		e.mem.PruneSidecars(ids, e.hasSidecar)
	}
}

// awaitBlock returns nil once block id is stored: at once if it is, after its dump if one is
// in flight or in assembly (at most until the task's deadline), ErrNotFound if it is not.
func (e *Engine) awaitBlock(t *Task, id BlockID) error {
	e.mu.Lock()
	var flight *inflightDump
	if d := e.mu.inflight[id]; d != nil {
		flight = d
	} else if s := e.mu.staging[id]; s != nil {
		flight = s.flight
	}
	e.mu.Unlock()
	if flight != nil {
		var timeout <-chan time.Time
		if !t.deadline.IsZero() {
			timer := time.NewTimer(time.Until(t.deadline))
			defer timer.Stop()
			timeout = timer.C
		}
		select {
		case <-flight.done:
			if flight.err != nil {
				return blockErr(ErrNotFound, id, "dump sidecar: the block's dump failed: %v", flight.err)
			}
		case <-timeout:
			return blockErr(ErrTimeout, id, "dump sidecar: the block's dump did not complete in time")
		}
	}
	if !e.ix.Contains(id) {
		return blockErr(ErrNotFound, id, "dump sidecar: the block is not stored")
	}
	return nil
}

// sidecarRecord builds the packed record of one sidecar in a pooled buffer.
func (e *Engine) sidecarRecord(id BlockID, kind SidecarKind, parts int, src []byte) *wal.Record {
	partBytes := len(src) / parts
	l := format.Layout{Shards: parts, TensorsPerShard: 1, ShardBytes: int64(partBytes)}
	payload := e.pool.Get(int(format.AlignUp(int64(len(src)))))
	clear(payload[copy(payload, src):])
	rec := &wal.Record{ID: id, Kind: kind, Layout: l, Compression: format.CompressionPacked,
		Buf: e.pool.Get(format.RecordHeaderSize), Payload: payload,
		ShardCRCs: make([]uint32, parts), StoredLens: make([]uint32, parts), StoredCRCs: make([]uint32, parts)}
	for p := range parts {
		c := format.Checksum(payload[p*partBytes : (p+1)*partBytes])
		rec.ShardCRCs[p], rec.StoredCRCs[p], rec.StoredLens[p] = c, c, uint32(partBytes)
	}
	return rec
}

// HasSidecars reports, for each block, whether its sidecar of kind is stored (here or, on a
// shared tier, by another instance), from memory.
func (e *Engine) HasSidecars(kind SidecarKind, ids []BlockID) []bool {
	out := make([]bool, len(ids))
	for i, id := range ids {
		out[i] = e.hasSidecar(id, kind)
	}
	return out
}

// hasSidecar reports whether block id's sidecar of kind is indexed, here or in the foreign
// index.
func (e *Engine) hasSidecar(id BlockID, kind SidecarKind) bool {
	return e.ix.HasSidecar(id, kind) || (e.share != nil && e.share.ForeignIndex() != nil && e.share.ForeignIndex().HasSidecar(id, kind))
}

// LoadSidecars copies part `part` of the sidecar of kind of every block into dst, one after
// the other: with n = len(dst)/len(ids), ids[i]'s part goes to dst[i·n : (i+1)·n] (a top-K scan
// over one layer of many blocks reads one contiguous array). found[i] says whether it did; a
// block whose sidecar is missing, has no such part, has parts of another size, or fails its
// checksum is not found (its bytes in dst are zeroed; a corrupt sidecar is dropped and
// counted). Parts come from the memory tier when there, else from disk, where the whole
// sidecar is read and cached so the next parts are memory hits. The error is for bad
// arguments and a closed engine only.
func (e *Engine) LoadSidecars(kind SidecarKind, part int, ids []BlockID, dst []byte) (found []bool, err error) {
	switch {
	case !format.ValidSidecarKind(kind):
		return nil, fmt.Errorf("load sidecars: kind %d out of range [1, %d]: %w", kind, MaxSidecarKind, ErrInvalidArgument)
	case len(ids) == 0:
		return nil, nil
	case len(dst) == 0 || len(dst)%len(ids) != 0:
		return nil, fmt.Errorf("load sidecars: %d bytes for %d blocks: %w", len(dst), len(ids), ErrInvalidArgument)
	case part < 0 || part >= MaxSidecarParts:
		return nil, fmt.Errorf("load sidecars: part %d out of range [0, %d): %w", part, MaxSidecarParts, ErrInvalidArgument)
	case e.opts.LookupOnly:
		return nil, errLookupOnly
	}
	if !e.life.Enter() {
		return nil, ErrClosed
	}
	defer e.life.Done()
	n := len(dst) / len(ids)
	found = make([]bool, len(ids))
	type read struct {
		i    int
		id   BlockID
		loc  index.Location
		seg  *wal.Segment
		tier tiers.Disk
		buf  []byte
	}
	var (
		reads []read
		ops   []devio.Op
	)
	if e.mem != nil {
		e.sidecarsFromMemory(kind, part, ids, dst, found)
	}
	for i, id := range ids {
		if found[i] {
			continue
		}
		out := dst[i*n : (i+1)*n]
		clear(out)
		loc, ok, err := e.ix.GetSidecar(id, kind)
		if err == nil && !ok && e.share != nil && e.share.ForeignIndex() != nil {
			loc, ok, err = e.share.ForeignIndex().GetSidecar(id, kind)
		}
		if err != nil || !ok || loc.Layout.ShardBytes != int64(n) || part >= loc.Layout.Shards || loc.Compression != format.CompressionPacked {
			if err != nil {
				e.opts.Logger.Warn("ucm: sidecar index read failed; a miss", "block", id, "kind", kind, "err", err)
			}
			e.stats.sidecarMisses.Add(1)
			continue
		}
		e.atSeam(seamSidecarLookedUp, id)
		// Relocation (demotion, promotion, compaction) may move the sidecar and retire its
		// segment after the entry was read: the entry is followed, as a block's is by Load.
		seg, loc, tier, err := e.acquireFollowing(id, kind, loc)
		if err != nil {
			var ce *wal.CorruptionError
			if errors.Is(err, wal.ErrSegmentGone) || errors.As(err, &ce) {
				_ = e.dropBrokenSidecar(id, kind, loc, err)
			} else {
				e.stats.readErrors.Add(1)
			}
			e.stats.sidecarMisses.Add(1)
			continue
		}
		buf := e.pool.Get(int(loc.PayloadBytes()))
		reads = append(reads, read{i: i, id: id, loc: loc, seg: seg, tier: tier, buf: buf})
		ops = append(ops, devio.Op{File: seg.File(), Buf: buf, Off: loc.ShardOffset(0)}) // the packed payload
	}
	if len(ops) > 0 {
		_ = e.submit(ops, func(k int) tiers.Disk { return reads[k].tier })
	}
	for k, r := range reads {
		err := ops[k].Err
		switch {
		case err == nil:
			err = verifySidecar(r.loc, r.buf)
			if err == nil {
				copy(dst[r.i*n:(r.i+1)*n], r.buf[int64(part)*int64(n):])
				found[r.i] = true
				e.stats.sidecarDiskReads.Add(1)
				e.atSeam(seamSidecarRead, r.id)
				e.cacheSidecar(r.id, kind, r.buf[:r.loc.Layout.BlockBytes()], r.loc.ShardCRCs)
			} else {
				_ = e.dropBrokenSidecar(r.id, kind, r.loc, err)
			}
		case shortRead(err) && cutShort(r.seg, r.loc):
			_ = e.dropBrokenSidecar(r.id, kind, r.loc, truncatedRecord(r.loc, err))
		default:
			e.stats.readErrors.Add(1)
		}
		if !found[r.i] {
			e.stats.sidecarMisses.Add(1)
		}
		r.seg.Release()
		e.pool.Put(r.buf)
	}
	return found, nil
}

// parallelSidecarBytes is the size of a LoadSidecars call from which its memory-tier copies
// (copy and checksum, memory-bound) are split across cores; sidecarChunkBytes is about how
// much of it one goroutine claims at a time.
const (
	parallelSidecarBytes = 1 << 20
	sidecarChunkBytes    = 256 << 10
)

// sidecarsFromMemory copies the parts the memory tier holds into dst and marks them found.
// Large calls are shared with helper goroutines claiming chunks of ids as they get a CPU
// (par.Chunks), so that a helper the scheduler starts late never delays the call.
func (e *Engine) sidecarsFromMemory(kind SidecarKind, part int, ids []BlockID, dst []byte, found []bool) {
	n := len(dst) / len(ids)
	run := func(lo, hi int) {
		hits, err := e.mem.GetSidecars(kind, part, ids[lo:hi], dst[lo*n:hi*n], found[lo:hi])
		if err != nil {
			e.opts.Logger.Error("ucm: memory tier: sidecar checksum mismatch; loading from disk", "kind", kind, "err", err)
		}
		e.stats.sidecarMemoryHits.Add(int64(hits))
	}
	workers := 1
	if len(dst) >= parallelSidecarBytes {
		workers = runtime.GOMAXPROCS(0)
	}
	par.Chunks(len(ids), max(1, sidecarChunkBytes/n), workers, run)
}

// verifySidecar checks every part of a packed sidecar payload against its checksums.
func verifySidecar(loc index.Location, payload []byte) error {
	n := loc.Layout.ShardBytes
	for p := 0; p < loc.Layout.Shards; p++ {
		if got := format.Checksum(payload[int64(p)*n : int64(p+1)*n]); got != loc.ShardCRCs[p] {
			return fmt.Errorf("%w: sidecar part %d checksum: index %#08x, computed %#08x", ErrCorrupt, p, loc.ShardCRCs[p], got)
		}
	}
	return nil
}

// dropBrokenSidecar forgets a sidecar that cannot be read (its segment gone, its bytes
// corrupt); the block is left alone. Like dropBroken for blocks, it returns the error to
// report.
func (e *Engine) dropBrokenSidecar(id BlockID, kind SidecarKind, loc index.Location, cause error) error {
	if errors.Is(cause, wal.ErrSegmentGone) {
		e.stats.missingSegmentReads.Add(1)
	} else {
		e.stats.corruptReads.Add(1)
	}
	e.opts.Logger.Error("ucm: stored sidecar unusable; dropped from the index", "block", id, "kind", kind, "segment", loc.Segment, "offset", loc.Offset, "err", cause)
	ix := e.ix
	if isForeign(loc.Segment) {
		ix = nil
		if e.share != nil {
			ix = e.share.ForeignIndex()
		}
	}
	if ix != nil && !e.opts.ReadOnly {
		b := ix.NewBatch()
		b.DeleteSidecarIf(id, kind, loc)
		if err := ix.Apply(b, false); err != nil {
			e.opts.Logger.Error("ucm: could not drop broken sidecar from the index", "block", id, "kind", kind, "err", err)
		}
	}
	if e.mem != nil {
		e.mem.RemoveSidecar(id, kind)
	}
	return fmt.Errorf("sidecar %d of block %s (segment %d offset %d): %w", kind, id, loc.Segment, loc.Offset, cause)
}

// evictSidecars moves the sidecars still live in segment n of tier t (their blocks are
// elsewhere) to the next tier, or drops them when there is none or it has no room.
func (e *Engine) evictSidecars(t tiers.Disk, n uint64) error {
	refs, err := e.liveRecords(n)
	if err != nil {
		return err
	}
	var side []recordRef
	for _, r := range refs {
		if r.kind != 0 {
			side = append(side, r)
		}
	}
	if len(side) == 0 {
		return nil
	}
	if t.Pos()+1 < len(e.tiers) {
		_, _, _, err := e.relocate(side, e.tiers[t.Pos()+1])
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrNoSpace) {
			return err
		}
	}
	b := e.ix.NewBatch()
	for _, r := range side {
		b.DeleteSidecarIf(r.id, r.kind, r.loc)
	}
	if err := e.ix.Apply(b, false); err != nil {
		return err
	}
	if e.mem != nil {
		for _, r := range side {
			e.mem.RemoveSidecar(r.id, r.kind)
		}
	}
	return nil
}

// foreignSidecarsOf returns the sidecars, in the foreign index, of the foreign blocks in refs.
func (e *Engine) foreignSidecarsOf(refs []recordRef) []recordRef {
	if e.share == nil || e.share.ForeignIndex() == nil {
		return nil
	}
	var out []recordRef
	for _, r := range refs {
		for _, kind := range e.share.ForeignIndex().SidecarKinds(r.id) {
			if loc, ok, err := e.share.ForeignIndex().GetSidecar(r.id, kind); err == nil && ok {
				out = append(out, recordRef{r.id, kind, loc})
			}
		}
	}
	return out
}
