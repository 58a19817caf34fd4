package index

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ucm-go/ucm/format"
)

// sideLoc is a packed sidecar location of parts 100-byte parts.
func sideLoc(seg uint64, off int64, parts int) Location {
	l := Location{Segment: seg, Offset: off, Layout: format.Layout{Shards: parts, TensorsPerShard: 1, ShardBytes: 100},
		Seq: seg<<32 | uint64(off), HeaderCRC: uint32(off), Compression: format.CompressionPacked}
	for i := range parts {
		c := uint32(i)*7 + uint32(seg)
		l.ShardCRCs = append(l.ShardCRCs, c)
		l.StoredCRCs = append(l.StoredCRCs, c)
		l.StoredLens = append(l.StoredLens, 100)
	}
	return l
}

func TestSidecarNeedsItsBlock(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, false, func(b *Batch) { b.SetSegment(seg(1)) })
	var orphan, beside *bool
	apply(t, ix, false, func(b *Batch) {
		orphan = b.PutSidecar(bid(1), 3, sideLoc(1, 4096, 2))
		b.Put(bid(2), testLoc(1, 8192, 2))
		beside = b.PutSidecar(bid(2), 3, sideLoc(1, 8192+testLoc(1, 0, 2).RecordBytes(), 2))
	})
	if *orphan || !*beside {
		t.Fatalf("PutSidecar results: without block %v, beside block %v", *orphan, *beside)
	}
	if ix.HasSidecar(bid(1), 3) || !ix.HasSidecar(bid(2), 3) || ix.HasSidecar(bid(2), 4) {
		t.Fatal("HasSidecar disagrees with the puts")
	}
	if _, ok, err := ix.GetSidecar(bid(1), 3); ok || err != nil {
		t.Fatalf("sidecar without block stored: %v %v", ok, err)
	}
	loc, ok, err := ix.GetSidecar(bid(2), 3)
	if err != nil || !ok || !reflect.DeepEqual(loc, sideLoc(1, 8192+testLoc(1, 0, 2).RecordBytes(), 2)) {
		t.Fatalf("GetSidecar = %+v %v %v", loc, ok, err)
	}
	// Live accounting counts the sidecar like a record.
	wantSeg(t, ix, 1, testLoc(1, 0, 2).RecordBytes()+sideLoc(1, 0, 2).RecordBytes(), 2)
	checkAcc(t, ix)
	if got := ix.SidecarKinds(bid(2)); !reflect.DeepEqual(got, []format.SidecarKind{3}) || ix.SidecarCount() != 1 {
		t.Fatalf("SidecarKinds %v count %d", got, ix.SidecarCount())
	}
}

func TestSidecarsGoWithTheirBlock(t *testing.T) {
	for _, how := range []string{"Delete", "DeleteIf", "DropSegmentEntries"} {
		t.Run(how, func(t *testing.T) {
			_, ix := openMem(t)
			blk := testLoc(1, 4096, 2)
			apply(t, ix, false, func(b *Batch) {
				b.SetSegment(seg(1))
				b.SetSegment(seg(2))
				b.Put(bid(1), blk)
				b.PutSidecar(bid(1), 1, sideLoc(1, 4096+blk.RecordBytes(), 3))
				b.PutSidecar(bid(1), 63, sideLoc(2, 4096, 1)) // in another segment
				b.Put(bid(2), testLoc(2, 8192, 1))
				b.PutSidecar(bid(2), 1, sideLoc(2, 8192+testLoc(2, 0, 1).RecordBytes(), 1))
			})
			checkAcc(t, ix)
			switch how {
			case "Delete":
				apply(t, ix, true, func(b *Batch) { b.Delete(bid(1)) })
			case "DeleteIf":
				var ok *bool
				apply(t, ix, true, func(b *Batch) { ok = b.DeleteIf(bid(1), blk) })
				if !*ok {
					t.Fatal("DeleteIf did not delete")
				}
			case "DropSegmentEntries":
				if n, err := ix.DropSegmentEntries(1, 0, true); err != nil || n != 2 {
					t.Fatalf("DropSegmentEntries = %d %v, want the block and its sidecar", n, err)
				}
			}
			if ix.HasSidecar(bid(1), 1) || ix.HasSidecar(bid(1), 63) || len(ix.SidecarKinds(bid(1))) != 0 {
				t.Fatalf("%s left sidecars of the block: %v", how, ix.SidecarKinds(bid(1)))
			}
			if !ix.HasSidecar(bid(2), 1) {
				t.Fatal("another block's sidecar went too")
			}
			wantSeg(t, ix, 1, 0, 0)
			wantSeg(t, ix, 2, testLoc(2, 0, 1).RecordBytes()+sideLoc(2, 0, 1).RecordBytes(), 2)
			checkAcc(t, ix)
		})
	}
}

