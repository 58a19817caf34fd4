package engine

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/mooncakefake"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/tiers"
)

func mooncakeTierConfig() tiers.Config {
	return tiers.Config{Name: "pool", Kind: tiers.KindMooncake, Mooncake: &tiers.MooncakeConfig{
		MetadataServer: "http://127.0.0.1:1/metadata", MasterServerAddress: "127.0.0.1:2",
		StagingBytes: 4 << 20, HealthIntervalMs: 5}}
}

// Without the mooncake build tag, a configuration naming a mooncake tier fails at Open with a
// typed error that says so, and touches nothing.
func TestMooncakeTierNotBuilt(t *testing.T) {
	if tiers.MooncakeBuilt {
		t.Skip("built with -tags mooncake")
	}
	dir := t.TempDir()
	opts := testOptions(nil, mhaLayout)
	opts.FS = nil
	opts.Tiers = []tiers.Config{mooncakeTierConfig(), {Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}}}
	_, err := Open(dir, opts)
	if !errors.Is(err, ErrMooncakeNotBuilt) || !errors.Is(err, tiers.ErrMooncakeNotBuilt) {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "built without Mooncake support") || !strings.Contains(err.Error(), `"pool"`) {
		t.Fatalf("message: %v", err)
	}
	// The store is not locked afterwards: it opens without the mooncake tier.
	opts.Tiers = opts.Tiers[1:]
	mustOpen(t, dir, opts).Close()
}

// withFakeMooncake makes Open use pools of st (the test restores the seams).
func withFakeMooncake(t *testing.T, st *mooncakefake.Store) {
	built, open := mooncakeBuilt, openMooncakePool
	mooncakeBuilt = true
	openMooncakePool = func(tiers.MooncakeConfig) (tiers.MooncakePool, error) { return mooncakefake.New(st), nil }
	t.Cleanup(func() { mooncakeBuilt, openMooncakePool = built, open })
}

func openMooncakeEngine(t *testing.T, memory bool) *Engine {
	t.Helper()
	dir := t.TempDir()
	opts := testOptions(nil, mhaLayout)
	opts.FS = nil
	opts.SyncPolicy = SyncNone
	opts.Tiers = []tiers.Config{mooncakeTierConfig(), {Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}}}
	if memory {
		opts.Tiers = append([]tiers.Config{{Name: "dram", Kind: tiers.KindMemory, Capacity: 1 << 20}}, opts.Tiers...)
	}
	e := mustOpen(t, dir, opts)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func mcLoadOne(e *Engine, id BlockID) ([]byte, error) {
	dst := make([]byte, e.Layout().BlockBytes())
	return dst, e.Load([]BlockID{id}, [][]byte{dst}).Wait()
}

