// Package verifytest builds store contents for the tests of tools/verify and ucm-tool that
// the engine does not write yet.
package verifytest

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tools/verify"
	"github.com/ucm-go/ucm/wal"
)

// Batch is one batch record for WriteBatchSegment to write: its blocks, in order, and whether
// it commits (else only its first layer is written and it is abandoned, as the engine abandons
// a batch whose layers stop arriving). WriteBatchSegment fills in where it was placed.
type Batch struct {
	IDs    []format.BlockID
	Commit bool
	// Offset and Extent: where the batch record lies in the segment.
	Offset, Extent int64
}

// WriteBatchSegment appends one segment of batch records (format.RecordBatch) to the closed
// store in dir on fs (nil: vfs.Default), with a wal.Writer indexing the committed batches'
// blocks as the engine does, and seals it (an abandoned batch is not in its footer). Shard i of
// block k of batches[j] is filled with byte(31j + 7k + 13i + position). It returns the
// segment's number.
func WriteBatchSegment(fs vfs.FS, dir string, batches []*Batch) (_ uint64, err error) {
	if fs == nil {
		fs = vfs.Default
	}
	h, err := verify.Open(dir, fs)
	if err != nil {
		return 0, err
	}
	fp, layout := h.Fingerprint, h.Layout
	var next uint64
	for _, m := range h.Index.Segments() {
		next = max(next, m.Number+1)
	}
	segDir := h.SegDirs[0]
	if err := h.Close(); err != nil {
		return 0, err
	}
	ix, err := index.Open(fs.PathJoin(dir, engine.IndexDir), index.Options{FS: fs})
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, ix.Close()) }()
	be, err := devio.NewBackend(devio.EnginePsync, 4, slog.New(slog.DiscardHandler))
	if err != nil {
		return 0, err
	}
	defer func() { _ = be.Close() }()
	w, err := wal.NewWriter(wal.Options{FS: fs, Dir: segDir, SegmentSize: 64 << 20, Sync: wal.SyncAlways,
		Backend: be, Schema: fp, Hooks: hooks{ix}, NextSegment: next, BatchRecords: true, Direct: devio.DirectOff})
	if err != nil {
		return 0, err
	}
	for j, bt := range batches {
		s, err := writeBatch(w, j, bt, layout)
		if err == nil && s != next {
			err = fmt.Errorf("batch %d placed in segment %d, want all in %d", j, s, next)
		}
		if err != nil {
			return 0, errors.Join(err, w.Close())
		}
	}
	return next, w.Close()
}

// writeBatch writes batches[j] and returns the segment it was placed in.
func writeBatch(w *wal.Writer, j int, bt *Batch, layout format.Layout) (uint64, error) {
	n := len(bt.IDs)
	b, err := w.ReserveBatch(bt.IDs, layout)
	if err != nil {
		return 0, err
	}
	bt.Offset, bt.Extent = b.Offset, b.Extent()
	for i := 0; i < layout.Shards; i++ {
		if !bt.Commit && i > 0 {
			break
		}
		run, crcs := make([][]byte, n), make([]uint32, n)
		for k := range run {
			run[k] = devio.AlignedBuffer(int(layout.ShardStride()))
			for p := int64(0); p < layout.ShardBytes; p++ {
				run[k][p] = byte(31*j + 7*k + 13*i + int(p))
			}
			crcs[k] = format.Checksum(run[k][:layout.ShardBytes])
		}
		if err := b.WriteRun(i, run, crcs); err != nil {
			return 0, err
		}
	}
	if bt.Commit {
		return b.Segment, b.CommitBatch()
	}
	if !b.AbandonBatch() {
		return 0, fmt.Errorf("abandon batch %d: it was not open", j)
	}
	return b.Segment, nil
}

// hooks index what the wal.Writer writes as the engine's do, batch blocks with their
// position.
type hooks struct{ ix *index.Index }

func (h hooks) SegmentCreated(number, generation uint64) error {
	b := h.ix.NewBatch()
	b.SetSegment(index.SegmentMeta{Number: number, Generation: generation, State: index.SegmentActive, Size: format.SegmentHeaderSize})
	return h.ix.Apply(b, true)
}

func (h hooks) Publish(recs []*wal.Record, _ bool) error {
	b := h.ix.NewBatch()
	for _, r := range recs {
		b.Put(r.ID, index.Location{Segment: r.Segment, Offset: r.Offset, Layout: r.Layout, Seq: r.Seq, HeaderCRC: r.HeaderCRC,
			ShardCRCs: r.ShardCRCs, BatchBlocks: r.BatchBlocks, BatchPos: r.BatchPos})
	}
	last := recs[len(recs)-1]
	if meta, ok := h.ix.Segment(last.Segment); ok {
		meta.Size = last.Offset + last.Size()
		b.SetSegment(meta)
	}
	return h.ix.Apply(b, true)
}

func (h hooks) SegmentSealed(number uint64, size int64) error {
	meta, ok := h.ix.Segment(number)
	if !ok {
		return nil
	}
	meta.State, meta.Size = index.SegmentSealed, size
	b := h.ix.NewBatch()
	b.SetSegment(meta)
	return h.ix.Apply(b, true)
}

func (h hooks) Synced() error                 { return h.ix.Sync() }
func (h hooks) SegmentDropped(_ uint64) error { return nil }