func TestSidecarMovesAndDeletesAlone(t *testing.T) {
	_, ix := openMem(t)
	blk, side := testLoc(1, 4096, 1), sideLoc(1, 4096+testLoc(1, 0, 1).RecordBytes(), 2)
	apply(t, ix, false, func(b *Batch) {
		b.SetSegment(seg(1))
		b.SetSegment(seg(2))
		b.Put(bid(1), blk)
		b.PutSidecar(bid(1), 2, side)
	})
	moved := sideLoc(2, 4096, 2)
	var stale, fresh *bool
	apply(t, ix, false, func(b *Batch) {
		stale = b.PutSidecarIf(bid(1), 2, sideLoc(1, 999*4096, 2), moved)
		fresh = b.PutSidecarIf(bid(1), 2, side, moved)
	})
	if *stale || !*fresh {
		t.Fatalf("PutSidecarIf: stale origin %v, right origin %v", *stale, *fresh)
	}
	wantSeg(t, ix, 1, blk.RecordBytes(), 1)
	wantSeg(t, ix, 2, moved.RecordBytes(), 1)
	var del *bool
	apply(t, ix, false, func(b *Batch) { del = b.DeleteSidecarIf(bid(1), 2, moved) })
	if !*del || ix.HasSidecar(bid(1), 2) || !ix.Contains(bid(1)) {
		t.Fatalf("DeleteSidecarIf: deleted %v, sidecar left %v, block kept %v", *del, ix.HasSidecar(bid(1), 2), ix.Contains(bid(1)))
	}
	wantSeg(t, ix, 2, 0, 0)
	checkAcc(t, ix)
	b := ix.NewBatch()
	b.PutSidecar(bid(1), 0, sideLoc(1, 4096, 1))
	if err := ix.Apply(b, false); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("kind 0: %v, want ErrInvalid", err)
	}
}

