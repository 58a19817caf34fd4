package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// volumeBytes sums the sizes of every file under dir (segments, files under their grace,
// manifests, publication logs, the lease): what the shared volume holds. Files that vanish
// while it walks are skipped.
func volumeBytes(dir string) int64 {
	var sum int64
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	for _, ent := range ents {
		p := filepath.Join(dir, ent.Name())
		if ent.IsDir() {
			sum += volumeBytes(p)
			continue
		}
		if st, err := os.Lstat(p); err == nil {
			sum += st.Size()
		}
	}
	return sum
}

// volumeListing lists every file under dir with its size, and each instance's account, for a
// failure message.
func volumeListing(dir string) string {
	var out strings.Builder
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if st, err := os.Lstat(p); err == nil {
				rel, _ := filepath.Rel(dir, p)
				fmt.Fprintf(&out, "  %s %d\n", rel, st.Size())
			}
		}
		return nil
	})
	return out.String()
}

// accounts describes each instance's share of the shared tier, for a failure message.
func accounts(es []*Engine) string {
	var out strings.Builder
	for i, e := range es {
		t := e.tiers[0]
		fmt.Fprintf(&out, "  instance %d (%x): %v\n", i, e.instance[:4], accountOf(t))
	}
	return out.String()
}

// envSharedBrick names the GlusterFS brick behind the mounts of envSharedMountA (make
// test-gluster): what the volume stores, seen without a client's cache.
const envSharedBrick = "UCM_SHARED_TEST_BRICK"

// volumeDir is where the bytes of shared directory dir (under mount A) are counted: the same
// directory on the brick when the test runs on GlusterFS (a client may list a file another
// client deleted for a while: the mount overstates the volume), else dir.
func volumeDir(dir string) string {
	brick, mount := os.Getenv(envSharedBrick), os.Getenv(envSharedMountA)
	if brick == "" || mount == "" {
		return dir
	}
	rel, err := filepath.Rel(mount, dir)
	if err != nil {
		return dir
	}
	return filepath.Join(brick, rel)
}

// TestSharedTierCapacityBound: two and four instances each dump twice the shared tier's
// capacity at once, while the bytes on the shared volume (every file under the shared
// directory, retired files in their grace included) are sampled every few milliseconds. At
// every sample they are at most capacity + one segment per instance (docs/tiers.md, "Shared
// tiers"); dumps that find no room fail with ErrNoSpace; afterwards every acknowledged block
// loads byte-exact from every instance, or is a miss (retired), never wrong bytes.
func TestSharedTierCapacityBound(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) { testSharedTierCapacityBound(t, n) })
	}
}

func testSharedTierCapacityBound(t *testing.T, instances int) {
	root := t.TempDir()
	sharedA, sharedB := sharedDirs(t)
	const capacity = 3 << 20
	es := make([]*Engine, instances)
	for i := range es {
		dir := sharedA
		if i%2 == 1 {
			dir = sharedB
		}
		o := capacityOptions(dir)
		es[i] = mustOpen(t, filepath.Join(root, fmt.Sprint("e", i)), o)
		defer es[i].Close()
	}
	seg := es[0].reservation(es[0].tiers[0])
	bound := int64(capacity) + int64(instances)*seg

	// The sampler.
	volume := volumeDir(sharedA)
	stop := make(chan struct{})
	var samples atomic.Int64
	var peak atomic.Int64
	var over atomic.Pointer[string]
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			b := volumeBytes(volume)
			samples.Add(1)
			if b > peak.Load() {
				peak.Store(b)
			}
			if b > bound && over.Load() == nil {
				msg := fmt.Sprintf("%d bytes on the volume, above capacity %d + %d segments of %d = %d:\n%s", b, capacity, instances, seg, bound, volumeListing(volume)+accounts(es))
				over.Store(&msg)
			}
		}
	}()

	// Every instance dumps 2× the capacity, two blocks per task.
	bb := es[0].Layout().BlockBytes()
	perInstance := int(2 * capacity / bb)
	acked := make([][]BlockID, instances)
	var refused atomic.Int64
	var writers sync.WaitGroup
	for i, e := range es {
		writers.Add(1)
		go func() {
			defer writers.Done()
			base := 10_000 * (i + 1)
			for lo := 0; lo < perInstance; lo += 2 {
				batch := ids(base+lo, base+min(lo+2, perInstance))
				src := make([][]byte, len(batch))
				for k, id := range batch {
					src[k] = blockBytes(e.Layout(), id)
				}
				task := e.Dump(batch, src)
				_ = task.Wait()
				for k, err := range task.BlockErrors() {
					switch {
					case err == nil:
						acked[i] = append(acked[i], batch[k])
					case errors.Is(err, ErrNoSpace):
						refused.Add(1)
					default:
						t.Errorf("instance %d, block %s: %v, want success or ErrNoSpace", i, batch[k], err)
					}
				}
			}
		}()
	}
	writers.Wait()
	// Let the last segments seal, publish and be reclaimed, still sampling.
	for _, e := range es {
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	sampler.Wait()
	if msg := over.Load(); msg != nil {
		t.Fatal(*msg)
	}
	var nAcked int
	for _, a := range acked {
		nAcked += len(a)
	}
	for i, e := range es {
		if st := e.Stats().Sharing; st.SharedShare <= 0 || st.SharedHeld <= 0 {
			t.Fatalf("instance %d: share %d, held %d: admission reported nothing", i, st.SharedShare, st.SharedHeld)
		}
	}
	t.Logf("%d instances: peak %d bytes on the volume (capacity %d, bound %d) over %d samples; %d blocks acknowledged, %d refused",
		instances, peak.Load(), capacity, bound, samples.Load(), nAcked, refused.Load())
	if peak.Load() < capacity/2 {
		t.Fatalf("peak %d bytes: the sampler did not see the volume's files in %s", peak.Load(), volume)
	}
	if samples.Load() < 10 || nAcked < perInstance {
		t.Fatalf("%d samples, %d blocks acknowledged: the test did not exercise the bound", samples.Load(), nAcked)
	}

	// Every acknowledged block: byte-exact or a miss, from its writer and from another instance.
	for i, a := range acked {
		for _, e := range []*Engine{es[i], es[(i+1)%instances]} {
			dst := make([][]byte, len(a))
			for k := range dst {
				dst[k] = devio.AlignedBuffer(int(bb))
			}
			task := e.Load(a, dst)
			_ = task.Wait()
			for k, err := range task.BlockErrors() {
				if err != nil {
					if !errors.Is(err, ErrNotFound) {
						t.Fatalf("block %s of instance %d: %v, want bytes or a miss", a[k], i, err)
					}
					continue
				}
				if string(dst[k]) != string(blockBytes(e.Layout(), a[k])) {
					t.Fatalf("block %s of instance %d: wrong bytes", a[k], i)
				}
			}
		}
	}
}

