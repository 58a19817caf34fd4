package share

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Segment summaries (format.Summary, docs/sharing.md "Start-up"): the owner of a shared
// segment writes, once it is sealed, a small file listing every record's index entry, in the
// SummaryDir of its namespace. Another instance indexes a published segment from that one file
// (one read) instead of the footer and one record header per record; a summary missing (a
// segment written before summaries existed, or not summarized yet), of another generation, or
// damaged sends it back to the footer and headers. Loads verify every payload against the
// checksums the entry names whatever gave the entry.

// SummaryDir, in a namespace of a shared tier, holds the summaries of the namespace's
// published segments, one file per segment named after it (wal.SegmentFileName +
// format.SummaryExt). Only the namespace's owner writes or removes them.
const SummaryDir = "summaries"

// summaryBudget bounds the time one sharer round spends writing summaries: the rest wait for
// the next round, so publication and refreshes are never held up by a backlog.
const summaryBudget = 200 * time.Millisecond

// progressEvery is the interval of the log line reporting a long indexing of other instances'
// segments.
const progressEvery = 5 * time.Second

// SummaryError reports a segment summary that cannot be used: unreadable, too large, failing
// its checks, or naming another segment, generation, size, owner or schema than its manifest
// entry. It wraps format.ErrCorrupt for damage (errors.Is); the segment is then indexed from
// its footer and record headers.
type SummaryError struct {
	Path    string // the summary file
	Segment uint64 // the segment it was read for
	Err     error
}

func (e *SummaryError) Error() string {
	return fmt.Sprintf("summary %s of segment %d: %v", e.Path, e.Segment, e.Err)
}

// Unwrap returns the cause.
func (e *SummaryError) Unwrap() error { return e.Err }

// SummaryPath is the summary of segment n of the namespace at nsDir.
func SummaryPath(nsDir string, n uint64) string {
	return filepath.Join(nsDir, SummaryDir, wal.SegmentFileName(n)+format.SummaryExt)
}

// ReadSummary reads and checks the summary of published segment ent of instance inst, whose
// segment directory is segDir, in one read, and returns its records as a footer-and-headers
// read would. A missing file is an error wrapping os.ErrNotExist; any other failure a
// *SummaryError.
func (s *Sharing) ReadSummary(segDir string, inst format.InstanceID, ent format.ManifestEntry) ([]wal.ScannedRecord, error) {
	path := SummaryPath(filepath.Dir(segDir), ent.Number)
	fail := func(err error) error { return &SummaryError{Path: path, Segment: ent.Number, Err: err} }
	var buf []byte
	err := tiers.ReadReplaced(s.cfg.FS, path, func(f vfs.File) error {
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if st.Size() < format.SummaryHeaderSize || st.Size() > format.MaxSummaryBytes {
			return fmt.Errorf("%w: %d bytes, not in [%d, %d]", format.ErrCorrupt, st.Size(), format.SummaryHeaderSize, format.MaxSummaryBytes)
		}
		buf = make([]byte, st.Size()) // bounded above
		if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return nil
	})
	if oserror.IsNotExist(err) {
		return nil, fmt.Errorf("summary %s: %w", path, os.ErrNotExist)
	}
	if err != nil {
		return nil, fail(err)
	}
	sum, err := format.DecodeSummary(buf)
	if err != nil {
		return nil, fail(err)
	}
	switch {
	case sum.Segment != ent.Number:
		return nil, fail(fmt.Errorf("%w: summarizes segment %d", format.ErrCorrupt, sum.Segment))
	case sum.Generation != ent.Generation || sum.Size != ent.Size:
		return nil, fail(fmt.Errorf("%w: summarizes generation %#x of %d bytes, the manifest lists generation %#x of %d bytes",
			errStaleSummary, sum.Generation, sum.Size, ent.Generation, ent.Size))
	case sum.Instance != inst:
		return nil, fail(fmt.Errorf("%w: names instance %x", format.ErrCorrupt, sum.Instance))
	case sum.Schema != s.env.Fingerprint() && !s.cfg.LookupOnly:
		return nil, fail(fmt.Errorf("%w: written under another schema", format.ErrCorrupt))
	}
	return summaryRecords(sum), nil
}

