package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// recover brings the segment directory and the index into agreement after a clean shutdown or
// a crash, and returns the number the next new segment gets.
//
//   - the log's temporary files (a segment name plus wal.TempSuffix) are removed;
//   - a registered segment whose file is missing loses its index entries (a miss, never
//     garbage) and its row; a missing sealed segment is reported;
//   - a segment still active (the crash interrupted it) is scanned record by record, truncated
//     after its last valid record, sealed with a footer, and index entries past that point are
//     dropped: it is never appended to again; one without a valid record is deleted;
//   - a segment file the index does not register is adopted: a file without a header (created
//     just before a crash, never written: wal.ErrNoHeader) is removed; otherwise it is
//     recovered like an active one and its records indexed where the index has nothing newer.
//     This rebuilds a lost index from the segments, and never deletes data an index that lost
//     its tail forgot.
func (e *Engine) recover(indexLost bool) (uint64, error) {
	files, maxNum, err := e.listSegments(true)
	if err != nil {
		return 0, err
	}
	if v, ok, err := e.ix.Meta(metaNextSegment); err != nil {
		return 0, err
	} else if ok && len(v) == 8 {
		maxNum = max(maxNum, binary.LittleEndian.Uint64(v)-1)
	}
	for _, row := range e.ix.Segments() {
		maxNum = max(maxNum, row.Number)
		if row.State == index.SegmentDeleting {
			// Retired before the crash: finish the deletion (its entries are gone already).
			if err := e.finishDeleting(row, files[row.Number]); err != nil {
				return 0, err
			}
			delete(files, row.Number)
			continue
		}
		if files[row.Number] {
			delete(files, row.Number)
			switch {
			case row.State == index.SegmentActive:
				if err := e.recoverActive(row, false); err != nil {
					return 0, err
				}
			case row.State == index.SegmentSealed && e.truncated(row):
				// Cut short since it was sealed (a copy, a full disk, an operator): its records
				// past the cut are lost, the ones before are intact. Seal it again after them.
				e.recovery.TruncatedSegments = append(e.recovery.TruncatedSegments, row.Number)
				if err := e.recoverActive(row, true); err != nil {
					return 0, err
				}
			}
			continue
		}
		if err := e.checkDroppedPaths(row); err != nil {
			return 0, err
		}
		if err := e.forgetMissing(row); err != nil {
			return 0, err
		}
	}
	unregistered := make([]uint64, 0, len(files))
	for n := range files {
		unregistered = append(unregistered, n)
	}
	slices.Sort(unregistered) // oldest first: a newer record of a block wins
	if indexLost && len(unregistered) > 0 {
		e.opts.Logger.Warn("ucm: index missing; rebuilding it from segments", "segments", len(unregistered))
	}
	for _, n := range unregistered {
		if err := e.adopt(n, indexLost); err != nil {
			return 0, err
		}
	}
	if err := e.indexPendingRecovered(); err != nil {
		return 0, err
	}
	return maxNum + 1, nil
}

// indexPendingRecovered indexes the sidecars recovery met before their block, now that every
// segment was scanned; the index refuses those whose block is not there.
func (e *Engine) indexPendingRecovered() error {
	if len(e.pendingRecovered) == 0 {
		return nil
	}
	b := e.ix.NewBatch()
	for _, r := range e.pendingRecovered {
		if cur, ok, err := e.ix.GetSidecar(r.id, r.kind); err != nil {
			return err
		} else if ok && cur.Seq >= r.loc.Seq {
			continue
		}
		b.PutSidecar(r.id, r.kind, r.loc)
	}
	e.pendingRecovered = nil
	return e.ix.Apply(b, true)
}

