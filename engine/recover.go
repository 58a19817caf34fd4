package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ucm-go/ucm/format"
	"slices"
	"strings"

	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// recover brings the segment directory and the index into agreement after a clean shutdown or
// a crash, and returns the number the next new segment gets.
//
//   - temporary files and segment files the index never registered (created just before a
//     crash) are removed;
//   - a registered segment whose file is missing loses its index entries (a miss, never
//     garbage) and its row; a missing sealed segment is reported;
//   - a segment still active (the crash interrupted it) is scanned record by record, truncated
//     after its last valid record, sealed with a footer, and index entries past that point are
//     dropped: it is never appended to again;
//   - an index that is missing (no schema recorded) while segments exist is rebuilt from them.
func (e *Engine) recover(indexLost bool) (uint64, error) {
	names, err := e.fs.List(e.segDir)
	if err != nil {
		return 0, fmt.Errorf("recover %s: %w", e.segDir, err)
	}
	files := map[uint64]bool{}
	var maxNum uint64
	for _, name := range names {
		path := e.fs.PathJoin(e.segDir, name)
		if strings.HasSuffix(name, wal.TempSuffix) {
			if err := e.fs.Remove(path); err != nil {
				return 0, fmt.Errorf("recover: remove %s: %w", path, err)
			}
			e.recovery.OrphansRemoved++
			continue
		}
		n, ok := wal.ParseSegmentFileName(name)
		if !ok {
			e.opts.Logger.Warn("ucm: foreign file in the segment directory left alone", "path", path)
			continue
		}
		files[n] = true
		maxNum = max(maxNum, n)
	}
	if v, ok, err := e.ix.Meta(metaNextSegment); err != nil {
		return 0, err
	} else if ok && len(v) == 8 {
		maxNum = max(maxNum, binary.LittleEndian.Uint64(v)-1)
	}
	rows := e.ix.Segments()
	if indexLost && len(files) > 0 {
		if err := e.rebuild(files); err != nil {
			return 0, err
		}
		return maxNum + 1, nil
	}
	for _, row := range rows {
		maxNum = max(maxNum, row.Number)
		path := wal.SegmentPath(e.segDir, row.Number)
		if !files[row.Number] {
			dropped, err := e.ix.DropSegmentEntries(row.Number, 0, false)
			if err != nil {
				return 0, err
			}
			b := e.ix.NewBatch()
			b.DeleteSegment(row.Number)
			if err := e.ix.Apply(b, true); err != nil {
				return 0, err
			}
			e.recovery.EntriesDropped += dropped
			if row.State == index.SegmentSealed {
				e.recovery.MissingSegments = append(e.recovery.MissingSegments, row.Number)
				e.opts.Logger.Error("ucm: sealed segment missing; its blocks are now misses", "path", path, "blocks_dropped", dropped)
			}
			continue
		}
		delete(files, row.Number)
		if row.State != index.SegmentActive {
			continue
		}
		res, err := wal.RecoverSegment(e.fs, path, e.direct, e.io, false)
		if err != nil {
			var ce *wal.CorruptionError
			if !errors.As(err, &ce) {
				return 0, fmt.Errorf("recover segment %d: %w", row.Number, err)
			}
			// The header itself is unreadable: nothing in the segment can be trusted.
			if err := e.quarantine(row, err); err != nil {
				return 0, err
			}
			continue
		}
		if res.Header.Schema != e.fingerprint || res.Header.Generation != row.Generation {
			if err := e.quarantine(row, fmt.Errorf("%s: header does not match the index (schema or generation)", path)); err != nil {
				return 0, err
			}
			continue
		}
		dropped, err := e.ix.DropSegmentEntries(row.Number, res.ValidEnd, false)
		if err != nil {
			return 0, err
		}
		row.State, row.Size = index.SegmentSealed, res.FileSize
		b := e.ix.NewBatch()
		b.SetSegment(row)
		if err := e.ix.Apply(b, true); err != nil {
			return 0, err
		}
		e.recovery.SegmentsRecovered++
		e.recovery.EntriesDropped += dropped
		e.recovery.TruncatedBytes += res.Truncated
		if res.Stop != nil {
			e.opts.Logger.Warn("ucm: torn tail truncated", "segment", row.Number, "valid_end", res.ValidEnd, "cut", res.Truncated, "stop", res.Stop)
		}
	}
	for n := range files {
		path := wal.SegmentPath(e.segDir, n)
		if err := e.fs.Remove(path); err != nil {
			return 0, fmt.Errorf("recover: remove orphan %s: %w", path, err)
		}
		e.recovery.OrphansRemoved++
		e.opts.Logger.Info("ucm: removed unregistered segment file", "path", path)
	}
	return maxNum + 1, nil
}

