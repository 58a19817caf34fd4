package engine

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/devio/devtest"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// testSchema is the schema every test store uses unless a test changes it.
var testSchema = Schema{Model: "test-model", DType: "bfloat16", KVLayout: "mha", TPRank: 0, TPSize: 1, BlockTokens: 16}

// mhaLayout: 4 layers, K and V, 16 tokens × 2 heads × 64 dims × 2 bytes = 4 KiB per tensor.
var mhaLayout = Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 2 * 4096}

func testOptions(fs vfs.FS, l Layout) Options {
	return Options{Layout: l, Schema: testSchema, FS: fs, SegmentSize: 1 << 20, TaskTimeout: 10 * time.Second}
}

// memFS returns a crash-simulating in-memory file system whose segment files refuse
// misaligned I/O (MemFS accepts it and would hide alignment bugs).
func memFS() (*vfs.MemFS, vfs.FS) {
	mem := vfs.NewCrashableMem()
	return mem, devtest.AlignCheckFS(mem, func(p string) bool { return len(p) > 4 && p[len(p)-4:] == wal.SegmentExt })
}

func mustOpen(t testing.TB, dir string, opts Options) *Engine {
	t.Helper()
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return e
}

// blockID returns a deterministic id for n.
func blockID(n int) BlockID {
	return md5.Sum([]byte(fmt.Sprintf("block-%d", n)))
}

// payload fills b with bytes that are a function of (id, seed): any reader can check them
// without an oracle.
func payload(id BlockID, seed uint64, b []byte) {
	r := rand.NewPCG(binary.LittleEndian.Uint64(id[:8])^seed, binary.LittleEndian.Uint64(id[8:]))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint64())
	}
}

func blockBytes(l Layout, id BlockID) []byte {
	b := make([]byte, l.BlockBytes())
	payload(id, 0, b)
	return b
}

func dumpBlocks(t testing.TB, e *Engine, ids []BlockID) {
	t.Helper()
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = blockBytes(e.Layout(), id)
	}
	if err := e.Dump(ids, src).Wait(); err != nil {
		t.Fatalf("dump: %v", err)
	}
}

func checkBlocks(t testing.TB, e *Engine, ids []BlockID) {
	t.Helper()
	dst := make([][]byte, len(ids))
	for i := range ids {
		dst[i] = devio.AlignedBuffer(int(e.Layout().BlockBytes()))
	}
	if err := e.Load(ids, dst).Wait(); err != nil {
		t.Fatalf("load: %v", err)
	}
	for i, id := range ids {
		if !bytes.Equal(dst[i], blockBytes(e.Layout(), id)) {
			t.Fatalf("block %s: loaded bytes differ", id)
		}
	}
}

func ids(lo, hi int) []BlockID {
	out := make([]BlockID, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, blockID(i))
	}
	return out
}

// TestRoundTripLayouts dumps and loads whole blocks and single shards over the layouts
// connectors use: MHA (2 tensors), MLA (1), ReRoPE (3); 16–128 tokens; 1–80 shards; aligned and
// unaligned shard sizes; aligned and unaligned caller buffers.
func TestRoundTripLayouts(t *testing.T) {
	layouts := map[string]Layout{
		"mha-16tok-1shard":       {Shards: 1, TensorsPerShard: 2, ShardBytes: 2 * 16 * 8 * 128 * 2},
		"mha-16tok-32layers":     {Shards: 32, TensorsPerShard: 2, ShardBytes: 2 * 16 * 8 * 128 * 2},
		"mla-64tok-61layers":     {Shards: 61, TensorsPerShard: 1, ShardBytes: 64 * 576 * 2},
		"rerope-128tok-80layers": {Shards: 80, TensorsPerShard: 3, ShardBytes: 3 * 128 * 1 * 64 * 2},
		"odd-size-shards":        {Shards: 3, TensorsPerShard: 2, ShardBytes: 2 * 1000},
	}
	for name, l := range layouts {
		t.Run(name, func(t *testing.T) {
			_, fs := memFS()
			opts := testOptions(fs, l)
			opts.SegmentSize = 4 * MinSegmentSize
			e := mustOpen(t, "/store", opts)
			defer e.Close()
			blocks := ids(0, 6)
			dumpBlocks(t, e, blocks)
			checkBlocks(t, e, blocks)
			// Layer-wise: every shard of every block, into unaligned buffers too.
			for sh := 0; sh < l.Shards; sh += max(1, l.Shards/7) {
				dst := make([][]byte, len(blocks))
				for i := range dst {
					if i%2 == 0 {
						dst[i] = devio.AlignedBuffer(int(l.ShardBytes))
					} else {
						dst[i] = make([]byte, l.ShardBytes+1)[1:]
					}
				}
				if err := e.LoadShard(blocks, sh, dst).Wait(); err != nil {
					t.Fatalf("load shard %d: %v", sh, err)
				}
				for i, id := range blocks {
					want := blockBytes(l, id)[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]
					if !bytes.Equal(dst[i], want) {
						t.Fatalf("block %s shard %d differs", id, sh)
					}
				}
			}
		})
	}
}

