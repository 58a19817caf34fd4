package tiers

import (
	"encoding/binary"
	"sync"
)

// LRU is the global, prefix-chain-aware recency order of the blocks of one disk tier, held in
// memory only (a hit costs no write). It is safe for concurrent use; every method takes one
// mutex for a short, bounded time except Victims, whose work is proportional to the blocks it
// returns plus the blocks it sets aside (each set aside at most once per Touch).
//
// Chains: a block's parent is the block before it in a prompt's prefix (TouchChain records
// the links). A child is useless without its parent, so Victims returns a block only after all
// its known live children, and never returns a pinned block or any ancestor of one.
//
// Memory: about 56 bytes per tracked block (48-byte node in slabs plus a 4-byte open-addressing
// slot at load <= 3/4), measured by TestLRUMemoryPerBlock.
type LRU struct {
	mu    sync.Mutex
	slabs []*[lruSlab]lruNode // node i is slabs[i>>lruSlabShift][i&lruSlabMask]; node 0 is the list sentinel
	used  uint32              // nodes ever allocated (including the sentinel)
	free  uint32              // head of the free-node list, linked through next; 0 = empty
	table []uint32            // open addressing with linear probing: node index, 0 = empty slot
	count int                 // tracked blocks
	bytes int64               // sum of their sizes
	clock uint32              // last-use stamp source (wraps; compared by signed difference)

	scratch []uint32 // TouchChain's node indices, reused under mu
}

const (
	lruSlabShift = 13
	lruSlab      = 1 << lruSlabShift
	lruSlabMask  = lruSlab - 1
)

// Node states.
const (
	nodeFree   uint8 = iota
	nodeListed       // tracked, in the recency list
	nodeParked       // tracked, out of the list: Victims found it pinned or with live children
	nodeDead         // removed, kept only as the former parent of live children (links cleared lazily)
)

type lruNode struct {
	id         ID
	size       int64
	prev, next uint32 // recency list: sentinel.next is the most recent, sentinel.prev the least
	parent     uint32 // 0 = none known
	nchild     uint32 // live children whose parent is this node
	stamp      uint32 // clock at the last use: where a released parked node re-enters the list
	pins       uint16 // saturates at maxPins and then stays pinned
	state      uint8
}

// maxPins is the most nested pins a block counts; a block pinned that often stays pinned.
const maxPins = 1<<16 - 1

// unparkWalk bounds the walk that puts a released parked node back at its place by last use.
const unparkWalk = 64

// NewLRU returns an empty LRU.
func NewLRU() *LRU {
	l := &LRU{used: 1, table: make([]uint32, 64)}
	l.slabs = append(l.slabs, new([lruSlab]lruNode))
	return l
}

// Add records that block id of size bytes was written to the tier, as most recently used.
// Re-adding a tracked block updates its size and makes it most recent, keeping its links
// and pins.
func (l *LRU) Add(id ID, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := l.lookup(id); i != 0 {
		n := l.node(i)
		l.bytes += size - n.size
		n.size = size
		l.toFront(i)
		return
	}
	i := l.alloc()
	n := l.node(i)
	n.id, n.size, n.state = id, size, nodeListed
	l.stamp(n)
	l.insertAfter(i, 0)
	l.insert(i)
	l.count++
	l.bytes += size
}

// AddColdest records block id of size bytes as the least recently used block, unless it is
// tracked already (a later Add or Touch placed it: that wins). Loading a tier's blocks newest
// first with AddColdest rebuilds their write order behind whatever was added meanwhile, so the
// engine can fill recency in the background after Open.
func (l *LRU) AddColdest(id ID, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lookup(id) != 0 {
		return
	}
	i := l.alloc()
	n := l.node(i)
	n.id, n.size, n.state = id, size, nodeListed
	// Older than everything listed: the stamp just below the least recent one's.
	if last := l.node(0).prev; last != 0 {
		n.stamp = l.node(last).stamp - 1
	} else {
		n.stamp = l.clock
	}
	l.insertAfter(i, l.node(0).prev)
	l.insert(i)
	l.count++
	l.bytes += size
}

// Remove forgets block id (it left the tier). Its children, if any, stay tracked with their
// parent link cleared: they no longer protect id and id no longer waits for them. Unknown ids
// are ignored.
func (l *LRU) Remove(id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := l.lookup(id)
	if i == 0 {
		return
	}
	l.delete(i)
	n := l.node(i)
	if n.state == nodeListed {
		l.unlink(i)
	}
	l.count--
	l.bytes -= n.size
	l.dropParent(i)
	if n.nchild > 0 {
		// Children still point here; the node lives on, unreachable by id, until they go.
		n.state, n.size, n.pins, n.id = nodeDead, 0, 0, ID{}
		return
	}
	l.release(i)
}

