package format

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

func sampleManifest() *Manifest {
	m := &Manifest{Sequence: 9, Written: 1_790_000_000_000_000_000, Segments: []ManifestEntry{
		{Number: 3, Generation: 0x1122334455667788, Size: 256 << 20, Sealed: 1_790_000_000_000_000_001, Records: 127},
		{Number: 7, Generation: 42, Size: 3 * Alignment, Sealed: 1_790_000_000_000_000_002, Accessed: 1_790_000_000_000_000_009, Records: 1},
	}, Notes: []ManifestNote{
		{Kind: NoteAccess, Owner: InstanceID{7}, Number: 12, Generation: 99, Time: 1_790_000_000_000_000_005},
		{Kind: NoteRetire, Owner: InstanceID{8}, Number: 1, Generation: 3, Time: 1_790_000_000_000_000_006},
		{Kind: NoteReclaimed, Owner: InstanceID{0xa0}, Number: 2, Generation: 4, Time: 1_790_000_000_000_000_007},
		{Kind: NoteGrant, Owner: InstanceID{7}, Number: 3 << 20, Time: 1_790_000_000_000_000_008},
		{Kind: NoteCredit, Owner: InstanceID{0xa0}, Number: 0, Generation: 5 << 20},
		{Kind: NoteSpace, Owner: InstanceID{0xa0}, Number: 2 << 20, Generation: 1 << 20, Time: 256 << 10},
	}}
	for i := range m.Instance {
		m.Instance[i] = byte(0xa0 + i)
	}
	for i := range m.Schema {
		m.Schema[i] = byte(i)
	}
	return m
}

func TestManifestGoldenAndRoundTrip(t *testing.T) {
	m := sampleManifest()
	buf, err := EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "manifest.golden", buf)
	got, err := DecodeManifest(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip: got %+v want %+v", got, m)
	}
	if e, ok := got.Find(7); !ok || e.Generation != 42 {
		t.Fatalf("Find(7) = %+v, %v", e, ok)
	}
	if _, ok := got.Find(5); ok {
		t.Fatal("Find(5) found a segment the manifest does not list")
	}
	empty, err := EncodeManifest(&Manifest{})
	if err != nil || int64(len(empty)) != ManifestHeaderSize {
		t.Fatalf("empty manifest: %d bytes, %v", len(empty), err)
	}
	if m2, err := DecodeManifest(empty); err != nil || len(m2.Segments) != 0 {
		t.Fatalf("empty manifest decodes to %+v, %v", m2, err)
	}
}

