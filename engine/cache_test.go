package engine

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// testCache is a kind of tiers.Cache for tests: a map of blocks that verifies what it loads, as
// every cache must, and records the calls the engine makes.
type testCache struct {
	name       string
	inclusive  bool
	shardBytes int

	mu      sync.Mutex
	blocks  map[BlockID]testCached
	asked   []BlockID // blocks Load was asked for, in order
	puts    []BlockID
	removed []BlockID
	onPut   func(BlockID) // if set, runs first in each Put
	hits    int64
	misses  int64
	corrupt int64
}

type testCached struct {
	data []byte
	crcs []uint32
}

func newTestCache(name string, inclusive bool, l Layout) *testCache {
	return &testCache{name: name, inclusive: inclusive, shardBytes: int(l.ShardBytes), blocks: map[BlockID]testCached{}}
}

func (c *testCache) Name() string     { return c.name }
func (c *testCache) Kind() tiers.Kind { return "test" }
func (c *testCache) Inclusive() bool  { return c.inclusive }
func (c *testCache) Close() error     { return nil }

func (c *testCache) Lookup(ids []BlockID, want []bool) []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]bool, len(ids))
	for i, id := range ids {
		if want == nil || want[i] {
			_, out[i] = c.blocks[id]
		}
	}
	return out
}

func (c *testCache) Load(ids []BlockID, shard int, want []bool, dst func(int) []byte, crcs [][]uint32) ([]bool, error) {
	hits := make([]bool, len(ids))
	var errs []error
	sb := c.shardBytes
	for i, id := range ids {
		if want != nil && !want[i] {
			continue
		}
		c.mu.Lock()
		c.asked = append(c.asked, id)
		b, ok := c.blocks[id]
		c.mu.Unlock()
		if !ok {
			c.count(&c.misses)
			continue
		}
		src, sums, first := b.data, b.crcs, 0
		if shard >= 0 {
			src, sums, first = b.data[shard*sb:(shard+1)*sb], b.crcs[shard:shard+1], shard
		}
		d := dst(i)
		if len(d) != len(src) {
			c.count(&c.misses)
			continue
		}
		copy(d, src)
		bad := -1
		for p, crc := range sums {
			if format.Checksum(d[p*sb:(p+1)*sb]) != crc {
				bad = first + p
				break
			}
		}
		if bad >= 0 {
			c.mu.Lock()
			delete(c.blocks, id)
			c.mu.Unlock()
			c.count(&c.corrupt)
			errs = append(errs, fmt.Errorf("test cache %s: block %s shard %d: %w", c.name, id, bad, format.ErrCorrupt))
			continue
		}
		c.count(&c.hits)
		hits[i] = true
		if crcs != nil && shard < 0 {
			crcs[i] = slices.Clone(b.crcs)
		}
	}
	return hits, errors.Join(errs...)
}

func (c *testCache) Put(id BlockID, data []byte, crcs []uint32) {
	if c.onPut != nil {
		c.onPut(id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.puts = append(c.puts, id)
	c.blocks[id] = testCached{data: bytes.Clone(data), crcs: slices.Clone(crcs)}
}

func (c *testCache) Remove(id BlockID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed = append(c.removed, id)
	delete(c.blocks, id)
}

func (c *testCache) Usage() tiers.CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return tiers.CacheStats{Blocks: int64(len(c.blocks)), Hits: c.hits, Misses: c.misses, Corrupt: c.corrupt}
}

func (c *testCache) count(n *int64) {
	c.mu.Lock()
	*n++
	c.mu.Unlock()
}

// has reports whether the cache holds block id with exactly its bytes and shard checksums.
func (c *testCache) has(l Layout, id BlockID) bool {
	c.mu.Lock()
	b, ok := c.blocks[id]
	c.mu.Unlock()
	return ok && bytes.Equal(b.data, blockBytes(l, id)) && slices.Equal(b.crcs, shardCRCs(l, b.data))
}

// reset forgets the calls recorded so far.
func (c *testCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked, c.puts, c.removed = nil, nil, nil
}

func (c *testCache) calls() (asked, puts, removed []BlockID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked), slices.Clone(c.puts), slices.Clone(c.removed)
}

