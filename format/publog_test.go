package format

import (
	"bytes"
	"errors"
	"testing"
)

func samplePublogHeader() PublogHeader {
	return PublogHeader{Instance: InstanceID{0xca, 0xfe, 1, 2}, Host: [16]byte{9, 8, 7}, Sequence: 1_790_000_000_000_000_042,
		Schema: Fingerprint{0x5c, 0x4e, 0x3a}}
}

func samplePublogEntries(t *testing.T) []byte {
	t.Helper()
	recs := []PublogRecord{
		{ID: BlockID{1, 2, 3}, Location: []byte{0xa1, 0xa2, 0xa3, 0xa4}},
		{ID: BlockID{1, 2, 3}, Kind: 2, Location: []byte{0xb1}},
	}
	buf, err := AppendPublogRecords(nil, 7, 0x77, recs)
	if err != nil {
		t.Fatal(err)
	}
	return AppendPublogNext(buf, 1_790_000_000_000_000_043)
}

func TestPublogGoldenAndRoundTrip(t *testing.T) {
	h := samplePublogHeader()
	buf := EncodePublogHeader(h)
	golden(t, "publog_header.golden", buf)
	got, err := DecodePublogHeader(buf)
	if err != nil || got != h {
		t.Fatalf("header round trip: %+v, %v", got, err)
	}
	for i := range buf {
		bad := append([]byte(nil), buf...)
		bad[i] ^= 0x21
		if _, err := DecodePublogHeader(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("header byte %d flipped: %v", i, err)
		}
	}
	if _, err := DecodePublogHeader(buf[:PublogHeaderSize-1]); !errors.Is(err, ErrCorrupt) {
		t.Fatal("short header decoded")
	}

	ents := samplePublogEntries(t)
	golden(t, "publog_entries.golden", ents)
	e, n, err := DecodePublogEntry(ents)
	if err != nil || e.Type != PublogRecords || e.Segment != 7 || e.Generation != 0x77 || len(e.Records) != 2 {
		t.Fatalf("records entry: %+v, %v", e, err)
	}
	if e.Records[1].Kind != 2 || !bytes.Equal(e.Records[0].Location, []byte{0xa1, 0xa2, 0xa3, 0xa4}) || e.Records[0].ID != (BlockID{1, 2, 3}) {
		t.Fatalf("records decoded as %+v", e.Records)
	}
	next, m, err := DecodePublogEntry(ents[n:])
	if err != nil || next.Type != PublogNext || next.Next != 1_790_000_000_000_000_043 || n+m != len(ents) {
		t.Fatalf("continuation entry: %+v, %d, %v", next, m, err)
	}
	// Every prefix of an entry is incomplete, never an error or a record.
	for i := range n {
		if _, _, err := DecodePublogEntry(ents[:i]); i >= PublogEntryHeader && !errors.Is(err, ErrShortPublogEntry) || i < PublogEntryHeader && err != ErrShortPublogEntry {
			t.Fatalf("prefix of %d bytes: %v", i, err)
		}
	}
	// Any flipped byte of an entry fails its checks (or, in the length, makes it incomplete).
	for i := range n {
		bad := append([]byte(nil), ents[:n]...)
		bad[i] ^= 0x10
		if _, _, err := DecodePublogEntry(bad); err == nil {
			t.Fatalf("entry byte %d flipped: decoded", i)
		}
	}
}

func TestPublogRecordsRefusesBadInput(t *testing.T) {
	if _, err := AppendPublogRecords(nil, 1, 1, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no records: %v", err)
	}
	if _, err := AppendPublogRecords(nil, 1, 1, []PublogRecord{{ID: BlockID{1}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty location: %v", err)
	}
	long := make([]byte, MaxPublogLocation+1)
	if _, err := AppendPublogRecords(nil, 1, 1, []PublogRecord{{ID: BlockID{1}, Location: long}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("long location: %v", err)
	}
	many := make([]PublogRecord, MaxPublogBody/(publogRecordFixed+MaxPublogLocation)+1)
	for i := range many {
		many[i] = PublogRecord{ID: BlockID{byte(i)}, Location: make([]byte, MaxPublogLocation)}
	}
	if _, err := AppendPublogRecords(nil, 1, 1, many); !errors.Is(err, ErrInvalid) {
		t.Fatalf("oversized body: %v", err)
	}
}

// FuzzDecodePublogEntry: arbitrary bytes never panic, fail only as incomplete or ErrCorrupt,
// and an entry that decodes re-encodes to the same bytes.
func FuzzDecodePublogEntry(f *testing.F) {
	buf, _ := AppendPublogRecords(nil, 3, 4, []PublogRecord{{ID: BlockID{5}, Location: []byte{1, 2}}})
	f.Add(buf)
	f.Add(AppendPublogNext(nil, 9))
	f.Add(EncodePublogHeader(samplePublogHeader()))
	f.Fuzz(func(t *testing.T, src []byte) {
		if h, err := DecodePublogHeader(src); err == nil {
			if !bytes.Equal(EncodePublogHeader(h), src[:PublogHeaderSize]) {
				t.Fatal("decoded header re-encodes to other bytes")
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("header error does not wrap ErrCorrupt: %v", err)
		}
		e, n, err := DecodePublogEntry(src)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShortPublogEntry) {
				t.Fatalf("entry error is neither incomplete nor corrupt: %v", err)
			}
			return
		}
		var again []byte
		if e.Type == PublogNext {
			again = AppendPublogNext(nil, e.Next)
		} else if again, err = AppendPublogRecords(nil, e.Segment, e.Generation, e.Records); err != nil {
			t.Fatalf("decoded entry does not re-encode: %v", err)
		}
		if !bytes.Equal(again, src[:n]) {
			t.Fatal("decoded entry re-encodes to other bytes")
		}
	})
}
