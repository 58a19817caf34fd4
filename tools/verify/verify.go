// Package verify checks a UCM-Go store offline: every record, checksum and index entry, on
// any file system (the operating system's or an in-memory one in tests). ucm-tool verify,
// stats and inspect are built on it, and crash tests run Store on a recovered file system to
// check that recovery left a clean store.
//
// Store reads every record of every segment and checks every checksum (segment header,
// record headers, every shard, footers of sealed segments), then cross-checks the index and
// the log both ways: every index entry must point at a valid record at that exact offset with
// the same header checksum, sequence number and shard checksums; every registered segment
// must have its file and every segment file must be registered; the segment table's live
// bytes and records must equal what the index entries add up to, and a sealed segment's
// recorded size must equal its file size. Records in the log that the index does not point
// at are dead space (counted, not a problem).
//
// A batch record (docs/format.md §4c) is one record of N blocks: an index entry of one of its
// blocks must match the batch's header and commit block (the id at its position, sequence
// number, header checksum, layout, shard checksums), whose shards are checked against the
// commit block's checksums. A batch that never committed (abandoned, or torn by a crash) is
// dead space, as recovery treats it, and so is one none of whose blocks is indexed. A batch
// whose commit block no longer checks but whose blocks are indexed committed (the index gets
// them only once the commit block is durable): its blocks are checked as a load checks them,
// against their entries' shard checksums, and count as verified when intact; the damaged commit
// block is one problem (docs/format.md §4c).
//
// A store left by a crash (a segment still active, or a segment marked deleting because the
// crash interrupted its retirement) is not corrupt: with Options.Recover, Store first recovers
// it as opening the engine does; without, it changes nothing and reports what recovery will
// do (Report.Pending).
//
// A store with tiers keeps segments under every path of every disk tier; Store finds them all
// through the tier configuration the store recorded (Handle.SegDirs, Handle.SegmentPath).
package verify

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// Options configure Store.
type Options struct {
	// FS is the file system the store is on (default vfs.Default).
	FS vfs.FS
	// Recover recovers a store left by a crash (a segment still active) before verifying it,
	// as ucm-tool verify does by default. Without it Store writes nothing: it reports what
	// recovery will do (Report.Pending) and verifies the rest read-only.
	Recover bool
	// ProgressTotal, if not nil, is called once before the segments are read with the number
	// of bytes Store expects to read (the sizes of the registered segment files).
	ProgressTotal func(total int64)
	// Progress, if not nil, is called with the byte count of every read of a segment file.
	Progress func(bytes int64)
}

// Problem is one finding of Store.
type Problem struct {
	// Segment is the segment the problem is in, 0 for the index as a whole.
	Segment uint64
	// Path is the segment file's path, "" for the index as a whole.
	Path string
	// Offset is where in the segment file the problem is, -1 when not at one place.
	Offset int64
	// Block is the block concerned, zero when none is.
	Block format.BlockID
	// Msg says what is wrong.
	Msg string
}

// String formats p as ucm-tool verify prints it:
// "PROBLEM <segment file> offset <n> block <id>: <msg>", with "index" for the index as a whole
// and without the offset or block when there is none.
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString("PROBLEM ")
	if p.Path == "" {
		b.WriteString("index")
	} else {
		b.WriteString(filepath.Base(p.Path))
	}
	if p.Offset >= 0 {
		fmt.Fprintf(&b, " offset %d", p.Offset)
	}
	if !p.Block.IsZero() {
		fmt.Fprintf(&b, " block %s", p.Block)
	}
	b.WriteString(": ")
	b.WriteString(p.Msg)
	return b.String()
}