// TestSidecarModel applies random batches of block and sidecar operations and compares the
// index with a model that deletes a block's sidecars with it; accounting is checked along the
// way and after a reopen.
func TestSidecarModel(t *testing.T) {
	fs := vfs.NewMem()
	ix := openFS(t, fs)
	rng := rand.New(rand.NewPCG(3, 4))
	type skey struct {
		id   format.BlockID
		kind format.SidecarKind
	}
	blocks := map[format.BlockID]Location{}
	sides := map[skey]Location{}
	apply(t, ix, false, func(b *Batch) {
		for s := uint64(1); s <= 4; s++ {
			b.SetSegment(seg(s))
		}
	})
	var off int64
	for step := 0; step < 400; step++ {
		b := ix.NewBatch()
		type want struct {
			r  *bool
			ok bool
		}
		var wants []want
		for k := rng.IntN(8); k >= 0; k-- {
			id := bid(uint64(rng.IntN(30)))
			kind := format.SidecarKind(1 + rng.IntN(4))
			s := 1 + uint64(rng.IntN(4))
			off += 4096
			switch rng.IntN(7) {
			case 0, 1:
				b.Put(id, testLoc(s, off, 1))
				blocks[id] = testLoc(s, off, 1)
			case 2:
				l := sideLoc(s, off, 1+rng.IntN(3))
				_, ok := blocks[id]
				wants = append(wants, want{b.PutSidecar(id, kind, l), ok})
				if ok {
					sides[skey{id, kind}] = l
				}
			case 3:
				b.Delete(id)
				delete(blocks, id)
				for k := range sides {
					if k.id == id {
						delete(sides, k)
					}
				}
			case 4:
				old := sides[skey{id, kind}]
				if rng.IntN(3) == 0 {
					old = sideLoc(s, off-4096, 1)
				}
				l := sideLoc(s, off, 2)
				cur, present := sides[skey{id, kind}]
				ok := present && cur.Segment == old.Segment && cur.Offset == old.Offset
				wants = append(wants, want{b.PutSidecarIf(id, kind, old, l), ok})
				if ok {
					sides[skey{id, kind}] = l
				}
			case 5:
				cur, present := sides[skey{id, kind}]
				wants = append(wants, want{b.DeleteSidecarIf(id, kind, cur), present})
				delete(sides, skey{id, kind})
			case 6:
				cur, present := blocks[id]
				wants = append(wants, want{b.DeleteIf(id, cur), present})
				if present {
					delete(blocks, id)
					for k := range sides {
						if k.id == id {
							delete(sides, k)
						}
					}
				}
			}
		}
		if err := ix.Apply(b, rng.IntN(4) == 0); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i, w := range wants {
			if *w.r != w.ok {
				t.Fatalf("step %d: result %d = %v, want %v", step, i, *w.r, w.ok)
			}
		}
		if step%40 == 0 {
			checkAcc(t, ix)
		}
	}
	check := func(ix *Index) {
		t.Helper()
		checkAcc(t, ix)
		got := map[skey]Location{}
		if err := ix.IterateSidecars(func(id format.BlockID, kind format.SidecarKind, loc Location) bool {
			got[skey{id, kind}] = loc
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, sides) {
			t.Fatalf("sidecars differ from the model: %d vs %d", len(got), len(sides))
		}
		if ix.SidecarCount() != len(sides) {
			t.Fatalf("SidecarCount %d, model %d", ix.SidecarCount(), len(sides))
		}
	}
	check(ix)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openFS(t, fs)
	check(ix)
	_ = ix.Close()
}

// TestIndexVersionUpgrade: an index written before sidecars (version 1) opens, and a writable
// open records version 2 so older builds refuse it; an unknown version is refused.
func TestIndexVersionUpgrade(t *testing.T) {
	fs := vfs.NewMem()
	ix := openFS(t, fs)
	apply(t, ix, false, func(b *Batch) { b.SetSegment(seg(1)); b.Put(bid(1), testLoc(1, 4096, 1)) })
	if err := ix.db.Set(metaKey(MetaIndexVersion), []byte("1"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = ix.Close()
	ro, err := Open(testDir, Options{FS: fs, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a version 1 index: %v", err)
	}
	if v, _, _ := ro.Meta(MetaIndexVersion); string(v) != "1" {
		t.Fatalf("read-only open changed the version to %q", v)
	}
	_ = ro.Close()
	ix = openFS(t, fs)
	if v, _, _ := ix.Meta(MetaIndexVersion); string(v) != "2" || !ix.Contains(bid(1)) {
		t.Fatalf("after a writable open: version %q, block kept %v", v, ix.Contains(bid(1)))
	}
	if err := ix.db.Set(metaKey(MetaIndexVersion), []byte("9"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = ix.Close()
	if _, err := Open(testDir, Options{FS: fs}); !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("version 9: %v, want ErrCorrupt", err)
	}
}

func TestSegmentMetaWithSidecars(t *testing.T) {
	m := SegmentMeta{Number: 9, Generation: 3, State: SegmentSealed, Size: 1 << 20, LiveBytes: 8192, LiveRecords: 2}
	if enc := EncodeSegmentMeta(nil, m); len(enc) != segmentMetaSize || enc[0] != segmentMetaVersion {
		t.Fatalf("a row without sidecars is not a version 1 value: %d bytes, version %d", len(enc), enc[0])
	}
	m.LiveSidecars = 1
	enc := EncodeSegmentMeta(nil, m)
	if len(enc) != segmentMetaSizeSidecars || enc[0] != segmentMetaVersionSidecars {
		t.Fatalf("version %d, %d bytes", enc[0], len(enc))
	}
	got, err := DecodeSegmentMeta(enc)
	if err != nil || got != m {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, bad := range []func([]byte) []byte{
		func(b []byte) []byte { b[segOffLiveSidecars] = 3; return b }, // more sidecars than records
		func(b []byte) []byte { clear(b[segOffLiveSidecars:]); return b },
		func(b []byte) []byte { return b[:segmentMetaSize] }, // version 2 cut to version 1's size
		func(b []byte) []byte { b[0] = 3; return b },
	} {
		if _, err := DecodeSegmentMeta(bad(append([]byte(nil), enc...))); !errors.Is(err, format.ErrCorrupt) {
			t.Fatalf("bad value decoded: %v", err)
		}
	}
}
