package index

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"

	"github.com/ucm-go/ucm/format"
)

// memberTable is the in-memory membership of the index's entries: which block ids have an
// entry, and which sidecar kinds each has. It answers exact and prefix lookups with a hash
// probe instead of a Pebble seek, and lets Apply skip the Pebble read of an entry it proves
// absent.
//
// It stores a 64-bit fingerprint per block (the id's first 8 bytes: ids are MD5 hashes, so
// uniform) and a byte of sidecar kinds, about 9 bytes a slot, in buckets of 8 slots (one cache
// line of fingerprints) probed linearly, kept between 60 % and 90 % full: 10–15 bytes a block
// where a Go map of 16-byte ids takes 40–50.
//
// A fingerprint is not the id, so the table is a superset, never a subset:
//   - It is a multiset: every block with an entry has a slot of its fingerprint (add and
//     remove are called exactly once per entry that comes and goes: Apply knows from Pebble
//     which), so an id whose fingerprint is absent has no entry (no false negatives).
//   - Two ids with the same fingerprint (probability about n/2^64 for a lookup among n blocks,
//     more for MD5 prefixes crafted to collide) make a lookup of the absent one report it
//     present; the load that follows finds no entry in Pebble (keyed by the whole id) and
//     misses. Bytes are never served for the wrong id, and Apply reads Pebble for every entry
//     the table lists.
//   - A fingerprint's sidecar kinds are the union over its slots (kinds is a superset too): a
//     kind is cleared only when one slot holds the fingerprint, and a removed slot's kinds move
//     to another slot of the same fingerprint.
//
// Kinds 1–7 live in the slot's byte; kinds 8–63 (none defined today) in a map by fingerprint.
// Not safe for concurrent use: the Index guards it with members.
type memberTable struct {
	fps   []uint64 // bucketSlots per bucket; emptySlot, deadSlot, or a fingerprint
	kinds []uint8  // beside fps: bit k is sidecar kind k (1..7)
	high  map[uint64]uint64
	nb    uint64 // buckets
	live  int    // slots holding a fingerprint
	dead  int    // deadSlot slots (removed; probing goes on past them)
	seed  uint64 // mixed into the bucket choice: crafted ids cannot pile into one bucket
}

const (
	bucketSlots = 8
	emptySlot   = 0 // never used: a probe stops at a bucket with one
	deadSlot    = 1 // removed: a probe goes on, an add may reuse it
	// maxLoad is the fill (live and dead slots) at which the table grows; growLoad the fill it
	// grows to: 9 bytes a slot / 0.6 = 15 bytes a block at most just after growing.
	maxLoad  = 0.9
	growLoad = 0.6
	// lowKinds are the kinds kept in a slot's byte.
	lowKinds = 8
)

// fingerprint returns id's fingerprint: its first 8 bytes, off the two reserved values.
func fingerprint(id format.BlockID) uint64 {
	fp := binary.LittleEndian.Uint64(id[:8])
	if fp <= deadSlot {
		fp += 2
	}
	return fp
}

// newMemberTable returns a table with room for about n blocks before it grows.
func newMemberTable(n int) *memberTable {
	t := &memberTable{seed: rand.Uint64() | 1}
	t.resize(n)
	return t
}

// resize rebuilds the table with room for n live slots at growLoad (at least one bucket),
// dropping the dead ones.
func (t *memberTable) resize(n int) {
	nb := uint64(float64(max(n, t.live))/growLoad/bucketSlots) + 1
	old, oldKinds := t.fps, t.kinds
	t.fps, t.kinds, t.nb, t.live, t.dead = make([]uint64, nb*bucketSlots), make([]uint8, nb*bucketSlots), nb, 0, 0
	for i, fp := range old {
		if fp > deadSlot {
			t.place(fp, oldKinds[i])
		}
	}
}

// bucket returns the first bucket fp's probe visits.
func (t *memberTable) bucket(fp uint64) uint64 {
	hi, _ := bits.Mul64((fp^t.seed)*0x9e3779b97f4a7c15, t.nb)
	return hi
}

