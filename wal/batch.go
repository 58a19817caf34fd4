package wal

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// ErrBatchAbandoned is returned by WriteRun and CommitBatch for a batch that was abandoned
// (AbandonBatch, Close): its blocks were never published and its extent is dead bytes.
var ErrBatchAbandoned = errors.New("wal: batch abandoned")

// Batch is a layer-major batch record (format.RecordBatch) of N blocks and L shards being
// written: ReserveBatch places its extent at the end of the log and writes its header;
// WriteRun writes the run of one layer (shard i of every block, contiguous) straight from the
// caller's buffers, in any order and concurrently; CommitBatch writes the commit block once
// every run is written, makes the batch durable and publishes its N blocks; AbandonBatch
// gives it up instead, leaving its extent as dead bytes that recovery skips.
//
// A block of a batch becomes visible only once every one of its shards is durable (the commit
// block, which holds every shard's checksum, is written after the last run completed and
// synced with them). The segment holding an open batch is not sealed until the batch is
// committed or abandoned: the caller must do one or the other (the engine abandons a batch
// whose layers stop arriving); Close abandons the batches still open.
type Batch struct {
	// Set by ReserveBatch.
	Segment   uint64
	Offset    int64
	FirstSeq  uint64
	HeaderCRC uint32

	w      *Writer
	seg    *Segment
	header format.BatchHeader
	placed *flight // the flight writing the header

	mu      sync.Mutex
	state   batchState
	written []bool   // per layer
	crcs    []uint32 // layer-major: crcs[i·N + b]
	origins []*Origin
}

type batchState uint8

const (
	batchOpen batchState = iota
	batchCommitting
	batchCommitted
	batchAbandoned
)

