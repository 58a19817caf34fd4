package format

import (
	"bytes"
	"encoding/binary"
	"slices"
)

// Manifest of a namespace on a shared tier: the list of sealed segments its owner (one engine
// instance) publishes to the other instances sharing the tier, and the owner's notes to them
// (docs/sharing.md). The owner rewrites it whole (temporary file, sync, rename) whenever it
// changes; a reader reads it whole, in one read, and trusts nothing in it before both checksums
// pass. A segment is listed only once it is sealed and durable, and is removed from the list
// before its file is deleted.
//
//	header (ManifestHeaderSize = 96 bytes):
//	offset size field
//	     0    8 magic "UCMGOMAN"
//	     8    4 manifest version (uint32 LE, = ManifestVersion)
//	    12    4 segment count n (uint32 LE, <= MaxManifestSegments)
//	    16   16 instance id of the owner
//	    32   32 schema fingerprint of every listed segment
//	    64    8 sequence (uint64 LE): increases with every manifest the owner writes
//	    72    8 written, Unix nanoseconds (int64 LE)
//	    80    4 CRC32C of everything after the header: entries and notes (uint32 LE)
//	    84    4 note count m (uint32 LE, <= MaxManifestNotes)
//	    88    4 zero
//	    92    4 CRC32C of header bytes [0, 92) (uint32 LE)
//	entries (n × ManifestEntrySize = 48 bytes), in increasing segment number order:
//	     0    8 segment number (uint64 LE, > 0)
//	     8    8 generation (uint64 LE)
//	    16    8 file size (uint64 LE): the sealed segment's size, footer included
//	    24    8 sealed, Unix nanoseconds (int64 LE): when the owner first published it
//	    32    8 accessed, Unix nanoseconds (int64 LE): the owner's last read of it (0: none)
//	    40    4 live records (uint32 LE): blocks of the owner's index in it when written
//	    44    4 zero
//	notes (m × ManifestNoteSize = 48 bytes), in any order:
//	     0    1 kind (NoteAccess, NoteRetire, NoteReclaimed; version 2 adds NoteGrant,
//	            NoteCredit, NoteSpace)
//	     1    7 zero
//	     8   16 instance id owning the segment the note is about (the space notes: the
//	            instance whose share of the tier it is about)
//	    24    8 segment number (uint64 LE, > 0); the space notes: a byte count (below)
//	    32    8 segment generation (uint64 LE); the space notes: a byte count (below)
//	    40    8 time, Unix nanoseconds (int64 LE); NoteSpace: a byte count (below)
//
// The space notes carry the admission account of a shared tier (docs/tiers.md): byte counts,
// each below 2^63, in the number, generation and time fields:
//
//	NoteGrant  (the lease holder's): Owner may hold Number bytes in total granted to it
//	           (cumulative, never decreasing); Time is when.
//	NoteCredit (the owner's own):    Number: bytes it gave back (cumulative, never decreasing);
//	           Generation: the largest grant it has seen.
//	NoteSpace  (the owner's own):    Number: bytes it holds on the tier (segments, their
//	           reservations, retired files in their grace); Generation: of those, bytes under
//	           grace; Time: bytes more it asks for.
//
// Part of the on-disk format: do not change without bumping ManifestVersion. Version 1 (no
// space notes) is still read.
const (
	ManifestHeaderSize = 96
	ManifestEntrySize  = 48
	ManifestNoteSize   = 48
	// ManifestVersion is the version of the manifest layout above (written; 1 is read too).
	ManifestVersion = 2
	// MaxManifestSegments bounds the entries of one manifest (48 MiB): 1M segments of the
	// default 256 MiB are 256 TiB in one namespace.
	MaxManifestSegments = 1 << 20
	// MaxManifestNotes bounds the notes of one manifest.
	MaxManifestNotes = 1 << 20

	manMagic        = "UCMGOMAN"
	manOffVersion   = 8
	manOffCount     = 12
	manOffInstance  = 16
	manOffSchema    = 32
	manOffSequence  = 64
	manOffWritten   = 72
	manOffEntriesCR = 80
	manOffNotes     = 84
	manOffCRC       = 92
)

