package tiers

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// lid makes distinct, deliberately non-random ids (the LRU must not rely on MD5-like keys).
func lid(n int) ID {
	var id ID
	id[12], id[13], id[14], id[15] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return id
}

func names(ids []ID) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id[12])<<24 | int(id[13])<<16 | int(id[14])<<8 | int(id[15])
	}
	return out
}

func wantVictims(t *testing.T, l *LRU, bytes int64, want ...int) {
	t.Helper()
	got := names(l.Victims(bytes))
	if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Errorf("Victims(%d) = %v, want %v", bytes, got, want)
	}
}

const all = 1 << 62

func TestLRUOrder(t *testing.T) {
	l := NewLRU()
	for n := 1; n <= 5; n++ {
		l.Add(lid(n), 10)
	}
	l.Touch(lid(2), lid(1)) // 1 becomes the most recent, then 2 before it
	l.Touch(lid(99))        // unknown: ignored
	wantVictims(t, l, 1, 3)
	wantVictims(t, l, 10, 3)
	wantVictims(t, l, 11, 3, 4)
	wantVictims(t, l, all, 3, 4, 5, 2, 1)
	wantVictims(t, l, 0)
	// Victims removes nothing; the engine does.
	if l.Len() != 5 || l.Bytes() != 50 {
		t.Errorf("Len %d Bytes %d after Victims, want 5 and 50", l.Len(), l.Bytes())
	}
	l.Remove(lid(3))
	l.Remove(lid(3))
	l.Remove(lid(77))
	l.Add(lid(4), 25) // re-Add: new size, most recent
	wantVictims(t, l, all, 5, 2, 1, 4)
	if l.Len() != 4 || l.Bytes() != 55 {
		t.Errorf("Len %d Bytes %d, want 4 and 55", l.Len(), l.Bytes())
	}
	checkLRU(t, l)
}

func TestLRUChainOrder(t *testing.T) {
	l := NewLRU()
	l.Add(lid(100), 1) // X
	for n := 1; n <= 3; n++ {
		l.Add(lid(n), 1) // A=1 → B=2 → C=3
	}
	l.Add(lid(200), 1) // Y
	l.TouchChain([]ID{lid(1), lid(2), lid(3)})
	// The whole chain is more recent than X and Y, the root most recent of all.
	wantVictims(t, l, all, 100, 200, 3, 2, 1)
	// Re-adding the parent makes it most recent but it still waits for its child.
	l.Add(lid(1), 1)
	l.Touch(lid(100))
	wantVictims(t, l, all, 200, 3, 2, 1, 100)
	checkLRU(t, l)
}

func TestLRUChildTouchedAfterParent(t *testing.T) {
	l := NewLRU()
	l.Add(lid(1), 1)
	l.Add(lid(2), 1)
	l.TouchChain([]ID{lid(1), lid(2)}) // 1 is the parent of 2
	l.Add(lid(100), 1)
	l.Touch(lid(2)) // now oldest first: 1, 100, 2
	wantVictims(t, l, 1, 100)
	wantVictims(t, l, 2, 100, 2)
	wantVictims(t, l, all, 100, 2, 1)
	checkLRU(t, l)

	// The engine evicts the first two; the parent is then the oldest.
	l.Remove(lid(100))
	l.Remove(lid(2))
	l.Add(lid(300), 1)
	wantVictims(t, l, 1, 1)
	checkLRU(t, l)
}

func TestLRUMiddleOfChainTouched(t *testing.T) {
	l := NewLRU()
	chain := []ID{lid(1), lid(2), lid(3), lid(4)}
	for _, id := range chain {
		l.Add(id, 1)
	}
	l.TouchChain(chain)
	l.Touch(lid(3))   // oldest first: 4, 2, 1, 3
	l.Add(lid(50), 1) // newest
	l.Touch(lid(4))   // oldest first: 2, 1, 3, 50, 4
	l.Add(lid(60), 1) // newest
	l.Touch(lid(1))   // a root touched alone: oldest first 2, 3, 50, 4, 60, 1
	wantVictims(t, l, 1, 50)
	wantVictims(t, l, all, 50, 4, 3, 2, 60, 1)
	checkLRU(t, l)
}

