package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/tiers"
)

// The tests here hold B's loads and B's sharer at the points where another instance's blocks
// move from the overlay (what its publication log announced) to the foreign index (what its
// manifest lists), and check that no block is lost, or taken for gone, in between.

// learnedFromLog opens instances A and B on one shared directory, both reading manifests
// only when kicked. A dumps blocks and B learns them from A's publication log; then A is
// closed, which lists its segment in its manifest, and B has not read that manifest yet.
func learnedFromLog(t *testing.T) (b *Engine, blocks []BlockID) {
	t.Helper()
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	a := mustOpen(t, filepath.Join(root, "a"), logOnlyOptions(shared))
	b = mustOpen(t, filepath.Join(root, "b"), logOnlyOptions(shared))
	t.Cleanup(func() { _ = b.Close() })
	blocks = ids(0, 8)
	dumpBlocks(t, a, blocks)
	if !allHit(b, blocks) {
		t.Fatal("A's blocks not found by B through A's publication log")
	}
	for _, id := range blocks {
		if loc, ok := b.share.OverlayGet(id); !ok || !isOverlay(loc.Segment) {
			t.Fatalf("block %s: overlay entry %+v %v", id, loc, ok)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	return b, blocks
}

// indexedFromManifest kicks b's sharer and waits until it indexed a segment from a manifest
// and the overlay forgot id; false if that did not happen within testwait.Bound. It may run
// on a goroutine other than the test's.
func indexedFromManifest(b *Engine, id BlockID) bool {
	b.share.Kick()
	for deadline := time.Now().Add(testwait.Bound); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, ok := b.share.OverlayGet(id); !ok && b.Stats().Sharing.SegmentsIndexed > 0 {
			return true
		}
	}
	return false
}

// holdOnce sets b's seam to run fn the first time point p is reached; what fn returns is
// sent on the channel returned.
func holdOnce(b *Engine, p seamPoint, fn func(id BlockID) bool) <-chan bool {
	done := make(chan bool, 1)
	var once sync.Once
	b.setSeam(func(q seamPoint, id BlockID) {
		if q == p {
			once.Do(func() { done <- fn(id) })
		}
	})
	return done
}

// loadExact loads blocks from e and reports the error, or a block whose bytes differ.
func loadExact(e *Engine, blocks []BlockID) error {
	dst := make([][]byte, len(blocks))
	for i := range dst {
		dst[i] = devio.AlignedBuffer(int(e.Layout().BlockBytes()))
	}
	if err := e.Load(blocks, dst).Wait(); err != nil {
		return err
	}
	for i, id := range blocks {
		if !bytes.Equal(dst[i], blockBytes(e.Layout(), id)) {
			return blockErr(ErrCorrupt, id, "loaded bytes differ")
		}
	}
	return nil
}

// TestSharedOverlayEntryFollowed: a load or a copy that read a block's overlay entry just
// before the overlay forgot its segment (the foreign index holds it now) follows the block to
// the foreign index's entry: no miss, nothing dropped. (Before, the forgotten overlay alias
// made the block a miss there, and B never copied it into its own disk tier.)
func TestSharedOverlayEntryFollowed(t *testing.T) {
	b, blocks := learnedFromLog(t)
	stale := make([]index.Location, len(blocks))
	for i, id := range blocks {
		stale[i], _ = b.share.OverlayGet(id)
	}
	if !indexedFromManifest(b, blocks[0]) {
		t.Fatal("B never indexed A's segment from its manifest")
	}
	for i, id := range blocks {
		seg, loc, tier, err := b.acquireLatest(id, stale[i])
		if err != nil {
			t.Fatalf("block %s: acquire with the overlay's entry after the manifest listed it: %v", id, err)
		}
		seg.Release()
		if isOverlay(loc.Segment) || !isForeign(loc.Segment) || tier == nil || !tier.Shared() {
			t.Fatalf("block %s followed to %+v (tier %v), want the manifest's foreign entry in the shared tier", id, loc, tier)
		}
	}
	refs := make([]recordRef, len(blocks))
	for i, id := range blocks {
		refs[i] = recordRef{id: id, loc: stale[i]}
	}
	recs, err := b.rc.readRecords(refs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		b.putRecord(r)
	}
	if len(recs) != len(blocks) {
		t.Fatalf("read %d of %d records for a copy from the overlay's entries", len(recs), len(blocks))
	}
	if st := b.Stats(); st.MissingSegmentReads != 0 || st.CorruptReads != 0 {
		t.Fatalf("stats after following: %+v", st)
	}
	checkBlocks(t, b, blocks)
}

// TestSharedLoadWhileIndexing: a load that runs while B's sharer indexes A's segment, right
// after the entries reached the foreign index, finds the segment they name and loads
// byte-exact. (Before, the alias was registered after the entries, and such a load took the
// block for gone and dropped it.)
func TestSharedLoadWhileIndexing(t *testing.T) {
	b, blocks := learnedFromLog(t)
	var loadErr error
	done := holdOnce(b, seamForeignIndexed, func(BlockID) bool {
		for _, id := range blocks {
			if loc, ok := b.share.Get(id); !ok || isOverlay(loc.Segment) {
				loadErr = blockErr(ErrNotFound, id, "not in the foreign index once indexed")
				return true
			}
		}
		loadErr = loadExact(b, blocks)
		return true
	})
	b.share.Kick()
	select {
	case <-done:
	case <-time.After(testwait.Bound):
		t.Fatal("B's sharer never indexed A's segment")
	}
	if loadErr != nil {
		t.Fatalf("load while the segment is being indexed: %v", loadErr)
	}
	if st := b.Stats(); st.MissingSegmentReads != 0 {
		t.Fatalf("%d loads found the segment gone", st.MissingSegmentReads)
	}
}

// TestSharedLoadWhileOverlayForgets: a load that finds no entry in the foreign index, and
// reads the overlay only after B's sharer indexed the block's segment and the overlay forgot
// it, reads the foreign index again: a hit, byte-exact. (Before, the block was in neither
// when looked for: a miss.)
func TestSharedLoadWhileOverlayForgets(t *testing.T) {
	b, blocks := learnedFromLog(t)
	moved := holdOnce(b, seamForeignMissed, func(id BlockID) bool { return indexedFromManifest(b, id) })
	checkBlocks(t, b, blocks)
	if !<-moved {
		t.Fatal("B's sharer never moved A's blocks from the overlay to the foreign index")
	}
}

// TestSharedLoadPinnedThenForgotten: a load that pinned a segment through its overlay alias,
// which the overlay forgets before the read completes, still counts the block as a foreign
// hit, with all that follows one (the memory tier's copy, the promotion): the segment's tier
// is known from before the pin. (Before, it was looked up after the pin, found nothing, and
// the block was served without being counted, cached or copied.)
func TestSharedLoadPinnedThenForgotten(t *testing.T) {
	b, blocks := learnedFromLog(t)
	moved := holdOnce(b, seamSegmentPinned, func(id BlockID) bool { return indexedFromManifest(b, id) })
	checkBlocks(t, b, blocks)
	if !<-moved {
		t.Fatal("B's sharer never moved A's blocks from the overlay to the foreign index")
	}
	if st := b.Stats().Sharing; st.ForeignHits != int64(len(blocks)) {
		t.Fatalf("%d foreign hits for %d blocks loaded from A's segment", st.ForeignHits, len(blocks))
	}
}

// TestSharedManifestOlderThanLog: B's sharer reads A's manifest from before A listed its
// segment and is held there. Meanwhile A lists the segment, and after the carry period lists
// another: its log is continued in a new file that no longer names the first segment, and B
// reads that log (a miss tails the logs of this host). The overlay keeps the first segment:
// the log read after the manifest cannot say the segment was retired, since the manifest may
// predate its listing. (Before, B forgot the segment there, and its blocks were misses until
// B's next refresh: a refresh slower than the carry period lost them for a while.)
func TestSharedManifestOlderThanLog(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	oa := logOnlyOptions(shared)
	oa.SharedRefreshInterval = 50 * time.Millisecond // A publishes as it seals: its log's carry period is a second
	a := mustOpen(t, filepath.Join(root, "a"), oa)
	defer a.Close()
	blocks := ids(0, 8)
	dumpBlocks(t, a, blocks)
	b := mustOpen(t, filepath.Join(root, "b"), logOnlyOptions(shared))
	defer b.Close()
	if !allHit(b, blocks) {
		t.Fatal("A's blocks not found by B through A's publication log")
	}
	type step struct{ reached, resume chan struct{} }
	steps := []step{{make(chan struct{}), make(chan struct{})}, {make(chan struct{}), make(chan struct{})}}
	var calls atomic.Int32
	b.setSeam(func(p seamPoint, _ BlockID) {
		if p != seamManifestRead {
			return
		}
		if n := int(calls.Add(1)); n <= len(steps) {
			close(steps[n-1].reached)
			<-steps[n-1].resume
		}
	})
	defer func() {
		for _, s := range steps {
			select {
			case <-s.resume:
			default:
				close(s.resume)
			}
		}
	}()
	wait := func(s step, what string) {
		select {
		case <-s.reached:
		case <-time.After(testwait.Bound):
			t.Fatalf("B's sharer never %s", what)
		}
	}
	publishes := func(e *Engine) int64 { return e.Stats().Sharing.ManifestsPublished }
	b.share.Kick()
	wait(steps[0], "read A's manifest")
	// B holds A's manifest that lists nothing. A lists its segment, then, after the carry
	// period, a second one: its log goes on in a new file without the first.
	n := publishes(a)
	sealShared(t, a)
	waitFor(t, "A's manifest listing its segment", func() bool { return publishes(a) > n })
	time.Sleep(a.share.PublogCarry() + 100*time.Millisecond)
	dumpBlocks(t, a, ids(100, 101))
	n = publishes(a)
	sealShared(t, a)
	waitFor(t, "A's manifest listing its second segment", func() bool { return publishes(a) > n })
	b.Lookup([]BlockID{blockID(999)}) // a miss: B reads this host's logs to their end
	close(steps[0].resume)
	b.share.Kick()
	wait(steps[1], "read A's manifest again")
	// The first refresh is over; the second has read A's newest manifest and indexed nothing.
	_, kept := b.share.OverlayGet(blocks[0])
	close(steps[1].resume)
	if !kept {
		t.Fatal("the overlay forgot A's listed segment by a log read after a manifest from before the listing")
	}
	waitFor(t, "A's segments indexed from its manifest", func() bool { return b.Stats().Sharing.SegmentsIndexed > 1 })
	checkBlocks(t, b, blocks)
}

// staleLogFS gives out one handle of a publication log that goes stale (ESTALE to every call)
// once armed, as a distributed file system's client does for a file it lost.
type staleLogFS struct {
	vfs.FS
	armed atomic.Bool
	given atomic.Bool
}

func (fs *staleLogFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil || !strings.HasPrefix(filepath.Base(name), tiers.PublogPrefix) || !fs.given.CompareAndSwap(false, true) {
		return f, err
	}
	return &staleLogFile{File: f, fs: fs}, nil
}

type staleLogFile struct {
	vfs.File
	fs *staleLogFS
}

func (f *staleLogFile) Stat() (vfs.FileInfo, error) {
	if f.fs.armed.Load() {
		return nil, &os.PathError{Op: "fstat", Err: syscall.ESTALE}
	}
	return f.File.Stat()
}

func (f *staleLogFile) ReadAt(p []byte, off int64) (int, error) {
	if f.fs.armed.Load() {
		return 0, &os.PathError{Op: "read", Err: syscall.ESTALE}
	}
	return f.File.ReadAt(p, off)
}

// TestSharedPublogStaleHandle: when the handle B reads A's publication log through goes stale,
// B opens the log again and goes on learning A's blocks from it. (Before, B kept the stale
// handle and learned nothing more from A's log.)
func TestSharedPublogStaleHandle(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "shared")
	a := mustOpen(t, filepath.Join(root, "a"), logOnlyOptions(shared))
	defer a.Close()
	dumpBlocks(t, a, ids(0, 8))
	ob := logOnlyOptions(shared)
	ob.SharedRefreshInterval = 10 * time.Millisecond // tails every 10 ms; manifests list nothing (seal age an hour)
	stale := &staleLogFS{FS: vfs.Default}
	ob.FS = stale
	b := mustOpen(t, filepath.Join(root, "b"), ob)
	defer b.Close()
	waitFor(t, "A's first blocks learned by B from A's log", func() bool { return allHit(b, ids(0, 8)) })
	if !stale.given.Load() {
		t.Fatal("B read A's log through no handle of the test's")
	}
	stale.armed.Store(true)
	dumpBlocks(t, a, ids(8, 16))
	waitFor(t, "A's later blocks learned by B after its log handle went stale", func() bool { return allHit(b, ids(8, 16)) })
	checkBlocks(t, b, ids(0, 16))
}
