package index

import (
	"fmt"
	"math/bits"
	"strconv"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ucm-go/ucm/format"
)

type opKind uint8

const (
	opPut opKind = iota + 1
	opDelete
	opPutIf
	opSetSegment
	opDeleteSegment
	opDeleteIf
	opSetMeta
	opDeleteMeta
	opPutSidecar
	opPutSidecarIf
	opDeleteSidecarIf
)

// op is one recorded mutation. For puts, loc carries no ShardCRCs (enc holds the encoded value,
// taken at the call so the caller may reuse its slices).
type op struct {
	kind   opKind
	id     format.BlockID
	side   format.SidecarKind // sidecar ops
	loc    Location
	enc    []byte
	oldSeg uint64
	oldOff int64
	result *bool
	seg    SegmentMeta
	number uint64
	key    string // meta ops
	val    []byte
}

// Batch groups mutations that Apply commits atomically, in the order they were added. It is
// not safe for concurrent use and is consumed by Apply (applied once, whatever the outcome).
type Batch struct {
	ix      *Index
	ops     []op
	err     error // first invalid argument; Apply returns it and commits nothing
	applied bool
}

// NewBatch returns an empty batch for ix.
func (ix *Index) NewBatch() *Batch { return &Batch{ix: ix} }

// Len returns the number of mutations recorded in b.
func (b *Batch) Len() int { return len(b.ops) }

func (b *Batch) setErr(err error) {
	if b.err == nil {
		b.err = err
	}
}

// SetMeta records that the meta name key (non-empty; "index." names are reserved) is set to
// val in the same atomic commit as the batch's other mutations. val is copied.
func (b *Batch) SetMeta(key string, val []byte) {
	if key == "" {
		b.setErr(fmt.Errorf("%w: index: empty meta name", format.ErrInvalid))
		return
	}
	b.ops = append(b.ops, op{kind: opSetMeta, key: key, val: append([]byte{}, val...)})
}

// DeleteMeta records that the meta name key is removed (absent is fine).
func (b *Batch) DeleteMeta(key string) {
	b.ops = append(b.ops, op{kind: opDeleteMeta, key: key})
}

// Put records that id's entry becomes loc (insert or overwrite). At Apply, loc's RecordBytes is
// added to loc.Segment's live counters and the previous location's (if any) subtracted from its
// segment's. An invalid loc (segment 0, negative offset, invalid layout, len(ShardCRCs) !=
// Layout.Shards) makes Apply fail with an error wrapping format.ErrInvalid. loc is copied.
func (b *Batch) Put(id format.BlockID, loc Location) {
	if err := loc.validate(); err != nil {
		b.setErr(fmt.Errorf("index: put %s: %w", id, err))
		return
	}
	enc := EncodeLocation(nil, loc)
	loc.ShardCRCs = nil
	b.ops = append(b.ops, op{kind: opPut, id: id, loc: loc, enc: enc})
}

// Delete records that id's entry is removed, with its sidecar entries; at Apply it is a no-op
// if id has no entry at that point of the batch, else the entries' bytes leave their segments'
// live counters.
func (b *Batch) Delete(id format.BlockID) {
	b.ops = append(b.ops, op{kind: opDelete, id: id})
}

// PutIf records a compare-and-set: at its point in the batch, id moves to loc only if its entry
// exists and points at exactly (old.Segment, old.Offset); otherwise it does nothing. The
// returned *bool is set by Apply: true if the move happened and the batch committed, false
// otherwise (including when Apply fails). loc is validated and copied as by Put.
func (b *Batch) PutIf(id format.BlockID, old Location, loc Location) *bool {
	res := new(bool)
	if err := loc.validate(); err != nil {
		b.setErr(fmt.Errorf("index: put-if %s: %w", id, err))
		return res
	}
	enc := EncodeLocation(nil, loc)
	loc.ShardCRCs = nil
	b.ops = append(b.ops, op{kind: opPutIf, id: id, loc: loc, enc: enc, oldSeg: old.Segment, oldOff: old.Offset, result: res})
	return res
}

// DeleteIf records a conditional delete: at its point in the batch, id's entry (with its
// sidecar entries) is removed only if it exists and points at exactly (old.Segment, old.Offset) — eviction uses it so that a block
// moved or re-dumped meanwhile is left alone. The returned *bool is set by Apply as for PutIf.
func (b *Batch) DeleteIf(id format.BlockID, old Location) *bool {
	res := new(bool)
	b.ops = append(b.ops, op{kind: opDeleteIf, id: id, oldSeg: old.Segment, oldOff: old.Offset, result: res})
	return res
}