// TestLayerwiseDump dumps blocks one shard per task, in shuffled order, concurrently; a block
// is invisible until its last shard is durable.
func TestLayerwiseDump(t *testing.T) {
	_, fs := memFS()
	l := Layout{Shards: 8, TensorsPerShard: 2, ShardBytes: 8192}
	opts := testOptions(fs, l)
	opts.StageLayerWise = true // the staging path (batch records: batchdump_test.go)
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 10)
	full := make([][]byte, len(blocks))
	for i, id := range blocks {
		full[i] = blockBytes(l, id)
	}
	order := rand.Perm(l.Shards)
	for k, sh := range order {
		if k == len(order)-1 {
			for _, hit := range e.Lookup(blocks) {
				if hit {
					t.Fatal("a block is visible before its last shard was dumped")
				}
			}
		}
		var wg sync.WaitGroup
		for i := range blocks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				src := [][]byte{full[i][int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]}
				if err := e.DumpShard(blocks[i:i+1], sh, src).Wait(); err != nil {
					t.Errorf("dump shard %d of %s: %v", sh, blocks[i], err)
				}
			}()
		}
		wg.Wait()
	}
	for i, hit := range e.Lookup(blocks) {
		if !hit {
			t.Fatalf("block %d not visible after all shards", i)
		}
	}
	checkBlocks(t, e, blocks)
	st := e.Stats()
	if st.StagingBlocks != 0 || st.StagingBytes != 0 {
		t.Fatalf("staging not empty after complete blocks: %+v", st)
	}
	// Every block was partly dumped at once (shard by shard across all of them): the
	// high-water mark is all ten of them, and it stays after they are published.
	if want := int64(len(blocks)) * l.RecordBytes(); st.StagingPeakBytes != want || st.StagingPeakBlocks != int64(len(blocks)) {
		t.Fatalf("staging peak %d bytes, %d blocks; want %d bytes, %d blocks", st.StagingPeakBytes, st.StagingPeakBlocks, want, len(blocks))
	}
}

