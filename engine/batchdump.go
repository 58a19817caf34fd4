package engine

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Layer-wise dumps as layer-major batch records (docs/format.md, "Batch records";
// docs/performance.md).
//
// A layer-wise connector hands DumpShard shard i of the same list of new blocks once per
// layer. The first such call for a list whose blocks are all new (not stored, not being
// dumped, not in staging) opens a layerBatch for the list: the dump writer reserves one batch
// record per chunk of the list (at most MaxBatchBytes each, one layer's run of it at most
// MaxStagingBytes), and every layer's task writes its run, chunk by chunk, shard i of every
// block contiguous, straight from the caller's buffers (through one pooled bounce buffer per
// shard when they are not aligned, taken from staging memory and waited for: staging.go). The
// task of the layer that completes the list commits the chunks and completes when they are
// durable and published; the other tasks complete once their run is written. Nothing waits in
// staging memory for the last layer, and the run of a layer is one sequential write.
//
// Anything else takes the staging path (dump.go): whole-block dumps, a list that differs from
// an open one, a list with a stored or in-flight block, V0 (Create), a store whose first tier
// compresses or that writes blocks through to a memory or Mooncake tier (which need whole
// blocks), and Options.StageLayerWise.

// layerBatch is the state of a layer-wise dump of one block list written as batch records.
type layerBatch struct {
	key        string
	ids        []BlockID
	flights    []*inflightDump // one per id, registered in e.mu.inflight
	per        int             // blocks per chunk
	chunks     []*wal.Batch    // set once ready is closed (nil if the reservation failed)
	ready      chan struct{}   // closed once the chunks are reserved (or failed)
	claimed    []bool          // layer's run claimed by a task
	written    int             // runs written
	tried      int             // layer tasks seen, failed ones included
	failed     error
	committing bool // every layer written: the commit is under way, expiry leaves it alone
	done       bool // committed or failed: no longer in e.mu.inflight
	created    time.Time
}

// listKey is the map key of a block list: its ids' bytes in order.
func listKey(ids []BlockID) string {
	if len(ids) == 0 {
		return ""
	}
	return string(unsafe.Slice(&ids[0][0], len(ids)*len(ids[0])))
}

// batchable reports whether layer-wise dumps may go to batch records in this store.
func (e *Engine) batchable() bool {
	return !e.opts.StageLayerWise && len(e.caches) == 0 && e.tiers[0].Codec() == format.CompressionNone
}

// chunkBlocks is how many of n blocks of the store's layout one batch record written into
// tier t holds at most: its extent must fit MaxBatchBytes and an empty segment of t, and one
// layer's run of it MaxStagingBytes. 0 if not even one fits.
func (e *Engine) chunkBlocks(t tiers.Disk, n int) int {
	l := e.opts.Layout
	limit := min(e.opts.MaxBatchBytes, t.SegmentSize()-format.SegmentHeaderSize-format.FooterSize(1))
	// A chunk's run of one layer must also fit staging memory, which it may need whole as
	// bounce buffers (writeChunkRun): MaxStagingBytes holds at least one record, so one block.
	per := min(n, format.MaxBatchBlocks, int(max(limit/(int64(l.Shards)*l.ShardStride()), 0)),
		int(e.opts.MaxStagingBytes/l.ShardStride()))
	for per > 0 {
		h := format.BatchHeader{Layout: l, IDs: make([]BlockID, per)}
		if h.ExtentBytes() <= limit {
			return per
		}
		per--
	}
	return 0
}

// dumpLayerBatch runs a layer-wise dump task as part of a layerBatch when it can; it reports
// false, having done nothing, when the task must take the staging path.
func (e *Engine) dumpLayerBatch(t *Task, shard int, src []spans) bool {
	l := e.opts.Layout
	key := listKey(t.ids)
	e.mu.Lock()
	lb := e.mu.batches[key]
	if lb == nil {
		e.mu.Unlock()
		if lb = e.openLayerBatch(t.ids, src); lb == nil {
			return false
		}
		e.mu.Lock()
	}
	lb.tried++
	switch {
	case lb.failed != nil:
		err := lb.failed
		e.retireLayerBatchLocked(lb)
		e.mu.Unlock()
		for i, id := range t.ids {
			t.errs[i] = batchBlockErr(id, err)
		}
		return true
	case lb.claimed[shard]:
		e.mu.Unlock()
		return true // the same layer again: already written (or being written)
	}
	for i, s := range src {
		if s.size() != l.ShardBytes {
			err := blockErr(ErrInvalidArgument, t.ids[i], "dump buffer is %d bytes, want %d", s.size(), l.ShardBytes)
			e.failLayerBatchLocked(lb, err)
			e.mu.Unlock()
			for k := range t.ids {
				t.errs[k] = err
			}
			return true
		}
	}
	lb.claimed[shard] = true
	e.mu.Unlock()

	<-lb.ready
	err := e.writeLayerRun(t, lb, shard, src)
	e.mu.Lock()
	if lb.failed == nil && err != nil {
		e.failLayerBatchLocked(lb, fmt.Errorf("layer %d: %w", shard, err))
	}
	if lb.failed != nil {
		// Whichever layer failed first, and however this one ended (a write to the abandoned
		// batch fails too), every task of the batch reports that root cause.
		cause := lb.failed
		e.mu.Unlock()
		for i, id := range t.ids {
			t.errs[i] = batchBlockErr(id, cause)
		}
		return true
	}
	lb.written++
	last := lb.written == l.Shards
	lb.committing = last
	e.mu.Unlock()
	if last {
		e.commitLayerBatch(lb, t)
	}
	return true
}

// openLayerBatch opens a layerBatch for ids if every one is new, distinct and not being dumped,
// and reserves its batch records; nil if the list must take the staging path. Another task of
// the same list racing with it finds it in e.mu.batches and waits on ready.
func (e *Engine) openLayerBatch(ids []BlockID, src []spans) *layerBatch {
	if len(ids) == 0 {
		return nil
	}
	per := e.chunkBlocks(e.tiers[0], len(ids))
	if per == 0 {
		return nil
	}
	seen := make(map[BlockID]bool, len(ids))
	for i, id := range ids {
		if id.IsZero() || seen[id] || src[i].size() != e.opts.Layout.ShardBytes || e.ix.Contains(id) {
			return nil
		}
		seen[id] = true
	}
	key := listKey(ids)
	e.mu.Lock()
	if lb := e.mu.batches[key]; lb != nil {
		e.mu.Unlock()
		return lb
	}
	for _, id := range ids {
		if e.mu.inflight[id] != nil || e.mu.staging[id] != nil {
			e.mu.Unlock()
			return nil
		}
	}
	lb := &layerBatch{key: key, ids: ids, per: per, flights: make([]*inflightDump, len(ids)), ready: make(chan struct{}),
		claimed: make([]bool, e.opts.Layout.Shards), created: time.Now()}
	for i, id := range ids {
		lb.flights[i] = newInflight()
		lb.flights[i].batch = lb
		e.mu.inflight[id] = lb.flights[i]
	}
	e.mu.batches[key] = lb
	e.mu.Unlock()

	var err error
	for lo := 0; lo < len(ids) && err == nil; lo += per {
		var b *wal.Batch
		if b, err = e.w.ReserveBatch(ids[lo:min(len(ids), lo+per)], e.opts.Layout); err == nil {
			lb.chunks = append(lb.chunks, b)
		}
	}
	if err != nil {
		e.mu.Lock()
		e.failLayerBatchLocked(lb, fmt.Errorf("reserve batch record: %w", wrapIO(err)))
		e.mu.Unlock()
	}
	close(lb.ready)
	return lb
}

// writeLayerRun writes layer shard's run of every chunk of lb for task t, chunk by chunk.
func (e *Engine) writeLayerRun(t *Task, lb *layerBatch, shard int, src []spans) error {
	if lb.chunks == nil {
		return errors.New("batch records not reserved")
	}
	for c, b := range lb.chunks {
		lo := c * lb.per
		if err := e.writeChunkRun(t, lb, b, shard, lo, src[lo:lo+b.Blocks()]); err != nil {
			return err
		}
	}
	return nil
}

// writeChunkRun writes layer shard's run of chunk b, whose blocks start at lo in lb, from src.
// The caller's buffer is written in place when it is one aligned piece of a shard that fills
// its stride; the others go through a bounce buffer taken from staging memory, waiting for it
// when it is taken (staging.go) and giving it back once the run is written. So a layer holds
// staging memory for one chunk at a time, never more than MaxStagingBytes (chunkBlocks).
func (e *Engine) writeChunkRun(t *Task, lb *layerBatch, b *wal.Batch, shard, lo int, src []spans) error {
	l := e.opts.Layout
	stride := l.ShardStride()
	shards := make([][]byte, len(src))
	crcs := make([]uint32, len(src))
	var need int64
	for i, s := range src {
		if one := s.contiguous(); one != nil && devio.IsAligned(one) && stride == l.ShardBytes {
			shards[i] = one
		} else {
			need += stride
		}
	}
	switch {
	case t.cancelled():
		return fmt.Errorf("run of blocks [%d, %d) of %d: task cancelled before it was written: %w", lo, lo+len(src), len(lb.ids), ErrTimeout)
	case e.layerBatchFailed(lb):
		return wal.ErrBatchAbandoned // another layer failed: the caller reports its cause
	}
	var bounce [][]byte
	if need > 0 {
		what := fmt.Sprintf("run of blocks [%d, %d) of %d", lo, lo+len(src), len(lb.ids))
		if err := e.waitStaging(t, need, what); err != nil {
			return err
		}
		defer func() {
			e.mu.Lock()
			e.releaseStagingLocked(need)
			e.mu.Unlock()
			for _, b := range bounce {
				e.pool.Put(b)
			}
		}()
		if e.layerBatchFailed(lb) {
			return wal.ErrBatchAbandoned // failed while this run waited
		}
	}
	e.cpu.enter()
	for i, s := range src {
		if i > 0 {
			e.cpu.yield()
		}
		if shards[i] != nil {
			crcs[i] = format.Checksum(shards[i])
			continue
		}
		b := e.pool.Get(int(stride))
		n := s.gather(b)
		clear(b[n:])
		bounce = append(bounce, b)
		shards[i], crcs[i] = b, format.Checksum(b[:n])
	}
	e.cpu.leave()
	if err := b.WriteRun(shard, shards, crcs); err != nil {
		return wrapIO(err)
	}
	return nil
}

// layerBatchFailed reports whether lb has failed.
func (e *Engine) layerBatchFailed(lb *layerBatch) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return lb.failed != nil
}