// Report is what Store found.
type Report struct {
	// Dir is the store directory and SegDirs its segment directories (Handle.SegDirs).
	Dir     string
	SegDirs []string
	// Segments counts the registered segments: Sealed, Active, Quarantined and Retiring
	// (marked deleting: a retirement a crash interrupted, which recovery finishes) by state;
	// MissingFiles of them have no file. UnregisteredFiles counts segment files the index does
	// not register. RecycledFiles counts retired segment files kept for reuse
	// (engine.Options.RecycleSegments), which hold nothing the index points at.
	Segments, Sealed, Active, Quarantined, Retiring, MissingFiles, UnregisteredFiles, RecycledFiles int
	// Records counts the records read from the log (a batch record once), ValidRecords the
	// valid ones and DeadRecords the valid ones no index entry points at (a batch record none
	// of whose blocks is indexed, or that never committed), DeadBytes bytes on disk.
	Records, ValidRecords, DeadRecords int
	DeadBytes                          int64
	// SidecarEntries counts the index's sidecar entries and SidecarsVerified those whose record
	// and every part checksum were verified.
	SidecarEntries, SidecarsVerified int
	// IndexEntries counts the index's entries and BlocksVerified those whose record and
	// every shard checksum were verified.
	IndexEntries, BlocksVerified int
	// PendingDrops counts index entries past the valid end of an active segment (without
	// Recover), which recovery will drop.
	PendingDrops int
	// BytesRead counts the bytes read from segment files.
	BytesRead int64
	// Problems are the problems found, sorted by segment file and offset; index-wide ones
	// first.
	Problems []Problem
	// Notes are remarks that are not problems (temporary or foreign files in a segment
	// directory, unregistered segment files, segments being retired).
	Notes []string
	// Recovery is what recovery did, when Store recovered the store (Options.Recover and a
	// segment was still active); nil otherwise.
	Recovery *engine.RecoveryReport
	// Pending is what recovery will do, when a segment is still active and Options.Recover is
	// not set or recovery could not run (RecoverySkipped); nil otherwise.
	Pending []*PendingSegment
	// RecoverySkipped is why recovery, asked for (Options.Recover), could not run: the engine
	// opened the store read-only because its file system is full. The store was verified
	// read-only, as without Options.Recover. "" when recovery was not asked for or could run.
	RecoverySkipped string
}

// Clean reports that Store found no problem. A store whose recovery is pending (a torn tail
// of an active segment) is clean: a torn tail is not corruption.
func (r *Report) Clean() bool { return len(r.Problems) == 0 }

// recKey locates a record: segment number and offset.
type recKey struct {
	seg uint64
	off int64
}

// recState is a record found in the log, with what the index says about it.
type recState struct {
	info    RecordInfo
	path    string
	indexed bool
	// indexedBlocks and loadable count, for a batch record whose commit block does not check,
	// the index entries pointing at it and those whose block verified against the entry.
	indexedBlocks, loadable int
}

// Store verifies the store in dir; see the package documentation for what it checks. The
// error is only for a store that cannot be opened or read (missing, not a store, in use by an
// engine, recovery or I/O failure); what is wrong with the store's contents is in the
// report's Problems.
func Store(dir string, opts Options) (*Report, error) {
	h, rec, err := OpenRecovered(dir, opts.FS, opts.Recover)
	if err != nil {
		return nil, err
	}
	defer func() { _ = h.Close() }()
	return h.verify(rec, opts)
}

// verifier is one run of verify over the store h holds open: the report it fills, and what
// each phase found that the next one uses.
type verifier struct {
	h        *Handle
	opts     Options
	r        *Report
	progress func(int64)
	pending  map[uint64]*PendingSegment // active segments as a recovery scan sees them
	onDisk   map[uint64]int64           // segment files: their sizes (-1: unknown)
	rows     []index.SegmentMeta
	// registered are the index's segment rows by number.
	registered map[uint64]index.SegmentMeta
	recs       map[recKey]*recState
	validEnd   map[uint64]int64  // active segments (without Recover): entries at or past it will be dropped
	badHeader  map[uint64]string // sealed segments the engine will not open: why
	unloadable map[uint64]int    // indexed records in segments with a bad header
}

// verify verifies the store h holds open; rec is what recovery did before, if it ran. Its
// phases: what recovery did and what it would do, the segment files on disk, every registered
// segment read and checked, the index checked against the log, the log against the index, and
// the space accounting.
func (h *Handle) verify(rec *engine.RecoveryReport, opts Options) (*Report, error) {
	v := &verifier{h: h, opts: opts, r: &Report{Dir: h.Dir, SegDirs: h.SegDirs, Recovery: rec}, progress: opts.Progress,
		pending: map[uint64]*PendingSegment{}, recs: map[recKey]*recState{}, validEnd: map[uint64]int64{},
		badHeader: map[uint64]string{}, unloadable: map[uint64]int{}}
	if v.progress == nil {
		v.progress = func(int64) {}
	}
	if err := v.recovery(rec); err != nil {
		return nil, err
	}
	total, err := v.segmentFiles()
	if err != nil {
		return nil, err
	}
	if opts.ProgressTotal != nil {
		opts.ProgressTotal(total)
	}
	if err := v.readSegments(); err != nil {
		return nil, err
	}
	v.indexToLog()
	v.logToIndex()
	if err := h.Index.CheckAccounting(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			v.r.Problems = append(v.r.Problems, Problem{Offset: -1, Msg: line})
		}
	}
	slices.SortStableFunc(v.r.Problems, func(a, b Problem) int {
		return cmp.Or(strings.Compare(a.Path, b.Path), cmp.Compare(a.Offset, b.Offset))
	})
	return v.r, nil
}