// listSegments finds the segment files of every disk tier, records where each lives and
// returns them with the highest number seen. With cleanup, the log's temporary files are
// removed. A number found in two directories is refused: the paths belong to different stores.
func (e *Engine) listSegments(cleanup bool) (map[uint64]bool, uint64, error) {
	files := map[uint64]bool{}
	var maxNum uint64
	for _, t := range e.tiers {
		for _, dir := range t.Dirs() {
			names, err := e.fs.List(dir)
			if err != nil {
				return nil, 0, fmt.Errorf("recover %s: %w", dir, err)
			}
			for _, name := range names {
				path := e.fs.PathJoin(dir, name)
				if base, ok := strings.CutSuffix(name, wal.TempSuffix); ok {
					if _, ours := wal.ParseSegmentFileName(base); ours && cleanup {
						if err := e.fs.Remove(path); err != nil {
							return nil, 0, fmt.Errorf("recover: remove %s: %w", path, err)
						}
						e.recovery.OrphansRemoved++
						continue
					}
				}
				if _, ok := wal.ParseRecycleFileName(name); ok {
					// Pooled (or deleted) once the tiers are accounted: poolFound.
					e.foundRecycled = append(e.foundRecycled, foundFile{tier: t, dir: dir, path: path})
					continue
				}
				n, ok := wal.ParseSegmentFileName(name)
				if !ok {
					e.opts.Logger.Warn("ucm: foreign file in the segment directory left alone", "path", path)
					continue
				}
				if files[n] {
					other, _ := e.home(n)
					return nil, 0, fmt.Errorf("open %s: segment %d found in both %s and %s (tier paths shared by two stores?): %w", e.dir, n, other.dir, dir, ErrCorrupt)
				}
				files[n] = true
				maxNum = max(maxNum, n)
				e.segs.setHome(n, segHome{tier: t, dir: dir})
			}
		}
	}
	return files, maxNum, nil
}

// findSegments records where every segment lives, for read-only opens.
func (e *Engine) findSegments() error {
	_, _, err := e.listSegments(false)
	return err
}

// finishDeleting completes the retirement of a segment interrupted by a crash.
func (e *Engine) finishDeleting(row index.SegmentMeta, exists bool) error {
	if _, err := e.deleteSegment(row, exists); err != nil {
		return err
	}
	e.recovery.RetiredSegmentsDeleted++
	return nil
}

// deleteSegment drops a segment's index entries, unlinks its file (if it exists) and syncs
// the directory, then forgets its row; it returns the entries dropped. A crash after the
// unlink leaves a row without a file, which the next recovery forgets.
func (e *Engine) deleteSegment(row index.SegmentMeta, exists bool) (int, error) {
	dropped, err := e.ix.DropSegmentEntries(row.Number, 0, false)
	if err != nil {
		return 0, err
	}
	if exists {
		h, _ := e.home(row.Number)
		if err := e.fs.Remove(wal.SegmentPath(h.dir, row.Number)); err != nil && !isNotExist(err) {
			return 0, fmt.Errorf("recover: delete segment %d: %w", row.Number, err)
		}
		if err := wal.SyncDir(e.fs, h.dir); err != nil {
			return 0, fmt.Errorf("recover: %w", err)
		}
		e.segs.forgetHome(row.Number)
	}
	b := e.ix.NewBatch()
	b.DeleteSegment(row.Number)
	if err := e.ix.Apply(b, true); err != nil {
		return 0, fmt.Errorf("recover: forget segment %d: %w", row.Number, err)
	}
	return dropped, nil
}

// forgetMissing drops a registered segment whose file is gone.
func (e *Engine) forgetMissing(row index.SegmentMeta) error {
	dropped, err := e.ix.DropSegmentEntries(row.Number, 0, false)
	if err != nil {
		return err
	}
	b := e.ix.NewBatch()
	b.DeleteSegment(row.Number)
	if err := e.ix.Apply(b, true); err != nil {
		return err
	}
	e.recovery.EntriesDropped += dropped
	if row.State == index.SegmentSealed {
		e.recovery.MissingSegments = append(e.recovery.MissingSegments, row.Number)
		e.opts.Logger.Error("ucm: sealed segment missing; its blocks are now misses",
			"path", e.segPath(row.Number), "blocks_dropped", dropped)
	}
	return nil
}

// truncated reports whether sealed segment row's file is shorter than the size recorded when
// it was sealed.
func (e *Engine) truncated(row index.SegmentMeta) bool {
	size := e.fileSize(e.segPath(row.Number))
	if size < 0 || size >= row.Size {
		return false
	}
	e.opts.Logger.Warn("ucm: sealed segment shorter than recorded; records past its end are lost", "segment", row.Number,
		"path", e.segPath(row.Number), "size", size, "recorded", row.Size)
	return true
}