// Two engines share one pool: what one dumps, the other finds and loads; bytes from the pool
// that are not the block are never returned; a pool that goes down is skipped (the engine
// serves from its disk) and rejoins.
func TestMooncakeTierSharedPool(t *testing.T) {
	st := mooncakefake.NewStore()
	withFakeMooncake(t, st)
	a := openMooncakeEngine(t, false)
	b := openMooncakeEngine(t, true)
	ids := []BlockID{blockID(1), blockID(2), blockID(3)}
	dumpBlocks(t, a, ids)
	a.FlushMooncake()
	if s, _ := a.MooncakeStats(); s.Puts != 3 {
		t.Fatalf("write-through: %+v", s)
	}
	// B has none of them on its disk; it finds them in the pool.
	for i, hit := range b.Lookup(ids) {
		if !hit {
			t.Fatalf("B: Lookup misses block %d", i)
		}
	}
	if n := b.LookupPrefix(append(ids, blockID(99))); n != 3 {
		t.Fatalf("B: LookupPrefix %d, want 3", n)
	}
	for _, id := range ids {
		got, err := mcLoadOne(b, id)
		if err != nil || !bytes.Equal(got, blockBytes(mhaLayout, id)) {
			t.Fatalf("B: load %s: %v", id, err)
		}
	}
	// ... and single shards.
	sh := make([]byte, mhaLayout.ShardBytes)
	if err := b.LoadShard([]BlockID{ids[0]}, 2, [][]byte{sh}).Wait(); err != nil || !bytes.Equal(sh, blockBytes(mhaLayout, ids[0])[2*mhaLayout.ShardBytes:3*mhaLayout.ShardBytes]) {
		t.Fatalf("B: load shard: %v", err)
	}
	if s, _ := b.MooncakeStats(); s.Hits != 3 {
		t.Fatalf("B: pool hits %+v (the shard came from B's memory tier, backfilled)", s)
	}
	// A loads from the pool before its disk.
	if _, err := mcLoadOne(a, ids[0]); err != nil {
		t.Fatal(err)
	}
	if s, _ := a.MooncakeStats(); s.Hits != 1 {
		t.Fatalf("A: pool hits %+v", s)
	}

	// Prefetch reads a block only the pool holds into B's memory tier: the next load is a
	// memory hit.
	dumpBlocks(t, a, []BlockID{blockID(8)})
	a.FlushMooncake()
	if err := b.Prefetch([]BlockID{blockID(8)}).Wait(); err != nil {
		t.Fatalf("B: prefetch: %v", err)
	}
	memHits, poolHits := b.Stats().MemoryHits, must(b.MooncakeStats()).Hits
	if got, err := mcLoadOne(b, blockID(8)); err != nil || !bytes.Equal(got, blockBytes(mhaLayout, blockID(8))) {
		t.Fatalf("B: load after prefetch: %v", err)
	}
	if b.Stats().MemoryHits != memHits+1 || must(b.MooncakeStats()).Hits != poolHits {
		t.Fatal("B: the prefetched block was not served from memory")
	}

	// A stale object (another block's) under a block's key: B misses (it has no other copy),
	// A loads from its disk and writes the block back to the pool (a promotion).
	stale := blockID(7)
	dumpBlocks(t, a, []BlockID{stale})
	a.FlushMooncake()
	k1, k2 := mooncakeKey(a, stale), mooncakeKey(a, ids[2])
	other, ok := st.Object(k2)
	if !ok {
		t.Fatalf("no object under %s", k2)
	}
	st.Set(k1, other)
	if _, err := mcLoadOne(b, stale); !errors.Is(err, ErrNotFound) {
		t.Fatalf("B: stale object: got %v, want ErrNotFound", err)
	}
	if s, _ := b.MooncakeStats(); s.Rejected != 1 {
		t.Fatalf("B: rejected %+v", s)
	}
	st.Delete(k1) // evicted: A's load misses the pool, reads its disk and puts the block back
	if got, err := mcLoadOne(a, stale); err != nil || !bytes.Equal(got, blockBytes(mhaLayout, stale)) {
		t.Fatalf("A: load after the stale object went: %v", err)
	}
	a.FlushMooncake()
	if got, err := mcLoadOne(b, stale); err != nil || !bytes.Equal(got, blockBytes(mhaLayout, stale)) {
		t.Fatalf("B: load after A's promotion: %v", err)
	}

	// The master goes down: A serves every block from its disk and keeps dumping; B misses
	// what only the pool had, and serves its own blocks.
	dumpBlocks(t, b, []BlockID{blockID(50)})
	b.FlushMooncake()
	st.SetDown(true)
	for _, id := range ids {
		if got, err := mcLoadOne(a, id); err != nil || !bytes.Equal(got, blockBytes(mhaLayout, id)) {
			t.Fatalf("A (pool down): load %s: %v", id, err)
		}
	}
	dumpBlocks(t, a, []BlockID{blockID(4)})
	if got, err := mcLoadOne(b, blockID(50)); err != nil || !bytes.Equal(got, blockBytes(mhaLayout, blockID(50))) {
		t.Fatalf("B (pool down): own block: %v", err)
	}
	if _, err := mcLoadOne(b, ids[2]); err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatalf("B (pool down): pool-only block: %v", err)
	}
	sa, _ := a.MooncakeStats()
	if sa.Up || sa.Downs != 1 || sa.Skipped == 0 {
		t.Fatalf("A (pool down): %+v", sa)
	}
	st.SetDown(false)
	waitFor(t, "A to rejoin", func() bool { s, _ := a.MooncakeStats(); return s.Up })
	if s, _ := a.MooncakeStats(); s.Rejoins != 1 {
		t.Fatalf("A: %+v", s)
	}
	dumpBlocks(t, a, []BlockID{blockID(5)})
	a.FlushMooncake()
	waitFor(t, "B to rejoin", func() bool { s, _ := b.MooncakeStats(); return s.Up })
	if got, err := mcLoadOne(b, blockID(5)); err != nil || !bytes.Equal(got, blockBytes(mhaLayout, blockID(5))) {
		t.Fatalf("B after rejoin: %v", err)
	}
	ts := a.TierStats()
	if ts[0].Kind != tiers.KindMooncake || ts[0].Name != "pool" || ts[1].Kind != tiers.KindDisk {
		t.Fatalf("TierStats: %+v", ts)
	}
}

func mooncakeKey(e *Engine, id BlockID) string {
	return "ucm/" + hexPrefix(e.fingerprint) + "/" + id.String()
}

