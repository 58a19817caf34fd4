package index

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ucm-go/ucm/format"
)

const testDir = "/idx"

func openFS(t testing.TB, fs vfs.FS) *Index {
	t.Helper()
	ix, err := Open(testDir, Options{FS: fs})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return ix
}

func openMem(t testing.TB) (*vfs.MemFS, *Index) {
	t.Helper()
	fs := vfs.NewCrashableMem()
	ix := openFS(t, fs)
	t.Cleanup(func() { _ = ix.Close() })
	return fs, ix
}

func bid(n uint64) format.BlockID {
	var id format.BlockID
	binary.BigEndian.PutUint64(id[:8], n*0x9e3779b97f4a7c15+1)
	binary.BigEndian.PutUint64(id[8:], n)
	return id
}

func seg(n uint64) SegmentMeta {
	return SegmentMeta{Number: n, Generation: n * 11, State: SegmentActive, Size: format.SegmentHeaderSize}
}

func apply(t testing.TB, ix *Index, sync bool, f func(b *Batch)) {
	t.Helper()
	b := ix.NewBatch()
	f(b)
	if err := ix.Apply(b, sync); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

func checkAcc(t testing.TB, ix *Index) {
	t.Helper()
	if err := ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

func mustGet(t testing.TB, ix *Index, id format.BlockID) (Location, bool) {
	t.Helper()
	loc, ok, err := ix.Get(id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return loc, ok
}

func wantSeg(t testing.TB, ix *Index, n uint64, bytes, records int64) {
	t.Helper()
	m, ok := ix.Segment(n)
	if !ok {
		t.Fatalf("segment %d: no row", n)
	}
	if m.LiveBytes != bytes || m.LiveRecords != records {
		t.Fatalf("segment %d: live %d bytes / %d records, want %d / %d", n, m.LiveBytes, m.LiveRecords, bytes, records)
	}
}

func TestPutGetHasDelete(t *testing.T) {
	_, ix := openMem(t)
	l1, l2 := testLoc(1, 4096, 3), testLoc(1, 4096+testLoc(1, 0, 3).RecordBytes(), 2)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.Put(bid(1), l1)
		b.Put(bid(2), l2)
	})
	if got, ok := mustGet(t, ix, bid(1)); !ok || !reflect.DeepEqual(got, l1) {
		t.Fatalf("Get 1 = %+v %v", got, ok)
	}
	if _, ok := mustGet(t, ix, bid(3)); ok {
		t.Fatalf("Get 3: found")
	}
	ids := []format.BlockID{bid(3), bid(2), bid(1), bid(4), bid(1)}
	hits := make([]bool, len(ids))
	if err := ix.Has(ids, hits); err != nil {
		t.Fatal(err)
	}
	if want := []bool{false, true, true, false, true}; !reflect.DeepEqual(hits, want) {
		t.Fatalf("Has = %v want %v", hits, want)
	}
	if err := ix.Has(ids, hits[:1]); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("Has with short hits: %v", err)
	}
	wantSeg(t, ix, 1, l1.RecordBytes()+l2.RecordBytes(), 2)
	if blocks, live, files := ix.Totals(); blocks != 2 || live != l1.RecordBytes()+l2.RecordBytes() || files != format.SegmentHeaderSize {
		t.Fatalf("Totals = %d %d %d", blocks, live, files)
	}

	apply(t, ix, false, func(b *Batch) {
		b.Delete(bid(1))
		b.Delete(bid(99)) // absent: no-op
	})
	if _, ok := mustGet(t, ix, bid(1)); ok {
		t.Fatalf("deleted block still present")
	}
	wantSeg(t, ix, 1, l2.RecordBytes(), 1)
	checkAcc(t, ix)

	var seen []format.BlockID
	if err := ix.Iterate(func(id format.BlockID, loc Location) bool {
		seen = append(seen, id)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(seen, []format.BlockID{bid(2)}) {
		t.Fatalf("Iterate saw %v", seen)
	}
}

func TestOverwriteMovesAccounting(t *testing.T) {
	_, ix := openMem(t)
	a, bl := testLoc(1, 4096, 2), testLoc(2, 4096, 5)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.SetSegment(seg(2))
		b.Put(bid(1), a)
	})
	wantSeg(t, ix, 1, a.RecordBytes(), 1)
	wantSeg(t, ix, 2, 0, 0)
	apply(t, ix, true, func(b *Batch) { b.Put(bid(1), bl) })
	wantSeg(t, ix, 1, 0, 0)
	wantSeg(t, ix, 2, bl.RecordBytes(), 1)
	// Overwrite within the same segment with a different layout.
	c := testLoc(2, 1<<20, 1)
	apply(t, ix, true, func(b *Batch) { b.Put(bid(1), c) })
	wantSeg(t, ix, 2, c.RecordBytes(), 1)
	checkAcc(t, ix)
}