// recoverActive seals a segment at its last valid record: one that was active at a crash, or
// (wasSealed) a sealed one found truncated, whose footer went with its tail.
func (e *Engine) recoverActive(row index.SegmentMeta, wasSealed bool) error {
	path := e.segPath(row.Number)
	// The seal never completed, so a footer found here is not authoritative: trustFooter false.
	res, err := wal.RecoverSegment(e.fs, path, row.Number, e.tierOf(row.Number).Direct(), e.tierOf(row.Number).Backend(), false)
	if errors.Is(err, wal.ErrNoHeader) || e.recycledUnwritten(res, err) {
		// Created (or reusing a recycled file), its header (written with the first records)
		// never written: nothing in it was acknowledged.
		return e.deleteEmpty(row)
	}
	if err != nil {
		var ce *wal.CorruptionError
		if !errors.As(err, &ce) {
			return fmt.Errorf("recover segment %d: %w", row.Number, err)
		}
		return e.quarantine(row, err) // the header itself is unreadable
	}
	if res.Header.Schema != e.fingerprint || res.Header.Generation != row.Generation {
		return e.quarantine(row, fmt.Errorf("%s: header does not match the index (schema or generation)", path))
	}
	for _, skipped := range res.Skipped {
		// A layer-wise dump's batch record whose commit never reached the disk (the crash came
		// before its last layer), or whose bytes no longer check: nothing was acknowledged from
		// it unless it rotted, and then loads of its blocks report them corrupt.
		e.opts.Logger.Warn("ucm: recovery passed over a batch record without a valid commit; its extent is dead space", "err", skipped)
	}
	if len(res.Records) == 0 {
		// Nothing in it survived: the dump writer's prepared next segment, or one whose first
		// records were never made durable. Delete it rather than keep an empty sealed segment.
		return e.deleteEmpty(row)
	}
	dropped, err := e.ix.DropSegmentEntries(row.Number, res.ValidEnd, false)
	if err != nil {
		return err
	}
	row.State, row.Size = index.SegmentSealed, res.FileSize
	b := e.ix.NewBatch()
	b.SetSegment(row)
	// Records in the valid part that the index lacks (their index batch was lost with the tail
	// of Pebble's WAL) are intact: index them again rather than leave them as dead space.
	readopted, err := e.indexRecords(b, row.Number, res)
	if err != nil {
		return err
	}
	if err := e.ix.Apply(b, true); err != nil {
		return err
	}
	e.recovery.EntriesAdopted += readopted
	if !wasSealed {
		e.recovery.SegmentsRecovered++
	}
	e.recovery.EntriesDropped += dropped
	e.recovery.TruncatedBytes += res.Truncated
	if res.Stop != nil {
		e.opts.Logger.Warn("ucm: torn tail truncated", "segment", row.Number, "valid_end", res.ValidEnd, "cut", res.Truncated, "stop", res.Stop)
	}
	return nil
}

// recycledUnwritten reports whether a recovery's error is wal.ErrStaleHeader for a recycled
// file whose new header never reached the disk: its header names a segment that is retired
// (no row, or marked deleting). A file naming a live segment is not one (a copy of a segment
// file under another name, say): it is corruption, quarantined and kept for inspection.
func (e *Engine) recycledUnwritten(res *wal.ScanResult, err error) bool {
	if !errors.Is(err, wal.ErrStaleHeader) || res == nil {
		return false
	}
	row, ok := e.ix.Segment(res.Header.Number)
	return !ok || row.State == index.SegmentDeleting
}

// deleteEmpty deletes an active segment in which no record survived.
func (e *Engine) deleteEmpty(row index.SegmentMeta) error {
	dropped, err := e.deleteSegment(row, true)
	if err != nil {
		return err
	}
	e.recovery.EmptySegmentsDeleted++
	e.recovery.EntriesDropped += dropped
	return nil
}

// quarantine drops every entry of a segment that cannot be trusted and marks it quarantined;
// the file is kept for inspection.
func (e *Engine) quarantine(row index.SegmentMeta, cause error) error {
	dropped, err := e.ix.DropSegmentEntries(row.Number, 0, false)
	if err != nil {
		return err
	}
	row.State = index.SegmentQuarantined
	if st, err := e.fs.Stat(e.segPath(row.Number)); err == nil {
		row.Size = st.Size()
	}
	b := e.ix.NewBatch()
	b.SetSegment(row)
	if err := e.ix.Apply(b, true); err != nil {
		return err
	}
	e.recovery.EntriesDropped += dropped
	e.recovery.QuarantinedSegments = append(e.recovery.QuarantinedSegments, row.Number)
	e.opts.Logger.Error("ucm: segment quarantined", "segment", row.Number, "blocks_dropped", dropped, "err", cause)
	return nil
}