// SetSegment records that segment m.Number's row is inserted or replaced. Apply takes Number,
// Generation, State and Size from m and ignores m.LiveBytes and m.LiveRecords: a row's live
// counters are always derived from block entries, as
//
//	live(after Apply) = live of the row before Apply (0 if there was none)
//	                    + net effect of every Put/Delete/PutIf of the batch on that segment,
//
// wherever in the batch SetSegment appears. Number 0, an unknown state or a negative Size make
// Apply fail with an error wrapping format.ErrInvalid.
func (b *Batch) SetSegment(m SegmentMeta) {
	if err := m.validate(); err != nil {
		b.setErr(fmt.Errorf("index: set segment: %w", err))
		return
	}
	m.LiveBytes, m.LiveRecords, m.LiveSidecars = 0, 0, 0
	b.ops = append(b.ops, op{kind: opSetSegment, seg: m})
}

// DeleteSegment records that segment number's row is removed (a no-op if there is none). The
// check is made at the end of the batch: if entries still point into the segment then (counting
// the batch's own moves and deletes), Apply fails and commits nothing. A later SetSegment of the
// same number in the batch re-creates the row.
func (b *Batch) DeleteSegment(number uint64) {
	b.ops = append(b.ops, op{kind: opDeleteSegment, number: number})
}

// entryKey names one entry: a block (side 0) or one of its sidecars.
type entryKey struct {
	id   format.BlockID
	side format.SidecarKind
}

// blockState is the in-batch view of one block or sidecar entry.
type blockState struct {
	present bool
	was     bool // present in the committed state, before the batch (the membership's update)
	side    bool // a sidecar entry
	seg     uint64
	off     int64
	bytes   int64
	enc     []byte
	dirty   bool
}

type liveDelta struct{ bytes, records, sidecars int64 }

// segState is the in-batch view of one segment row.
type segState struct {
	exists bool
	meta   SegmentMeta
}

// Apply commits b atomically and updates the in-memory segment table; with sync it returns
// once the batch is durable, else the batch is durable after a later Sync or synced Apply (or
// through anyone else's). Either way it is visible at once. Ops are evaluated in order against
// an in-batch view that starts from the committed state; each segment row written carries the
// exact live counters (see SetSegment) in the same Pebble batch as the entries. The evaluation
// and commit are serialized with other Apply and DropSegmentEntries calls, so the previous
// locations it reads cannot change under it; the wait for durability is not: Pebble's WAL is
// ordered, so a synced empty record written after the batch makes it durable, and other
// batches commit meanwhile (a sync waits behind a full device queue, tens of milliseconds
// under load, during which every index update used to wait). On an error before the commit,
// nothing is committed and every PutIf result is false; if only the sync fails, the batch is
// committed and visible but its durability unknown, and the error says so. A stored entry that
// fails to decode fails Apply with an error wrapping format.ErrCorrupt.
func (ix *Index) Apply(b *Batch, sync bool) (err error) {
	if err := ix.checkWritable(); err != nil {
		return err
	}
	defer ix.survive(&err)
	if b.ix != ix {
		return fmt.Errorf("%w: index: batch belongs to another index", format.ErrInvalid)
	}
	if b.applied {
		return fmt.Errorf("%w: index: batch already applied", format.ErrInvalid)
	}
	ix.applyMu.Lock()
	err = func() error {
		defer ix.applyMu.Unlock() // also when Pebble's Fatalf unwinds through the commit
		return ix.applyLocked(b)
	}()
	if err != nil || !sync {
		return err
	}
	return ix.syncWAL()
}

// syncWAL makes every committed batch durable.
func (ix *Index) syncWAL() error {
	if err := ix.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("index: sync: %w", err)
	}
	return nil
}

