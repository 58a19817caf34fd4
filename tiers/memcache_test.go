package tiers

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ucm-go/ucm/format"
)

func bid(n int) ID {
	var id ID
	id[0], id[1], id[15] = byte(n), byte(n>>8), 0xAB
	return id
}

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// putParts caches data in parts equal parts with their checksums.
func putParts(c *MemCache, id ID, data []byte, parts int) {
	crcs := make([]uint32, parts)
	unit := len(data) / parts
	for p := range crcs {
		crcs[p] = format.Checksum(data[p*unit : (p+1)*unit])
	}
	c.Put(id, data, crcs)
}

// put caches data in one-byte parts: any range of it can be read.
func put(c *MemCache, id ID, data []byte) { putParts(c, id, data, max(len(data), 1)) }

// putShards caches data as 32 shards, as the engine caches a block.
func putShards(c *MemCache, id ID, data []byte) { putParts(c, id, data, 32) }

// get is Get for data that cannot be corrupt: a checksum failure is a bug.
func get(c *MemCache, id ID, off int64, dst []byte) bool {
	ok, err := c.Get(id, off, dst)
	if err != nil {
		panic(err)
	}
	return ok
}

func TestMemCacheLRUOrder(t *testing.T) {
	c := NewMemCache("dram", 300)
	put(c, bid(1), fill(100, 1))
	put(c, bid(2), fill(100, 2))
	put(c, bid(3), fill(100, 3))
	// Touch 1: now 2 is least recent.
	if !get(c, bid(1), 0, make([]byte, 1)) {
		t.Fatal("miss on 1")
	}
	// Contains must not refresh 2.
	if !c.Contains(bid(2)) {
		t.Fatal("2 not contained")
	}
	put(c, bid(4), fill(100, 4))
	if c.Contains(bid(2)) {
		t.Error("2 (least recent) survived the eviction")
	}
	for _, n := range []int{1, 3, 4} {
		if !c.Contains(bid(n)) {
			t.Errorf("%d was evicted", n)
		}
	}
	// A block needing two slots evicts the two least recent, 3 then 4, once 1 is read again.
	get(c, bid(1), 0, nil)
	put(c, bid(5), fill(200, 5))
	if c.Contains(bid(3)) || c.Contains(bid(4)) || !c.Contains(bid(1)) || !c.Contains(bid(5)) {
		t.Errorf("after a 200-byte put: 1=%v 3=%v 4=%v 5=%v, want 1 and 5 only",
			c.Contains(bid(1)), c.Contains(bid(3)), c.Contains(bid(4)), c.Contains(bid(5)))
	}
	s := c.Stats()
	if s.Bytes != 300 || s.Blocks != 2 || s.Evictions != 3 || s.Inserts != 5 || s.Capacity != 300 {
		t.Errorf("stats %+v", s)
	}
}

func TestMemCacheGetCopiesAndPartialReads(t *testing.T) {
	c := NewMemCache("dram", 1<<20)
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i * 7)
	}
	put(c, bid(1), src)
	orig := append([]byte(nil), src...)
	for i := range src { // the caller reuses its buffer right after Put
		src[i] = 0xFF
	}
	dst := make([]byte, 4096)
	if !get(c, bid(1), 0, dst) || !bytes.Equal(dst, orig) {
		t.Fatal("whole-block Get did not return the bytes as they were at Put")
	}
	part := make([]byte, 100)
	if !get(c, bid(1), 1000, part) || !bytes.Equal(part, orig[1000:1100]) {
		t.Error("partial Get returned wrong bytes")
	}
	tail := make([]byte, 96)
	if !get(c, bid(1), 4000, tail) || !bytes.Equal(tail, orig[4000:]) {
		t.Error("Get of the last bytes returned wrong bytes")
	}
	if !get(c, bid(1), 4096, nil) {
		t.Error("empty Get at the end of the block missed")
	}
	// Out of range: dst must stay untouched.
	for _, tc := range []struct {
		off int64
		n   int
	}{{4000, 97}, {4097, 0}, {-1, 10}, {0, 4097}, {1 << 62, 1}} {
		dst := fill(tc.n, 0x5A)
		if get(c, bid(1), tc.off, dst) {
			t.Errorf("Get(off=%d, len=%d) of a 4096-byte block hit", tc.off, tc.n)
		}
		if !bytes.Equal(dst, fill(tc.n, 0x5A)) {
			t.Errorf("Get(off=%d, len=%d) wrote into dst on a miss", tc.off, tc.n)
		}
	}
	if get(c, bid(2), 0, make([]byte, 1)) {
		t.Error("Get of an absent block hit")
	}
	s := c.Stats()
	if s.Hits != 4 || s.Misses != 6 {
		t.Errorf("hits %d misses %d, want 4 and 6", s.Hits, s.Misses)
	}
}

