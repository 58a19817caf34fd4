package engine

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// tierSegment is the segment size of the tier tests: 7 records of mhaLayout (36 KiB each).
const tierSegment = 256 << 10

func tierOptions(fs vfs.FS, ts ...tiers.Config) Options {
	o := testOptions(fs, mhaLayout)
	o.SegmentSize = tierSegment
	o.Tiers = ts
	return o
}

func diskTierCfg(name string, capacity int64, paths ...string) tiers.Config {
	return tiers.Config{Name: name, Kind: tiers.KindDisk, Paths: paths, Capacity: capacity}
}

// segmentFileBytes sums the sizes of the segment files (and of recycled files kept for reuse)
// under dirs, as the file system sees them. A file renamed while a directory is listed can be
// listed under both names: files are counted once by inode where the file system has them.
func segmentFileBytes(t testing.TB, fs vfs.FS, dirs ...string) (total int64, files int) {
	t.Helper()
	seen := map[uint64]bool{}
	for _, d := range dirs {
		names, err := fs.List(d + "/" + SegmentDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			_, seg := wal.ParseSegmentFileName(n)
			_, recycled := wal.ParseRecycleFileName(n)
			if !seg && !recycled {
				continue
			}
			st, err := fs.Stat(d + "/" + SegmentDir + "/" + n)
			if err != nil {
				continue // retired between List and Stat
			}
			if sys, ok := st.Sys().(*syscall.Stat_t); ok {
				if seen[sys.Ino] {
					continue
				}
				seen[sys.Ino] = true
			}
			total += st.Size()
			files++
		}
	}
	return total, files
}

func loadOne(e *Engine, id BlockID) ([]byte, error) {
	buf := make([]byte, e.Layout().BlockBytes())
	err := e.Load([]BlockID{id}, [][]byte{buf}).Wait()
	return buf, err
}

// checkBlock fails the test unless id loads with exactly its payload.
func checkBlock(t testing.TB, e *Engine, id BlockID) {
	t.Helper()
	got, err := loadOne(e, id)
	if err != nil {
		t.Fatalf("load %s: %v", id, err)
	}
	if !bytes.Equal(got, blockBytes(e.Layout(), id)) {
		t.Fatalf("block %s: loaded bytes differ from what was dumped", id)
	}
}

// A tier never holds more than its capacity plus one segment, whatever the dump pattern: here
// sustained concurrent dumps of random blocks, 5× the capacity, checked both by the account and
// by the file system while the dumps run. Every block still indexed at the end loads intact.
// On a real file system retired segment files are recycled (and counted: they are on disk).
func TestTierCapacityNeverExceeded(t *testing.T) {
	t.Run("memfs", func(t *testing.T) {
		_, fs := memFS()
		testTierCapacityNeverExceeded(t, fs, "")
	})
	t.Run("os", func(t *testing.T) { testTierCapacityNeverExceeded(t, vfs.Default, t.TempDir()) })
}

