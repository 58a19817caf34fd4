package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// sharedOptions: one shared disk tier at root, small segments so that dumps seal several, and a
// short refresh interval.
func sharedOptions(root string, grace time.Duration) Options {
	o := testOptions(vfs.Default, mhaLayout)
	o.SegmentSize = 256 << 10
	o.Tiers = []tiers.Config{{Name: "shared", Kind: tiers.KindDisk, Paths: []string{root}, Shared: true}}
	o.SharedRefreshInterval = 10 * time.Millisecond
	o.SharedRetireGrace = grace
	return o
}

// Environment for running the sharing tests on a real distributed file system (make
// test-gluster): two mounts of one GlusterFS volume, as two hosts see it. Instance A uses the
// shared directory through the first, instance B (and the others) through the second.
const (
	envSharedMountA = "UCM_SHARED_TEST_A"
	envSharedMountB = "UCM_SHARED_TEST_B"
)

// sharedDirs returns the shared directory as instance A and as instance B see it: one temporary
// directory, or a fresh directory of the volume through each mount (removed afterwards).
func sharedDirs(t *testing.T) (a, b string) {
	t.Helper()
	ma, mb := os.Getenv(envSharedMountA), os.Getenv(envSharedMountB)
	if ma == "" {
		d := filepath.Join(t.TempDir(), "shared")
		return d, d
	}
	if mb == "" {
		mb = ma
	}
	sub := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(ma, sub)) })
	return filepath.Join(ma, sub), filepath.Join(mb, sub)
}

func allHit(e *Engine, ids []BlockID) bool {
	for _, h := range e.Lookup(ids) {
		if !h {
			return false
		}
	}
	return true
}