func TestSameIDSeveralOpsInBatch(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.SetSegment(seg(2))
		b.Put(bid(1), testLoc(1, 4096, 1))
	})
	var r1, r2 *bool
	apply(t, ix, true, func(b *Batch) {
		b.Put(bid(1), testLoc(2, 4096, 4))                             // 1 → seg 2
		r1 = b.PutIf(bid(1), testLoc(1, 4096, 1), testLoc(1, 8192, 1)) // old no longer matches
		r2 = b.PutIf(bid(1), testLoc(2, 4096, 4), testLoc(1, 8192, 2)) // matches the in-batch view
		b.Delete(bid(1))
		b.Put(bid(1), testLoc(2, 1<<20, 3))
		b.Put(bid(2), testLoc(1, 1<<21, 1))
		b.Delete(bid(2))
	})
	if *r1 || !*r2 {
		t.Fatalf("PutIf results %v %v, want false true", *r1, *r2)
	}
	if got, _ := mustGet(t, ix, bid(1)); !reflect.DeepEqual(got, testLoc(2, 1<<20, 3)) {
		t.Fatalf("final location %+v", got)
	}
	if _, ok := mustGet(t, ix, bid(2)); ok {
		t.Fatalf("bid 2 present")
	}
	wantSeg(t, ix, 1, 0, 0)
	wantSeg(t, ix, 2, testLoc(2, 0, 3).RecordBytes(), 1)
	checkAcc(t, ix)
}

// DeleteIf removes an entry only while it still points where the evictor saw it, and keeps the
// segment accounting exact either way.
func TestDeleteIf(t *testing.T) {
	_, ix := openMem(t)
	loc, moved := testLoc(1, 4096, 2), testLoc(2, 4096, 2)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.SetSegment(seg(2))
		b.Put(bid(1), loc)
		b.Put(bid(2), moved) // moved by compaction after the evictor looked
	})
	var ok1, ok2, ok3 *bool
	apply(t, ix, true, func(b *Batch) {
		ok1 = b.DeleteIf(bid(1), loc)
		ok2 = b.DeleteIf(bid(2), loc)
		ok3 = b.DeleteIf(bid(3), loc) // absent
	})
	if !*ok1 || *ok2 || *ok3 {
		t.Fatalf("DeleteIf = %v %v %v, want true false false", *ok1, *ok2, *ok3)
	}
	if _, ok := mustGet(t, ix, bid(1)); ok || ix.Contains(bid(1)) {
		t.Fatalf("bid 1 still indexed")
	}
	if got, _ := mustGet(t, ix, bid(2)); !reflect.DeepEqual(got, moved) {
		t.Fatalf("bid 2 at %+v", got)
	}
	wantSeg(t, ix, 1, 0, 0)
	wantSeg(t, ix, 2, moved.RecordBytes(), 1)
	checkAcc(t, ix)

	// With the segment emptied, it can be marked deleting and then removed in later batches.
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(SegmentMeta{Number: 1, Generation: 11, State: SegmentDeleting, Size: 1 << 20})
	})
	if m, _ := ix.Segment(1); m.State != SegmentDeleting {
		t.Fatalf("segment 1 row %+v", m)
	}
	apply(t, ix, true, func(b *Batch) { b.DeleteSegment(1) })
	if _, ok := ix.Segment(1); ok {
		t.Fatalf("segment 1 row survived DeleteSegment")
	}
	checkAcc(t, ix)

	// A failed Apply reports false.
	b := ix.NewBatch()
	r := b.DeleteIf(bid(2), moved)
	b.DeleteSegment(2) // bid 2 deleted first in the batch: fine
	b.Put(bid(4), testLoc(9, 0, 1))
	if err := ix.Apply(b, true); !errors.Is(err, format.ErrInvalid) || *r {
		t.Fatalf("failed batch: err %v, DeleteIf %v", err, *r)
	}
}