// quarantine drops every entry of a segment that cannot be trusted and marks it quarantined;
// the file is kept for inspection.
func (e *Engine) quarantine(row index.SegmentMeta, cause error) error {
	dropped, err := e.ix.DropSegmentEntries(row.Number, 0, false)
	if err != nil {
		return err
	}
	row.State = index.SegmentQuarantined
	if st, err := e.fs.Stat(wal.SegmentPath(e.segDir, row.Number)); err == nil {
		row.Size = st.Size()
	}
	b := e.ix.NewBatch()
	b.SetSegment(row)
	if err := e.ix.Apply(b, true); err != nil {
		return err
	}
	e.recovery.EntriesDropped += dropped
	e.opts.Logger.Error("ucm: segment quarantined", "segment", row.Number, "blocks_dropped", dropped, "err", cause)
	return nil
}

// rebuild recreates the index from the segment files (the index directory was lost): every
// segment is scanned (and sealed if it was active), its records indexed; when a block appears
// more than once the newest record wins.
func (e *Engine) rebuild(files map[uint64]bool) error {
	nums := make([]uint64, 0, len(files))
	for n := range files {
		nums = append(nums, n)
	}
	slices.Sort(nums)
	e.opts.Logger.Warn("ucm: index missing; rebuilding it from segments", "segments", len(nums))
	for _, n := range nums {
		path := wal.SegmentPath(e.segDir, n)
		res, err := wal.RecoverSegment(e.fs, path, e.direct, e.io, true)
		if st, serr := e.fs.Stat(path); serr == nil && st.Size() < format.SegmentHeaderSize {
			// Created just before a crash, header never written: an orphan, not data.
			if err := e.fs.Remove(path); err != nil {
				return fmt.Errorf("rebuild index: remove orphan %s: %w", path, err)
			}
			e.recovery.OrphansRemoved++
			continue
		}
		if err != nil {
			// Registered as quarantined and left in place for inspection (ucm-tool verify
			// reports it; a later Open does not remove it as an orphan); its blocks are misses.
			e.opts.Logger.Error("ucm: segment unreadable or corrupt during rebuild; quarantined", "path", path, "err", err)
			row := index.SegmentMeta{Number: n, Generation: 1, State: index.SegmentQuarantined}
			if res != nil {
				row.Generation = res.Header.Generation
			}
			if st, serr := e.fs.Stat(path); serr == nil {
				row.Size = st.Size()
			}
			b := e.ix.NewBatch()
			b.SetSegment(row)
			if err := e.ix.Apply(b, true); err != nil {
				return fmt.Errorf("rebuild index: quarantine %s: %w", path, err)
			}
			continue
		}
		if res.Header.Schema != e.fingerprint {
			return fmt.Errorf("rebuild index: segment %s was written under another schema: %w", path, ErrSchemaMismatch)
		}
		e.instance = res.Header.Instance
		b := e.ix.NewBatch()
		b.SetSegment(index.SegmentMeta{Number: n, Generation: res.Header.Generation, State: index.SegmentSealed, Size: res.FileSize})
		for i := range res.Records {
			r := &res.Records[i]
			b.Put(r.Header.ID, index.Location{Segment: n, Offset: r.Offset, Layout: r.Header.Layout, Seq: r.Header.Seq,
				HeaderCRC: r.HeaderCRC, ShardCRCs: r.Header.ShardCRCs})
		}
		if err := e.ix.Apply(b, true); err != nil {
			return fmt.Errorf("rebuild index from %s: %w", path, err)
		}
		e.recovery.SegmentsRecovered++
	}
	return nil
}
