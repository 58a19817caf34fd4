package engine

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine/internal/lifecycle"
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
//  3. evicting the least recently used segments of the tier (evictSegment: never one a load
//     is reading): their live blocks demoted to the next disk tier when there is one, else
//     dropped from the index, except those loaded since the segment was last chosen, which
//     are rewritten forward within the tier (a second chance), then the segment retired. A
//     segment's recency is the last write or load of any of its records (tiers.Recency):
//     eviction keeps no per-block state but a bit per record slot of a segment loaded from. A
//     shared next tier without room yet (its share is granted by the lease holder, an
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

// reclaimer is the space reclamation of the disk tiers: the background pass (run), eviction,
// compaction, retirement of segments and the relocation of records they share with promotion
// and the sharing code. It holds the index and the tiers (values below the engine) and reaches
// the rest of the engine only through env.
//
// Lock order: mu → the provider's lock (segments.mu) → sharing's mu. mu is held for a whole
// reclamation (one at a time: a tier's pass, Evict, Compact, the sharing code's evictSegment);
// env's methods are called with mu held or not, and none of them takes mu.
type reclaimer struct {
	mu sync.Mutex // one reclamation at a time; taken before segments.mu
	// kick asks run for a pass now (a writer waits for room; kick).
	kick lifecycle.Kick
	// deferrals is, per disk tier (by position), how long background eviction from it has
	// waited for a shared next tier's share while writers wait there (evict). Guarded by mu.
	deferrals []deferral
	ix        *index.Index
	tiers     []tiers.Disk // disk tiers, fastest first
	pool      *devio.BufferPool
	stats     *counters
	cfg       reclaimConfig
	env       reclaimEnv
}

// reclaimConfig is what the reclaimer reads of the engine's options (final once the schema is
// known: see newReclaimer).
type reclaimConfig struct {
	Layout                Layout
	StageLayerWise        bool
	CompactInterval       time.Duration
	CompactLiveRatio      float64
	SharedRefreshInterval time.Duration
	TaskTimeout           time.Duration
	Logger                *slog.Logger
}

// reclaimEnv is what the reclaimer needs from the rest of the engine. None of its methods
// takes the reclaimer's mu; those that lock the provider (segments.mu) or sharing's mu do so
// after it, in the order the reclaimer documents.
type reclaimEnv interface {
	// The provider (segments.go): where segments live and their open files.
	tierOf(n uint64) tiers.Disk
	home(n uint64) (segHome, bool)
	acquireSegment(n uint64) (*wal.Segment, error)
	acquireInTier(n uint64) (*wal.Segment, tiers.Disk, error)
	acquireFollowing(id BlockID, kind format.SidecarKind, loc index.Location) (*wal.Segment, index.Location, tiers.Disk, error)
	// forgetSegment drops segment n's open handle (nil if none) and returns it with n's home.
	forgetSegment(n uint64) (*wal.Segment, segHome)
	// forgetHome forgets where segment n lives (its file is gone).
	forgetHome(n uint64)
	// entryLike reads again the entry loc was read from: this instance's index or, for a
	// foreign segment, the foreign index.
	entryLike(id BlockID, kind format.SidecarKind, loc index.Location) (index.Location, bool, error)
	// Records and I/O.
	submit(ops []devio.Op, tierOf func(i int) tiers.Disk) error
	putRecord(rec *wal.Record)
	compressRecord(rec *wal.Record, code format.Compression)
	chunkBlocks(t tiers.Disk, n int) int
	// Effects on the other parts: the cache tiers, broken entries, the shared tiers.
	uncache(id BlockID)
	dropBroken(id BlockID, loc index.Location, cause error) error
	dropBrokenSidecar(id BlockID, kind SidecarKind, loc index.Location, cause error) error
	// retireShared defers finish (the unlink) of shared segment n for its grace; takes
	// sharing's mu.
	retireShared(n uint64, finish func())
	// sharingPasses counts the sharing passes started so far (0 without shared tiers).
	sharingPasses() int64
	// evictSidecars evicts the sidecars live in sealed segment n of t whose blocks are not
	// (demoted with them, else dropped).
	evictSidecars(t tiers.Disk, n uint64) error
	// Lifecycle.
	stopped() <-chan struct{}
}

