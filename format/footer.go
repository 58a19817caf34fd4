package format

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Footer of a sealed segment: written once, after the last record, at an Alignment boundary
// (DataEnd). It lists every record so an index can be rebuilt, and another instance can read the
// segment, without scanning payloads (Bitcask's hint file, inside the segment).
//
//	DataEnd:  entry 0 .. entry n-1        n × 48 bytes
//	          zero padding
//	          trailer                     last 64 bytes; the footer ends the file at an Alignment boundary
//
// Footer entry (48 bytes):
//
//	offset size field
//	     0   16 block id (batch: the id of its block 0)
//	    16    8 record offset in the segment (uint64 LE, Alignment-aligned)
//	    24    8 record bytes on disk, header included (uint64 LE; batch: its ExtentBytes, a
//	            multiple of Alignment in [3·Alignment, MaxBatchExtent])
//	    32    8 sequence number (uint64 LE; batch: its first sequence number)
//	    40    4 record header CRC32C (uint32 LE; the header holds the shard CRCs; batch: the
//	            batch header's CRC, its commit block holds the shard CRCs)
//	    44    1 record type (1 = block, 2 = sidecar, 3 = batch: FeatureBatchRecords segments only)
//	    45    1 zero
//	    46    2 sidecar kind (uint16 LE; 0 for a block and a batch; FeatureSidecars segments only)
//
// A batch record has one entry, for all its blocks: a reader takes the ids from its header and
// the shard CRCs from its commit block. Only committed batches are listed.
//
// Trailer (64 bytes):
//
//	offset size field
//	     0    8 magic "UCMGOFTR"
//	     8    4 format version (uint32 LE)
//	    12    4 entry count n (uint32 LE)
//	    16    8 DataEnd (uint64 LE)
//	    24    8 segment number (uint64 LE)
//	    32    8 segment generation (uint64 LE)
//	    40    4 CRC32C of the n entries (uint32 LE)
//	    44   16 zero
//	    60    4 CRC32C of trailer bytes [0, 60) (uint32 LE)
//
// Part of the on-disk format: do not change without bumping Version.
const (
	FooterEntrySize = 48
	TrailerSize     = 64
	footMagic       = "UCMGOFTR"
	trOffVersion    = 8
	trOffCount      = 12
	trOffDataEnd    = 16
	trOffSegment    = 24
	trOffGeneration = 32
	trOffEntriesCRC = 40
	trOffCRC        = 60
)

// FooterEntry describes one record of a sealed segment.
type FooterEntry struct {
	ID        BlockID
	Offset    int64
	Length    int64
	Seq       uint64
	HeaderCRC uint32
	Type      RecordType
	// Kind is the sidecar kind of a RecordSidecar entry (0 for a block).
	Kind SidecarKind
}

// Trailer is the decoded fixed-size end of a footer.
type Trailer struct {
	Count      int
	DataEnd    int64
	Segment    uint64
	Generation uint64
	EntriesCRC uint32
}

// FooterSize is the on-disk size of a footer listing n records.
func FooterSize(n int) int64 { return AlignUp(int64(n)*FooterEntrySize + TrailerSize) }

// EncodeFooter returns the footer bytes (FooterSize(len(entries)) long, Alignment-aligned in size)
// for a segment whose records end at dataEnd.
func EncodeFooter(segment, generation uint64, dataEnd int64, entries []FooterEntry) ([]byte, error) {
	if dataEnd < SegmentHeaderSize || dataEnd%Alignment != 0 {
		return nil, errorf(ErrInvalid, "footer: data end %d not an aligned offset past the header", dataEnd)
	}
	buf := make([]byte, FooterSize(len(entries)))
	le := binary.LittleEndian
	for i, e := range entries {
		if e.Offset < SegmentHeaderSize || e.Offset%Alignment != 0 || e.Length < RecordHeaderSize || e.Offset+e.Length > dataEnd {
			return nil, errorf(ErrInvalid, "footer entry %d (%s): offset %d length %d outside [%d, %d)", i, e.ID, e.Offset, e.Length, SegmentHeaderSize, dataEnd)
		}
		b := buf[i*FooterEntrySize:]
		copy(b, e.ID[:])
		le.PutUint64(b[16:], uint64(e.Offset))
		le.PutUint64(b[24:], uint64(e.Length))
		le.PutUint64(b[32:], e.Seq)
		le.PutUint32(b[40:], e.HeaderCRC)
		b[44] = byte(e.Type)
		le.PutUint16(b[46:], uint16(e.Kind))
	}
	tr := buf[len(buf)-TrailerSize:]
	copy(tr, footMagic)
	le.PutUint32(tr[trOffVersion:], Version)
	le.PutUint32(tr[trOffCount:], uint32(len(entries)))
	le.PutUint64(tr[trOffDataEnd:], uint64(dataEnd))
	le.PutUint64(tr[trOffSegment:], segment)
	le.PutUint64(tr[trOffGeneration:], generation)
	le.PutUint32(tr[trOffEntriesCRC:], Checksum(buf[:len(entries)*FooterEntrySize]))
	le.PutUint32(tr[trOffCRC:], Checksum(tr[:trOffCRC]))
	return buf, nil
}