func TestMemCacheOutOfRangeGetKeepsRecency(t *testing.T) {
	c := NewMemCache("dram", 200)
	put(c, bid(1), fill(100, 1))
	put(c, bid(2), fill(100, 2))
	get(c, bid(1), 50, make([]byte, 51)) // out of range: 1 stays least recent
	put(c, bid(3), fill(100, 3))
	if c.Contains(bid(1)) || !c.Contains(bid(2)) {
		t.Error("an out-of-range Get refreshed the block")
	}
}

func TestMemCacheOversizeBlock(t *testing.T) {
	c := NewMemCache("dram", 1000)
	put(c, bid(1), fill(600, 1))
	put(c, bid(2), fill(1001, 2))
	if c.Contains(bid(2)) {
		t.Error("a block larger than the capacity was cached")
	}
	if !c.Contains(bid(1)) {
		t.Error("an oversize Put evicted another block")
	}
	// An oversize re-Put must not leave the old version readable.
	put(c, bid(1), fill(2000, 9))
	if c.Contains(bid(1)) {
		t.Error("an oversize re-Put left the old version cached")
	}
	put(c, bid(3), fill(1000, 3)) // exactly the capacity fits
	if !c.Contains(bid(3)) {
		t.Error("a block of exactly the capacity was not cached")
	}
	if s := c.Stats(); s.Bytes != 1000 || s.Blocks != 1 || s.Inserts != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestMemCacheReplaceAndRemove(t *testing.T) {
	c := NewMemCache("dram", 1000)
	put(c, bid(1), fill(100, 1))
	put(c, bid(1), fill(300, 7))
	dst := make([]byte, 300)
	if !get(c, bid(1), 0, dst) || !bytes.Equal(dst, fill(300, 7)) {
		t.Error("re-Put did not replace the block")
	}
	if s := c.Stats(); s.Bytes != 300 || s.Blocks != 1 {
		t.Errorf("after re-Put: %+v, want 300 bytes in 1 block", s)
	}
	c.Remove(bid(1))
	c.Remove(bid(1)) // idempotent
	if get(c, bid(1), 0, dst[:1]) || c.Contains(bid(1)) {
		t.Error("Get after Remove hit")
	}
	if s := c.Stats(); s.Bytes != 0 || s.Blocks != 0 || s.Evictions != 0 {
		t.Errorf("after Remove: %+v", s)
	}
}

// A reader holding an entry that is evicted or replaced under it still copies one whole,
// consistent version.
func TestMemCacheConcurrentInvariants(t *testing.T) {
	const capacity = 64 << 10
	c := NewMemCache("dram", capacity)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var violations atomic.Int64
	wg.Add(1)
	go func() { // checker: the cap holds at every observed instant
		defer wg.Done()
		for !stop.Load() {
			s := c.Stats()
			if s.Bytes > s.Capacity || s.Bytes < 0 {
				violations.Add(1)
				t.Errorf("Stats: %d bytes cached, capacity %d", s.Bytes, s.Capacity)
				return
			}
		}
	}()
	const workers = 8
	var ops sync.WaitGroup
	for w := range workers {
		ops.Add(1)
		go func() {
			defer ops.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			buf := make([]byte, 20<<10)
			for range 4000 {
				n := r.IntN(64)
				id := bid(n)
				switch op := r.IntN(10); {
				case op < 4: // every version of block n is filled with byte n, whatever its size
					size := r.IntN(20 << 10)
					if r.IntN(50) == 0 {
						size = capacity + 1
					}
					data := fill(size, byte(n))
					put(c, id, data)
					clear(data) // reuse the caller's buffer at once
				case op < 9:
					size := r.IntN(len(buf))
					dst := buf[:size]
					clear(dst)
					if get(c, id, 0, dst) {
						for i, b := range dst {
							if b != byte(n) {
								t.Errorf("Get of block %d: byte %d is %d", n, i, b)
								return
							}
						}
					}
				default:
					c.Remove(id)
				}
			}
		}()
	}
	ops.Wait()
	stop.Store(true)
	wg.Wait()
	s := c.Stats()
	if s.Bytes > capacity {
		t.Errorf("final stats over capacity: %+v", s)
	}
	// The accounting matches the content.
	var sum int64
	blocks := 0
	for n := range 64 {
		if c.Contains(bid(n)) {
			blocks++
			lo, hi := int64(0), int64(capacity)
			for lo < hi { // largest readable length = the block's size
				mid := (lo + hi + 1) / 2
				if get(c, bid(n), mid-1, make([]byte, 1)) {
					lo = mid
				} else {
					hi = mid - 1
				}
			}
			sum += lo
		}
	}
	if blocks != s.Blocks || sum != s.Bytes {
		t.Errorf("content: %d blocks, %d bytes; stats say %d blocks, %d bytes", blocks, sum, s.Blocks, s.Bytes)
	}
	if s.Inserts == 0 || s.Hits == 0 || s.Evictions == 0 {
		t.Errorf("the workload did not exercise the cache: %+v", s)
	}
}

const block2MiB = 2 << 20

// BenchmarkMemCacheGet2MiB and BenchmarkMemcpy2MiB measure the same copy with and without the
// cache in front: their MB/s ratio is the cache's overhead over a plain copy.
func BenchmarkMemCacheGet2MiB(b *testing.B) {
	c := NewMemCache("dram", 64*block2MiB)
	for i := range 64 {
		putShards(c, bid(i), fill(block2MiB, byte(i)))
	}
	dst := make([]byte, block2MiB)
	b.SetBytes(block2MiB)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if !get(c, bid(i%64), 0, dst) {
			b.Fatal("miss")
		}
	}
}