// NoteKind says what a manifest note tells the other instances.
type NoteKind uint8

const (
	// NoteAccess: the manifest's instance read the segment at Time (an access hint for the
	// reclaimer's least-recently-used order across instances).
	NoteAccess NoteKind = 1
	// NoteRetire: the manifest's instance, holding the reclaimer lease, asks the segment's
	// owner to retire it (the shared tier is over its capacity).
	NoteRetire NoteKind = 2
	// NoteReclaimed: a reclaimer retired this namespace's segment while its owner was not
	// running; the owner drops it from its index at its next Open.
	NoteReclaimed NoteKind = 3
	// NoteGrant: the manifest's instance, holding the reclaimer lease, grants the Owner
	// Number bytes of the shared tier in total (cumulative). Version 2.
	NoteGrant NoteKind = 4
	// NoteCredit: the Owner (the manifest's instance) gave back Number bytes of its grants in
	// total (cumulative) and has seen grants of Generation bytes in total. Version 2.
	NoteCredit NoteKind = 5
	// NoteSpace: the Owner (the manifest's instance) holds Number bytes on the shared tier,
	// Generation of them under grace, and asks for Time bytes more. Version 2.
	NoteSpace NoteKind = 6
)

// ManifestNote is one note of a manifest about a segment of some namespace.
type ManifestNote struct {
	Kind       NoteKind
	Owner      InstanceID
	Number     uint64
	Generation uint64
	Time       int64 // Unix nanoseconds
}

// ManifestEntry is one published segment.
type ManifestEntry struct {
	Number     uint64
	Generation uint64
	Size       int64
	Sealed     int64  // Unix nanoseconds: when the owner first published the segment
	Accessed   int64  // Unix nanoseconds: the owner's last read of it, 0 for none
	Records    uint32 // live records when written (informative: readers use the footer)
}

// Manifest is the decoded list of a namespace's published segments.
type Manifest struct {
	Instance InstanceID
	Schema   Fingerprint
	Sequence uint64
	Written  int64 // Unix nanoseconds
	Segments []ManifestEntry
	Notes    []ManifestNote
}

// ManifestSize is the encoded size of a manifest listing n segments and m notes.
func ManifestSize(n, m int) int64 {
	return ManifestHeaderSize + int64(n)*ManifestEntrySize + int64(m)*ManifestNoteSize
}

