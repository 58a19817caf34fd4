package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// sealShared seals e's active segments (its writer's and its relocation writer's) and kicks
// publication.
func sealShared(t *testing.T, e *Engine) {
	t.Helper()
	for _, w := range []*wal.Writer{e.tiers[0].Writer(false), e.tiers[0].Writer(true)} {
		if w != nil {
			if err := w.SealOlderThan(time.Nanosecond); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.share.Kick()
}

// foreignKnown reports whether e's foreign index holds segment n of instance inst.
func foreignKnown(e *Engine, inst format.InstanceID, n uint64) bool {
	return e.share.HasAlias(inst, n)
}

// foreignHome returns the owner and segment number of the foreign index's entry of id.
func foreignHome(t *testing.T, e *Engine, id BlockID) (format.InstanceID, uint64) {
	t.Helper()
	loc, ok := e.share.Get(id)
	fs, known := e.share.ForeignSegment(loc.Segment)
	if !ok || !known {
		t.Fatalf("block %s not in the foreign index", id)
	}
	return fs.Instance, fs.Number
}

// TestSharedTierForeignMovedBlock: a block another instance holds in two published segments
// at once — its owner moved it (relocation, as compaction and demotion do) into a new segment
// before retiring the old one, or two owners stored it — stays a hit in B after the segment B's
// entry pointed into is retired, and loads byte-exact with its sidecar from the copy still
// listed. Before the foreign index remembered the other copies, B kept only the first one it
// indexed and lost the block for good when that segment left the manifest. Entries still never
// outlive their segment: blocks only the retired segment held are misses, and the block goes
// once its last listed copy is retired.
func TestSharedTierForeignMovedBlock(t *testing.T) {
	for _, c := range []struct {
		name   string
		reopen bool // B restarts between indexing both copies and the retirement
		damage bool // B's load finds its copy damaged (and drops the entry) before the retirement
		owners int  // 1: the owner moved the block; 2: two owners stored it
	}{{"moved", false, false, 1}, {"moved, B reopened", true, false, 1}, {"moved, first copy damaged", false, true, 1}, {"two owners", false, false, 2}} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			shared, sharedB := sharedDirs(t)
			x := blockID(100)
			side := []BlockID{x}
			owners := make([]*Engine, c.owners)
			fills := make([][]BlockID, c.owners)
			for i := range owners {
				owners[i] = mustOpen(t, filepath.Join(root, fmt.Sprint("owner", i)), sharedOptions(shared, time.Hour))
				defer func() { _ = owners[i].Close() }()
				fills[i] = ids(10*i, 10*i+6)
				dumpBlocks(t, owners[i], append(fills[i], x))
				dumpSidecars(t, owners[i], 8, side)
				sealShared(t, owners[i])
			}
			allIDs := append(slices.Concat(fills...), x)
			bOpts := sharedOptions(sharedB, time.Hour)
			b := mustOpen(t, filepath.Join(root, "b"), bOpts)
			defer func() { _ = b.Close() }()
			waitFor(t, "the owners' blocks visible in B", func() bool {
				return allHit(b, allIDs) && countTrue(b.HasSidecars(8, side)) == 1
			})

			var first *Engine // the owner of the copy B's entry points at
			var firstSeg uint64
			if c.owners == 1 {
				a := owners[0]
				loc, _, _ := a.ix.Get(x)
				refs := []recordRef{{id: x, loc: loc}}
				refs = append(refs, a.sidecarsOf(refs, nil)...)
				if moved, _, _, err := a.relocate(refs, a.tiers[0]); err != nil || moved != 2 {
					t.Fatalf("relocate: %d records moved, %v; want the block and its sidecar", moved, err)
				}
				moved, _, _ := a.ix.Get(x)
				if moved.Segment == loc.Segment {
					t.Fatal("relocation left the block in its segment")
				}
				sealShared(t, a)
				waitFor(t, "B indexes the segment the block moved to", func() bool { return foreignKnown(b, a.instance, moved.Segment) })
				first, firstSeg = a, loc.Segment
			} else {
				inst, n := foreignHome(t, b, x)
				for _, o := range owners {
					if o.instance == inst {
						first, firstSeg = o, n
					}
				}
			}
			if inst, n := foreignHome(t, b, x); inst != first.instance || n != firstSeg {
				t.Fatalf("B's entry of the block is in segment %d of %x, want the first copy (segment %d of %x)", n, inst, firstSeg, first.instance)
			}
			if c.reopen {
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				b = mustOpen(t, filepath.Join(root, "b"), bOpts)
			}
			if c.damage {
				// Damaged in place (a file B has open): B's load drops its entry; the block is a
				// miss until the damaged segment is dropped and the copy takes its place.
				damageForeignBlock(t, b, x)
				if _, err := loadOne(b, x); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("load of the damaged copy: %v, want ErrCorrupt", err)
				}
				if b.Lookup(side)[0] {
					t.Fatal("the damaged copy's entry is still indexed")
				}
			}

			// The owner of B's copy retires that segment; B drops it at its next refresh.
			dropped := b.share.Stats().SegmentsDropped
			if err := first.evictSegment(first.tiers[0], firstSeg); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "B drops the retired segment", func() bool {
				return b.share.Stats().SegmentsDropped > dropped && !foreignKnown(b, first.instance, firstSeg)
			})
			if !allHit(b, side) || countTrue(b.HasSidecars(8, side)) != 1 {
				t.Fatalf("B lost the block (hit %v, sidecars %v) although a listed segment holds it", b.Lookup(side), b.HasSidecars(8, side))
			}
			checkBlocks(t, b, side)
			checkSidecars(t, b, 8, side, nil)
			if inst, n := foreignHome(t, b, x); inst == first.instance && n == firstSeg {
				t.Fatal("B's entry still points into the retired segment")
			}
			// What only the retired segment held is gone from B as from its owner.
			for i, o := range owners {
				if got, want := b.Lookup(fills[i]), o.Lookup(fills[i]); !slices.Equal(got, want) {
					t.Fatalf("owner %d's other blocks: B hits %v, the owner %v", i, got, want)
				}
			}

			// Once every listed copy is retired, the block is a miss in B, and its sidecar too.
			held := 0
			for _, o := range owners {
				loc, ok, err := o.ix.Get(x)
				if err != nil || !ok {
					continue // the first copy's owner
				}
				held++
				if err := o.evictSegment(o.tiers[0], loc.Segment); err != nil {
					t.Fatal(err)
				}
			}
			if held != 1 {
				t.Fatalf("%d owners still hold the block, want 1", held)
			}
			waitFor(t, "the block gone from B", func() bool {
				return !b.Lookup(side)[0] && countTrue(b.HasSidecars(8, side)) == 0
			})
		})
	}
}

// damageForeignBlock overwrites the start of block id's first shard in the segment file of
// another instance that e's foreign index points at, in place (a file e may have open).
func damageForeignBlock(t *testing.T, e *Engine, id BlockID) {
	t.Helper()
	loc, ok := e.share.Get(id)
	fs, known := e.share.ForeignSegment(loc.Segment)
	if !ok || !known {
		t.Fatalf("block %s not in the foreign index", id)
	}
	f, err := os.OpenFile(wal.SegmentPath(fs.Dir, fs.Number), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(bytes.Repeat([]byte{0xa5}, 64), loc.ShardOffset(0))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}