// SetOrigins marks the batch as a relocation: block k copies the stored block whose entry
// pointed at origins[k] when it was read (nil: an ordinary put, as for a dump). Each
// published Record carries its Origin, so Hooks.Publish moves an entry only if it still
// points there (Record.Origin). It must be called before CommitBatch, with one origin per
// block.
func (b *Batch) SetOrigins(origins []*Origin) error {
	if len(origins) != len(b.header.IDs) {
		return fmt.Errorf("wal: batch of %d blocks given %d origins: %w", len(b.header.IDs), len(origins), format.ErrInvalid)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != batchOpen {
		return fmt.Errorf("wal: batch at %d of segment %d: origins set after commit or abandon: %w", b.Offset, b.Segment, format.ErrInvalid)
	}
	b.origins = origins
	return nil
}

// Blocks is the number of blocks in the batch.
func (b *Batch) Blocks() int { return len(b.header.IDs) }

// Extent is the on-disk size of the batch record: header, runs and commit block.
func (b *Batch) Extent() int64 { return b.header.ExtentBytes() }

// ReserveBatch places a batch record for the blocks ids (in that order) of layout l at the end
// of the active segment (a new one when it does not fit) and writes its header as part of the
// ordinary flight pipeline, so records placed after it are published only after the header
// is written (durable under SyncAlways): a scan never meets a hole where a header should be.
// It returns once the batch is placed; the header write may still be in flight. Needs
// Options.BatchRecords.
func (w *Writer) ReserveBatch(ids []format.BlockID, l format.Layout) (*Batch, error) {
	if !w.opts.BatchRecords {
		return nil, fmt.Errorf("wal: batch records are off for this writer: %w", format.ErrInvalid)
	}
	if len(ids) < 1 || len(ids) > format.MaxBatchBlocks {
		return nil, fmt.Errorf("wal: batch of %d blocks, want [1, %d]: %w", len(ids), format.MaxBatchBlocks, format.ErrInvalid)
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("wal: batch of %d blocks from %s: %w", len(ids), ids[0], err)
	}
	b := &Batch{w: w, header: format.BatchHeader{Layout: l, IDs: ids},
		written: make([]bool, l.Shards), crcs: make([]uint32, len(ids)*l.Shards)}
	r := &request{batch: b, done: make(chan error, 1)}
	if err := w.send(r); err != nil {
		return nil, err
	}
	return b, nil
}

// placeBatch places b in the active segment and issues its header write, from the committer.
func (w *Writer) placeBatch(b *Batch) error {
	size := b.header.ExtentBytes()
	var seg *Segment
	for {
		if err := w.ensureActive(); err != nil {
			return err
		}
		seg = w.active
		n := len(seg.entries)
		if seg.end+size+format.FooterSize(n+1) <= w.opts.SegmentSize || n == 0 {
			break // like a record, a batch bigger than a whole segment gets an empty one
		}
		w.rotate(seg)
	}
	b.seg = seg
	b.Segment, b.Offset, b.FirstSeq = seg.Number, seg.end, SequenceFor(seg.Number, seg.ordinal+1)
	b.header.Segment, b.header.Generation, b.header.FirstSeq = seg.Number, seg.Generation, b.FirstSeq
	hdr := devio.AlignedBuffer(int(format.BatchHeaderSize(len(b.header.IDs))))
	crc, err := format.EncodeBatchHeader(hdr, &b.header)
	if err != nil {
		return fmt.Errorf("wal: batch from %s: %w", b.header.IDs[0], err)
	}
	b.HeaderCRC = crc
	w.batchMu.Lock()
	if w.batchesClosed {
		w.batchMu.Unlock()
		return ErrWriterClosed
	}
	w.open[b] = struct{}{}
	w.batchMu.Unlock()
	if len(seg.entries) == 0 {
		seg.firstPlaced = time.Now()
	}
	seg.entries = append(seg.entries, format.FooterEntry{ID: b.header.IDs[0], Offset: b.Offset, Length: size,
		Seq: b.FirstSeq, HeaderCRC: crc, Type: format.RecordBatch})
	seg.batches = append(seg.batches, b)
	seg.openBatches.Add(1)
	seg.end += size
	seg.ordinal += uint64(len(b.header.IDs))
	if w.opts.Sync != SyncAlways {
		w.markDirty(seg)
	}
	ops := append(headerOp(seg), devio.Op{File: seg.file, Buf: hdr, Off: b.Offset, Write: true})
	b.placed = w.launch(seg, nil, nil, ops)
	return nil
}

// WriteRun writes layer i's run: shards[k] is shard i of block k, an aligned buffer of exactly
// Layout.ShardStride() bytes (the raw ShardBytes, then zero padding), and crcs[k] the CRC32C of
// its raw ShardBytes. The N writes are adjacent, so the backend issues them as one vectored
// write. It returns once they are written (not yet durable). A run is written once; runs of
// different layers may be written concurrently. A failed write fails the batch and stops
// appends to its segment (like any failed write).
func (b *Batch) WriteRun(i int, shards [][]byte, crcs []uint32) error {
	n, l := len(b.header.IDs), b.header.Layout
	switch {
	case i < 0 || i >= l.Shards:
		return fmt.Errorf("wal: batch at %d of segment %d: layer %d out of range [0, %d): %w", b.Offset, b.Segment, i, l.Shards, format.ErrInvalid)
	case len(shards) != n || len(crcs) != n:
		return fmt.Errorf("wal: batch at %d of segment %d: layer %d: %d shards and %d checksums for %d blocks: %w", b.Offset, b.Segment, i, len(shards), len(crcs), n, format.ErrInvalid)
	}
	for k, s := range shards {
		if int64(len(s)) != l.ShardStride() || !devio.IsAligned(s) {
			return fmt.Errorf("wal: batch at %d of segment %d: block %s shard %d: buffer of %d bytes, want an aligned %d: %w",
				b.Offset, b.Segment, b.header.IDs[k], i, len(s), l.ShardStride(), format.ErrInvalid)
		}
	}
	b.mu.Lock()
	switch {
	case b.state == batchAbandoned:
		b.mu.Unlock()
		return ErrBatchAbandoned
	case b.state != batchOpen:
		b.mu.Unlock()
		return fmt.Errorf("wal: batch at %d of segment %d: layer %d written after commit: %w", b.Offset, b.Segment, i, format.ErrInvalid)
	case b.written[i]:
		b.mu.Unlock()
		return fmt.Errorf("wal: batch at %d of segment %d: layer %d written twice: %w", b.Offset, b.Segment, i, format.ErrInvalid)
	}
	b.written[i] = true // claimed; undone if the write fails
	b.mu.Unlock()
	if err := b.seg.failure(); err != nil {
		b.unclaim(i)
		return err
	}
	ops := make([]devio.Op, n)
	for k, s := range shards {
		ops[k] = devio.Op{File: b.seg.file, Buf: s, Off: b.Offset + b.header.ShardOffset(k, i), Write: true}
	}
	if err := b.w.opts.Backend.Submit(ops); err != nil {
		err = fmt.Errorf("wal: write layer %d of batch at %d of segment %d: %w", i, b.Offset, b.Segment, err)
		b.w.markFailed(b.seg, err)
		b.unclaim(i)
		return err
	}
	b.mu.Lock()
	copy(b.crcs[i*n:(i+1)*n], crcs)
	b.mu.Unlock()
	return nil
}

func (b *Batch) unclaim(i int) {
	b.mu.Lock()
	b.written[i] = false
	b.mu.Unlock()
}

// CommitBatch makes the batch visible: once its header is written and every run is written,
// it writes the commit block (every shard's checksum), fdatasyncs the segment (unless
// SyncNone: a batch is acknowledged as a whole, so the one sync covers all its layers; one
// fdatasync serves the commits of concurrent batches of the segment) and
// publishes its N blocks with Hooks.Publish, each as a Record with BatchBlocks and BatchPos
// set. On error nothing is published and the batch is abandoned.
func (b *Batch) CommitBatch() error { return CommitBatches([]*Batch{b})[0] }

// CommitBatches commits batches of one Writer as CommitBatch commits each, together: their
// commit blocks go out in one submission, each segment they lie in is synced once, and the
// blocks of each segment are published in one Hooks.Publish call. So the chunks of a long
// list wait for one device flush, not one each in turn. errs[k] is bs[k]'s outcome, what
// CommitBatch would return for it; a batch that fails (not fully written, abandoned, a failed
// segment) is abandoned and fails alone, except that a failed sync or publish fails every
// batch of that segment.
func CommitBatches(bs []*Batch) (errs []error) {
	// A batch being committed: bs[k], and its commit block once encoded.
	type committing struct {
		b *Batch
		k int
		c format.BatchCommit
	}
	errs = make([]error, len(bs))
	var live []*committing
	for k, b := range bs {
		if err := b.beginCommit(bs[0].w); err != nil {
			errs[k] = err
			continue
		}
		live = append(live, &committing{b: b, k: k})
	}
	defer func() {
		for _, it := range live {
			it.b.endCommit(errs[it.k])
		}
	}()
	// In file order, so that each segment's publish ends with its farthest record.
	sort.Slice(live, func(i, j int) bool {
		if live[i].b.Segment != live[j].b.Segment {
			return live[i].b.Segment < live[j].b.Segment
		}
		return live[i].b.Offset < live[j].b.Offset
	})
	var (
		ops    []devio.Op
		owners []*committing // owners[i] wrote ops[i]
	)
	for _, it := range live {
		b := it.b
		<-b.placed.settled // the header is written; the sync below makes it durable with the runs
		if err := b.seg.failure(); err != nil {
			errs[it.k] = fmt.Errorf("wal: batch at %d of segment %d: %w", b.Offset, b.Segment, err)
			continue
		}
		n, l := len(b.header.IDs), b.header.Layout
		it.c = format.BatchCommit{Segment: b.Segment, Generation: b.seg.Generation, FirstSeq: b.FirstSeq, Blocks: n, Shards: l.Shards,
			HeaderCRC: b.HeaderCRC, ShardCRCs: b.crcs}
		buf := devio.AlignedBuffer(int(format.BatchCommitSize(n, l.Shards)))
		if err := format.EncodeBatchCommit(buf, &it.c); err != nil {
			errs[it.k] = fmt.Errorf("wal: commit of batch at %d of segment %d: %w", b.Offset, b.Segment, err)
			continue
		}
		ops = append(ops, devio.Op{File: b.seg.file, Buf: buf, Off: b.Offset + b.header.CommitOffset(), Write: true})
		owners = append(owners, it)
	}
	if len(ops) == 0 {
		return errs
	}
	w := owners[0].b.w
	_ = w.opts.Backend.Submit(ops) // each op's outcome is its own
	var written []*committing
	for i, it := range owners {
		if err := ops[i].Err; err != nil {
			err = fmt.Errorf("wal: write commit of batch at %d of segment %d: %w", it.b.Offset, it.b.Segment, err)
			w.markFailed(it.b.seg, err)
			errs[it.k] = err
			continue
		}
		written = append(written, it)
	}
	durable := w.opts.Sync != SyncNone
	for lo := 0; lo < len(written); {
		seg := written[lo].b.seg
		hi := lo + 1
		for hi < len(written) && written[hi].b.seg == seg {
			hi++
		}
		group := written[lo:hi]
		lo = hi
		var err error
		if durable {
			if err = seg.syncCovering(); err != nil {
				w.markFailed(seg, fmt.Errorf("wal: sync of segment %d: %w", seg.Number, err))
				err = fmt.Errorf("sync: %w", err)
			}
		}
		if err == nil {
			var recs []*Record
			for _, it := range group {
				recs = append(recs, it.b.records(it.c)...)
			}
			w.pubMu.Lock()
			perr := w.opts.Hooks.Publish(recs, durable)
			w.pubMu.Unlock()
			if perr != nil {
				err = fmt.Errorf("publish to index: %w", perr)
			}
		}
		if err != nil {
			for _, it := range group {
				errs[it.k] = fmt.Errorf("wal: batch at %d of segment %d: %w", it.b.Offset, it.b.Segment, err)
			}
		}
	}
	return errs
}

// beginCommit moves an open, fully written batch of Writer w to committing.
func (b *Batch) beginCommit(w *Writer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case batchAbandoned:
		return ErrBatchAbandoned
	case batchOpen:
	default:
		return fmt.Errorf("wal: batch at %d of segment %d committed twice: %w", b.Offset, b.Segment, format.ErrInvalid)
	}
	if b.w != w {
		return fmt.Errorf("wal: batch at %d of segment %d: committed with another writer's batches: %w", b.Offset, b.Segment, format.ErrInvalid)
	}
	for i, ok := range b.written {
		if !ok {
			return fmt.Errorf("wal: batch at %d of segment %d: commit with layer %d not written: %w", b.Offset, b.Segment, i, format.ErrInvalid)
		}
	}
	b.state = batchCommitting
	return nil
}