// commitLayerBatch commits every chunk of lb (every layer is written) for task t, which
// completes with each block's outcome, and ends lb.
func (e *Engine) commitLayerBatch(lb *layerBatch, t *Task) {
	errs := make([]error, len(lb.ids))
	// The chunks together: one commit submission and one flush per segment, not one each.
	for c, err := range wal.CommitBatches(lb.chunks) {
		if err != nil {
			for k := c * lb.per; k < c*lb.per+lb.chunks[c].Blocks(); k++ {
				errs[k] = blockErr(wrapIO(err), lb.ids[k], "dump")
			}
		}
	}
	e.mu.Lock()
	e.endLayerBatchLocked(lb, errs)
	delete(e.mu.batches, lb.key)
	e.mu.Unlock()
	var stored int64
	for i, err := range errs {
		t.errs[i] = err
		if err == nil {
			stored++
		}
	}
	e.stats.dumpedBlocks.Add(stored)
	e.stats.dumpedBytes.Add(stored * e.opts.Layout.BlockBytes())
	e.stats.batchRecords.Add(int64(len(lb.chunks)))
}

// endLayerBatchLocked finishes lb's in-flight entries with errs (nil: every block stored).
func (e *Engine) endLayerBatchLocked(lb *layerBatch, errs []error) {
	if lb.done {
		return
	}
	lb.done = true
	for i, id := range lb.ids {
		if e.mu.inflight[id] == lb.flights[i] {
			delete(e.mu.inflight, id)
		}
		var err error
		if errs != nil {
			err = errs[i]
		}
		lb.flights[i].finish(err)
	}
}