func BenchmarkMemcpy2MiB(b *testing.B) {
	srcs := make([][]byte, 64)
	for i := range srcs {
		srcs[i] = fill(block2MiB, byte(i))
	}
	dst := make([]byte, block2MiB)
	b.SetBytes(block2MiB)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		copy(dst, srcs[i%64])
	}
}

// BenchmarkMemcpy2MiBRotating is BenchmarkMemcpy2MiB into 65 destinations in turn: a copy into
// memory no cache and no TLB entry holds, as a Put into the buffer of the block it just evicted
// is (BenchmarkMemCachePutTurnover's baseline).
func BenchmarkMemcpy2MiBRotating(b *testing.B) {
	srcs := make([][]byte, 64)
	dsts := make([][]byte, 65)
	for i := range srcs {
		srcs[i] = fill(block2MiB, byte(i))
	}
	for i := range dsts {
		dsts[i] = fill(block2MiB, byte(i))
	}
	b.SetBytes(block2MiB)
	for i := 0; b.Loop(); i++ {
		copy(dsts[i%len(dsts)], srcs[i%len(srcs)])
	}
}

// Parallel readers: the copy runs outside the lock, so throughput should scale with cores.
func BenchmarkMemCacheGet2MiBParallel(b *testing.B) {
	c := NewMemCache("dram", 64*block2MiB)
	for i := range 64 {
		putShards(c, bid(i), fill(block2MiB, byte(i)))
	}
	b.SetBytes(block2MiB)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]byte, block2MiB)
		i := 0
		for pb.Next() {
			get(c, bid(i%64), 0, dst)
			i++
		}
	})
}

