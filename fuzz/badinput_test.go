package fuzz

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/wal"
)

// TestBadOptions: every invalid option fails Open with ErrInvalidArgument naming the field,
// and creates nothing.
func TestBadOptions(t *testing.T) {
	cases := []struct {
		name  string
		mut   func(o *engine.Options)
		field string // substring the message must contain
	}{
		{"queue-depth-negative", func(o *engine.Options) { o.QueueDepth = -1 }, "queue depth"},
		{"queue-depth-huge", func(o *engine.Options) { o.QueueDepth = 1 << 20 }, "queue depth"},
		{"recycle-segments-huge", func(o *engine.Options) { o.RecycleSegments = 1 << 20 }, "recycle segments"},
		{"segment-size-tiny", func(o *engine.Options) { o.SegmentSize = 4096 }, "segment size"},
		{"segment-size-negative", func(o *engine.Options) { o.SegmentSize = -1 }, "segment size"},
		{"segment-size-unaligned", func(o *engine.Options) { o.SegmentSize = 1<<20 + 1 }, "segment size"},
		{"sync-policy", func(o *engine.Options) { o.SyncPolicy = 7 }, "sync policy"},
		{"sync-policy-negative", func(o *engine.Options) { o.SyncPolicy = -1 }, "sync policy"},
		{"sync-interval", func(o *engine.Options) { o.SyncInterval = -time.Second }, "sync interval"},
		{"io-engine", func(o *engine.Options) { o.IOEngine = 9 }, "io engine"},
		{"direct-io", func(o *engine.Options) { o.DirectIO = -3 }, "direct io"},
		{"task-timeout", func(o *engine.Options) { o.TaskTimeout = -1 }, "task timeout"},
		{"max-staging", func(o *engine.Options) { o.MaxStagingBytes = 1 }, "max staging bytes"},
		{"layout-zero", func(o *engine.Options) { o.Layout = engine.Layout{} }, "layout"},
		{"layout-shards", func(o *engine.Options) { o.Layout.Shards = -4 }, "shards"},
		{"layout-tensors", func(o *engine.Options) { o.Layout.TensorsPerShard = 0 }, "tensors per shard"},
		{"layout-shard-bytes", func(o *engine.Options) { o.Layout.ShardBytes = 0 }, "shard bytes"},
		{"layout-shard-bytes-not-multiple", func(o *engine.Options) { o.Layout.ShardBytes = 8191 }, "shard bytes"},
		{"layout-huge", func(o *engine.Options) { o.Layout.ShardBytes = 1 << 40 }, "shard bytes"},
		{"schema-model", func(o *engine.Options) { o.Schema.Model = "" }, "model"},
		{"schema-dtype", func(o *engine.Options) { o.Schema.DType = "" }, "dtype"},
		{"schema-tp-size", func(o *engine.Options) { o.Schema.TPSize = 0 }, "tp"},
		{"schema-tp-rank", func(o *engine.Options) { o.Schema.TPRank = 1 }, "tp rank"},
		{"schema-tp-rank-negative", func(o *engine.Options) { o.Schema.TPRank = -1 }, "tp rank"},
		{"schema-block-tokens", func(o *engine.Options) { o.Schema.BlockTokens = 0 }, "block tokens"},
	}
	for _, c := range cases {
		mem := vfs.NewCrashableMem()
		opts := fOptions(mem)
		c.mut(&opts)
		e, err := engine.Open(storeDir, opts)
		if err == nil {
			e.Close()
			t.Errorf("%s: Open accepted invalid options", c.name)
			continue
		}
		if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v; want ErrInvalidArgument naming %q", c.name, err, c.field)
		}
		if _, serr := mem.Stat(storeDir); serr == nil {
			t.Errorf("%s: a rejected Open created %s", c.name, storeDir)
		}
	}
	// Opening a store that does not exist for inspection fails cleanly.
	for _, mut := range []func(o *engine.Options){
		func(o *engine.Options) { o.ReadOnly = true },
		func(o *engine.Options) { o.AdoptStoredSchema = true },
	} {
		opts := fOptions(vfs.NewCrashableMem())
		mut(&opts)
		if e, err := engine.Open(storeDir, opts); err == nil {
			e.Close()
			t.Errorf("read-only/adopt Open of a missing store succeeded")
		}
	}
	t.Logf("bad options: %d invalid configurations rejected with ErrInvalidArgument naming the field", len(cases))
}

