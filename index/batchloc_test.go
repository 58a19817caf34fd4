package index

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ucm-go/ucm/format"
)

// testBatchLoc is the location of block b of a batch of n blocks.
func testBatchLoc(seg uint64, off int64, shards, n, b int) Location {
	l := testLoc(seg, off, shards)
	l.BatchBlocks, l.BatchPos = n, b
	l.Seq += uint64(b)
	return l
}

// batchExtent is a batch record's on-disk size: header, N·L shards, commit block.
func batchExtent(n int, lay format.Layout) int64 {
	return format.BatchHeaderSize(n) + int64(n)*lay.PayloadBytes() + format.BatchCommitSize(n, lay.Shards)
}

// TestBatchLocation: a block of a batch is a version-3 value that round trips; its shards are
// where the layer-major layout puts them, and the live bytes of the batch's N blocks sum to
// the batch's extent exactly.
func TestBatchLocation(t *testing.T) {
	for _, c := range []struct{ shards, n int }{{1, 1}, {3, 2}, {32, 7}, {80, 35}, {format.MaxShards, 3}, {2, format.MaxBatchBlocks}} {
		var sum int64
		for _, b := range []int{0, 1, c.n / 2, c.n - 1} {
			if b >= c.n {
				continue
			}
			l := testBatchLoc(5, 1<<20, c.shards, c.n, b)
			enc := EncodeLocation([]byte("x"), l)[1:]
			if enc[0] != locationVersionBatch || len(enc) != locFixedSizeBatch+4*c.shards {
				t.Fatalf("N=%d b=%d: version %d, %d bytes", c.n, b, enc[0], len(enc))
			}
			got, err := DecodeLocation(enc)
			if err != nil {
				t.Fatalf("N=%d b=%d: %v", c.n, b, err)
			}
			if !reflect.DeepEqual(got, l) {
				t.Fatalf("round trip: got %+v want %+v", got, l)
			}
			s := l.Layout.ShardStride()
			h := format.BatchHeaderSize(c.n)
			for _, i := range []int{0, 1, c.shards - 1} {
				if i >= c.shards {
					continue
				}
				if want := l.Offset + h + int64(i*c.n+b)*s; got.ShardOffset(i) != want {
					t.Fatalf("N=%d b=%d: shard %d at %d, want %d", c.n, b, i, got.ShardOffset(i), want)
				}
			}
			// The last shard of the last block ends where the commit block starts.
			if b == c.n-1 {
				end := got.ShardOffset(c.shards-1) + s
				if want := l.Offset + batchExtent(c.n, l.Layout) - format.BatchCommitSize(c.n, c.shards); end != want {
					t.Fatalf("N=%d: last shard ends at %d, commit block at %d", c.n, end, want)
				}
			}
		}
		for b := 0; b < c.n; b++ {
			l := testBatchLoc(5, 0, c.shards, c.n, b)
			sum += l.RecordBytes()
			if b > 0 && l.RecordBytes() > testBatchLoc(5, 0, c.shards, c.n, 0).RecordBytes() {
				t.Fatalf("N=%d: block %d's share exceeds block 0's", c.n, b)
			}
		}
		if want := batchExtent(c.n, format.Layout{Shards: c.shards, TensorsPerShard: 2, ShardBytes: 6144}); sum != want {
			t.Fatalf("N=%d L=%d: shares sum to %d, extent is %d", c.n, c.shards, sum, want)
		}
	}
	// A record of its own: shard offsets as the record layout puts them, raw and compressed.
	raw, packed := testLoc(2, 8192, 5), testCompressedLoc(2, 8192, 5)
	for i := 0; i < 5; i++ {
		if want := raw.Offset + raw.Layout.ShardOffset(i); raw.ShardOffset(i) != want {
			t.Fatalf("raw shard %d at %d, want %d", i, raw.ShardOffset(i), want)
		}
		off, _ := packed.ShardExtent(i)
		if want := packed.Offset + format.RecordHeaderSize + off; packed.ShardOffset(i) != want {
			t.Fatalf("compressed shard %d at %d, want %d", i, packed.ShardOffset(i), want)
		}
	}
	if raw.IsBatch() || packed.IsBatch() {
		t.Fatal("a record of its own reported as a batch block")
	}
}