func BenchmarkMemcpy2MiBParallel(b *testing.B) {
	srcs := make([][]byte, 64)
	for i := range srcs {
		srcs[i] = fill(block2MiB, byte(i))
	}
	b.SetBytes(block2MiB)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]byte, block2MiB)
		i := 0
		for pb.Next() {
			copy(dst, srcs[i%64])
			i++
		}
	})
}

// TestMemCacheVerifiesChecksums: a cached block whose bytes changed in memory is never
// returned as a hit: Get reports ErrCorrupt naming the block and the part, drops the block and
// counts it; parts not copied are not judged; ranges that are not whole parts miss.
func TestMemCacheVerifiesChecksums(t *testing.T) {
	c := NewMemCache("dram", 1<<20)
	data := make([]byte, 32*1024)
	for i := range data {
		data[i] = byte(i * 7)
	}
	putParts(c, bid(1), data, 32)
	dst := make([]byte, len(data))
	if ok, err := c.Get(bid(1), 0, dst); !ok || err != nil || !bytes.Equal(dst, data) {
		t.Fatalf("intact block: %v, %v", ok, err)
	}
	if ok, err := c.Get(bid(1), 512, make([]byte, 1024)); ok || err != nil {
		t.Errorf("a range not of whole parts: %v, %v; want a plain miss", ok, err)
	}
	c.entries[memKey{bid(1), 0}].data[5*1024+3] ^= 0x10 // a bit flips in part 5
	if ok, err := c.Get(bid(1), 6*1024, make([]byte, 2*1024)); !ok || err != nil {
		t.Errorf("parts 6-7, intact: %v, %v", ok, err)
	}
	ok, err := c.Get(bid(1), 4*1024, make([]byte, 2*1024))
	if ok || !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), bid(1).String()) || !strings.Contains(err.Error(), "part 5") {
		t.Fatalf("corrupt part 5: %v, %v; want a miss with ErrCorrupt naming the block and part 5", ok, err)
	}
	if c.Contains(bid(1)) {
		t.Error("the corrupt block is still cached")
	}
	if ok, err := c.Get(bid(1), 0, dst); ok || err != nil {
		t.Errorf("after the drop: %v, %v; want a plain miss", ok, err)
	}
	st := c.Stats()
	if st.Corrupt != 1 || st.Hits != 2 || st.Blocks != 0 || st.Bytes != 0 {
		t.Errorf("stats %+v: want 1 corrupt, 2 hits, nothing cached", st)
	}
	// Data that does not split into the parts given is not cached.
	c.Put(bid(2), make([]byte, 100), make([]uint32, 3))
	c.Put(bid(3), make([]byte, 100), nil)
	if c.Contains(bid(2)) || c.Contains(bid(3)) {
		t.Error("cached a block whose checksums do not match its parts")
	}
}