func TestLRUPins(t *testing.T) {
	l := NewLRU()
	chain := []ID{lid(1), lid(2), lid(3)}
	for _, id := range chain {
		l.Add(id, 1)
	}
	l.Add(lid(100), 1)
	l.TouchChain(chain) // oldest first: 100, 3, 2, 1
	l.Pin(lid(3))
	l.Pin(lid(3)) // nested
	wantVictims(t, l, all, 100)
	l.Unpin(lid(3))
	wantVictims(t, l, all, 100)
	l.Unpin(lid(3))
	wantVictims(t, l, all, 100, 3, 2, 1)
	l.Unpin(lid(3)) // extra Unpin: no effect, no underflow
	l.Pin(lid(3))
	l.Unpin(lid(3))
	wantVictims(t, l, all, 100, 3, 2, 1)

	// A pinned middle block protects itself and its ancestors, not its child.
	l.Pin(lid(2))
	wantVictims(t, l, all, 100, 3)
	l.Remove(lid(3))
	wantVictims(t, l, all, 100)
	l.Unpin(lid(2))
	wantVictims(t, l, all, 100, 2, 1)

	// Pins of unknown ids are ignored; a removed block loses its pins.
	l.Pin(lid(999))
	l.Pin(lid(100))
	l.Remove(lid(100))
	l.Add(lid(100), 1)
	wantVictims(t, l, all, 2, 1, 100)
	checkLRU(t, l)
}

func TestLRUVictimsFewerThanAsked(t *testing.T) {
	l := NewLRU()
	l.Add(lid(1), 100)
	l.Add(lid(2), 200)
	l.Add(lid(3), 300)
	l.Pin(lid(2))
	got := l.Victims(10_000)
	if !slices.Equal(names(got), []int{1, 3}) {
		t.Errorf("Victims(10000) = %v, want every evictable block [1 3]", names(got))
	}
	if v := NewLRU().Victims(1); len(v) != 0 {
		t.Errorf("Victims of an empty LRU = %v", v)
	}
}

func TestLRURemoveParentWithLiveChildren(t *testing.T) {
	l := NewLRU()
	l.Add(lid(1), 1)
	l.Add(lid(2), 1)
	l.Add(lid(3), 1)
	l.TouchChain([]ID{lid(1), lid(2)})
	l.TouchChain([]ID{lid(1), lid(3)}) // two children
	l.Pin(lid(2))
	l.Remove(lid(1)) // deleted for another reason while its children live
	if l.Len() != 2 || l.Bytes() != 2 {
		t.Errorf("Len %d Bytes %d, want 2 and 2", l.Len(), l.Bytes())
	}
	checkLRU(t, l)
	// The same id comes back (rewritten); the old links must not bind it to the pinned child.
	l.Add(lid(1), 1)
	l.Touch(lid(2), lid(3)) // 1 is now the oldest
	wantVictims(t, l, all, 1, 3)
	l.Remove(lid(3))
	l.Remove(lid(2)) // last child of the removed node: its placeholder is freed
	checkLRU(t, l)
	// New links to the new node work.
	l.Add(lid(2), 1)
	l.TouchChain([]ID{lid(1), lid(2)})
	l.Touch(lid(2))
	wantVictims(t, l, all, 2, 1)
	checkLRU(t, l)
}

func TestLRUTouchChainLinks(t *testing.T) {
	l := NewLRU()
	for _, n := range []int{1, 3, 4} {
		l.Add(lid(n), 1)
	}
	// 2 is not in this tier: 1 and 3 are not linked, 3 and 4 are.
	l.TouchChain([]ID{lid(1), lid(2), lid(3), lid(4)})
	l.Touch(lid(4), lid(3)) // oldest first: 1, 4, 3
	wantVictims(t, l, all, 1, 4, 3)

	// A contradicting chain re-parents: 4's parent becomes 1.
	l.TouchChain([]ID{lid(1), lid(4)})
	l.Touch(lid(4), lid(3)) // oldest first: 1, 4, 3 — 1 must now wait for 4
	wantVictims(t, l, all, 4, 1, 3)

	// A chain that would close a cycle is ignored rather than making both unevictable.
	l.TouchChain([]ID{lid(4), lid(1)})
	l.TouchChain([]ID{lid(1), lid(1)})
	got := names(l.Victims(all))
	if len(got) != 3 || slices.Index(got, 4) > slices.Index(got, 1) {
		t.Errorf("after a cyclic chain: Victims = %v, want all three with 4 before 1", got)
	}
	checkLRU(t, l)
}

