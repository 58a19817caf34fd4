package wal

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// ScannedRecord is one valid record found by a scan: its decoded header and where it lies.
//
// A committed batch record (format.RecordBatch) gives one ScannedRecord per block, in the
// batch's order: Header then holds the block's id, sequence number, layout and shard
// checksums (Type RecordBatch, no compression), Offset and HeaderCRC are the batch record's,
// and BatchBlocks, BatchPos and BatchExtent say where the block lies in it.
type ScannedRecord struct {
	Header    format.RecordHeader
	Offset    int64
	HeaderCRC uint32

	BatchBlocks int
	BatchPos    int
	BatchExtent int64
}

// Length is the on-disk size of the record (of the whole batch record for a block of one).
func (r *ScannedRecord) Length() int64 {
	if r.BatchBlocks > 0 {
		return r.BatchExtent
	}
	return r.Header.RecordBytes()
}

// footerEntry is the footer entry that lists r: one per batch record, for its first block.
func (r *ScannedRecord) footerEntry() (format.FooterEntry, bool) {
	if r.BatchPos > 0 {
		return format.FooterEntry{}, false
	}
	return format.FooterEntry{ID: r.Header.ID, Offset: r.Offset, Length: r.Length(), Seq: r.Header.Seq, HeaderCRC: r.HeaderCRC, Type: r.Header.Type, Kind: r.Header.Kind}, true
}

// ScanResult is what a scan of a segment found.
type ScanResult struct {
	Header  format.SegmentHeader
	Records []ScannedRecord
	// ValidEnd is the offset just past the last valid record: the end of the log.
	ValidEnd int64
	// FileSize is the size of the file when it was scanned.
	FileSize int64
	// Sealed reports that a valid footer ends the file and every record before it is valid.
	Sealed bool
	// HasFooter reports that a valid footer trailer ends the file: the segment was sealed, so
	// an invalid record in it is corruption, not a torn tail.
	HasFooter bool
	// Truncated is how many bytes RecoverSegment cut after ValidEnd (a torn or unpublished tail).
	Truncated int64
	// Stop says why the scan of an unsealed segment stopped before FileSize: nil when it reached
	// a clean end (end of file or a zeroed block), else the first invalid record's error, which
	// names its offset. For a torn tail this is expected; in a sealed segment it is corruption.
	Stop error
	// Skipped lists the batch records passed over, each as a *CorruptionError naming its
	// offset and first block: a valid header whose commit block is missing, does not match
	// it, or whose shards do not match the commit's checksums. Such a batch was never
	// acknowledged (its commit is synced before its blocks are published) unless its bytes
	// rotted since: its extent is dead bytes, and the scan goes on after it.
	Skipped []error
}

// CorruptionError reports an invalid record or structure in a segment, with its place.
type CorruptionError struct {
	Path   string
	Offset int64
	ID     format.BlockID // zero when the block is unknown
	Err    error
}

// Error names the segment file, the offset and the block.
func (e *CorruptionError) Error() string {
	if e.ID.IsZero() {
		return fmt.Sprintf("%s at offset %d: %v", e.Path, e.Offset, e.Err)
	}
	return fmt.Sprintf("%s at offset %d (block %s): %v", e.Path, e.Offset, e.ID, e.Err)
}

// Unwrap returns the underlying error, which wraps format.ErrCorrupt for bad bytes.
func (e *CorruptionError) Unwrap() error { return e.Err }

// reader reads aligned ranges of one segment file.
type reader struct {
	f       *devio.File
	backend devio.Backend
	size    int64
	win     []byte // the current read window: file bytes [winOff, winOff+winLen)
	winOff  int64
	winLen  int
}

func (r *reader) read(buf []byte, off int64) error {
	return r.backend.Submit([]devio.Op{{File: r.f, Buf: buf, Off: off}})
}

// scanWindow is how much of a segment a scan reads at a time: records are parsed out of large
// sequential reads instead of two small reads each.
const scanWindow = 8 << 20

