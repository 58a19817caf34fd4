package engine

import (
	"encoding/binary"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// walHooks is the engine seen by the log writer: it keeps the index's segment table and block
// entries in step with the segment files, in the durability order of docs/durability.md.
type walHooks Engine

var _ wal.Hooks = (*walHooks)(nil)

// SegmentCreated registers a new segment as active, durably. The next segment number is
// recorded first, unsynced; the synced batch after it makes both durable together (Pebble's
// WAL is ordered), so a number is never reused. Several writers create segments: the counter
// is read and written under one lock so the recorded value never goes back.
func (h *walHooks) SegmentCreated(number, generation uint64) error {
	e := (*Engine)(h)
	var next [8]byte
	e.nextSegMu.Lock()
	binary.LittleEndian.PutUint64(next[:], max(number+1, e.nextSeg.Load()))
	err := e.ix.SetMeta(metaNextSegment, next[:], false)
	e.nextSegMu.Unlock()
	if err != nil {
		return err
	}
	b := e.ix.NewBatch()
	b.SetSegment(index.SegmentMeta{Number: number, Generation: generation, State: index.SegmentActive, Size: format.SegmentHeaderSize})
	return e.ix.Apply(b, true)
}

// Publish indexes a group of records: one batch with every entry and the segment's new size.
// A relocated record (Origin set) moves its block's entry only if the entry still points at
// the origin; otherwise the copy is dead space, left for compaction.
//
// Under SyncAlways the records are durable when this is called, and a dump is acknowledged
// once the batch is applied, without waiting for the index to sync: the segment is the
// durable copy of these entries. The segment is active, and recovery re-indexes every intact
// record of an active segment the index lacks (recoverActive); it stops being active only
// through its seal's synced batch, which makes these entries durable first (Pebble's WAL is
// ordered). An index sync here would hold the publisher for a device flush per group (10–40
// ms under load) while the device idles. A batch that relocates blocks is synced: the copy's
// source may be deleted soon after, and the move must not be lost.
func (h *walHooks) Publish(recs []*wal.Record, durable bool) error {
	e := (*Engine)(h)
	b := e.ix.NewBatch()
	var last *wal.Record
	moved := make([]*bool, len(recs))
	var locs []index.Location // for the publication log
	if e.share != nil {
		locs = make([]index.Location, len(recs))
	}
	sync := false
	for k, r := range recs {
		loc := index.Location{Segment: r.Segment, Offset: r.Offset, Layout: r.Layout, Seq: r.Seq, HeaderCRC: r.HeaderCRC, ShardCRCs: r.ShardCRCs,
			Compression: r.Compression, StoredLens: r.StoredLens, StoredCRCs: r.StoredCRCs, BatchBlocks: r.BatchBlocks, BatchPos: r.BatchPos}
		if locs != nil {
			locs[k] = loc
		}
		switch {
		case r.Kind != 0 && r.Origin != nil:
			moved[k] = b.PutSidecarIf(r.ID, r.Kind, index.Location{Segment: r.Origin.Segment, Offset: r.Origin.Offset}, loc)
			sync = durable
		case r.Kind != 0:
			// Indexed only beside its block (the index drops a sidecar whose block is gone).
			b.PutSidecar(r.ID, r.Kind, loc)
		case r.Origin != nil:
			moved[k] = b.PutIf(r.ID, index.Location{Segment: r.Origin.Segment, Offset: r.Origin.Offset}, loc)
			sync = durable
		default:
			b.Put(r.ID, loc)
		}
		last = r
	}
	if meta, ok := e.ix.Segment(last.Segment); ok && last.End() > meta.Size {
		// A batch record (wal.Batch) is published when it commits, possibly after records
		// placed behind it: the size only grows. (The Writer publishes one group at a time.)
		meta.Size = last.End()
		b.SetSegment(meta)
	}
	if err := e.ix.Apply(b, sync); err != nil {
		return err
	}
	if locs != nil {
		// Before the dump completes: other instances find the blocks from now on.
		e.share.AppendPublog(recs, locs)
	}
	// Recency (per segment): a segment written into is the newest of its tier; records moved
	// in from another tier (demoted, promoted) count as written; records compacted within a
	// tier keep their recency: the segment they land in is at least as recent as the one they
	// came from.
	to := e.tierOf(last.Segment)
	var rec *tiers.Recency
	if to != nil {
		rec = to.Recency()
	}
	var written, inherited uint64 // the last segment stamped written, inherited from (0: none)
	for k, r := range recs {
		if r.Origin != nil && !*moved[k] {
			e.stats.relocationsLost.Add(1)
			continue
		}
		switch {
		case r.Origin == nil || e.tierOf(r.Origin.Segment) != to:
			if r.Segment != written {
				rec.Written(r.Segment)
				written = r.Segment
			}
		case r.Origin.Segment != inherited:
			rec.Inherit(r.Segment, r.Origin.Segment)
			inherited = r.Origin.Segment
		}
	}
	return nil
}

// SegmentSealed records a segment's final size and sealed state, durably, and settles its
// tier's account from the reservation to that size.
func (h *walHooks) SegmentSealed(number uint64, size int64) error {
	e := (*Engine)(h)
	e.settleSealed(number, size)
	meta, ok := e.ix.Segment(number)
	if !ok {
		return nil
	}
	meta.State, meta.Size = index.SegmentSealed, size
	b := e.ix.NewBatch()
	b.SetSegment(meta)
	if err := e.ix.Apply(b, true); err != nil {
		return err
	}
	if t := e.tierOf(number); t != nil && t.Shared() {
		e.share.Kick() // publish it to the other instances
	}
	return nil
}

// Synced makes the index durable after the segments were synced.
func (h *walHooks) Synced() error { return (*Engine)(h).ix.Sync() }

// SegmentDropped deletes a segment prepared for a writer and never used: its reservation is
// settled to its header, then it is retired like any empty segment (marked deleting durably,
// unlinked, its row removed), so a crash on the way is finished by the next Open.
func (h *walHooks) SegmentDropped(number uint64) error {
	e := (*Engine)(h)
	meta, ok := e.ix.Segment(number)
	if !ok {
		return nil
	}
	e.settleSealed(number, meta.Size)
	return e.retire(number)
}