// TestSharedTierCrossInstanceHits: two instances (own store directories) share one path and
// write at once. What one dumps and seals is, after a refresh, a hit in the other, byte-exact through Load and
// LoadShard, with prefix lookups spanning both instances' blocks; each writes only its own
// namespace; a namespace of another schema is ignored.
func TestSharedTierCrossInstanceHits(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	b := mustOpen(t, filepath.Join(root, "b"), sharedOptions(sharedB, time.Hour))
	defer b.Close()
	aIDs, bIDs := ids(0, 40), ids(40, 50)
	// Both write at once, a few blocks per task.
	errs := make(chan error, 2)
	for _, w := range []struct {
		e   *Engine
		ids []BlockID
	}{{a, aIDs}, {b, bIDs}} {
		go func() {
			for lo := 0; lo < len(w.ids); lo += 4 {
				batch := w.ids[lo:min(lo+4, len(w.ids))]
				src := make([][]byte, len(batch))
				for i, id := range batch {
					src[i] = blockBytes(w.e.Layout(), id)
				}
				if err := w.e.Dump(batch, src).Wait(); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Only sealed segments are listed in manifests: close A to seal its active one. (A's
	// publication log makes its blocks hits in B before that; the foreign index holds them once
	// B has read the manifest that lists them all.)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A's blocks indexed in B from A's manifest", func() bool {
		return allHit(b, aIDs) && b.Stats().Sharing.ForeignBlocks == int64(len(aIDs))
	})
	checkBlocks(t, b, aIDs)
	l := b.Layout()
	for sh := 0; sh < l.Shards; sh++ {
		dst := make([][]byte, len(aIDs))
		for i := range dst {
			dst[i] = devio.AlignedBuffer(int(l.ShardBytes))
		}
		if err := b.LoadShard(aIDs, sh, dst).Wait(); err != nil {
			t.Fatal(err)
		}
		for i, id := range aIDs {
			want := blockBytes(l, id)[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]
			if string(dst[i]) != string(want) {
				t.Fatalf("shard %d of %s differs", sh, id)
			}
		}
	}
	// A prefix alternating between the instances' blocks is one run.
	chain := []BlockID{aIDs[0], bIDs[0], aIDs[1], bIDs[1], blockID(999), aIDs[2]}
	if n := b.LookupPrefix(chain); n != 4 {
		t.Fatalf("LookupPrefix over both instances = %d, want 4", n)
	}
	st := b.Stats().Sharing
	if st.ForeignBlocks != int64(len(aIDs)) || st.ForeignHits < int64(len(aIDs)) || st.ForeignSegments == 0 || st.VisibilitySamples == 0 {
		t.Fatalf("sharing stats %+v", st)
	}
	// Each instance wrote only its own namespace.
	nss, err := tiers.ListNamespaces(vfs.Default, shared)
	if err != nil || len(nss) != 2 {
		t.Fatalf("namespaces %v, %v", nss, err)
	}
	for _, id := range nss {
		segs, _ := os.ReadDir(filepath.Join(tiers.NamespaceDir(shared, id), SegmentDir))
		if len(segs) == 0 {
			t.Fatalf("namespace %x has no segments", id)
		}
	}
	// A third instance of another schema sees nothing of theirs.
	o := sharedOptions(shared, time.Hour)
	o.Schema.Model = "another-model"
	c := mustOpen(t, filepath.Join(root, "c"), o)
	defer c.Close()
	// Refreshes counts a refresh as it starts, and they run one after another: at 3, two
	// have read A's and B's manifests through.
	waitFor(t, "C to refresh twice", func() bool { return c.Stats().Sharing.Refreshes >= 3 })
	if n := c.LookupPrefix(aIDs); n != 0 {
		t.Fatalf("instance of another schema sees %d blocks", n)
	}
	if st := c.Stats().Sharing; st.ForeignSegments != 0 || st.ForeignBlocks != 0 {
		t.Fatalf("instance of another schema indexed others' segments: %+v", st)
	}
}

// TestSharedTierNoTakeover: an instance that opens a shared path another instance wrote never
// adopts, evicts or deletes the other's segments; when the first comes back, every block of it
// is there. (Before namespaces, the second instance adopted the first's segments and evicted
// them, and the first came back to misses.)
func TestSharedTierNoTakeover(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, 0))
	aIDs := ids(0, 30)
	dumpBlocks(t, a, aIDs)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := mustOpen(t, filepath.Join(root, "b"), sharedOptions(sharedB, 0))
	if rec := b.Recovery(); rec.SegmentsAdopted != 0 || rec.OrphansRemoved != 0 {
		t.Fatalf("B recovered A's files as its own: %+v", rec)
	}
	dumpBlocks(t, b, ids(100, 130))
	waitFor(t, "A's blocks visible in B", func() bool { return allHit(b, aIDs) })
	if _, err := b.Evict("shared", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Compact(0.99, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	a = mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, 0))
	defer a.Close()
	if rec := a.Recovery(); len(rec.MissingSegments) != 0 || rec.EntriesDropped != 0 {
		t.Fatalf("A lost segments while away: %+v", rec)
	}
	checkBlocks(t, a, aIDs)
}