// TestStagedRecordBuffers: a block staged for a layer-wise dump takes pool buffers of its
// payload's size and of one header page, not one buffer of the next power of two above both
// (a 2 MiB block took 4 MiB, and the pool's bound on idle memory was met twice as soon).
func TestStagedRecordBuffers(t *testing.T) {
	_, fs := memFS()
	for _, l := range []Layout{
		{Shards: 32, TensorsPerShard: 2, ShardBytes: 64 << 10}, // 2 MiB blocks
		{Shards: 8, TensorsPerShard: 2, ShardBytes: 5000},      // padded shards: a 64 KiB payload
	} {
		e := mustOpen(t, fmt.Sprintf("/store-%d", l.ShardBytes), testOptions(fs, l))
		rec := e.newRecord(blockID(1))
		if cap(rec.Buf) != format.RecordHeaderSize || int64(len(rec.Payload)) != l.PayloadBytes() {
			t.Errorf("layout %+v: record buffers of %d and %d bytes (capacities %d, %d); want a header page and the payload (%d bytes)",
				l, len(rec.Buf), len(rec.Payload), cap(rec.Buf), cap(rec.Payload), l.PayloadBytes())
		}
		if l.PayloadBytes() == 2<<20 && cap(rec.Payload) != 2<<20 {
			t.Errorf("a 2 MiB block's payload buffer has capacity %d, want 2 MiB", cap(rec.Payload))
		}
		e.putRecord(rec)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedShardFailsBlock: a shard dump with a wrong-sized buffer fails the whole block: it
// is never published (UCM published such blocks with a hole of zeros).
func TestFailedShardFailsBlock(t *testing.T) {
	_, fs := memFS()
	l := Layout{Shards: 4, TensorsPerShard: 1, ShardBytes: 4096}
	e := mustOpen(t, "/store", testOptions(fs, l))
	defer e.Close()
	id := blockID(1)
	full := blockBytes(l, id)
	shard := func(sh int) [][]byte { return [][]byte{full[sh*4096 : (sh+1)*4096]} }
	if err := e.DumpShard([]BlockID{id}, 0, shard(0)).Wait(); err != nil {
		t.Fatal(err)
	}
	err := e.DumpShard([]BlockID{id}, 1, [][]byte{make([]byte, 100)}).Wait()
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad shard: %v", err)
	}
	for _, sh := range []int{2, 3} {
		if err := e.DumpShard([]BlockID{id}, sh, shard(sh)).Wait(); !errors.Is(err, ErrBlockFailed) {
			t.Fatalf("shard %d after a failed shard: %v, want ErrBlockFailed", sh, err)
		}
	}
	if e.Lookup([]BlockID{id})[0] {
		t.Fatal("a block with a failed shard was published")
	}
	// Once every shard has been tried the tombstone is gone: a fresh dump works.
	dumpBlocks(t, e, []BlockID{id})
	checkBlocks(t, e, []BlockID{id})
	if st := e.Stats(); st.StagingBytes != 0 || st.FailedBlocks != 1 {
		t.Fatalf("stats after failed block: %+v", st)
	}
}

func TestLookupAndPrefix(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	chain := ids(0, 8)
	dumpBlocks(t, e, chain[:3])
	dumpBlocks(t, e, chain[4:6])
	hits := e.Lookup(chain)
	want := []bool{true, true, true, false, true, true, false, false}
	for i := range want {
		if hits[i] != want[i] {
			t.Fatalf("lookup %d = %v want %v", i, hits[i], want[i])
		}
	}
	if n := e.LookupPrefix(chain); n != 3 {
		t.Fatalf("prefix = %d want 3", n)
	}
	if n := e.LookupPrefix(chain[3:]); n != 0 {
		t.Fatalf("prefix from a miss = %d", n)
	}
	if n := e.LookupPrefix(chain[4:6]); n != 2 {
		t.Fatalf("full prefix = %d", n)
	}
	if n := e.LookupPrefix(nil); n != 0 {
		t.Fatal("empty prefix")
	}
}

// TestCreateCommit covers V0: created blocks are invisible until Commit(true), discarded by
// Commit(false), and never published with missing shards.
func TestCreateCommit(t *testing.T) {
	_, fs := memFS()
	l := Layout{Shards: 2, TensorsPerShard: 2, ShardBytes: 8192}
	e := mustOpen(t, "/store", testOptions(fs, l))
	defer e.Close()
	a, b, c, d := blockID(1), blockID(2), blockID(3), blockID(4)
	for _, err := range e.Create([]BlockID{a, b, c}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if errs := e.Create([]BlockID{a, {}}); !errors.Is(errs[0], ErrExists) || !errors.Is(errs[1], ErrInvalidArgument) {
		t.Fatalf("create again / zero id: %v", errs)
	}
	dumpBlocks(t, e, []BlockID{a, b})
	full := blockBytes(l, c)
	if err := e.DumpShard([]BlockID{c}, 0, [][]byte{full[:8192]}).Wait(); err != nil {
		t.Fatal(err)
	}
	if hits := e.Lookup([]BlockID{a, b, c}); hits[0] || hits[1] || hits[2] {
		t.Fatal("created blocks visible before commit")
	}
	if err := e.Commit([]BlockID{a}, true); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit([]BlockID{b}, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Commit([]BlockID{c}, true); !errors.Is(err, ErrBlockFailed) {
		t.Fatalf("commit with a missing shard: %v", err)
	}
	if err := e.Commit([]BlockID{d}, true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("commit of an id never created: %v", err)
	}
	hits := e.Lookup([]BlockID{a, b, c})
	if !hits[0] || hits[1] || hits[2] {
		t.Fatalf("after commit: %v, want [true false false]", hits)
	}
	checkBlocks(t, e, []BlockID{a})
	if errs := e.Create([]BlockID{a}); !errors.Is(errs[0], ErrExists) {
		t.Fatalf("create of a stored block: %v", errs[0])
	}
	if st := e.Stats(); st.StagingBytes != 0 {
		t.Fatalf("staging bytes %d after commits", st.StagingBytes)
	}
}

// TestDuplicateDumpsWriteOnce: concurrent and repeated dumps of one id write one record.
func TestDuplicateDumpsWriteOnce(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	id := blockID(7)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := [][]byte{blockBytes(mhaLayout, id), blockBytes(mhaLayout, id)}
			if err := e.Dump([]BlockID{id, id}, src).Wait(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	st := e.Stats()
	if st.DumpedBlocks != 1 || st.Blocks != 1 || st.LiveBytes != mhaLayout.RecordBytes() {
		t.Fatalf("dumped %d blocks, stored %d, live %d bytes: want 1, 1, %d", st.DumpedBlocks, st.Blocks, st.LiveBytes, mhaLayout.RecordBytes())
	}
	checkBlocks(t, e, []BlockID{id})
}

// TestTypedErrors: every failure reaches the caller as a typed error naming what was wrong,
// and loses nothing already stored.
func TestTypedErrors(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	stored := blockID(1)
	dumpBlocks(t, e, []BlockID{stored})
	bb := int(mhaLayout.BlockBytes())
	cases := []struct {
		name string
		task *Task
		want error
	}{
		{"load missing", e.Load([]BlockID{blockID(2)}, [][]byte{make([]byte, bb)}), ErrNotFound},
		{"load short buffer", e.Load([]BlockID{stored}, [][]byte{make([]byte, bb-1)}), ErrInvalidArgument},
		{"load zero id", e.Load([]BlockID{{}}, [][]byte{make([]byte, bb)}), ErrInvalidArgument},
		{"load count mismatch", e.Load([]BlockID{stored}, nil), ErrInvalidArgument},
		{"load shard out of range", e.LoadShard([]BlockID{stored}, 4, [][]byte{make([]byte, 8192)}), ErrInvalidArgument},
		{"dump long buffer", e.Dump([]BlockID{blockID(3)}, [][]byte{make([]byte, bb+1)}), ErrInvalidArgument},
		{"dump zero id", e.Dump([]BlockID{{}}, [][]byte{make([]byte, bb)}), ErrInvalidArgument},
		{"dump shard negative", e.DumpShard([]BlockID{blockID(3)}, -1, [][]byte{make([]byte, 8192)}), ErrInvalidArgument},
	}
	for _, c := range cases {
		err := c.task.Wait()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if err2 := c.task.Wait(); err2 != err {
			t.Errorf("%s: second Wait returned %v, first %v", c.name, err2, err)
		}
		if done, err3 := c.task.Check(); !done || err3 != err {
			t.Errorf("%s: Check = %v, %v", c.name, done, err3)
		}
	}
	if err := e.Load([]BlockID{blockID(2)}, [][]byte{make([]byte, bb)}).Wait(); err == nil ||
		!bytes.Contains([]byte(err.Error()), []byte(blockID(2).String())) {
		t.Errorf("a miss does not name the block: %v", err)
	}
	checkBlocks(t, e, []BlockID{stored})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Load([]BlockID{stored}, [][]byte{make([]byte, bb)}).Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("load after close: %v", err)
	}
	if err := e.Dump([]BlockID{stored}, [][]byte{make([]byte, bb)}).Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("dump after close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	// Invalid options name the field.
	bad := testOptions(fs, mhaLayout)
	bad.QueueDepth = -1
	if _, err := Open("/store2", bad); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad queue depth: %v", err)
	}
	bad = testOptions(fs, Layout{Shards: 0, TensorsPerShard: 1, ShardBytes: 1})
	if _, err := Open("/store2", bad); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad layout: %v", err)
	}
	bad = testOptions(fs, mhaLayout)
	bad.Schema.Model = ""
	if _, err := Open("/store2", bad); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty model: %v", err)
	}
	// Everything stored survives.
	e = mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	checkBlocks(t, e, []BlockID{stored})
}

func TestTaskTimeoutCancels(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	opts.TaskTimeout = time.Nanosecond
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 300)
	dst := make([][]byte, len(blocks))
	for i := range dst {
		dst[i] = make([]byte, mhaLayout.BlockBytes())
	}
	err := e.Load(blocks, dst).Wait()
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrNotFound) {
		t.Fatalf("load past its timeout: %v", err)
	}
}