// TestBadBuffersAndIDs: wrong sizes, unaligned buffers, zero and duplicate ids, out-of-range
// shards. Bad entries fail per block with ErrInvalidArgument; good ones in the same call work;
// unaligned buffers are bounced and work.
func TestBadBuffersAndIDs(t *testing.T) {
	base := goroutineBaseline()
	mem := vfs.NewCrashableMem()
	e, err := engine.Open(storeDir, fOptions(alignChecked(mem)))
	if err != nil {
		t.Fatal(err)
	}
	bb := int(fLayout.BlockBytes())
	var zero engine.BlockID
	good := bid(1)

	// Wrong sizes and a zero id mixed with a good block in one call.
	bad := [][]byte{nil, make([]byte, bb-1), make([]byte, bb+1), make([]byte, 0, bb)}
	ids := []engine.BlockID{good, bid(2), bid(3), bid(4), bid(5), zero}
	src := append([][]byte{blockPayload(good)}, bad...)
	src = append(src, blockPayload(bid(6)))
	task := e.Dump(ids, src)
	_ = task.Wait()
	errs := task.BlockErrors()
	if errs[0] != nil {
		t.Errorf("good block in a call with bad ones: %v", errs[0])
	}
	for i := 1; i < len(ids); i++ {
		if !errors.Is(errs[i], engine.ErrInvalidArgument) {
			t.Errorf("dump entry %d: %v, want ErrInvalidArgument", i, errs[i])
		}
	}
	if hits := e.Lookup(ids); hits[1] || hits[2] || hits[3] || hits[4] || hits[5] {
		t.Errorf("a rejected block is visible: %v", hits)
	}
	// Mismatched lengths, out-of-range shards.
	if err := e.Dump(ids[:2], src[:1]).Wait(); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("dump with fewer buffers than ids: %v", err)
	}
	if err := e.Load(ids[:2], [][]byte{make([]byte, bb)}).Wait(); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("load with fewer buffers than ids: %v", err)
	}
	for _, sh := range []int{-1, fLayout.Shards, 1 << 30} {
		if err := e.DumpShard([]engine.BlockID{bid(7)}, sh, [][]byte{make([]byte, fLayout.ShardBytes)}).Wait(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("DumpShard shard %d: %v", sh, err)
		}
		if err := e.LoadShard([]engine.BlockID{good}, sh, [][]byte{make([]byte, fLayout.ShardBytes)}).Wait(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("LoadShard shard %d: %v", sh, err)
		}
	}
	// A wrong-size shard fails its block: never published with holes.
	if err := e.DumpShard([]engine.BlockID{bid(8)}, 0, [][]byte{shardPayload(bid(8), 0)}).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := e.DumpShard([]engine.BlockID{bid(8)}, 1, [][]byte{make([]byte, 3)}).Wait(); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("wrong-size shard: %v", err)
	}
	for sh := 2; sh < fLayout.Shards; sh++ {
		_ = e.DumpShard([]engine.BlockID{bid(8)}, sh, [][]byte{shardPayload(bid(8), sh)}).Wait()
	}
	if e.Lookup([]engine.BlockID{bid(8)})[0] {
		t.Errorf("a block with a failed shard was published")
	}
	// Loads: wrong sizes and zero id.
	lt := e.Load([]engine.BlockID{good, good, zero}, [][]byte{make([]byte, bb-4096), make([]byte, bb+1), make([]byte, bb)})
	_ = lt.Wait()
	for i, err := range lt.BlockErrors() {
		if !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("load entry %d: %v, want ErrInvalidArgument", i, err)
		}
	}
	if e.Lookup([]engine.BlockID{zero})[0] || e.LookupPrefix([]engine.BlockID{zero}) != 0 {
		t.Errorf("zero id reported as stored")
	}
	if errs := e.Create([]engine.BlockID{zero}); !errors.Is(errs[0], engine.ErrInvalidArgument) {
		t.Errorf("Create(zero): %v", errs[0])
	}

	// Unaligned caller buffers (offset by 1 byte and by 8 bytes) are bounced, both ways.
	for k, skew := range []int{1, 8, 512} {
		id := bid(20 + k)
		raw := make([]byte, bb+skew)
		src := raw[skew:]
		copy(src, blockPayload(id))
		if err := e.Dump([]engine.BlockID{id}, [][]byte{src}).Wait(); err != nil {
			t.Errorf("dump from a buffer skewed by %d: %v", skew, err)
		}
		dstRaw := make([]byte, bb+skew)
		dst := dstRaw[skew:]
		if err := e.Load([]engine.BlockID{id}, [][]byte{dst}).Wait(); err != nil || !bytes.Equal(dst, blockPayload(id)) {
			t.Errorf("load into a buffer skewed by %d: %v (bytes equal %v)", skew, err, bytes.Equal(dst, blockPayload(id)))
		}
		sraw := make([]byte, fLayout.ShardBytes+int64(skew))
		sdst := sraw[skew:]
		if err := e.LoadShard([]engine.BlockID{id}, 2, [][]byte{sdst}).Wait(); err != nil || !bytes.Equal(sdst, shardPayload(id, 2)) {
			t.Errorf("shard load into a buffer skewed by %d: %v", skew, err)
		}
	}

	// Duplicate ids in one call: same bytes, then different bytes (the first wins, the other is
	// deduplicated: content-addressed ids make them equal in practice).
	d := bid(30)
	if err := e.Dump([]engine.BlockID{d, d, d}, [][]byte{blockPayload(d), blockPayload(d), blockPayload(d)}).Wait(); err != nil {
		t.Errorf("dump of a duplicated id: %v", err)
	}
	d2 := bid(31)
	other := blockPayload(bid(99))
	if err := e.Dump([]engine.BlockID{d2, d2}, [][]byte{blockPayload(d2), other}).Wait(); err != nil {
		t.Errorf("dump of a duplicated id with different bytes: %v", err)
	}
	dst, lerrs := loadNs(e, []int{31})
	if lerrs[0] != nil || !(bytes.Equal(dst[0], blockPayload(d2)) || bytes.Equal(dst[0], other)) {
		t.Errorf("duplicated id with different bytes: load %v; bytes are neither payload", lerrs[0])
	}
	// Same id twice in a load, and duplicate shards of a layer-wise dump.
	dst, lerrs = loadNs(e, []int{30, 30})
	for i := range dst {
		if lerrs[i] != nil || !bytes.Equal(dst[i], blockPayload(d)) {
			t.Errorf("load of a duplicated id, entry %d: %v", i, lerrs[i])
		}
	}
	ls := bid(32)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sh := 0; sh < fLayout.Shards; sh++ {
			p := shardPayload(ls, sh)
			if err := e.DumpShard([]engine.BlockID{ls, ls}, sh, [][]byte{p, p}).Wait(); err != nil {
				t.Errorf("layer-wise dump with a duplicated id, shard %d: %v", sh, err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("layer-wise dump with a duplicated id hangs")
	}
	dst, lerrs = [][]byte{make([]byte, bb)}, nil
	if err := e.Load([]engine.BlockID{ls}, dst).Wait(); err != nil || !bytes.Equal(dst[0], blockPayload(ls)) {
		t.Errorf("layer-wise block with duplicated ids: %v", err)
	}
	checkServed(t, e, []int{1, 20, 21, 22, 30, 32}, "after bad input")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	checkNoLeak(t, base, "bad buffers")
}

// segmentFiles lists the segment files of the store on fs, sorted.
func segmentFiles(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	names, err := fs.List(storeDir + "/" + engine.SegmentDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if _, ok := wal.ParseSegmentFileName(n); ok {
			out = append(out, storeDir+"/"+engine.SegmentDir+"/"+n)
		}
	}
	sort.Strings(out)
	return out
}

// flipByte xors one byte of a file with a non-zero mask.
func flipByte(t *testing.T, fs vfs.FS, path string, off int64, mask byte) {
	t.Helper()
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestBadCorruptSegments flips random bytes anywhere in the segment files of a store (closed
// cleanly, or crashed with its last segment active), reopens it and loads every block: each is
// either its exact payload or a miss (ErrCorrupt / ErrNotFound); never wrong bytes, never a
// panic; a flip inside a block's payload is always detected; Stats counts the corrupt reads.
func TestBadCorruptSegments(t *testing.T) {
	var flips, flipsInPayload, detected, corruptReads, served, missed, openErrs int
	const seeds = 12
	for seed := uint64(1); seed <= seeds; seed++ {
		crashed := seed%3 == 0
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		mem := vfs.NewCrashableMem()
		opts := fOptions(alignChecked(mem))
		e, err := engine.Open(storeDir, opts)
		if err != nil {
			t.Fatal(err)
		}
		all := span(0, 20)
		mustDump(t, e, all)
		// Locations, to know which flips hit a block's payload.
		type span64 struct{ lo, hi int64 }
		payloadOf := map[string]map[int]span64{} // path -> block -> payload byte range
		for _, n := range all {
			loc, ok, err := e.Index().Get(bid(n))
			if err != nil || !ok {
				t.Fatalf("block %d not indexed: %v", n, err)
			}
			p := wal.SegmentPath(storeDir+"/"+engine.SegmentDir, loc.Segment)
			if payloadOf[p] == nil {
				payloadOf[p] = map[int]span64{}
			}
			payloadOf[p][n] = span64{loc.Offset + format.RecordHeaderSize, loc.Offset + fLayout.RecordBytes()}
		}
		var fs *vfs.MemFS = mem
		if crashed {
			fs = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		}
		_ = e.Close()
		// Segment files with bytes to flip (a prepared segment may be empty: created, its
		// header written only with its first records).
		var files []string
		for _, p := range segmentFiles(t, fs) {
			if st, err := fs.Stat(p); err == nil && st.Size() > 0 {
				files = append(files, p)
			}
		}
		nflips := 1 + rng.IntN(12)
		hitBlocks := map[int]bool{}
		for k := 0; k < nflips; k++ {
			p := files[rng.IntN(len(files))]
			st, err := fs.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			off := rng.Int64N(st.Size())
			flipByte(t, fs, p, off, byte(1+rng.IntN(255)))
			flips++
			for n, r := range payloadOf[p] {
				if off >= r.lo && off < r.hi {
					hitBlocks[n] = true
					flipsInPayload++
				}
			}
		}
		opts.FS = alignChecked(fs)
		e, err = engine.Open(storeDir, opts)
		if err != nil {
			// Recovery of a crashed store scans its active segment; a clear error is allowed,
			// a panic is not.
			openErrs++
			t.Logf("seed %d (crashed %v): Open refused the corrupted store: %v", seed, crashed, err)
			continue
		}
		hits := e.Lookup(idsOf(all))
		dst, errs := loadNs(e, all)
		for i, n := range all {
			switch {
			case errs[i] == nil:
				if !bytes.Equal(dst[i], blockPayload(bid(n))) {
					t.Errorf("seed %d: block %d: WRONG BYTES served after corruption", seed, n)
				}
				if hitBlocks[n] {
					t.Errorf("seed %d: block %d served although a byte of its payload was flipped", seed, n)
				}
				served++
			case errors.Is(errs[i], engine.ErrCorrupt), errors.Is(errs[i], engine.ErrNotFound):
				missed++
				if hitBlocks[n] {
					detected++
				}
			default:
				t.Errorf("seed %d: block %d (lookup %v): %v; want the payload, ErrCorrupt or ErrNotFound", seed, n, hits[i], errs[i])
			}
		}
		// Shard loads of every block verify too.
		for _, n := range all[:5] {
			for sh := 0; sh < fLayout.Shards; sh++ {
				d := [][]byte{make([]byte, fLayout.ShardBytes)}
				err := e.LoadShard(idsOf([]int{n}), sh, d).Wait()
				if err == nil && !bytes.Equal(d[0], shardPayload(bid(n), sh)) {
					t.Errorf("seed %d: shard %d of block %d: WRONG BYTES", seed, sh, n)
				}
			}
		}
		corruptReads += int(e.Stats().CorruptReads)
		// The store still works: the lost blocks can be dumped again.
		var lost []int
		for i, n := range all {
			if errs[i] != nil {
				lost = append(lost, n)
			}
		}
		if len(lost) > 0 {
			for i, err := range dumpNs(e, lost) {
				if err != nil {
					t.Errorf("seed %d: re-dump of lost block %d: %v", seed, lost[i], err)
				}
			}
			checkServed(t, e, all, fmt.Sprintf("seed %d after re-dump", seed))
		}
		if err := e.Close(); err != nil {
			t.Errorf("seed %d: close: %v", seed, err)
		}
	}
	t.Logf("corruption: %d stores (every third crashed with an active segment), %d random byte flips injected, %d inside a block payload; "+
		"%d block loads served exact bytes, %d were misses (%d counted in Stats.CorruptReads), every payload flip detected (%d blocks); "+
		"%d reopen refusals; 0 wrong bytes", seeds, flips, flipsInPayload, served, missed, corruptReads, detected, openErrs)
}

// TestBadForeignFiles: files the engine does not own in the store directory, in segments/ and
// in index/ are left alone and do not fail Open.
func TestBadForeignFiles(t *testing.T) {
	mem := vfs.NewCrashableMem()
	opts := fOptions(alignChecked(mem))
	e, err := engine.Open(storeDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	mustDump(t, e, span(0, 10))
	_ = e.Close()
	foreign := map[string]string{
		storeDir + "/README":                        "notes",
		storeDir + "/segments/notes.txt":            "x",
		storeDir + "/segments/notes.seg":            "not a segment",
		storeDir + "/segments/12.seg":               "short name",
		storeDir + "/segments/0000000000000001.bak": "backup",
		storeDir + "/index/foreign.txt":             "y",
	}
	for p, body := range foreign {
		f, err := mem.Create(p, vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = f.Write([]byte(body))
		_ = f.Sync()
		_ = f.Close()
	}
	if err := mem.MkdirAll(storeDir+"/segments/subdir", 0o755); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		e, err = engine.Open(storeDir, opts)
		if err != nil {
			t.Fatalf("open with foreign files: %v", err)
		}
		checkServed(t, e, span(0, 10), "with foreign files")
		mustDump(t, e, span(10+round*5, 15+round*5))
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for p, body := range foreign {
		f, err := mem.Open(p)
		if err != nil {
			t.Errorf("foreign file %s removed: %v", p, err)
			continue
		}
		got := make([]byte, len(body)+1)
		n, _ := f.ReadAt(got, 0)
		_ = f.Close()
		if string(got[:n]) != body {
			t.Errorf("foreign file %s changed: %q", p, got[:n])
		}
	}
	if _, err := mem.Stat(storeDir + "/segments/subdir"); err != nil {
		t.Errorf("foreign directory removed: %v", err)
	}
	t.Logf("foreign files: %d files and 1 directory left alone over 2 reopens", len(foreign))
}

// TestBadIndexDamage removes or truncates parts of the Pebble index of a closed store and
// reopens it: Open either fails with a clear error or succeeds; if it succeeds every block it
// reports is served byte-identical. A deleted (or emptied) index is rebuilt from the segments.
func TestBadIndexDamage(t *testing.T) {
	ixDir := storeDir + "/" + engine.IndexDir
	damage := []struct {
		name string
		do   func(t *testing.T, fs *vfs.MemFS) // damages the index of a closed store
		// mustRebuild: every block must be served after the damage.
		mustRebuild bool
	}{
		{"delete-index-dir", func(t *testing.T, fs *vfs.MemFS) { must(t, fs.RemoveAll(ixDir)) }, true},
		{"empty-index-dir", func(t *testing.T, fs *vfs.MemFS) {
			for _, n := range list(t, fs, ixDir) {
				must(t, fs.RemoveAll(ixDir+"/"+n))
			}
		}, true},
		{"remove-manifest", func(t *testing.T, fs *vfs.MemFS) { removeMatching(t, fs, ixDir, "MANIFEST-") }, false},
		{"remove-marker", func(t *testing.T, fs *vfs.MemFS) { removeMatching(t, fs, ixDir, "marker.") }, false},
		{"remove-options", func(t *testing.T, fs *vfs.MemFS) { removeMatching(t, fs, ixDir, "OPTIONS-") }, false},
		{"remove-newest-wal", func(t *testing.T, fs *vfs.MemFS) { removeNewest(t, fs, ixDir, ".log") }, false},
		{"truncate-newest-wal", func(t *testing.T, fs *vfs.MemFS) { truncateNewest(t, fs, ixDir, ".log") }, false},
		{"truncate-manifest", func(t *testing.T, fs *vfs.MemFS) { truncateNewest(t, fs, ixDir, "MANIFEST-") }, false},
	}
	for _, d := range damage {
		t.Run(d.name, func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			opts := fOptions(alignChecked(mem))
			e, err := engine.Open(storeDir, opts)
			if err != nil {
				t.Fatal(err)
			}
			all := span(0, 30)
			mustDump(t, e, all)
			_ = e.Close()
			before := list(t, mem, ixDir)
			d.do(t, mem)
			e, err = engine.Open(storeDir, opts)
			if err != nil {
				if d.mustRebuild {
					t.Fatalf("open after %s: %v", d.name, err)
				}
				if errors.Is(err, engine.ErrInvalidArgument) {
					t.Errorf("damaged index reported as a caller error: %v", err)
				}
				t.Logf("%s: Open refuses the store: %v (index files before: %v)", d.name, err, before)
				return
			}
			defer e.Close()
			hits := e.Lookup(idsOf(all))
			var present []int
			for i, h := range hits {
				if h {
					present = append(present, all[i])
				}
			}
			checkServed(t, e, present, d.name)
			if d.mustRebuild && len(present) != len(all) {
				t.Errorf("%s: rebuilt index has %d of %d blocks", d.name, len(present), len(all))
			}
			mustDump(t, e, span(100, 105))
			checkServed(t, e, span(100, 105), d.name+" new dumps")
			t.Logf("%s: Open succeeded, %d of %d blocks served byte-identical, recovery %+v", d.name, len(present), len(all), e.Recovery())
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func list(t *testing.T, fs vfs.FS, dir string) []string {
	t.Helper()
	names, err := fs.List(dir)
	must(t, err)
	sort.Strings(names)
	return names
}

func removeMatching(t *testing.T, fs vfs.FS, dir, sub string) {
	t.Helper()
	n := 0
	for _, name := range list(t, fs, dir) {
		if strings.Contains(name, sub) {
			must(t, fs.Remove(dir+"/"+name))
			n++
		}
	}
	if n == 0 {
		t.Skipf("no index file matches %q", sub)
	}
}

func newest(t *testing.T, fs vfs.FS, dir, sub string) string {
	t.Helper()
	var last string
	for _, name := range list(t, fs, dir) { // Pebble numbers files in creation order
		if strings.Contains(name, sub) {
			last = name
		}
	}
	if last == "" {
		t.Skipf("no index file matches %q (files: %v)", sub, list(t, fs, dir))
	}
	return dir + "/" + last
}

func removeNewest(t *testing.T, fs vfs.FS, dir, sub string) {
	must(t, fs.Remove(newest(t, fs, dir, sub)))
}

func truncateNewest(t *testing.T, fs vfs.FS, dir, sub string) {
	p := newest(t, fs, dir, sub)
	st, err := fs.Stat(p)
	must(t, err)
	f, err := fs.OpenReadWrite(p, vfs.WriteCategoryUnspecified)
	must(t, err)
	buf := make([]byte, st.Size()/2)
	_, _ = f.ReadAt(buf, 0)
	_ = f.Close()
	must(t, fs.Remove(p))
	g, err := fs.Create(p, vfs.WriteCategoryUnspecified)
	must(t, err)
	_, _ = g.Write(buf)
	_ = g.Sync()
	_ = g.Close()
}

// lockChild is the second process: it tries to open dir and prints the outcome.
func lockChild(dir string) {
	opts := fOptions(vfs.Default)
	e, err := engine.Open(dir, opts)
	switch {
	case errors.Is(err, engine.ErrLocked):
		fmt.Printf("LOCKED %v\n", err)
	case err != nil:
		fmt.Printf("ERROR %v\n", err)
	default:
		fmt.Printf("OPENED\n")
		_ = e.Close()
	}
}

// TestBadSecondOpener: a second engine in this process, and a second process, on the same
// store directory fail with ErrLocked while the first holds it, and succeed after it closed.
func TestBadSecondOpener(t *testing.T) {
	dir := t.TempDir()
	opts := fOptions(vfs.Default)
	e, err := engine.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	mustDump(t, e, span(0, 4))
	if e2, err := engine.Open(dir, opts); !errors.Is(err, engine.ErrLocked) {
		if e2 != nil {
			e2.Close()
		}
		t.Errorf("second Open in the same process: %v, want ErrLocked", err)
	}
	if out, err := runChild(t, "lock "+dir); err != nil || !strings.HasPrefix(out, "LOCKED") {
		t.Errorf("second process while the store is open: %v\n%s", err, out)
	}
	checkServed(t, e, span(0, 4), "after a refused second opener")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := runChild(t, "lock "+dir); err != nil || !strings.HasPrefix(out, "OPENED") {
		t.Errorf("second process after Close: %v\n%s", err, out)
	}
	e, err = engine.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	checkServed(t, e, span(0, 4), "reopen")
	_ = e.Close()
}

// TestBadCloseDuringTasks: Close while many dump and load tasks are in flight, some started
// before Close is called and more started by workers concurrently with it. Every task completes
// or fails with ErrClosed, none is still running once Close has returned (a task either entered
// before Close began and Close waited for it, or was refused), no panic, no goroutine left
// behind, and a reopen (also after a simulated power loss) serves every block whose dump
// succeeded.
func TestBadCloseDuringTasks(t *testing.T) {
	base := goroutineBaseline()
	var closedErrs, okDumps, okLoads, concurrentTasks int
	for round := 0; round < 6; round++ {
		mem := vfs.NewCrashableMem()
		opts := fOptions(alignChecked(mem))
		opts.SyncPolicy = engine.SyncPolicy(round % 2) // always, interval
		e, err := engine.Open(storeDir, opts)
		if err != nil {
			t.Fatal(err)
		}
		mustDump(t, e, span(0, 8))
		acked := span(0, 8)
		type dumpTask struct {
			ns   []int
			task *engine.Task
		}
		type loadTask struct {
			ns   []int
			dst  [][]byte
			task *engine.Task
		}
		var dumps []dumpTask
		var loads []loadTask
		// Rounds 0-2 start 32 tasks before Close and 8 workers; rounds 3-5 only 2 workers, so
		// that the engine's task count often drops to zero and a start races Close's wait for
		// the tasks from an empty engine.
		preStart, workers := 16, 8
		if round >= 3 {
			preStart, workers = 0, 2
		}
		for w := 0; w < preStart; w++ {
			ns := []int{1000 + 3*w, 1001 + 3*w, 1002 + 3*w}
			src := make([][]byte, len(ns))
			for i, n := range ns {
				src[i] = blockPayload(bid(n))
			}
			dumps = append(dumps, dumpTask{ns, e.Dump(idsOf(ns), src)})
			ls := []int{w % 8, (w + 3) % 8}
			dst := [][]byte{make([]byte, fLayout.BlockBytes()), make([]byte, fLayout.BlockBytes())}
			loads = append(loads, loadTask{ls, dst, e.Load(idsOf(ls), dst)})
		}
		// Workers keep starting a dump of a new block and a load of stored blocks, one task at a
		// time, until a start is refused with ErrClosed; Close is called once each has started.
		var wg, started sync.WaitGroup
		var mu sync.Mutex
		wg.Add(workers)
		started.Add(workers)
		for w := 0; w < workers; w++ {
			go func(w int) {
				defer wg.Done()
				first := true
				for k := 0; ; k++ {
					ns := []int{100000*(round+1) + 1000*w + k}
					ls := []int{(w + k) % 8, (w + k + 5) % 8}
					dst := [][]byte{make([]byte, fLayout.BlockBytes()), make([]byte, fLayout.BlockBytes())}
					dt := e.Dump(idsOf(ns), [][]byte{blockPayload(bid(ns[0]))})
					if first {
						started.Done()
						first = false
					}
					dErr := dt.Wait()
					lt := e.Load(idsOf(ls), dst)
					lErr := lt.Wait()
					mu.Lock()
					dumps = append(dumps, dumpTask{ns, dt})
					loads = append(loads, loadTask{ls, dst, lt})
					concurrentTasks += 2
					mu.Unlock()
					if errors.Is(dErr, engine.ErrClosed) || errors.Is(lErr, engine.ErrClosed) {
						return
					}
				}
			}(w)
		}
		started.Wait()
		// Rounds 0 and 1 close at once, among the first tasks; the later ones once the
		// workers have completed tasks (round 2: 4 pairs, 3-5: 8 per worker, one at a time, so
		// that their starts come from an empty engine, which is what a start racing Close's
		// wait for the tasks needs).
		doneSince := func() func() int {
			mu.Lock()
			at := concurrentTasks
			mu.Unlock()
			return func() int {
				mu.Lock()
				defer mu.Unlock()
				return (concurrentTasks - at) / 2
			}
		}()
		switch {
		case round >= 3:
			testwait.Until(t, "8 task pairs per worker on average", func() bool { return doneSince() >= 8*workers })
		case round > 1:
			testwait.Until(t, "4 task pairs", func() bool { return doneSince() >= 4 })
		}
		if err := e.Close(); err != nil {
			t.Errorf("Close during tasks: %v", err)
		}
		if err := e.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		wg.Wait()
		for _, d := range dumps {
			if done, _ := d.task.Check(); !done {
				t.Errorf("a dump task is still running after Close returned")
			}
			_ = d.task.Wait()
			for i, err := range d.task.BlockErrors() {
				switch {
				case err == nil:
					okDumps++
					acked = append(acked, d.ns[i])
				case errors.Is(err, engine.ErrClosed):
					closedErrs++
				default:
					t.Errorf("dump racing Close: %v", err)
				}
			}
		}
		for _, l := range loads {
			if done, _ := l.task.Check(); !done {
				t.Errorf("a load task is still running after Close returned")
			}
			_ = l.task.Wait()
			for i, err := range l.task.BlockErrors() {
				switch {
				case err == nil:
					okLoads++
					if !bytes.Equal(l.dst[i], blockPayload(bid(l.ns[i]))) {
						t.Errorf("load racing Close: WRONG BYTES")
					}
				case errors.Is(err, engine.ErrClosed):
					closedErrs++
				default:
					t.Errorf("load racing Close: %v", err)
				}
			}
		}
		// Everything after Close fails cleanly.
		if err := dumpNs(e, []int{1})[0]; !errors.Is(err, engine.ErrClosed) {
			t.Errorf("dump after Close: %v", err)
		}
		if _, errs := loadNs(e, []int{1}); !errors.Is(errs[0], engine.ErrClosed) {
			t.Errorf("load after Close: %v", errs[0])
		}
		if err := e.Sync(); !errors.Is(err, engine.ErrClosed) {
			t.Errorf("Sync after Close: %v", err)
		}
		if errs := e.Create(idsOf([]int{5000})); !errors.Is(errs[0], engine.ErrClosed) {
			t.Errorf("Create after Close: %v", errs[0])
		}
		if err := e.Commit(idsOf([]int{5000}), true); !errors.Is(err, engine.ErrClosed) {
			t.Errorf("Commit after Close: %v", err)
		}
		if e.Lookup(idsOf([]int{1}))[0] || e.LookupPrefix(idsOf([]int{1})) != 0 {
			t.Errorf("Lookup after Close reports a hit")
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Stats after Close panics: %v", r)
				}
			}()
			_ = e.Stats()
		}()
		reopenClone(t, mem, acked, fmt.Sprintf("round %d power loss after Close", round))
		e2, err := engine.Open(storeDir, fOptions(alignChecked(mem)))
		if err != nil {
			t.Fatal(err)
		}
		checkServed(t, e2, acked, fmt.Sprintf("round %d reopen", round))
		_ = e2.Close()
	}
	checkNoLeak(t, base, "close during tasks")
	t.Logf("close during tasks: 6 rounds, %d tasks started concurrently with Close, %d dump blocks and %d load blocks completed, %d failed with ErrClosed, 0 panics, no leaks",
		concurrentTasks, okDumps, okLoads, closedErrs)
}

// TestBadTaskStartDuringClose: tasks started while Close runs either complete or fail with
// ErrClosed, and starting them is race-free (run with -race): Engine.enter registers a task under
// a read lock that Close takes before it waits for the tasks (engine/engine.go), so no tasks.Add
// can overlap Close's tasks.Wait.
func TestBadTaskStartDuringClose(t *testing.T) {
	mem := vfs.NewCrashableMem()
	e, err := engine.Open(storeDir, fOptions(alignChecked(mem)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	var dumped atomic.Int64
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := 0; !stop.Load(); k++ {
				if err := dumpNs(e, []int{1000*(w+1) + k})[0]; err != nil {
					if !errors.Is(err, engine.ErrClosed) {
						t.Errorf("dump racing Close: %v", err)
					}
					return
				}
				dumped.Add(1)
			}
		}(w)
	}
	// Close once the workers have completed 16 dumps (each keeps dumping until refused).
	testwait.Until(t, "two dumps per worker", func() bool { return dumped.Load() >= 16 })
	if err := e.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	stop.Store(true)
	wg.Wait()
}
