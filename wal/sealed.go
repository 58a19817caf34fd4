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
