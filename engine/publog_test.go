package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// logOnlyOptions: a shared tier whose manifests never make a block visible within a test (no
// refresh, no aged seal): only the publication logs can.
func logOnlyOptions(root string) Options {
	o := sharedOptions(root, time.Hour)
	o.SegmentSize = 64 << 20
	o.SharedRefreshInterval = time.Hour
	o.SharedOwnerTimeout = 4 * time.Hour
	o.SharedSealAge = time.Hour
	return o
}

// TestSharedReadYourWrites: once a dump's Wait returned in one instance, another instance on
// the same host finds the blocks at once — Lookup, LookupPrefix and Load, byte-exact — with no
// refresh and no seal in between; so does an instance opened after the dump. Once the segment
// is sealed and its manifest read, the blocks are served from the foreign index and the
// overlay forgets them.
func TestSharedReadYourWrites(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	a := mustOpen(t, filepath.Join(root, "a"), logOnlyOptions(shared))
	b := mustOpen(t, filepath.Join(root, "b"), logOnlyOptions(shared))
	defer b.Close()
	for lo := 0; lo < 40; lo += 8 {
		batch := ids(lo, lo+8)
		if hits := b.Lookup(batch); hits[0] {
			t.Fatalf("block %d found before its dump", lo)
		}
		dumpBlocks(t, a, batch)
		if !allHit(b, batch) {
			t.Fatalf("blocks %d..%d not found by the other instance right after the dump's Wait", lo, lo+8)
		}
	}
	all := ids(0, 40)
	if n := b.LookupPrefix(append(all, blockID(999))); n != len(all) {
		t.Fatalf("LookupPrefix = %d, want %d", n, len(all))
	}
	checkBlocks(t, b, all)
	// Loads without a lookup first, into an instance that never saw the blocks.
	more := ids(40, 48)
	dumpBlocks(t, a, more)
	checkBlocks(t, b, more)
	c := mustOpen(t, filepath.Join(root, "c"), logOnlyOptions(shared))
	checkBlocks(t, c, append(all, more...))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats().Sharing; st.LogRecords != 48 || st.SegmentsIndexed != 0 {
		t.Fatalf("sharing stats %+v: want 48 blocks learned from the log, no segment indexed", st)
	}

	// A's Close seals and publishes its segment; an instance that reads manifests indexes it
	// and forgets what the log told it.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	o := sharedOptions(shared, time.Hour)
	o.SegmentSize = 64 << 20
	d := mustOpen(t, filepath.Join(root, "d"), o)
	defer d.Close()
	waitFor(t, "A's segment indexed from its manifest", func() bool { return d.Stats().Sharing.SegmentsIndexed > 0 })
	checkBlocks(t, d, append(all, more...))
	left := d.share.OverlaySize()
	if left != 0 {
		t.Fatalf("%d blocks still in the overlay after their segment was indexed", left)
	}
}

// TestPublogDamagedOrLying: a log torn in the middle is used up to the damage and no further
// (no panic, no error for the caller); a log that names wrong places makes loads fail their
// checks (ErrCorrupt or ErrNotFound), never return another block's bytes.
func TestPublogDamagedOrLying(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	a := mustOpen(t, filepath.Join(root, "a"), logOnlyOptions(shared))
	defer a.Close()
	first, second := ids(0, 4), ids(4, 8)
	dumpBlocks(t, a, first)
	dumpBlocks(t, a, second)
	nsDir := tiers.NamespaceDir(shared, a.instance)
	seqs, err := tiers.PublogNames(vfs.Default, nsDir)
	if err != nil || len(seqs) != 1 {
		t.Fatalf("logs %v, %v", seqs, err)
	}
	path := filepath.Join(nsDir, tiers.PublogName(seqs[0]))
	log, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, n1, err := format.DecodePublogEntry(log[format.PublogHeaderSize:])
	if err != nil {
		t.Fatal(err)
	}

	// Damage the second entry (A appends no more).
	damaged := append([]byte(nil), log...)
	damaged[format.PublogHeaderSize+n1+20] ^= 0xff
	writeLog(t, nsDir, seqs[0], damaged)
	b := mustOpen(t, filepath.Join(root, "b"), logOnlyOptions(shared))
	if !allHit(b, first) {
		t.Fatal("blocks before the damage not found")
	}
	for i, h := range b.Lookup(second) {
		if h {
			t.Fatalf("block %d after the damage found", i)
		}
	}
	checkBlocks(t, b, first)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	// A log that swaps the locations of two blocks.
	ent, _, _ := format.DecodePublogEntry(log[format.PublogHeaderSize:])
	recs := append([]format.PublogRecord(nil), ent.Records...)
	recs[0].Location, recs[1].Location = recs[1].Location, recs[0].Location
	lying := append([]byte(nil), log[:format.PublogHeaderSize]...)
	if lying, err = format.AppendPublogRecords(lying, ent.Segment, ent.Generation, recs); err != nil {
		t.Fatal(err)
	}
	writeLog(t, nsDir, seqs[0], lying)
	c := mustOpen(t, filepath.Join(root, "c"), logOnlyOptions(shared))
	defer c.Close()
	dst := [][]byte{make([]byte, c.Layout().BlockBytes()), make([]byte, c.Layout().BlockBytes())}
	task := c.Load(first[:2], dst)
	_ = task.Wait()
	for i, err := range task.BlockErrors() {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotFound) {
			t.Fatalf("block %d loaded through a lying log: %v", i, err)
		}
	}
	checkBlocks(t, c, first[2:]) // the entries the log got right still serve
}

