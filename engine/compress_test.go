package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/kvgen"
	"github.com/ucm-go/ucm/tiers"
)

// kvBlock is block id's bytes for the compression tests: KV-shaped bf16 for even ids, with the
// last quarter of each shard zero so that both codes compress it well past any threshold (real
// KV compresses by only ~6 %, see docs/performance.md), random bytes for odd ids (they do not
// compress). With mixed set, shard 1 of every even block is random too, so its record mixes
// lz4 and raw shards.
func kvBlock(l Layout, id BlockID, mixed bool) []byte {
	b := make([]byte, l.BlockBytes())
	seed := binary.LittleEndian.Uint64(id[:8])
	if id[15]%2 == 1 {
		payload(id, 7, b)
		return b
	}
	kvgen.Fill(b, kvgen.BF16, seed)
	for sh := int64(0); sh < int64(l.Shards); sh++ {
		clear(b[sh*l.ShardBytes+l.ShardBytes*3/4 : (sh+1)*l.ShardBytes])
	}
	if mixed && l.Shards > 1 {
		payload(id, 9, b[l.ShardBytes:2*l.ShardBytes])
	}
	return b
}

// compressibleIDs returns n ids, alternating between even (compressible) and odd last bytes.
func compressibleIDs(n int) []BlockID {
	out := make([]BlockID, n)
	for i := range out {
		out[i] = blockID(i)
		out[i][15] = out[i][15]&^1 | byte(i%2)
	}
	return out
}

func compressOptions(fs vfs.FS, l Layout) Options {
	o := testOptions(fs, l)
	o.Compression = CompressionLZ4
	o.CompressMinSaving = 0.01
	return o
}

func dumpKV(t *testing.T, e *Engine, ids []BlockID, mixed bool) {
	t.Helper()
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = kvBlock(e.Layout(), id, mixed)
	}
	if err := e.Dump(ids, src).Wait(); err != nil {
		t.Fatalf("dump: %v", err)
	}
}

func checkKV(t *testing.T, e *Engine, ids []BlockID, mixed bool) {
	t.Helper()
	l := e.Layout()
	for _, aligned := range []bool{true, false} {
		dst := make([][]byte, len(ids))
		for i := range ids {
			if aligned {
				dst[i] = devio.AlignedBuffer(int(l.BlockBytes()))
			} else {
				dst[i] = make([]byte, l.BlockBytes()+1)[1:]
			}
		}
		if err := e.Load(ids, dst).Wait(); err != nil {
			t.Fatalf("load: %v", err)
		}
		for i, id := range ids {
			if !bytes.Equal(dst[i], kvBlock(l, id, mixed)) {
				t.Fatalf("block %s: loaded bytes differ", id)
			}
		}
	}
	for sh := 0; sh < l.Shards; sh++ {
		dst := make([][]byte, len(ids))
		for i := range ids {
			dst[i] = make([]byte, l.ShardBytes)
		}
		if err := e.LoadShard(ids, sh, dst).Wait(); err != nil {
			t.Fatalf("load shard %d: %v", sh, err)
		}
		for i, id := range ids {
			if !bytes.Equal(dst[i], kvBlock(l, id, mixed)[int64(sh)*l.ShardBytes:int64(sh+1)*l.ShardBytes]) {
				t.Fatalf("block %s shard %d: loaded bytes differ", id, sh)
			}
		}
	}
}