// Touch makes each tracked id most recently used, in argument order (the last is the most
// recent). Unknown ids are ignored. O(1) per id.
func (l *LRU) Touch(ids ...ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if i := l.lookup(id); i != 0 {
			l.toFront(i)
		}
	}
}

// TouchChain records a prompt's prefix chain: chain[i] is the parent of chain[i+1]. For each
// adjacent pair of tracked ids it records the parent link (replacing an older, different
// parent; a link that would close a cycle is ignored), then makes the tracked ids most
// recently used with every parent more recent than its child. Untracked ids are skipped and
// break the chain: the ids on either side of one are not linked. O(1) per id.
func (l *LRU) TouchChain(chain []ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	idx := l.scratch[:0]
	for _, id := range chain {
		idx = append(idx, l.lookup(id))
	}
	for k := 1; k < len(idx); k++ {
		if p, c := idx[k-1], idx[k]; p != 0 && c != 0 && p != c {
			l.setParent(c, p)
		}
	}
	for k := len(idx) - 1; k >= 0; k-- {
		if idx[k] != 0 {
			l.toFront(idx[k])
		}
	}
	l.scratch = idx[:0]
}

// Pin protects block id (and, through the chain rule, its known ancestors) from Victims until
// a matching Unpin; pins nest (up to 65535; a block pinned more often stays pinned until
// removed). Unknown ids are ignored; a block removed while pinned loses its pins.
func (l *LRU) Pin(id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := l.lookup(id); i != 0 {
		if n := l.node(i); n.pins < maxPins {
			n.pins++
		}
	}
}

// Unpin releases one Pin of block id. Unpinning an unknown or unpinned id does nothing.
func (l *LRU) Unpin(id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := l.lookup(id)
	if i == 0 {
		return
	}
	n := l.node(i)
	if n.pins == 0 || n.pins == maxPins {
		return
	}
	n.pins--
	l.maybeUnpark(i)
}

// Victims returns blocks to evict to free at least bytes (all evictable blocks if they hold
// fewer), least recently used first, skipping pinned blocks, ancestors of pinned blocks, and
// any block with a known live child not returned before it in the same answer. It does not
// remove them: the engine calls Remove for each block it actually evicts, and until then a
// later Victims may return them again. Blocks Victims sets aside because they were pinned or
// had live children re-enter the order at their place by last use when released (last child
// removed, last pin dropped), found by a walk of at most 64 blocks from the least recent end.
// bytes <= 0 returns nil.
func (l *LRU) Victims(bytes int64) []ID {
	if bytes <= 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ID
	var freed int64
	var taken map[uint32]uint32 // node -> its children returned so far in this answer
	take := func(i uint32) {
		for {
			n := l.node(i)
			out = append(out, n.id)
			freed += n.size
			p := n.parent
			if p == 0 || freed >= bytes {
				return
			}
			pn := l.node(p)
			if pn.state == nodeDead {
				return
			}
			if taken == nil {
				taken = make(map[uint32]uint32)
			}
			taken[p]++
			// A parked parent lies behind the scan: take it now, it is older than anything left.
			// A listed one lies ahead and is taken when the scan reaches it.
			if pn.state != nodeParked || pn.pins > 0 || taken[p] < pn.nchild {
				return
			}
			i = p
		}
	}
	for i := l.node(0).prev; i != 0 && freed < bytes; {
		n := l.node(i)
		prev := n.prev
		if n.pins > 0 || (n.nchild > 0 && taken[i] < n.nchild) {
			l.unlink(i)
			n.state = nodeParked
		} else {
			take(i)
		}
		i = prev
	}
	return out
}

// Len returns the number of tracked blocks.
func (l *LRU) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// Bytes returns the sum of the sizes of the tracked blocks.
func (l *LRU) Bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes
}

// --- links and parking (all under mu) ---

// setParent links child c to parent p unless that would close a cycle.
func (l *LRU) setParent(c, p uint32) {
	cn := l.node(c)
	if cn.parent == p {
		return
	}
	// Only a node with children can be an ancestor of p; new leaves (the usual case) skip the walk.
	if cn.nchild > 0 {
		for a := p; a != 0; a = l.node(a).parent {
			if a == c {
				return
			}
		}
	}
	l.dropParent(c)
	cn.parent = p
	l.node(p).nchild++
}