// endCommit settles a committing batch: committed when err is nil, else abandoned.
func (b *Batch) endCommit(err error) {
	b.mu.Lock()
	if err != nil {
		b.state = batchAbandoned
	} else {
		b.state = batchCommitted
	}
	b.mu.Unlock()
	b.w.release(b)
}

// records are the Records Publish gets for a committed batch, one per block.
func (b *Batch) records(c format.BatchCommit) []*Record {
	n, l := len(b.header.IDs), b.header.Layout
	recs := make([]*Record, n)
	for k, id := range b.header.IDs {
		recs[k] = &Record{ID: id, Layout: l, ShardCRCs: c.BlockCRCs(k), Segment: b.Segment, Offset: b.Offset, Seq: b.FirstSeq + uint64(k),
			HeaderCRC: b.HeaderCRC, BatchBlocks: n, BatchPos: k, BatchExtent: b.header.ExtentBytes()}
		if b.origins != nil {
			recs[k].Origin = b.origins[k]
		}
	}
	return recs
}

// AbandonBatch gives the batch up: nothing of it is published, its extent stays as dead bytes
// (recovery skips a batch without a valid commit block) and its segment may be sealed. It
// reports whether the batch was still open (false once committed or being committed).
func (b *Batch) AbandonBatch() bool {
	b.mu.Lock()
	if b.state != batchOpen {
		b.mu.Unlock()
		return false
	}
	b.state = batchAbandoned
	b.mu.Unlock()
	b.w.release(b)
	return true
}