// applyLocked is Apply with applyMu held, without waiting for durability: the ops are
// evaluated against an in-batch view (applyState), written to one Pebble batch with the
// segment rows they change, committed, and then published to the in-memory membership and
// segment tables.
func (ix *Index) applyLocked(b *Batch) (err error) {
	b.applied = true
	a := newApplyState(ix)
	defer func() { a.report(b, err) }()
	if b.err != nil {
		return b.err
	}
	if len(b.ops) == 0 {
		return nil
	}
	if err := a.evaluate(b.ops); err != nil {
		return err
	}
	pb := ix.db.NewBatch()
	defer func() { _ = pb.Close() }()
	newRows, err := a.writeSegmentRows(pb)
	if err != nil {
		return err
	}
	if err := a.writeEntries(pb, b.ops); err != nil {
		return err
	}
	recordBatch := a.batchPut && ix.version < indexVersionBatch
	if recordBatch {
		if err := pb.Set(metaKey(MetaIndexVersion), []byte(strconv.Itoa(indexVersionBatch)), nil); err != nil {
			return fmt.Errorf("index: apply: %w", err)
		}
	}
	if pb.Empty() {
		return nil
	}
	if err := ix.db.Apply(pb, pebble.NoSync); err != nil {
		return fmt.Errorf("index: apply: %w", err)
	}
	ix.mutations.Add(1) // after the commit: see Mutations
	if recordBatch {
		ix.version = indexVersionBatch
	}
	a.publish(newRows)
	return nil
}

// applyState is the in-batch view one Apply evaluates its ops against: the entries and
// segment rows as the ops so far left them, starting from the committed state, and the live
// counters' changes per segment.
type applyState struct {
	ix         *Index
	blocks     map[entryKey]*blockState
	deltas     map[uint64]*liveDelta
	segs       map[uint64]*segState
	batchKinds map[format.BlockID]uint64 // sidecar kinds put by this batch, per block
	// committed is the committed segment table: only applyMu holders write ix.mu.segments,
	// so it is read here without ix.mu.
	committed map[uint64]SegmentMeta
	batchPut  bool // a block of a batch record is put: the index becomes version 3
	results   []applyResult
	kb        [sidecarKeySize]byte
}

// applyResult is a conditional op's outcome, reported to its caller's *bool once Apply ends.
type applyResult struct {
	p  *bool
	ok bool
}

func newApplyState(ix *Index) *applyState {
	return &applyState{ix: ix, blocks: map[entryKey]*blockState{}, deltas: map[uint64]*liveDelta{},
		segs: map[uint64]*segState{}, batchKinds: map[format.BlockID]uint64{}, committed: ix.mu.segments}
}

// report sets each conditional op's result: what its evaluation found if the batch committed
// (err nil), else false for every op.
func (a *applyState) report(b *Batch, err error) {
	for _, r := range a.results {
		*r.p = err == nil && r.ok
	}
	if err != nil {
		for _, o := range b.ops {
			if o.result != nil {
				*o.result = false
			}
		}
	}
}

// current returns entry k as the batch has left it so far, read from the committed state the
// first time.
func (a *applyState) current(k entryKey) (*blockState, error) {
	if st, ok := a.blocks[k]; ok {
		return st, nil
	}
	ix := a.ix
	// The membership lists every committed entry (updated under applyMu), and more where
	// fingerprints collide: an entry it does not list needs no Pebble read. Until it is built,
	// every entry is read.
	member := true
	ix.members.RLock()
	if tab := ix.members.tab; tab != nil {
		if k.side == 0 {
			member = tab.has(fingerprint(k.id))
		} else {
			member = tab.kindsOf(fingerprint(k.id))&(1<<k.side) != 0
		}
	}
	ix.members.RUnlock()
	if !member {
		st := &blockState{}
		a.blocks[k] = st
		return st, nil
	}
	key := blockKey(a.kb[:], k.id)
	if k.side != 0 {
		key = sidecarKey(a.kb[:], k.id, k.side)
	}
	loc, ok, err := ix.getLocation(key, k.id)
	if err != nil {
		return nil, err
	}
	st := &blockState{}
	if ok {
		*st = blockState{present: true, was: true, side: k.side != 0, seg: loc.Segment, off: loc.Offset, bytes: loc.RecordBytes()}
	}
	a.blocks[k] = st
	return st, nil
}

// adjust counts st's record in (sign 1) or out of (sign -1) its segment's live counters.
func (a *applyState) adjust(st *blockState, sign int64) {
	d := a.deltas[st.seg]
	if d == nil {
		d = &liveDelta{}
		a.deltas[st.seg] = d
	}
	d.bytes += sign * st.bytes
	d.records += sign
	if st.side {
		d.sidecars += sign
	}
}

