package verify_test

import (
	"bytes"
	"crypto/md5"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/tools/verify"
	"github.com/ucm-go/ucm/wal"
)

const storeDir = "/store"

var (
	testSchema = engine.Schema{Model: "verify-test", DType: "bfloat16", KVLayout: "mha", TPSize: 1, BlockTokens: 16}
	// 4 shards of 2 tensors, 4 KiB per shard: 20 KiB records, several per 128 KiB segment.
	testLayout = format.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 4 << 10}
)

func testID(i int) format.BlockID { return md5.Sum([]byte(fmt.Sprintf("verify-test-%d", i))) }

func openEngine(t *testing.T, fs vfs.FS) *engine.Engine {
	t.Helper()
	e, err := engine.Open(storeDir, engine.Options{FS: fs, Layout: testLayout, Schema: testSchema, SegmentSize: 128 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// dump dumps blocks from..to-1, ten at a time.
func dump(t *testing.T, e *engine.Engine, from, to int) {
	t.Helper()
	for i := from; i < to; i += 10 {
		var ids []format.BlockID
		var src [][]byte
		for j := i; j < min(to, i+10); j++ {
			id := testID(j)
			b := devio.AlignedBuffer(int(testLayout.BlockBytes()))
			for k := range b {
				b[k] = id[k%16] ^ byte(k/16)
			}
			ids, src = append(ids, id), append(src, b)
		}
		if err := e.Dump(ids, src).Wait(); err != nil {
			t.Fatal(err)
		}
	}
}

// buildStore makes a cleanly closed store of n blocks on an in-memory file system.
func buildStore(t *testing.T, n int) vfs.FS {
	t.Helper()
	fs := vfs.NewMem()
	e := openEngine(t, fs)
	dump(t, e, 0, n)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return fs
}

func run(t *testing.T, fs vfs.FS, recover bool) *verify.Report {
	t.Helper()
	var progress int64
	r, err := verify.Store(storeDir, verify.Options{FS: fs, Recover: recover, Progress: func(n int64) { progress += n }})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Problems {
		t.Log(p)
	}
	if progress != r.BytesRead {
		t.Errorf("progress reported %d bytes, the report %d", progress, r.BytesRead)
	}
	return r
}

// open opens the store read-only; the caller closes it.
func open(t *testing.T, fs vfs.FS) *verify.Handle {
	t.Helper()
	h, err := verify.Open(storeDir, fs)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// flipPayloadByte flips a byte of shard 2 of block id's record and returns the block's location.
func flipPayloadByte(t *testing.T, fs vfs.FS, id format.BlockID) index.Location {
	t.Helper()
	h := open(t, fs)
	loc, ok, err := h.Index.Get(id)
	path := h.SegmentPath(loc.Segment)
	_ = h.Close()
	if err != nil || !ok {
		t.Fatalf("block %s not in the index: %v", id, err)
	}
	off := loc.ShardOffset(2) + 123
	b := make([]byte, 1)
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(b, off)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, fs, path, []byte{b[0] ^ 0x40}, off)
	return loc
}

func segPath(n uint64) string { return wal.SegmentPath(storeDir+"/"+engine.SegmentDir, n) }

// writeAt writes b at off into the file at path (off < 0: at its end).
func writeAt(t *testing.T, fs vfs.FS, path string, b []byte, off int64) {
	t.Helper()
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if off < 0 {
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		off = st.Size()
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestCleanStore(t *testing.T) {
	fs := buildStore(t, 40)
	r := run(t, fs, true)
	if !r.Clean() || r.BlocksVerified != 40 || r.IndexEntries != 40 || r.ValidRecords != 40 || r.Segments < 3 ||
		r.Sealed != r.Segments || r.Recovery != nil || r.Pending != nil {
		t.Fatalf("clean store: %+v", r)
	}
}

func TestFlippedPayloadByte(t *testing.T) {
	fs := buildStore(t, 40)
	id := testID(7)
	loc := flipPayloadByte(t, fs, id)

	r := run(t, fs, true)
	if r.Clean() || len(r.Problems) != 1 || r.BlocksVerified != 39 {
		t.Fatalf("flipped byte: %d problems, %d blocks verified, want 1, 39", len(r.Problems), r.BlocksVerified)
	}
	p := r.Problems[0]
	if p.Segment != loc.Segment || p.Path != segPath(loc.Segment) || p.Offset != loc.Offset || p.Block != id ||
		!strings.Contains(p.Msg, "shard 2 checksum") {
		t.Errorf("problem %+v, want segment %d offset %d block %s", p, loc.Segment, loc.Offset, id)
	}
	want := fmt.Sprintf("PROBLEM %s offset %d block %s: invalid record", wal.SegmentFileName(loc.Segment), loc.Offset, id)
	if !strings.HasPrefix(p.String(), want) {
		t.Errorf("%q does not start with %q", p.String(), want)
	}
}

// TestCrashClone verifies what a power loss leaves while an engine is open (the last segment
// active, no footer) plus a torn record after its last one. Dumps do not wait for the index to
// sync (the active segment is their durable copy), so the clone's index may lack the newest
// entries and rows: the read-only scan, not the rows, says where the records are.
func TestCrashClone(t *testing.T) {
	mem := vfs.NewCrashableMem()
	e := openEngine(t, mem)
	defer func() { _ = e.Close() }()
	dump(t, e, 0, 25)
	fs := mem.CrashClone(vfs.CrashCloneCfg{})

	// Active: the segment the last blocks went to, full ones before it whose seal (which runs
	// in the background) had not finished, and maybe the dump writer's prepared next one.
	r := run(t, fs, false)
	if !r.Clean() || r.Recovery != nil || r.Active == 0 || len(r.Pending) != r.Active || r.BlocksVerified > 25 {
		t.Fatalf("without Recover: %+v", r)
	}
	var (
		last         *verify.PendingSegment
		withRecords  int
		emptyActives int
	)
	for _, p := range r.Pending {
		if p.Missing && p.Records == 0 {
			// The prepared segment, its directory entry not synced yet: recovery forgets it.
			continue
		}
		if p.Empty != (p.Records == 0) || p.CutBytes != 0 || p.EntriesToDrop != 0 || p.Unreadable != "" || p.Missing {
			t.Errorf("pending %+v: want a clean end", p)
		}
		if p.Empty {
			emptyActives++
			continue
		}
		withRecords++
		if last == nil || p.Number > last.Number {
			last = p
		}
	}
	if withRecords == 0 || emptyActives > 1 {
		t.Fatalf("pending %+v: want the last segments holding blocks, maybe one empty", r.Pending)
	}
	garbage := bytes.Repeat([]byte("torn"), 3000) // past a 4 KiB block: an invalid record header
	writeAt(t, fs, segPath(last.Number), garbage, last.ValidEnd)

	r = run(t, fs, false)
	for _, p := range r.Pending {
		if p.Number != last.Number {
			continue
		}
		if p.Empty || p.CutBytes != int64(len(garbage)) || p.ValidEnd != last.ValidEnd || p.Records != last.Records ||
			p.FileSize != last.ValidEnd+int64(len(garbage)) || p.EntriesToDrop != 0 || p.Stop == "" {
			t.Errorf("pending %+v, want segment %d cut %d bytes after %d", p, last.Number, len(garbage), last.ValidEnd)
		}
		if st, err := fs.Stat(segPath(last.Number)); err != nil || st.Size() != p.FileSize {
			t.Fatalf("verify without Recover changed the segment: %v", err)
		}
	}

	r = run(t, fs, true)
	if !r.Clean() || r.Recovery == nil || r.Pending != nil || r.Active != 0 || r.BlocksVerified != 25 {
		t.Fatalf("with Recover: %+v", r)
	}
	if r.Recovery.SegmentsRecovered != withRecords || r.Recovery.TruncatedBytes != int64(len(garbage)) || r.Recovery.EmptySegmentsDeleted != emptyActives {
		t.Errorf("recovery %+v, want %d segments recovered with %d bytes cut, %d empty one deleted", r.Recovery, withRecords, len(garbage), emptyActives)
	}
	// Recovered: nothing left to recover.
	if r = run(t, fs, true); !r.Clean() || r.Recovery != nil {
		t.Fatalf("second verify: %+v", r)
	}
}

func TestNotAStore(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll(storeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{storeDir, "/nope"} {
		if r, err := verify.Store(dir, verify.Options{FS: fs, Recover: true}); err == nil {
			t.Errorf("%s: no error, report %+v", dir, r)
		}
	}
	if names, _ := fs.List(storeDir); len(names) != 0 {
		t.Errorf("verify wrote into a directory that is not a store: %v", names)
	}
}

// TestRecoveredCrashClonesAreClean takes crash clones that keep a random part of the unsynced
// data at many points of a workload without syncs: after recovery every one verifies clean.
func TestRecoveredCrashClonesAreClean(t *testing.T) {
	mem := vfs.NewCrashableMem()
	e, err := engine.Open(storeDir, engine.Options{FS: mem, Layout: testLayout, Schema: testSchema, SegmentSize: 128 << 10,
		SyncPolicy: engine.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close() }()
	recovered := 0
	for i := 0; i < 8; i++ {
		dump(t, e, i*7, (i+1)*7)
		for _, pct := range []int{0, 50, 100} {
			fs := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(i), uint64(pct)))})
			r := run(t, fs, true)
			if !r.Clean() {
				t.Errorf("clone after %d blocks, %d%% of the unsynced data kept: %d problems", (i+1)*7, pct, len(r.Problems))
			}
			if r.Recovery != nil && r.BlocksVerified > 0 {
				recovered++
			}
		}
	}
	if recovered == 0 {
		t.Error("no clone needed recovery and kept blocks")
	}
}

// TestVerifyCompressedStore: a store of lz4-compressed records verifies clean (stored and raw
// checksums), and a flipped stored byte is reported for its block.
func TestVerifyCompressedStore(t *testing.T) {
	fs := vfs.NewMem()
	e, err := engine.Open(storeDir, engine.Options{FS: fs, Layout: testLayout, Schema: testSchema, SegmentSize: 128 << 10,
		Compression: engine.CompressionLZ4})
	if err != nil {
		t.Fatal(err)
	}
	var ids []format.BlockID
	var src [][]byte
	for j := 0; j < 12; j++ {
		b := make([]byte, testLayout.BlockBytes())
		rand.NewChaCha8([32]byte{byte(j)}).Read(b)
		for sh := int64(0); sh < int64(testLayout.Shards); sh++ {
			clear(b[sh*testLayout.ShardBytes : sh*testLayout.ShardBytes+testLayout.ShardBytes/2]) // compressible
		}
		ids, src = append(ids, testID(j)), append(src, b)
	}
	if err := e.Dump(ids, src).Wait(); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.CompressedBlocks != 12 {
		t.Fatalf("compressed %d blocks", st.CompressedBlocks)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if r := run(t, fs, false); len(r.Problems) != 0 {
		t.Fatalf("clean compressed store: %d problems", len(r.Problems))
	}
	h := open(t, fs)
	loc, ok, err := h.Index.Get(testID(5))
	_ = h.Close()
	if err != nil || !ok || loc.Compression == format.CompressionNone {
		t.Fatalf("block 5: %v %v %v", ok, err, loc.Compression)
	}
	off, _ := loc.ShardExtent(2)
	writeAt(t, fs, segPath(loc.Segment), []byte{0xee}, loc.Offset+format.RecordHeaderSize+off+1)
	r := run(t, fs, false)
	found := false
	for _, p := range r.Problems {
		found = found || strings.Contains(p.String(), testID(5).String())
	}
	if !found {
		t.Fatalf("flipped stored byte not reported for its block: %v", r.Problems)
	}
}

// tieredOptions: two disk tiers of two paths each, none of them the store directory; the first
// holds about 25 records.
func tieredOptions(fs vfs.FS) engine.Options {
	return engine.Options{FS: fs, Layout: testLayout, Schema: testSchema, SegmentSize: 128 << 10,
		Logger: slog.New(slog.DiscardHandler),
		Tiers: []tiers.Config{
			{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/ssd1", "/ssd2"}, Capacity: 512 << 10},
			{Name: "nfs", Kind: tiers.KindDisk, Paths: []string{"/nfs1", "/nfs2"}},
		}}
}

// buildTieredStore fills a two-tier store and demotes most blocks to the second tier.
func buildTieredStore(t *testing.T, fs vfs.FS) {
	t.Helper()
	e, err := engine.Open(storeDir, tieredOptions(fs))
	if err != nil {
		t.Fatal(err)
	}
	dump(t, e, 0, 60)
	if _, err := e.Evict("ssd", 128<<10); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// Verify finds the segments of every path of every tier (the store directory itself holds
// none), and reports a problem in the second tier with that file's path.
func TestVerifyTieredStore(t *testing.T) {
	fs := vfs.NewMem()
	buildTieredStore(t, fs)
	r := run(t, fs, false)
	if !r.Clean() || r.Segments == 0 || r.BlocksVerified != 60 || len(r.SegDirs) != 4 || r.UnregisteredFiles != 0 {
		t.Fatalf("tiered store: %+v", r)
	}
	h := open(t, fs)
	perDir := map[string]int{}
	var low format.BlockID
	for _, m := range h.Index.Segments() {
		perDir[path.Dir(h.SegmentPath(m.Number))]++
	}
	err := h.Index.Iterate(func(id format.BlockID, loc index.Location) bool {
		if h.SegmentTier(loc.Segment) == "nfs" {
			low = id
			return false
		}
		return true
	})
	if err != nil || low.IsZero() || h.NeedsRecovery() {
		t.Fatalf("no block in the second tier (%v), or recovery needed", err)
	}
	_ = h.Close()
	if len(perDir) < 3 {
		t.Fatalf("segments in %d directories only: %v", len(perDir), perDir)
	}
	loc := flipPayloadByte(t, fs, low)
	r = run(t, fs, false)
	if r.Clean() || !strings.HasPrefix(r.Problems[0].Path, "/nfs") || r.Problems[0].Segment != loc.Segment {
		t.Fatalf("flipped byte in the second tier: %+v", r.Problems)
	}
}

// failRemoveFS refuses to delete segment files, as a crash between marking a segment deleting
// and unlinking it would leave the store.
type failRemoveFS struct{ vfs.FS }

func (f failRemoveFS) Remove(name string) error {
	if strings.HasSuffix(name, wal.SegmentExt) {
		return errors.New("injected: remove refused")
	}
	return f.FS.Remove(name)
}

// A segment marked deleting (a retirement a crash interrupted) is not corruption: without
// recovery it is reported as pending; recovery deletes it and the store verifies clean.
func TestVerifyInterruptedRetirement(t *testing.T) {
	fs := vfs.NewMem()
	buildTieredStore(t, fs)
	e, err := engine.Open(storeDir, tieredOptions(failRemoveFS{fs}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Evict("ssd", 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	h := open(t, fs)
	retiring := len(h.RetiringSegments())
	needs := h.NeedsRecovery()
	_ = h.Close()
	if retiring == 0 || !needs {
		t.Fatalf("%d segments marked deleting, needs recovery %v", retiring, needs)
	}
	r := run(t, fs, false)
	if !r.Clean() || r.Retiring != retiring || r.BlocksVerified != 60 {
		t.Fatalf("without recovery: %+v", r)
	}
	pending := 0
	for _, p := range r.Pending {
		if p.Retiring && !p.Missing && p.FileSize > 0 {
			pending++
		}
	}
	if pending != retiring {
		t.Fatalf("pending retirements %d, want %d: %+v", pending, retiring, r.Pending)
	}
	r = run(t, fs, true)
	if !r.Clean() || r.Retiring != 0 || r.Recovery == nil || r.Recovery.RetiredSegmentsDeleted != retiring || r.BlocksVerified != 60 {
		t.Fatalf("after recovery: %+v (recovery %+v)", r, r.Recovery)
	}
}

// TestSidecarsVerified: sidecar records are read and checked like blocks: a clean store
// reports every sidecar verified; a flipped byte in a sidecar's part is a problem naming the
// block and the sidecar's kind, and leaves the blocks verified.
func TestSidecarsVerified(t *testing.T) {
	fs := vfs.NewMem()
	e := openEngine(t, fs)
	dump(t, e, 0, 30)
	ids := make([]format.BlockID, 20)
	src := make([][]byte, 20)
	for i := range ids {
		ids[i] = testID(i)
		src[i] = bytes.Repeat([]byte{byte(i)}, 4*200)
	}
	if err := e.DumpSidecars(2, 4, ids, src).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	r := run(t, fs, true)
	if !r.Clean() || r.BlocksVerified != 30 || r.SidecarEntries != 20 || r.SidecarsVerified != 20 || r.ValidRecords != 50 {
		t.Fatalf("clean store with sidecars: %+v", r)
	}
	h := open(t, fs)
	loc, ok, err := h.Index.GetSidecar(testID(5), 2)
	path := h.SegmentPath(loc.Segment)
	_ = h.Close()
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	writeAt(t, fs, path, []byte{0xee}, loc.Offset+format.RecordHeaderSize+2*200+3)
	r = run(t, fs, false)
	if r.Clean() || len(r.Problems) != 1 || !strings.Contains(r.Problems[0].String(), testID(5).String()) ||
		!strings.Contains(r.Problems[0].String(), "invalid sidecar 2 record") ||
		r.SidecarsVerified != 19 || r.BlocksVerified != 30 {
		t.Fatalf("flipped sidecar byte: %+v", r)
	}
}