// at returns the bytes [off, off+n) of the file, off aligned, from a window of large aligned
// reads. The slice is valid until the next call. A range the file does not hold in full gives
// io.ErrUnexpectedEOF.
func (r *reader) at(off, n int64) ([]byte, error) {
	if off >= r.winOff && off+n <= r.winOff+int64(r.winLen) {
		return r.win[off-r.winOff : off-r.winOff+n], nil
	}
	want := min(max(scanWindow, format.AlignUp(n)), format.AlignUp(r.size-off))
	if want <= 0 {
		return nil, io.ErrUnexpectedEOF
	}
	if int64(cap(r.win)) < want {
		r.win = devio.AlignedBuffer(int(max(want, scanWindow)))
	}
	ops := []devio.Op{{File: r.f, Buf: r.win[:want], Off: off}}
	err := r.backend.Submit(ops)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		r.winLen = 0
		return nil, err
	}
	r.winOff, r.winLen = off, ops[0].N
	if int64(r.winLen) < n {
		return nil, io.ErrUnexpectedEOF
	}
	return r.win[:n], nil
}

// ScanSegment reads every record of the segment file at path from the start, validating each
// (header checksum and fields, segment number and generation, every shard checksum), and stops
// at the first one that fails or at a clean end. It does not modify the file. It also reports
// whether a valid footer ends the file. I/O errors (as opposed to invalid bytes) are returned
// as err.
func ScanSegment(fs vfs.FS, path string, direct devio.DirectMode, backend devio.Backend) (*ScanResult, error) {
	f, err := devio.OpenReadOnly(fs, path, direct)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.VFS().Stat()
	if err != nil {
		return nil, fmt.Errorf("wal: stat %s: %w", path, err)
	}
	return scanFile(f, path, st.Size(), backend)
}

func scanFile(f *devio.File, path string, size int64, backend devio.Backend) (*ScanResult, error) {
	r := &reader{f: f, backend: backend, size: size}
	res := &ScanResult{FileSize: size, ValidEnd: format.SegmentHeaderSize}
	if size < format.SegmentHeaderSize {
		return nil, &CorruptionError{Path: path, Err: fmt.Errorf("%w: %w: file of %d bytes", format.ErrCorrupt, ErrNoHeader, size)}
	}
	hdr := devio.AlignedBuffer(format.Alignment)
	if err := r.read(hdr, 0); err != nil {
		return nil, err
	}
	if format.IsZeroBlock(hdr) {
		return nil, &CorruptionError{Path: path, Err: fmt.Errorf("%w: %w", format.ErrCorrupt, ErrNoHeader)}
	}
	h, err := format.DecodeSegmentHeader(hdr)
	if err != nil {
		return nil, &CorruptionError{Path: path, Err: err}
	}
	res.Header = h
	var tr *format.Trailer
	dataLimit := size &^ (format.Alignment - 1)
	if size%format.Alignment == 0 && size >= 2*format.Alignment {
		if err := r.read(hdr, size-format.Alignment); err != nil {
			return nil, err
		}
		if t, err := format.DecodeTrailer(hdr, size); err == nil && t.Segment == h.Number && t.Generation == h.Generation {
			tr = &t
			dataLimit = t.DataEnd
			res.HasFooter = true
		}
	}
	// A sealed segment's footer lists the batch records it holds: one of them that no longer
	// checks is corruption, while a batch it does not list was abandoned and is dead bytes.
	var entries []format.FooterEntry
	var entriesErr error
	listed := map[int64]bool{}
	if tr != nil {
		entries, entriesErr = readFooterEntries(r, tr)
		if entriesErr != nil && !isCorrupt(entriesErr) {
			return nil, entriesErr
		}
		for _, e := range entries {
			if e.Type == format.RecordBatch {
				listed[e.Offset] = true
			}
		}
	}
	off := int64(format.SegmentHeaderSize)
	var scratch []byte // decoding compressed shards
	for off < dataLimit {
		if off+format.RecordHeaderSize > dataLimit {
			res.Stop = &CorruptionError{Path: path, Offset: off, Err: fmt.Errorf("%w: partial record header", format.ErrCorrupt)}
			break
		}
		hdr, err := r.at(off, format.RecordHeaderSize)
		if err != nil {
			return nil, err
		}
		if format.IsZeroBlock(hdr) {
			if tr != nil {
				res.Stop = &CorruptionError{Path: path, Offset: off, Err: fmt.Errorf("%w: zeroed block inside sealed data", format.ErrCorrupt)}
			}
			break // clean end of an unsealed log
		}
		if format.RecordType(hdr[6]) == format.RecordBatch {
			recs, extent, skip, err := scanBatch(r, &h, off, dataLimit)
			if err != nil {
				var ce *CorruptionError
				if !errors.As(err, &ce) {
					return nil, err // I/O
				}
				ce.Path = path
				if !skip || listed[off] {
					res.Stop = ce
					break
				}
				res.Skipped = append(res.Skipped, ce)
				off += extent
				if tr != nil {
					res.ValidEnd = off // dead bytes inside sealed data
				}
				continue
			}
			res.Records = append(res.Records, recs...)
			off += extent
			res.ValidEnd = off
			continue
		}
		rh, crc, err := format.DecodeRecordHeader(hdr)
		if err == nil && (rh.Segment != h.Number || rh.Generation != h.Generation) {
			err = fmt.Errorf("%w: record of segment %d generation %#x in segment %d generation %#x (stale bytes)",
				format.ErrCorrupt, rh.Segment, rh.Generation, h.Number, h.Generation)
		}
		if err == nil && off+rh.RecordBytes() > dataLimit {
			err = fmt.Errorf("%w: record of %d bytes runs past the data end %d", format.ErrCorrupt, rh.RecordBytes(), dataLimit)
		}
		if err != nil {
			res.Stop = &CorruptionError{Path: path, Offset: off, ID: rh.ID, Err: err}
			break
		}
		payload, err := r.at(off+format.RecordHeaderSize, rh.PayloadBytes())
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				res.Stop = &CorruptionError{Path: path, Offset: off, ID: rh.ID, Err: fmt.Errorf("%w: payload cut short by end of file", format.ErrCorrupt)}
				break
			}
			return nil, err
		}
		if rh.Compression != format.CompressionNone && int64(len(scratch)) < 2*rh.Layout.ShardBytes {
			scratch = make([]byte, 2*rh.Layout.ShardBytes)
		}
		// Compressed records are decoded too: the stored and the raw checksums must match.
		if err := format.VerifyPayload(&rh, payload, nil, scratch); err != nil {
			res.Stop = &CorruptionError{Path: path, Offset: off, ID: rh.ID, Err: err}
			break
		}
		res.Records = append(res.Records, ScannedRecord{Header: rh, Offset: off, HeaderCRC: crc})
		off += rh.RecordBytes()
		res.ValidEnd = off
	}
	if tr != nil && res.Stop == nil && res.ValidEnd == tr.DataEnd {
		err := entriesErr
		if err == nil {
			err = checkFooterEntries(entries, res.Records)
		}
		if err != nil {
			res.Stop = &CorruptionError{Path: path, Offset: tr.DataEnd, Err: err}
		} else {
			res.Sealed = true
		}
	}
	return res, nil
}