// A long chain touched in full, then every block touched alone leaf-to-root: Victims must
// still return the whole chain leaf first.
func TestLRUDeepChain(t *testing.T) {
	l := NewLRU()
	const depth = 256
	chain := make([]ID, depth)
	for i := range chain {
		chain[i] = lid(i + 1)
		l.Add(chain[i], 1)
	}
	l.TouchChain(chain)
	for i := depth - 1; i >= 0; i-- {
		l.Touch(chain[i]) // the root ends up most recent... then reverse it
	}
	l.Touch(chain...) // the leaf ends up most recent, the root least
	got := names(l.Victims(all))
	for i, n := range got {
		if n != depth-i {
			t.Fatalf("Victims[%d] = %d, want %d (leaf first)", i, n, depth-i)
		}
	}
	if len(got) != depth {
		t.Fatalf("got %d victims, want %d", len(got), depth)
	}
	// Evict half: the rest still comes leaf first.
	for _, n := range got[:depth/2] {
		l.Remove(lid(n))
	}
	got = names(l.Victims(all))
	if len(got) != depth/2 || got[0] != depth/2 || got[len(got)-1] != 1 {
		t.Errorf("after evicting half: %d victims from %d to %d", len(got), got[0], got[len(got)-1])
	}
	checkLRU(t, l)
}

func TestLRUConcurrent(t *testing.T) {
	l := NewLRU()
	const (
		workers = 4
		perW    = 200
		rounds  = 3000
	)
	// pinGen[id] is odd while its owner holds a pin (set after Pin, bumped before Unpin).
	var pinGen [workers * perW]atomic.Uint64
	var wg sync.WaitGroup
	var stop atomic.Bool
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			base := w * perW
			pinned := map[int]bool{}
			for range rounds {
				n := base + r.IntN(perW)
				switch op := r.IntN(12); {
				case op < 3:
					if !pinned[n] { // the engine does not rewrite a block it is loading
						l.Add(lid(n), int64(1+r.IntN(100)))
					}
				case op < 5:
					l.Touch(lid(n), lid(base+r.IntN(perW)))
				case op < 7:
					start := base + r.IntN(perW-16)
					chain := make([]ID, 1+r.IntN(16))
					for i := range chain {
						chain[i] = lid(start + i)
					}
					l.TouchChain(chain)
				case op < 8:
					if !pinned[n] { // written, then loaded: Pin of an absent id would be a no-op
						l.Add(lid(n), int64(1+r.IntN(100)))
						l.Pin(lid(n))
						pinGen[n].Add(1)
						pinned[n] = true
					}
				case op < 10:
					if pinned[n] {
						pinGen[n].Add(1)
						l.Unpin(lid(n))
						pinned[n] = false
					}
				default:
					if !pinned[n] { // the engine does not remove a block it is loading
						l.Remove(lid(n))
					}
				}
			}
			for n := range pinned {
				if pinned[n] {
					pinGen[n].Add(1)
					l.Unpin(lid(n))
				}
			}
		}()
	}
	var evictions atomic.Int64
	var ev sync.WaitGroup
	ev.Add(1)
	go func() { // the evictor: like the engine, removes what Victims returns
		defer ev.Done()
		for !stop.Load() {
			var before [workers * perW]uint64
			for i := range before {
				before[i] = pinGen[i].Load()
			}
			v := l.Victims(500)
			seen := map[ID]bool{}
			for _, id := range v {
				n := names([]ID{id})[0]
				if g := pinGen[n].Load(); g == before[n] && g%2 == 1 {
					t.Errorf("Victims returned %d, pinned throughout the call", n)
				}
				if seen[id] {
					t.Errorf("Victims returned %d twice", n)
				}
				seen[id] = true
			}
			for _, id := range v {
				l.Remove(id)
			}
			evictions.Add(int64(len(v)))
			l.Len()
			l.Bytes()
		}
	}()
	wg.Wait()
	stop.Store(true)
	ev.Wait()
	if evictions.Load() == 0 {
		t.Error("the evictor never evicted anything")
	}
	checkLRU(t, l)
	// With every pin released, everything left is evictable, leaf first along known links.
	v := l.Victims(all)
	if len(v) != l.Len() {
		t.Errorf("Victims(all) returned %d of %d blocks with no pins held", len(v), l.Len())
	}
	checkChildrenFirst(t, l, v)
}