func TestPutIf(t *testing.T) {
	_, ix := openMem(t)
	old, moved := testLoc(1, 4096, 2), testLoc(2, 4096, 2)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.SetSegment(seg(2))
		b.Put(bid(1), old)
		b.Put(bid(2), old) // same place, another id: fine for the index
	})
	// Concurrent overwrite of bid(2) before compaction's CAS.
	newer := testLoc(1, 1<<20, 2)
	apply(t, ix, true, func(b *Batch) { b.Put(bid(2), newer) })

	var ok1, ok2, ok3 *bool
	apply(t, ix, true, func(b *Batch) {
		ok1 = b.PutIf(bid(1), old, moved)
		ok2 = b.PutIf(bid(2), old, moved)
		ok3 = b.PutIf(bid(3), old, moved) // absent
		b.SetSegment(SegmentMeta{Number: 1, Generation: 11, State: SegmentSealed, Size: 1 << 22})
	})
	if !*ok1 || *ok2 || *ok3 {
		t.Fatalf("PutIf = %v %v %v, want true false false", *ok1, *ok2, *ok3)
	}
	if got, _ := mustGet(t, ix, bid(1)); !reflect.DeepEqual(got, moved) {
		t.Fatalf("bid 1 at %+v", got)
	}
	if got, _ := mustGet(t, ix, bid(2)); !reflect.DeepEqual(got, newer) {
		t.Fatalf("bid 2 at %+v", got)
	}
	if _, ok := mustGet(t, ix, bid(3)); ok {
		t.Fatalf("bid 3 created by a failed PutIf")
	}
	wantSeg(t, ix, 1, newer.RecordBytes(), 1)
	wantSeg(t, ix, 2, moved.RecordBytes(), 1)
	if m, _ := ix.Segment(1); m.State != SegmentSealed || m.Size != 1<<22 {
		t.Fatalf("segment 1 row %+v", m)
	}
	checkAcc(t, ix)

	// A failing Apply reports false for every PutIf.
	b := ix.NewBatch()
	r := b.PutIf(bid(1), moved, testLoc(9, 0, 1)) // segment 9 has no row
	if err := ix.Apply(b, true); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("Apply to unknown segment: %v", err)
	}
	if *r {
		t.Fatalf("PutIf true in a failed batch")
	}
	if got, _ := mustGet(t, ix, bid(1)); !reflect.DeepEqual(got, moved) {
		t.Fatalf("failed batch changed bid 1")
	}
}

func TestDeleteSegment(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.SetSegment(seg(2))
		b.Put(bid(1), testLoc(1, 4096, 1))
	})
	b := ix.NewBatch()
	b.DeleteSegment(1)
	if err := ix.Apply(b, true); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("DeleteSegment with live records: %v", err)
	}
	if _, ok := ix.Segment(1); !ok {
		t.Fatalf("row deleted by a failed batch")
	}
	if err := ix.Apply(b, true); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("re-applying a batch: %v", err)
	}
	// Compaction: move the last record away and drop the victim in one batch.
	var ok *bool
	apply(t, ix, true, func(b *Batch) {
		b.DeleteSegment(1)
		ok = b.PutIf(bid(1), testLoc(1, 4096, 1), testLoc(2, 4096, 1))
		b.DeleteSegment(77) // absent: no-op
	})
	if !*ok {
		t.Fatalf("PutIf failed")
	}
	if _, ok := ix.Segment(1); ok {
		t.Fatalf("segment 1 still present")
	}
	if segs := ix.Segments(); len(segs) != 1 || segs[0].Number != 2 || segs[0].LiveRecords != 1 {
		t.Fatalf("Segments = %+v", segs)
	}
	checkAcc(t, ix)
}