// TestMemCacheSidecars: sidecars are cached beside blocks under their own key, share the
// capacity, are checked part by part, and go with their block on Remove.
func TestMemCacheSidecars(t *testing.T) {
	c := NewMemCache("dram", 1<<20)
	block := bytes.Repeat([]byte{7}, 4096)
	side := make([]byte, 4*256)
	for i := range side {
		side[i] = byte(i)
	}
	crcs := make([]uint32, 4)
	for p := range crcs {
		crcs[p] = format.Checksum(side[p*256 : (p+1)*256])
	}
	c.Put(bid(1), block, []uint32{format.Checksum(block)})
	c.PutSidecar(bid(1), 3, side, crcs)
	c.PutSidecar(bid(2), 3, side, crcs) // a sidecar may be cached without its block
	c.PutSidecar(bid(1), 0, side, crcs) // kind 0 is no sidecar: ignored
	st := c.Stats()
	if st.Blocks != 1 || st.Sidecars != 2 || st.Bytes != int64(len(block)+2*len(side)) {
		t.Fatalf("stats %+v", st)
	}
	dst := make([]byte, 256)
	if ok, err := c.GetSidecar(bid(1), 3, 2, dst); !ok || err != nil || !bytes.Equal(dst, side[512:768]) {
		t.Fatalf("part 2: %v %v", ok, err)
	}
	if ok, _ := c.GetSidecar(bid(1), 3, 1, make([]byte, 512)); ok {
		t.Fatal("a two-part read answered as one part")
	}
	if ok, _ := c.GetSidecar(bid(1), 3, 4, dst); ok {
		t.Fatal("a part past the end answered")
	}
	if ok, _ := c.GetSidecar(bid(1), 4, 0, dst); ok {
		t.Fatal("hit on a kind never cached")
	}
	if ok, _ := c.Get(bid(2), 0, make([]byte, 256)); ok {
		t.Fatal("a sidecar answered a block Get")
	}
	c.entries[memKey{bid(2), 3}].data[300] ^= 1
	if ok, err := c.GetSidecar(bid(2), 3, 1, dst); ok || !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), "sidecar 3 of block") {
		t.Fatalf("corrupt part: %v %v", ok, err)
	}
	c.Remove(bid(1))
	if ok, _ := c.GetSidecar(bid(1), 3, 0, dst); ok || c.Contains(bid(1)) {
		t.Fatal("Remove left the block's sidecar")
	}
	if st := c.Stats(); st.Blocks != 0 || st.Sidecars != 0 || st.Bytes != 0 {
		t.Fatalf("after Remove: %+v", st)
	}
}

// PruneSidecars drops exactly the cached sidecars keep rejects, of the blocks named or of
// every block, and leaves blocks alone.
func TestMemCachePruneSidecars(t *testing.T) {
	c := NewMemCache("dram", 1<<20)
	side := fill(256, 9)
	crcs := []uint32{format.Checksum(side)}
	for n := 1; n <= 3; n++ {
		put(c, bid(n), fill(64, byte(n)))
		c.PutSidecar(bid(n), 2, side, crcs)
		c.PutSidecar(bid(n), 5, side, crcs)
	}
	cached := func(n int, kind format.SidecarKind) bool {
		ok, err := c.GetSidecar(bid(n), kind, 0, make([]byte, 256))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	// Of block 1 only: its kind 5 goes, block 2's kind 5 stays although keep rejects it.
	notFive := func(_ ID, kind format.SidecarKind) bool { return kind != 5 }
	if n := c.PruneSidecars([]ID{bid(1), bid(9)}, notFive); n != 1 || cached(1, 5) || !cached(1, 2) || !cached(2, 5) {
		t.Fatalf("pruned %d of block 1", n)
	}
	// Of every block: block 3's sidecars go, the rest stay.
	notThree := func(id ID, _ format.SidecarKind) bool { return id != bid(3) }
	if n := c.PruneSidecars(nil, notThree); n != 2 || cached(3, 2) || cached(3, 5) || !cached(2, 2) || !cached(2, 5) {
		t.Fatalf("pruned %d of every block", n)
	}
	if st := c.Stats(); st.Blocks != 3 || st.Sidecars != 3 || st.Bytes != 3*64+3*256 {
		t.Fatalf("after pruning: %+v", st)
	}
}

// GetSidecars answers like GetSidecar for each block, across several lock batches: hits copied
// and found, misses (absent, another kind, parts of another size) left alone, blocks already
// found skipped, corrupt parts dropped and reported by block.
func TestMemCacheGetSidecars(t *testing.T) {
	const parts, part, blocks = 4, 128, 150
	c := NewMemCache("dram", 1<<20)
	sides := make([][]byte, blocks)
	for i := range sides {
		sides[i] = make([]byte, parts*part)
		for j := range sides[i] {
			sides[i][j] = byte(i*7 + j)
		}
		crcs := make([]uint32, parts)
		for p := range crcs {
			crcs[p] = format.Checksum(sides[i][p*part : (p+1)*part])
		}
		switch {
		case i%10 == 3: // not cached
		case i%10 == 5:
			c.PutSidecar(bid(i), 4, sides[i], crcs) // another kind
		default:
			c.PutSidecar(bid(i), 3, sides[i], crcs)
		}
	}
	// Corrupt part 2 of blocks 77 and 62: of the 50 hits of the first batch of 64 ids, the last
	// two (61, 62) are checked one by one, the others (and 77, in the second batch) three at a
	// time.
	c.entries[memKey{bid(77), 3}].data[2*part+9] ^= 1
	c.entries[memKey{bid(62), 3}].data[3*part-1] ^= 0x80
	ids := make([]ID, blocks)
	for i := range ids {
		ids[i] = bid(i)
	}
	dst := make([]byte, blocks*part)
	found := make([]bool, blocks)
	found[1] = true // already found elsewhere: skipped
	copy(dst[part:2*part], fill(part, 0xEE))
	hits, err := c.GetSidecars(3, 2, ids, dst, found)
	if !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), bid(77).String()) || !strings.Contains(err.Error(), bid(62).String()) {
		t.Fatalf("error %v, want the corrupt parts of blocks 77 and 62", err)
	}
	want := 0
	for i := range ids {
		got := dst[i*part : (i+1)*part]
		switch {
		case i == 1:
			if !found[i] || !bytes.Equal(got, fill(part, 0xEE)) {
				t.Fatalf("block 1 (found before the call) was overwritten")
			}
		case i%10 == 3 || i%10 == 5 || i == 77 || i == 62:
			if found[i] {
				t.Fatalf("block %d found", i)
			}
		default:
			want++
			if !found[i] || !bytes.Equal(got, sides[i][2*part:3*part]) {
				t.Fatalf("block %d: found %v, bytes match %v", i, found[i], bytes.Equal(got, sides[i][2*part:3*part]))
			}
		}
	}
	if hits != want {
		t.Fatalf("%d hits, want %d", hits, want)
	}
	if c.entries[memKey{bid(77), 3}] != nil || c.entries[memKey{bid(62), 3}] != nil || c.Stats().Corrupt != 2 {
		t.Fatalf("corrupt sidecar still cached (stats %+v)", c.Stats())
	}
	// Parts of another size miss; mismatched arguments copy nothing.
	small := make([]byte, blocks*part/2)
	if hits, err := c.GetSidecars(3, 0, ids, small, make([]bool, blocks)); hits != 0 || err != nil {
		t.Fatalf("half-size parts: %d hits, %v", hits, err)
	}
	if hits, _ := c.GetSidecars(3, 0, ids, dst, make([]bool, blocks-1)); hits != 0 {
		t.Fatalf("found of the wrong length: %d hits", hits)
	}
	if hits, _ := c.GetSidecars(3, parts, ids, dst, make([]bool, blocks)); hits != 0 {
		t.Fatalf("part past the end: %d hits", hits)
	}
}