// checkChildrenFirst asserts that in an answer no block precedes a live child of its.
func checkChildrenFirst(t *testing.T, l *LRU, v []ID) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	pos := map[uint32]int{}
	for k, id := range v {
		pos[l.lookup(id)] = k
	}
	for k, id := range v {
		i := l.lookup(id)
		if p := l.node(i).parent; p != 0 && l.node(p).state != nodeDead {
			if pp, ok := pos[p]; !ok || pp < k {
				t.Errorf("block %v at %d: its parent at %d (returned: %v)", names([]ID{id}), k, pp, ok)
			}
		}
	}
}

// checkLRU verifies the internal structure: list links, states, counts, sizes, child counts,
// the hash table and the free list.
func checkLRU(t *testing.T, l *LRU) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	listed := map[uint32]bool{}
	prev := uint32(0)
	for i := l.node(0).next; i != 0; i = l.node(i).next {
		if listed[i] {
			t.Fatalf("list cycle at node %d", i)
		}
		listed[i] = true
		if l.node(i).prev != prev {
			t.Fatalf("node %d: prev %d, want %d", i, l.node(i).prev, prev)
		}
		if s := l.node(i).state; s != nodeListed {
			t.Fatalf("node %d in the list with state %d", i, s)
		}
		prev = i
	}
	if l.node(0).prev != prev {
		t.Fatalf("sentinel prev %d, want %d", l.node(0).prev, prev)
	}
	live, children := 0, map[uint32]uint32{}
	var bytes int64
	free := map[uint32]bool{}
	for i := l.free; i != 0; i = l.node(i).next {
		free[i] = true
	}
	for i := uint32(1); i < l.used; i++ {
		n := l.node(i)
		switch n.state {
		case nodeListed, nodeParked:
			live++
			bytes += n.size
			if (n.state == nodeListed) != listed[i] {
				t.Errorf("node %d state %d, in list %v", i, n.state, listed[i])
			}
			if l.lookup(n.id) != i {
				t.Errorf("node %d not found by its id", i)
			}
			if n.state == nodeParked && n.pins == 0 && n.nchild == 0 {
				t.Errorf("node %d parked though evictable", i)
			}
		case nodeDead:
			if n.nchild == 0 {
				t.Errorf("dead node %d without children not freed", i)
			}
			if n.parent != 0 {
				t.Errorf("dead node %d keeps a parent", i)
			}
		case nodeFree:
			if !free[i] {
				t.Errorf("free node %d not on the free list", i)
			}
			continue
		}
		if n.parent != 0 {
			children[n.parent]++
		}
	}
	for i := uint32(1); i < l.used; i++ {
		if n := l.node(i); n.nchild != children[i] {
			t.Errorf("node %d: nchild %d, %d nodes point at it", i, n.nchild, children[i])
		}
	}
	inTable := 0
	for _, i := range l.table {
		if i != 0 {
			inTable++
		}
	}
	if live != l.count || inTable != l.count || bytes != l.bytes {
		t.Errorf("count %d bytes %d; found %d live nodes, %d in the table, %d bytes", l.count, l.bytes, live, inTable, bytes)
	}
}