// TestCompressionRoundTrip: with compression on, KV-shaped blocks are stored compressed
// (byte planes for bf16, plain lz4 for a 4-byte dtype), random ones raw; whole-block and
// single-shard loads return identical bytes; Stats and the segment table account for the
// true on-disk sizes, also across a reopen.
func TestCompressionRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dtype  string
		l      Layout
		mixed  bool
		code   format.Compression
		direct bool
	}{
		{"bf16-planes", "bfloat16", Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 64 << 10}, false, format.CompressionLZ4Planes, false},
		{"bf16-mixed", "bfloat16", Layout{Shards: 6, TensorsPerShard: 2, ShardBytes: 10000}, true, format.CompressionLZ4Planes, false},
		{"fp32-lz4", "float32", Layout{Shards: 3, TensorsPerShard: 1, ShardBytes: 3 * 4096}, false, format.CompressionLZ4, false},
		{"odd-shard-bytes", "bfloat16", Layout{Shards: 2, TensorsPerShard: 1, ShardBytes: 4097}, false, format.CompressionLZ4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, fs := memFS()
			opts := compressOptions(fs, tc.l)
			opts.Schema.DType = tc.dtype
			e := mustOpen(t, "/store", opts)
			blocks := compressibleIDs(12)
			dumpKV(t, e, blocks, tc.mixed)
			st := e.Stats()
			// Random blocks do not compress, but packing drops the per-shard padding of an
			// unaligned shard size: that alone can pass the threshold (all shards stored raw).
			packs := tc.l.ShardBytes%format.Alignment != 0
			wantCompressed := int64(6)
			if packs {
				wantCompressed = 12
			}
			if st.CompressedBlocks != wantCompressed || st.CompressSkipped != 12-wantCompressed {
				t.Fatalf("compressed %d, skipped %d: want %d of 12", st.CompressedBlocks, st.CompressSkipped, wantCompressed)
			}
			var live int64
			for i, id := range blocks {
				loc := location(t, e, id)
				live += loc.RecordBytes()
				want := tc.code
				if i%2 == 1 && !packs {
					want = format.CompressionNone
				}
				if i%2 == 1 && packs {
					for sh, n := range loc.StoredLens {
						if int64(n) != tc.l.ShardBytes {
							t.Fatalf("random block %d shard %d stored in %d bytes", i, sh, n)
						}
					}
				}
				if loc.Compression != want {
					t.Fatalf("block %d stored with %v, want %v", i, loc.Compression, want)
				}
				if want != format.CompressionNone && loc.RecordBytes() >= tc.l.RecordBytes() {
					t.Fatalf("block %d: compressed record of %d bytes, raw is %d", i, loc.RecordBytes(), tc.l.RecordBytes())
				}
				if tc.mixed && want != format.CompressionNone && int64(loc.StoredLens[1]) != tc.l.ShardBytes {
					t.Fatalf("random shard 1 stored in %d bytes, want raw %d", loc.StoredLens[1], tc.l.ShardBytes)
				}
			}
			if st.LiveBytes != live || st.StoredPayloadBytes != live-int64(len(blocks))*format.RecordHeaderSize {
				t.Fatalf("stats live %d, stored payload %d; locations sum to %d", st.LiveBytes, st.StoredPayloadBytes, live)
			}
			checkKV(t, e, blocks, tc.mixed)
			if err := e.ix.CheckAccounting(); err != nil {
				t.Fatal(err)
			}
			checkFileSizes(t, fs, e)
			e.Close()
			// Reopen with compression off: compressed records still load.
			opts.Compression = CompressionOff
			e = mustOpen(t, "/store", opts)
			defer e.Close()
			if st2 := e.Stats(); st2.LiveBytes != live || st2.Blocks != int64(len(blocks)) {
				t.Fatalf("after reopen: live %d blocks %d", st2.LiveBytes, st2.Blocks)
			}
			checkKV(t, e, blocks, tc.mixed)
			checkFileSizes(t, fs, e)
		})
	}
}

// TestCompressionThreshold: a saving below CompressMinSaving stores the record raw.
func TestCompressionThreshold(t *testing.T) {
	_, fs := memFS()
	opts := compressOptions(fs, Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 64 << 10})
	opts.CompressMinSaving = 0.9
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := compressibleIDs(4)
	dumpKV(t, e, blocks, false)
	if st := e.Stats(); st.CompressedBlocks != 0 || st.CompressSkipped != 4 {
		t.Fatalf("compressed %d skipped %d", st.CompressedBlocks, st.CompressSkipped)
	}
	checkKV(t, e, blocks, false)
}