// TestMemCacheLoad checks the Cache side of the memory tier: Load of whole blocks and shards
// asks dst only for cached blocks, reports each block's checksums, counts a miss for an absent
// block or a buffer of the wrong size, and turns a block whose bytes changed into a miss with
// an error wrapping format.ErrCorrupt that names it, dropping it.
func TestMemCacheLoad(t *testing.T) {
	const shards, shardBytes = 4, 1024
	c := NewMemCache("dram", 1<<20)
	blocks := map[ID][]byte{}
	for n := 1; n <= 3; n++ {
		b := make([]byte, shards*shardBytes)
		for i := range b {
			b[i] = byte(n*7 + i)
		}
		blocks[bid(n)] = b
		putParts(c, bid(n), b, shards)
	}
	ids := []ID{bid(1), bid(9), bid(2), bid(3)} // bid(9) is not cached
	want := []bool{true, true, true, false}     // bid(3) is not asked for
	asked := map[int]bool{}
	bufs := make([][]byte, len(ids))
	dst := func(i int) []byte {
		if asked[i] {
			t.Fatalf("dst(%d) asked twice", i)
		}
		asked[i] = true
		bufs[i] = make([]byte, shards*shardBytes)
		return bufs[i]
	}
	crcs := make([][]uint32, len(ids))
	hits, err := c.Load(ids, -1, want, dst, crcs)
	if err != nil {
		t.Fatal(err)
	}
	if !hits[0] || hits[1] || !hits[2] || hits[3] {
		t.Fatalf("hits %v, want [true false true false]", hits)
	}
	if asked[1] || asked[3] {
		t.Errorf("dst asked for a block not cached or not wanted: %v", asked)
	}
	for _, i := range []int{0, 2} {
		if !bytes.Equal(bufs[i], blocks[ids[i]]) {
			t.Errorf("block %d: wrong bytes", i)
		}
		for s, crc := range crcs[i] {
			if crc != format.Checksum(blocks[ids[i]][s*shardBytes:(s+1)*shardBytes]) || len(crcs[i]) != shards {
				t.Errorf("block %d: checksums %v are not its shards'", i, crcs[i])
			}
		}
	}
	if got := c.Lookup(ids, []bool{true, true, false, true}); !got[0] || got[1] || got[2] || !got[3] {
		t.Errorf("Lookup %v, want [true false false true]", got)
	}

	// One shard: only its bytes, no checksums reported.
	one := make([]byte, shardBytes)
	crcs = make([][]uint32, 1)
	hits, err = c.Load(ids[2:3], 2, nil, func(int) []byte { return one }, crcs)
	if err != nil || !hits[0] || !bytes.Equal(one, blocks[bid(2)][2*shardBytes:3*shardBytes]) || crcs[0] != nil {
		t.Errorf("shard load: hit %v err %v crcs %v", hits[0], err, crcs[0])
	}
	// A buffer of the wrong size misses.
	before := c.Stats().Misses
	if hits, _ := c.Load(ids[:1], -1, nil, func(int) []byte { return make([]byte, 10) }, nil); hits[0] {
		t.Error("a 10-byte buffer was loaded")
	}
	if c.Stats().Misses != before+1 {
		t.Error("a wrong-size buffer was not counted as a miss")
	}

	// A bit flips in the cache: a miss, an error naming the block, the block dropped.
	c.entries[memKey{bid(3), 0}].data[shardBytes+5] ^= 0x40
	hits, err = c.Load(ids[3:], -1, nil, func(int) []byte { return make([]byte, shards*shardBytes) }, nil)
	if hits[0] || !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), bid(3).String()) {
		t.Errorf("corrupt block: hit %v, err %v", hits[0], err)
	}
	if c.Contains(bid(3)) {
		t.Error("a corrupt block stayed cached")
	}
	if u := c.Usage(); u.Corrupt != 1 || u.Blocks != 2 || u.Capacity != 1<<20 {
		t.Errorf("usage %+v", u)
	}
}