func TestDirectoryLock(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	_, err := Open("/store", testOptions(fs, mhaLayout))
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	e.Close()
	e = mustOpen(t, "/store", testOptions(fs, mhaLayout))
	e.Close()
}

func TestSchemaMismatch(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	dumpBlocks(t, e, ids(0, 3))
	e.Close()
	for name, mutate := range map[string]func(*Options){
		"dtype":  func(o *Options) { o.Schema.DType = "fp8_e4m3" },
		"tp":     func(o *Options) { o.Schema.TPSize, o.Schema.TPRank = 2, 1 },
		"layout": func(o *Options) { o.Layout.Shards = 8 },
		"model":  func(o *Options) { o.Schema.Model = "other" },
		"hash":   func(o *Options) { o.Schema.HashScheme = HashSchemeUCMPickle },
	} {
		opts := testOptions(fs, mhaLayout)
		mutate(&opts)
		if _, err := Open("/store", opts); !errors.Is(err, ErrSchemaMismatch) {
			t.Errorf("%s changed: %v, want ErrSchemaMismatch", name, err)
		}
	}
	e = mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	checkBlocks(t, e, ids(0, 3))
}

// TestReopenKeepsBlocksAndAccounting: a clean close and reopen serves every block, with the
// same exact space accounting, across several segments.
func TestReopenKeepsBlocksAndAccounting(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 64 << 10})
	e := mustOpen(t, "/store", opts)
	blocks := ids(0, 20) // 20 × 260 KiB over 1 MiB segments: several segments
	dumpBlocks(t, e, blocks)
	before := e.Stats()
	if before.Segments < 4 {
		t.Fatalf("expected several segments, have %d", before.Segments)
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e = mustOpen(t, "/store", opts)
	defer e.Close()
	after := e.Stats()
	// File bytes grow by the footer Close wrote to the active segment; checkFileSizes checks them.
	if after.Blocks != before.Blocks || after.LiveBytes != before.LiveBytes {
		t.Fatalf("accounting changed across reopen: %+v vs %+v", before, after)
	}
	if r := e.Recovery(); r.SegmentsRecovered != 0 || r.EntriesDropped != 0 {
		t.Fatalf("clean reopen recovered something: %+v", r)
	}
	checkBlocks(t, e, blocks)
	checkFileSizes(t, fs, e)
}

