package engine

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Space reclamation (docs/tiers.md). A disk tier above its high watermark is brought down to
// its low watermark by, in this order:
//
//  1. retiring sealed segments no entry points into (dropped whole);
//  2. compacting sealed segments whose live ratio is at most Options.CompactLiveRatio: their
//     live records are copied forward (verified, synced, then moved in one index batch that
//     moves each entry only if it still points at the old place) and the segment retired;
//  3. evicting the least recently used blocks of the tier (chain-aware, never a block pinned
//     by a load): demoted to the next disk tier when there is one, else dropped from the
//     index; the segments they leave empty or sparse are reclaimed by 1 and 2 on the next round.
//     A shared next tier without room yet (its share is granted by the lease holder, an
//     interval or two away) makes a background pass stop and leave the victims where they
//     are; they are dropped only when writers have waited for the room a few intervals
//     (evict).
//
// Retiring a segment marks it deleting in the index (durably) before the file is unlinked,
// which happens when its last reader releases it; recovery finishes interrupted deletions, so
// a crash never resurrects evicted blocks nor leaves an orphan file.

// DefaultCompactLiveRatio is the live ratio at or below which a sealed segment is compacted.
const DefaultCompactLiveRatio = 0.5

// reclaimRounds bounds the rounds of one reclamation pass (each round evicts at least one
// block or stops).
const reclaimRounds = 64

// reclaimer runs reclamation for tiers above their high watermark, when kicked by a writer
// waiting for space and once a second. Below the watermarks, unless Options.CompactInterval is
// negative, it also reclaims dead space (failed, abandoned, relocated, evicted or dropped
// records): every second it retires the sealed segments no entry points into, and on its first
// second after Open and then every CompactInterval it compacts those at or below
// CompactLiveRatio (online compaction; docs/tiers.md, "When dead space comes back").
func (e *Engine) reclaimer() {
	defer e.bg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	online := e.opts.CompactInterval > 0
	var lastCompact time.Time // zero: the first pass after Open compacts, whatever the interval
	for {
		select {
		case <-e.stop:
			return
		case <-tick.C:
		case <-e.reclaimKick:
		}
		compact := online && time.Since(lastCompact) >= e.opts.CompactInterval
		if compact {
			lastCompact = time.Now()
		}
		for _, t := range e.tiers {
			var err error
			switch {
			case t.Space().OverHigh():
				_, err = e.reclaimTier(t, -1, recencyOf(t))
			case compact:
				// Online compaction: dead space is reclaimed in every tier, also below the
				// watermarks and in unlimited tiers.
				err = e.compactTier(t, e.opts.CompactLiveRatio)
			case online:
				// A segment with nothing live costs no copy to reclaim: retired at once, not
				// after a compaction interval that a short-lived process never reaches.
				err = e.compactTier(t, 0)
			}
			if err != nil && !errors.Is(err, ErrClosed) {
				e.opts.Logger.Warn("ucm: reclamation failed", "tier", t.Name(), "err", err)
			}
		}
	}
}

// tierFileBytes is the bytes of t's segment files as the segment table records them (an active
// segment's size is its durable end).
func (e *Engine) tierFileBytes(t tiers.Disk) int64 {
	var n int64
	for _, row := range e.ix.Segments() {
		if e.tierOf(row.Number) == t {
			n += row.Size
		}
	}
	return n
}

// compactTier retires t's empty sealed segments and compacts those at or below liveRatio (0:
// only retires the empty ones, copying nothing).
func (e *Engine) compactTier(t tiers.Disk, liveRatio float64) error {
	select {
	case <-e.stop:
		return ErrClosed
	default:
	}
	e.reclaimMu.Lock()
	defer e.reclaimMu.Unlock()
	var rep ReclaimReport
	return e.reclaimSegments(t, liveRatio, &rep, nil, nil)
}

// ReclaimReport says what one reclamation did.
type ReclaimReport struct {
	SegmentsRetired   int // segment files deleted
	SegmentsCompacted int // of which compacted first
	// BytesReclaimed is the bytes freed: by Compact, the sizes of the segments it retired less
	// the bytes of the records it copied out of them (never negative); by eviction, the fall
	// of the tier's accounted segment bytes (the files retired less what compaction during
	// the eviction wrote forward: negative when that outweighs them).
	BytesReclaimed int64
	// compactedBytes accumulates Compact's BytesReclaimed segment by segment.
	compactedBytes int64
	RecordsMoved   int // live records copied forward by compaction
	BlocksEvicted  int // blocks dropped from the tier (demoted or deleted)
	BlocksDemoted  int // of which moved to the next tier
}