func testTierCapacityNeverExceeded(t *testing.T, fs vfs.FS, root string) {
	const capacity = 2 << 20
	ssd1, ssd2 := root+"/ssd1", root+"/ssd2"
	cfg := diskTierCfg("ssd", capacity, ssd1, ssd2)
	// Headroom above the high watermark for two recycled 256 KiB segment files.
	cfg.HighWatermark, cfg.LowWatermark = 0.75, 0.6
	e := mustOpen(t, root+"/store", tierOptions(fs, cfg))
	defer e.Close()
	bound := int64(capacity) + e.reservation(e.tiers[0])

	var (
		wg   sync.WaitGroup
		stop atomic.Bool
		peak atomic.Int64
	)
	// placed records the paths that held a segment at some point: eviction may empty either
	// path later, so placement is observed while the dumps run, not only at the end.
	placed := map[string]bool{}
	watch := make(chan struct{})
	go func() {
		defer close(watch)
		for !stop.Load() {
			if u := e.TierStats()[0].Used; u > peak.Load() {
				peak.Store(u)
			}
			var n int64
			for _, d := range []string{ssd1, ssd2} {
				b, files := segmentFileBytes(t, fs, d)
				n += b
				placed[d] = placed[d] || files > 0
			}
			if n > bound {
				t.Errorf("segment files hold %d bytes, capacity %d + one segment = %d", n, capacity, bound)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	const blocks = 300 // × 36 KiB ≈ 5 × capacity
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < blocks/4; i++ {
				id := blockID(r.IntN(1 << 20))
				if err := e.Dump([]BlockID{id}, [][]byte{blockBytes(mhaLayout, id)}).Wait(); err != nil {
					t.Errorf("dump: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	<-watch
	st := e.TierStats()[0]
	if peak.Load() > bound || st.Used > bound {
		t.Fatalf("accounted bytes peaked at %d, now %d; bound %d", peak.Load(), st.Used, bound)
	}
	if st.Blocks == 0 || e.Stats().EvictedBlocks == 0 || e.Stats().SegmentsRetired == 0 {
		t.Fatalf("no eviction happened: %+v, %+v", st, e.Stats())
	}
	if recycled := e.Stats().SegmentsRecycled; (root != "") != (recycled > 0) {
		t.Fatalf("%d segments created in recycled files (real file system: %v)", recycled, root != "")
	}
	// Both paths were used, and every block still indexed loads intact.
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{ssd1, ssd2} {
		if !placed[d] {
			t.Fatalf("no segment placed in %s", d)
		}
	}
	checkAllIndexed(t, e)
}

// checkAllIndexed loads every indexed block and checks its bytes and the index's accounting.
func checkAllIndexed(t *testing.T, e *Engine) {
	t.Helper()
	var ids []BlockID
	if err := e.ix.Iterate(func(id BlockID, _ index.Location) bool { ids = append(ids, id); return true }); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		got, err := loadOne(e, id)
		if errors.Is(err, ErrNotFound) {
			// The background reclaimer may still be evicting (the tier can stay above its high
			// watermark after the last dump): a block evicted since the iteration is no longer
			// indexed. One that is still indexed must load.
			if _, ok, _ := e.ix.Get(id); !ok {
				continue
			}
		}
		if err != nil {
			t.Fatalf("load %s: %v", id, err)
		}
		if !bytes.Equal(got, blockBytes(e.Layout(), id)) {
			t.Fatalf("block %s: loaded bytes differ from what was dumped", id)
		}
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// Eviction takes whole segments, least recently used first, across all of a tier's paths: a
// segment's recency is the last write or load of any of its blocks. Segments loaded from
// survive older ones that were not, whatever path they are on; the untouched ones go in write
// order; a segment's blocks go together (the contract is per segment, not per block: a block
// written beside a loaded one survives with it).
func TestTierEvictsLeastRecentSegments(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 64<<20, "/p1", "/p2", "/p3")))
	defer e.Close()
	ids := make([]BlockID, 60)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids[:30])
	dumpBlocks(t, e, ids[30:])
	// Load the oldest ten: their segments become the most recent.
	for _, id := range ids[:10] {
		checkBlock(t, e, id)
	}
	segOf := map[BlockID]uint64{}
	touched := map[uint64]bool{}
	placed := map[string]bool{}
	for i, id := range ids {
		loc := location(t, e, id)
		segOf[id] = loc.Segment
		touched[loc.Segment] = touched[loc.Segment] || i < 10
		h, _ := e.home(loc.Segment)
		placed[h.dir] = true
	}
	if len(placed) != 3 {
		t.Fatalf("blocks placed in %d of 3 paths", len(placed))
	}
	// Keep room for about 25 blocks and the two active segments (dumps, relocations).
	rep, err := e.Evict("ssd", 25*mhaLayout.RecordBytes()+2*e.reservation(e.tiers[0]))
	if err != nil {
		t.Fatal(err)
	}
	hits := e.Lookup(ids)
	kept := map[uint64]bool{} // segment -> its blocks survived
	evicted := 0
	for i, id := range ids {
		n := segOf[id]
		if prev, ok := kept[n]; ok && prev != hits[i] {
			t.Fatalf("segment %d lost some of its blocks, not all: eviction is by segment", n)
		}
		kept[n] = hits[i]
		if !hits[i] {
			evicted++
		} else {
			checkBlock(t, e, id)
		}
	}
	if evicted < 20 || evicted > 40 {
		t.Fatalf("evicted %d blocks, want 20 to 40 (hits %v)", evicted, hits)
	}
	for n, k := range kept {
		if touched[n] && !k {
			t.Fatalf("segment %d, loaded from last, was evicted", n)
		}
		// The untouched ones go in write order: one dump writer fills them in number order.
		for m, km := range kept {
			if !touched[n] && !touched[m] && k && !km && m > n {
				t.Fatalf("segment %d evicted while older segment %d, as little used, was kept: not LRU", m, n)
			}
		}
	}
	if rep.BlocksEvicted != evicted || rep.SegmentsRetired == 0 {
		t.Fatalf("report %+v, %d blocks evicted", rep, evicted)
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// A prompt's prefix stays usable: a connector loads the hit prefix of a chain whole, and a load
// stamps parents at least as recent as their children, so eviction by segment takes the
// chain's leaves before its root. A chain never loaded since it was written goes in write
// order, its parents first: the children left behind are harmless (a prefix lookup stops at the
// first missing block; they still load intact) and age out in their turn.
func TestTierChainAwareEviction(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 64<<20, "/ssd")))
	defer e.Close()
	chain := make([]BlockID, 21) // three segments of 7 records
	for i := range chain {
		chain[i] = blockID(1000 + i)
	}
	for i := range chain {
		dumpBlocks(t, e, chain[i:i+1]) // root first, as prompts grow
	}
	dumpBlocks(t, e, ids(2000, 2007)) // rotate: the chain's segments are sealed
	if n := e.LookupPrefix(chain); n != len(chain) {
		t.Fatalf("prefix %d", n)
	}
	checkBlocks(t, e, chain) // the connector loads the hit prefix
	for round := 0; round < 3; round++ {
		used := e.TierStats()[0].Used
		if _, err := e.Evict("ssd", used-7*mhaLayout.RecordBytes()); err != nil {
			t.Fatal(err)
		}
		n := e.LookupPrefix(chain)
		hits := e.Lookup(chain)
		if got := countTrue(hits); got != n {
			t.Fatalf("round %d: %d blocks stored but the prefix is %d: a parent went before its child (%v)", round, got, n, hits)
		}
	}

	// Never loaded: write order decides, the root's segment is the oldest.
	fresh := ids(3000, 3014)
	dumpBlocks(t, e, fresh[:7])
	dumpBlocks(t, e, fresh[7:])
	dumpBlocks(t, e, ids(4000, 4007)) // rotate
	root := location(t, e, fresh[0]).Segment
	for round := 0; e.Lookup(fresh[:1])[0]; round++ {
		if round == 20 {
			t.Fatal("the root's segment was never evicted")
		}
		// Just below the files' bytes: one segment goes (Used counts active segments at their
		// reservation, Evict's target their files).
		if _, err := e.Evict("ssd", e.rc.tierFileBytes(e.tiers[0])-mhaLayout.RecordBytes()); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.LookupPrefix(fresh); n != 0 {
		t.Fatalf("prefix %d after the root's segment %d went", n, root)
	}
	left := 0
	for i, hit := range e.Lookup(fresh) {
		if hit {
			left++
			checkBlock(t, e, fresh[i]) // a child left behind: stored, intact, unreachable by prefix
		}
	}
	if left == 0 {
		t.Fatal("the root's segment went with all of its children's: write order not kept")
	}
}

func countTrue(b []bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}

// A segment pinned by an in-flight load is never chosen for eviction: it survives whole, with
// every block in it (eviction is by segment), while everything else goes.
func TestTierPinnedSegmentSkipped(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 64<<20, "/ssd")))
	defer e.Close()
	ids := make([]BlockID, 30)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	rec := e.tiers[0].Recency()
	// Two sealed segments: seals complete in the background, and which blocks land where
	// depends on how the concurrent dumps were placed.
	var pinned []uint64
	waitFor(t, "two sealed segments", func() bool {
		pinned = pinned[:0]
		for _, id := range ids {
			n := location(t, e, id).Segment
			if m, ok := e.ix.Segment(n); ok && m.State == index.SegmentSealed && !slices.Contains(pinned, n) && len(pinned) < 2 {
				pinned = append(pinned, n)
			}
		}
		return len(pinned) == 2
	})
	for _, n := range pinned {
		rec.Pin(n)
	}
	segOf := map[BlockID]uint64{}
	for _, id := range ids {
		segOf[id] = location(t, e, id).Segment
	}
	rep, err := e.Evict("ssd", 0)
	if err != nil {
		t.Fatal(err)
	}
	hits := e.Lookup(ids)
	if rep.BlocksEvicted != len(ids)-countTrue(hits) {
		t.Fatalf("report %+v, %d blocks left", rep, countTrue(hits))
	}
	for i, id := range ids {
		if want := slices.Contains(pinned, segOf[id]); hits[i] != want {
			t.Fatalf("after evicting everything: block %d stored %v, want %v (pinned segments %v)", i, hits[i], want, pinned)
		}
		if hits[i] {
			checkBlock(t, e, id)
		}
	}
	// Unpinned, they go like the others.
	for _, n := range pinned {
		rec.Unpin(n, 0, 0)
	}
	if _, err := e.Evict("ssd", 0); err != nil {
		t.Fatal(err)
	}
	if got := countTrue(e.Lookup(ids)); got != 0 {
		t.Fatalf("%d blocks left after the pins were released", got)
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// Blocks evicted from the first disk tier demote to the second, intact; a hit there promotes
// the block back up (asynchronously), intact.
func TestTierDemotionAndPromotion(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 1<<20, "/ssd"), diskTierCfg("nfs", 0, "/nfs")))
	defer e.Close()
	ids := make([]BlockID, 80) // 2.9 MiB into a 1 MiB first tier
	for i := range ids {
		ids[i] = blockID(i)
		dumpBlocks(t, e, ids[i:i+1])
	}
	waitFor(t, "the first tier to get under its high watermark", func() bool {
		return !e.tiers[0].Space().OverHigh()
	})
	st := e.TierStats()
	if st[1].Blocks == 0 || e.Stats().EvictedBlocks == 0 {
		t.Fatalf("nothing demoted: %+v", st)
	}
	if hits := e.Lookup(ids); countTrue(hits) != len(ids) {
		t.Fatalf("demotion lost blocks: %d of %d stored", countTrue(hits), len(ids))
	}
	var low BlockID
	for _, id := range ids {
		loc, _, _ := e.ix.Get(id)
		if e.tierOf(loc.Segment).Pos() == 1 {
			low = id
			break
		}
	}
	checkBlock(t, e, low) // served from the second tier, queued for promotion
	// The entry moves inside the promotion; the counter is bumped when it returns.
	waitFor(t, "the promotion", func() bool {
		loc, _, _ := e.ix.Get(low)
		return e.tierOf(loc.Segment).Pos() == 0 && e.Stats().Promotions > 0
	})
	checkBlock(t, e, low)
	checkAllIndexed(t, e)
}