// find calls fn with the index of every slot holding fp, in probe order, until fn returns
// false or the probe reaches a bucket with an empty slot (past which fp cannot be).
func (t *memberTable) find(fp uint64, fn func(i int) bool) {
	b := t.bucket(fp)
	for range t.nb {
		base := int(b) * bucketSlots
		empty := false
		for i := base; i < base+bucketSlots; i++ {
			switch t.fps[i] {
			case fp:
				if !fn(i) {
					return
				}
			case emptySlot:
				empty = true
			}
		}
		if empty {
			return
		}
		if b++; b == t.nb {
			b = 0
		}
	}
}

// has reports whether a slot holds fp.
func (t *memberTable) has(fp uint64) bool {
	found := false
	t.find(fp, func(int) bool { found = true; return false })
	return found
}

// kindsOf returns the union of fp's sidecar kinds (bit k: kind k).
func (t *memberTable) kindsOf(fp uint64) uint64 {
	var k uint64
	t.find(fp, func(i int) bool { k |= uint64(t.kinds[i]); return true })
	return k | t.high[fp]
}

// add adds a slot for fp (a block entry that did not exist), growing the table first if it is
// full.
func (t *memberTable) add(fp uint64) {
	if float64(t.live+t.dead+1) > maxLoad*float64(len(t.fps)) {
		t.resize(t.live + 1)
	}
	t.place(fp, 0)
}

// place puts fp with kinds in the first empty or dead slot of its probe; the table has room.
func (t *memberTable) place(fp uint64, kinds uint8) {
	b := t.bucket(fp)
	for {
		base := int(b) * bucketSlots
		for i := base; i < base+bucketSlots; i++ {
			if s := t.fps[i]; s == emptySlot || s == deadSlot {
				if s == deadSlot {
					t.dead--
				}
				t.fps[i], t.kinds[i] = fp, kinds
				t.live++
				return
			}
		}
		if b++; b == t.nb {
			b = 0
		}
	}
}

// remove removes one slot of fp (a block entry that went). Its kinds go to another slot of fp
// if there is one; else fp's high kinds go too.
func (t *memberTable) remove(fp uint64) {
	var slots []int
	t.find(fp, func(i int) bool { slots = append(slots, i); return len(slots) < 2 })
	if len(slots) == 0 {
		return // not listed: nothing to remove (the caller's bookkeeping keeps this from happening)
	}
	i := slots[0]
	if len(slots) > 1 {
		t.kinds[slots[1]] |= t.kinds[i]
	} else {
		delete(t.high, fp)
	}
	t.fps[i], t.kinds[i] = deadSlot, 0
	t.live--
	t.dead++
	if t.dead > t.live && float64(t.dead) > 0.25*float64(len(t.fps)) {
		t.resize(t.live) // mostly removed: reclaim the dead slots
	}
}

// setKind records sidecar kind k for fp, which has a slot (the block's).
func (t *memberTable) setKind(fp uint64, k format.SidecarKind) {
	if k >= lowKinds {
		if t.high == nil {
			t.high = map[uint64]uint64{}
		}
		t.high[fp] |= 1 << k
		return
	}
	t.find(fp, func(i int) bool { t.kinds[i] |= 1 << k; return false })
}

// clearKind forgets sidecar kind k of fp, unless another slot holds fp (a fingerprint shared by
// two blocks keeps the union of their kinds).
func (t *memberTable) clearKind(fp uint64, k format.SidecarKind) {
	var slots []int
	t.find(fp, func(i int) bool { slots = append(slots, i); return len(slots) < 2 })
	if len(slots) != 1 {
		return
	}
	if k >= lowKinds {
		if h := t.high[fp] &^ (1 << k); h != 0 {
			t.high[fp] = h
		} else {
			delete(t.high, fp)
		}
		return
	}
	t.kinds[slots[0]] &^= 1 << k
}

// sidecars returns the number of sidecar kinds listed over all slots.
func (t *memberTable) sidecars() int {
	n := 0
	for i, fp := range t.fps {
		if fp > deadSlot {
			n += bits.OnesCount8(t.kinds[i])
		}
	}
	for _, h := range t.high {
		n += bits.OnesCount64(h)
	}
	return n
}

// bytes returns the memory the table holds.
func (t *memberTable) bytes() int64 {
	return int64(len(t.fps))*9 + int64(len(t.high))*48
}