// dropParent clears c's parent link and releases the parent if that was its last child.
func (l *LRU) dropParent(c uint32) {
	cn := l.node(c)
	p := cn.parent
	if p == 0 {
		return
	}
	cn.parent = 0
	pn := l.node(p)
	pn.nchild--
	if pn.state == nodeDead {
		if pn.nchild == 0 {
			l.release(p)
		}
		return
	}
	l.maybeUnpark(p)
}

// maybeUnpark puts a parked node that became evictable back in the list by its stamp. It was
// older than every unreturned listed node when Victims parked it and a use would have relisted
// it, so its place is near the least recent end: only nodes Victims returned but the engine has
// not removed yet, and other released nodes, can be older.
func (l *LRU) maybeUnpark(i uint32) {
	n := l.node(i)
	if n.state != nodeParked || n.pins != 0 || n.nchild != 0 {
		return
	}
	n.state = nodeListed
	j := l.node(0).prev
	for k := 0; j != 0 && k < unparkWalk && int32(l.node(j).stamp-n.stamp) < 0; k++ {
		j = l.node(j).prev
	}
	l.insertAfter(i, j)
}

// --- recency list ---

func (l *LRU) node(i uint32) *lruNode { return &l.slabs[i>>lruSlabShift][i&lruSlabMask] }

func (l *LRU) unlink(i uint32) {
	n := l.node(i)
	l.node(n.prev).next = n.next
	l.node(n.next).prev = n.prev
	n.prev, n.next = 0, 0
}

// insertAfter links node i into the list after node j (j = 0: as the most recent).
func (l *LRU) insertAfter(i, j uint32) {
	n, p := l.node(i), l.node(j)
	n.prev, n.next = j, p.next
	l.node(p.next).prev = i
	p.next = i
}

func (l *LRU) stamp(n *lruNode) {
	l.clock++
	n.stamp = l.clock
}

// toFront makes a tracked node the most recent, relisting it if it was parked.
func (l *LRU) toFront(i uint32) {
	n := l.node(i)
	l.stamp(n)
	if n.state == nodeListed {
		if l.node(0).next == i {
			return
		}
		l.unlink(i)
	}
	n.state = nodeListed
	l.insertAfter(i, 0)
}

// --- node storage ---

func (l *LRU) alloc() uint32 {
	if i := l.free; i != 0 {
		l.free = l.node(i).next
		l.node(i).next = 0
		return i
	}
	i := l.used
	if int(i>>lruSlabShift) == len(l.slabs) {
		l.slabs = append(l.slabs, new([lruSlab]lruNode))
	}
	l.used++
	return i
}

func (l *LRU) release(i uint32) {
	*l.node(i) = lruNode{next: l.free}
	l.free = i
}

// --- hash table: id -> node index ---

func lruHash(id *ID) uint64 {
	return mix64(binary.LittleEndian.Uint64(id[:8]) ^ mix64(binary.LittleEndian.Uint64(id[8:])))
}

func (l *LRU) lookup(id ID) uint32 {
	mask := uint64(len(l.table) - 1)
	for s := lruHash(&id) & mask; ; s = (s + 1) & mask {
		i := l.table[s]
		if i == 0 || l.node(i).id == id {
			return i
		}
	}
}

func (l *LRU) insert(i uint32) {
	if (l.count+1)*4 > len(l.table)*3 {
		l.grow()
	}
	l.place(i)
}

func (l *LRU) place(i uint32) {
	mask := uint64(len(l.table) - 1)
	s := lruHash(&l.node(i).id) & mask
	for l.table[s] != 0 {
		s = (s + 1) & mask
	}
	l.table[s] = i
}

func (l *LRU) grow() {
	old := l.table
	l.table = make([]uint32, 2*len(old))
	for _, i := range old {
		if i != 0 {
			l.place(i)
		}
	}
}

// delete removes node i from the table by backward-shift deletion (no tombstones).
func (l *LRU) delete(i uint32) {
	mask := uint64(len(l.table) - 1)
	s := lruHash(&l.node(i).id) & mask
	for l.table[s] != i {
		s = (s + 1) & mask
	}
	for {
		l.table[s] = 0
		j := s
		for {
			j = (j + 1) & mask
			k := l.table[j]
			if k == 0 {
				return
			}
			home := lruHash(&l.node(k).id) & mask
			// k may move to the hole at s unless its home lies cyclically in (s, j].
			if (s < j && s < home && home <= j) || (s > j && (s < home || home <= j)) {
				continue
			}
			l.table[s] = k
			s = j
			break
		}
	}
}
