package engine

import (
	"encoding/binary"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// walHooks is the engine seen by the log writer: it keeps the index's segment table and block
// entries in step with the segment files, in the durability order of docs/durability.md.
type walHooks Engine

var _ wal.Hooks = (*walHooks)(nil)

// SegmentCreated registers a new segment as active, durably. The next segment number is
// advanced first, unsynced; the synced batch after it makes both durable together (Pebble's
// WAL is ordered), so a number is never reused.
func (h *walHooks) SegmentCreated(number, generation uint64) error {
	e := (*Engine)(h)
	var next [8]byte
	binary.LittleEndian.PutUint64(next[:], number+1)
	if err := e.ix.SetMeta(metaNextSegment, next[:], false); err != nil {
		return err
	}
	b := e.ix.NewBatch()
	b.SetSegment(index.SegmentMeta{Number: number, Generation: generation, State: index.SegmentActive, Size: format.SegmentHeaderSize})
	return e.ix.Apply(b, true)
}

// Publish indexes a group of records: one batch with every entry and the segment's new size.
// Under SyncAlways the records are already durable and the batch is synced before the dumps
// are acknowledged.
func (h *walHooks) Publish(recs []*wal.Record, durable bool) error {
	e := (*Engine)(h)
	b := e.ix.NewBatch()
	var last *wal.Record
	for _, r := range recs {
		b.Put(r.ID, index.Location{Segment: r.Segment, Offset: r.Offset, Layout: r.Layout, Seq: r.Seq, HeaderCRC: r.HeaderCRC, ShardCRCs: r.ShardCRCs,
			Compression: r.Compression, StoredLens: r.StoredLens, StoredCRCs: r.StoredCRCs})
		last = r
	}
	if meta, ok := e.ix.Segment(last.Segment); ok {
		meta.Size = last.Offset + int64(len(last.Buf)) + int64(len(last.Payload))
		b.SetSegment(meta)
	}
	return e.ix.Apply(b, durable)
}

// SegmentSealed records a segment's final size and sealed state, durably.
func (h *walHooks) SegmentSealed(number uint64, size int64) error {
	e := (*Engine)(h)
	meta, ok := e.ix.Segment(number)
	if !ok {
		return nil
	}
	meta.State, meta.Size = index.SegmentSealed, size
	b := e.ix.NewBatch()
	b.SetSegment(meta)
	return e.ix.Apply(b, true)
}

// Synced makes the index durable after the segments were synced.
func (h *walHooks) Synced() error { return (*Engine)(h).ix.Sync() }
