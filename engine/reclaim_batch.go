package engine

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Layer-major relocation. Compaction, eviction's demotion and promotion copy live blocks
// forward (relocate). A block of a batch record copied as a record of its own would lose the
// layout that makes a layer-wise load of its request one sequential read per layer: shard i of
// the blocks of a chain would lie a whole block apart. So the live blocks of one source batch
// that move to the same tier are copied together as a new batch record, layer-major again:
// for each layer, shard i of every block is read (adjacent blocks of the source give adjacent
// reads, merged by devio), checked against the index's checksums, and written as one run of
// the new batch, which commits like a dump's (durable before it is published) and is published
// with a compare-and-set per block against the place it was read from.

// minRelocatedBatch is the fewest live blocks of one source batch copied as a batch: a single
// block is copied as a record of its own (a batch of one costs a header and a commit block).
const minRelocatedBatch = 2

// batchGroups splits refs into runs of live blocks of one source batch record that
// relocateBatch copies layer-major into dst, and the rest, which relocate copies record by
// record. Batches are not compressed: into a tier that compresses, every block goes the record
// way.
func (rc *reclaimer) batchGroups(refs []recordRef, dst tiers.Disk) (groups [][]recordRef, rest []recordRef) {
	if rc.cfg.StageLayerWise || dst.Codec() != format.CompressionNone {
		return nil, refs
	}
	type source struct {
		segment uint64
		offset  int64
	}
	byBatch := map[source][]recordRef{}
	var order []source
	for _, r := range refs {
		if r.kind != 0 || !r.loc.IsBatch() || r.loc.Compression != format.CompressionNone || r.loc.Layout != rc.cfg.Layout {
			rest = append(rest, r)
			continue
		}
		k := source{r.loc.Segment, r.loc.Offset}
		if byBatch[k] == nil {
			order = append(order, k)
		}
		byBatch[k] = append(byBatch[k], r)
	}
	for _, k := range order {
		g := byBatch[k]
		if len(g) < minRelocatedBatch {
			rest = append(rest, g...)
			continue
		}
		// Chunks that fit a batch record of dst, in the source's block order (refs of a footer
		// come in it already; demotion's come coldest first), so that the shards of a layer
		// are read in file order and merged where adjacent.
		slices.SortStableFunc(g, func(a, b recordRef) int { return cmp.Compare(a.loc.BatchPos, b.loc.BatchPos) })
		per := rc.env.chunkBlocks(dst, len(g))
		if per < minRelocatedBatch {
			rest = append(rest, g...)
			continue
		}
		// Even chunks: 5 blocks at 4 a record go as 3 and 2, not 4 and a batch of one.
		chunks := (len(g) + per - 1) / per
		size := (len(g) + chunks - 1) / chunks
		for lo := 0; lo < len(g); lo += size {
			groups = append(groups, g[lo:min(len(g), lo+size)])
		}
	}
	return groups, rest
}

// relocateBatch copies group, live blocks of one source batch record, into a new batch record
// of dst's relocation writer. Blocks that cannot be read are handled as readRecords handles
// them (a broken one dropped from the index, a failed read counted and left where it is). It
// returns the blocks copied and the bytes the new record takes.
func (rc *reclaimer) relocateBatch(group []recordRef, dst tiers.Disk) (int, int64, error) {
	l := rc.cfg.Layout
	src := group[0].loc
	seg, err := rc.env.acquireSegment(src.Segment)
	if err != nil {
		var ce *wal.CorruptionError
		for _, r := range group {
			switch {
			case errors.Is(err, wal.ErrSegmentGone) && rc.movedAway(r):
			case errors.Is(err, wal.ErrSegmentGone) || errors.As(err, &ce):
				_ = rc.dropBrokenRef(r, err)
			default:
				return 0, 0, wrapIO(err)
			}
		}
		return 0, 0, nil
	}
	defer seg.Release()
	n, stride := len(group), l.ShardStride()
	// buf holds the group layer-major, as the new record does: shard i of block k at
	// (i·n + k)·stride.
	buf := rc.pool.Get(n * l.Shards * int(stride))
	defer rc.pool.Put(buf)
	shard := func(i, k int) []byte {
		off := (int64(i)*int64(n) + int64(k)) * stride
		return buf[off : off+stride]
	}
	ops := make([]devio.Op, 0, n*l.Shards)
	for i := 0; i < l.Shards; i++ {
		for k, r := range group {
			ops = append(ops, devio.Op{File: seg.File(), Buf: shard(i, k), Off: r.loc.ShardOffset(i)})
		}
	}
	from := rc.env.tierOf(src.Segment)
	_ = rc.env.submit(ops, func(int) tiers.Disk { return from })
	var good []int // positions in group of the blocks read whole and verified
	for k, r := range group {
		var err error
		for i := 0; i < l.Shards && err == nil; i++ {
			op := ops[i*n+k]
			switch {
			case op.Err != nil:
				err = op.Err
			default:
				s := shard(i, k)
				if got := format.Checksum(s[:l.ShardBytes]); got != r.loc.ShardCRCs[i] {
					err = fmt.Errorf("%w: shard %d: index %#08x, computed %#08x", ErrCorrupt, i, r.loc.ShardCRCs[i], got)
				}
				clear(s[l.ShardBytes:]) // the padding written is zeros, whatever was read
			}
		}
		switch {
		case err == nil:
			good = append(good, k)
		case shortRead(err) && cutShort(seg, r.loc):
			_ = rc.dropBrokenRef(r, truncatedRecord(r.loc, err))
		case errors.Is(err, ErrCorrupt):
			_ = rc.dropBrokenRef(r, err)
		default:
			rc.stats.readErrors.Add(1)
		}
	}
	if len(good) == 0 {
		return 0, 0, nil
	}
	ids := make([]BlockID, len(good))
	origins := make([]*wal.Origin, len(good))
	for j, k := range good {
		r := group[k]
		ids[j] = r.id
		if !isForeign(r.loc.Segment) { // another instance's block: the copy is this instance's own
			origins[j] = &wal.Origin{Segment: r.loc.Segment, Offset: r.loc.Offset}
		}
	}
	b, err := dst.Writer(true).ReserveBatch(ids, l)
	if err != nil {
		return 0, 0, fmt.Errorf("relocate a batch of %d blocks from %s into tier %q: %w", len(ids), ids[0], dst.Name(), wrapIO(err))
	}
	err = b.SetOrigins(origins)
	shards, crcs := make([][]byte, len(good)), make([]uint32, len(good))
	for i := 0; i < l.Shards && err == nil; i++ {
		for j, k := range good {
			shards[j], crcs[j] = shard(i, k), group[k].loc.ShardCRCs[i]
		}
		err = b.WriteRun(i, shards, crcs)
	}
	if err == nil {
		err = b.CommitBatch()
	}
	if err != nil {
		b.AbandonBatch()
		return 0, 0, fmt.Errorf("relocate a batch of %d blocks from %s into tier %q: %w", len(ids), ids[0], dst.Name(), wrapIO(err))
	}
	return len(good), b.Extent(), nil
}