// EncodeManifest returns the bytes of m. Segments must be in strictly increasing number order,
// with numbers > 0 and sizes of at least a segment header; at most MaxManifestSegments.
func EncodeManifest(m *Manifest) ([]byte, error) {
	if len(m.Segments) > MaxManifestSegments || len(m.Notes) > MaxManifestNotes {
		return nil, errorf(ErrInvalid, "manifest: %d segments and %d notes, at most %d and %d", len(m.Segments), len(m.Notes), MaxManifestSegments, MaxManifestNotes)
	}
	buf := make([]byte, ManifestSize(len(m.Segments), len(m.Notes)))
	le := binary.LittleEndian
	var prev uint64
	for i, s := range m.Segments {
		if s.Number <= prev || s.Size < SegmentHeaderSize {
			return nil, errorf(ErrInvalid, "manifest entry %d: segment %d size %d (numbers increasing from 1, sizes >= %d)", i, s.Number, s.Size, SegmentHeaderSize)
		}
		prev = s.Number
		b := buf[ManifestHeaderSize+i*ManifestEntrySize:]
		le.PutUint64(b, s.Number)
		le.PutUint64(b[8:], s.Generation)
		le.PutUint64(b[16:], uint64(s.Size))
		le.PutUint64(b[24:], uint64(s.Sealed))
		le.PutUint64(b[32:], uint64(s.Accessed))
		le.PutUint32(b[40:], s.Records)
	}
	notes := buf[ManifestHeaderSize+len(m.Segments)*ManifestEntrySize:]
	for i, nt := range m.Notes {
		if !nt.valid(ManifestVersion) {
			return nil, errorf(ErrInvalid, "manifest note %d: kind %d owner %x segment %d", i, nt.Kind, nt.Owner, nt.Number)
		}
		b := notes[i*ManifestNoteSize:]
		b[0] = byte(nt.Kind)
		copy(b[8:], nt.Owner[:])
		le.PutUint64(b[24:], nt.Number)
		le.PutUint64(b[32:], nt.Generation)
		le.PutUint64(b[40:], uint64(nt.Time))
	}
	copy(buf, manMagic)
	le.PutUint32(buf[manOffVersion:], ManifestVersion)
	le.PutUint32(buf[manOffCount:], uint32(len(m.Segments)))
	copy(buf[manOffInstance:], m.Instance[:])
	copy(buf[manOffSchema:], m.Schema[:])
	le.PutUint64(buf[manOffSequence:], m.Sequence)
	le.PutUint64(buf[manOffWritten:], uint64(m.Written))
	le.PutUint32(buf[manOffNotes:], uint32(len(m.Notes)))
	le.PutUint32(buf[manOffEntriesCR:], Checksum(buf[ManifestHeaderSize:]))
	le.PutUint32(buf[manOffCRC:], Checksum(buf[:manOffCRC]))
	return buf, nil
}