func TestInvalidArguments(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) { b.SetSegment(seg(1)) })
	bad := []func(b *Batch){
		func(b *Batch) { b.Put(bid(1), testLoc(0, 0, 1)) },
		func(b *Batch) { b.Put(bid(1), testLoc(1, -1, 1)) },
		func(b *Batch) { l := testLoc(1, 0, 2); l.ShardCRCs = l.ShardCRCs[:1]; b.Put(bid(1), l) },
		func(b *Batch) { l := testLoc(1, 0, 2); l.Layout.ShardBytes = 0; b.Put(bid(1), l) },
		func(b *Batch) { b.Put(bid(1), testLoc(5, 0, 1)) }, // no row for segment 5
		func(b *Batch) { b.SetSegment(SegmentMeta{Number: 0, State: SegmentActive}) },
		func(b *Batch) { b.SetSegment(SegmentMeta{Number: 2, State: 7}) },
		func(b *Batch) { b.SetSegment(SegmentMeta{Number: 2, State: SegmentActive, Size: -1}) },
	}
	for i, f := range bad {
		b := ix.NewBatch()
		b.Put(bid(100), testLoc(1, 4096, 1)) // must not be committed either
		f(b)
		if err := ix.Apply(b, true); !errors.Is(err, format.ErrInvalid) {
			t.Errorf("case %d: err = %v, want ErrInvalid", i, err)
		}
	}
	if _, ok := mustGet(t, ix, bid(100)); ok {
		t.Fatalf("a failed batch was partly committed")
	}
	other := openFS(t, vfs.NewMem())
	defer other.Close()
	if err := ix.Apply(other.NewBatch(), true); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("foreign batch: %v", err)
	}
	// SetSegment ignores the caller's live counters.
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(SegmentMeta{Number: 3, State: SegmentActive, LiveBytes: 999, LiveRecords: 5})
	})
	wantSeg(t, ix, 3, 0, 0)
	checkAcc(t, ix)
}

func TestReopenAndMeta(t *testing.T) {
	fs := vfs.NewMem()
	ix := openFS(t, fs)
	apply(t, ix, false, func(b *Batch) {
		for s := uint64(1); s <= 3; s++ {
			b.SetSegment(seg(s))
		}
		for i := uint64(0); i < 100; i++ {
			b.Put(bid(i), testLoc(1+i%3, int64(i)*1<<20, 1+int(i%7)))
		}
	})
	apply(t, ix, false, func(b *Batch) {
		for i := uint64(0); i < 100; i += 3 {
			b.Delete(bid(i))
		}
	})
	if err := ix.SetMeta("schema", []byte("model:x"), false); err != nil {
		t.Fatal(err)
	}
	if err := ix.SetMeta("", nil, false); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("empty meta name: %v", err)
	}
	if err := ix.Sync(); err != nil {
		t.Fatal(err)
	}
	before := ix.Segments()
	checkAcc(t, ix)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := ix.Get(bid(1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}

	ix = openFS(t, fs)
	if after := ix.Segments(); !reflect.DeepEqual(before, after) {
		t.Fatalf("segments changed across reopen:\n%+v\n%+v", before, after)
	}
	checkAcc(t, ix)
	if v, ok, err := ix.Meta("schema"); err != nil || !ok || string(v) != "model:x" {
		t.Fatalf("Meta = %q %v %v", v, ok, err)
	}
	if _, ok, err := ix.Meta("nope"); err != nil || ok {
		t.Fatalf("absent meta: %v %v", ok, err)
	}
	v, ok, err := ix.Meta(MetaPebbleFormat)
	if err != nil || !ok || string(v) != fmt.Sprint(uint64(pebble.FormatNewest)) {
		t.Fatalf("pebble format meta = %q %v %v, want %d", v, ok, err, uint64(pebble.FormatNewest))
	}
	if v, ok, _ := ix.Meta(MetaIndexVersion); !ok || string(v) != "2" {
		t.Fatalf("index version meta = %q", v)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}

	// Read-only open: reads work, writes fail.
	ro, err := Open(testDir, Options{FS: fs, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, ok := mustGet(t, ro, bid(1)); !ok {
		t.Fatalf("read-only: bid 1 missing")
	}
	if err := ro.Apply(ro.NewBatch(), true); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("read-only Apply: %v", err)
	}
	checkAcc(t, ro)
	if _, err := Open("/absent", Options{FS: fs, ReadOnly: true}); err == nil {
		t.Fatalf("read-only open of a missing index succeeded")
	}
}

func TestDropSegmentEntries(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.SetSegment(seg(2))
		for i := uint64(0); i < 50; i++ {
			b.Put(bid(i), testLoc(1+i%2, int64(4096+i*1<<20), 1))
		}
	})
	// Segment 1 holds even i at offsets 4096 + i MiB; drop offsets >= 4096 + 20 MiB: i = 20..48.
	n, err := ix.DropSegmentEntries(1, 4096+20<<20, true)
	if err != nil {
		t.Fatal(err)
	}
	if n != 15 {
		t.Fatalf("dropped %d, want 15", n)
	}
	for i := uint64(0); i < 50; i++ {
		_, ok := mustGet(t, ix, bid(i))
		if want := !(i%2 == 0 && i >= 20); ok != want {
			t.Fatalf("bid %d present=%v want %v", i, ok, want)
		}
	}
	one := testLoc(1, 0, 1).RecordBytes()
	wantSeg(t, ix, 1, 10*one, 10)
	wantSeg(t, ix, 2, 25*one, 25)
	if n, err := ix.DropSegmentEntries(1, 1<<40, false); err != nil || n != 0 {
		t.Fatalf("drop nothing: %d %v", n, err)
	}
	checkAcc(t, ix)
}