// failLayerBatchLocked fails lb with cause: its records are abandoned (dead bytes), dumps
// waiting for its blocks get ErrBlockFailed, and it stays as a tombstone that fails its other
// layers until each was tried (or TaskTimeout passed).
func (e *Engine) failLayerBatchLocked(lb *layerBatch, cause error) {
	if lb.failed != nil {
		return
	}
	lb.failed = cause
	for _, b := range lb.chunks {
		b.AbandonBatch()
	}
	errs := make([]error, len(lb.ids))
	for i, id := range lb.ids {
		errs[i] = batchBlockErr(id, cause)
	}
	e.endLayerBatchLocked(lb, errs)
	e.stats.failedBlocks.Add(int64(len(lb.ids)))
	e.retireLayerBatchLocked(lb)
}

// batchBlockErr is the error of block id when its layer-wise batch failed with cause: the
// root cause, whichever layer met it, so errors.Is finds its kind (ErrTimeout, ErrNoSpace,
// ErrIO, ...) as well as ErrBlockFailed.
func batchBlockErr(id BlockID, cause error) error {
	return fmt.Errorf("block %s: not stored, its layer-wise batch failed: %w: %w", id, cause, ErrBlockFailed)
}

// retireLayerBatchLocked forgets a failed lb once every layer has been tried.
func (e *Engine) retireLayerBatchLocked(lb *layerBatch) {
	if lb.tried >= e.opts.Layout.Shards && e.mu.batches[lb.key] == lb {
		delete(e.mu.batches, lb.key)
	}
}

// expireLayerBatchesLocked fails the layer batches older than TaskTimeout (the janitor) or
// all of them (Close) with cause.
func (e *Engine) expireLayerBatchesLocked(now time.Time, all bool, cause func(id BlockID) error) {
	for key, lb := range e.mu.batches {
		if lb.committing || (!all && now.Sub(lb.created) <= e.opts.TaskTimeout) {
			continue
		}
		if lb.failed == nil {
			select {
			case <-lb.ready:
			default:
				continue // still reserving: its opener fails or finishes it
			}
			e.failLayerBatchLocked(lb, cause(lb.ids[0]))
			e.stats.stagingExpired.Add(int64(len(lb.ids)))
		}
		delete(e.mu.batches, key)
	}
}