// TestSharedTierVanishedAndRetiredSegments: a reader whose foreign segment vanishes gets a miss,
// never wrong bytes, and the other blocks still load; a segment its owner retires leaves the
// other instances' index after their next refresh, and its file stays for the grace period.
func TestSharedTierVanishedAndRetiredSegments(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	b := mustOpen(t, filepath.Join(root, "b"), sharedOptions(sharedB, time.Hour))
	defer b.Close()
	aIDs := ids(0, 40)
	dumpBlocks(t, a, aIDs)
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	// Seal A's active segment by reopening it.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	waitFor(t, "A's blocks visible in B", func() bool { return allHit(b, aIDs) })

	// Delete one of A's segment files behind everyone's back.
	segDir := filepath.Join(tiers.NamespaceDir(shared, a.instance), SegmentDir)
	names, _ := os.ReadDir(segDir)
	victim := filepath.Join(segDir, names[0].Name())
	n, _ := wal.ParseSegmentFileName(names[0].Name())
	if err := os.Remove(victim); err != nil {
		t.Fatal(err)
	}
	dst := make([][]byte, len(aIDs))
	for i := range dst {
		dst[i] = devio.AlignedBuffer(int(b.Layout().BlockBytes()))
	}
	task := b.Load(aIDs, dst)
	_ = task.Wait()
	lost := 0
	for i, err := range task.BlockErrors() {
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("block %d: %v, want a miss", i, err)
			}
			lost++
			continue
		}
		if string(dst[i]) != string(blockBytes(b.Layout(), aIDs[i])) {
			t.Fatalf("block %d: wrong bytes", i)
		}
	}
	if lost == 0 || lost == len(aIDs) {
		t.Fatalf("%d of %d blocks lost with one segment (%d) of several", lost, len(aIDs), n)
	}

	// A retires everything (evicts to 0): B forgets it after a refresh; the files stay for the
	// grace period, which A's Close cuts short.
	if _, err := a.Evict("shared", 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A's retired blocks gone from B", func() bool { return b.LookupPrefix(aIDs) == 0 })
	if left, _ := os.ReadDir(segDir); len(left) == 0 {
		t.Fatal("retired segment files deleted before their grace period")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(segDir); len(left) != 0 {
		t.Fatalf("retired segment files left after Close: %d", len(left))
	}
}

// TestSharedTierSealsAgingSegment: blocks of a writer that does not fill a segment reach the
// other instances anyway: the active segment is sealed and published once SharedSealAge old.
func TestSharedTierSealsAgingSegment(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	oa := sharedOptions(shared, time.Hour)
	oa.SegmentSize = 64 << 20 // never fills here
	oa.SharedSealAge = 20 * time.Millisecond
	a := mustOpen(t, filepath.Join(root, "a"), oa)
	defer a.Close()
	b := mustOpen(t, filepath.Join(root, "b"), sharedOptions(sharedB, time.Hour))
	defer b.Close()
	first := ids(0, 3)
	dumpBlocks(t, a, first)
	waitFor(t, "A's open segment published", func() bool { return allHit(b, first) })
	checkBlocks(t, b, first)
	// A goes on writing into a new segment, which ages and is published in turn.
	second := ids(3, 6)
	dumpBlocks(t, a, second)
	waitFor(t, "A's next segment published", func() bool { return allHit(b, second) })
	checkBlocks(t, b, second)
}

// capacityOptions: a shared tier at dir with a 3 MiB global capacity (high watermark 0.8, low
// 0.7), segments sealed within 20 ms and a 100 ms grace: retired files count against the
// capacity until their grace ends, so a writer filling the tier waits about that long for room.
func capacityOptions(dir string) Options {
	o := sharedOptions(dir, 100*time.Millisecond)
	o.Tiers[0].Capacity = 3 << 20
	o.Tiers[0].HighWatermark, o.Tiers[0].LowWatermark = 0.8, 0.7
	o.SharedSealAge = 20 * time.Millisecond
	return o
}

// publishedManifest is inst's newest manifest under shared, or nil while there is none (or it
// cannot be read).
func publishedManifest(shared string, inst format.InstanceID) *format.Manifest {
	m, err := tiers.ReadManifest(vfs.Default, tiers.NamespaceDir(shared, inst), inst)
	if err != nil {
		return nil
	}
	return m
}

// publishedBytes sums the segments the instances' manifests under shared list.
func publishedBytes(shared string, es ...*Engine) int64 {
	var sum int64
	for _, e := range es {
		if m := publishedManifest(shared, e.instance); m != nil {
			for _, s := range m.Segments {
				sum += s.Size
			}
		}
	}
	return sum
}

// publishedRecords sums the records of the segments e's manifest under shared lists.
func publishedRecords(shared string, e *Engine) int {
	var n int
	if m := publishedManifest(shared, e.instance); m != nil {
		for _, s := range m.Segments {
			n += int(s.Records)
		}
	}
	return n
}

// TestSharedTierGlobalCapacity: two instances fill a shared tier past its capacity together
// (each alone is under it). The lease holder — exactly one of them — retires the least recently
// used published segments of both, its own directly and the other's by request, until the tier
// is under its high watermark; segments one instance keeps reading from the other survive,
// though they were published first. Either may hold the lease: the writer (A, opened first), or
// the reader (B, opened first), whose own reads of A's segments must count as much as anyone's.
func TestSharedTierGlobalCapacity(t *testing.T) {
	t.Run("writer holds the lease", func(t *testing.T) { testSharedTierGlobalCapacity(t, false) })
	t.Run("reader holds the lease", func(t *testing.T) { testSharedTierGlobalCapacity(t, true) })
}

func testSharedTierGlobalCapacity(t *testing.T, readerFirst bool) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	var a, b *Engine
	if readerFirst {
		b = mustOpen(t, filepath.Join(root, "b"), capacityOptions(sharedB))
		waitFor(t, "B holds the lease", func() bool { return b.Stats().Sharing.LeaseHeld })
		a = mustOpen(t, filepath.Join(root, "a"), capacityOptions(shared))
	} else {
		a = mustOpen(t, filepath.Join(root, "a"), capacityOptions(shared))
		waitFor(t, "A holds the lease", func() bool { return a.Stats().Sharing.LeaseHeld })
		b = mustOpen(t, filepath.Join(root, "b"), capacityOptions(sharedB))
	}
	defer a.Close()
	defer b.Close()
	hot := ids(0, 6)
	dumpBlocks(t, a, hot) // A's oldest segment
	waitFor(t, "A's first blocks visible in B", func() bool { return allHit(b, hot) })
	checkBlocks(t, b, hot)
	waitFor(t, "B's reads of A's blocks published", func() bool {
		m := publishedManifest(shared, b.instance)
		return m != nil && len(m.Notes) > 0 && m.Notes[0].Kind == format.NoteAccess && m.Notes[0].Owner == a.instance
	})
	// B keeps reading A's first blocks from now on.
	stop, reading := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(reading)
		dst := make([][]byte, len(hot))
		for i := range dst {
			dst[i] = devio.AlignedBuffer(int(b.Layout().BlockBytes()))
		}
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				_ = b.Load(hot, dst).Wait()
			}
		}
	}()
	defer func() { close(stop); <-reading }()
	// Together about 2.6 MiB, above the 2.4 MiB high watermark; the low one (2.1 MiB) is
	// reached by retiring some of A's unread blocks.
	aIDs, bIDs := ids(6, 50), ids(100, 120)
	dumpBlocks(t, a, aIDs)
	dumpBlocks(t, b, bIDs)
	published := func() int64 { return publishedBytes(shared, a, b) }
	high := int64(3<<20) * 8 / 10
	deadline := time.Now().Add(30 * time.Second)
	// Reclaimed: a round ran and, when B holds the lease, A obeyed it (with admission, a round
	// may start before the tier is over its high watermark: for room a writer asks for).
	reclaimed := func() bool {
		sa, sb := a.Stats().Sharing, b.Stats().Sharing
		return sa.ReclaimRounds+sb.ReclaimRounds > 0 && (!sb.LeaseHeld || sa.RetiredOnRequest > 0)
	}
	for !reclaimed() || published() > high {
		checkBlocks(t, b, bIDs) // B reads its own blocks too
		if time.Now().After(deadline) {
			t.Fatalf("published bytes %d still above the high watermark %d (stats A %+v, B %+v)", published(), high, a.Stats().Sharing, b.Stats().Sharing)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sa, sb := a.Stats().Sharing, b.Stats().Sharing
	if sa.LeaseHeld == sb.LeaseHeld {
		t.Fatalf("lease held by A: %v, by B: %v (want exactly one)", sa.LeaseHeld, sb.LeaseHeld)
	}
	holder, other := sa, sb
	if sb.LeaseHeld {
		holder, other = sb, sa
	}
	// The victims were A's unread blocks: retired by A itself as holder, or on B's request.
	if holder.ReclaimRounds == 0 || (sb.LeaseHeld && other.RetiredOnRequest == 0) {
		t.Fatalf("holder %+v, other %+v: the victims' owner was never asked to retire them", holder, other)
	}
	if !allHit(a, hot) || !allHit(b, bIDs) {
		t.Fatalf("blocks in constant use were retired before unread ones: hot %v, B's %v, A's unread %d of %d left; holder %+v other %+v",
			a.Lookup(hot), b.Lookup(bIDs), a.LookupPrefix(aIDs), len(aIDs), holder, other)
	}
	if a.LookupPrefix(aIDs) == len(aIDs) {
		t.Fatal("none of A's unread blocks was retired")
	}
	checkBlocks(t, a, hot)
}

// TestSharedTierLookupOnly: a lookup-only instance (UCM's scheduler: it knows neither the shard
// split nor the model's dtype) sees the blocks another instance published, whatever its own
// schema and layout, and refuses every data operation with ErrInvalidArgument.
func TestSharedTierLookupOnly(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	aIDs := ids(0, 20)
	dumpBlocks(t, a, aIDs)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	o := sharedOptions(sharedB, time.Hour)
	o.LookupOnly = true
	o.Schema = Schema{Model: "scheduler", DType: "any", KVLayout: "any", TPSize: 1, BlockTokens: 1}
	o.Layout = Layout{Shards: 1, TensorsPerShard: 1, ShardBytes: o.Layout.BlockBytes()}
	s := mustOpen(t, filepath.Join(root, "s"), o)
	defer s.Close()
	waitFor(t, "A's blocks visible to the lookup-only instance", func() bool { return allHit(s, aIDs) })
	if n := s.LookupPrefix(append(aIDs[:3:3], blockID(999))); n != 3 {
		t.Fatalf("LookupPrefix = %d, want 3", n)
	}
	dst := [][]byte{make([]byte, o.Layout.BlockBytes())}
	for name, err := range map[string]error{
		"load":     s.Load(aIDs[:1], dst).Wait(),
		"dump":     s.Dump([]BlockID{blockID(1000)}, dst).Wait(),
		"prefetch": s.Prefetch(aIDs[:1]).Wait(),
		"create":   s.Create([]BlockID{blockID(1001)})[0],
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%s on a lookup-only instance: %v, want ErrInvalidArgument", name, err)
		}
	}
	o.Tiers = nil
	if _, err := Open(filepath.Join(root, "t"), o); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("lookup-only without a shared tier: %v", err)
	}
}