// waitFor is the repository's one wait-until helper (internal/testwait), under the name the
// engine's tests use.
var waitFor = testwait.Until

// countingFS counts reads of segment files.
type countingFS struct {
	vfs.FS
	reads atomic.Int64
}

type countingFile struct {
	vfs.File
	fs *countingFS
}

func (c *countingFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := c.FS.Open(name, opts...)
	if err != nil || !strings.HasSuffix(name, wal.SegmentExt) {
		return f, err
	}
	return countingFile{f, c}, nil
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.reads.Add(1)
	return f.File.ReadAt(p, off)
}

// Memory-tier hits never touch disk: blocks dumped (write-through) or loaded once (backfill)
// are served from memory, whole or shard by shard, with no segment read.
func TestMemoryTierHitsNeverTouchDisk(t *testing.T) {
	_, inner := memFS()
	fs := &countingFS{FS: inner}
	mem := tiers.Config{Name: "dram", Kind: tiers.KindMemory, Capacity: 40 * mhaLayout.BlockBytes()}
	o := tierOptions(fs, mem, diskTierCfg("ssd", 0, "/ssd"))
	o.DirectIO = 2 // off: the counting wrapper sees every read
	e := mustOpen(t, "/store", o)
	ids := make([]BlockID, 30)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	fs.reads.Store(0)
	for _, id := range ids {
		checkBlock(t, e, id)
		shard := make([]byte, mhaLayout.ShardBytes)
		if err := e.LoadShard([]BlockID{id}, 2, [][]byte{shard}).Wait(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(shard, blockBytes(mhaLayout, id)[2*mhaLayout.ShardBytes:3*mhaLayout.ShardBytes]) {
			t.Fatalf("shard 2 of %s differs", id)
		}
	}
	if n := fs.reads.Load(); n != 0 {
		t.Fatalf("%d segment reads for blocks in the memory tier", n)
	}
	if got := e.Stats().MemoryHits; got != 60 {
		t.Fatalf("memory hits %d, want 60", got)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// After a restart the memory tier is empty: the first load reads the disk and backfills,
	// the second does not.
	e = mustOpen(t, "/store", o)
	defer e.Close()
	fs.reads.Store(0)
	checkBlock(t, e, ids[3])
	if fs.reads.Load() == 0 {
		t.Fatalf("a cold load read nothing from disk")
	}
	fs.reads.Store(0)
	checkBlock(t, e, ids[3])
	if n := fs.reads.Load(); n != 0 {
		t.Fatalf("backfilled block read %d times from disk", n)
	}
}

// Compaction reclaims dead space and keeps every live block byte-identical while loads and
// dumps run (race detector).
func TestCompactionUnderConcurrentLoadsAndDumps(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/a", "/b")))
	defer e.Close()
	ids := make([]BlockID, 140) // 20 segments
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	// Kill three of every four blocks: mostly-dead segments.
	var live []BlockID
	b := e.ix.NewBatch()
	for i, id := range ids {
		if i%4 != 0 {
			b.Delete(id)
		} else {
			live = append(live, id)
		}
	}
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	before := e.TierStats()[0]
	var (
		wg   sync.WaitGroup
		stop atomic.Bool
	)
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for !stop.Load() {
				id := live[r.IntN(len(live))]
				got, err := loadOne(e, id)
				if err != nil {
					t.Errorf("load during compaction: %v", err)
					return
				}
				if !bytes.Equal(got, blockBytes(mhaLayout, id)) {
					t.Errorf("block %s differs during compaction", id)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load() && i < 40; i++ {
			dumpBlocks(t, e, []BlockID{blockID(10000 + i)})
		}
	}()
	rep, err := e.Compact(0.5, nil)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	after := e.TierStats()[0]
	if rep.SegmentsCompacted == 0 || rep.BytesReclaimed <= 0 || after.DeadBytes >= before.DeadBytes {
		t.Fatalf("compaction %+v: dead bytes %d → %d", rep, before.DeadBytes, after.DeadBytes)
	}
	for _, id := range live {
		checkBlock(t, e, id)
	}
	checkAllIndexed(t, e)
	// Reopen: accounting and blocks survive.
	closing := e.TierStats()[0]
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/a", "/b")))
	defer e.Close()
	for _, id := range live {
		checkBlock(t, e, id)
	}
	if got := e.TierStats()[0]; got.LiveBytes != closing.LiveBytes || got.Blocks != closing.Blocks || got.Used != got.FileBytes {
		t.Fatalf("after reopen %+v, before %+v", got, closing)
	}
}

// Tier configuration errors are reported at Open, naming the tier.
func TestTierConfigErrors(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/shared")))
	// A second store cannot use a path the first one holds.
	_, err := Open("/other", tierOptions(fs, diskTierCfg("ssd", 0, "/shared")))
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "/shared") {
		t.Fatalf("second store on a held tier path: %v", err)
	}
	e.Close()
	for name, ts := range map[string][]tiers.Config{
		"io engine": {{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/x"}, IOEngine: "spdk"}},
		"direct":    {{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/x"}, DirectIO: "maybe"}},
		"capacity":  {{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/x"}, Capacity: tierSegment}},
		"no disk":   {{Name: "dram", Kind: tiers.KindMemory, Capacity: 1 << 20}},
	} {
		if _, err := Open("/s-"+name, tierOptions(fs, ts...)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The recorded tier configuration names the store directory itself relatively: a store moved
// (or copied) elsewhere and opened by a tool finds its segments where it now is, and those on
// its other paths where they are.
func TestStoredTiersFollowAMovedStore(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/store", "/ssd2")))
	ids := make([]BlockID, 40)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename("/store", "/moved"); err != nil {
		t.Fatal(err)
	}
	r := mustOpen(t, "/moved", Options{FS: fs, ReadOnly: true, AdoptStoredSchema: true})
	defer r.Close()
	if got, want := r.SegmentDirs(), []string{"/moved/" + SegmentDir, "/ssd2/" + SegmentDir}; !slices.Equal(got, want) {
		t.Fatalf("segment dirs %v, want %v", got, want)
	}
	rows := r.Index().Segments()
	for _, row := range rows {
		if _, ok := r.SegmentPath(row.Number); !ok {
			t.Fatalf("segment %d not found", row.Number)
		}
	}
	checkBlocks(t, r, ids)
	if st := r.TierStats()[0]; st.Used != st.FileBytes || st.Blocks != int64(len(ids)) {
		t.Fatalf("read-only tier stats %+v: want Used = FileBytes and %d blocks", st, len(ids))
	}
}

// Online compaction reclaims dead space in an unlimited tier without being asked, keeping
// every live block intact.
func TestOnlineCompaction(t *testing.T) {
	_, fs := memFS()
	o := tierOptions(fs, diskTierCfg("ssd", 0, "/ssd"))
	o.CompactInterval = 20 * time.Millisecond
	e := mustOpen(t, "/store", o)
	defer e.Close()
	ids := make([]BlockID, 70)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	b := e.ix.NewBatch()
	for i, id := range ids {
		if i%3 != 0 {
			b.Delete(id)
		}
	}
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	dead := e.TierStats()[0].DeadBytes
	waitFor(t, "online compaction", func() bool { return e.Stats().SegmentsRetired > 0 && e.TierStats()[0].DeadBytes < dead/2 })
	for i, id := range ids {
		if i%3 == 0 {
			checkBlock(t, e, id)
		}
	}
}

// I/O failures while relocating (demotion into a failing tier, compaction whose writes fail)
// reach the caller as typed errors and lose nothing: every block stays where it was, loadable,
// and the same operations succeed once the file system recovers.
func TestReclamationIOFailuresLoseNothing(t *testing.T) {
	mem, _ := memFS()
	inj := &segInjector{kind: errorfs.OpFileWriteAt, err: syscall.EIO}
	fs := errorfs.Wrap(mem, inj)
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 64<<20, "/ssd"), diskTierCfg("cold", 0, "/cold")))
	defer e.Close()
	ids := make([]BlockID, 40)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	inj.armed.Store(true)
	if _, err := e.Evict("ssd", 0); !errors.Is(err, ErrIO) {
		t.Fatalf("evict into a failing tier: %v, want ErrIO", err)
	}
	if _, err := e.Compact(0.99, nil); err != nil && !errors.Is(err, ErrIO) {
		t.Fatalf("compact on a failing file system: %v", err)
	}
	if inj.hits.Load() == 0 {
		t.Fatalf("no write failed: the test did not test anything")
	}
	inj.armed.Store(false)
	for _, id := range ids {
		checkBlock(t, e, id)
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	rep, err := e.Evict("ssd", 0)
	if err != nil || rep.BlocksDemoted != len(ids) {
		t.Fatalf("evict after recovery: %+v, %v", rep, err)
	}
	if st := e.TierStats(); st[1].Blocks != int64(len(ids)) || st[0].Blocks != 0 {
		t.Fatalf("after demotion: %+v", st)
	}
	for _, id := range ids {
		checkBlock(t, e, id) // from the second tier (each hit queues a promotion)
	}
}

// A tier path dropped from the configuration while it holds blocks is refused at Open, naming
// the path, instead of turning its blocks into misses; once its tier is evicted to 0 bytes the
// path can go.
func TestDroppedTierPathRefused(t *testing.T) {
	_, fs := memFS()
	// The ssd tier holds every block: promotions never push it over its watermark, so no
	// background demotion can refill cold after it is evicted to 0 below.
	both := tierOptions(fs, diskTierCfg("ssd", 64<<20, "/ssd"), diskTierCfg("cold", 0, "/cold"))
	e := mustOpen(t, "/store", both)
	ids := make([]BlockID, 30)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	if _, err := e.Evict("ssd", 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	one := tierOptions(fs, diskTierCfg("ssd", 64<<20, "/ssd"))
	if _, err := Open("/store", one); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "/cold") {
		t.Fatalf("open without the tier holding blocks: %v", err)
	}
	e = mustOpen(t, "/store", both)
	for _, id := range ids {
		checkBlock(t, e, id) // nothing was forgotten by the refused Open
	}
	waitFor(t, "promotions to settle", func() bool { return len(e.promote) == 0 })
	if _, err := e.Evict("cold", 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, "/store", one)
	defer e.Close()
	if e.Recovery().EntriesDropped != 0 {
		t.Fatalf("dropping the emptied path dropped entries: %+v", e.Recovery())
	}
}

// A load that read a block's entry just before compaction moved the block and retired its
// segment follows the entry to the new place instead of reporting a miss (TestOnlineCompaction
// hit this window about once in fifty runs).
func TestLoadFollowsBlockMovedByCompaction(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 0, "/ssd")))
	defer e.Close()
	ids := make([]BlockID, 30)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	keep, gone := ids[0], ids[1]
	stale, ok, err := e.ix.Get(keep)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	staleGone, _, _ := e.ix.Get(gone)
	// Leave keep alone in its segment, then compact: it moves and the segment is retired.
	b := e.ix.NewBatch()
	for _, id := range ids[1:] {
		if loc, _, _ := e.ix.Get(id); loc.Segment == stale.Segment {
			b.Delete(id)
		}
	}
	if err := e.ix.Apply(b, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Compact(0.99, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.acquireSegment(stale.Segment); !errors.Is(err, wal.ErrSegmentGone) {
		t.Fatalf("segment %d not retired by compaction: %v", stale.Segment, err)
	}
	seg, loc, _, err := e.acquireLatest(keep, stale)
	if err != nil {
		t.Fatalf("acquireLatest with the entry from before the move: %v", err)
	}
	seg.Release()
	if loc.Segment == stale.Segment {
		t.Fatalf("followed entry still in segment %d", loc.Segment)
	}
	checkBlock(t, e, keep)
	// A block deleted meanwhile has nothing to follow: the segment is gone, a miss.
	if staleGone.Segment != stale.Segment {
		t.Fatalf("setup: blocks 0 and 1 in segments %d and %d, want one", stale.Segment, staleGone.Segment)
	}
	if _, _, _, err := e.acquireLatest(gone, staleGone); !errors.Is(err, wal.ErrSegmentGone) {
		t.Fatalf("acquireLatest of a deleted block: %v, want ErrSegmentGone", err)
	}
}

// recycledFiles lists the recycled segment files kept under dirs.
func recycledFiles(t *testing.T, fs vfs.FS, dirs ...string) []string {
	t.Helper()
	var out []string
	for _, d := range dirs {
		names, err := fs.List(d + "/" + SegmentDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if _, ok := wal.ParseRecycleFileName(n); ok {
				out = append(out, d+"/"+SegmentDir+"/"+n)
			}
		}
	}
	return out
}

// Retired segment files are kept for reuse up to Options.RecycleSegments per directory, found
// again by Open and reused by the next segments; a recycled file renamed for a segment that
// never wrote its header (a crash between the rename and the first write) is removed by
// recovery, not adopted or quarantined; RecycleSegments -1 keeps none.
func TestRecycledFilesAcrossReopen(t *testing.T) {
	root := t.TempDir()
	fs, ssd := vfs.Default, root+"/ssd"
	cfg := diskTierCfg("ssd", 2<<20, ssd)
	cfg.HighWatermark, cfg.LowWatermark = 0.75, 0.6 // headroom for two recycled files
	opts := tierOptions(fs, cfg)
	fill := func(e *Engine, from int) {
		for i := from; i < from+150; i++ { // ≈ 2.5 × the capacity
			dumpBlocks(t, e, []BlockID{blockID(i)})
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	e := mustOpen(t, root+"/store", opts)
	fill(e, 0)
	if e.Stats().SegmentsRecycled == 0 {
		t.Fatalf("no segment reused a recycled file: %+v", e.Stats())
	}
	// Retire a few more segments with nothing left to reuse their files before Close.
	if _, err := e.Evict("ssd", 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	kept := recycledFiles(t, fs, ssd)
	var keptBytes int64
	for _, p := range kept {
		st, err := fs.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		keptBytes += st.Size()
	}
	if headroom := int64(2<<20) / 4; len(kept) == 0 || keptBytes > headroom {
		t.Fatalf("%d recycled files of %d bytes kept, want at least one, within the %d bytes above the high watermark", len(kept), keptBytes, headroom)
	}
	// A read-only Open accounts them and leaves them alone.
	ro := opts
	ro.ReadOnly = true
	e = mustOpen(t, root+"/store", ro)
	if st := e.TierStats()[0]; st.Recycled != keptBytes || st.Used < keptBytes {
		t.Fatalf("read-only tier stats %+v: want %d recycled bytes within used", st, keptBytes)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(recycledFiles(t, fs, ssd)); n != len(kept) {
		t.Fatalf("read-only Open changed the recycled files: %d, was %d", n, len(kept))
	}

	// A crash right after a reuse's rename: an unregistered segment file with a retired
	// segment's header (a copy, so that the kept files are still there to be reused).
	stale := wal.SegmentPath(ssd+"/"+SegmentDir, 9999)
	b, err := os.ReadFile(kept[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, b, 0o644); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, root+"/store", opts)
	r := e.Recovery()
	if r.OrphansRemoved != 1 || len(r.QuarantinedSegments) != 0 || r.SegmentsAdopted != 0 {
		t.Fatalf("recovery %+v: want the stale-header file removed as an orphan", r)
	}
	if _, err := fs.Stat(stale); !oserror.IsNotExist(err) {
		t.Fatalf("stale-header file still there: %v", err)
	}
	// The files found at Open are reused by the next segments.
	dumpBlocks(t, e, []BlockID{blockID(1000)})
	if e.Stats().SegmentsRecycled == 0 {
		t.Fatalf("no segment reused a file found at Open: %+v", e.Stats())
	}
	fill(e, 2000)
	checkAllIndexed(t, e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	opts.RecycleSegments = -1
	e = mustOpen(t, root+"/store", opts)
	if n := len(recycledFiles(t, fs, ssd)); n != 0 {
		t.Fatalf("RecycleSegments -1: %d recycled files left after Open", n)
	}
	fill(e, 4000)
	if st := e.Stats(); st.SegmentsRecycled != 0 || st.SegmentsRetired == 0 || len(recycledFiles(t, fs, ssd)) != 0 {
		t.Fatalf("RecycleSegments -1: %+v, %d recycled files", st, len(recycledFiles(t, fs, ssd)))
	}
	checkAllIndexed(t, e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// memoryTierBytes returns the bytes the memory tier caches for id, reached through reflection:
// what a stray write into the process's memory would change.
func memoryTierBytes(t *testing.T, e *Engine, id BlockID) []byte {
	t.Helper()
	entries := reflect.ValueOf(e.mem).Elem().FieldByName("entries")
	key := reflect.New(entries.Type().Key()).Elem() // the block's key: its id, kind 0
	*(*BlockID)(unsafe.Pointer(key.FieldByName("id").UnsafeAddr())) = id
	entry := entries.MapIndex(key)
	if !entry.IsValid() {
		t.Fatalf("block %s is not in the memory tier", id)
	}
	data := entry.Elem().FieldByName("data")
	return *(*[]byte)(unsafe.Pointer(data.UnsafeAddr()))
}

// TestMemoryTierHitsAreVerified: bytes changed in the memory tier are never served: the load
// notices the checksum mismatch, reads the block from disk, and the memory tier counts it.
func TestMemoryTierHitsAreVerified(t *testing.T) {
	_, fs := memFS()
	mem := tiers.Config{Name: "dram", Kind: tiers.KindMemory, Capacity: 8 * mhaLayout.BlockBytes()}
	e := mustOpen(t, "/store", tierOptions(fs, mem, diskTierCfg("ssd", 0, "/ssd")))
	defer e.Close()
	ids := []BlockID{blockID(1), blockID(2)}
	dumpBlocks(t, e, ids)
	memoryTierBytes(t, e, ids[0])[mhaLayout.ShardBytes+17] ^= 0x01 // shard 1
	memoryTierBytes(t, e, ids[1])[3*mhaLayout.ShardBytes] ^= 0x80  // shard 3
	checkBlock(t, e, ids[0])
	shard := make([]byte, mhaLayout.ShardBytes)
	if err := e.LoadShard([]BlockID{ids[1]}, 3, [][]byte{shard}).Wait(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shard, blockBytes(mhaLayout, ids[1])[3*mhaLayout.ShardBytes:4*mhaLayout.ShardBytes]) {
		t.Fatal("shard 3 of a block corrupt in memory was served wrong")
	}
	st := e.TierStats()[0]
	if st.Corrupt != 2 || st.Hits != 0 {
		t.Fatalf("memory tier: %d corrupt, %d hits; want 2 and 0", st.Corrupt, st.Hits)
	}
	// The whole-block load backfilled the first block from disk: now a good hit.
	checkBlock(t, e, ids[0])
	if st := e.TierStats()[0]; st.Hits != 1 {
		t.Fatalf("memory tier hits after the backfill: %d, want 1", st.Hits)
	}
}

// TestDeferralCountsPasses: eviction waits for a shared tier's share for n sharing passes and n
// intervals, whichever ends later (a loaded machine or a slow file system stretches passes past
// their interval, and a grant comes only from a pass), and never past its cap.
func TestDeferralCountsPasses(t *testing.T) {
	const n, interval, cap = 4, 10 * time.Millisecond, time.Second
	var d deferral
	if d.over(100, n, interval, cap) {
		t.Fatal("over as the wait began")
	}
	d.since = time.Now().Add(-10 * interval) // ten intervals ago, and no pass since
	for p := int64(100); p <= 100+n; p++ {
		if d.over(p, n, interval, cap) {
			t.Fatalf("over after %d passes started", p-100)
		}
	}
	if !d.over(100+n+1, n, interval, cap) {
		t.Fatalf("not over after %d passes and ten intervals", n+1)
	}
	d.since = time.Now() // passes kicked faster than the interval: the intervals still count
	if d.over(100+10*n, n, interval, cap) {
		t.Fatal("over before n intervals")
	}
	d.since = time.Now().Add(-cap) // passes stalled: the cap ends the wait
	if !d.over(100, n, interval, cap) {
		t.Fatal("not over at the cap")
	}
	d.reset()
	if d.over(100+10*n, n, interval, cap) || d.since.IsZero() {
		t.Fatal("after reset, the next call does not start a new wait")
	}
}

// A block served by the memory tier is a use of the block: its disk segment stays as recent as
// a disk load would leave it, so eviction takes an untouched newer segment first.
func TestTierMemoryHitKeepsSegmentRecent(t *testing.T) {
	_, fs := memFS()
	mem := tiers.Config{Name: "dram", Kind: tiers.KindMemory, Capacity: 64 * mhaLayout.BlockBytes()}
	e := mustOpen(t, "/store", tierOptions(fs, mem, diskTierCfg("ssd", 64<<20, "/ssd")))
	defer e.Close()
	blocks := ids(0, 24)
	for _, id := range blocks {
		dumpBlocks(t, e, []BlockID{id}) // written through to the memory tier
	}
	oldest := location(t, e, blocks[0]).Segment
	waitFor(t, "the oldest segment sealed", func() bool {
		m, ok := e.ix.Segment(oldest)
		return ok && m.State == index.SegmentSealed
	})
	hits := e.Stats().MemoryHits
	checkBlock(t, e, blocks[0])
	if e.Stats().MemoryHits != hits+1 {
		t.Fatal("the load was not served by the memory tier")
	}
	// The touch is applied in the background: wait until the oldest segment orders after the
	// one written next.
	next := location(t, e, blocks[len(blocks)-1]).Segment
	waitFor(t, "the memory hit's touch", func() bool {
		return slices.Equal(e.tiers[0].Recency().Order([]uint64{oldest, next}), []uint64{next, oldest})
	})
	// One segment's worth: the least recently used segment goes.
	if _, err := e.Evict("ssd", e.rc.tierFileBytes(e.tiers[0])-mhaLayout.RecordBytes()); err != nil {
		t.Fatal(err)
	}
	if !e.ix.Contains(blocks[0]) {
		t.Fatalf("segment %d, whose block the memory tier served last, was evicted first", oldest)
	}
	if got := countTrue(e.Lookup(blocks)); got == len(blocks) {
		t.Fatal("nothing evicted")
	}
}

// A block loaded since its segment was written is kept when eviction takes the segment: it is
// rewritten forward, into the newest segment, and the cold blocks written beside it go (a
// second chance; tiers.Recency's loaded slots; that a block kept must be loaded again to be kept
// again is TestRecencyLoadedSlots'). Emptying the tier keeps nothing.
func TestTierEvictionKeepsLoadedBlocks(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", tierOptions(fs, diskTierCfg("ssd", 64<<20, "/ssd")))
	defer e.Close()
	blocks := ids(0, 24)
	for _, id := range blocks {
		dumpBlocks(t, e, []BlockID{id})
	}
	old := location(t, e, blocks[0]).Segment
	waitFor(t, "the oldest segment sealed", func() bool {
		m, ok := e.ix.Segment(old)
		return ok && m.State == index.SegmentSealed
	})
	var oldBlocks, others []BlockID
	for _, id := range blocks {
		if location(t, e, id).Segment == old {
			oldBlocks = append(oldBlocks, id)
		} else {
			others = append(others, id)
		}
	}
	hot := oldBlocks[1]
	checkBlock(t, e, hot)
	checkBlocks(t, e, others) // every other segment more recent: the old one goes first
	evictOne := func() {
		t.Helper()
		if _, err := e.Evict("ssd", e.rc.tierFileBytes(e.tiers[0])-mhaLayout.RecordBytes()); err != nil {
			t.Fatal(err)
		}
	}
	evictOne()
	for _, id := range oldBlocks {
		if stored := e.ix.Contains(id); stored != (id == hot) {
			t.Fatalf("block %s of the evicted segment stored %v (the loaded one is %s)", id, stored, hot)
		}
	}
	if n := location(t, e, hot).Segment; n == old {
		t.Fatalf("the loaded block is still in segment %d", old)
	}
	checkBlock(t, e, hot) // intact where it went; and loaded again
	if e.Stats().EvictedBlocks != int64(len(oldBlocks)-1) {
		t.Fatalf("%d blocks evicted, want %d", e.Stats().EvictedBlocks, len(oldBlocks)-1)
	}
	if _, err := e.Evict("ssd", 0); err != nil {
		t.Fatal(err)
	}
	if e.ix.Contains(hot) {
		t.Fatal("emptying the tier kept a loaded block")
	}
}
