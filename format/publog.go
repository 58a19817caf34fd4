package format

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// Publication log: each instance on a shared tier appends, to a log file in its namespace, the
// location of every record as soon as the record is durable and indexed, before the dump that
// wrote it completes. Other instances tail these logs, so a block whose dump completed is found
// at once by any instance on the same host, and within one refresh interval across hosts, long
// before its segment is sealed and listed in a manifest (docs/sharing.md). The log is a hint:
// every load of a block found through it is checked like any other (record header, every shard
// checksum), so a damaged, stale or lying log can cause a miss, never wrong bytes.
//
// A log file (PUBLOG-<sequence>) starts with a header:
//
//	offset size field
//	     0    8 magic "UCMGOPLG"
//	     8    4 log version (uint32 LE, = PublogVersion)
//	    12    4 zero
//	    16   16 writer instance id
//	    32   16 writer host id (the kernel's boot id: equal ids mean one host, one page cache)
//	    48    8 sequence (uint64 LE): the number in the file name
//	    56    4 zero
//	    60    4 CRC32C of bytes [0, 60) (uint32 LE)
//	    64   32 schema fingerprint
//	    96    4 zero
//	   100    4 CRC32C of bytes [64, 100) (uint32 LE)
//
// then entries, each appended with one write:
//
//	offset size field
//	     0    4 body length n (uint32 LE, 1 <= n <= MaxPublogBody)
//	     4    4 CRC32C of the body (uint32 LE)
//	     8    n body
//
// A body is a type byte and its fields:
//
//	type 1, records of one segment:
//	     0    1 type (1)
//	     1    8 segment number (uint64 LE)
//	     9    8 segment generation (uint64 LE)
//	    17    4 record count c (uint32 LE, >= 1)
//	    21      c records: block id (16), sidecar kind (uint16 LE; 0 for a
//	            block), location length
//	            l (uint16 LE, <= MaxPublogLocation), l bytes of the location (the index's
//	            encoding, index.EncodeLocation, of the record in its owner's segment)
//	type 2, continued: the writer started log <sequence> and appends no more here:
//	     0    1 type (2)
//	     1    8 sequence (uint64 LE)
//
// A reader stops at the first entry that is incomplete (being written) or fails its checks
// (torn by a crash) and tries again from there later; nothing after it is used.
//
// Part of the on-disk format: do not change without bumping PublogVersion.
const (
	PublogHeaderSize  = 104
	PublogVersion     = 1
	PublogEntryHeader = 8
	// MaxPublogBody bounds an entry's body: a reader refuses a longer one before allocating.
	MaxPublogBody = 4 << 20
	// MaxPublogLocation bounds one record's encoded location.
	MaxPublogLocation = 4096

	publogMagic       = "UCMGOPLG"
	publogOffVer      = 8
	publogOffInstance = 16
	publogOffHost     = 32
	publogOffSeq      = 48
	publogOffCRC      = 60
	publogOffSchema   = 64
	publogOffCRC2     = 100

	// PublogRecords and PublogNext are the entry types.
	PublogRecords = 1
	PublogNext    = 2

	publogRecordsFixed = 21
	publogRecordFixed  = 16 + 2 + 2
)

// ErrShortPublogEntry says the bytes end inside a log entry: the writer has not finished
// appending it, or crashed while it did.
var ErrShortPublogEntry = errors.New("publication log: entry incomplete")

// PublogHeader is a decoded log header.
type PublogHeader struct {
	Instance InstanceID
	Host     [16]byte
	Sequence uint64
	Schema   Fingerprint
}

// EncodePublogHeader returns the PublogHeaderSize bytes of h.
func EncodePublogHeader(h PublogHeader) []byte {
	buf := make([]byte, PublogHeaderSize)
	le := binary.LittleEndian
	copy(buf, publogMagic)
	le.PutUint32(buf[publogOffVer:], PublogVersion)
	copy(buf[publogOffInstance:], h.Instance[:])
	copy(buf[publogOffHost:], h.Host[:])
	le.PutUint64(buf[publogOffSeq:], h.Sequence)
	le.PutUint32(buf[publogOffCRC:], Checksum(buf[:publogOffCRC]))
	copy(buf[publogOffSchema:], h.Schema[:])
	le.PutUint32(buf[publogOffCRC2:], Checksum(buf[publogOffSchema:publogOffCRC2]))
	return buf
}