// readFooterEntries reads the footer entries a trailer announces.
func readFooterEntries(r *reader, tr *format.Trailer) ([]format.FooterEntry, error) {
	buf := devio.AlignedBuffer(int(r.size - tr.DataEnd))
	if err := r.read(buf, tr.DataEnd); err != nil {
		return nil, err
	}
	return format.DecodeFooterEntries(buf, *tr)
}

func isCorrupt(err error) bool { return errors.Is(err, format.ErrCorrupt) }

// checkFooterEntries checks that a footer's entries list exactly the records the scan found.
func checkFooterEntries(entries []format.FooterEntry, recs []ScannedRecord) error {
	want := footerEntries(recs)
	if len(entries) != len(want) {
		return fmt.Errorf("%w: footer lists %d records, the segment holds %d", format.ErrCorrupt, len(entries), len(want))
	}
	for i, e := range entries {
		if e != want[i] {
			return fmt.Errorf("%w: footer entry %d (%s at %d) does not match the record at %d (%s)", format.ErrCorrupt, i, e.ID, e.Offset, want[i].Offset, want[i].ID)
		}
	}
	return nil
}

// footerEntries is the footer listing recs: one entry per record, one per batch record.
func footerEntries(recs []ScannedRecord) []format.FooterEntry {
	entries := make([]format.FooterEntry, 0, len(recs))
	for i := range recs {
		if e, ok := recs[i].footerEntry(); ok {
			entries = append(entries, e)
		}
	}
	return entries
}

