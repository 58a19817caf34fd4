package index

import (
	"crypto/md5"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
)

func benchIDs(n int) []format.BlockID {
	ids := make([]format.BlockID, n)
	for i := range ids {
		ids[i] = md5.Sum([]byte(fmt.Sprint("b", i)))
	}
	return ids
}

func BenchmarkGetRun(b *testing.B) {
	ix, err := Open("/ix", Options{FS: vfs.NewMem()})
	if err != nil {
		b.Fatal(err)
	}
	defer ix.Close()
	ids := benchIDs(4096)
	l := format.Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 16 << 10}
	bt := ix.NewBatch()
	bt.SetSegment(SegmentMeta{Number: 1, Generation: 1, State: SegmentActive, Size: 1 << 40})
	for i, id := range ids {
		bt.Put(id, Location{Segment: 1, Offset: int64(i) << 20, Layout: l, Seq: uint64(i), ShardCRCs: make([]uint32, 32)})
	}
	if err := ix.Apply(bt, true); err != nil {
		b.Fatal(err)
	}
	if err := ix.db.Flush(); err != nil {
		b.Fatal(err)
	}
	run := ids[1000:1035]
	b.Run("Get", func(b *testing.B) {
		for b.Loop() {
			for _, id := range run {
				if _, ok, err := ix.Get(id); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		}
	})
	b.Run("GetMany", func(b *testing.B) {
		locs, found := make([]Location, len(run)), make([]bool, len(run))
		for b.Loop() {
			if err := ix.GetMany(run, locs, found); err != nil || !found[0] {
				b.Fatal(err)
			}
		}
	})
}

// GetMany returns what Get returns for every id, in the caller's order, whatever the ids'
// key order, with duplicates and missing ids, from memtables and from flushed tables alike.
func TestGetMany(t *testing.T) {
	_, ix := openMem(t)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		for i := 0; i < 40; i += 2 {
			b.Put(bid(uint64(i)), testLoc(1, int64(i+1)*4096, 3))
		}
	})
	for _, flush := range []bool{false, true} {
		if flush {
			if err := ix.db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		var ids []format.BlockID
		for _, i := range []int{7, 4, 38, 4, 0, 39, 100, 12} {
			ids = append(ids, bid(uint64(i)))
		}
		locs, found := make([]Location, len(ids)), make([]bool, len(ids))
		if err := ix.GetMany(ids, locs, found); err != nil {
			t.Fatal(err)
		}
		for k, id := range ids {
			want, ok, err := ix.Get(id)
			if err != nil || ok != found[k] || fmt.Sprint(want) != fmt.Sprint(locs[k]) {
				t.Fatalf("flush %v, id %d: GetMany %v %+v, Get %v %+v %v", flush, k, found[k], locs[k], ok, want, err)
			}
		}
	}
	if err := ix.GetMany([]format.BlockID{bid(1)}, nil, nil); !errors.Is(err, format.ErrInvalid) {
		t.Fatalf("short result slices: %v", err)
	}
	var kb [blockKeySize]byte
	if err := ix.db.Set(blockKey(kb[:], bid(4)), []byte{1, 2, 3}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	locs, found := make([]Location, 2), make([]bool, 2)
	err := ix.GetMany([]format.BlockID{bid(2), bid(4)}, locs, found)
	if !errors.Is(err, format.ErrCorrupt) || !contains(err.Error(), bid(4).String()) {
		t.Fatalf("corrupt entry: %v", err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ix.GetMany([]format.BlockID{bid(2)}, locs[:1], found[:1]); err == nil {
		t.Fatal("GetMany on a closed index succeeded")
	}
}

// Mutations counts every committed batch once it is visible, and nothing else: an empty batch
// and a read leave it; a put, a delete and a drop of a segment's entries move it.
func TestMutations(t *testing.T) {
	ix, err := Open("/ix", Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	m := ix.Mutations()
	if err := ix.Apply(ix.NewBatch(), false); err != nil || ix.Mutations() != m {
		t.Fatalf("empty batch: %v, mutations %d → %d", err, m, ix.Mutations())
	}
	id := benchIDs(1)[0]
	b := ix.NewBatch()
	b.SetSegment(SegmentMeta{Number: 1, Generation: 1, State: SegmentActive, Size: 1 << 20})
	b.Put(id, testLoc(1, 4096, 4))
	if err := ix.Apply(b, false); err != nil || ix.Mutations() != m+1 {
		t.Fatalf("put: %v, mutations %d, want %d", err, ix.Mutations(), m+1)
	}
	if _, _, err := ix.Get(id); err != nil || ix.Mutations() != m+1 {
		t.Fatalf("a read moved the count: %v, %d", err, ix.Mutations())
	}
	if n, err := ix.DropSegmentEntries(1, 0, false); err != nil || n != 1 || ix.Mutations() != m+2 {
		t.Fatalf("drop: %d, %v, mutations %d, want %d", n, err, ix.Mutations(), m+2)
	}
}