// reclaimTier brings t down to target accounted bytes (-1: its low watermark). It returns what
// it did; it stops early, without error, when nothing more can be evicted (everything left is
// pinned or the tier is empty).
func (e *Engine) reclaimTier(t tiers.Disk, target int64, lru recency) (ReclaimReport, error) {
	e.reclaimMu.Lock()
	defer e.reclaimMu.Unlock()
	return e.reclaimTierLocked(t, target, lru)
}

// reclaimTierLocked is reclaimTier with reclaimMu held.
func (e *Engine) reclaimTierLocked(t tiers.Disk, target int64, lru recency) (rep ReclaimReport, err error) {
	before := t.Space().Segments()
	defer func() { rep.BytesReclaimed = before - t.Space().Segments() }()
	excess := func() int64 {
		if target < 0 {
			return t.Space().Excess()
		}
		// An explicit target is about the files: active segments count what they hold, not
		// their reservation (which a target below one segment could never get under).
		return e.tierFileBytes(t) - target
	}
	// Emptying the tier moves every evictable block out of it (demoted or deleted): compacting
	// before evicting would copy records forward only to move or delete them next, and leave
	// the segment they were copied into behind. Only segments already empty are retired
	// first; what eviction cannot take (pinned blocks) is compacted after it.
	compactRatio := e.opts.CompactLiveRatio
	if target == 0 {
		compactRatio = 0
	}
	for round := 0; round < reclaimRounds && excess() > 0; round++ {
		select {
		case <-e.stop:
			return rep, ErrClosed
		default:
		}
		if err := e.reclaimSegments(t, compactRatio, &rep, excess, nil); err != nil {
			return rep, err
		}
		need := excess()
		if need <= 0 || lru == nil {
			break
		}
		if !e.waitRecency() {
			return rep, ErrClosed
		}
		victims := lru.Victims(need)
		if len(victims) == 0 {
			break
		}
		if err := e.evict(t, lru, victims, target < 0, &rep); err != nil {
			if errors.Is(err, errEvictionDeferred) {
				break // the next tier's share is on its way; it kicks the reclaimer
			}
			return rep, err
		}
		// The victims left holes across segments. Before evicting more, rewrite the hot
		// remainder of the sparsest segments forward: compaction costs I/O, eviction costs a
		// recomputation.
		if err := e.reclaimSegments(t, pressureLiveRatio, &rep, excess, nil); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// pressureLiveRatio is the live ratio up to which a segment is compacted, after an eviction
// round, when the tier is still above its target: bounds the bytes rewritten per byte freed
// (at most 9 for 1).
const pressureLiveRatio = 0.9

// reclaimSegments retires t's empty sealed segments and compacts those at or below
// liveRatio, emptiest first, while excess() > 0 (or all of them when excess is nil), calling
// progress (if not nil) after each segment.
func (e *Engine) reclaimSegments(t tiers.Disk, liveRatio float64, rep *ReclaimReport, excess func() int64, progress func()) error {
	type cand struct {
		row   index.SegmentMeta
		ratio float64
	}
	var cands []cand
	for _, row := range e.ix.Segments() {
		if row.State != index.SegmentSealed || e.tierOf(row.Number) != t || row.Size <= 0 {
			continue
		}
		ratio := float64(row.LiveBytes) / float64(row.Size)
		if row.LiveRecords == 0 || ratio <= liveRatio {
			cands = append(cands, cand{row, ratio})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(a.ratio, b.ratio) })
	for _, c := range cands {
		if excess != nil && excess() <= 0 {
			return nil
		}
		var written int64
		if c.row.LiveRecords > 0 {
			moved, w, err := e.compactSegment(t, c.row.Number)
			rep.RecordsMoved += moved
			written = w
			if err != nil {
				if errors.Is(err, ErrNoSpace) {
					return nil // no room to copy into: eviction must free whole segments first
				}
				return err
			}
			rep.SegmentsCompacted++
		}
		if err := e.retire(c.row.Number); err != nil {
			return err
		}
		rep.SegmentsRetired++
		rep.compactedBytes += c.row.Size - written
		if progress != nil {
			progress()
		}
	}
	return nil
}

// compactSegment copies every live record of segment n (blocks and sidecars) forward into t's
// relocation writer. The segment's footer lists its records, so only those are looked up (a
// damaged footer falls back to a scan of the index). Entries that moved or went away meanwhile
// are left alone by the conditional index batch.
func (e *Engine) compactSegment(t tiers.Disk, n uint64) (int, int64, error) {
	refs, err := e.liveRecords(n)
	if err != nil {
		return 0, 0, err
	}
	moved, _, written, err := e.relocate(refs, t)
	return moved, written, err
}

// recordRef is one live record: a block (kind 0) or a block's sidecar, and where it is.
type recordRef struct {
	id   BlockID
	kind format.SidecarKind
	loc  index.Location
}

// liveRecords returns the records (blocks, then sidecars, in footer order) whose index entry
// points into sealed segment n.
func (e *Engine) liveRecords(n uint64) ([]recordRef, error) {
	var refs []recordRef
	if row, ok := e.ix.Segment(n); ok {
		if seg, t, err := e.acquireInTier(n); err == nil {
			var (
				entries []format.FooterEntry
				ferr    = fmt.Errorf("segment %d: %w", n, wal.ErrSegmentGone) // no tier: retired meanwhile
			)
			if t != nil {
				entries, ferr = wal.ReadFooter(seg, row.Size, t.Backend())
			}
			if ferr == nil {
				for _, fe := range entries {
					ids := []BlockID{fe.ID}
					if fe.Type == format.RecordBatch {
						bh, err := wal.ReadBatchHeader(seg, fe, t.Backend())
						if err != nil {
							ferr = err
							break
						}
						ids = bh.IDs
					}
					for _, id := range ids {
						loc, ok, err := e.entry(id, fe.Kind)
						if err != nil {
							seg.Release()
							return nil, err
						}
						if ok && loc.Segment == n && loc.Offset == fe.Offset {
							refs = append(refs, recordRef{id, fe.Kind, loc})
						}
					}
				}
			}
			seg.Release()
			if ferr == nil {
				return refs, nil
			}
			refs = refs[:0]
			e.opts.Logger.Warn("ucm: segment footer unreadable; finding its records in the index", "segment", n, "err", ferr)
		}
	}
	err := e.ix.Iterate(func(id BlockID, loc index.Location) bool {
		if loc.Segment == n {
			refs = append(refs, recordRef{id, 0, loc})
		}
		return true
	})
	if err == nil {
		err = e.ix.IterateSidecars(func(id BlockID, kind format.SidecarKind, loc index.Location) bool {
			if loc.Segment == n {
				refs = append(refs, recordRef{id, kind, loc})
			}
			return true
		})
	}
	return refs, err
}

// sidecarsOf returns the sidecars of the blocks in refs that are stored in tier t (all tiers
// when t is nil) and not in refs already: what must move with the blocks so that a tier is
// not left holding representations of blocks it no longer has.
func (e *Engine) sidecarsOf(refs []recordRef, t tiers.Disk) []recordRef {
	var out []recordRef
	for _, r := range refs {
		if r.kind != 0 {
			continue
		}
		for _, kind := range e.ix.SidecarKinds(r.id) {
			if slices.ContainsFunc(refs, func(o recordRef) bool { return o.id == r.id && o.kind == kind }) {
				continue
			}
			loc, ok, err := e.ix.GetSidecar(r.id, kind)
			if err != nil || !ok || (t != nil && e.tierOf(loc.Segment) != t) {
				continue
			}
			out = append(out, recordRef{r.id, kind, loc})
		}
	}
	return out
}

// relocateBatch bounds the records read and appended together by relocate.
const relocateBatch = 16

// relocate copies records from where their refs say they are into dst's relocation writer:
// live blocks of one batch record together as a new batch record (relocateBatch), the others
// record by record. Each record is read whole and verified (header and every shard checksum)
// before it is written again; a record that fails is handled like a failed load (dropped from
// the index, counted).
// The moves are published by the writer's Publish hook with a compare-and-set per entry. It
// returns how many records were copied (and how many of them are blocks) and the bytes they
// take in dst.
func (e *Engine) relocate(refs []recordRef, dst tiers.Disk) (moved, blocks int, written int64, err error) {
	groups, refs := e.batchGroups(refs, dst)
	for _, g := range groups {
		n, w, err := e.relocateBatch(g, dst)
		moved, blocks, written = moved+n, blocks+n, written+w
		if err != nil {
			return moved, blocks, written, err
		}
	}
	for lo := 0; lo < len(refs); lo += relocateBatch {
		hi := min(len(refs), lo+relocateBatch)
		recs, err := e.readRecords(refs[lo:hi])
		if err != nil {
			return moved, blocks, written, err
		}
		if len(recs) == 0 {
			continue
		}
		for _, r := range recs {
			if r.Kind == 0 {
				e.compressRecord(r, dst.Codec())
			}
			if isForeign(r.Origin.Segment) {
				r.Origin = nil // another instance's block: the copy is this instance's own
			}
		}
		for _, r := range recs {
			written += r.Size()
		}
		err = wrapIO(dst.Writer(true).Append(recs))
		for _, r := range recs {
			e.putRecord(r)
		}
		if err != nil {
			return moved, blocks, written, fmt.Errorf("relocate into tier %q: %w", dst.Name(), err)
		}
		moved += len(recs)
		for _, r := range recs {
			if r.Kind == 0 {
				blocks++
			}
		}
	}
	return moved, blocks, written, nil
}

// readRecords reads and verifies whole records for relocation; unusable ones are dropped from
// the index and skipped. The returned records own pooled buffers, the header's and the
// payload's apart (read by one vectored read; see newRecord). A block of a batch record that
// does not move with others of its batch (relocateBatch) is read shard by shard (its shards
// lie N × ShardStride apart) into a payload laid out as a record's, and written as a record of
// its own.
func (e *Engine) readRecords(refs []recordRef) ([]*wal.Record, error) {
	l := e.opts.Layout
	type read struct {
		rec    *wal.Record
		seg    *wal.Segment
		ref    recordRef
		tier   tiers.Disk
		header bool // ops[lo] reads the record header
		lo, hi int  // ops[lo:hi] are this record's
	}
	var (
		reads []read
		ops   []devio.Op
	)
	for _, ref := range refs {
		var (
			seg  *wal.Segment
			tier tiers.Disk
			err  error
		)
		if isForeign(ref.loc.Segment) {
			// Another instance's block is copied from wherever it is now: its publication log's
			// segment alias gives way to its manifest's.
			seg, ref.loc, tier, err = e.acquireFollowing(ref.id, ref.kind, ref.loc)
		} else {
			seg, tier, err = e.acquireInTier(ref.loc.Segment)
		}
		loc := ref.loc
		if err != nil {
			var ce *wal.CorruptionError
			switch {
			case errors.Is(err, wal.ErrSegmentGone) && e.movedAway(ref):
				// Moved or dropped by a relocation that ran since the ref was read (a
				// promotion beside a compaction), and its segment retired: not broken, and
				// nothing to copy from here.
				continue
			case errors.Is(err, wal.ErrSegmentGone) || errors.As(err, &ce):
				_ = e.dropBrokenRef(ref, err)
				continue
			}
			for _, r := range reads {
				r.seg.Release()
				e.putRecord(r.rec)
			}
			return nil, wrapIO(err)
		}
		rec := &wal.Record{ID: ref.id, Kind: ref.kind, Layout: loc.Layout, ShardCRCs: loc.ShardCRCs,
			Buf: e.pool.Get(format.RecordHeaderSize), Payload: e.pool.Get(int(loc.PayloadBytes())),
			Compression: loc.Compression, StoredLens: loc.StoredLens, StoredCRCs: loc.StoredCRCs,
			Origin: &wal.Origin{Segment: loc.Segment, Offset: loc.Offset}}
		r := read{rec: rec, seg: seg, ref: ref, tier: tier, header: !loc.IsBatch(), lo: len(ops)}
		if r.header {
			ops = append(ops, devio.Op{File: seg.File(), Buf: rec.Buf, Off: loc.Offset})
		}
		if loc.Compression == format.CompressionNone {
			ops = appendShardReads(ops, seg.File(), loc, 0, [][]byte{rec.Payload})
		} else {
			ops = append(ops, devio.Op{File: seg.File(), Buf: rec.Payload, Off: loc.ShardOffset(0)})
		}
		r.hi = len(ops)
		reads = append(reads, r)
	}
	if len(ops) > 0 {
		owner := make([]tiers.Disk, len(ops))
		for _, r := range reads {
			for i := r.lo; i < r.hi; i++ {
				owner[i] = r.tier
			}
		}
		_ = e.submit(ops, func(i int) tiers.Disk { return owner[i] })
	}
	var out []*wal.Record
	for _, r := range reads {
		var err error
		for _, op := range ops[r.lo:r.hi] {
			if err = op.Err; err != nil {
				break
			}
		}
		switch {
		case err == nil:
			var header []byte
			if r.header {
				header = r.rec.Buf
			}
			err = e.checkRecord(r.ref.id, r.ref.loc, header, r.rec.Payload)
			if err != nil {
				_ = e.dropBrokenRef(r.ref, err)
			}
		case shortRead(err) && cutShort(r.seg, r.ref.loc):
			_ = e.dropBrokenRef(r.ref, truncatedRecord(r.ref.loc, err))
		default:
			e.stats.readErrors.Add(1)
		}
		r.seg.Release()
		if err != nil || (r.ref.kind == 0 && r.ref.loc.Layout != l) {
			e.putRecord(r.rec)
			continue
		}
		out = append(out, r.rec)
	}
	return out, nil
}

// movedAway reports whether r's entry no longer points where r says (moved or gone).
func (e *Engine) movedAway(r recordRef) bool {
	cur, ok, err := e.entryLike(r.id, r.kind, r.loc)
	return err == nil && (!ok || cur.Segment != r.loc.Segment || cur.Offset != r.loc.Offset)
}

// dropBrokenRef is dropBroken for a block or a sidecar.
func (e *Engine) dropBrokenRef(r recordRef, cause error) error {
	if r.kind == 0 {
		return e.dropBroken(r.id, r.loc, cause)
	}
	return e.dropBrokenSidecar(r.id, r.kind, r.loc, cause)
}

// checkRecord verifies a whole record, read into header and payload, against its index entry.
// A block of a batch record has no header of its own (header nil): its shards are checked
// against the index's checksums.
func (e *Engine) checkRecord(id BlockID, loc index.Location, header, payload []byte) error {
	if !loc.IsBatch() {
		if err := checkHeader(id, loc, header); err != nil {
			return err
		}
	}
	if loc.Compression == format.CompressionNone {
		h := format.RecordHeader{ID: id, Layout: loc.Layout, ShardCRCs: loc.ShardCRCs}
		return wal.VerifyShards(&h, payload, 0, loc.Layout.Shards)
	}
	// Compressed records are moved as stored: their stored checksums cover every byte copied
	// (the raw checksums are checked again by every load).
	for i := 0; i < loc.Layout.Shards; i++ {
		off, n := loc.ShardExtent(i)
		if got := format.Checksum(payload[off : off+n]); got != loc.StoredCRCs[i] {
			return fmt.Errorf("%w: shard %d stored checksum: index %#08x, computed %#08x", ErrCorrupt, i, loc.StoredCRCs[i], got)
		}
	}
	return nil
}

// errEvictionDeferred: evict left its victims in place for a shared next tier to be granted
// room (mayDefer).
var errEvictionDeferred = errors.New("eviction deferred until the next tier has room")

// evictionDeferral bounds, in sharing passes (and at least as many refresh intervals), how
// long writers waiting for room in a tier wait for a shared next tier's share before evicted
// blocks are dropped instead: a request and its grant take about one pass each way, a new lease
// holder two more. The wait never lasts more than a quarter of the task timeout, which those
// writers' dumps would otherwise run into.
const evictionDeferral = 4

// evict removes victims from t: demoted to the next disk tier if there is one (falling back
// to dropping them when it has no room), else deleted from the index, only where their entry
// still points into t. With mayDefer (a background pass), a shared next tier that refuses for
// lack of its share leaves them in t instead, with errEvictionDeferred: the share is asked for
// ahead of need and arrives within an interval or two, and a block dropped is a prefill
// recomputed. Without limit while t is within its capacity and no writer waits for room in it;
// for evictionDeferral sharing passes when writers wait (then they are dropped as before).
func (e *Engine) evict(t tiers.Disk, lru recency, victims []BlockID, mayDefer bool, rep *ReclaimReport) error {
	var refs []recordRef
	for _, id := range victims {
		loc, ok, err := e.ix.Get(id)
		if err != nil {
			return err
		}
		if !ok || e.tierOf(loc.Segment) != t {
			lru.Remove(id) // already gone from this tier
			continue
		}
		refs = append(refs, recordRef{id: id, loc: loc})
	}
	if len(refs) == 0 {
		return nil
	}
	if t.Pos()+1 < len(e.tiers) {
		next := e.tiers[t.Pos()+1]
		// The blocks' sidecars in this tier go down with them.
		_, moved, _, err := e.relocate(append(refs, e.sidecarsOf(refs, t)...), next)
		if moved > 0 || !errors.Is(err, ErrNoSpace) {
			e.deferrals[t.Pos()].reset() // room came (or the blocks went elsewhere): a new wait starts afresh
		}
		if err == nil {
			rep.BlocksDemoted += moved
			rep.BlocksEvicted += len(refs)
			e.stats.evictedBlocks.Add(int64(len(refs)))
			for _, r := range refs {
				lru.Remove(r.id) // moved ones left via Publish; broken ones were dropped
			}
			return nil
		}
		if !errors.Is(err, ErrNoSpace) {
			return err
		}
		if mayDefer && accountOf(next) != nil {
			if t.Space().Demand() == 0 && t.Space().Used() <= t.Config().Capacity {
				return errEvictionDeferred // costs nothing: no writer waits for this room
			}
			var passes int64
			if e.share != nil {
				passes = e.share.Refreshes()
			}
			if !e.deferrals[t.Pos()].over(passes, evictionDeferral, e.opts.SharedRefreshInterval, e.opts.TaskTimeout/4) {
				return errEvictionDeferred
			}
		}
		e.kickReclaimer()
		e.opts.Logger.Warn("ucm: next tier full; evicted blocks dropped instead of demoted", "tier", t.Name(), "next", next.Name(), "err", err)
		// Some may have moved before the refusal; drop only those still here.
	}
	b := e.ix.NewBatch()
	results := make([]*bool, len(refs))
	for k, r := range refs {
		results[k] = b.DeleteIf(r.id, r.loc) // with its sidecars
	}
	if err := e.ix.Apply(b, false); err != nil {
		return err
	}
	for k, r := range refs {
		id := r.id
		lru.Remove(id)
		if *results[k] {
			rep.BlocksEvicted++
			e.stats.evictedBlocks.Add(1)
			e.uncache(id)
		}
	}
	return nil
}

// retire deletes segment n: marked deleting in the index (durably), then unlinked once its last
// reader releases it, then its row removed and its bytes released from its tier's account.
func (e *Engine) retire(n uint64) error {
	row, ok := e.ix.Segment(n)
	if !ok {
		return nil
	}
	if row.LiveRecords != 0 {
		return fmt.Errorf("retire segment %d: %d live records: %w", n, row.LiveRecords, ErrCorrupt)
	}
	wasSealed := row.State == index.SegmentSealed
	row.State = index.SegmentDeleting
	b := e.ix.NewBatch()
	b.SetSegment(row)
	if err := e.ix.Apply(b, true); err != nil {
		return fmt.Errorf("retire segment %d: %w", n, err)
	}
	s, h := e.segs.forget(n)
	shared := h.tier != nil && h.tier.Shared()
	// A shared tier's files are read by other instances: never overwritten in place, and a
	// published one stays a grace period after it leaves the manifest.
	recyclable := s != nil && s.Recyclable() && !shared
	remove := func() { e.finishRetire(n, row.Size, recyclable) }
	if shared && wasSealed {
		finish := remove
		remove = func() { e.share.RetireShared(n, finish) }
	}
	if s == nil {
		remove()
		return nil
	}
	s.Retire(remove)
	return nil
}

// finishRetire unlinks a retired segment (or renames its file for reuse, when recyclable and
// its directory's pool has room), makes that durable and forgets it. Failures are logged: the
// row stays deleting and the next Open finishes the job.
func (e *Engine) finishRetire(n uint64, size int64, recyclable bool) {
	h, ok := e.home(n)
	if !ok {
		return
	}
	kept, err := h.tier.Unlink(n, h.dir, size, recyclable)
	if err != nil {
		e.opts.Logger.Error("ucm: could not delete retired segment; the next Open will", "segment", n, "err", err)
		return
	}
	b := e.ix.NewBatch()
	b.DeleteSegment(n)
	if err := e.ix.Apply(b, false); err != nil {
		e.opts.Logger.Error("ucm: could not remove retired segment's row; the next Open will", "segment", n, "err", err)
	}
	e.segs.forgetHome(n)
	h.tier.Released(h.dir, n, size, kept)
	e.stats.segmentsRetired.Add(1)
}

// Evict frees space in the disk tier named tier (the first disk tier when empty) until its
// segment files hold at most toBytes, by the same policy as automatic reclamation. It returns what it did;
// fewer bytes are freed when the remaining blocks are pinned or the store is empty. Only sealed
// segments are retired: the active segment, and one whose background seal has not finished,
// keep their files (their evicted blocks are gone from the index) until a later reclamation
// finds them sealed and empty. Sync first waits for the seals under way.
func (e *Engine) Evict(tier string, toBytes int64) (ReclaimReport, error) {
	if !e.enter() {
		return ReclaimReport{}, ErrClosed
	}
	defer e.tasks.Done()
	t, err := e.diskTierNamed(tier)
	if err != nil {
		return ReclaimReport{}, err
	}
	if toBytes < 0 {
		return ReclaimReport{}, fmt.Errorf("evict to %d bytes: %w", toBytes, ErrInvalidArgument)
	}
	if lru := recencyOf(t); lru != nil {
		return e.reclaimTier(t, toBytes, lru)
	}
	// An unlimited last tier keeps no recency; evict by write order, oldest first. The list
	// is built under the reclamation lock: blocks that a reclamation of the tier above was
	// demoting into t meanwhile are in it, so Evict(t, 0) leaves t empty.
	e.reclaimMu.Lock()
	defer e.reclaimMu.Unlock()
	lru, err := e.writeOrder(t)
	if err != nil {
		return ReclaimReport{}, err
	}
	return e.reclaimTierLocked(t, toBytes, lru)
}

// recency is what eviction needs of a tier's LRU.
type recency interface {
	Victims(bytes int64) []BlockID
	Remove(id BlockID)
}

// recencyOf returns t's LRU, or nil (an interface holding no pointer) when it keeps none.
func recencyOf(t tiers.Disk) recency {
	if t.LRU() == nil {
		return nil
	}
	return t.LRU()
}

// writeOrder builds a recency list of t's blocks in write order, for tiers that keep none.
func (e *Engine) writeOrder(t tiers.Disk) (recency, error) {
	lru := tiers.NewLRU()
	err := e.fillWriteOrder(func(loc index.Location) *tiers.LRU {
		if e.tierOf(loc.Segment) == t {
			return lru
		}
		return nil
	})
	return lru, err
}

// Compact retires every empty sealed segment and compacts every sealed segment whose live
// ratio is at most liveRatio (0 < liveRatio < 1), in every disk tier, whatever the watermarks:
// what `ucm-tool compact` runs. progress, if not nil, is called after each segment.
func (e *Engine) Compact(liveRatio float64, progress func(ReclaimReport)) (ReclaimReport, error) {
	if !e.enter() {
		return ReclaimReport{}, ErrClosed
	}
	defer e.tasks.Done()
	if liveRatio <= 0 || liveRatio >= 1 {
		return ReclaimReport{}, fmt.Errorf("compact: live ratio %v out of (0, 1): %w", liveRatio, ErrInvalidArgument)
	}
	e.reclaimMu.Lock()
	defer e.reclaimMu.Unlock()
	var total ReclaimReport
	// The bytes are counted segment by segment, not as the fall of the tier's account: that
	// holds the segment the moved records went to at its whole reservation while it is active.
	for _, t := range e.tiers {
		var rep ReclaimReport
		err := e.reclaimSegments(t, liveRatio, &rep, nil, func() {
			if progress != nil {
				p := total
				rep.BytesReclaimed = rep.compactedBytes
				p.add(rep)
				progress(p)
			}
		})
		rep.BytesReclaimed = rep.compactedBytes
		total.add(rep)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (r *ReclaimReport) add(o ReclaimReport) {
	r.SegmentsRetired += o.SegmentsRetired
	r.SegmentsCompacted += o.SegmentsCompacted
	r.BytesReclaimed += o.BytesReclaimed
	r.RecordsMoved += o.RecordsMoved
	r.BlocksEvicted += o.BlocksEvicted
	r.BlocksDemoted += o.BlocksDemoted
}

// diskTierNamed returns the disk tier called name ("" = the first).
func (e *Engine) diskTierNamed(name string) (tiers.Disk, error) {
	if name == "" {
		return e.tiers[0], nil
	}
	for _, t := range e.tiers {
		if t.Name() == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("no disk tier named %q: %w", name, ErrInvalidArgument)
}