// errStaleSummary: a summary of another generation of the segment number (the number was
// reused and the new one is not summarized yet): not damage.
var errStaleSummary = errors.New("stale summary")

// summaryRecords turns a summary's entries into the records indexForeign indexes.
func summaryRecords(sum *format.Summary) []wal.ScannedRecord {
	recs := make([]wal.ScannedRecord, len(sum.Entries))
	for i := range sum.Entries {
		se := &sum.Entries[i]
		recs[i] = wal.ScannedRecord{Header: format.RecordHeader{Type: se.Type, Kind: se.Kind, ID: se.ID, Segment: sum.Segment,
			Generation: sum.Generation, Seq: se.Seq, Layout: se.Layout, ShardCRCs: se.ShardCRCs, Compression: se.Compression,
			StoredLens: se.StoredLens, StoredCRCs: se.StoredCRCs}, Offset: se.Offset, HeaderCRC: se.HeaderCRC,
			BatchBlocks: se.BatchBlocks, BatchPos: se.BatchPos}
	}
	return recs
}

// summaryEntries is summaryRecords' inverse.
func summaryEntries(recs []wal.ScannedRecord) []format.SummaryEntry {
	out := make([]format.SummaryEntry, len(recs))
	for i := range recs {
		r := &recs[i]
		out[i] = format.SummaryEntry{ID: r.Header.ID, Offset: r.Offset, Seq: r.Header.Seq, HeaderCRC: r.HeaderCRC, Type: r.Header.Type,
			Kind: r.Header.Kind, Layout: r.Header.Layout, Compression: r.Header.Compression, ShardCRCs: r.Header.ShardCRCs,
			StoredLens: r.Header.StoredLens, StoredCRCs: r.Header.StoredCRCs, BatchBlocks: r.BatchBlocks, BatchPos: r.BatchPos}
		if r.Header.Compression == format.CompressionNone {
			out[i].StoredLens, out[i].StoredCRCs = nil, nil
		}
	}
	return out
}

// foreignRecords returns the records of published segment ent of instance inst: from its
// summary when there is one that checks and agrees with the segment's footer, else from its
// footer and record headers. The segment's header must name the segment, the instance and
// this store's schema either way.
func (s *Sharing) foreignRecords(t tiers.Disk, segDir string, inst format.InstanceID, ent format.ManifestEntry) ([]wal.ScannedRecord, error) {
	recs, sumErr := s.ReadSummary(segDir, inst, ent)
	seg, err := wal.OpenSegmentForRead(s.cfg.FS, segDir, ent.Number, ent.Generation, t.Direct(), t.Backend())
	if err != nil {
		return nil, err
	}
	defer seg.Release()
	if info := seg.Info(); info.Instance != inst || (info.Schema != s.env.Fingerprint() && !s.cfg.LookupOnly) {
		return nil, fmt.Errorf("segment %s: header names instance %x and another schema or owner: %w", seg.Path(), info.Instance, format.ErrCorrupt)
	}
	if sumErr == nil {
		// The footer binds every record's block id, place, sequence number and header
		// checksum: a summary that names another is refused.
		entries, err := wal.ReadFooter(seg, ent.Size, t.Backend())
		if err != nil {
			return nil, err
		}
		if sumErr = SummaryMatchesFooter(recs, entries); sumErr == nil {
			s.fromSummary.Add(1)
			return recs, nil
		}
		sumErr = &SummaryError{Path: SummaryPath(filepath.Dir(segDir), ent.Number), Segment: ent.Number, Err: sumErr}
	}
	if !errors.Is(sumErr, os.ErrNotExist) && !errors.Is(sumErr, errStaleSummary) {
		s.summaryDamaged.Add(1)
		s.cfg.Logger.Warn("ucm: segment summary unusable; indexing the segment from its footer and record headers", "err", sumErr)
	}
	recs, err = wal.ReadSealedRecords(seg, ent.Size, t.Backend())
	if err == nil {
		s.fromHeaders.Add(1)
	}
	return recs, err
}