func TestCorruptValue(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.Put(bid(1), testLoc(1, 4096, 2))
	})
	var kb [blockKeySize]byte
	if err := ix.db.Set(blockKey(kb[:], bid(1)), []byte{1, 2, 3}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_, _, err := ix.Get(bid(1))
	if !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("Get corrupt: %v", err)
	}
	if want := bid(1).String(); !contains(err.Error(), want) {
		t.Fatalf("error %q does not name block %s", err, want)
	}
	if err := ix.Iterate(func(format.BlockID, Location) bool { return true }); !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("Iterate corrupt: %v", err)
	}
	b := ix.NewBatch()
	b.Delete(bid(1))
	if err := ix.Apply(b, true); !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("Apply over corrupt entry: %v", err)
	}
	if err := ix.CheckAccounting(); !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("CheckAccounting over corrupt entry: %v", err)
	}
	// Has does not decode values.
	hits := make([]bool, 1)
	if err := ix.Has([]format.BlockID{bid(1)}, hits); err != nil || !hits[0] {
		t.Fatalf("Has: %v %v", hits, err)
	}

	// A corrupt segment row fails Open with ErrCorrupt naming the segment.
	if err := ix.db.Set(segmentKey(1), []byte("garbage"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := ix.loadSegments(); !errors.Is(err, format.ErrCorrupt) || !contains(err.Error(), "segment 1") {
		t.Fatalf("loadSegments corrupt: %v", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestCrash applies synced then unsynced batches, crashes keeping only synced data, and checks
// that every synced batch survived with exact accounting.
func TestCrash(t *testing.T) {
	for round := 0; round < 5; round++ {
		fs := vfs.NewCrashableMem()
		ix := openFS(t, fs)
		rng := rand.New(rand.NewPCG(uint64(round), 7))
		model := map[format.BlockID]Location{}
		apply(t, ix, true, func(b *Batch) {
			for s := uint64(1); s <= 4; s++ {
				b.SetSegment(seg(s))
			}
		})
		var next uint64
		for batch := 0; batch < 20; batch++ {
			apply(t, ix, true, func(b *Batch) {
				for k := 0; k < 10; k++ {
					id := bid(uint64(rng.IntN(60)))
					if rng.IntN(4) == 0 {
						b.Delete(id)
						delete(model, id)
						continue
					}
					next++
					l := testLoc(1+uint64(rng.IntN(4)), int64(next)<<20, 1+rng.IntN(5))
					b.Put(id, l)
					model[id] = l
				}
			})
		}
		// Unsynced batches: may or may not survive; they touch only ids >= 1000 and segment 5.
		apply(t, ix, true, func(b *Batch) { b.SetSegment(seg(5)) })
		for batch := 0; batch < 5; batch++ {
			apply(t, ix, false, func(b *Batch) {
				for k := 0; k < 10; k++ {
					next++
					b.Put(bid(1000+next), testLoc(5, int64(next)<<20, 1))
				}
			})
		}
		crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		if err := ix.Close(); err != nil {
			t.Fatal(err)
		}
		ix2 := openFS(t, crashed)
		checkAcc(t, ix2)
		got := map[format.BlockID]Location{}
		if err := ix2.Iterate(func(id format.BlockID, loc Location) bool {
			if loc.Segment != 5 {
				got[id] = loc
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, model) {
			t.Fatalf("round %d: recovered %d entries, want %d (synced state differs)", round, len(got), len(model))
		}
		if _, ok := ix2.Segment(5); !ok {
			t.Fatalf("synced SetSegment lost")
		}
		if err := ix2.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestModel runs random batches against a map model and checks accounting after each.
func TestModel(t *testing.T) {
	fs := vfs.NewMem()
	ix := openFS(t, fs)
	rng := rand.New(rand.NewPCG(1, 2))
	model := map[format.BlockID]Location{}
	segs := map[uint64]bool{}
	var off int64
	for step := 0; step < 300; step++ {
		b := ix.NewBatch()
		type cas struct {
			r    *bool
			want bool
		}
		var cass []cas
		for k := rng.IntN(8); k >= 0; k-- {
			id := bid(uint64(rng.IntN(40)))
			s := 1 + uint64(rng.IntN(6))
			off += 4096
			l := testLoc(s, off, 1+rng.IntN(4))
			switch rng.IntN(6) {
			case 0:
				b.SetSegment(seg(s))
				segs[s] = true
			case 1:
				b.Delete(id)
				delete(model, id)
			case 2:
				if !segs[s] {
					continue
				}
				old, present := model[id]
				if rng.IntN(3) == 0 {
					old = testLoc(s, off-4096, 1)
				}
				r := b.PutIf(id, old, l)
				ok := present && model[id].Segment == old.Segment && model[id].Offset == old.Offset
				if ok {
					model[id] = l
				}
				cass = append(cass, cas{r, ok})
			default:
				if segs[s] {
					b.Put(id, l)
					model[id] = l
				}
			}
		}
		if err := ix.Apply(b, rng.IntN(2) == 0); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for _, c := range cass {
			if *c.r != c.want {
				t.Fatalf("step %d: PutIf = %v want %v", step, *c.r, c.want)
			}
		}
		if step%25 == 0 {
			checkAcc(t, ix)
		}
		// Occasionally try to drop an unused segment, or a used one (must fail).
		if rng.IntN(10) == 0 {
			s := 1 + uint64(rng.IntN(6))
			used := false
			for _, l := range model {
				used = used || l.Segment == s
			}
			b := ix.NewBatch()
			b.DeleteSegment(s)
			err := ix.Apply(b, false)
			if used != (err != nil) {
				t.Fatalf("step %d: DeleteSegment(%d) used=%v err=%v", step, s, used, err)
			}
			if !used {
				delete(segs, s)
			}
		}
	}
	checkAcc(t, ix)
	got := map[format.BlockID]Location{}
	if err := ix.Iterate(func(id format.BlockID, loc Location) bool { got[id] = loc; return true }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, model) {
		t.Fatalf("index differs from model: %d vs %d entries", len(got), len(model))
	}
	blocks, _, _ := ix.Totals()
	if blocks != int64(len(model)) {
		t.Fatalf("Totals blocks %d, model %d", blocks, len(model))
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openFS(t, fs)
	checkAcc(t, ix)
	_ = ix.Close()
}

func TestConcurrent(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) {
		for s := uint64(1); s <= 4; s++ {
			b.SetSegment(seg(s))
		}
	})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for i := 0; i < 200; i++ {
				b := ix.NewBatch()
				id := bid(uint64(rng.IntN(100)))
				if rng.IntN(3) == 0 {
					b.Delete(id)
				} else {
					b.Put(id, testLoc(1+uint64(rng.IntN(4)), int64(i)<<20, 1+rng.IntN(3)))
				}
				if err := ix.Apply(b, false); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]format.BlockID, 16)
			hits := make([]bool, 16)
			for i := 0; i < 200; i++ {
				for j := range ids {
					ids[j] = bid(uint64((i + j) % 100))
				}
				if err := ix.Has(ids, hits); err != nil {
					t.Error(err)
					return
				}
				if _, _, err := ix.Get(ids[0]); err != nil {
					t.Error(err)
					return
				}
				ix.Segments()
				ix.Totals()
				if i%50 == 0 {
					if err := ix.CheckAccounting(); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	checkAcc(t, ix)
}

func BenchmarkHas1024(b *testing.B) {
	_, ix := openMem(b)
	const n = 100_000
	for start := uint64(0); start < n; start += 10_000 {
		apply(b, ix, false, func(bt *Batch) {
			if start == 0 {
				bt.SetSegment(seg(1))
			}
			for i := start; i < start+10_000; i++ {
				bt.Put(bid(i), testLoc(1, int64(i)<<16, 4))
			}
		})
	}
	if err := ix.db.Flush(); err != nil {
		b.Fatal(err)
	}
	ids := make([]format.BlockID, 1024)
	hits := make([]bool, len(ids))
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range ids {
		ids[i] = bid(uint64(rng.IntN(2 * n))) // about half hit
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := ix.Has(ids, hits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/id")
}

// A checkpoint taken while the index is open holds every synced batch, and an unsynced one
// or not, as a crash would; it opens as a crash image does (WAL replayed), with consistent
// accounting.
func TestCheckpoint(t *testing.T) {
	fs := vfs.NewMem()
	ix := openFS(t, fs)
	defer ix.Close()
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		for i := uint64(0); i < 50; i++ {
			b.Put(bid(i), testLoc(1, int64(i)*1<<20, 2))
		}
	})
	apply(t, ix, false, func(b *Batch) { b.Delete(bid(7)) }) // not synced
	if err := ix.Checkpoint("/copy"); err != nil {
		t.Fatal(err)
	}
	if err := ix.Checkpoint("/copy"); err == nil {
		t.Fatal("checkpoint over an existing directory succeeded")
	}
	cp, err := Open("/copy", Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	for i := uint64(0); i < 50; i++ {
		if loc, ok := mustGet(t, cp, bid(i)); i != 7 && (!ok || loc.Segment != 1) {
			t.Errorf("synced block %d in the checkpoint: %v %+v", i, ok, loc)
		}
	}
	live := int64(49)
	if _, ok := mustGet(t, cp, bid(7)); ok {
		live = 50
	}
	checkAcc(t, cp)
	wantSeg(t, cp, 1, live*testLoc(1, 0, 2).RecordBytes(), live)
}

// TestBatchMetaAndRange: meta set in a batch commits atomically with the batch's entries and
// segment rows, survives a reopen, and MetaRange lists exactly the names under a prefix.
func TestBatchMetaAndRange(t *testing.T) {
	fs, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.Put(bid(1), testLoc(1, 4096, 2))
		b.SetMeta("share.seg.0001", []byte("one"))
		b.SetMeta("share.seg.0002", []byte("two"))
		b.SetMeta("sharex", []byte("not under the prefix"))
	})
	apply(t, ix, true, func(b *Batch) { b.DeleteMeta("share.seg.0001"); b.DeleteMeta("absent") })
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openFS(t, fs)
	var got []string
	if err := ix.MetaRange("share.seg.", func(k string, v []byte) bool {
		got = append(got, k+"="+string(v))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "share.seg.0002=two" {
		t.Fatalf("MetaRange = %q", got)
	}
	if _, ok := mustGet(t, ix, bid(1)); !ok {
		t.Fatal("entry of the batch lost")
	}
	b := ix.NewBatch()
	b.SetMeta("", nil)
	if err := ix.Apply(b, false); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("empty meta name: %v", err)
	}
}