// TestSharedTierLeaseFailover: the reclaimer lease passes to another instance when its holder
// stops without giving it up (a crash: the lease is never released, it lapses), not before it
// has been expired for the skew; the new holder then enforces the capacity.
func TestSharedTierLeaseFailover(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), capacityOptions(shared))
	waitFor(t, "A holds the lease", func() bool { return a.Stats().Sharing.LeaseHeld })
	b := mustOpen(t, filepath.Join(root, "b"), capacityOptions(sharedB))
	defer b.Close()
	dumpBlocks(t, a, ids(0, 2))
	if err := a.Close(); err != nil { // A stops; its lease is not released
		t.Fatal(err)
	}
	stopped := time.Now()
	lease, err := tiers.ReadLease(vfs.Default, sharedB)
	if err != nil || lease.Holder != a.instance {
		t.Fatalf("lease after A stopped: %+v, %v", lease, err)
	}
	waitFor(t, "B takes the lapsed lease over", func() bool { return b.Stats().Sharing.LeaseHeld })
	// B may take it only once it has been expired for the skew (2 s at least).
	if waited := time.Since(stopped); waited < 2*time.Second-100*time.Millisecond {
		t.Fatalf("B took the lease %v after A stopped, before the skew", waited)
	}
	// B, now the reclaimer, fills the tier past its high watermark and brings it back under.
	for lo := 100; lo < 220; lo += 20 {
		dumpBlocks(t, b, ids(lo, lo+20))
	}
	high := int64(3<<20) * 8 / 10
	waitFor(t, "B reclaims the tier under its high watermark", func() bool {
		return b.Stats().Sharing.ReclaimRounds > 0 && publishedBytes(sharedB, a, b) <= high
	})
}