// DecodeManifest checks and decodes a whole manifest file. Every field is checked before it is
// used: magic, header checksum, version, a count that matches the length exactly (so a torn or
// truncated file is rejected, never half read), the entries' checksum, and entries in strictly
// increasing number order with plausible sizes. Errors wrap ErrCorrupt.
func DecodeManifest(src []byte) (*Manifest, error) {
	if len(src) < ManifestHeaderSize {
		return nil, errorf(ErrCorrupt, "manifest: %d bytes, shorter than its %d-byte header", len(src), ManifestHeaderSize)
	}
	if !bytes.Equal(src[:len(manMagic)], []byte(manMagic)) {
		return nil, errorf(ErrCorrupt, "manifest: field magic: %q is not %q", src[:len(manMagic)], manMagic)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(src[manOffCRC:]), Checksum(src[:manOffCRC]); got != want {
		return nil, errorf(ErrCorrupt, "manifest: field header crc: stored %#08x, computed %#08x", got, want)
	}
	version := le.Uint32(src[manOffVersion:])
	if version != 1 && version != ManifestVersion {
		return nil, errorf(ErrCorrupt, "manifest: field version: %d, this build reads 1 to %d", version, ManifestVersion)
	}
	n := int64(le.Uint32(src[manOffCount:]))
	nn := int64(le.Uint32(src[manOffNotes:]))
	if n > MaxManifestSegments || nn > MaxManifestNotes {
		return nil, errorf(ErrCorrupt, "manifest: field count: %d segments and %d notes, above %d and %d", n, nn, MaxManifestSegments, MaxManifestNotes)
	}
	if want := ManifestSize(int(n), int(nn)); int64(len(src)) != want {
		return nil, errorf(ErrCorrupt, "manifest: field count: %d entries and %d notes make %d bytes, file has %d", n, nn, want, len(src))
	}
	if got, want := Checksum(src[ManifestHeaderSize:]), le.Uint32(src[manOffEntriesCR:]); got != want {
		return nil, errorf(ErrCorrupt, "manifest: field entries crc: stored %#08x, computed %#08x", want, got)
	}
	if !IsZeroBlock(src[manOffNotes+4 : manOffCRC]) {
		return nil, errorf(ErrCorrupt, "manifest: reserved header bytes [88, 92) not zero")
	}
	m := &Manifest{Sequence: le.Uint64(src[manOffSequence:]), Written: int64(le.Uint64(src[manOffWritten:])),
		Segments: make([]ManifestEntry, n)}
	if nn > 0 {
		m.Notes = make([]ManifestNote, nn)
	}
	copy(m.Instance[:], src[manOffInstance:])
	copy(m.Schema[:], src[manOffSchema:])
	var prev uint64
	for i := range m.Segments {
		b := src[ManifestHeaderSize+i*ManifestEntrySize:]
		s := ManifestEntry{Number: le.Uint64(b), Generation: le.Uint64(b[8:]), Size: int64(le.Uint64(b[16:])),
			Sealed: int64(le.Uint64(b[24:])), Accessed: int64(le.Uint64(b[32:])), Records: le.Uint32(b[40:])}
		if !IsZeroBlock(b[44:ManifestEntrySize]) {
			return nil, errorf(ErrCorrupt, "manifest entry %d: reserved bytes not zero", i)
		}
		if s.Number <= prev {
			return nil, errorf(ErrCorrupt, "manifest entry %d: segment number %d not above %d", i, s.Number, prev)
		}
		if s.Size < SegmentHeaderSize || s.Size%Alignment != 0 {
			return nil, errorf(ErrCorrupt, "manifest entry %d: segment %d: size %d not an aligned size >= %d", i, s.Number, s.Size, SegmentHeaderSize)
		}
		if maxRecs := (s.Size - SegmentHeaderSize) / RecordHeaderSize; int64(s.Records) > maxRecs {
			return nil, errorf(ErrCorrupt, "manifest entry %d: segment %d: %d records cannot fit in %d bytes", i, s.Number, s.Records, s.Size)
		}
		prev = s.Number
		m.Segments[i] = s
	}
	notes := src[ManifestHeaderSize+int(n)*ManifestEntrySize:]
	for i := range m.Notes {
		b := notes[i*ManifestNoteSize:]
		nt := ManifestNote{Kind: NoteKind(b[0]), Number: le.Uint64(b[24:]), Generation: le.Uint64(b[32:]), Time: int64(le.Uint64(b[40:]))}
		copy(nt.Owner[:], b[8:24])
		if !nt.valid(version) || !IsZeroBlock(b[1:8]) {
			return nil, errorf(ErrCorrupt, "manifest note %d: kind %d owner %x segment %d", i, nt.Kind, nt.Owner, nt.Number)
		}
		m.Notes[i] = nt
	}
	return m, nil
}

// IsSpace reports whether the note kind is one of the admission account's (NoteGrant,
// NoteCredit, NoteSpace), whose fields hold byte counts rather than a segment's.
func (k NoteKind) IsSpace() bool { return k >= NoteGrant && k <= NoteSpace }

// valid reports whether the note may appear in a manifest of the given version: a known kind,
// an owner, and a segment number for the segment notes or byte counts below 2^63 for the space
// notes.
func (nt ManifestNote) valid(version uint32) bool {
	switch {
	case nt.Owner == (InstanceID{}):
		return false
	case nt.Kind >= NoteAccess && nt.Kind <= NoteReclaimed:
		return nt.Number > 0
	case nt.Kind.IsSpace() && version >= 2:
		return int64(nt.Number) >= 0 && int64(nt.Generation) >= 0 && nt.Time >= 0
	}
	return false
}

// Find returns the entry of segment n and whether the manifest lists it.
func (m *Manifest) Find(n uint64) (ManifestEntry, bool) {
	i, ok := slices.BinarySearchFunc(m.Segments, n, func(e ManifestEntry, n uint64) int {
		switch {
		case e.Number < n:
			return -1
		case e.Number > n:
			return 1
		}
		return 0
	})
	if !ok {
		return ManifestEntry{}, false
	}
	return m.Segments[i], true
}