// TestLRUMemoryPerBlock tracks 1,000,000 blocks (with chain links) and measures the heap.
func TestLRUMemoryPerBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~75 MB")
	}
	blocks := 1_000_000
	if raceEnabled {
		blocks = 200_000 // same per-block cost, a fifth of the time under the race detector
	}
	ids := make([]ID, blocks)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range ids {
		for k := range 16 {
			ids[i][k] = byte(r.Uint32())
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l := NewLRU()
	for i, id := range ids {
		l.Add(id, 2<<20)
		if i%64 != 0 {
			l.TouchChain(ids[i-1 : i+1])
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(ids) // else freeing ids (16 MB) during the run hides that much of the LRU
	per := float64(after.HeapAlloc-before.HeapAlloc) / float64(blocks)
	t.Logf("%.1f bytes per tracked block (%d blocks, heap +%.1f MiB)", per, l.Len(), float64(after.HeapAlloc-before.HeapAlloc)/(1<<20))
	if l.Len() != blocks {
		t.Fatalf("Len %d", l.Len())
	}
	if per > 64 {
		t.Errorf("%.1f bytes per tracked block, budget 64", per)
	}
	runtime.KeepAlive(l)
}

func benchLRU(b *testing.B, blocks int) (*LRU, []ID) {
	l := NewLRU()
	ids := make([]ID, blocks)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range ids {
		for k := range 16 {
			ids[i][k] = byte(r.Uint32())
		}
		l.Add(ids[i], 2<<20)
	}
	return l, ids
}

func BenchmarkLRUTouch(b *testing.B) {
	l, ids := benchLRU(b, 1_000_000)
	r := rand.New(rand.NewPCG(5, 6))
	b.ResetTimer()
	for b.Loop() {
		l.Touch(ids[r.IntN(len(ids))])
	}
}

func BenchmarkLRUTouchChain256(b *testing.B) {
	l, ids := benchLRU(b, 1_000_000)
	r := rand.New(rand.NewPCG(5, 6))
	b.ResetTimer()
	for b.Loop() {
		start := r.IntN(len(ids)/256) * 256
		l.TouchChain(ids[start : start+256])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/256, "ns/block")
}

// BenchmarkLRUVictims evicts 32 blocks (64 MiB of 2 MiB blocks) per op from 1,000,000 tracked
// blocks in chains of 64, and re-adds them so the population stays constant.
func BenchmarkLRUVictims(b *testing.B) {
	for _, chained := range []bool{false, true} {
		b.Run(fmt.Sprintf("chained=%v", chained), func(b *testing.B) {
			l, ids := benchLRU(b, 1_000_000)
			if chained {
				for s := 0; s < len(ids); s += 64 {
					l.TouchChain(ids[s : s+64])
				}
				for i := range ids { // children touched alone after their parents
					if i%64 != 0 {
						l.Touch(ids[i])
					}
				}
			}
			b.ResetTimer()
			n := 0
			for b.Loop() {
				v := l.Victims(64 << 20)
				if len(v) == 0 {
					b.Fatal("no victims")
				}
				for _, id := range v {
					l.Remove(id)
					l.Add(id, 2<<20)
				}
				n += len(v)
			}
			b.ReportMetric(float64(n)/float64(b.N), "victims/op")
		})
	}
}

// AddColdest puts blocks behind everything tracked, leaves tracked blocks where they are, and
// newest-first loading rebuilds write order behind blocks added meanwhile.
func TestLRUAddColdest(t *testing.T) {
	l := NewLRU()
	l.Add(lid(100), 10) // dumped while the fill runs
	for i := 9; i >= 0; i-- {
		l.AddColdest(lid(i), 10) // the fill: newest (9) first
	}
	l.AddColdest(lid(100), 10) // already tracked: stays the most recent
	got := l.Victims(100)
	want := []ID{lid(0), lid(1), lid(2), lid(3), lid(4), lid(5), lid(6), lid(7), lid(8), lid(9)}
	if !slices.Equal(got, want) {
		t.Fatalf("victims %v, want %v", got, want)
	}
	if l.Len() != 11 || l.Bytes() != 110 {
		t.Fatalf("len %d bytes %d", l.Len(), l.Bytes())
	}
	l.Touch(lid(0))
	if v := l.Victims(10); len(v) != 1 || v[0] != lid(1) {
		t.Fatalf("after touching the coldest: %v", v)
	}
	checkLRU(t, l)
}