// release ends b's hold on its segment, once it is committed or abandoned.
func (w *Writer) release(b *Batch) {
	w.batchMu.Lock()
	delete(w.open, b)
	w.batchMu.Unlock()
	b.seg.openBatches.Done()
}

// abandonOpenBatches abandons every open batch and refuses new ones (Close).
func (w *Writer) abandonOpenBatches() {
	w.batchMu.Lock()
	w.batchesClosed = true
	open := make([]*Batch, 0, len(w.open))
	for b := range w.open {
		open = append(open, b)
	}
	w.batchMu.Unlock()
	for _, b := range open {
		b.AbandonBatch()
	}
}

// hasOpenBatches reports whether a batch of seg is neither committed nor abandoned. Called by
// the seal, once the committer has let go of seg (no batch is placed in it any more).
func hasOpenBatches(seg *Segment) bool {
	for _, b := range seg.batches {
		b.mu.Lock()
		open := b.state == batchOpen || b.state == batchCommitting
		b.mu.Unlock()
		if open {
			return true
		}
	}
	return false
}

// committedEntries waits until no batch of seg is open, then returns its footer entries without
// those of abandoned batches. Called by the seal, once the committer has let go of seg.
func committedEntries(seg *Segment) []format.FooterEntry {
	seg.openBatches.Wait()
	if len(seg.batches) == 0 {
		return seg.entries
	}
	dead := make(map[int64]bool)
	for _, b := range seg.batches {
		b.mu.Lock()
		if b.state != batchCommitted {
			dead[b.Offset] = true
		}
		b.mu.Unlock()
	}
	seg.batches = nil
	if len(dead) == 0 {
		return seg.entries
	}
	kept := seg.entries[:0]
	for _, e := range seg.entries {
		if e.Type == format.RecordBatch && dead[e.Offset] {
			continue
		}
		kept = append(kept, e)
	}
	return kept
}