// checkFileSizes asserts that the accounted file bytes equal the segment files' sizes.
func checkFileSizes(t *testing.T, fs vfs.FS, e *Engine) {
	t.Helper()
	if err := fileSizesMatch(fs, e); err != nil {
		t.Fatal(err)
	}
}

// activeSizes maps each active segment to its recorded size: the end of its last record. Its
// file is preallocated beyond that (the dump writer prepares its next segment at Open).
func activeSizes(rows []index.SegmentMeta) map[uint64]int64 {
	m := map[uint64]int64{}
	for _, r := range rows {
		if r.State == index.SegmentActive {
			m[r.Number] = r.Size
		}
	}
	return m
}

// fileBytesOf is what segment file name of size bytes counts for in the accounting: its size,
// or, for an active segment, its recorded size (its file may be preallocated beyond, or not
// hold its header yet).
func fileBytesOf(name string, size int64, active map[uint64]int64) int64 {
	if n, ok := wal.ParseSegmentFileName(name); ok {
		if recorded, ok := active[n]; ok {
			return recorded
		}
	}
	return size
}

func fileSizesMatch(fs vfs.FS, e *Engine) error {
	var total int64
	names, err := fs.List(e.segDir)
	if err != nil {
		return err
	}
	active := activeSizes(e.ix.Segments())
	for _, n := range names {
		st, err := fs.Stat(fs.PathJoin(e.segDir, n))
		if err != nil {
			return err
		}
		total += fileBytesOf(n, st.Size(), active)
	}
	if _, _, fileBytes := e.ix.Totals(); fileBytes != total {
		return fmt.Errorf("accounted file bytes %d, segment files hold %d", fileBytes, total)
	}
	return nil
}