// TestSharedTierTakesDemotions: a shared tier with a capacity below a local one receives only
// demotions, which never wait for room and so never ask for it: it keeps room granted ahead,
// and the blocks the local tier evicts land there within the shared capacity.
func TestSharedTierTakesDemotions(t *testing.T) {
	root := t.TempDir()
	shared, _ := sharedDirs(t)
	o := capacityOptions(shared)
	o.Tiers = []tiers.Config{{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{filepath.Join(root, "ssd")}, Capacity: 1 << 20, HighWatermark: 0.9, LowWatermark: 0.8},
		{Name: "shared", Kind: tiers.KindDisk, Paths: []string{shared}, Shared: true, Capacity: 3 << 20, HighWatermark: 0.8, LowWatermark: 0.7}}
	e := mustOpen(t, filepath.Join(root, "e"), o)
	defer e.Close()
	blocks := ids(0, 30) // about 2 MiB into a 1 MiB first tier
	for i := range blocks {
		dumpBlocks(t, e, blocks[i:i+1])
	}
	waitFor(t, "blocks demoted into the shared tier", func() bool { return e.TierStats()[1].Blocks > 0 })
	if n := countTrue(e.Lookup(blocks)); n <= len(blocks)/2 {
		t.Fatalf("%d of %d blocks kept across the two tiers", n, len(blocks))
	}
	if used, capacity := volumeBytes(volumeDir(shared)), int64(3<<20); used > capacity+e.reservation(e.tiers[1]) {
		t.Fatalf("%d bytes on the shared volume, capacity %d", used, capacity)
	}
}

// TestSharedRequestAnsweredOnce: the holder answers a request for room once. An instance that
// asked and then stopped leaves its request in its manifest; the holder grants it the bytes
// asked for and no more, however many passes read the manifest, so the capacity stays free for
// the instances that run (a new holder once granted such a request again at every pass, until
// nothing was left for itself).
func TestSharedRequestAnsweredOnce(t *testing.T) {
	root := t.TempDir()
	shared, _ := sharedDirs(t)
	h := mustOpen(t, filepath.Join(root, "h"), capacityOptions(shared))
	defer h.Close()
	waitFor(t, "the instance holds the lease", func() bool { return h.Stats().Sharing.LeaseHeld })

	// The stopped instance had seen 64 KiB granted and asked for 512 KiB beyond it.
	var gone format.InstanceID
	gone[0], gone[15] = 0x60, 0x4e
	const seen, asked = 64 << 10, 512 << 10
	m := &format.Manifest{Instance: gone, Schema: h.fingerprint, Sequence: 1, Written: time.Now().UnixNano(), Notes: []format.ManifestNote{
		{Kind: format.NoteCredit, Owner: gone, Number: 0, Generation: seen},
		{Kind: format.NoteSpace, Owner: gone, Number: seen, Time: asked},
	}}
	nsDir := tiers.NamespaceDir(shared, gone)
	if err := os.MkdirAll(nsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := tiers.WriteManifest(vfs.Default, nsDir, m); err != nil {
		t.Fatal(err)
	}
	issued := func() int64 { return accountOf(h.tiers[0]).Issued(gone) }
	waitFor(t, "the request answered", func() bool { return issued() > seen })
	passes := h.Stats().Sharing.Refreshes
	waitFor(t, "ten more passes", func() bool { return h.Stats().Sharing.Refreshes >= passes+10 })
	if got := issued(); got != seen+asked {
		t.Fatalf("granted %d in total to the stopped instance, want %d (what it had seen plus what it asked for)", got, seen+asked)
	}
	// The running instance still gets room: its dumps are admitted.
	dumpBlocks(t, h, ids(0, 8))
}