// add reports a problem at offset off of segment seg (-1: the whole segment), about block id
// (zero: none in particular).
func (v *verifier) add(seg uint64, off int64, id format.BlockID, msg string, args ...any) {
	v.r.Problems = append(v.r.Problems, Problem{Segment: seg, Path: v.h.SegmentPath(seg), Offset: off, Block: id,
		Msg: fmt.Sprintf(msg, args...)})
}

// note adds a note (something the engine handles, not a problem) to the report.
func (v *verifier) note(msg string, args ...any) {
	v.r.Notes = append(v.r.Notes, fmt.Sprintf(msg, args...))
}

// recovery reports what recovery did (rec, if it ran), and scans the active segments as
// recovery would when it did not run.
func (v *verifier) recovery(rec *engine.RecoveryReport) error {
	if rec != nil {
		for _, n := range rec.MissingSegments {
			v.add(n, -1, format.BlockID{}, "sealed segment file was missing; recovery dropped the index entries pointing into it")
		}
		for _, n := range rec.TruncatedSegments {
			v.add(n, -1, format.BlockID{}, "sealed segment file was cut short; recovery dropped the index entries of the records it lost and sealed it again")
		}
	}
	if err := v.h.RecoverySkipped(); err != nil {
		v.r.RecoverySkipped = err.Error()
	}
	if v.opts.Recover && v.h.RecoverySkipped() == nil {
		return nil
	}
	ps, err := v.h.ScanPending()
	if err != nil {
		return err
	}
	v.r.Pending = ps
	for _, p := range ps {
		v.pending[p.Number] = p
	}
	return nil
}

// segmentFiles lists the segment files on disk, in every segment directory, against the
// index's segment rows, and returns the bytes the segment reads will cover.
func (v *verifier) segmentFiles() (total int64, err error) {
	h, r := v.h, v.r
	files, err := h.ListSegmentFiles()
	if err != nil {
		return 0, err
	}
	v.onDisk = map[uint64]int64{}
	for _, f := range files {
		switch {
		case f.Segment:
			size := int64(-1)
			if fi, err := h.FS.Stat(f.Path); err == nil {
				size = fi.Size()
			}
			v.onDisk[f.Number] = size
		case f.Recycled:
			r.RecycledFiles++
		case f.Temp:
			v.note("temporary file %s left by an interrupted operation (the engine removes it at open)", f.Path)
		default:
			v.note("foreign file %s in a segment directory (ignored by the engine)", f.Path)
		}
	}
	v.rows = h.Index.Segments()
	v.registered = map[uint64]index.SegmentMeta{}
	for _, m := range v.rows {
		v.registered[m.Number] = m
		if sz, ok := v.onDisk[m.Number]; ok && m.State != index.SegmentQuarantined && m.State != index.SegmentDeleting && sz > 0 {
			total += sz
		}
	}
	for n := range v.onDisk {
		if _, ok := v.registered[n]; !ok {
			r.UnregisteredFiles++
			v.note("segment file %s not registered in the index: recovery will adopt it (or remove it if it holds no header)", h.SegmentPath(n))
		}
	}
	return total, nil
}