// scanBatch reads and checks the batch record at off of the segment with header h: its header,
// its commit block and every shard against the commit's checksums. It returns the record's
// blocks and its extent. A bad header (torn, stale, not fitting the data) is a
// *CorruptionError with skip false: the scan stops there, as at any bad record header. Once the
// header is valid its extent is known, and a missing or mismatched commit block or a bad shard
// is a *CorruptionError with skip true: the scan passes over the extent. Other errors are I/O.
func scanBatch(r *reader, h *format.SegmentHeader, off, dataLimit int64) (recs []ScannedRecord, extent int64, skip bool, err error) {
	corrupt := func(id format.BlockID, err error) error { return &CorruptionError{Offset: off, ID: id, Err: err} }
	first, err := r.at(off, format.RecordHeaderSize)
	if err != nil {
		return nil, 0, false, err
	}
	_, size, err := format.PeekBatchHeader(first)
	if err != nil {
		return nil, 0, false, corrupt(format.BlockID{}, err)
	}
	if off+size > dataLimit {
		return nil, 0, false, corrupt(format.BlockID{}, fmt.Errorf("%w: batch header of %d bytes runs past the data end %d", format.ErrCorrupt, size, dataLimit))
	}
	hb, err := r.at(off, size)
	if err != nil {
		return nil, 0, false, err
	}
	bh, hcrc, err := format.DecodeBatchHeader(hb)
	if err == nil && h.Features&format.FeatureBatchRecords == 0 {
		err = fmt.Errorf("%w: batch record in a segment without the batch-records feature flag", format.ErrCorrupt)
	}
	if err == nil && (bh.Segment != h.Number || bh.Generation != h.Generation) {
		err = fmt.Errorf("%w: batch of segment %d generation %#x in segment %d generation %#x (stale bytes)",
			format.ErrCorrupt, bh.Segment, bh.Generation, h.Number, h.Generation)
	}
	extent = bh.ExtentBytes()
	if err == nil && off+extent > dataLimit {
		err = fmt.Errorf("%w: batch record of %d bytes runs past the data end %d", format.ErrCorrupt, extent, dataLimit)
	}
	if err != nil {
		return nil, 0, false, corrupt(format.BlockID{}, err)
	}
	id0 := bh.IDs[0]
	n, l := len(bh.IDs), bh.Layout
	cb, err := r.at(off+bh.CommitOffset(), format.BatchCommitSize(n, l.Shards))
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, extent, true, corrupt(id0, fmt.Errorf("%w: batch commit block cut short by end of file", format.ErrCorrupt))
		}
		return nil, 0, false, err
	}
	c, err := format.DecodeBatchCommit(cb, &bh, hcrc)
	if err != nil {
		return nil, extent, true, corrupt(id0, fmt.Errorf("batch not committed: %w", err))
	}
	for i := 0; i < l.Shards; i++ {
		for b := 0; b < n; b++ {
			s, err := r.at(off+bh.ShardOffset(b, i), l.ShardBytes)
			if err != nil {
				if errors.Is(err, io.ErrUnexpectedEOF) {
					return nil, extent, true, corrupt(bh.IDs[b], fmt.Errorf("%w: batch shard cut short by end of file", format.ErrCorrupt))
				}
				return nil, 0, false, err
			}
			if got, want := format.Checksum(s), c.ShardCRCs[i*n+b]; got != want {
				return nil, extent, true, corrupt(bh.IDs[b], fmt.Errorf("%w: batch shard %d checksum: stored %#08x, computed %#08x", format.ErrCorrupt, i, want, got))
			}
		}
	}
	return batchBlocks(&bh, hcrc, &c, off), extent, false, nil
}

// batchBlocks lists the blocks of the committed batch record at off with header bh (whose
// checksum is hcrc) and commit block c.
func batchBlocks(bh *format.BatchHeader, hcrc uint32, c *format.BatchCommit, off int64) []ScannedRecord {
	recs := make([]ScannedRecord, len(bh.IDs))
	for b, id := range bh.IDs {
		recs[b] = ScannedRecord{Header: format.RecordHeader{Type: format.RecordBatch, ID: id, Segment: bh.Segment, Generation: bh.Generation,
			Seq: bh.FirstSeq + uint64(b), Layout: bh.Layout, ShardCRCs: c.BlockCRCs(b)}, Offset: off, HeaderCRC: hcrc,
			BatchBlocks: len(bh.IDs), BatchPos: b, BatchExtent: bh.ExtentBytes()}
	}
	return recs
}