// TestMemCacheReusesBuffers turns a full cache over: the buffers of evicted blocks are reused
// by later Puts, every cached block still reads back as put, and the free list stays within
// its budget.
func TestMemCacheReusesBuffers(t *testing.T) {
	const size, blocks = 128 << 10, 32
	c := NewMemCache("mem", size*blocks)
	block := func(n int) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(n*7 + i/4096)
		}
		return b
	}
	crcsOf := func(b []byte) []uint32 {
		return []uint32{format.Checksum(b[:size/2]), format.Checksum(b[size/2:])}
	}
	for n := range 3 * blocks {
		b := block(n)
		c.Put(bid(n), b, crcsOf(b))
	}
	st := c.Stats()
	if st.Reused == 0 {
		t.Errorf("no Put reused an evicted block's buffer: %+v", st)
	}
	if st.FreeBytes > freeBudget(c.capacity) || st.Bytes > c.capacity {
		t.Errorf("free %d bytes (budget %d), cached %d (capacity %d)", st.FreeBytes, freeBudget(c.capacity), st.Bytes, c.capacity)
	}
	dst := make([]byte, size)
	for n := 2 * blocks; n < 3*blocks; n++ {
		if ok, err := c.Get(bid(n), 0, dst); !ok || err != nil || !bytes.Equal(dst, block(n)) {
			t.Fatalf("block %d: ok %v err %v, equal %v", n, ok, err, bytes.Equal(dst, block(n)))
		}
	}
}