// put makes st the entry o puts.
func (a *applyState) put(st *blockState, o *op) {
	a.batchPut = a.batchPut || o.loc.IsBatch()
	if st.present {
		a.adjust(st, -1)
	}
	*st = blockState{present: true, was: st.was, side: o.side != 0, seg: o.loc.Segment, off: o.loc.Offset, bytes: o.loc.RecordBytes(), enc: o.enc, dirty: true}
	a.adjust(st, 1)
}

// remove deletes entry st.
func (a *applyState) remove(st *blockState) {
	a.adjust(st, -1)
	*st = blockState{dirty: true, was: st.was}
}

// dropSidecars deletes every sidecar of a block whose entry goes: none outlives it.
func (a *applyState) dropSidecars(id format.BlockID) error {
	kinds := a.ix.sidecarKindsOf(id)
	for kinds |= a.batchKinds[id]; kinds != 0; kinds &= kinds - 1 {
		st, err := a.current(entryKey{id, format.SidecarKind(bits.TrailingZeros64(kinds))})
		if err != nil {
			return err
		}
		if st.present {
			a.remove(st)
		}
	}
	return nil
}

// record notes a conditional op's outcome for report.
func (a *applyState) record(p *bool, ok bool) {
	if p != nil {
		a.results = append(a.results, applyResult{p, ok})
	}
}

// segRow returns segment n's row as the batch has left it so far.
func (a *applyState) segRow(n uint64) *segState {
	if s, ok := a.segs[n]; ok {
		return s
	}
	m, ok := a.committed[n]
	s := &segState{exists: ok, meta: m}
	a.segs[n] = s
	return s
}

// evaluate runs the ops in order against the in-batch view: segment ops first (a batch that
// creates a segment and puts entries into it may list them in any order), then the entry ops.
func (a *applyState) evaluate(ops []op) error {
	for i := range ops {
		o := &ops[i]
		switch o.kind {
		case opSetSegment:
			s := a.segRow(o.seg.Number)
			s.exists, s.meta = true, o.seg
		case opDeleteSegment:
			a.segRow(o.number).exists = false
		}
	}
	for i := range ops {
		if err := a.evaluateEntryOp(&ops[i]); err != nil {
			return err
		}
	}
	return nil
}

// evaluateEntryOp evaluates one op on an entry (other ops are left alone).
func (a *applyState) evaluateEntryOp(o *op) error {
	switch o.kind {
	case opPut:
		st, err := a.current(entryKey{o.id, 0})
		if err != nil {
			return err
		}
		a.put(st, o)
	case opPutIf, opPutSidecarIf:
		st, err := a.current(entryKey{o.id, o.side})
		if err != nil {
			return err
		}
		ok := st.present && st.seg == o.oldSeg && st.off == o.oldOff
		if ok {
			a.put(st, o)
		}
		a.record(o.result, ok)
	case opPutSidecar:
		// Only beside a block that has an entry at this point of the batch.
		blk, err := a.current(entryKey{o.id, 0})
		if err != nil {
			return err
		}
		if blk.present {
			st, err := a.current(entryKey{o.id, o.side})
			if err != nil {
				return err
			}
			a.put(st, o)
			a.batchKinds[o.id] |= 1 << o.side
		}
		a.record(o.result, blk.present)
	case opDelete, opDeleteIf:
		st, err := a.current(entryKey{o.id, 0})
		if err != nil {
			return err
		}
		ok := st.present && (o.kind == opDelete || (st.seg == o.oldSeg && st.off == o.oldOff))
		if ok {
			a.remove(st)
			if err := a.dropSidecars(o.id); err != nil {
				return err
			}
		}
		a.record(o.result, ok)
	case opDeleteSidecarIf:
		st, err := a.current(entryKey{o.id, o.side})
		if err != nil {
			return err
		}
		ok := st.present && st.seg == o.oldSeg && st.off == o.oldOff
		if ok {
			a.remove(st)
		}
		a.record(o.result, ok)
	}
	return nil
}