func hexPrefix(fp format.Fingerprint) string {
	const digits = "0123456789abcdef"
	var b strings.Builder
	for _, c := range fp[:8] {
		b.WriteByte(digits[c>>4])
		b.WriteByte(digits[c&15])
	}
	return b.String()
}

// Sidecars are not stored in the pool and keep working with a mooncake tier in the chain.
func TestMooncakeTierKeepsSidecars(t *testing.T) {
	st := mooncakefake.NewStore()
	withFakeMooncake(t, st)
	e := openMooncakeEngine(t, true)
	ids := []BlockID{blockID(1), blockID(2)}
	dumpBlocks(t, e, ids)
	src := [][]byte{bytes.Repeat([]byte{1}, 256), bytes.Repeat([]byte{2}, 256)}
	if err := e.DumpSidecars(1, 2, ids, src).Wait(); err != nil {
		t.Fatal(err)
	}
	e.FlushMooncake()
	if n := len(st.Keys()); n != 2 {
		t.Fatalf("%d objects in the pool, want the 2 blocks only", n)
	}
	dst := make([]byte, 2*128)
	found, err := e.LoadSidecars(1, 1, ids, dst)
	if err != nil || !found[0] || !found[1] || !bytes.Equal(dst[:128], src[0][128:]) || !bytes.Equal(dst[128:], src[1][128:]) {
		t.Fatalf("sidecars: %v %v", found, err)
	}
}

// A master that is down at Open does not fail Open: the tier starts down and joins later.
func TestMooncakeTierDownAtOpen(t *testing.T) {
	st := mooncakefake.NewStore()
	st.SetDown(true)
	withFakeMooncake(t, st)
	e := openMooncakeEngine(t, false)
	if s, _ := e.MooncakeStats(); s.Up {
		t.Fatal("up with the master down")
	}
	dumpBlocks(t, e, []BlockID{blockID(1)})
	if _, err := mcLoadOne(e, blockID(1)); err != nil {
		t.Fatal(err)
	}
	st.SetDown(false)
	waitFor(t, "the tier to join", func() bool { s, _ := e.MooncakeStats(); return s.Up })
}

func must(s tiers.MooncakeStats, ok bool) tiers.MooncakeStats {
	if !ok {
		panic("no mooncake tier")
	}
	return s
}

// batchRecorder is a cache that records how the engine puts blocks into it.
type batchRecorder struct {
	tiers.Cache
	mu      sync.Mutex
	puts    int
	batches [][]BlockID
}

func (r *batchRecorder) Put(id BlockID, data []byte, crcs []uint32) {
	r.mu.Lock()
	r.puts++
	r.mu.Unlock()
	r.Cache.Put(id, data, crcs)
}

func (r *batchRecorder) PutBatch(ids []BlockID, data [][]byte, crcs [][]uint32) {
	r.mu.Lock()
	r.batches = append(r.batches, append([]BlockID(nil), ids...))
	r.mu.Unlock()
	for i := range ids {
		r.Cache.Put(ids[i], data[i], crcs[i])
	}
}

// A dump's blocks reach a cache that takes batches (the mooncake tier) together, in PutBatch
// calls, not one Put per block, so its writer puts them in one batch.
func TestMooncakeWriteThroughInBatches(t *testing.T) {
	st := mooncakefake.NewStore()
	withFakeMooncake(t, st)
	e := openMooncakeEngine(t, false)
	rec := &batchRecorder{Cache: e.caches[0]}
	e.caches[0] = rec
	ids := []BlockID{blockID(1), blockID(2), blockID(3), blockID(4)}
	dumpBlocks(t, e, ids)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n, most := 0, 0
	for _, b := range rec.batches {
		n, most = n+len(b), max(most, len(b))
	}
	if rec.puts != 0 || n != len(ids) || most < 2 {
		t.Fatalf("write-through: %d single puts, batches %v; want the %d blocks in batches", rec.puts, rec.batches, len(ids))
	}
	e.caches[0] = rec.Cache // MooncakeStats finds the tier among the caches
	e.FlushMooncake()
	if s, _ := e.MooncakeStats(); s.Puts != uint64(len(ids)) {
		t.Fatalf("after flush: %+v", s)
	}
}

// shardSpans is the bytes of blocks ids (blockBytes), each block's shards named apart as
// DumpSpans takes them, as a connector names its K and V tensors.
func shardSpans(l Layout, ids []BlockID) [][][]byte {
	src := make([][][]byte, len(ids))
	for i, id := range ids {
		b := blockBytes(l, id)
		for sh := int64(0); sh < int64(l.Shards); sh++ {
			src[i] = append(src[i], b[sh*l.ShardBytes:(sh+1)*l.ShardBytes])
		}
	}
	return src
}