func TestBatchLocationRejects(t *testing.T) {
	good := EncodeLocation(nil, testBatchLoc(5, 4096, 4, 3, 2))
	le := binary.LittleEndian
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for name, b := range map[string][]byte{
		"truncated":  good[:len(good)-1],
		"trailing":   append(bytes.Clone(good), 0),
		"n0":         mut(func(b []byte) []byte { le.PutUint32(b[locOffBatchBlocks:], 0); return b }),
		"nOver":      mut(func(b []byte) []byte { le.PutUint32(b[locOffBatchBlocks:], format.MaxBatchBlocks+1); return b }),
		"nHuge":      mut(func(b []byte) []byte { le.PutUint32(b[locOffBatchBlocks:], 1<<31); return b }),
		"posN":       mut(func(b []byte) []byte { le.PutUint32(b[locOffBatchPos:], 3); return b }),
		"posHuge":    mut(func(b []byte) []byte { le.PutUint32(b[locOffBatchPos:], 1<<32-1); return b }),
		"v1 length":  mut(func(b []byte) []byte { b[0] = locationVersion; return b }),
		"v2 length":  mut(func(b []byte) []byte { b[0] = locationVersionCompressed; return b }),
		"version 4":  mut(func(b []byte) []byte { b[0] = 4; return b }),
		"v1 as v3":   func() []byte { b := EncodeLocation(nil, testLoc(5, 4096, 4)); b[0] = locationVersionBatch; return b }(),
		"shards0":    mut(func(b []byte) []byte { le.PutUint32(b[locOffShards:], 0); return b }),
		"shardsOver": mut(func(b []byte) []byte { le.PutUint32(b[locOffShards:], format.MaxShards+1); return b }),
	} {
		if _, err := DecodeLocation(b); !errors.Is(err, format.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := DecodeLocation(mut(func(b []byte) []byte { b[0] = 4; return b })); err == nil || !strings.Contains(err.Error(), "version: 4") {
		t.Errorf("unknown version not named: %v", err)
	}

	// Put refuses what the codec could not store faithfully.
	_, ix := openMem(t)
	for name, l := range map[string]Location{
		"nOver":      testBatchLoc(1, 0, 2, format.MaxBatchBlocks+1, 0),
		"nNeg":       testBatchLoc(1, 0, 2, -1, 0),
		"posNeg":     testBatchLoc(1, 0, 2, 3, -1),
		"posN":       testBatchLoc(1, 0, 2, 3, 3),
		"posAlone":   func() Location { l := testLoc(1, 0, 2); l.BatchPos = 1; return l }(),
		"compressed": func() Location { l := testCompressedLoc(1, 0, 2); l.BatchBlocks = 2; return l }(),
	} {
		b := ix.NewBatch()
		b.SetSegment(seg(1))
		b.Put(bid(1), l)
		if err := ix.Apply(b, false); !errors.Is(err, format.ErrInvalid) {
			t.Errorf("%s: Put: %v, want ErrInvalid", name, err)
		}
	}
	b := ix.NewBatch()
	b.SetSegment(seg(1))
	b.Put(bid(1), testLoc(1, 0, 2))
	sl := testCompressedLoc(1, 8192, 2)
	sl.Compression = format.CompressionPacked
	sl.BatchBlocks = 2
	b.PutSidecar(bid(1), 1, sl)
	if err := ix.Apply(b, false); !errors.Is(err, format.ErrInvalid) {
		t.Errorf("sidecar in a batch: %v, want ErrInvalid", err)
	}
	if ix.Contains(bid(1)) {
		t.Fatal("a refused batch committed")
	}
}

// TestLocationV3Golden pins the bytes of a version-3 value (a format change shows up here).
func TestLocationV3Golden(t *testing.T) {
	l := testBatchLoc(3, 8192, 3, 5, 2)
	want, err := os.ReadFile("testdata/location_v3.golden")
	if *updateGolden {
		want = EncodeLocation(nil, l)
		err = os.WriteFile("testdata/location_v3.golden", want, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := EncodeLocation(nil, l); !bytes.Equal(got, want) {
		t.Fatalf("location v3 bytes differ from testdata/location_v3.golden: the index value format changed")
	}
	got, err := DecodeLocation(want)
	if err != nil || !reflect.DeepEqual(got, l) {
		t.Fatalf("golden decodes to %+v, %v", got, err)
	}
}

// TestIndexVersionBatch: an index records version 3 at the first put of a batch block, in the
// same commit, and not before; it opens again (read-only too) as version 3 with its entries;
// an unknown version is refused naming it.
func TestIndexVersionBatch(t *testing.T) {
	fs := vfs.NewCrashableMem()
	ix := openFS(t, fs)
	version := func(ix *Index) string {
		t.Helper()
		v, ok, err := ix.Meta(MetaIndexVersion)
		if err != nil || !ok {
			t.Fatalf("index version: %q %v %v", v, ok, err)
		}
		return string(v)
	}
	apply(t, ix, false, func(b *Batch) { b.SetSegment(seg(1)); b.Put(bid(1), testLoc(1, 4096, 2)) })
	// A failed compare-and-set of a batch location puts nothing: still version 2.
	apply(t, ix, false, func(b *Batch) { b.PutIf(bid(1), testLoc(1, 1<<20, 2), testBatchLoc(1, 8192, 2, 3, 0)) })
	if v := version(ix); v != "2" {
		t.Fatalf("version %s before any batch block", v)
	}
	const n = 3
	apply(t, ix, true, func(b *Batch) {
		for k := 0; k < n; k++ {
			b.Put(bid(uint64(10+k)), testBatchLoc(1, 8192, 2, n, k))
		}
	})
	if v := version(ix); v != "3" {
		t.Fatalf("version %s after a batch put, want 3", v)
	}
	lay := testLoc(1, 0, 2).Layout
	wantSeg(t, ix, 1, lay.RecordBytes()+batchExtent(n, lay), 1+n)
	checkAcc(t, ix)
	// What survives a crash right after the synced Apply has both the entries and the version.
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	_ = ix.Close()
	for _, fs := range []vfs.FS{fs, crashed} {
		ix = openFS(t, fs)
		if v := version(ix); v != "3" {
			t.Fatalf("reopened at version %s", v)
		}
		got, ok := mustGet(t, ix, bid(11))
		if !ok || !reflect.DeepEqual(got, testBatchLoc(1, 8192, 2, n, 1)) {
			t.Fatalf("batch entry after reopen: %+v %v", got, ok)
		}
		checkAcc(t, ix)
		// Later batch puts and moves away leave the version alone.
		apply(t, ix, false, func(b *Batch) { b.Put(bid(10), testLoc(1, 1<<20, 2)) })
		if v := version(ix); v != "3" {
			t.Fatalf("version %s", v)
		}
		_ = ix.Close()
	}
	ro, err := Open(testDir, Options{FS: fs, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a version 3 index: %v", err)
	}
	if v := version(ro); v != "3" {
		t.Fatalf("read-only: version %s", v)
	}
	_ = ro.Close()

	ix = openFS(t, fs)
	if err := ix.db.Set(metaKey(MetaIndexVersion), []byte("4"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = ix.Close()
	_, err = Open(testDir, Options{FS: fs})
	if !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), `"4"`) {
		t.Fatalf("version 4: %v, want ErrCorrupt naming it", err)
	}
}