// TestDirectoryLockAcrossProcesses: a second process opening a store in use gets ErrLocked.
// The test binary re-executes itself as the second process.
func TestDirectoryLockAcrossProcesses(t *testing.T) {
	if dir := os.Getenv("UCM_TEST_LOCK_CHILD"); dir != "" {
		_, err := Open(dir, testOptions(vfs.Default, mhaLayout))
		fmt.Printf("child-open: locked=%v err=%v\n", errors.Is(err, ErrLocked), err)
		return
	}
	dir := t.TempDir()
	e := mustOpen(t, dir, testOptions(vfs.Default, mhaLayout))
	defer e.Close()
	// In this process too.
	if _, err := Open(dir, testOptions(vfs.Default, mhaLayout)); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open in-process: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDirectoryLockAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "UCM_TEST_LOCK_CHILD="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("child-open: locked=true")) {
		t.Fatalf("second process did not get ErrLocked:\n%s", out)
	}
}

// TestWholeDumpOfBlockInAssemblyWaitsForIt: a whole-block dump of a block another task is
// assembling shard by shard completes only once the block is durable and visible, even when
// the other task is still copying the last shard in (held there by shardCopyHook until the
// whole-block dump has met the block in assembly).
func TestWholeDumpOfBlockInAssemblyWaitsForIt(t *testing.T) {
	_, fs := memFS()
	l := Layout{Shards: 2, TensorsPerShard: 1, ShardBytes: 4 << 20}
	opts := testOptions(fs, l)
	opts.SegmentSize = 16 << 20
	opts.StageLayerWise = true // blocks assembled in staging (a batch's are not waited for: batchdump_test.go)
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	id := blockID(100)
	full := blockBytes(l, id)
	if err := e.DumpShard([]BlockID{id}, 0, [][]byte{full[:l.ShardBytes]}).Wait(); err != nil {
		t.Fatal(err)
	}
	copying, release := make(chan struct{}), make(chan struct{})
	hook := func(he *Engine, hid BlockID, shard int) {
		if he == e && hid == id && shard == 1 {
			close(copying)
			<-release
		}
	}
	shardCopyHook.Store(&hook)
	defer shardCopyHook.Store(nil)
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock() // a failed check must not leave the copy held (Close waits for it)
	last := e.DumpShard([]BlockID{id}, 1, [][]byte{full[l.ShardBytes:]})
	<-copying // the last shard is claimed and not yet copied in
	whole := e.Dump([]BlockID{id}, [][]byte{full})
	// The whole-block dump has delivered both shards to the slot (both already claimed).
	attempts := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		if s := e.mu.staging[id]; s != nil {
			return s.attempts
		}
		return -1
	}
	waitFor(t, "the whole-block dump to meet the block in assembly", func() bool { return attempts() >= 4 })
	if done, err := whole.Check(); done {
		t.Fatalf("the whole-block dump completed (%v) while the block's last shard was still being copied in", err)
	}
	if e.Lookup([]BlockID{id})[0] {
		t.Fatal("the block is visible before its last shard was copied in")
	}
	unblock()
	if err := whole.Wait(); err != nil {
		t.Fatal(err)
	}
	if !e.Lookup([]BlockID{id})[0] {
		t.Fatal("Dump returned before the block was visible")
	}
	if err := last.Wait(); err != nil {
		t.Fatal(err)
	}
	checkBlock(t, e, id)
	if got := e.Stats().DedupedDumps; got != 1 {
		t.Fatalf("%d deduplicated dumps, want 1 (the whole-block dump is the layer-wise one's)", got)
	}
}