// DecodePublogHeader checks and decodes a log header (the first PublogHeaderSize bytes of src):
// magic, both checksums, version, zero reserved bytes and an instance. Errors wrap ErrCorrupt.
func DecodePublogHeader(src []byte) (PublogHeader, error) {
	var h PublogHeader
	if len(src) < PublogHeaderSize {
		return h, errorf(ErrCorrupt, "publication log: header of %d bytes, want %d", len(src), PublogHeaderSize)
	}
	if !bytes.Equal(src[:len(publogMagic)], []byte(publogMagic)) {
		return h, errorf(ErrCorrupt, "publication log: field magic: %q is not %q", src[:len(publogMagic)], publogMagic)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(src[publogOffCRC:]), Checksum(src[:publogOffCRC]); got != want {
		return h, errorf(ErrCorrupt, "publication log: field crc: stored %#08x, computed %#08x", got, want)
	}
	if got, want := le.Uint32(src[publogOffCRC2:]), Checksum(src[publogOffSchema:publogOffCRC2]); got != want {
		return h, errorf(ErrCorrupt, "publication log: field schema crc: stored %#08x, computed %#08x", got, want)
	}
	if v := le.Uint32(src[publogOffVer:]); v != PublogVersion {
		return h, errorf(ErrCorrupt, "publication log: field version: %d, this build reads %d", v, PublogVersion)
	}
	if !IsZeroBlock(src[12:publogOffInstance]) || !IsZeroBlock(src[56:publogOffCRC]) || !IsZeroBlock(src[96:publogOffCRC2]) {
		return h, errorf(ErrCorrupt, "publication log: reserved bytes not zero")
	}
	copy(h.Instance[:], src[publogOffInstance:])
	if h.Instance == (InstanceID{}) {
		return h, errorf(ErrCorrupt, "publication log: field instance: zero instance id")
	}
	copy(h.Host[:], src[publogOffHost:])
	h.Sequence = le.Uint64(src[publogOffSeq:])
	copy(h.Schema[:], src[publogOffSchema:])
	return h, nil
}

// PublogRecord is one record a log entry announces.
type PublogRecord struct {
	ID       BlockID
	Kind     SidecarKind
	Location []byte // the index's encoding of the record's location in its owner's segment
}

// PublogEntry is a decoded log entry: the records of one segment (Type PublogRecords), or the
// sequence of the log that continues this one (Type PublogNext).
type PublogEntry struct {
	Type       byte
	Segment    uint64
	Generation uint64
	Records    []PublogRecord
	Next       uint64
}

// AppendPublogRecords appends the entry announcing recs of segment (number, generation) to dst.
// It fails (ErrInvalid) for no records, a location longer than MaxPublogLocation or a
// body longer than MaxPublogBody: split the records over several entries.
func AppendPublogRecords(dst []byte, number, generation uint64, recs []PublogRecord) ([]byte, error) {
	if len(recs) == 0 {
		return dst, errorf(ErrInvalid, "publication log: an entry with no records")
	}
	n := publogRecordsFixed
	for i, r := range recs {
		if len(r.Location) == 0 || len(r.Location) > MaxPublogLocation {
			return dst, errorf(ErrInvalid, "publication log: record %d (block %s): location of %d bytes, want 1..%d", i, r.ID, len(r.Location), MaxPublogLocation)
		}
		n += publogRecordFixed + len(r.Location)
	}
	if n > MaxPublogBody {
		return dst, errorf(ErrInvalid, "publication log: entry body of %d bytes, at most %d", n, MaxPublogBody)
	}
	le := binary.LittleEndian
	start := len(dst)
	dst = append(dst, make([]byte, PublogEntryHeader)...)
	dst = append(dst, PublogRecords)
	dst = le.AppendUint64(dst, number)
	dst = le.AppendUint64(dst, generation)
	dst = le.AppendUint32(dst, uint32(len(recs)))
	for _, r := range recs {
		dst = append(dst, r.ID[:]...)
		dst = le.AppendUint16(dst, uint16(r.Kind))
		dst = le.AppendUint16(dst, uint16(len(r.Location)))
		dst = append(dst, r.Location...)
	}
	return sealPublogEntry(dst, start), nil
}

// AppendPublogNext appends the entry saying the log continues in log sequence next.
func AppendPublogNext(dst []byte, next uint64) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, PublogEntryHeader)...)
	dst = append(dst, PublogNext)
	dst = binary.LittleEndian.AppendUint64(dst, next)
	return sealPublogEntry(dst, start)
}