// TestSharedTierLocalCopies: a hit on another instance's segment is copied into the reader's
// faster tiers — its memory tier at once, its own SSD tier by promotion — and counted; the
// copies then serve the reader's loads.
func TestSharedTierLocalCopies(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	a := mustOpen(t, filepath.Join(root, "a"), sharedOptions(shared, time.Hour))
	aIDs := ids(0, 12)
	dumpBlocks(t, a, aIDs)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	o := sharedOptions(sharedB, time.Hour)
	o.Tiers = []tiers.Config{
		{Name: "dram", Kind: tiers.KindMemory, Capacity: 8 << 20},
		{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{filepath.Join(root, "b-ssd")}},
		o.Tiers[0],
	}
	b := mustOpen(t, filepath.Join(root, "b"), o)
	defer b.Close()
	waitFor(t, "A's blocks visible in B", func() bool { return allHit(b, aIDs) })
	checkBlocks(t, b, aIDs)
	if st := b.Stats().Sharing; st.CopiedToMemory != int64(len(aIDs)) || st.ForeignHits < int64(len(aIDs)) {
		t.Fatalf("after loading A's blocks: %+v", st)
	}
	waitFor(t, "A's blocks copied into B's SSD tier", func() bool {
		for _, id := range aIDs {
			if !b.ix.Contains(id) {
				return false
			}
		}
		return b.Stats().Sharing.CopiedToDisk == int64(len(aIDs))
	})
	checkBlocks(t, b, aIDs)
}