func shardCRCs(l Layout, block []byte) []uint32 {
	crcs := make([]uint32, l.Shards)
	for s := range crcs {
		crcs[s] = format.Checksum(block[int64(s)*l.ShardBytes : int64(s+1)*l.ShardBytes])
	}
	return crcs
}

// TestCacheChainRoutes proves the engine routes over its chain of caches without knowing their
// kind: a dump is written through to every cache; a load asks the caches fastest first, each
// only for the blocks the faster ones missed, reads the rest from disk, and backfills (a cache
// hit into the faster caches, a disk hit into all, with the blocks' shard checksums); a cached
// block that fails its check is a miss served from below; lookups ask only the caches that are
// not inclusive; a block evicted from disk is removed from every cache; TierStats lists them.
func TestCacheChainRoutes(t *testing.T) {
	_, fs := memFS()
	l := mhaLayout
	e := mustOpen(t, "/store", testOptions(fs, l))
	defer e.Close()
	fast, slow := newTestCache("fast", true, l), newTestCache("slow", false, l)
	e.caches = []tiers.Cache{fast, slow} // before any task: the chain is fixed once Open returns
	a, b, x, y := blockID(1), blockID(2), blockID(3), blockID(4)

	dumpBlocks(t, e, []BlockID{a, b})
	for _, c := range []*testCache{fast, slow} {
		if !c.has(l, a) || !c.has(l, b) {
			t.Fatalf("%s: the dump was not written through", c.name)
		}
	}

	// a: in no cache (read from disk); b: only in slow; x: only in slow, not stored on disk at
	// all; y: only in fast, not on disk.
	fast.Remove(a)
	slow.Remove(a)
	fast.Remove(b)
	slow.Put(x, blockBytes(l, x), shardCRCs(l, blockBytes(l, x)))
	fast.Put(y, blockBytes(l, y), shardCRCs(l, blockBytes(l, y)))
	fast.reset()
	slow.reset()

	checkBlocks(t, e, []BlockID{a, b, x, y})
	fastAsked, fastPuts, _ := fast.calls()
	slowAsked, slowPuts, _ := slow.calls()
	if want := []BlockID{a, b, x, y}; !slices.Equal(fastAsked, want) {
		t.Errorf("fast was asked for %v, want %v (every block, in order)", fastAsked, want)
	}
	if want := []BlockID{a, b, x}; !slices.Equal(slowAsked, want) {
		t.Errorf("slow was asked for %v, want %v (the blocks fast missed)", slowAsked, want)
	}
	// Backfill: slow's hits into fast (while the chain is asked), then the disk hit into both.
	if want := []BlockID{b, x, a}; !slices.Equal(fastPuts, want) {
		t.Errorf("fast was backfilled with %v, want %v", fastPuts, want)
	}
	if want := []BlockID{a}; !slices.Equal(slowPuts, want) {
		t.Errorf("slow was backfilled with %v, want %v", slowPuts, want)
	}
	for _, id := range []BlockID{a, b, x} {
		if !fast.has(l, id) {
			t.Errorf("fast does not hold block %s with its bytes and checksums after the backfill", id)
		}
	}
	if !slow.has(l, a) {
		t.Error("slow does not hold the block read from disk")
	}

	// Fastest first: a block fast holds is not asked of slow.
	fast.reset()
	slow.reset()
	checkBlocks(t, e, []BlockID{x})
	if asked, _, _ := slow.calls(); len(asked) != 0 {
		t.Errorf("slow was asked for %v although fast holds them", asked)
	}

	// A cached block whose bytes changed is a miss: the next cache serves it, and backfills it.
	fast.mu.Lock()
	fast.blocks[x].data[100] ^= 1
	fast.mu.Unlock()
	checkBlocks(t, e, []BlockID{x})
	if !fast.has(l, x) || fast.Usage().Corrupt != 1 {
		t.Errorf("the corrupt copy in fast was not replaced (corrupt %d)", fast.Usage().Corrupt)
	}

	// Shards: served from the chain too, with no backfill (a shard is not a block).
	fast.Remove(x)
	fast.reset()
	shard := devio.AlignedBuffer(int(l.ShardBytes))
	if err := e.LoadShard([]BlockID{x}, 2, [][]byte{shard}).Wait(); err != nil {
		t.Fatalf("load shard: %v", err)
	}
	if !bytes.Equal(shard, blockBytes(l, x)[2*l.ShardBytes:3*l.ShardBytes]) {
		t.Error("shard 2 of x: wrong bytes")
	}
	if _, puts, _ := fast.calls(); len(puts) != 0 {
		t.Errorf("a shard load backfilled %v", puts)
	}

	// Lookups: the index, then the caches that are not inclusive (slow), never an inclusive one.
	if got := e.Lookup([]BlockID{a, x, y}); !got[0] || !got[1] || got[2] {
		t.Errorf("Lookup(a, x, y) = %v, want [true true false]", got)
	}
	if n := e.LookupPrefix([]BlockID{a, x, b, y}); n != 3 {
		t.Errorf("LookupPrefix(a, x, b, y) = %d, want 3", n)
	}
	if n := e.LookupPrefix([]BlockID{a, y, b}); n != 1 {
		t.Errorf("LookupPrefix(a, y, b) = %d, want 1", n)
	}

	// Eviction from disk removes the blocks from every cache.
	fast.reset()
	slow.reset()
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Evict("", 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*testCache{fast, slow} {
		_, _, removed := c.calls()
		slices.SortFunc(removed, func(p, q BlockID) int { return bytes.Compare(p[:], q[:]) })
		want := []BlockID{a, b}
		slices.SortFunc(want, func(p, q BlockID) int { return bytes.Compare(p[:], q[:]) })
		if !slices.Equal(removed, want) {
			t.Errorf("%s: evicting the disk tier removed %v, want %v", c.name, removed, want)
		}
	}

	st := e.TierStats()
	if len(st) < 3 || st[0].Name != "fast" || st[1].Name != "slow" || st[0].Kind != "test" || st[1].Corrupt != 0 || st[0].Corrupt != 1 {
		t.Errorf("TierStats: %+v", st)
	}
}

// TestCacheWriteThroughOrder: an inclusive cache gets a dumped block only once it is stored
// (the index answers for it); a shared cache (not inclusive) gets it beside the disk write, so
// a dump whose disk write fails leaves it, with its bytes, in the shared cache and not in the
// inclusive one, and the engine still serves it from there.
func TestCacheWriteThroughOrder(t *testing.T) {
	mem := vfs.NewCrashableMem()
	inj := &segInjector{kind: errorfs.OpFileWriteAt, err: syscall.ENOSPC}
	l := mhaLayout
	e := mustOpen(t, "/store", testOptions(errorfs.Wrap(mem, inj), l))
	defer e.Close()
	fast, shared := newTestCache("fast", true, l), newTestCache("shared", false, l)
	var early atomic.Int64 // inclusive puts of blocks the index did not hold yet
	fast.onPut = func(id BlockID) {
		if !e.Lookup([]BlockID{id})[0] {
			early.Add(1)
		}
	}
	e.caches = []tiers.Cache{fast, shared}

	ok := ids(0, 8)
	dumpBlocks(t, e, ok)
	for _, id := range ok {
		if !fast.has(l, id) || !shared.has(l, id) {
			t.Fatalf("block %s was not written through to both caches", id)
		}
	}
	if n := early.Load(); n != 0 {
		t.Fatalf("%d blocks reached the inclusive cache before they were stored", n)
	}

	inj.armed.Store(true)
	lost := blockID(50)
	if err := e.Dump([]BlockID{lost}, [][]byte{blockBytes(l, lost)}).Wait(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("dump on a full disk: %v, want ErrNoSpace", err)
	}
	inj.armed.Store(false)
	if fast.has(l, lost) {
		t.Error("the inclusive cache holds a block whose dump failed")
	}
	if !shared.has(l, lost) {
		t.Error("the shared cache did not get the block beside its (failed) disk write")
	}
	// The index does not hold it; the shared cache answers for it and serves it.
	if !e.Lookup([]BlockID{lost})[0] {
		t.Error("Lookup of a block the shared cache holds: false")
	}
	checkBlocks(t, e, []BlockID{lost})
	checkBlocks(t, e, ok)
}