func sealPublogEntry(dst []byte, start int) []byte {
	body := dst[start+PublogEntryHeader:]
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(dst[start+4:], Checksum(body))
	return dst
}

// DecodePublogEntry decodes the entry at the start of src and returns it with its size. It
// returns ErrShortPublogEntry when src holds only part of an entry (a reader has caught up with
// the writer, or the writer crashed mid-entry) and an error wrapping ErrCorrupt for an entry
// that fails its checks. The records' locations alias src.
func DecodePublogEntry(src []byte) (PublogEntry, int, error) {
	var e PublogEntry
	if len(src) < PublogEntryHeader {
		return e, 0, ErrShortPublogEntry
	}
	le := binary.LittleEndian
	n := le.Uint32(src)
	if n == 0 || n > MaxPublogBody {
		return e, 0, errorf(ErrCorrupt, "publication log: entry length %d, want 1..%d", n, MaxPublogBody)
	}
	size := PublogEntryHeader + int(n)
	if len(src) < size {
		return e, 0, ErrShortPublogEntry
	}
	body := src[PublogEntryHeader:size]
	if got, want := le.Uint32(src[4:]), Checksum(body); got != want {
		return e, 0, errorf(ErrCorrupt, "publication log: entry crc: stored %#08x, computed %#08x", got, want)
	}
	e.Type = body[0]
	switch e.Type {
	case PublogNext:
		if len(body) != 9 {
			return e, 0, errorf(ErrCorrupt, "publication log: continuation entry of %d bytes, want 9", len(body))
		}
		e.Next = le.Uint64(body[1:])
		return e, size, nil
	case PublogRecords:
	default:
		return e, 0, errorf(ErrCorrupt, "publication log: entry type %d unknown", e.Type)
	}
	if len(body) < publogRecordsFixed {
		return e, 0, errorf(ErrCorrupt, "publication log: records entry of %d bytes, want at least %d", len(body), publogRecordsFixed)
	}
	e.Segment = le.Uint64(body[1:])
	e.Generation = le.Uint64(body[9:])
	count := le.Uint32(body[17:])
	rest := body[publogRecordsFixed:]
	// Every record takes at least publogRecordFixed+1 bytes: the count is bounded by the body
	// before it sizes the slice.
	if count == 0 || uint64(count)*(publogRecordFixed+1) > uint64(len(rest)) {
		return e, 0, errorf(ErrCorrupt, "publication log: record count %d does not fit an entry of %d bytes", count, len(body))
	}
	e.Records = make([]PublogRecord, count)
	for i := range e.Records {
		if len(rest) < publogRecordFixed {
			return e, 0, errorf(ErrCorrupt, "publication log: record %d truncated", i)
		}
		r := &e.Records[i]
		copy(r.ID[:], rest)
		r.Kind = SidecarKind(le.Uint16(rest[16:]))
		l := int(le.Uint16(rest[18:]))
		rest = rest[publogRecordFixed:]
		if l == 0 || l > MaxPublogLocation || l > len(rest) {
			return e, 0, errorf(ErrCorrupt, "publication log: record %d: location of %d bytes (%d left, at most %d)", i, l, len(rest), MaxPublogLocation)
		}
		r.Location = rest[:l:l]
		rest = rest[l:]
	}
	if len(rest) != 0 {
		return e, 0, errorf(ErrCorrupt, "publication log: %d bytes after the last record", len(rest))
	}
	return e, size, nil
}