// TestSharedTierGoneOwnerReclaimed: instances A and C dump and stop, leaving the shared tier over
// its capacity. B, the reclaimer, presumes them gone only once it has seen their manifests
// unchanged for SharedOwnerTimeout, takes their least recently used segments out of their
// manifests itself (NoteReclaimed) and unlinks the files after the grace. A returns during the
// grace: it retires the noted segments itself and republishes, and B leaves A's files to A. C
// returns after the unlink: its reclaimed blocks are misses, the others hits, byte-exact.
func TestSharedTierGoneOwnerReclaimed(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	const timeout = 300 * time.Millisecond
	// Only B has a capacity, so only B takes the reclaimer lease: at once, as nobody held it.
	opts := func(dir string, capacity int64) Options {
		o := capacityOptions(dir)
		o.Tiers[0].Capacity = capacity
		o.SharedOwnerTimeout = timeout
		o.SharedRetireGrace = 500 * time.Millisecond
		return o
	}
	// segmentsOf maps each block to the segment holding it.
	segmentsOf := func(e *Engine, blocks []BlockID) map[BlockID]uint64 {
		out := map[BlockID]uint64{}
		for _, id := range blocks {
			loc, ok, err := e.ix.Get(id)
			if err != nil || !ok {
				t.Fatalf("block %s not indexed: %v", id, err)
			}
			out[id] = loc.Segment
		}
		return out
	}
	a := mustOpen(t, filepath.Join(root, "a"), opts(shared, 0))
	aIDs := ids(0, 40)
	dumpBlocks(t, a, aIDs)
	aSegs := segmentsOf(a, aIDs)
	aInst := a.instance
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, filepath.Join(root, "c"), opts(shared, 0))
	cIDs := ids(100, 140)
	dumpBlocks(t, c, cIDs)
	cSegs := segmentsOf(c, cIDs)
	cInst := c.instance
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range cSegs {
		if _, err := os.Stat(share.SummaryPath(tiers.NamespaceDir(shared, cInst), n)); err != nil {
			t.Fatalf("C's segment %d has no summary: %v", n, err)
		}
	}

	bOpened := time.Now()
	b := mustOpen(t, filepath.Join(root, "b"), opts(sharedB, 3<<19)) // high watermark 1.2 MiB, low 1.05 MiB: below what A had alone
	defer b.Close()
	// reclaimed returns the segments the reclaimer noted in inst's manifest.
	reclaimed := func(inst format.InstanceID) map[uint64]bool {
		m := publishedManifest(shared, inst)
		if m == nil {
			return nil
		}
		out := map[uint64]bool{}
		for _, nt := range m.Notes {
			if nt.Kind == format.NoteReclaimed && nt.Owner == inst {
				out[nt.Number] = true
				if at := time.Unix(0, nt.Time); at.Sub(bOpened) < timeout {
					t.Fatalf("segment %d of %x reclaimed %v after B opened, before the owner timeout %v", nt.Number, inst, at.Sub(bOpened), timeout)
				}
			}
		}
		return out
	}
	high := int64(3<<19) * 8 / 10
	waitFor(t, "B reclaims the gone instances' segments under the high watermark", func() bool {
		return b.Stats().Sharing.ReclaimedOfGone > 0 && publishedBytes(sharedB, &Engine{instance: aInst}, &Engine{instance: cInst}) <= high
	})
	var aGone, cGone map[uint64]bool
	waitFor(t, "B's count of reclaimed segments matches the notes", func() bool {
		aGone, cGone = reclaimed(aInst), reclaimed(cInst)
		return int64(len(aGone)+len(cGone)) == b.Stats().Sharing.ReclaimedOfGone
	})
	if len(aGone) == 0 || len(cGone) == 0 {
		t.Fatalf("reclaimed %d of A's and %d of C's segments (stats %+v)", len(aGone), len(cGone), b.Stats().Sharing)
	}
	// Blocks of reclaimed segments are misses in B at its next refresh; the rest stay hits.
	expectHits := func(e *Engine, segs map[BlockID]uint64, gone map[uint64]bool) {
		t.Helper()
		var kept []BlockID
		waitFor(t, "hits exactly for the blocks of segments not reclaimed", func() bool {
			kept = kept[:0]
			for id, n := range segs {
				hit := e.Lookup([]BlockID{id})[0]
				if hit == gone[n] {
					return false
				}
				if hit {
					kept = append(kept, id)
				}
			}
			return true
		})
		checkBlocks(t, e, kept)
	}
	expectHits(b, cSegs, cGone)

	// A returns during the grace: it retires what was taken and publishes again.
	a = mustOpen(t, filepath.Join(root, "a"), opts(shared, 0))
	defer a.Close()
	waitFor(t, "A retires its reclaimed segments", func() bool { return a.Stats().Sharing.ReclaimedWhileGone == int64(len(aGone)) })
	expectHits(a, aSegs, aGone)
	waitFor(t, "A's manifest rewritten by A", func() bool { return len(reclaimed(aInst)) == 0 })
	// C stays away: B deletes its reclaimed files after the grace and the skew margin.
	waitFor(t, "B unlinks C's reclaimed segments", func() bool { return b.Stats().Sharing.UnlinkedOfGone == int64(len(cGone)) })
	segPath := func(inst format.InstanceID, n uint64) string {
		return wal.SegmentPath(filepath.Join(tiers.NamespaceDir(shared, inst), SegmentDir), n)
	}
	for n := range cGone {
		if _, err := os.Stat(segPath(cInst, n)); !os.IsNotExist(err) {
			t.Fatalf("C's reclaimed segment %d still there: %v", n, err)
		}
		if _, err := os.Stat(share.SummaryPath(tiers.NamespaceDir(shared, cInst), n)); !os.IsNotExist(err) {
			t.Fatalf("C's reclaimed segment %d's summary still there: %v", n, err)
		}
	}
	// A's reclaimed files A deletes itself after its own grace.
	waitFor(t, "A deletes its retired segments", func() bool {
		for n := range aGone {
			if _, err := os.Stat(segPath(aInst, n)); !os.IsNotExist(err) {
				return false
			}
		}
		return true
	})
	// C returns: its reclaimed blocks are misses, the rest hits.
	c = mustOpen(t, filepath.Join(root, "c"), opts(shared, 0))
	defer c.Close()
	expectHits(c, cSegs, cGone)
	expectHits(a, cSegs, cGone)
}

