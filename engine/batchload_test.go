package engine

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
)

// plantBatch writes the blocks ids as one batch record (layer-major: shard i of block b at
// off + H + (i·N + b)·S, H = align4k(128 + 16·N)) into the segment file holding anchor's
// record, at off (past anything the engine writes in the test), and indexes them with
// version-3 locations. The batch header and commit block are left zero: loads read only the
// shards and check them against the index's checksums.
func plantBatch(t *testing.T, e *Engine, mem vfs.FS, anchor BlockID, off int64, ids []BlockID) []index.Location {
	t.Helper()
	l := e.Layout()
	n := len(ids)
	s := l.ShardStride()
	h := format.AlignUp(128 + 16*int64(n))
	seg := location(t, e, anchor).Segment
	f, err := mem.OpenReadWrite(e.segPath(seg), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	locs := make([]index.Location, n)
	b := e.ix.NewBatch()
	for k, id := range ids {
		data := blockBytes(l, id)
		loc := index.Location{Segment: seg, Offset: off, Layout: l, Seq: 1000 + uint64(k), HeaderCRC: 0xba7c4,
			ShardCRCs: make([]uint32, l.Shards), BatchBlocks: n, BatchPos: k}
		for i := 0; i < l.Shards; i++ {
			shard := data[int64(i)*l.ShardBytes:][:l.ShardBytes]
			loc.ShardCRCs[i] = format.Checksum(shard)
			at := off + h + int64(i*n+k)*s
			if loc.ShardOffset(i) != at {
				t.Fatalf("block %d shard %d: ShardOffset %d, layout puts it at %d", k, i, loc.ShardOffset(i), at)
			}
			if _, err := f.WriteAt(shard, at); err != nil {
				t.Fatal(err)
			}
		}
		locs[k] = loc
		b.Put(id, loc)
	}
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	return locs
}

// corruptShard flips one byte of shard i of the batch block at loc.
func corruptShard(t *testing.T, e *Engine, mem vfs.FS, loc index.Location, i int) {
	t.Helper()
	f, err := mem.OpenReadWrite(e.segPath(loc.Segment), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	b := make([]byte, 1)
	at := loc.ShardOffset(i) + 100
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

// batchStore opens a store (in memory, checking that segment I/O is aligned; or on disk, with
// O_DIRECT and merged reads), dumps one block as a record of its own and plants a batch of
// three blocks beside it in its segment.
func batchStore(t *testing.T, disk bool) (*Engine, vfs.FS, []BlockID, []index.Location) {
	t.Helper()
	mem, fs := memFS()
	raw, dir := vfs.FS(mem), "/store" // raw: the file system without the alignment check
	if disk {
		raw, fs, dir = vfs.Default, vfs.Default, t.TempDir()
	}
	e := mustOpen(t, dir, testOptions(fs, mhaLayout))
	t.Cleanup(func() { _ = e.Close() })
	dumpBlocks(t, e, ids(0, 1))
	batch := ids(100, 103)
	return e, raw, batch, plantBatch(t, e, raw, blockID(0), 512<<10, batch)
}

// TestBatchBlockLoads: blocks of a batch record load whole (into aligned memory, unaligned
// memory and pieces that cut across shards) and by shard, beside a block of its own record.
func TestBatchBlockLoads(t *testing.T) {
	for _, disk := range []bool{false, true} {
		testBatchBlockLoads(t, disk)
	}
}

func testBatchBlockLoads(t *testing.T, disk bool) {
	e, _, batch, _ := batchStore(t, disk)
	l := e.Layout()
	all := append([]BlockID{blockID(0)}, batch...)
	checkBlocks(t, e, all) // aligned: straight into dst
	for _, id := range all {
		checkBlock(t, e, id) // unaligned: through a bounce buffer
	}
	// Pieces of 12 KiB and 20 KiB: the first ends inside shard 1 (8 KiB shards).
	pieces := make([][][]byte, len(all))
	for k := range all {
		pieces[k] = [][]byte{devio.AlignedBuffer(12 << 10), devio.AlignedBuffer(20 << 10)}
	}
	if err := e.LoadSpans(all, AllShards, pieces).Wait(); err != nil {
		t.Fatalf("load into pieces: %v", err)
	}
	for k, id := range all {
		if got := append(bytes.Clone(pieces[k][0]), pieces[k][1]...); !bytes.Equal(got, blockBytes(l, id)) {
			t.Fatalf("block %s loaded into pieces differs", id)
		}
	}
	for shard := 0; shard < l.Shards; shard++ {
		dst := make([][]byte, len(all))
		split := make([][][]byte, len(all))
		for k := range all {
			dst[k] = devio.AlignedBuffer(int(l.ShardBytes))
			split[k] = [][]byte{devio.AlignedBuffer(4096), devio.AlignedBuffer(int(l.ShardBytes) - 4096)}
		}
		if err := e.LoadShard(all, shard, dst).Wait(); err != nil {
			t.Fatalf("load shard %d: %v", shard, err)
		}
		if err := e.LoadSpans(all, shard, split).Wait(); err != nil {
			t.Fatalf("load shard %d into pieces: %v", shard, err)
		}
		for k, id := range all {
			want := blockBytes(l, id)[int64(shard)*l.ShardBytes:][:l.ShardBytes]
			if !bytes.Equal(dst[k], want) || !bytes.Equal(append(bytes.Clone(split[k][0]), split[k][1]...), want) {
				t.Fatalf("block %s shard %d differs", id, shard)
			}
		}
		one := make([]byte, l.ShardBytes) // unaligned: bounced
		if err := e.LoadShard(batch[1:2], shard, [][]byte{one}).Wait(); err != nil || !bytes.Equal(one, blockBytes(l, batch[1])[int64(shard)*l.ShardBytes:][:l.ShardBytes]) {
			t.Fatalf("bounced load of shard %d: %v", shard, err)
		}
	}
}

// TestBatchBlockCorruptShard: a batch block whose shard fails its checksum is reported corrupt,
// naming the block, whether loaded whole or by that shard, and dropped from the index; the
// other blocks of the batch still load.
func TestBatchBlockCorruptShard(t *testing.T) {
	e, mem, batch, locs := batchStore(t, false)
	corruptShard(t, e, mem, locs[1], 2)
	corruptShard(t, e, mem, locs[2], 0)
	dst := make([][]byte, 2)
	for k := range dst {
		dst[k] = devio.AlignedBuffer(int(e.Layout().BlockBytes()))
	}
	task := e.Load(batch[:2], dst)
	_ = task.Wait()
	errs := task.BlockErrors()
	if errs[0] != nil {
		t.Fatalf("intact block of the batch: %v", errs[0])
	}
	if !errors.Is(errs[1], ErrCorrupt) || !strings.Contains(errs[1].Error(), batch[1].String()) || !strings.Contains(errs[1].Error(), "shard 2") {
		t.Fatalf("block with a corrupt shard 2: %v, want ErrCorrupt naming it and the shard", errs[1])
	}
	shard := devio.AlignedBuffer(int(e.Layout().ShardBytes))
	if err := e.LoadShard(batch[2:], 1, [][]byte{shard}).Wait(); err != nil {
		t.Fatalf("intact shard 1 of a block whose shard 0 is corrupt: %v", err)
	}
	if err := e.LoadShard(batch[2:], 0, [][]byte{shard}).Wait(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), batch[2].String()) {
		t.Fatalf("corrupt shard loaded alone: %v, want ErrCorrupt naming the block", err)
	}
	if hits := e.Lookup(batch); !hits[0] || hits[1] || hits[2] {
		t.Fatalf("lookup after the failed loads: %v, want only the intact block", hits)
	}
	checkBlock(t, e, batch[0])
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestBatchBlockRelocates: relocation copies the intact blocks of a batch record together into
// a new batch record, which loads the same bytes; a corrupt one is dropped, not copied; a
// batch block relocated without its siblings becomes a record of its own.
func TestBatchBlockRelocates(t *testing.T) {
	e, mem, batch, locs := batchStore(t, false)
	corruptShard(t, e, mem, locs[0], 3)
	refs := make([]recordRef, len(batch))
	for k, id := range batch {
		refs[k] = recordRef{id: id, loc: locs[k]}
	}
	moved, blocks, written, err := e.relocate(refs, e.tiers[0])
	if err != nil || moved != 2 || blocks != 2 {
		t.Fatalf("relocate: moved %d (%d blocks), %v; want the 2 intact blocks", moved, blocks, err)
	}
	if e.Lookup(batch[:1])[0] {
		t.Fatal("the corrupt batch block was relocated")
	}
	first := location(t, e, batch[1])
	h := format.BatchHeader{Layout: e.Layout(), IDs: batch[1:]}
	if written != h.ExtentBytes() {
		t.Fatalf("relocation wrote %d bytes, want the new batch record's %d", written, h.ExtentBytes())
	}
	for k, id := range batch[1:] {
		loc := location(t, e, id)
		if loc.Offset == locs[0].Offset || loc.Offset != first.Offset || loc.BatchBlocks != 2 || loc.BatchPos != k {
			t.Fatalf("block %s at %+v, want position %d of a new batch record of 2", id, loc, k)
		}
		checkBlock(t, e, id)
	}
	// One block of that new batch alone: a record of its own.
	moved, _, _, err = e.relocate([]recordRef{{id: batch[2], loc: location(t, e, batch[2])}}, e.tiers[0])
	if err != nil || moved != 1 {
		t.Fatalf("relocate one batch block: moved %d, %v", moved, err)
	}
	if loc := location(t, e, batch[2]); loc.IsBatch() {
		t.Fatalf("a batch block relocated alone is at %+v, want a record of its own", loc)
	}
	checkBlock(t, e, batch[2])
	checkBlock(t, e, batch[1])
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestAppendShardReads: a record of its own is read by one op per buffer; a block of a batch
// by one op per shard (and piece), each at the shard's place, and shard i of consecutive
// blocks of a batch continues itself on disk (the backend merges such ops).
func TestAppendShardReads(t *testing.T) {
	l := mhaLayout
	own := index.Location{Segment: 1, Offset: 8192, Layout: l, ShardCRCs: make([]uint32, l.Shards)}
	payload := make([]byte, l.PayloadBytes())
	if ops := appendShardReads(nil, nil, own, 0, [][]byte{payload}); len(ops) != 1 || ops[0].Off != own.Offset+format.RecordHeaderSize || len(ops[0].Buf) != len(payload) {
		t.Fatalf("record of its own: %d ops", len(ops))
	}
	b0, b1 := own, own
	b0.BatchBlocks, b1.BatchBlocks, b1.BatchPos = 5, 5, 1
	ops := appendShardReads(nil, nil, b0, 0, [][]byte{payload[:12<<10], payload[12<<10:]})
	var got []int64
	for _, op := range ops {
		got = append(got, op.Off, int64(len(op.Buf)))
	}
	h, s := int64(4096), l.ShardStride() // H = align4k(128 + 16·5)
	want := []int64{8192 + h, s, 8192 + h + 5*s, 4096, 8192 + h + 5*s + 4096, 4096, 8192 + h + 10*s, s, 8192 + h + 15*s, s}
	if !slices.Equal(got, want) {
		t.Fatalf("batch block 0 read as (offset, length) %v, want %v", got, want)
	}
	for i := 0; i < l.Shards; i++ {
		a := appendShardReads(nil, nil, b0, i, [][]byte{payload[:s]})
		b := appendShardReads(nil, nil, b1, i, [][]byte{payload[:s]})
		if a[0].Off+s != b[0].Off {
			t.Fatalf("shard %d of blocks 0 and 1 of a batch: at %d and %d, not adjacent", i, a[0].Off, b[0].Off)
		}
	}
}

// batchGroups cuts the live blocks of one source batch into even chunks that fit a batch
// record of the destination, in their source order; a block alone, a sidecar, a record and
// anything bound for a compressing tier go record by record.
func TestBatchGroups(t *testing.T) {
	_, fs := memFS()
	opts := tierOptions(fs, diskTierCfg("ssd", 0, "/a"))
	opts.MaxBatchBytes = 4 * (mhaLayout.RecordBytes() + 4096) // about four blocks a record
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	per := e.chunkBlocks(e.tiers[0], 100)
	if per < 2 || per > 5 {
		t.Fatalf("%d blocks per record under a %d-byte bound", per, opts.MaxBatchBytes)
	}
	n := 2*per + 1 // three chunks of at most per, none of one
	batch := func(seg uint64, off int64, pos int) index.Location {
		return index.Location{Segment: seg, Offset: off, Layout: mhaLayout, BatchBlocks: n + 3, BatchPos: pos,
			ShardCRCs: make([]uint32, mhaLayout.Shards)}
	}
	var refs []recordRef
	for k := n - 1; k >= 0; k-- { // coldest first: not in source order
		refs = append(refs, recordRef{id: blockID(k), loc: batch(7, 4096, k)})
	}
	refs = append(refs,
		recordRef{id: blockID(100), loc: batch(8, 4096, 0)},                                              // alone of its batch
		recordRef{id: blockID(101), loc: index.Location{Segment: 7, Offset: 1 << 20, Layout: mhaLayout}}, // a record
		recordRef{id: blockID(0), kind: 1, loc: index.Location{Segment: 7, Offset: 2 << 20}},             // a sidecar
	)
	groups, rest := e.rc.batchGroups(refs, e.tiers[0])
	if len(rest) != 3 {
		t.Fatalf("%d refs to copy record by record, want the lone batch block, the record and the sidecar", len(rest))
	}
	total := 0
	for _, g := range groups {
		if len(g) < minRelocatedBatch || len(g) > per {
			t.Fatalf("a chunk of %d blocks (at most %d a record)", len(g), per)
		}
		for k, r := range g {
			if r.loc.BatchPos != total+k {
				t.Fatalf("chunk %v not in source order", g)
			}
		}
		total += len(g)
	}
	if total != n || len(groups) != 3 {
		t.Fatalf("%d blocks in %d chunks, want %d in 3", total, len(groups), n)
	}
	opts.Tiers = []tiers.Config{{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/b"}, Compression: "lz4"}}
	c := mustOpen(t, "/store2", opts)
	defer c.Close()
	if groups, rest := c.rc.batchGroups(refs, c.tiers[0]); len(groups) != 0 || len(rest) != len(refs) {
		t.Fatalf("into a compressing tier: %d chunks, %d refs record by record", len(groups), len(rest))
	}
}
