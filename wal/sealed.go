package wal

import (
	"fmt"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// sealedHeaderBatch bounds the record headers ReadSealedRecords reads in one submission.
const sealedHeaderBatch = 64

// ReadSealedRecords lists the records of sealed segment seg, whose file is size bytes, as a
// reader that has no index of it needs them: the footer is read and checked, then every record
// header it lists (one 4 KiB read each, in batches), each checked against its footer entry
// (header checksum, block id, sequence) and against the segment (number, generation). No
// payload is read: a load verifies the payload's shard checksums from the header. Anything
// that fails a check is a *CorruptionError; the segment is then unusable as a whole.
func ReadSealedRecords(seg *Segment, size int64, backend devio.Backend) ([]ScannedRecord, error) {
	entries, err := ReadFooter(seg, size, backend)
	if err != nil {
		return nil, err
	}
	out := make([]ScannedRecord, 0, len(entries))
	bufs := make([][]byte, min(len(entries), sealedHeaderBatch))
	for i := range bufs {
		bufs[i] = devio.AlignedBuffer(format.RecordHeaderSize)
	}
	for lo := 0; lo < len(entries); lo += sealedHeaderBatch {
		batch := entries[lo:min(len(entries), lo+sealedHeaderBatch)]
		ops := make([]devio.Op, len(batch))
		for k, fe := range batch {
			ops[k] = devio.Op{File: seg.file, Buf: bufs[k], Off: fe.Offset}
		}
		if err := backend.Submit(ops); err != nil {
			return nil, fmt.Errorf("read record headers of segment %d: %w", seg.Number, err)
		}
		for k, fe := range batch {
			if fe.Type == format.RecordBatch {
				recs, err := readSealedBatch(seg, fe, bufs[k], backend)
				if err != nil {
					return nil, err
				}
				out = append(out, recs...)
				continue
			}
			h, crc, err := format.DecodeRecordHeader(bufs[k])
			if err == nil && (crc != fe.HeaderCRC || h.ID != fe.ID || h.Seq != fe.Seq || h.Segment != seg.Number ||
				h.Generation != seg.Generation || h.RecordBytes() != fe.Length) {
				err = fmt.Errorf("%w: record header does not match its footer entry or segment", format.ErrCorrupt)
			}
			if err != nil {
				return nil, &CorruptionError{Path: seg.path, Offset: fe.Offset, ID: fe.ID, Err: err}
			}
			out = append(out, ScannedRecord{Header: h, Offset: fe.Offset, HeaderCRC: crc})
		}
	}
	return out, nil
}

// readSealedBatch reads the header and the commit block of the batch record a footer entry
// lists, first holding the record's first Alignment bytes (nil: read them), and checks them
// against the entry and the segment. Like a record header, the shards are not read: a load
// verifies them with the commit block's checksums.
func readSealedBatch(seg *Segment, fe format.FooterEntry, first []byte, backend devio.Backend) ([]ScannedRecord, error) {
	bh, crc, err := readBatchHeader(seg, fe, first, backend)
	if err != nil {
		return nil, err
	}
	cb := devio.AlignedBuffer(int(format.BatchCommitSize(len(bh.IDs), bh.Layout.Shards)))
	if err := backend.Submit([]devio.Op{{File: seg.file, Buf: cb, Off: fe.Offset + bh.CommitOffset()}}); err != nil {
		return nil, fmt.Errorf("read batch commit of segment %d at %d: %w", seg.Number, fe.Offset, err)
	}
	c, err := format.DecodeBatchCommit(cb, &bh, crc)
	if err != nil {
		return nil, &CorruptionError{Path: seg.path, Offset: fe.Offset, ID: fe.ID, Err: err}
	}
	return batchBlocks(&bh, crc, &c, fe.Offset), nil
}

// ReadBatchHeader reads the header of the batch record footer entry fe of sealed segment seg
// lists (fe.Type == format.RecordBatch) and checks it against the entry and the segment: what
// a reader walking a footer needs to know the batch's blocks. A mismatch is a
// *CorruptionError.
func ReadBatchHeader(seg *Segment, fe format.FooterEntry, backend devio.Backend) (format.BatchHeader, error) {
	bh, _, err := readBatchHeader(seg, fe, nil, backend)
	return bh, err
}

func readBatchHeader(seg *Segment, fe format.FooterEntry, first []byte, backend devio.Backend) (format.BatchHeader, uint32, error) {
	corrupt := func(err error) error { return &CorruptionError{Path: seg.path, Offset: fe.Offset, ID: fe.ID, Err: err} }
	if fe.Type != format.RecordBatch {
		return format.BatchHeader{}, 0, corrupt(fmt.Errorf("%w: footer entry of type %d is not a batch record", format.ErrInvalid, fe.Type))
	}
	if first == nil {
		first = devio.AlignedBuffer(format.Alignment)
		if err := backend.Submit([]devio.Op{{File: seg.file, Buf: first, Off: fe.Offset}}); err != nil {
			return format.BatchHeader{}, 0, fmt.Errorf("read batch header of segment %d at %d: %w", seg.Number, fe.Offset, err)
		}
	}
	_, size, err := format.PeekBatchHeader(first)
	if err != nil {
		return format.BatchHeader{}, 0, corrupt(err)
	}
	if size > fe.Length {
		return format.BatchHeader{}, 0, corrupt(fmt.Errorf("%w: batch header of %d bytes in a record of %d", format.ErrCorrupt, size, fe.Length))
	}
	hb := first
	if size > int64(len(first)) {
		hb = devio.AlignedBuffer(int(size))
		if err := backend.Submit([]devio.Op{{File: seg.file, Buf: hb, Off: fe.Offset}}); err != nil {
			return format.BatchHeader{}, 0, fmt.Errorf("read batch header of segment %d at %d: %w", seg.Number, fe.Offset, err)
		}
	}
	bh, crc, err := format.DecodeBatchHeader(hb)
	if err == nil && (crc != fe.HeaderCRC || bh.IDs[0] != fe.ID || bh.FirstSeq != fe.Seq || bh.Segment != seg.Number ||
		bh.Generation != seg.Generation || bh.ExtentBytes() != fe.Length) {
		err = fmt.Errorf("%w: batch header does not match its footer entry or segment", format.ErrCorrupt)
	}
	if err != nil {
		return format.BatchHeader{}, 0, corrupt(err)
	}
	return bh, crc, nil
}
