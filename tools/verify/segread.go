package verify

import (
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// RecordInfo is one record found in a segment file.
type RecordInfo struct {
	// Offset is where the record starts in the file.
	Offset int64
	// Length is the record's on-disk size, 0 when unknown (header unreadable and no footer
	// entry).
	Length int64
	// ID, Seq and HeaderCRC are the record's block id, sequence number and header checksum
	// (from the footer entry when the header did not decode); for a batch record, its block
	// 0's id, its first sequence number and its batch header's checksum, as its footer entry
	// lists them.
	ID        format.BlockID
	Seq       uint64
	HeaderCRC uint32
	// Header is the decoded record header, nil for a batch record (Batch) and when it did not
	// decode.
	Header *format.RecordHeader
	// Batch describes a batch record (format.RecordBatch) whose batch header decoded, nil
	// for any other record.
	Batch *BatchInfo
	// Err is why the record is invalid (header, segment/generation, footer disagreement,
	// payload checksum), nil for a valid record. A batch record that never committed is valid
	// (Batch.Committed false): its extent is dead bytes.
	Err error
	// PayloadChecked reports that every shard checksum was verified.
	PayloadChecked bool
}

// BatchInfo describes a batch record (format.RecordBatch, docs/format.md §4c): N blocks of
// one layout stored layer-major, one extent with a header, L runs and a commit block.
type BatchInfo struct {
	// Header is the decoded batch header: the block ids in their order (block b is
	// Header.IDs[b], with sequence number Header.FirstSeq + b), the layout, segment and
	// generation.
	Header format.BatchHeader
	// Committed reports that the commit block is valid and matches the header. Without it
	// (CommitErr says why: missing, torn, left over from an older batch, or damaged since) a
	// reader that has only the segment cannot tell the batch's blocks exist, and a batch
	// nothing else vouches for was never acknowledged: its extent is dead bytes. One that the
	// footer lists (Listed) or whose blocks are indexed did commit (docs/format.md §4c): its
	// commit block was damaged after the fact.
	Committed bool
	CommitErr error
	// Listed reports that the segment's footer lists the batch (only sealed segments have one):
	// it committed before the segment was sealed.
	Listed bool
	// ShardCRCs holds each block's shard checksums from the commit block, in shard order:
	// ShardCRCs[b][i] is shard i of block b. Nil when not committed.
	ShardCRCs [][]uint32
	// Bad lists the positions of the blocks of a committed batch with a shard that fails its
	// checksum (when payloads were verified), in order; Err names the first.
	Bad []int
}

// SegmentProblem is a problem of a segment file not tied to one record.
type SegmentProblem struct {
	// Offset is where in the file the problem is, -1 for the file as a whole.
	Offset int64
	// Msg says what is wrong.
	Msg string
}

// SegmentRead is what reading one segment file found.
type SegmentRead struct {
	// Path is the file read and FileSize its size.
	Path     string
	FileSize int64
	// Header is the decoded segment header, nil when it did not decode.
	Header *format.SegmentHeader
	// Footer reports that a valid footer was found and used.
	Footer bool
	// DataEnd is the end of the records: the footer's start, or where the walk stopped.
	DataEnd int64
	// Records are the records found, in file order, valid or not.
	Records []RecordInfo
	// Problems are the file's problems not tied to one record.
	Problems []SegmentProblem
	// BytesRead counts the bytes read.
	BytesRead int64
	// Stop is why a walk of an unsealed segment ended before the end of the file (its torn
	// tail), nil at a clean end.
	Stop error
}

// readMode says how strict a segment read is.
type readMode int

const (
	// modeSealed: the footer lists every record; every deviation is a problem. Without a valid
	// footer the records are walked and the walk resynchronises after a bad header.
	modeSealed readMode = iota
	// modeUnsealed: walk the records from the header; the first invalid one ends the log
	// (a torn tail, reported as Stop, not as a problem).
	modeUnsealed
)

// segReader reads records from one segment file with pread.
type segReader struct {
	f      vfs.File
	res    *SegmentRead
	number uint64 // expected segment number and generation (from the index)
	gen    uint64
	// recordedSize is the size the index recorded when the segment was sealed (0: unknown).
	recordedSize int64
	payloads     bool // verify shard checksums (else headers only)
	progress     func(int64)
	buf          []byte
	aux          []byte // the parts of a batch record not in buf (checkBatch)
}

// readAt reads n bytes at off into the reader's buffer; the slice is valid until the next
// readAt.
func (r *segReader) readAt(n int, off int64) ([]byte, error) { return r.readInto(&r.buf, n, off) }

// readInto reads n bytes at off into *buf, grown as needed, counting them.
func (r *segReader) readInto(buf *[]byte, n int, off int64) ([]byte, error) {
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	got, err := r.f.ReadAt(b, off)
	r.res.BytesRead += int64(got)
	if r.progress != nil {
		r.progress(int64(got))
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

// ReadSegment reads the segment file at path on fs (nil: vfs.Default), which the index
// describes by m, and checks every record. A sealed segment is read through its footer, which
// must end the file at the size m recorded at sealing (without a valid footer its records are
// walked, resynchronising after a bad header); any other segment (active, quarantined) is
// walked from its header up to the first invalid record, its torn tail (SegmentRead.Stop).
// With payloads it verifies every shard checksum, else only record headers. progress, if not
// nil, is called with the byte count of every read. Invalid bytes go into the result; only
// I/O errors other than a short file (including a missing file) are returned as err.
func ReadSegment(fs vfs.FS, path string, m index.SegmentMeta, payloads bool, progress func(int64)) (*SegmentRead, error) {
	if fs == nil {
		fs = vfs.Default
	}
	mode, size := modeSealed, m.Size
	if m.State != index.SegmentSealed {
		mode, size = modeUnsealed, 0
	}
	return readSegment(fs, path, m.Number, m.Generation, size, mode, payloads, progress)
}

// readSegment reads the segment file at path, which the index says is segment number with
// generation gen and, if sealed, recordedSize bytes long (0: unknown), and checks every
// record; see ReadSegment.
func readSegment(fs vfs.FS, path string, number, gen uint64, recordedSize int64, mode readMode, payloads bool, progress func(int64)) (*SegmentRead, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	res := &SegmentRead{Path: path, FileSize: st.Size()}
	r := &segReader{f: f, res: res, number: number, gen: gen, recordedSize: recordedSize, payloads: payloads, progress: progress}
	problem := func(off int64, format string, args ...any) {
		res.Problems = append(res.Problems, SegmentProblem{Offset: off, Msg: fmt.Sprintf(format, args...)})
	}
	if res.FileSize < format.SegmentHeaderSize {
		problem(-1, "file of %d bytes is shorter than a segment header", res.FileSize)
		return res, nil
	}
	hb, err := r.readAt(format.SegmentHeaderSize, 0)
	if err != nil {
		return nil, err
	}
	if h, err := format.DecodeSegmentHeader(hb); err != nil {
		problem(0, "segment header: %v", err)
	} else {
		res.Header = &h
		if h.Number != number || h.Generation != gen {
			problem(0, "segment header names segment %d generation %#x, the index expects %d generation %#x", h.Number, h.Generation, number, gen)
		}
	}
	if mode == modeSealed {
		entries, dataEnd, err := r.readFooter(res.FileSize)
		if err != nil && recordedSize > format.SegmentHeaderSize && recordedSize < res.FileSize {
			// Bytes appended after the seal: the footer should still end at the recorded size.
			if e2, d2, err2 := r.readFooter(recordedSize); err2 == nil {
				problem(recordedSize, "%d bytes after the footer (the segment was sealed at %d bytes)", res.FileSize-recordedSize, recordedSize)
				entries, dataEnd, err = e2, d2, nil
			}
		}
		if err != nil {
			problem(-1, "no valid footer: %v", err)
		} else {
			res.Footer = true
			res.DataEnd = dataEnd
			return res, r.checkEntries(entries, dataEnd)
		}
	}
	return res, r.walk(mode)
}

// ReadRecordAt reads and checks the record (or batch record) at offset off of the segment
// file at path on fs (nil: vfs.Default), which the index describes by m, as ReadSegment checks
// each record: with payloads, every shard checksum too. Invalid bytes go into the result's Err;
// only I/O errors (including a missing file) are returned.
func ReadRecordAt(fs vfs.FS, path string, m index.SegmentMeta, off int64, payloads bool, progress func(int64)) (RecordInfo, error) {
	if fs == nil {
		fs = vfs.Default
	}
	f, err := fs.Open(path)
	if err != nil {
		return RecordInfo{}, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return RecordInfo{}, err
	}
	res := &SegmentRead{Path: path, FileSize: st.Size()}
	r := &segReader{f: f, res: res, number: m.Number, gen: m.Generation, payloads: payloads, progress: progress}
	if res.FileSize >= format.SegmentHeaderSize {
		hb, err := r.readAt(format.SegmentHeaderSize, 0)
		if err != nil {
			return RecordInfo{}, err
		}
		if h, err := format.DecodeSegmentHeader(hb); err == nil {
			res.Header = &h
		}
	}
	if off < format.SegmentHeaderSize || off%format.Alignment != 0 {
		return RecordInfo{Offset: off, Err: fmt.Errorf("%w: offset %d is not a record's", format.ErrCorrupt, off)}, nil
	}
	return r.checkRecord(off, 0)
}

// scannedRecords turns the records of a wal scan (wal.ScanSegment) into RecordInfos, in file
// order: one per record, and one per batch record, whose blocks the scan lists one by one at
// the batch's offset. The scan verified every shard checksum of what it lists.
func scannedRecords(srs []wal.ScannedRecord) []RecordInfo {
	out := make([]RecordInfo, 0, len(srs))
	for k := 0; k < len(srs); k++ {
		sr := &srs[k]
		hd := sr.Header
		if sr.BatchBlocks == 0 {
			out = append(out, RecordInfo{Offset: sr.Offset, Length: sr.Length(), ID: hd.ID, Seq: hd.Seq, HeaderCRC: sr.HeaderCRC,
				Header: &hd, PayloadChecked: true})
			continue
		}
		n := sr.BatchBlocks
		bi := &BatchInfo{Committed: true, Header: format.BatchHeader{Segment: hd.Segment, Generation: hd.Generation,
			FirstSeq: hd.Seq - uint64(sr.BatchPos), Layout: hd.Layout, IDs: make([]format.BlockID, n)}, ShardCRCs: make([][]uint32, n)}
		for ; k < len(srs) && srs[k].Offset == sr.Offset && srs[k].BatchBlocks == n; k++ {
			if b := srs[k].BatchPos; b >= 0 && b < n {
				bi.Header.IDs[b], bi.ShardCRCs[b] = srs[k].Header.ID, srs[k].Header.ShardCRCs
			}
		}
		k--
		out = append(out, RecordInfo{Offset: sr.Offset, Length: sr.Length(), ID: bi.Header.IDs[0], Seq: bi.Header.FirstSeq,
			HeaderCRC: sr.HeaderCRC, Batch: bi, PayloadChecked: true})
	}
	return out
}

// readFooter reads and checks the trailer and entries of a sealed segment.
// size is where the footer ends: the file size, or the size recorded at sealing.
func (r *segReader) readFooter(size int64) ([]format.FooterEntry, int64, error) {
	if size%format.Alignment != 0 || size < 2*format.Alignment {
		return nil, 0, fmt.Errorf("%w: file size %d is not a sealed segment's (a multiple of %d past the header)", format.ErrCorrupt, size, format.Alignment)
	}
	tb, err := r.readAt(format.Alignment, size-format.Alignment)
	if err != nil {
		return nil, 0, err
	}
	t, err := format.DecodeTrailer(tb, size)
	if err != nil {
		return nil, 0, err
	}
	if t.Segment != r.number || t.Generation != r.gen {
		return nil, 0, fmt.Errorf("%w: footer names segment %d generation %#x, want %d generation %#x", format.ErrCorrupt, t.Segment, t.Generation, r.number, r.gen)
	}
	fb, err := r.readAt(int(size-t.DataEnd), t.DataEnd)
	if err != nil {
		return nil, 0, err
	}
	entries, err := format.DecodeFooterEntries(fb, t)
	if err != nil {
		return nil, 0, err
	}
	return entries, t.DataEnd, nil
}

// checkEntries checks every record the footer lists and that they tile the data area.
func (r *segReader) checkEntries(entries []format.FooterEntry, dataEnd int64) error {
	next := int64(format.SegmentHeaderSize)
	for _, e := range entries {
		if e.Offset != next {
			dead, err := r.deadGap(next, e.Offset)
			if err != nil {
				return err
			}
			if !dead {
				r.res.Problems = append(r.res.Problems, SegmentProblem{Offset: next,
					Msg: fmt.Sprintf("%d bytes between records not listed in the footer (next record at %d)", e.Offset-next, e.Offset)})
			}
		}
		next = e.Offset + e.Length
		ri, err := r.checkRecord(e.Offset, e.Length)
		if err != nil {
			return err
		}
		if ri.Header == nil && ri.Batch == nil {
			ri.ID, ri.Seq, ri.Length = e.ID, e.Seq, e.Length
		}
		if ri.Batch != nil {
			ri.Batch.Listed = true // committed, whatever its commit block holds now
		}
		if ri.Err == nil {
			switch {
			case ri.Batch != nil && (e.Type != format.RecordBatch || e.Kind != 0):
				ri.Err = fmt.Errorf("%w: record is a batch record, the footer lists type %d kind %d", format.ErrCorrupt, e.Type, e.Kind)
			case ri.ID != e.ID:
				ri.Err = fmt.Errorf("%w: record holds block %s, the footer lists %s", format.ErrCorrupt, ri.ID, e.ID)
			case ri.Seq != e.Seq || ri.HeaderCRC != e.HeaderCRC:
				ri.Err = fmt.Errorf("%w: record seq %d header crc %#08x, the footer lists seq %d crc %#08x", format.ErrCorrupt, ri.Seq, ri.HeaderCRC, e.Seq, e.HeaderCRC)
			case ri.Length != e.Length:
				ri.Err = fmt.Errorf("%w: record is %d bytes, the footer lists %d", format.ErrCorrupt, ri.Length, e.Length)
			case ri.Header != nil && (ri.Header.Type != e.Type || ri.Header.Kind != e.Kind):
				ri.Err = fmt.Errorf("%w: record is of type %d kind %d, the footer lists type %d kind %d", format.ErrCorrupt, ri.Header.Type, ri.Header.Kind, e.Type, e.Kind)
			}
		}
		r.res.Records = append(r.res.Records, ri)
	}
	if next != dataEnd {
		dead, err := r.deadGap(next, dataEnd)
		if err != nil {
			return err
		}
		if !dead {
			r.res.Problems = append(r.res.Problems, SegmentProblem{Offset: next,
				Msg: fmt.Sprintf("%d bytes between the last record and the footer at %d", dataEnd-next, dataEnd)})
		}
	}
	return nil
}

// deadGap reports whether the bytes [from, to) of a sealed segment, which its footer does not
// list, hold nothing but batch records that never committed, back to back: the extents of
// batches the writer abandoned (or recovery found uncommitted), which a footer does not list.
// It then adds them to the records (valid, uncommitted: dead bytes). Anything else in the gap
// (another record, zeros, a committed batch, a bad header) makes it false and adds nothing.
func (r *segReader) deadGap(from, to int64) (bool, error) {
	if from >= to {
		return false, nil
	}
	var found []RecordInfo
	for off := from; off < to; {
		if off+format.RecordHeaderSize > to {
			return false, nil
		}
		ri, err := r.checkRecord(off, 0)
		if err != nil {
			return false, err
		}
		if ri.Batch == nil || ri.Err != nil || ri.Batch.Committed || off+ri.Length > to {
			return false, nil
		}
		found = append(found, ri)
		off += ri.Length
	}
	r.res.Records = append(r.res.Records, found...)
	return true, nil
}

// walk reads records one after the other from the header, up to the end of the file (or the
// footer's data end). In modeUnsealed the first invalid record ends the walk (Stop); in
// modeSealed an invalid record is recorded and the walk goes on: past its payload when its
// header is valid, else to the next 4 KiB block that holds a valid header of this segment.
func (r *segReader) walk(mode readMode) error {
	limit := r.res.FileSize &^ (format.Alignment - 1)
	off := int64(format.SegmentHeaderSize)
	resync := false
	listed := 0 // the footer entries of the records walked so far
	for off+format.RecordHeaderSize <= limit {
		if mode == modeSealed && r.recordedSize > 0 && off+format.FooterSize(listed) == r.recordedSize {
			break // where the (unreadable) footer of the records walked so far starts
		}
		hb, err := r.readAt(format.RecordHeaderSize, off)
		if err != nil {
			return err
		}
		if format.IsZeroBlock(hb) {
			if mode == modeUnsealed {
				break // clean end of the log
			}
			off += format.Alignment
			continue
		}
		if resync {
			starts, err := r.recordStarts(hb, off)
			if err != nil {
				return err
			}
			if !starts {
				off += format.Alignment
				continue
			}
			resync = false
		}
		ri, err := r.checkRecord(off, 0)
		if err != nil {
			return err
		}
		// A batch whose header is valid is passed over whatever its commit block and shards
		// hold, as recovery's scan does (its extent is known); anything else invalid ends an
		// unsealed log.
		if ri.Err != nil && mode == modeUnsealed && (ri.Batch == nil || !ri.Batch.Committed) {
			r.res.Stop = &wal.CorruptionError{Path: r.res.Path, Offset: off, ID: ri.ID, Err: ri.Err}
			break
		}
		r.res.Records = append(r.res.Records, ri)
		if ri.Batch == nil || ri.Batch.Committed {
			listed++
		}
		if (ri.Header == nil && ri.Batch == nil) || ri.Length == 0 {
			resync = true
			off += format.Alignment
			continue
		}
		off += ri.Length
	}
	r.res.DataEnd = off
	if mode == modeUnsealed && r.res.Stop == nil && off == limit && limit < r.res.FileSize {
		r.res.Stop = &wal.CorruptionError{Path: r.res.Path, Offset: off, Err: fmt.Errorf("%w: partial record header", format.ErrCorrupt)}
	}
	return nil
}

// checkRecord reads and checks the record at off. length is the on-disk size a footer gives
// (0: take it from the header). Invalid bytes go to the result's Err; only I/O errors are
// returned.
func (r *segReader) checkRecord(off, length int64) (RecordInfo, error) {
	ri := RecordInfo{Offset: off, Length: length}
	n := int64(format.RecordHeaderSize)
	if r.payloads && length > 0 {
		n = length // header and payload in one read
	}
	if off+n > r.res.FileSize {
		ri.Err = fmt.Errorf("%w: record of %d bytes runs past the end of the file (%d)", format.ErrCorrupt, n, r.res.FileSize)
		return ri, nil
	}
	b, err := r.readAt(int(n), off)
	if err != nil {
		return ri, err
	}
	if format.RecordType(b[6]) == format.RecordBatch {
		return r.checkBatch(ri, b)
	}
	h, crc, err := format.DecodeRecordHeader(b[:format.RecordHeaderSize])
	if err != nil {
		ri.Err = err
		return ri, nil
	}
	ri.Header, ri.ID, ri.Seq, ri.HeaderCRC, ri.Length = &h, h.ID, h.Seq, crc, h.RecordBytes()
	switch {
	case h.Segment != r.number || h.Generation != r.gen:
		ri.Err = fmt.Errorf("%w: record of segment %d generation %#x in segment %d generation %#x (stale bytes)", format.ErrCorrupt, h.Segment, h.Generation, r.number, r.gen)
		return ri, nil
	case length > 0 && length != ri.Length:
		ri.Err = fmt.Errorf("%w: record header implies %d bytes, the footer lists %d", format.ErrCorrupt, ri.Length, length)
		return ri, nil
	case off+ri.Length > r.res.FileSize:
		ri.Err = fmt.Errorf("%w: record of %d bytes runs past the end of the file (%d)", format.ErrCorrupt, ri.Length, r.res.FileSize)
		return ri, nil
	}
	if !r.payloads {
		return ri, nil
	}
	payload := b[format.RecordHeaderSize:]
	if int64(len(b)) < ri.Length {
		if payload, err = r.readAt(int(ri.Length-format.RecordHeaderSize), off+format.RecordHeaderSize); err != nil {
			return ri, err
		}
	}
	// Raw records: every shard CRC. Compressed ones: every stored CRC (the bytes on disk), then,
	// decompressed, every raw CRC (the bytes a load returns).
	var scratch []byte
	if h.Compression != format.CompressionNone {
		scratch = make([]byte, 2*h.Layout.ShardBytes)
	}
	if err := format.VerifyPayload(&h, payload, nil, scratch); err != nil {
		ri.Err = err
		return ri, nil
	}
	ri.PayloadChecked = true
	return ri, nil
}

// recordStarts reports whether the 4 KiB block hb read at off starts a record of this segment:
// a record header or a batch header that decodes and names this segment and generation.
func (r *segReader) recordStarts(hb []byte, off int64) (bool, error) {
	if format.RecordType(hb[6]) != format.RecordBatch {
		h, _, err := format.DecodeRecordHeader(hb)
		return err == nil && h.Segment == r.number && h.Generation == r.gen, nil
	}
	_, size, err := format.PeekBatchHeader(hb)
	if err != nil || off+size > r.res.FileSize {
		return false, nil
	}
	b, err := r.readInto(&r.aux, int(size), off)
	if err != nil {
		return false, err
	}
	h, _, err := format.DecodeBatchHeader(b)
	return err == nil && h.Segment == r.number && h.Generation == r.gen, nil
}

// checkBatch checks the batch record (docs/format.md §4c) at ri.Offset, whose first bytes
// checkRecord read into b (ri.Length: the footer's length, 0 when unknown): its header, that
// it belongs to this segment and fits the file, its commit block and, with payloads, every
// shard against the commit block's checksums. A batch whose commit block is missing or does
// not match its header never committed: it is valid and its extent is dead bytes
// (BatchInfo.Committed false). A bad shard makes the record invalid, naming the block and the
// shard. Only I/O errors are returned.
func (r *segReader) checkBatch(ri RecordInfo, b []byte) (RecordInfo, error) {
	off, length := ri.Offset, ri.Length
	// get returns the bytes [start, start+n) of the record, from b when it holds them.
	get := func(start, n int64) ([]byte, error) {
		if start+n <= int64(len(b)) {
			return b[start : start+n], nil
		}
		return r.readInto(&r.aux, int(n), off+start)
	}
	_, size, err := format.PeekBatchHeader(b[:format.RecordHeaderSize])
	if err != nil {
		ri.Err = err
		return ri, nil
	}
	if off+size > r.res.FileSize {
		ri.Err = fmt.Errorf("%w: batch header of %d bytes runs past the end of the file (%d)", format.ErrCorrupt, size, r.res.FileSize)
		return ri, nil
	}
	hb, err := get(0, size)
	if err != nil {
		return ri, err
	}
	bh, crc, err := format.DecodeBatchHeader(hb)
	if err != nil {
		ri.Err = err
		return ri, nil
	}
	bi := &BatchInfo{Header: bh}
	extent := bh.ExtentBytes()
	ri.Batch, ri.ID, ri.Seq, ri.HeaderCRC, ri.Length = bi, bh.IDs[0], bh.FirstSeq, crc, extent
	switch {
	case r.res.Header != nil && r.res.Header.Features&format.FeatureBatchRecords == 0:
		ri.Err = fmt.Errorf("%w: batch record in a segment without the batch-records feature flag", format.ErrCorrupt)
	case bh.Segment != r.number || bh.Generation != r.gen:
		ri.Err = fmt.Errorf("%w: batch record of segment %d generation %#x in segment %d generation %#x (stale bytes)", format.ErrCorrupt, bh.Segment, bh.Generation, r.number, r.gen)
	case length > 0 && length != extent:
		ri.Err = fmt.Errorf("%w: batch header implies %d bytes, the footer lists %d", format.ErrCorrupt, extent, length)
	case off+extent > r.res.FileSize:
		ri.Err = fmt.Errorf("%w: batch record of %d bytes runs past the end of the file (%d)", format.ErrCorrupt, extent, r.res.FileSize)
	}
	if ri.Err != nil {
		return ri, nil
	}
	n, l := len(bh.IDs), bh.Layout
	cb, err := get(bh.CommitOffset(), format.BatchCommitSize(n, l.Shards))
	if err != nil {
		return ri, err
	}
	c, err := format.DecodeBatchCommit(cb, &bh, crc)
	if err != nil {
		bi.CommitErr = err
		return ri, nil
	}
	bi.Committed = true
	bi.ShardCRCs = make([][]uint32, n)
	for k := range bi.ShardCRCs {
		bi.ShardCRCs[k] = c.BlockCRCs(k)
	}
	if !r.payloads {
		return ri, nil
	}
	stride := l.ShardStride()
	bad := make([]bool, n)
	for i := 0; i < l.Shards; i++ {
		run, err := get(bh.ShardOffset(0, i), int64(n)*stride) // shard i of every block
		if err != nil {
			return ri, err
		}
		for k := 0; k < n; k++ {
			s := run[int64(k)*stride : int64(k)*stride+l.ShardBytes]
			if got, want := format.Checksum(s), c.ShardCRCs[i*n+k]; got != want && !bad[k] {
				bad[k] = true
				if ri.Err == nil {
					ri.Err = fmt.Errorf("%w: block %s (position %d of the batch) shard %d checksum: commit block has %#08x, computed %#08x",
						format.ErrCorrupt, bh.IDs[k], k, i, want, got)
				}
			}
		}
	}
	for k, isBad := range bad {
		if isBad {
			bi.Bad = append(bi.Bad, k)
		}
	}
	ri.PayloadChecked = ri.Err == nil
	return ri, nil
}