// SummaryMatchesFooter checks a summary's records against the footer of their segment: each
// footer entry is one record of the summary, in order, with its block id, offset, sequence
// number, header checksum, type, kind and length (what the layout and stored lengths the
// summary names make); a batch entry is the batch's blocks, positions 0 to
// N-1 at its offset with its header checksum, block 0 its id, sequence numbers consecutive
// from its own. A mismatch wraps format.ErrCorrupt naming the entry.
func SummaryMatchesFooter(recs []wal.ScannedRecord, entries []format.FooterEntry) error {
	i := 0
	for k, fe := range entries {
		if i >= len(recs) {
			return fmt.Errorf("%w: footer entry %d (%s) at %d: not in the summary", format.ErrCorrupt, k, fe.ID, fe.Offset)
		}
		r := &recs[i]
		n := 1
		if fe.Type == format.RecordBatch {
			n = r.BatchBlocks
		}
		length := r.Header.RecordBytes() // the layout and stored lengths the summary names
		if fe.Type == format.RecordBatch {
			l := r.Header.Layout
			length = format.BatchHeaderSize(n) + int64(l.Shards)*int64(n)*l.ShardStride() + format.BatchCommitSize(n, l.Shards)
		}
		if r.Header.ID != fe.ID || r.Offset != fe.Offset || r.Header.Seq != fe.Seq || r.HeaderCRC != fe.HeaderCRC || length != fe.Length ||
			r.Header.Type != fe.Type || r.Header.Kind != fe.Kind || (fe.Type == format.RecordBatch && r.BatchPos != 0) || n < 1 || i+n > len(recs) {
			return fmt.Errorf("%w: summary entry %d (%s at %d) does not match footer entry %d (%s at %d)", format.ErrCorrupt, i, r.Header.ID, r.Offset, k, fe.ID, fe.Offset)
		}
		for b := 1; b < n; b++ {
			o := &recs[i+b]
			if o.Header.Type != format.RecordBatch || o.Offset != fe.Offset || o.HeaderCRC != fe.HeaderCRC || o.BatchBlocks != n ||
				o.BatchPos != b || o.Header.Seq != fe.Seq+uint64(b) || o.Header.Layout != r.Header.Layout {
				return fmt.Errorf("%w: summary entry %d (%s) is not block %d of the batch at %d", format.ErrCorrupt, i+b, o.Header.ID, b, fe.Offset)
			}
		}
		i += n
	}
	if i != len(recs) {
		return fmt.Errorf("%w: summary lists %d records the footer does not", format.ErrCorrupt, len(recs)-i)
	}
	return nil
}

// noteIndexed counts a foreign segment of n records just indexed and, during a long
// indexing, logs its progress every progressEvery.
func (s *Sharing) noteIndexed(n int) {
	s.indexedRecords.Add(int64(n))
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.progressAt.IsZero() {
		s.progressAt, s.progressRecs = now, s.indexedRecords.Load()
		return
	}
	if now.Sub(s.progressAt) < progressEvery {
		return
	}
	recs := s.indexedRecords.Load()
	rate := float64(recs-s.progressRecs) / now.Sub(s.progressAt).Seconds()
	s.progressAt, s.progressRecs = now, recs
	listed := 0
	for _, n := range s.listedByNS {
		listed += n
	}
	s.cfg.Logger.Info("ucm: indexing other instances' segments", "indexed", len(s.segs), "listed", listed,
		"from_summary", s.fromSummary.Load(), "from_headers", s.fromHeaders.Load(), "records_per_s", int64(rate))
}

// forgetListedCounts drops the progress counts of the namespaces under root that are gone
// (not in present).
func (s *Sharing) forgetListedCounts(root string, present map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nsDir := range s.listedByNS {
		if !present[nsDir] && filepath.Dir(nsDir) == filepath.Join(root, tiers.InstancesDir) {
			delete(s.listedByNS, nsDir)
		}
	}
}