// readSegments reads every registered segment: its records, checked, into recs.
func (v *verifier) readSegments() error {
	r := v.r
	for _, m := range v.rows {
		path := v.h.SegmentPath(m.Number)
		r.Segments++
		size, present := v.onDisk[m.Number]
		switch m.State {
		case index.SegmentSealed:
			r.Sealed++
		case index.SegmentActive:
			r.Active++
		case index.SegmentQuarantined:
			r.Quarantined++
			v.add(m.Number, -1, format.BlockID{}, "segment quarantined (found corrupt when recovery scanned it); its blocks are not served")
			continue
		case index.SegmentDeleting:
			// A retirement interrupted by a crash: no entry is served from it and recovery
			// deletes it. Not corruption; nothing to read.
			r.Retiring++
			if !v.opts.Recover {
				v.note("segment %s is being retired (marked deleting when a crash interrupted it): recovery deletes it", path)
			}
			continue
		}
		if !present {
			r.MissingFiles++
			if m.State == index.SegmentSealed {
				v.add(m.Number, -1, format.BlockID{}, "segment file missing (registered as %s with %d live records)", m.State, m.LiveRecords)
			}
			continue
		}
		var err error
		if m.State == index.SegmentActive {
			err = v.readActive(m, path)
		} else {
			err = v.readSealed(m, path, size)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readActive takes active segment m's records from its recovery scan.
func (v *verifier) readActive(m index.SegmentMeta, path string) error {
	p := v.pending[m.Number]
	if p == nil || p.scan == nil {
		// Unreadable header: recovery will quarantine it; already reported as pending.
		v.validEnd[m.Number] = 0
		return nil
	}
	v.validEnd[m.Number] = p.ValidEnd
	v.r.BytesRead += p.FileSize
	v.progress(p.FileSize)
	for _, ri := range scannedRecords(p.scan.Records) {
		v.recs[recKey{m.Number, ri.Offset}] = &recState{path: path, info: ri}
	}
	// Batches the scan passed over (never committed, or a shard failing the commit block's
	// checksum): read again to count their extents as dead bytes.
	for _, skipped := range p.scan.Skipped {
		var ce *wal.CorruptionError
		if !errors.As(skipped, &ce) {
			continue
		}
		ri, err := ReadRecordAt(v.h.FS, path, m, ce.Offset, true, func(n int64) { v.r.BytesRead += n; v.progress(n) })
		if err != nil {
			return fmt.Errorf("read %s at %d: %w", path, ce.Offset, err)
		}
		v.recs[recKey{m.Number, ce.Offset}] = &recState{path: path, info: ri}
	}
	return nil
}

// readSealed reads sealed segment m, whose file is size bytes, and checks its header.
func (v *verifier) readSealed(m index.SegmentMeta, path string, size int64) error {
	res, err := ReadSegment(v.h.FS, path, m, true, v.progress)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	v.r.BytesRead += res.BytesRead
	if m.Size != size {
		v.add(m.Number, -1, format.BlockID{}, "sealed segment's recorded size %d differs from its file size %d", m.Size, size)
	}
	switch {
	case res.Header == nil:
		v.badHeader[m.Number] = "its header is unreadable"
	case res.Header.Schema != v.h.Fingerprint:
		v.add(m.Number, 0, format.BlockID{}, "segment header carries another schema fingerprint than the store's")
		v.badHeader[m.Number] = "its header carries another schema"
	case res.Header.Number != m.Number || res.Header.Generation != m.Generation:
		v.badHeader[m.Number] = "its header names another segment or generation"
	}
	for _, p := range res.Problems {
		v.add(m.Number, p.Offset, format.BlockID{}, "%s", p.Msg)
	}
	for _, ri := range res.Records {
		v.recs[recKey{m.Number, ri.Offset}] = &recState{path: path, info: ri}
	}
	return nil
}

// indexToLog checks every index entry, blocks then sidecars, against its record.
func (v *verifier) indexToLog() {
	r := v.r
	err := v.h.Index.Iterate(func(id format.BlockID, loc index.Location) bool {
		r.IndexEntries++
		if v.checkEntry(id, 0, loc) {
			r.BlocksVerified++
		}
		return true
	})
	if err == nil {
		err = v.h.Index.IterateSidecars(func(id format.BlockID, kind format.SidecarKind, loc index.Location) bool {
			r.SidecarEntries++
			if v.checkEntry(id, kind, loc) {
				r.SidecarsVerified++
			}
			return true
		})
	}
	if err != nil {
		r.Problems = append(r.Problems, Problem{Offset: -1, Msg: fmt.Sprintf("reading the index: %v", err)})
	}
	for n, count := range v.unloadable {
		v.add(n, -1, format.BlockID{}, "%d indexed records cannot load: %s (the engine drops them as it meets them)", count, v.badHeader[n])
	}
}

// checkEntry checks the index entry of block id (kind 0) or of its sidecar of kind against the
// record at loc, and reports whether a load of it would verify.
func (v *verifier) checkEntry(id format.BlockID, kind format.SidecarKind, loc index.Location) (verified bool) {
	if _, bad := v.badHeader[loc.Segment]; bad {
		// The engine refuses to open such a segment: none of its records can load, however
		// intact they look.
		v.unloadable[loc.Segment]++
		return false
	}
	what := "index entry"
	if kind != 0 {
		what = fmt.Sprintf("sidecar %d entry", kind)
	}
	m, ok := v.registered[loc.Segment]
	if !ok {
		v.add(loc.Segment, loc.Offset, id, "%s points into segment %d, which is not registered", what, loc.Segment)
		return false
	}
	if _, present := v.onDisk[loc.Segment]; !present {
		return false // reported once for the segment
	}
	if m.State == index.SegmentQuarantined {
		v.add(loc.Segment, loc.Offset, id, "%s points into a quarantined segment", what)
		return false
	}
	if m.State == index.SegmentDeleting {
		v.r.PendingDrops++ // recovery drops the entries of a segment it finishes deleting
		return false
	}
	if end, ok := v.validEnd[loc.Segment]; ok && loc.Offset >= end {
		v.r.PendingDrops++ // past the valid end of an active segment: recovery drops it
		return false
	}
	rs := v.recs[recKey{loc.Segment, loc.Offset}]
	if loc.IsBatch() {
		what = fmt.Sprintf("%s (block %d of a batch record of %d)", what, loc.BatchPos, loc.BatchBlocks)
	}
	if rs == nil {
		v.add(loc.Segment, loc.Offset, id, "%s points at offset %d, which is not the start of a record", what, loc.Offset)
		return false
	}
	rs.indexed = true
	if rs.info.Err != nil {
		return false // reported with the record
	}
	if !loc.IsBatch() {
		if why := mismatch(rs.info, id, kind, loc, v.h.Layout); len(why) > 0 {
			v.add(loc.Segment, loc.Offset, id, "%s does not match the record: %s", what, strings.Join(why, "; "))
			return false
		}
		return rs.info.PayloadChecked
	}
	// A block of a batch record: the entry must match the batch's header and commit block,
	// whose shards the segment read checked against the commit's checksums.
	why := BatchEntryMismatch(rs.info, id, kind, loc)
	if kind == 0 && loc.Layout != v.h.Layout {
		why = append(why, fmt.Sprintf("index layout %+v is not the store's %+v", loc.Layout, v.h.Layout))
	}
	if len(why) > 0 {
		v.add(loc.Segment, loc.Offset, id, "%s does not match the batch record: %s", what, strings.Join(why, "; "))
		return false
	}
	if b := rs.info.Batch; b != nil && !b.Committed {
		// The batch committed (its blocks are indexed only once its commit block was durable)
		// and its commit block was damaged since: the block loads as the engine loads it, its
		// shards checked against the entry's checksums.
		rs.indexedBlocks++
		err := v.h.checkShards(rs.path, loc, func(n int64) { v.r.BytesRead += n; v.progress(n) })
		if err != nil {
			v.add(loc.Segment, loc.Offset, id, "%s: %v (loads of the block will miss)", what, err)
			return false
		}
		rs.loadable++
		return true
	}
	return rs.info.PayloadChecked
}

// logToIndex goes over every record read: invalid records are problems; valid ones nobody
// points at are dead space.
func (v *verifier) logToIndex() {
	for k, rs := range v.recs {
		v.r.Records++
		if b := rs.info.Batch; b != nil && rs.info.Err == nil && !b.Committed {
			v.uncommittedBatch(k, rs, b)
			continue
		}
		if rs.info.Err != nil {
			v.invalidRecord(k, rs)
			continue
		}
		v.r.ValidRecords++
		if !rs.indexed {
			v.r.DeadRecords++
			v.r.DeadBytes += rs.info.Length
		}
	}
}

// uncommittedBatch accounts for batch record rs at k whose commit block does not check.
func (v *verifier) uncommittedBatch(k recKey, rs *recState, b *BatchInfo) {
	r, path := v.r, v.h.SegmentPath(k.seg)
	switch {
	case rs.indexedBlocks > 0:
		// Committed (its blocks are indexed), its commit block damaged since.
		loads := fmt.Sprintf("its %d indexed blocks load", rs.loadable)
		if rs.loadable != rs.indexedBlocks {
			loads = fmt.Sprintf("%d of its %d indexed blocks load", rs.loadable, rs.indexedBlocks)
		}
		v.add(k.seg, k.off, rs.info.ID, "batch record of %d blocks: commit block damaged (%v); the batch committed (its blocks are indexed) and %s, checked against the index's checksums, "+
			"but a reader without this index (an index rebuild, another instance reading the segment's footer) cannot use it; compaction rewrites its blocks with a new commit block",
			len(b.Header.IDs), b.CommitErr, loads)
	case b.Listed:
		// Listed in the footer (it committed) and no longer indexed: dead space that is never
		// served, reclaimed with its segment.
		r.DeadRecords++
		r.DeadBytes += rs.info.Length
		v.note("%s offset %d: batch record of %d blocks whose commit block is damaged (%v), none of them indexed any more: dead space, never served; compaction reclaims it",
			path, k.off, len(b.Header.IDs), b.CommitErr)
	default:
		// A batch that never committed: none of its blocks exists (an entry pointing at it
		// was reported with the index). Dead space, as recovery treats it.
		r.ValidRecords++
		r.DeadRecords++
		r.DeadBytes += rs.info.Length
		v.note("%s offset %d: batch record of %d blocks (first %s) never committed (%v): dead space, never indexed; compaction reclaims it",
			path, k.off, len(b.Header.IDs), rs.info.ID, b.CommitErr)
	}
}

// invalidRecord accounts for record rs at k, which fails its checks.
func (v *verifier) invalidRecord(k recKey, rs *recState) {
	if !rs.indexed {
		// Dropped from the index already (a load or a recovery found it broken): dead space
		// that is never served, reclaimed with its segment. Not a problem to report again on
		// every run.
		v.r.DeadRecords++
		v.r.DeadBytes += max(rs.info.Length, 0)
		v.note("%s offset %d: record failing its checks and no longer indexed (%v): dead space, never served; compaction reclaims it",
			v.h.SegmentPath(k.seg), k.off, rs.info.Err)
		return
	}
	what, id, miss := "record", rs.info.ID, "it"
	if hd := rs.info.Header; hd != nil && hd.Kind != 0 {
		what = fmt.Sprintf("sidecar %d record", hd.Kind)
	}
	if b := rs.info.Batch; b != nil {
		what, miss = fmt.Sprintf("batch record of %d blocks", len(b.Header.IDs)), "its blocks"
		if len(b.Bad) > 0 {
			id = b.Header.IDs[b.Bad[0]] // the block whose shard fails
			miss = "the block with a bad shard"
			if len(b.Bad) > 1 {
				miss = fmt.Sprintf("the %d blocks with a bad shard", len(b.Bad))
			}
		}
	}
	v.add(k.seg, k.off, id, "invalid %s (indexed: loads of %s will miss): %v", what, miss, rs.info.Err)
}

// BatchEntryMismatch lists how the index entry (id, kind, loc) of a block of a batch record
// differs from the batch record ri it points at: a batch record holding id at loc.BatchPos of
// loc.BatchBlocks blocks, with sequence number first + BatchPos, the entry's header checksum,
// layout and shard checksums (the commit block's), uncompressed. Nothing when they agree. (The
// store's layout is the caller's to check.) A batch whose commit block does not check
// (BatchInfo.Committed false) is compared by its header only: an entry pointing at it is what
// says it committed (docs/format.md §4c), and its block's shards are checked against the
// entry's checksums by the caller, as a load checks them.
func BatchEntryMismatch(ri RecordInfo, id format.BlockID, kind format.SidecarKind, loc index.Location) []string {
	b := ri.Batch
	if b == nil {
		return []string{"the record there is not a batch record"}
	}
	var why []string
	ids := b.Header.IDs
	if kind != 0 {
		why = append(why, fmt.Sprintf("a sidecar %d entry points at a batch record (sidecars are never batched)", kind))
	}
	if loc.BatchBlocks != len(ids) {
		why = append(why, fmt.Sprintf("the batch holds %d blocks, the entry says %d", len(ids), loc.BatchBlocks))
	}
	pos := loc.BatchPos
	if pos < 0 || pos >= len(ids) || ids[pos] != id {
		at := slices.Index(ids, id)
		if pos >= 0 && pos < len(ids) {
			why = append(why, fmt.Sprintf("position %d holds block %s", pos, ids[pos]))
		}
		if at < 0 {
			why = append(why, "the batch does not hold the block")
		} else {
			why = append(why, fmt.Sprintf("the batch holds the block at position %d", at))
		}
		return why // the other fields would be compared with another block's
	}
	if want := b.Header.FirstSeq + uint64(pos); loc.Seq != want {
		why = append(why, fmt.Sprintf("seq %d, index has %d", want, loc.Seq))
	}
	if ri.HeaderCRC != loc.HeaderCRC {
		why = append(why, fmt.Sprintf("batch header crc %#08x, index has %#08x", ri.HeaderCRC, loc.HeaderCRC))
	}
	switch {
	case b.Header.Layout != loc.Layout:
		why = append(why, fmt.Sprintf("layout %+v, index has %+v", b.Header.Layout, loc.Layout))
	case b.Committed && !slices.Equal(b.ShardCRCs[pos], loc.ShardCRCs):
		why = append(why, "shard checksums differ from the commit block's")
	}
	if loc.Compression != format.CompressionNone || len(loc.StoredLens) > 0 {
		why = append(why, fmt.Sprintf("index has compression %v (batches are never compressed)", loc.Compression))
	}
	return why
}

// mismatch lists how the record ri differs from the index entry (id, kind, loc) of a store of
// layout l; nothing when they agree.
func mismatch(ri RecordInfo, id format.BlockID, kind format.SidecarKind, loc index.Location, l format.Layout) []string {
	if ri.Batch != nil {
		return []string{fmt.Sprintf("the record there is a batch record of %d blocks, the entry is not one of its blocks'", len(ri.Batch.Header.IDs))}
	}
	var why []string
	if ri.ID != id {
		why = append(why, fmt.Sprintf("the record holds block %s", ri.ID))
	}
	if hd := ri.Header; hd != nil && hd.Kind != kind {
		why = append(why, fmt.Sprintf("the record is of kind %d (%v), the entry of kind %d", hd.Kind, hd.Type, kind))
	}
	if ri.HeaderCRC != loc.HeaderCRC {
		why = append(why, fmt.Sprintf("header crc %#08x, index has %#08x", ri.HeaderCRC, loc.HeaderCRC))
	}
	if ri.Seq != loc.Seq {
		why = append(why, fmt.Sprintf("seq %d, index has %d", ri.Seq, loc.Seq))
	}
	if hd := ri.Header; hd != nil {
		if hd.Layout != loc.Layout {
			why = append(why, fmt.Sprintf("layout %+v, index has %+v", hd.Layout, loc.Layout))
		} else if !slices.Equal(hd.ShardCRCs, loc.ShardCRCs) {
			why = append(why, "shard checksums differ from the index's")
		} else if hd.Compression != loc.Compression || !slices.Equal(hd.StoredLens, loc.StoredLens) || !slices.Equal(hd.StoredCRCs, loc.StoredCRCs) {
			why = append(why, fmt.Sprintf("compression %v with stored lengths %v, index has %v with %v", hd.Compression, hd.StoredLens, loc.Compression, loc.StoredLens))
		}
	}
	if kind == 0 && loc.Layout != l {
		why = append(why, fmt.Sprintf("index layout %+v is not the store's %+v", loc.Layout, l))
	}
	return why
}

// checkShards reads every shard of the batch block loc points at in the segment file at path
// and checks it against the entry's shard checksums, as a load does. progress gets the bytes
// read.
func (h *Handle) checkShards(path string, loc index.Location, progress func(int64)) error {
	f, err := h.FS.Open(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	if len(loc.ShardCRCs) != loc.Layout.Shards {
		return fmt.Errorf("%w: the entry has %d shard checksums for %d shards", format.ErrCorrupt, len(loc.ShardCRCs), loc.Layout.Shards)
	}
	buf := make([]byte, loc.Layout.ShardBytes)
	for i := 0; i < loc.Layout.Shards; i++ {
		if _, err := f.ReadAt(buf, loc.ShardOffset(i)); err != nil {
			return fmt.Errorf("read shard %d: %w", i, err)
		}
		progress(int64(len(buf)))
		if got := format.Checksum(buf); got != loc.ShardCRCs[i] {
			return fmt.Errorf("%w: shard %d checksum: index has %#08x, computed %#08x", format.ErrCorrupt, i, loc.ShardCRCs[i], got)
		}
	}
	return nil
}