// A whole block the dump copies in (its shards named apart, as a connector names its K and V
// tensors) is copied once: into a payload the pool tier lends, which the disk write and the
// put both read from. Every lent payload goes back (many more blocks than the tier has put
// slots are all put that way), and what was put loads intact in another instance. A block
// stored compressed is not put from a loan.
func TestMooncakeWriteThroughFromLentPayloads(t *testing.T) {
	st := mooncakefake.NewStore()
	withFakeMooncake(t, st)
	a := openMooncakeEngine(t, false)
	l := a.Layout()
	const n, batch = 240, 8 // the tier's 4 MiB of staging hold 56 put slots of these blocks
	var ids []BlockID
	for k := 0; k < n; k += batch {
		part := make([]BlockID, batch)
		for i := range part {
			part[i] = blockID(5000 + k + i)
		}
		if err := a.DumpSpans(part, AllShards, shardSpans(l, part)).Wait(); err != nil {
			t.Fatal(err)
		}
		a.FlushMooncake()
		ids = append(ids, part...)
	}
	if s := must(a.MooncakeStats()); s.Puts != n || s.PutsLent != n || s.PutsDropped != 0 {
		t.Fatalf("write-throughs: %+v, want all %d put from lent payloads", s, n)
	}
	checkBlocks(t, a, ids)
	b := openMooncakeEngine(t, false) // an empty disk: every load is from the pool
	for _, id := range ids {
		got, err := mcLoadOne(b, id)
		if err != nil || !bytes.Equal(got, blockBytes(l, id)) {
			t.Fatalf("block %v from the pool: %v", id, err)
		}
	}

	dir := t.TempDir()
	opts := testOptions(nil, mhaLayout)
	opts.FS, opts.SyncPolicy = nil, SyncNone
	opts.Tiers = []tiers.Config{mooncakeTierConfig(), {Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}, Compression: "lz4"}}
	c := mustOpen(t, dir, opts)
	defer c.Close()
	id := blockID(6000)
	b0 := blockBytes(l, id)
	if err := c.DumpSpans([]BlockID{id}, AllShards, [][][]byte{{b0[:l.ShardBytes], b0[l.ShardBytes:]}}).Wait(); err != nil {
		t.Fatal(err)
	}
	c.FlushMooncake()
	if s := must(c.MooncakeStats()); s.PutsLent != 0 {
		t.Fatalf("a compressing tier's dump was put from a loan: %+v", s)
	}
	checkBlocks(t, c, []BlockID{id})
}

// Dumps from several goroutines borrow payloads while the pool goes down and comes back (the
// tier goes down, lent blocks' puts fail or are dropped): every dump succeeds and loads
// intact, and no loan is lost (once the pool is back, a sequence of dumps four times the
// tier's put slots is put from loans block for block).
func TestMooncakeLentPayloadsUnderFailures(t *testing.T) {
	st := mooncakefake.NewStore()
	withFakeMooncake(t, st)
	e := openMooncakeEngine(t, false)
	l := e.Layout()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		all []BlockID
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := 0; k < 20; k++ {
				ids := []BlockID{blockID(7000 + w*100 + 2*k), blockID(7000 + w*100 + 2*k + 1)}
				if err := e.DumpSpans(ids, AllShards, shardSpans(l, ids)).Wait(); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, ids...)
				mu.Unlock()
			}
		}(w)
	}
	for i := 0; i < 6; i++ { // the pool goes down and up while the dumps run
		st.SetDown(i%2 == 0)
		time.Sleep(3 * time.Millisecond)
	}
	st.SetDown(false)
	wg.Wait()
	e.FlushMooncake()
	checkBlocks(t, e, all)
	testwait.Until(t, "the tier to rejoin", func() bool { return must(e.MooncakeStats()).Up })
	before := must(e.MooncakeStats())
	const n = 224 // four times the 56 put slots of the tier's staging
	for k := 0; k < n; k += 8 {
		ids := make([]BlockID, 8)
		for i := range ids {
			ids[i] = blockID(9000 + k + i)
		}
		if err := e.DumpSpans(ids, AllShards, shardSpans(l, ids)).Wait(); err != nil {
			t.Fatal(err)
		}
		e.FlushMooncake()
	}
	if s := must(e.MooncakeStats()); s.PutsLent-before.PutsLent != n || s.PutsDropped != before.PutsDropped {
		t.Fatalf("after the failures: %d of %d blocks put from loans (before %+v, after %+v)", s.PutsLent-before.PutsLent, n, before, s)
	}
}