// The dump writer prepares its next segment once it writes to one; Close deletes it when
// unused, so opening and closing a store leaves no segment behind, and after dumps only the
// sealed segments holding them remain.
func TestPreparedSegmentDroppedAtClose(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	for i := 0; i < 3; i++ {
		e := mustOpen(t, "/store", opts)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	e := mustOpen(t, "/store", opts)
	blocks := ids(0, 4)
	dumpBlocks(t, e, blocks)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", opts)
	checkBlocks(t, e, blocks)
	if r := e.Recovery(); r.EmptySegmentsDeleted != 0 || r.SegmentsRecovered != 0 {
		t.Fatalf("clean reopen recovered segments: %+v", r)
	}
	used := map[uint64]bool{}
	for _, id := range blocks {
		used[location(t, e, id).Segment] = true
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	names, err := fs.List(e.segDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if num, ok := wal.ParseSegmentFileName(n); ok && !used[num] {
			t.Errorf("segment file %s holds no dumped block: a prepared segment was left behind", n)
		} else if ok {
			delete(used, num)
		}
	}
	if len(used) != 0 {
		t.Fatalf("segments %v holding blocks are gone", used)
	}
}

// TestTimingObservers: Options.OnFlight hears of every dumped record once, in flights whose
// steps are in order, and Options.OnLoad of every block a load task reads, with its reads and
// bytes, steps in order.
func TestTimingObservers(t *testing.T) {
	_, fs := memFS()
	l := Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 8192}
	var (
		mu      sync.Mutex
		flights []wal.FlightTiming
		loads   []LoadTiming
	)
	opts := testOptions(fs, l)
	opts.OnFlight = func(ft wal.FlightTiming) { mu.Lock(); flights = append(flights, ft); mu.Unlock() }
	opts.OnLoad = func(lt LoadTiming) { mu.Lock(); loads = append(loads, lt); mu.Unlock() }
	opts.StageLayerWise = true // flights of block records
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 6)
	for sh := 0; sh < l.Shards; sh++ {
		src := make([][]byte, len(blocks))
		for i, id := range blocks {
			src[i] = blockBytes(l, id)[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]
		}
		if err := e.DumpShard(blocks, sh, src).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([][]byte, len(blocks))
	for i := range dst {
		dst[i] = make([]byte, l.ShardBytes)
	}
	if err := e.LoadShard(blocks, 2, dst).Wait(); err != nil {
		t.Fatal(err)
	}
	// OnFlight runs once a flight is settled, after its records' dumps were answered.
	waitFor(t, "every flight reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, ft := range flights {
			n += ft.Records
		}
		return n >= len(blocks)
	})
	mu.Lock()
	defer mu.Unlock()
	records := 0
	for _, ft := range flights {
		records += ft.Records
		if ft.Issued.Before(ft.Appended) || ft.Written.Before(ft.Issued) || ft.Published.Before(ft.Written) {
			t.Fatalf("flight steps out of order: %+v", ft)
		}
	}
	if records != len(blocks) {
		t.Fatalf("flights report %d records, want %d", records, len(blocks))
	}
	if len(loads) != 1 {
		t.Fatalf("%d load timings for one task of %d blocks, want 1", len(loads), len(blocks))
	}
	lt := loads[0]
	if lt.Blocks != len(blocks) || lt.Reads != len(blocks) || lt.Bytes != int64(len(blocks))*l.ShardBytes ||
		lt.Start.Before(lt.Queued) || lt.Submitted.Before(lt.Start) || lt.Read.Before(lt.Submitted) || lt.Done.Before(lt.Read) {
		t.Fatalf("load timing %+v: want %d blocks, %d reads of %d bytes, steps in order", lt, len(blocks), len(blocks), l.ShardBytes)
	}
}
