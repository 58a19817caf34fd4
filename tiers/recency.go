package tiers

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
)

// Recency is the recency of one disk tier's segments, held in memory only (a hit costs no
// write): per segment, a stamp of the last time one of its records was written or loaded, how
// many reads pin it, and a bit per record slot loaded since eviction last chose it. Eviction
// takes whole segments, least recently used first (Order), keeping the blocks loaded since
// (TakeLoaded), so it keeps no per-block state beyond that bit: its memory is a map entry per
// segment (about 60 bytes) and, for a segment loaded from, a bit per record slot. Safe for concurrent use; every method takes one mutex for a
// short time (Order: proportional to the segments it sorts).
//
// Stamps come from one process-wide clock (NextStamps), so the stamps a load reserves for its
// blocks before it knows their tiers order like any other. A segment not used since Open has
// stamp 0 and is older than every segment used since; segments of equal stamp (the unused
// ones) order by number, which is write order: recency is not kept across restarts.
//
// Only segments the tier knows (Track, Written, Inherit) are touched or pinned: a touch or pin of a
// segment forgotten meanwhile (retired) is ignored, so none comes back.
//
// A nil *Recency is a tier that keeps none: its methods do nothing and Order sorts by number
// (write order) without pins.
type Recency struct {
	mu   sync.Mutex
	segs map[uint64]segUse
}

type segUse struct {
	stamp uint64
	pins  uint32 // reads in flight; saturates at maxPins and then stays pinned
	// loaded has bit s set when a block in slot s was loaded since the segment was last
	// chosen for eviction (TakeLoaded); allocated at the first load.
	loaded Slots
}

// Slots is a set of a segment's record slots (a hint: distinct records may share a slot).
// A slot is the caller's: the engine uses a record's offset in whole-block record sizes plus
// its place in a batch record, so a segment of n blocks needs about n bits.
type Slots []uint64

// MaxSlot bounds the slots a Recency marks (a larger one is not marked): 2^20 bits, 128 KiB a
// segment at most.
const MaxSlot = 1<<20 - 1

// Has reports whether slot s is in the set.
func (s Slots) Has(slot uint64) bool {
	return slot/64 < uint64(len(s)) && s[slot/64]&(1<<(slot%64)) != 0
}

func (s Slots) with(slot uint64) Slots {
	if slot > MaxSlot {
		return s
	}
	if w := int(slot / 64); w >= len(s) {
		s = append(s, make([]uint64, w+1-len(s))...)
	}
	s[slot/64] |= 1 << (slot % 64)
	return s
}

// maxPins is the most nested pins a segment counts; a segment pinned that often stays pinned
// until forgotten.
const maxPins = 1<<32 - 1

// stampClock is the source of every Recency's stamps (0 is never handed out).
var stampClock atomic.Uint64

// NextStamps reserves n consecutive stamps, newer than every stamp handed out before, and
// returns the first: a load of n blocks gives block i the stamp first+n-1-i, so that a
// prompt's prefix (ids in chain order) leaves its parents at least as recent as their children.
func NextStamps(n int) uint64 {
	return stampClock.Add(uint64(max(n, 1))) - uint64(max(n, 1)) + 1
}

// NewRecency returns an empty Recency.
func NewRecency() *Recency { return &Recency{segs: make(map[uint64]segUse)} }

// Track makes segment n known, as not used since Open (stamp 0), unless it is known already.
// The engine tracks every segment of the tier at Open.
func (r *Recency) Track(n uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.segs[n]; !ok {
		r.segs[n] = segUse{}
	}
}

// Written records that records were just written into segment n (tracking it if need be): it
// becomes the most recently used segment.
func (r *Recency) Written(n uint64) {
	if r == nil {
		return
	}
	s := NextStamps(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.segs[n]
	u.stamp = max(u.stamp, s)
	r.segs[n] = u
}

// Touch records a load, at stamp (from NextStamps), of the block in slot of segment n: the
// segment's stamp becomes the later of the two, and the slot is marked loaded (TakeLoaded).
// Unknown segments are ignored.
func (r *Recency) Touch(n, slot, stamp uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if u, ok := r.segs[n]; ok {
		u.use(slot, stamp)
		r.segs[n] = u
	}
}

// use records a load at stamp of the block in slot: the stamp becomes the later of the two,
// and the slot is marked loaded.
func (u *segUse) use(slot, stamp uint64) {
	u.stamp = max(u.stamp, stamp)
	u.loaded = u.loaded.with(slot)
}

// TakeLoaded returns the slots of segment n loaded since the last TakeLoaded (Touch, Unpin)
// and forgets them: eviction, having chosen n, keeps the blocks in them (rewrites them
// forward) and evicts the rest, and a block kept must be loaded again to be kept again.
func (r *Recency) TakeLoaded(n uint64) Slots {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	u, ok := r.segs[n]
	if !ok {
		return nil
	}
	s := u.loaded
	u.loaded = nil
	r.segs[n] = u
	return s
}

// Inherit records that records of segment src were just compacted into segment dst (tracking
// dst if need be): dst's stamp becomes the later of its own and src's, so the records keep
// their recency.
func (r *Recency) Inherit(dst, src uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.segs[dst]
	d.stamp = max(d.stamp, r.segs[src].stamp)
	r.segs[dst] = d
}

// Pin keeps segment n out of Order until a matching Unpin (a read of one of its blocks is in
// flight). Pins nest. Unknown segments are ignored.
func (r *Recency) Pin(n uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if u, ok := r.segs[n]; ok && u.pins < maxPins {
		u.pins++
		r.segs[n] = u
	}
}

// Unpin releases one Pin of segment n and, with stamp > 0 (the read that pinned it loaded the
// block in slot), touches it (Touch). Unknown segments are ignored; unpinned ones only get the
// touch.
func (r *Recency) Unpin(n, slot, stamp uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	u, ok := r.segs[n]
	if !ok {
		return
	}
	if u.pins > 0 && u.pins < maxPins {
		u.pins--
	}
	if stamp > 0 {
		u.use(slot, stamp)
	}
	r.segs[n] = u
}

// Forget drops segment n (retired): later touches and pins of it are ignored.
func (r *Recency) Forget(n uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.segs, n)
}

// Order sorts segs least recently used first (by stamp, then by number) and returns them
// without the pinned ones (reusing segs' array). Segments it does not know count as not used
// since Open.
func (r *Recency) Order(segs []uint64) []uint64 {
	if r == nil {
		slices.Sort(segs)
		return segs
	}
	type use struct {
		n     uint64
		stamp uint64
	}
	uses := make([]use, 0, len(segs))
	r.mu.Lock()
	for _, n := range segs {
		u := r.segs[n]
		if u.pins == 0 {
			uses = append(uses, use{n, u.stamp})
		}
	}
	r.mu.Unlock()
	slices.SortFunc(uses, func(a, b use) int {
		if c := cmp.Compare(a.stamp, b.stamp); c != 0 {
			return c
		}
		return cmp.Compare(a.n, b.n)
	})
	segs = segs[:0]
	for _, u := range uses {
		segs = append(segs, u.n)
	}
	return segs
}

// Len returns the number of segments known.
func (r *Recency) Len() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.segs)
}