// WriteSummaries writes the summary of every sealed segment of this instance on a shared tier
// that has none yet, within summaryBudget (the rest at the next round). A summary already on
// disk for the segment's generation is kept. A summary is built from the sealed segment as a
// reader sees it (footer and record headers, checked), so it never says more than the segment.
func (s *Sharing) WriteSummaries() {
	if s == nil || s.cfg.ReadOnly {
		return
	}
	deadline := time.Now().Add(summaryBudget)
	for _, row := range s.env.OwnSegments() {
		if row.State != index.SegmentSealed {
			continue
		}
		h, ok := s.env.Home(row.Number)
		if !ok || h.Tier == nil || !h.Tier.Shared() {
			continue
		}
		s.mu.Lock()
		gen, done := s.summarized[row.Number]
		s.mu.Unlock()
		if done && gen == row.Generation {
			continue
		}
		if time.Now().After(deadline) {
			return
		}
		if err := s.writeSummary(h, row); err != nil {
			// Readers index the segment from its footer and headers; not retried until the
			// next Open (a segment that cannot be read back will fail them too).
			s.cfg.Logger.Warn("ucm: could not write a segment summary; other instances read its record headers instead",
				"segment", row.Number, "err", err)
		}
		s.mu.Lock()
		s.summarized[row.Number] = row.Generation
		s.mu.Unlock()
	}
}

// writeSummary writes the summary of own sealed segment row, in home h, unless one of its
// generation is there.
func (s *Sharing) writeSummary(h Home, row index.SegmentMeta) error {
	nsDir := filepath.Dir(h.Dir)
	ent := format.ManifestEntry{Number: row.Number, Generation: row.Generation, Size: row.Size}
	if _, err := s.ReadSummary(h.Dir, s.env.Instance(), ent); err == nil {
		return nil
	}
	seg, err := wal.OpenSegmentForRead(s.cfg.FS, h.Dir, row.Number, row.Generation, h.Tier.Direct(), h.Tier.Backend())
	if err != nil {
		return err
	}
	defer seg.Release()
	recs, err := wal.ReadSealedRecords(seg, row.Size, h.Tier.Backend())
	if err != nil {
		return err
	}
	enc, err := format.EncodeSummary(&format.Summary{Instance: s.env.Instance(), Schema: s.env.Fingerprint(), Segment: row.Number,
		Generation: row.Generation, Size: row.Size, Entries: summaryEntries(recs)})
	if err != nil {
		return err
	}
	if err := tiers.MkdirAllStale(s.cfg.FS, filepath.Join(nsDir, SummaryDir), 0o755); err != nil {
		return err
	}
	path := SummaryPath(nsDir, row.Number)
	return wal.ReplaceFile(s.cfg.FS, path, path+".tmp", enc)
}

// PruneSummaries removes the summaries in the namespace at nsDir of segments its manifest no
// longer lists (retired, reclaimed, or a leftover .tmp), after a manifest without them was
// written.
func (s *Sharing) PruneSummaries(nsDir string, listed []format.ManifestEntry) {
	dir := filepath.Join(nsDir, SummaryDir)
	names, err := s.cfg.FS.List(dir)
	if err != nil {
		return // none written yet
	}
	keep := make(map[uint64]bool, len(listed))
	for _, ent := range listed {
		keep[ent.Number] = true
	}
	for _, name := range names {
		n, ok := wal.ParseSegmentFileName(strings.TrimSuffix(name, format.SummaryExt))
		if ok && keep[n] && strings.HasSuffix(name, format.SummaryExt) {
			continue
		}
		if err := s.cfg.FS.Remove(filepath.Join(dir, name)); err != nil && !oserror.IsNotExist(err) {
			s.cfg.Logger.Warn("ucm: could not remove a segment summary", "path", filepath.Join(dir, name), "err", err)
			continue
		}
		if ok {
			s.mu.Lock()
			delete(s.summarized, n)
			s.mu.Unlock()
		}
	}
}