// VerifyShards checks shards [first, first+n) of a raw (uncompressed) record whose payload bytes
// from shard first on are in payload (shard i of the run at (i-first) × stride). Compressed
// records are checked with format.VerifyPayload or format.UnpackShard.
func VerifyShards(h *format.RecordHeader, payload []byte, first, n int) error {
	if h.Compression != format.CompressionNone {
		return fmt.Errorf("%w: VerifyShards of a %v record", format.ErrInvalid, h.Compression)
	}
	stride := h.Layout.ShardStride()
	for i := 0; i < n; i++ {
		s := first + i
		b := payload[int64(i)*stride : int64(i)*stride+h.Layout.ShardBytes]
		if got := format.Checksum(b); got != h.ShardCRCs[s] {
			return fmt.Errorf("%w: shard %d checksum: stored %#08x, computed %#08x", format.ErrCorrupt, s, h.ShardCRCs[s], got)
		}
	}
	return nil
}

// RecoverSegment makes an unsealed segment (one that was active at a crash) a sealed one: it
// scans it, truncates it just past the last valid record, writes the footer and syncs. It
// never appends records to it. It returns the scan, whose ValidEnd bounds the records an index
// may point at. Recovering an already sealed segment returns its scan unchanged.
//
// trustFooter says what a footer ending a file with an invalid record means. The index knows a
// segment whose seal never completed (still active): its footer may have reached the disk while
// earlier unsynced records did not, so it is a torn tail like any other (trustFooter false). When
// the seal state is unknown (rebuilding a lost index) the footer is trusted: the segment is left
// untouched and the *CorruptionError returned with the scan, never cutting valid records.
//
// The file must be segment number's: one whose header names another segment (a recycled file
// whose new header never reached the disk) is left untouched and reported as a
// *CorruptionError wrapping ErrStaleHeader.
func RecoverSegment(fs vfs.FS, path string, number uint64, direct devio.DirectMode, backend devio.Backend, trustFooter bool) (*ScanResult, error) {
	res, err := ScanSegment(fs, path, direct, backend)
	if err == nil && res.Header.Number != number {
		return res, &CorruptionError{Path: path, Err: fmt.Errorf("%w: %w: header names segment %d, not %d", format.ErrCorrupt, ErrStaleHeader, res.Header.Number, number)}
	}
	if err != nil || res.Sealed {
		return res, err
	}
	if res.HasFooter && trustFooter {
		// A sealed segment with a bad record: corruption. Never cut valid records after it.
		return res, res.Stop
	}
	if err := truncatePath(fs, path, res.ValidEnd); err != nil {
		return nil, fmt.Errorf("wal: truncate %s to %d: %w", path, res.ValidEnd, err)
	}
	f, err := devio.OpenFile(fs, path, false, direct)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	entries := footerEntries(res.Records)
	seg := &Segment{Number: res.Header.Number, Generation: res.Header.Generation, path: path, file: f}
	if err := sealAt(seg, res.ValidEnd, entries, backend); err != nil {
		return nil, err
	}
	res.Truncated = res.FileSize - res.ValidEnd
	res.FileSize = res.ValidEnd + format.FooterSize(len(entries))
	res.Sealed = true
	return res, nil
}

// TempSuffix marks temporary files the log writes next to segments (a truncation copy); a
// file with it found at open is left over from a crash and is removed.
const TempSuffix = ".tmp"

// truncatePath cuts the file at path to size and makes that durable. Files with a kernel
// descriptor are truncated in place; files without one (an in-memory test file system) are
// rewritten to a temporary file renamed over the original.
func truncatePath(fs vfs.FS, path string, size int64) error {
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if fd := f.Fd(); fd != vfs.InvalidFd {
		err := unix.Ftruncate(int(fd), size)
		if err == nil {
			err = f.Sync()
		}
		return errors.Join(err, f.Close())
	}
	buf := make([]byte, size)
	_, err = f.ReadAt(buf, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil && !(errors.Is(err, io.EOF) && size == 0) {
		return err
	}
	tmp := path + TempSuffix
	t, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = t.Write(buf)
	if err == nil {
		err = t.Sync()
	}
	if err = errors.Join(err, t.Close()); err != nil {
		return err
	}
	if err := fs.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(fs, fs.PathDir(path))
}