// writeSegmentRows writes to pb the final row of every segment touched by a segment op or by
// an entry, with its exact live counters, and returns the rows that changed (nil: deleted).
// A segment deleted while entries point into it, entries pointing at a segment with no row, or
// counters that would go negative or disagree fail it.
func (a *applyState) writeSegmentRows(pb *pebble.Batch) (map[uint64]*SegmentMeta, error) {
	for n := range a.deltas {
		a.segRow(n)
	}
	newRows := make(map[uint64]*SegmentMeta, len(a.segs))
	for n, s := range a.segs {
		var live liveDelta
		old, hadRow := a.committed[n]
		if hadRow {
			live = liveDelta{old.LiveBytes, old.LiveRecords, old.LiveSidecars}
		}
		if d := a.deltas[n]; d != nil {
			live.bytes += d.bytes
			live.records += d.records
			live.sidecars += d.sidecars
		}
		if !s.exists {
			if live.records != 0 || live.bytes != 0 {
				if hadRow {
					return nil, fmt.Errorf("%w: index: apply: segment %d deleted with %d live records (%d bytes)", format.ErrInvalid, n, live.records, live.bytes)
				}
				return nil, fmt.Errorf("%w: index: apply: %d entries (%d bytes) would point at segment %d, which has no row", format.ErrInvalid, live.records, live.bytes, n)
			}
			if hadRow {
				newRows[n] = nil
				if err := pb.Delete(segmentKey(n), nil); err != nil {
					return nil, fmt.Errorf("index: apply: %w", err)
				}
			}
			continue
		}
		if live.records < 0 || live.bytes < 0 || (live.records == 0) != (live.bytes == 0) || live.sidecars < 0 || live.sidecars > live.records {
			return nil, fmt.Errorf("%w: index: apply: segment %d accounting would become %d bytes in %d records (%d sidecars)", format.ErrCorrupt, n, live.bytes, live.records, live.sidecars)
		}
		m := s.meta
		m.LiveBytes, m.LiveRecords, m.LiveSidecars = live.bytes, live.records, live.sidecars
		if hadRow && old == m {
			continue
		}
		newRows[n] = &m
		if err := pb.Set(segmentKey(n), EncodeSegmentMeta(nil, m), nil); err != nil {
			return nil, fmt.Errorf("index: apply: %w", err)
		}
	}
	return newRows, nil
}

// writeEntries writes to pb every entry the batch changed, and its meta ops.
func (a *applyState) writeEntries(pb *pebble.Batch, ops []op) error {
	for k, st := range a.blocks {
		if !st.dirty {
			continue
		}
		key := blockKey(make([]byte, blockKeySize), k.id)
		if k.side != 0 {
			key = sidecarKey(make([]byte, sidecarKeySize), k.id, k.side)
		}
		var err error
		if st.present {
			err = pb.Set(key, st.enc, nil)
		} else {
			err = pb.Delete(key, nil)
		}
		if err != nil {
			return fmt.Errorf("index: apply: %w", err)
		}
	}
	for _, o := range ops {
		var err error
		switch o.kind {
		case opSetMeta:
			err = pb.Set(metaKey(o.key), o.val, nil)
		case opDeleteMeta:
			err = pb.Delete(metaKey(o.key), nil)
		}
		if err != nil {
			return fmt.Errorf("index: apply: %w", err)
		}
	}
	return nil
}

// publish brings the in-memory membership and segment tables to the committed state, once the
// batch is committed.
func (a *applyState) publish(newRows map[uint64]*SegmentMeta) {
	ix := a.ix
	m := &ix.members
	m.Lock()
	// Blocks that came first, then sidecar kinds (a kind needs its block's slot), then blocks
	// that went.
	for pass := 0; pass < 3; pass++ {
		for k, st := range a.blocks {
			if !st.dirty || st.present == st.was || (pass == 1) != (k.side != 0) || (pass == 0 && !st.present) || (pass == 2 && st.present) {
				continue
			}
			if m.tab == nil {
				m.noteChange(k, st.was, st.present)
				continue
			}
			fp := fingerprint(k.id)
			switch {
			case k.side != 0 && st.present:
				m.tab.setKind(fp, k.side)
			case k.side != 0:
				m.tab.clearKind(fp, k.side)
			case st.present:
				m.tab.add(fp)
			default:
				m.tab.remove(fp)
			}
		}
	}
	m.Unlock()
	ix.mu.Lock()
	for n, m := range newRows {
		if m == nil {
			delete(ix.mu.segments, n)
		} else {
			ix.mu.segments[n] = *m
		}
	}
	ix.mu.Unlock()
}
