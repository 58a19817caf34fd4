package index

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/ucm-go/ucm/format"
)

// TestMemberTableModel: random adds, removes and sidecar kinds against an exact model, with ids
// drawn from a small set of fingerprints so that many share one. The table never misses a
// listed block or kind (a superset), is exact where fingerprints do not collide, and keeps its
// slot count equal to the model's block count through growth and the reclaiming of removed
// slots.
func TestMemberTableModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	idOf := func(n int) format.BlockID {
		var id format.BlockID
		fp := uint64(n) // most fingerprints unique; the ids from 1,000 share 300 of them
		if n >= 1000 {
			fp = uint64(n % 300)
		}
		binary.LittleEndian.PutUint64(id[:8], fp)
		binary.LittleEndian.PutUint64(id[8:], uint64(n))
		return id
	}
	tab := newMemberTable(0)
	model := map[format.BlockID]uint64{} // id -> kinds (bit 0: unused)
	shared := map[uint64]bool{}          // fingerprints ever held by two blocks at once
	kinds := []format.SidecarKind{1, 3, 7, 8, 63}
	for step := 0; step < 200000; step++ {
		id := idOf(r.IntN(2000))
		fp := fingerprint(id)
		_, present := model[id]
		switch op := r.IntN(10); {
		case op < 5 && !present:
			tab.add(fp)
			model[id] = 0
			for other := range model {
				if other != id && fingerprint(other) == fp {
					shared[fp] = true
				}
			}
		case op < 7 && present:
			tab.remove(fp)
			delete(model, id)
		case op < 9 && present:
			k := kinds[r.IntN(len(kinds))]
			tab.setKind(fp, k)
			model[id] |= 1 << k
		case present:
			k := kinds[r.IntN(len(kinds))]
			if model[id]&(1<<k) != 0 {
				tab.clearKind(fp, k)
				model[id] &^= 1 << k
			}
		}
		if step%5000 == 0 || step == 199999 {
			checkMemberTable(t, tab, model, shared)
		}
	}
}

func checkMemberTable(t *testing.T, tab *memberTable, model map[format.BlockID]uint64, shared map[uint64]bool) {
	t.Helper()
	if tab.live != len(model) {
		t.Fatalf("%d live slots for %d blocks", tab.live, len(model))
	}
	union := map[uint64]uint64{}
	holders := map[uint64]int{}
	for id, k := range model {
		union[fingerprint(id)] |= k
		holders[fingerprint(id)]++
	}
	for fp, want := range union {
		if !tab.has(fp) {
			t.Fatalf("fingerprint %#x of a listed block is missing", fp)
		}
		got := tab.kindsOf(fp)
		if got&want != want {
			t.Fatalf("fingerprint %#x: kinds %#x lack %#x", fp, got, want)
		}
		if !shared[fp] && got != want {
			t.Fatalf("fingerprint %#x never shared: kinds %#x, want exactly %#x", fp, got, want)
		}
	}
	n := 0
	for i, fp := range tab.fps {
		if fp > deadSlot {
			n++
			if union[fp] == 0 && holders[fp] == 0 {
				t.Fatalf("slot %d holds fingerprint %#x of no block", i, fp)
			}
		}
	}
	if n != tab.live {
		t.Fatalf("%d occupied slots, live says %d", n, tab.live)
	}
	if fill := float64(tab.live+tab.dead) / float64(len(tab.fps)); fill > maxLoad {
		t.Fatalf("fill %.2f above %.2f", fill, maxLoad)
	}
}

// TestMemberTableUniqueIDs: with uniformly random ids (MD5 hashes), the table is exact, every
// absent id is reported absent, and it holds at most 16 bytes a block at every size, including
// right after it grew.
func TestMemberTableUniqueIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	tab := newMemberTable(0)
	var ids []format.BlockID
	for n := 1; n <= 300000; n++ {
		var id format.BlockID
		binary.LittleEndian.PutUint64(id[:8], r.Uint64())
		binary.LittleEndian.PutUint64(id[8:], r.Uint64())
		ids = append(ids, id)
		tab.add(fingerprint(id))
		if n >= 1000 && tab.bytes() > 16*int64(n) {
			t.Fatalf("%d blocks: %d bytes, %.1f a block", n, tab.bytes(), float64(tab.bytes())/float64(n))
		}
	}
	for _, id := range ids {
		if !tab.has(fingerprint(id)) {
			t.Fatalf("block %x missing", id)
		}
	}
	for i := 0; i < 100000; i++ {
		var id format.BlockID
		binary.LittleEndian.PutUint64(id[:8], r.Uint64())
		if tab.has(fingerprint(id)) {
			t.Fatalf("absent id %x reported present", id)
		}
	}
	// Remove nine in ten: the dead slots are reclaimed, the rest still found.
	for i, id := range ids {
		if i%10 != 0 {
			tab.remove(fingerprint(id))
		}
	}
	for i, id := range ids {
		if got := tab.has(fingerprint(id)); got != (i%10 == 0) {
			t.Fatalf("block %d: present %v after removing nine in ten", i, got)
		}
	}
	if per := float64(tab.bytes()) / float64(tab.live); per > 40 {
		t.Fatalf("%.1f bytes a block after removals: dead slots not reclaimed", per)
	}
	if bits.OnesCount64(uint64(tab.sidecars())) != 0 {
		t.Fatalf("%d sidecars listed, none set", tab.sidecars())
	}
}

// BenchmarkMembershipLookup: a 1,024-id batch, half present, against 2,000,000 blocks: the
// table beside a Go map of the ids (what the membership was), in the same run.
func BenchmarkMembershipLookup(b *testing.B) {
	const n = 2_000_000
	r := rand.New(rand.NewPCG(5, 6))
	ids := make([]format.BlockID, n)
	tab := newMemberTable(n)
	set := make(map[format.BlockID]struct{}, n)
	for i := range ids {
		binary.LittleEndian.PutUint64(ids[i][:8], r.Uint64())
		binary.LittleEndian.PutUint64(ids[i][8:], r.Uint64())
		tab.add(fingerprint(ids[i]))
		set[ids[i]] = struct{}{}
	}
	batch := make([]format.BlockID, 1024)
	for i := range batch {
		if i%2 == 0 {
			batch[i] = ids[r.IntN(n)]
		} else {
			binary.LittleEndian.PutUint64(batch[i][:8], r.Uint64())
		}
	}
	b.Run("table", func(b *testing.B) {
		hits := 0
		for range b.N {
			for _, id := range batch {
				if tab.has(fingerprint(id)) {
					hits++
				}
			}
		}
		if hits != 512*b.N {
			b.Fatalf("%d hits", hits)
		}
	})
	b.Run("map", func(b *testing.B) {
		hits := 0
		for range b.N {
			for _, id := range batch {
				if _, ok := set[id]; ok {
					hits++
				}
			}
		}
		if hits != 512*b.N {
			b.Fatalf("%d hits", hits)
		}
	})
}