func TestCompressionOptions(t *testing.T) {
	for _, s := range []string{"off", "lz4", "LZ4", "none"} {
		if _, err := ParseCompression(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	if _, err := ParseCompression("zstd"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("zstd: %v", err)
	}
	_, fs := memFS()
	for _, o := range []Options{
		func() Options { o := testOptions(fs, mhaLayout); o.Compression = 7; return o }(),
		func() Options { o := testOptions(fs, mhaLayout); o.CompressMinSaving = 1.5; return o }(),
		func() Options { o := testOptions(fs, mhaLayout); o.CompressMinSaving = -1; return o }(),
	} {
		if _, err := Open("/store", o); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("options %v/%v: %v", o.Compression, o.CompressMinSaving, err)
		}
	}
	if c := codecFor(CompressionLZ4, "torch.float16"); c != format.CompressionLZ4Planes {
		t.Errorf("fp16: %v", c)
	}
	if c := codecFor(CompressionLZ4, "fp8_e4m3"); c != format.CompressionLZ4 {
		t.Errorf("fp8: %v", c)
	}
	if c := codecFor(CompressionOff, "bfloat16"); c != format.CompressionNone {
		t.Errorf("off: %v", c)
	}
	if d := storedDType(testSchema.Canonical(mhaLayout)); d != "bfloat16" {
		t.Errorf("stored dtype %q", d)
	}
}

// TestCompressedCorruptionIsAMiss: a flipped stored byte of a compressed record makes the
// shard load and the block load a miss (ErrCorrupt naming the block and segment) that drops
// the block, exactly like a raw checksum mismatch; other shards and blocks still load.
func TestCompressedCorruptionIsAMiss(t *testing.T) {
	mem, fs := memFS()
	l := Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 64 << 10}
	opts := compressOptions(fs, l)
	e := mustOpen(t, "/store", opts)
	blocks := compressibleIDs(6)
	dumpKV(t, e, blocks, false)
	e.Close()
	e = mustOpen(t, "/store", opts)
	defer e.Close()
	victim := location(t, e, blocks[2])
	if victim.Compression == format.CompressionNone {
		t.Fatal("victim not compressed")
	}
	off, n := victim.ShardExtent(2)
	patchFile(t, mem, e.segDir+"/"+segName(victim.Segment), victim.Offset+format.RecordHeaderSize+off+n/2, func(b []byte) { b[0] ^= 0x10 })
	dst := make([]byte, l.ShardBytes)
	if err := e.LoadShard(blocks[2:3], 1, [][]byte{dst}).Wait(); err != nil {
		t.Fatalf("untouched shard: %v", err)
	}
	err := e.LoadShard(blocks[2:3], 2, [][]byte{dst}).Wait()
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), blocks[2].String()) || !strings.Contains(err.Error(), "segment") {
		t.Fatalf("flipped shard: %v", err)
	}
	if e.Lookup(blocks[2:3])[0] {
		t.Fatal("corrupt block still indexed")
	}
	// The same flip seen by a whole-block load (re-point the index at the bad record).
	b := e.ix.NewBatch()
	b.Put(blocks[2], victim)
	if err := e.ix.Apply(b, false); err != nil {
		t.Fatal(err)
	}
	whole := make([]byte, l.BlockBytes())
	if err := e.Load(blocks[2:3], [][]byte{whole}).Wait(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), blocks[2].String()) {
		t.Fatalf("whole load of flipped record: %v", err)
	}
	if st := e.Stats(); st.CorruptReads != 2 {
		t.Fatalf("corrupt reads %d, want 2", st.CorruptReads)
	}
	checkKV(t, e, append(blocks[:2:2], blocks[3:]...), false)
	dumpKV(t, e, blocks[2:3], false)
	checkKV(t, e, blocks, false)
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestCompressedCrashRecovery: a crash with compressed records in the active segment and a torn
// last record: recovery keeps the intact compressed records (re-indexing them if the index lost
// them) and cuts the torn one; a lost index is rebuilt from compressed records too.
func TestCompressedCrashRecovery(t *testing.T) {
	mem, fs := memFS()
	l := Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 64 << 10}
	opts := compressOptions(fs, l)
	e := mustOpen(t, "/store", opts)
	blocks := compressibleIDs(6)
	dumpKV(t, e, blocks[:4], false)
	dumpKV(t, e, blocks[4:6], false)
	last := location(t, e, blocks[4]) // even: compressed
	if last.Compression == format.CompressionNone {
		t.Fatal("block 4 not compressed")
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	e.Close()
	seg := e.segDir + "/" + segName(last.Segment)
	off, _ := last.ShardExtent(1)
	patchFile(t, crashed, seg, last.Offset+format.RecordHeaderSize+off+10, func(b []byte) { b[0] ^= 0xff })
	opts.FS = crashed
	e2 := mustOpen(t, "/store", opts)
	r := e2.Recovery()
	// The torn segment is recovered, or deleted if the torn record was its first (blocks 4 and
	// 5 start a new segment when the first four fill one, whose seal then races the crash).
	if r.SegmentsRecovered+r.EmptySegmentsDeleted < 1 || len(r.QuarantinedSegments) != 0 {
		t.Fatalf("recovery report %+v: want the torn segment handled, nothing quarantined", r)
	}
	if hits := e2.Lookup(blocks); !hits[3] || hits[4] || hits[5] {
		t.Fatalf("after torn compressed record: %v", hits)
	}
	checkKV(t, e2, blocks[:4], false)
	if err := e2.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	if err := fileSizesMatch(crashed, e2); err != nil {
		t.Fatal(err)
	}
	e2.Close()
	// Lose the index: it is rebuilt from the segments, compressed records included.
	if err := crashed.RemoveAll("/store/" + IndexDir); err != nil {
		t.Fatal(err)
	}
	e3 := mustOpen(t, "/store", opts)
	defer e3.Close()
	checkKV(t, e3, blocks[:4], false)
	if loc := location(t, e3, blocks[0]); loc.Compression != format.CompressionLZ4Planes {
		t.Fatalf("rebuilt location of a compressed record: %v", loc.Compression)
	}
	if err := e3.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// With tiers, compression is a disk tier's setting: a memory tier in front of a compressing
// tier caches raw blocks (never the stored form), and blocks demoted into a compressing tier
// are compressed on the way, loading intact from both.
func TestCompressionPerTier(t *testing.T) {
	_, fs := memFS()
	l := Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 16 << 10}
	o := testOptions(fs, l)
	o.SegmentSize = 256 << 10
	o.CompressMinSaving = 0.01
	o.Tiers = []tiers.Config{
		{Name: "dram", Kind: tiers.KindMemory, Capacity: 64 * l.BlockBytes()},
		{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/ssd"}, Capacity: 1 << 20},
		{Name: "cold", Kind: tiers.KindDisk, Paths: []string{"/cold"}, Compression: "lz4"},
	}
	e := mustOpen(t, "/store", o)
	defer e.Close()
	ids := compressibleIDs(60)
	for _, id := range ids {
		dumpKV(t, e, []BlockID{id}, false)
	}
	waitFor(t, "demotion", func() bool { return !e.tiers[0].Space().OverHigh() && e.TierStats()[2].Blocks > 0 })
	compressedBelow := 0
	for _, id := range ids {
		loc, _, _ := e.ix.Get(id)
		switch tier := e.tierOf(loc.Segment); {
		case tier.Pos() == 0 && loc.Compression != format.CompressionNone:
			t.Fatalf("block %s compressed in the raw tier", id)
		case tier.Pos() == 1 && loc.Compression != format.CompressionNone:
			compressedBelow++
		}
	}
	if compressedBelow == 0 {
		t.Fatalf("no demoted block was compressed")
	}
	checkKV(t, e, ids, false) // from memory, the raw tier and the compressed one
	if e.Stats().MemoryHits == 0 {
		t.Fatalf("the memory tier served nothing")
	}

	// Options.Compression and tiers together are refused: one place says how a tier stores.
	o.Compression = CompressionLZ4
	if _, err := Open("/other", o); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("compression with tiers: %v", err)
	}
}