// newReclaimer returns the reclaimer of e's disk tiers. It is made once the index, the tiers
// and the schema (the layout) are final.
func newReclaimer(e *Engine) *reclaimer {
	o := e.opts
	return &reclaimer{kick: lifecycle.NewKick(), deferrals: make([]deferral, len(e.tiers)),
		ix: e.ix, tiers: e.tiers, pool: e.pool, stats: &e.stats, env: e,
		cfg: reclaimConfig{Layout: o.Layout, StageLayerWise: o.StageLayerWise, CompactInterval: o.CompactInterval,
			CompactLiveRatio: o.CompactLiveRatio, SharedRefreshInterval: o.SharedRefreshInterval,
			TaskTimeout: o.TaskTimeout, Logger: o.Logger}}
}

// run reclaims space for tiers above their high watermark, when kicked by a writer waiting for
// space and once a second, until the engine stops. Below the watermarks, unless
// Options.CompactInterval is negative, it also reclaims dead space (failed, abandoned,
// relocated, evicted or dropped records): every second it retires the sealed segments no entry
// points into, and on its first second after Open and then every CompactInterval it compacts
// those at or below CompactLiveRatio (online compaction; docs/tiers.md, "When dead space comes
// back").
func (rc *reclaimer) run() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	online := rc.cfg.CompactInterval > 0
	var lastCompact time.Time // zero: the first pass after Open compacts, whatever the interval
	for {
		select {
		case <-rc.env.stopped():
			return
		case <-tick.C:
		case <-rc.kick:
		}
		compact := online && time.Since(lastCompact) >= rc.cfg.CompactInterval
		if compact {
			lastCompact = time.Now()
		}
		for _, t := range rc.tiers {
			var err error
			switch {
			case t.Space().OverHigh():
				_, err = rc.reclaimTier(t, -1)
			case compact:
				// Online compaction: dead space is reclaimed in every tier, also below the
				// watermarks and in unlimited tiers.
				err = rc.compactTier(t, rc.cfg.CompactLiveRatio)
			case online:
				// A segment with nothing live costs no copy to reclaim: retired at once, not
				// after a compaction interval that a short-lived process never reaches.
				err = rc.compactTier(t, 0)
			}
			if err != nil && !errors.Is(err, ErrClosed) {
				rc.cfg.Logger.Warn("ucm: reclamation failed", "tier", t.Name(), "err", err)
			}
		}
	}
}

// tierFileBytes is the bytes of t's segment files as the segment table records them (an active
// segment's size is its durable end).
func (rc *reclaimer) tierFileBytes(t tiers.Disk) int64 {
	var n int64
	for _, row := range rc.ix.Segments() {
		if rc.env.tierOf(row.Number) == t {
			n += row.Size
		}
	}
	return n
}