// DecodeTrailer checks and decodes the last TrailerSize bytes of src, the tail of a segment file
// of fileSize bytes. It checks that the footer it describes fits exactly between DataEnd and
// fileSize, so the caller can size the entry read from the trailer alone.
func DecodeTrailer(src []byte, fileSize int64) (Trailer, error) {
	var t Trailer
	if len(src) < TrailerSize {
		return t, errorf(ErrCorrupt, "footer trailer: %d bytes, want %d", len(src), TrailerSize)
	}
	tr := src[len(src)-TrailerSize:]
	if !bytes.Equal(tr[:len(footMagic)], []byte(footMagic)) {
		return t, errorf(ErrCorrupt, "footer trailer: field magic: %q is not %q", tr[:len(footMagic)], footMagic)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(tr[trOffCRC:]), Checksum(tr[:trOffCRC]); got != want {
		return t, errorf(ErrCorrupt, "footer trailer: field crc: stored %#08x, computed %#08x", got, want)
	}
	if v := le.Uint32(tr[trOffVersion:]); v != Version {
		return t, errorf(ErrCorrupt, "footer trailer: field version: %d, this build reads %d", v, Version)
	}
	count := int64(le.Uint32(tr[trOffCount:]))
	dataEnd := le.Uint64(tr[trOffDataEnd:])
	if dataEnd < SegmentHeaderSize || dataEnd%Alignment != 0 || dataEnd > uint64(fileSize) {
		return t, errorf(ErrCorrupt, "footer trailer: field data end: %d not an aligned offset in [%d, %d]", dataEnd, SegmentHeaderSize, fileSize)
	}
	if maxCount := (int64(dataEnd) - SegmentHeaderSize) / RecordHeaderSize; count > maxCount {
		return t, errorf(ErrCorrupt, "footer trailer: field count: %d entries cannot fit in %d bytes of records", count, int64(dataEnd)-SegmentHeaderSize)
	}
	if want := int64(dataEnd) + FooterSize(int(count)); want != fileSize {
		return t, errorf(ErrCorrupt, "footer trailer: field count: %d entries after data end %d imply file size %d, file is %d", count, dataEnd, want, fileSize)
	}
	t.Count = int(count)
	t.DataEnd = int64(dataEnd)
	t.Segment = le.Uint64(tr[trOffSegment:])
	t.Generation = le.Uint64(tr[trOffGeneration:])
	t.EntriesCRC = le.Uint32(tr[trOffEntriesCRC:])
	return t, nil
}

// DecodeFooterEntries checks and decodes the entries a trailer announces. src holds the footer
// from DataEnd (at least t.Count × FooterEntrySize bytes). Entries must lie inside [header, DataEnd)
// and be in increasing, non-overlapping offset order.
func DecodeFooterEntries(src []byte, t Trailer) ([]FooterEntry, error) {
	n := t.Count * FooterEntrySize
	if t.Count < 0 || len(src) < n {
		return nil, errorf(ErrCorrupt, "footer: %d bytes hold fewer than %d entries", len(src), t.Count)
	}
	if got := Checksum(src[:n]); got != t.EntriesCRC {
		return nil, errorf(ErrCorrupt, "footer: field entries crc: stored %#08x, computed %#08x", t.EntriesCRC, got)
	}
	le := binary.LittleEndian
	entries := make([]FooterEntry, t.Count)
	next := int64(SegmentHeaderSize)
	for i := range entries {
		b := src[i*FooterEntrySize:]
		e := &entries[i]
		copy(e.ID[:], b[:16])
		off, length := le.Uint64(b[16:]), le.Uint64(b[24:])
		if off < uint64(next) || off%Alignment != 0 || length < RecordHeaderSize || length > RecordHeaderSize+MaxPayloadBytes || off+length > uint64(t.DataEnd) {
			return nil, errorf(ErrCorrupt, "footer entry %d (%s): offset %d length %d outside [%d, %d) or overlapping", i, e.ID, off, length, next, t.DataEnd)
		}
		e.Offset, e.Length = int64(off), int64(length)
		e.Seq = le.Uint64(b[32:])
		e.HeaderCRC = le.Uint32(b[40:])
		e.Type = RecordType(b[44])
		e.Kind = SidecarKind(le.Uint16(b[46:]))
		if p := entryProblem(e); p != "" {
			return nil, errorf(ErrCorrupt, "footer entry %d (%s): %s", i, e.ID, p)
		}
		next = e.Offset + e.Length
	}
	return entries, nil
}

// entryProblem describes what is inconsistent in a footer entry's type, kind and length ("" if
// nothing): a block has kind 0; a sidecar a valid kind; a batch kind 0 and an aligned length
// of at least a header, a run and a commit block and at most MaxBatchExtent.
func entryProblem(e *FooterEntry) string {
	switch e.Type {
	case RecordBlock:
		if e.Kind == 0 {
			return ""
		}
	case RecordSidecar:
		if ValidSidecarKind(e.Kind) {
			return ""
		}
	case RecordBatch:
		if e.Kind != 0 {
			return fmt.Sprintf("field kind: %d on a batch entry", e.Kind)
		}
		if e.Length%Alignment != 0 || e.Length < 3*Alignment || e.Length > MaxBatchExtent {
			return fmt.Sprintf("field length: batch extent %d not a multiple of %d in [%d, %d]", e.Length, Alignment, 3*Alignment, MaxBatchExtent)
		}
		return ""
	}
	return fmt.Sprintf("fields type %d, kind %d: neither a block, a sidecar nor a batch", e.Type, e.Kind)
}