// writeLog writes a log file of sequence seq in nsDir with src's entries under a header of
// that sequence.
func writeLog(t *testing.T, nsDir string, seq uint64, src []byte) {
	t.Helper()
	h, err := format.DecodePublogHeader(src)
	if err != nil {
		t.Fatal(err)
	}
	h.Sequence = seq
	out := append(format.EncodePublogHeader(h), src[format.PublogHeaderSize:]...)
	if err := os.WriteFile(filepath.Join(nsDir, tiers.PublogName(seq)), out, 0o640); err != nil {
		t.Fatal(err)
	}
}

// TestPublogRotationUnderLoad: the writer seals a small segment every few dumps, so its log is
// continued in a new one at nearly every manifest; a reader that never reads manifests (its
// refresh is an hour away) still finds every block right after its dump, through the
// continuations, and the writer keeps only a few logs on disk.
func TestPublogRotationUnderLoad(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	oa := sharedOptions(shared, time.Second)
	oa.SharedSealAge = 50 * time.Millisecond
	oa.SharedRefreshInterval = 20 * time.Millisecond
	a := mustOpen(t, filepath.Join(root, "a"), oa)
	defer a.Close()
	b := mustOpen(t, filepath.Join(root, "b"), logOnlyOptions(shared))
	defer b.Close()
	for lo := 0; lo < 1600; lo += 4 {
		batch := ids(lo, lo+4)
		dumpBlocks(t, a, batch)
		if !allHit(b, batch) {
			t.Fatalf("blocks %d..%d not found right after their dump (hits %v)", lo, lo+4, b.Lookup(batch))
		}
		if lo%400 == 200 {
			// An instance that starts now reads the logs still on disk, retired ones too, and
			// indexes what the manifests list (in the background: once that is done, blocks of
			// segments listed longer than the logs' carry are hits too).
			c := mustOpen(t, filepath.Join(root, fmt.Sprintf("c%d", lo)), logOnlyOptions(shared))
			waitFor(t, "the new instance's first indexing", func() bool {
				st := c.Stats().Sharing
				return st.SegmentsListed > 0 && st.ForeignSegments == st.SegmentsListed
			})
			hits := c.Lookup(ids(lo-40, lo+4))
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			for i, h := range hits {
				if !h {
					t.Fatalf("a new instance misses block %d, dumped just before it opened", lo-40+i)
				}
			}
		}
	}
	if a.Stats().Sharing.ManifestsPublished < 10 {
		t.Fatalf("only %d manifests published: the test did not rotate the log", a.Stats().Sharing.ManifestsPublished)
	}
	seqs, err := tiers.PublogNames(vfs.Default, tiers.NamespaceDir(shared, a.instance))
	if err != nil || len(seqs) == 0 || len(seqs) > 200 {
		t.Fatalf("%d logs on disk (%v): retired logs are not deleted", len(seqs), err)
	}
}