// compactTier retires t's empty sealed segments and compacts those at or below liveRatio (0:
// only retires the empty ones, copying nothing).
func (rc *reclaimer) compactTier(t tiers.Disk, liveRatio float64) error {
	select {
	case <-rc.env.stopped():
		return ErrClosed
	default:
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var rep ReclaimReport
	return rc.reclaimSegments(t, liveRatio, &rep, nil, nil)
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
	RecordsMoved   int // live records copied forward: by compaction, and blocks eviction kept (evictSegment)
	BlocksEvicted  int // blocks dropped from the tier (demoted or deleted)
	BlocksDemoted  int // of which moved to the next tier
}

// reclaimTier brings t down to target accounted bytes (-1: its low watermark). It returns what
// it did; it stops early, without error, when nothing more can be evicted (everything left is
// pinned or the tier is empty).
func (rc *reclaimer) reclaimTier(t tiers.Disk, target int64) (rep ReclaimReport, err error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	before := t.Space().Segments()
	defer func() { rep.BytesReclaimed = before - t.Space().Segments() }()
	excess := func() int64 {
		if target < 0 {
			return t.Space().Excess()
		}
		// An explicit target is about the files: active segments count what they hold, not
		// their reservation (which a target below one segment could never get under).
		return rc.tierFileBytes(t) - target
	}
	// Emptying the tier moves every evictable block out of it (demoted or deleted): compacting
	// before evicting would copy records forward only to move or delete them next, and leave
	// the segment they were copied into behind. Only segments already empty are retired
	// first; what eviction cannot take (pinned blocks) is compacted after it.
	compactRatio := rc.cfg.CompactLiveRatio
	if target == 0 {
		compactRatio = 0
	}
	for round := 0; round < reclaimRounds && excess() > 0; round++ {
		select {
		case <-rc.env.stopped():
			return rep, ErrClosed
		default:
		}
		if err := rc.reclaimSegments(t, compactRatio, &rep, excess, nil); err != nil {
			return rep, err
		}
		need := excess()
		if need <= 0 {
			break
		}
		victims := rc.victimSegments(t, need, target >= 0)
		if len(victims) == 0 {
			break
		}
		for _, n := range victims {
			// Emptying the tier keeps nothing in it; otherwise what was loaded gets its chance.
			if err := rc.evictSegment(t, n, target < 0, target != 0, &rep); err != nil {
				if errors.Is(err, errEvictionDeferred) {
					return rep, nil // the next tier's share is on its way; it kicks the reclaimer
				}
				return rep, err
			}
		}
		// What a victim kept (a block that moved in meanwhile, a record that could not be
		// moved) leaves it sparse: before evicting more, rewrite the remainder of the sparsest
		// segments forward: compaction costs I/O, eviction costs a recomputation.
		if err := rc.reclaimSegments(t, pressureLiveRatio, &rep, excess, nil); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// victimSegments returns the segments of t to evict to free need bytes (all of them if they
// hold fewer), least recently used first (t.Recency().Order; by number, which is write order,
// for a tier that keeps no recency), never one pinned by a load. Only sealed segments, unless
// unsealed: an explicit eviction (Evict) takes an unsealed one too (the active one, one whose
// seal is under way) in its place in the order: its blocks leave the index, found by a scan of
// it (it has no footer yet), and its file stays until it is sealed and found empty
// (reclaimSegments). A background pass leaves them: it would scan the index for each, and it
// takes them once they are sealed.
//
// Prefix chains: a child block is useless without its parent (a lookup of a prefix stops at
// the first missing block), so a parent should not go before its children. Segment order
// gives that in the common case without tracking chains: a connector loads a prompt's hit
// prefix whole, and a load stamps its blocks so that every parent is at least as recent as
// its children (tiers.NextStamps), so after any load of a chain its root's segment is at
// least as recent as its leaves' and goes last. Otherwise, between a child's write and the
// next load of its chain (children are written after their parents, so their segments are
// newer), a parent's segment can go first: the children left behind are harmless (lookups
// stop before them, loads of them still verify), are never touched by a load of their chain
// again, and age out with their segments.
func (rc *reclaimer) victimSegments(t tiers.Disk, need int64, unsealed bool) []uint64 {
	var segs []uint64
	size := map[uint64]int64{}
	for _, row := range rc.ix.Segments() {
		if row.LiveRecords == 0 || row.State == index.SegmentDeleting || rc.env.tierOf(row.Number) != t ||
			row.State != index.SegmentSealed && !unsealed {
			continue
		}
		size[row.Number] = row.Size
		segs = append(segs, row.Number)
	}
	var out []uint64
	var freed int64
	for _, n := range t.Recency().Order(segs) {
		if freed >= need {
			break
		}
		out = append(out, n)
		freed += size[n]
	}
	return out
}

// evictSegment empties segment n of tier t and retires it if it is sealed and nothing is left
// in it. The blocks loaded since eviction last chose it (a second chance: tiers.Recency's
// loaded slots) are rewritten forward within t, into a segment made the newest, where t has
// room, with keepLoaded; the others are evicted (demoted to the next tier when there is one,
// else dropped: evict, with their sidecars), then the sidecars left in it. mayDefer is
// evict's. The rewrite
// keeps a hot block from going with the cold blocks it was written beside, and lets those go
// although it was loaded; a block kept must be loaded again to be kept again, so every pass
// frees what was not used since the last one.
func (rc *reclaimer) evictSegment(t tiers.Disk, n uint64, mayDefer, keepLoaded bool, rep *ReclaimReport) error {
	refs, err := rc.liveRecords(n)
	if err != nil {
		return err
	}
	loaded := t.Recency().TakeLoaded(n)
	if !keepLoaded {
		loaded = nil
	}
	var ids []BlockID
	var hot []recordRef
	for _, r := range refs {
		switch {
		case r.kind != 0:
		case loaded.Has(recordSlot(r.loc, rc.cfg.Layout)):
			hot = append(hot, r)
		default:
			ids = append(ids, r.id)
		}
	}
	if len(hot) > 0 {
		moved, _, _, err := rc.relocate(append(hot, rc.sidecarsOf(hot, t)...), t)
		rep.RecordsMoved += moved
		if err != nil && !errors.Is(err, ErrNoSpace) {
			return err
		}
		// Where they went is the newest segment; those that could not move are evicted.
		for _, r := range hot {
			loc, ok, err := rc.ix.Get(r.id)
			switch {
			case err != nil:
				return err
			case ok && loc.Segment == n:
				ids = append(ids, r.id)
			case ok && rc.env.tierOf(loc.Segment) == t:
				t.Recency().Written(loc.Segment)
			}
		}
	}
	if err := rc.evict(t, ids, mayDefer, rep); err != nil {
		return err
	}
	row, ok := rc.ix.Segment(n)
	if !ok || row.State != index.SegmentSealed {
		return nil
	}
	if row.LiveRecords > 0 {
		if err := rc.env.evictSidecars(t, n); err != nil {
			return err
		}
		if row, ok = rc.ix.Segment(n); !ok || row.LiveRecords > 0 {
			return nil
		}
	}
	if err := rc.retire(n); err != nil {
		return err
	}
	rep.SegmentsRetired++
	return nil
}

// pressureLiveRatio is the live ratio up to which a segment is compacted, after an eviction
// round, when the tier is still above its target: bounds the bytes rewritten per byte freed
// (at most 9 for 1).
const pressureLiveRatio = 0.9

// reclaimSegments retires t's empty sealed segments and compacts those at or below
// liveRatio, emptiest first, while excess() > 0 (or all of them when excess is nil), calling
// progress (if not nil) after each segment.
func (rc *reclaimer) reclaimSegments(t tiers.Disk, liveRatio float64, rep *ReclaimReport, excess func() int64, progress func()) error {
	type cand struct {
		row   index.SegmentMeta
		ratio float64
	}
	var cands []cand
	for _, row := range rc.ix.Segments() {
		if row.State != index.SegmentSealed || rc.env.tierOf(row.Number) != t || row.Size <= 0 {
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
			moved, w, err := rc.compactSegment(t, c.row.Number)
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
		if err := rc.retire(c.row.Number); err != nil {
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
func (rc *reclaimer) compactSegment(t tiers.Disk, n uint64) (int, int64, error) {
	refs, err := rc.liveRecords(n)
	if err != nil {
		return 0, 0, err
	}
	moved, _, written, err := rc.relocate(refs, t)
	return moved, written, err
}

// recordRef is one live record: a block (kind 0) or a block's sidecar, and where it is.
type recordRef struct {
	id   BlockID
	kind format.SidecarKind
	loc  index.Location
}

// liveRecords returns the records (blocks, then sidecars, in footer order) whose index entry
// points into segment n: those its footer lists when it is sealed, else (an unsealed segment,
// an unreadable footer) those a scan of the index finds.
func (rc *reclaimer) liveRecords(n uint64) ([]recordRef, error) {
	var refs []recordRef
	// An unsealed segment has no footer yet: its records are found in the index.
	if row, ok := rc.ix.Segment(n); ok && row.State == index.SegmentSealed {
		if seg, t, err := rc.env.acquireInTier(n); err == nil {
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
						loc, ok, err := rc.entry(id, fe.Kind)
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
			rc.cfg.Logger.Warn("ucm: segment footer unreadable; finding its records in the index", "segment", n, "err", ferr)
		}
	}
	err := rc.ix.Iterate(func(id BlockID, loc index.Location) bool {
		if loc.Segment == n {
			refs = append(refs, recordRef{id, 0, loc})
		}
		return true
	})
	if err == nil {
		err = rc.ix.IterateSidecars(func(id BlockID, kind format.SidecarKind, loc index.Location) bool {
			if loc.Segment == n {
				refs = append(refs, recordRef{id, kind, loc})
			}
			return true
		})
	}
	return refs, err
}

// entry reads an index entry: block id's (kind 0) or its sidecar of kind.
func (rc *reclaimer) entry(id BlockID, kind format.SidecarKind) (index.Location, bool, error) {
	if kind == 0 {
		return rc.ix.Get(id)
	}
	return rc.ix.GetSidecar(id, kind)
}

// sidecarsOf returns the sidecars of the blocks in refs that are stored in tier t (all tiers
// when t is nil) and not in refs already: what must move with the blocks so that a tier is
// not left holding representations of blocks it no longer has.
func (rc *reclaimer) sidecarsOf(refs []recordRef, t tiers.Disk) []recordRef {
	var out []recordRef
	for _, r := range refs {
		if r.kind != 0 {
			continue
		}
		for _, kind := range rc.ix.SidecarKinds(r.id) {
			if slices.ContainsFunc(refs, func(o recordRef) bool { return o.id == r.id && o.kind == kind }) {
				continue
			}
			loc, ok, err := rc.ix.GetSidecar(r.id, kind)
			if err != nil || !ok || (t != nil && rc.env.tierOf(loc.Segment) != t) {
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
func (rc *reclaimer) relocate(refs []recordRef, dst tiers.Disk) (moved, blocks int, written int64, err error) {
	groups, refs := rc.batchGroups(refs, dst)
	for _, g := range groups {
		n, w, err := rc.relocateBatch(g, dst)
		moved, blocks, written = moved+n, blocks+n, written+w
		if err != nil {
			return moved, blocks, written, err
		}
	}
	for lo := 0; lo < len(refs); lo += relocateBatch {
		hi := min(len(refs), lo+relocateBatch)
		recs, err := rc.readRecords(refs[lo:hi])
		if err != nil {
			return moved, blocks, written, err
		}
		if len(recs) == 0 {
			continue
		}
		for _, r := range recs {
			if r.Kind == 0 {
				rc.env.compressRecord(r, dst.Codec())
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
			rc.env.putRecord(r)
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
func (rc *reclaimer) readRecords(refs []recordRef) ([]*wal.Record, error) {
	l := rc.cfg.Layout
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
			seg, ref.loc, tier, err = rc.env.acquireFollowing(ref.id, ref.kind, ref.loc)
		} else {
			seg, tier, err = rc.env.acquireInTier(ref.loc.Segment)
		}
		loc := ref.loc
		if err != nil {
			var ce *wal.CorruptionError
			switch {
			case errors.Is(err, wal.ErrSegmentGone) && rc.movedAway(ref):
				// Moved or dropped by a relocation that ran since the ref was read (a
				// promotion beside a compaction), and its segment retired: not broken, and
				// nothing to copy from here.
				continue
			case errors.Is(err, wal.ErrSegmentGone) || errors.As(err, &ce):
				_ = rc.dropBrokenRef(ref, err)
				continue
			}
			for _, r := range reads {
				r.seg.Release()
				rc.env.putRecord(r.rec)
			}
			return nil, wrapIO(err)
		}
		rec := &wal.Record{ID: ref.id, Kind: ref.kind, Layout: loc.Layout, ShardCRCs: loc.ShardCRCs,
			Buf: rc.pool.Get(format.RecordHeaderSize), Payload: rc.pool.Get(int(loc.PayloadBytes())),
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
		_ = rc.env.submit(ops, func(i int) tiers.Disk { return owner[i] })
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
			err = rc.checkRecord(r.ref.id, r.ref.loc, header, r.rec.Payload)
			if err != nil {
				_ = rc.dropBrokenRef(r.ref, err)
			}
		case shortRead(err) && cutShort(r.seg, r.ref.loc):
			_ = rc.dropBrokenRef(r.ref, truncatedRecord(r.ref.loc, err))
		default:
			rc.stats.readErrors.Add(1)
		}
		r.seg.Release()
		if err != nil || (r.ref.kind == 0 && r.ref.loc.Layout != l) {
			rc.env.putRecord(r.rec)
			continue
		}
		out = append(out, r.rec)
	}
	return out, nil
}

// movedAway reports whether r's entry no longer points where r says (moved or gone).
func (rc *reclaimer) movedAway(r recordRef) bool {
	cur, ok, err := rc.env.entryLike(r.id, r.kind, r.loc)
	return err == nil && (!ok || cur.Segment != r.loc.Segment || cur.Offset != r.loc.Offset)
}

// dropBrokenRef is dropBroken for a block or a sidecar.
func (rc *reclaimer) dropBrokenRef(r recordRef, cause error) error {
	if r.kind == 0 {
		return rc.env.dropBroken(r.id, r.loc, cause)
	}
	return rc.env.dropBrokenSidecar(r.id, r.kind, r.loc, cause)
}

// checkRecord verifies a whole record, read into header and payload, against its index entry.
// A block of a batch record has no header of its own (header nil): its shards are checked
// against the index's checksums.
func (rc *reclaimer) checkRecord(id BlockID, loc index.Location, header, payload []byte) error {
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
func (rc *reclaimer) evict(t tiers.Disk, victims []BlockID, mayDefer bool, rep *ReclaimReport) error {
	var refs []recordRef
	for _, id := range victims {
		loc, ok, err := rc.ix.Get(id)
		if err != nil {
			return err
		}
		if !ok || rc.env.tierOf(loc.Segment) != t {
			continue // already gone from this tier
		}
		refs = append(refs, recordRef{id: id, loc: loc})
	}
	if len(refs) == 0 {
		return nil
	}
	if t.Pos()+1 < len(rc.tiers) {
		next := rc.tiers[t.Pos()+1]
		// The blocks' sidecars in this tier go down with them.
		_, moved, _, err := rc.relocate(append(refs, rc.sidecarsOf(refs, t)...), next)
		if moved > 0 || !errors.Is(err, ErrNoSpace) {
			rc.deferrals[t.Pos()].reset() // room came (or the blocks went elsewhere): a new wait starts afresh
		}
		if err == nil {
			rep.BlocksDemoted += moved
			rep.BlocksEvicted += len(refs)
			rc.stats.evictedBlocks.Add(int64(len(refs)))
			return nil
		}
		if !errors.Is(err, ErrNoSpace) {
			return err
		}
		if mayDefer && accountOf(next) != nil {
			if t.Space().Demand() == 0 && t.Space().Used() <= t.Config().Capacity {
				return errEvictionDeferred // costs nothing: no writer waits for this room
			}
			if !rc.deferrals[t.Pos()].over(rc.env.sharingPasses(), evictionDeferral, rc.cfg.SharedRefreshInterval, rc.cfg.TaskTimeout/4) {
				return errEvictionDeferred
			}
		}
		rc.kick.Kick()
		rc.cfg.Logger.Warn("ucm: next tier full; evicted blocks dropped instead of demoted", "tier", t.Name(), "next", next.Name(), "err", err)
		// Some may have moved before the refusal; drop only those still here.
	}
	b := rc.ix.NewBatch()
	results := make([]*bool, len(refs))
	for k, r := range refs {
		results[k] = b.DeleteIf(r.id, r.loc) // with its sidecars
	}
	if err := rc.ix.Apply(b, false); err != nil {
		return err
	}
	for k, r := range refs {
		if *results[k] {
			rep.BlocksEvicted++
			rc.stats.evictedBlocks.Add(1)
			rc.env.uncache(r.id)
		}
	}
	return nil
}

// retire deletes segment n: marked deleting in the index (durably), then unlinked once its last
// reader releases it, then its row removed and its bytes released from its tier's account.
func (rc *reclaimer) retire(n uint64) error {
	row, ok := rc.ix.Segment(n)
	if !ok {
		return nil
	}
	if row.LiveRecords != 0 {
		return fmt.Errorf("retire segment %d: %d live records: %w", n, row.LiveRecords, ErrCorrupt)
	}
	wasSealed := row.State == index.SegmentSealed
	row.State = index.SegmentDeleting
	b := rc.ix.NewBatch()
	b.SetSegment(row)
	if err := rc.ix.Apply(b, true); err != nil {
		return fmt.Errorf("retire segment %d: %w", n, err)
	}
	s, h := rc.env.forgetSegment(n)
	if h.tier != nil {
		h.tier.Recency().Forget(n) // never a victim again; touches and pins of it are ignored
	}
	shared := h.tier != nil && h.tier.Shared()
	// A shared tier's files are read by other instances: never overwritten in place, and a
	// published one stays a grace period after it leaves the manifest.
	recyclable := s != nil && s.Recyclable() && !shared
	remove := func() { rc.finishRetire(n, row.Size, recyclable) }
	if shared && wasSealed {
		finish := remove
		remove = func() { rc.env.retireShared(n, finish) }
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
func (rc *reclaimer) finishRetire(n uint64, size int64, recyclable bool) {
	h, ok := rc.env.home(n)
	if !ok {
		return
	}
	kept, err := h.tier.Unlink(n, h.dir, size, recyclable)
	if err != nil {
		rc.cfg.Logger.Error("ucm: could not delete retired segment; the next Open will", "segment", n, "err", err)
		return
	}
	b := rc.ix.NewBatch()
	b.DeleteSegment(n)
	if err := rc.ix.Apply(b, false); err != nil {
		rc.cfg.Logger.Error("ucm: could not remove retired segment's row; the next Open will", "segment", n, "err", err)
	}
	rc.env.forgetHome(n)
	h.tier.Released(h.dir, n, size, kept)
	rc.stats.segmentsRetired.Add(1)
}

// Evict frees space in the disk tier named tier (the first disk tier when empty) until its
// segment files hold at most toBytes, by the same policy as automatic reclamation. It returns what it did;
// fewer bytes are freed when the remaining blocks are pinned or the store is empty. Only sealed
// segments are retired: the active segment, and one whose background seal has not finished,
// keep their files (their evicted blocks are gone from the index) until a later reclamation
// finds them sealed and empty. Sync first waits for the seals under way.
func (e *Engine) Evict(tier string, toBytes int64) (ReclaimReport, error) {
	if !e.life.Enter() {
		return ReclaimReport{}, ErrClosed
	}
	defer e.life.Done()
	t, err := e.diskTierNamed(tier)
	if err != nil {
		return ReclaimReport{}, err
	}
	if toBytes < 0 {
		return ReclaimReport{}, fmt.Errorf("evict to %d bytes: %w", toBytes, ErrInvalidArgument)
	}
	return e.rc.evictTo(t, toBytes)
}

// evictTo is Evict of tier t down to toBytes (at least 0). A tier that keeps no recency
// evicts in write order (segment numbers), oldest first. The segments are listed under the
// reclamation lock: those a reclamation of the tier above was demoting into t meanwhile are
// among them, so Evict(t, 0) leaves t empty.
func (rc *reclaimer) evictTo(t tiers.Disk, toBytes int64) (ReclaimReport, error) {
	return rc.reclaimTier(t, toBytes)
}

// Compact retires every empty sealed segment and compacts every sealed segment whose live
// ratio is at most liveRatio (0 < liveRatio < 1), in every disk tier, whatever the watermarks:
// what `ucm-tool compact` runs. progress, if not nil, is called after each segment.
func (e *Engine) Compact(liveRatio float64, progress func(ReclaimReport)) (ReclaimReport, error) {
	if !e.life.Enter() {
		return ReclaimReport{}, ErrClosed
	}
	defer e.life.Done()
	if liveRatio <= 0 || liveRatio >= 1 {
		return ReclaimReport{}, fmt.Errorf("compact: live ratio %v out of (0, 1): %w", liveRatio, ErrInvalidArgument)
	}
	return e.rc.compactAll(liveRatio, progress)
}

// compactAll is Compact of every tier.
func (rc *reclaimer) compactAll(liveRatio float64, progress func(ReclaimReport)) (ReclaimReport, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var total ReclaimReport
	// The bytes are counted segment by segment, not as the fall of the tier's account: that
	// holds the segment the moved records went to at its whole reservation while it is active.
	for _, t := range rc.tiers {
		var rep ReclaimReport
		err := rc.reclaimSegments(t, liveRatio, &rep, nil, func() {
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

// The reclaimer's relocation and retirement, as the rest of the engine (promotion, sidecars,
// the walHooks, the sharing code) calls them.

// relocate copies records into dst (reclaimer.relocate).
func (e *Engine) relocate(refs []recordRef, dst tiers.Disk) (moved, blocks int, written int64, err error) {
	return e.rc.relocate(refs, dst)
}

// sidecarsOf returns the sidecars that move with the blocks of refs (reclaimer.sidecarsOf).
func (e *Engine) sidecarsOf(refs []recordRef, t tiers.Disk) []recordRef {
	return e.rc.sidecarsOf(refs, t)
}

// liveRecords returns the records live in sealed segment n (reclaimer.liveRecords).
func (e *Engine) liveRecords(n uint64) ([]recordRef, error) { return e.rc.liveRecords(n) }

// retire deletes segment n (reclaimer.retire).
func (e *Engine) retire(n uint64) error { return e.rc.retire(n) }

// The engine as the reclaimer's environment (reclaimEnv); the other methods it needs are the
// engine's own.

// sharingPasses counts the sharing passes started so far (0 without shared tiers).
func (e *Engine) sharingPasses() int64 {
	if e.share == nil {
		return 0
	}
	return e.share.Refreshes()
}

// retireShared defers finish (the unlink) of shared segment n for its grace (share.Sharing).
func (e *Engine) retireShared(n uint64, finish func()) { e.share.RetireShared(n, finish) }

// stopped is closed when the engine stops its background work.
func (e *Engine) stopped() <-chan struct{} { return e.stop }