// TestSharedTierRecencyAcrossRestart: a restarted instance publishes the segments it kept with
// the times they were first published and last read before, not as new: the reclaimer ranks
// by those, and would otherwise take another instance's newer data before a restarted
// instance's old data.
func TestSharedTierRecencyAcrossRestart(t *testing.T) {
	root := t.TempDir()
	shared, _ := sharedDirs(t)
	dir := filepath.Join(root, "a")
	a := mustOpen(t, dir, sharedOptions(shared, time.Hour))
	blocks := ids(0, 16)
	dumpBlocks(t, a, blocks)
	checkBlocks(t, a, blocks[:4]) // a read of its first segment: its Accessed time
	inst := a.instance
	manifest := func() *format.Manifest { return publishedManifest(shared, inst) }
	waitFor(t, "A's segments and its read published", func() bool {
		m := manifest()
		return m != nil && len(m.Segments) > 1 && m.Segments[0].Accessed > 0
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	before := manifest() // the last one A wrote, at Close
	if before == nil {
		t.Fatal("no manifest after Close")
	}
	time.Sleep(20 * time.Millisecond) // a restart later: "now" is another time
	reopened := time.Now().UnixNano()
	a = mustOpen(t, dir, sharedOptions(shared, time.Hour))
	defer a.Close()
	var after *format.Manifest
	waitFor(t, "A's manifest published again after the restart", func() bool {
		after = manifest()
		return after != nil && after.Written > reopened
	})
	was := map[uint64]format.ManifestEntry{}
	for _, ent := range before.Segments {
		was[ent.Number] = ent
	}
	for _, ent := range after.Segments {
		old, ok := was[ent.Number]
		if !ok {
			continue // sealed at Close: published first now
		}
		if ent.Sealed != old.Sealed || ent.Accessed != old.Accessed {
			t.Errorf("segment %d republished as first published %d, read %d; before the restart %d, %d",
				ent.Number, ent.Sealed, ent.Accessed, old.Sealed, old.Accessed)
		}
	}
}

// TestSharedTierIdleOwnerNotGone: a running instance that has nothing new to publish still
// rewrites its manifest (a heartbeat every quarter of SharedOwnerTimeout), so the others never
// presume it gone, however long it stays idle.
func TestSharedTierIdleOwnerNotGone(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	opts := func(dir string) Options {
		o := sharedOptions(dir, 0)
		// A heartbeat every 250 ms: well above what one pass of the sharer takes on a loaded
		// machine over GlusterFS (a manifest write is 20–50 ms there, a refresh up to 100 ms),
		// so that only a missing heartbeat can make B presume A gone.
		o.SharedOwnerTimeout = time.Second
		return o
	}
	a := mustOpen(t, filepath.Join(root, "a"), opts(shared))
	defer a.Close()
	dumpBlocks(t, a, ids(0, 4))
	b := mustOpen(t, filepath.Join(root, "b"), opts(sharedB))
	defer b.Close()
	waitFor(t, "A's blocks visible in B", func() bool { return allHit(b, ids(0, 4)) })
	nsA := tiers.NamespaceDir(sharedB, a.instance)
	for end := time.Now().Add(5 * opts("").SharedOwnerTimeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if b.share.OwnerGone(nsA) {
			t.Fatalf("B presumes the idle but running A gone (A published %d manifests)", a.Stats().Sharing.ManifestsPublished)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B presumes A gone once it stopped", func() bool { return b.share.OwnerGone(nsA) })
}

// TestSharedTierCapacityEverySchema: the shared tier's capacity bounds the bytes of every
// instance on it, whatever model or schema they store: an instance of another schema is counted
// and asked to retire its least recently used segments like any other (its blocks are never
// loaded here).
func TestSharedTierCapacityEverySchema(t *testing.T) {
	root := t.TempDir()
	shared, sharedB := sharedDirs(t)
	oa := capacityOptions(shared)
	oa.Tiers[0].Capacity = 0 // only B holds the lease
	oa.Schema.Model = "another-model"
	a := mustOpen(t, filepath.Join(root, "a"), oa)
	defer a.Close()
	dumpBlocks(t, a, ids(0, 40))
	// Recency is publication: B's blocks are the newest only once A's last segment, sealed by
	// age, is published before them (a loaded A may publish it after B's first segment).
	waitFor(t, "A's blocks all published", func() bool { return publishedRecords(shared, a) == 40 })
	ob := capacityOptions(sharedB)
	ob.Tiers[0].Capacity = 3 << 19 // high watermark 1.2 MiB: below A's bytes alone
	b := mustOpen(t, filepath.Join(root, "b"), ob)
	defer b.Close()
	bIDs := ids(100, 110)
	dumpBlocks(t, b, bIDs)
	high := int64(3<<19) * 8 / 10
	waitFor(t, "A retires segments on B's request", func() bool {
		return a.Stats().Sharing.RetiredOnRequest > 0 && publishedBytes(sharedB, a, b) <= high
	})
	if n := b.LookupPrefix(ids(0, 40)); n != 0 {
		t.Fatalf("B sees %d blocks of another schema", n)
	}
	if !allHit(b, bIDs) {
		t.Fatalf("B's own recent blocks retired: %v", b.Lookup(bIDs))
	}
}