// adopt registers a segment file the index does not know. Its seal state is unknown, so a
// footer is trusted: a file with a valid footer and an invalid record is corruption
// (quarantined, never cut); a file without one is recovered like an active segment. Its records
// are indexed unless the index holds a newer record of the block. With indexLost, a segment of
// another schema means the whole store is foreign: ErrSchemaMismatch.
func (e *Engine) adopt(n uint64, indexLost bool) error {
	path := e.segPath(n)
	res, err := wal.RecoverSegment(e.fs, path, n, e.tierOf(n).Direct(), e.tierOf(n).Backend(), true)
	if errors.Is(err, wal.ErrNoHeader) || e.recycledUnwritten(res, err) {
		// Created just before a crash, its header never written (zeros, a file shorter than a
		// header, or a recycled file still naming the retired segment): not data.
		return e.removeOrphan(n, path)
	}
	if err == nil && res.Header.Schema != e.fingerprint {
		if indexLost {
			return fmt.Errorf("rebuild index: segment %s was written under another schema: %w", path, ErrSchemaMismatch)
		}
		err = fmt.Errorf("%s: written under another schema: %w", path, ErrSchemaMismatch)
	}
	if err != nil {
		var ce *wal.CorruptionError
		if !errors.As(err, &ce) && !errors.Is(err, ErrSchemaMismatch) {
			return fmt.Errorf("recover: adopt %s: %w", path, err)
		}
		row := index.SegmentMeta{Number: n, Generation: 1, State: index.SegmentQuarantined}
		if res != nil {
			row.Generation = res.Header.Generation
		}
		return e.quarantine(row, err)
	}
	if indexLost && e.instance == (format.InstanceID{}) {
		e.instance = res.Header.Instance
	}
	b := e.ix.NewBatch()
	b.SetSegment(index.SegmentMeta{Number: n, Generation: res.Header.Generation, State: index.SegmentSealed, Size: res.FileSize})
	indexed, err := e.indexRecords(b, n, res)
	if err != nil {
		return err
	}
	if err := e.ix.Apply(b, true); err != nil {
		return fmt.Errorf("recover: adopt %s: %w", path, err)
	}
	e.recovery.SegmentsAdopted++
	e.recovery.EntriesAdopted += indexed
	e.recovery.TruncatedBytes += res.Truncated
	e.opts.Logger.Warn("ucm: adopted a segment the index did not register", "path", path, "records", len(res.Records), "indexed", indexed)
	return nil
}

// removeOrphan deletes the file of segment n, which the index does not know and which holds no
// header.
func (e *Engine) removeOrphan(n uint64, path string) error {
	if err := e.fs.Remove(path); err != nil {
		return fmt.Errorf("recover: remove orphan %s: %w", path, err)
	}
	e.segs.forgetHome(n)
	e.recovery.OrphansRemoved++
	return nil
}

// scannedLocation is the index location of a record (or block of a batch record) a scan of
// segment n found, or of a sealed segment's footer listed (wal.ReadSealedRecords).
func scannedLocation(n uint64, r *wal.ScannedRecord) index.Location {
	return share.ScannedLocation(n, r)
}

// indexRecords adds to b an entry for every scanned record of segment n whose block the index
// does not hold at all or holds an older record of, and returns how many it added.
func (e *Engine) indexRecords(b *index.Batch, n uint64, res *wal.ScanResult) (int, error) {
	added := 0
	// Blocks first, then sidecars: a sidecar is indexed only beside its block, and compaction
	// may have copied a sidecar ahead of its block.
	order := make([]int, 0, len(res.Records))
	for pass := range 2 {
		for i := range res.Records {
			if (res.Records[i].Header.Kind != 0) == (pass == 1) {
				order = append(order, i)
			}
		}
	}
	inSegment := map[BlockID]bool{}
	for _, i := range order {
		r := &res.Records[i]
		if r.Header.Kind == 0 {
			inSegment[r.Header.ID] = true
		}
		cur, ok, err := e.entry(r.Header.ID, r.Header.Kind)
		if err != nil {
			return added, err
		}
		if ok && cur.Seq >= r.Header.Seq {
			continue
		}
		loc := scannedLocation(n, r)
		switch {
		case r.Header.Kind != 0 && !inSegment[r.Header.ID] && !e.ix.Contains(r.Header.ID):
			// Its block is in a segment not indexed yet (compaction copied the sidecar ahead of
			// it): indexed at the end of recovery, beside the block if it is there by then.
			e.pendingRecovered = append(e.pendingRecovered, recordRef{r.Header.ID, r.Header.Kind, loc})
			continue
		case r.Header.Kind != 0:
			// After the blocks' puts in the batch; indexed only if its block is (the index
			// refuses an orphan).
			b.PutSidecar(r.Header.ID, r.Header.Kind, loc)
		default:
			b.Put(r.Header.ID, loc)
		}
		added++
	}
	return added, nil
}