// TestMemCacheReaderKeepsBuffer removes a block while a reader is copying it: no Put may reuse
// its buffer until the reader is done, so the reader copies the complete old bytes.
func TestMemCacheReaderKeepsBuffer(t *testing.T) {
	const size = 128 << 10
	c := NewMemCache("mem", 64*size)
	mk := func(v byte) ([]byte, []uint32) {
		b := bytes.Repeat([]byte{v}, size)
		return b, []uint32{format.Checksum(b)}
	}
	b, crcs := mk(1)
	c.Put(bid(1), b, crcs)
	c.mu.Lock()
	e := c.lookupLocked(memKey{bid(1), 0}, 0, size, false) // a Get that has found the block
	c.mu.Unlock()
	if e == nil {
		t.Fatal("block 1 not found")
	}
	c.Remove(bid(1))
	if st := c.Stats(); st.FreeBytes != 0 {
		t.Fatalf("the buffer of a block being read is free: %+v", st)
	}
	for n := 2; n < 10; n++ { // same size: each would take a free buffer
		b, crcs := mk(byte(n))
		c.Put(bid(n), b, crcs)
	}
	dst := make([]byte, size)
	if err := c.check(e, 0, dst); err != nil || !bytes.Equal(dst, b) {
		t.Fatalf("the reader of the removed block copied other bytes: %v", err)
	}
	c.release(e)
	if st := c.Stats(); st.FreeBytes != size {
		t.Errorf("after its last reader, the removed block's buffer is not free for reuse: %+v", st)
	}
	b2, crcs2 := mk(42)
	c.Put(bid(42), b2, crcs2)
	if st := c.Stats(); st.Reused != 1 || st.FreeBytes != 0 {
		t.Errorf("the next Put did not reuse it: %+v", st)
	}
	if ok, err := c.Get(bid(42), 0, dst); !ok || err != nil || !bytes.Equal(dst, b2) {
		t.Errorf("block 42 in a reused buffer: ok %v err %v", ok, err)
	}
}

// BenchmarkMemCachePutTurnover puts 2 MiB blocks into a full cache, each evicting the least
// recently used: the memory tier's backfill of a stream of loads. Its MB/s over
// BenchmarkMemcpy2MiBRotating's is the cost of a Put over a plain copy of its bytes into memory
// as cold.
func BenchmarkMemCachePutTurnover(b *testing.B) {
	c := NewMemCache("dram", 64*block2MiB)
	srcs := make([][]byte, 64) // as BenchmarkMemcpy2MiB's
	crcs := make([][]uint32, len(srcs))
	for i := range srcs {
		srcs[i] = fill(block2MiB, byte(i))
		crcs[i] = []uint32{format.Checksum(srcs[i])}
	}
	for i := range 64 {
		c.Put(bid(i), srcs[i], crcs[i])
	}
	b.SetBytes(block2MiB)
	b.ResetTimer()
	for i := 64; b.Loop(); i++ {
		c.Put(bid(i), srcs[i%64], crcs[i%64])
	}
}

// BenchmarkMemCacheFillFresh puts 2 MiB blocks into empty tiers of 128 blocks, a new tier each
// time one is full, the last one's memory returned to the operating system first (untimed):
// every Put copies into memory the process never touched before, as a freshly opened store's
// memory tier fills. Against BenchmarkMemCachePutTurnover it is the cost of that first touch.
func BenchmarkMemCacheFillFresh(b *testing.B) {
	srcs := make([][]byte, 64) // as BenchmarkMemcpy2MiB's
	crcs := make([][]uint32, len(srcs))
	for i := range srcs {
		srcs[i] = fill(block2MiB, byte(i))
		crcs[i] = []uint32{format.Checksum(srcs[i])}
	}
	b.SetBytes(block2MiB)
	var c *MemCache
	for i := 0; b.Loop(); i++ {
		if i%128 == 0 {
			b.StopTimer()
			c = nil
			debug.FreeOSMemory()
			c = NewMemCache("dram", 128*block2MiB)
			b.StartTimer()
		}
		c.Put(bid(i), srcs[i%64], crcs[i%64])
	}
}