func TestManifestEncodeRefusesBadEntries(t *testing.T) {
	for name, segs := range map[string][]ManifestEntry{
		"zero number":    {{Number: 0, Size: Alignment}},
		"out of order":   {{Number: 5, Size: Alignment}, {Number: 4, Size: Alignment}},
		"duplicate":      {{Number: 5, Size: Alignment}, {Number: 5, Size: Alignment}},
		"size too small": {{Number: 1, Size: 100}},
	} {
		if _, err := EncodeManifest(&Manifest{Segments: segs}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	for name, nt := range map[string]ManifestNote{
		"unknown kind": {Kind: 9, Owner: InstanceID{1}, Number: 1},
		"no owner":     {Kind: NoteAccess, Number: 1},
		"segment 0":    {Kind: NoteRetire, Owner: InstanceID{1}},
	} {
		if _, err := EncodeManifest(&Manifest{Notes: []ManifestNote{nt}}); !errors.Is(err, ErrInvalid) {
			t.Errorf("note %s: err = %v, want ErrInvalid", name, err)
		}
	}
}

// TestManifestDecodeRejectsDamage: every single-byte change, every truncation and an appended
// byte fail with ErrCorrupt (a torn or half-written manifest is never half read).
func TestManifestDecodeRejectsDamage(t *testing.T) {
	buf, err := EncodeManifest(sampleManifest())
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		bad := append([]byte(nil), buf...)
		bad[i] ^= 0x5a
		if _, err := DecodeManifest(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: err = %v, want ErrCorrupt", i, err)
		}
	}
	for n := 0; n < len(buf); n++ {
		if _, err := DecodeManifest(buf[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: err = %v, want ErrCorrupt", n, err)
		}
	}
	if _, err := DecodeManifest(append(append([]byte(nil), buf...), 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("appended byte: err = %v, want ErrCorrupt", err)
	}
	// A count beyond the bound is refused before anything is sized by it.
	huge := append([]byte(nil), buf[:ManifestHeaderSize]...)
	binary.LittleEndian.PutUint32(huge[manOffCount:], MaxManifestSegments+1)
	binary.LittleEndian.PutUint32(huge[manOffNotes:], 0)
	binary.LittleEndian.PutUint32(huge[manOffCRC:], Checksum(huge[:manOffCRC]))
	if _, err := DecodeManifest(huge); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("huge count: err = %v, want ErrCorrupt", err)
	}
}

// FuzzDecodeManifest: decoding arbitrary bytes never panics, fails only with ErrCorrupt, and
// whatever decodes re-encodes to the same bytes.
func FuzzDecodeManifest(f *testing.F) {
	buf, _ := EncodeManifest(sampleManifest())
	f.Add(buf)
	empty, _ := EncodeManifest(&Manifest{})
	f.Add(empty)
	f.Add([]byte("UCMGOMAN"))
	f.Fuzz(func(t *testing.T, src []byte) {
		m, err := DecodeManifest(src)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		again, err := EncodeManifest(m)
		if err != nil {
			t.Fatalf("decoded manifest does not re-encode: %v", err)
		}
		if string(again) != string(src) {
			t.Fatal("decoded manifest re-encodes to other bytes")
		}
	})
}

func TestLeaseGoldenAndRoundTrip(t *testing.T) {
	l := Lease{Holder: InstanceID{0xde, 0xad, 0xbe, 0xef, 1, 2, 3}, Expiry: 1_790_000_000_123_456_789, Term: 12}
	buf := EncodeLease(l)
	golden(t, "lease.golden", buf)
	got, err := DecodeLease(buf)
	if err != nil || got != l {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for i := range buf {
		bad := append([]byte(nil), buf...)
		bad[i] ^= 0x21
		if _, err := DecodeLease(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	if _, err := DecodeLease(buf[:LeaseSize-1]); !errors.Is(err, ErrCorrupt) {
		t.Fatal("short lease decoded")
	}
	if _, err := DecodeLease(EncodeLease(Lease{})); !errors.Is(err, ErrCorrupt) {
		t.Fatal("a lease without a holder decoded")
	}
}

// FuzzDecodeLease: arbitrary bytes never panic, fail only with ErrCorrupt, and what decodes
// re-encodes to the same bytes.
func FuzzDecodeLease(f *testing.F) {
	f.Add(EncodeLease(Lease{Holder: InstanceID{1}, Expiry: 5, Term: 1}))
	f.Add([]byte("UCMGOLSE"))
	f.Fuzz(func(t *testing.T, src []byte) {
		l, err := DecodeLease(src)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if string(EncodeLease(l)) != string(src) {
			t.Fatal("decoded lease re-encodes to other bytes")
		}
	})
}

// Version 1 manifests (no space notes) are still read; a space note in one is corruption.
func TestManifestVersion1(t *testing.T) {
	asV1 := func(buf []byte) []byte {
		binary.LittleEndian.PutUint32(buf[manOffVersion:], 1)
		binary.LittleEndian.PutUint32(buf[manOffCRC:], Checksum(buf[:manOffCRC]))
		return buf
	}
	m := sampleManifest()
	m.Notes = m.Notes[:3]
	buf, err := EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeManifest(asV1(buf)); err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("version 1 manifest: %+v, %v", got, err)
	}
	buf, err = EncodeManifest(sampleManifest())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeManifest(asV1(buf)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("space notes in a version 1 manifest: %v, want ErrCorrupt", err)
	}
	bad := sampleManifest()
	bad.Notes = append(bad.Notes, ManifestNote{Kind: NoteGrant, Owner: InstanceID{1}, Number: 1 << 63})
	if _, err := EncodeManifest(bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a grant of 2^63 bytes: %v, want ErrInvalid", err)
	}
}
