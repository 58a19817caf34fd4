package tiers

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// fakeDiskEnv counts the calls a disk tier makes to its engine.
type fakeDiskEnv struct {
	admits, reclaimKicks, sharerKicks atomic.Int32
	refuse                            error // AdmitStore's answer
	stop                              chan struct{}
}

func (v *fakeDiskEnv) AdmitStore(string, int64) error { v.admits.Add(1); return v.refuse }
func (v *fakeDiskEnv) KickReclaimer()                 { v.reclaimKicks.Add(1) }
func (v *fakeDiskEnv) KickSharer()                    { v.sharerKicks.Add(1) }
func (v *fakeDiskEnv) Stop() <-chan struct{}          { return v.stop }

const (
	testSegSize = 1 << 20
	testRecord  = 4096
)

var errEngineNoSpace, errEngineLocked = errors.New("engine: no space"), errors.New("engine: locked")

func diskOpts(fs vfs.FS, store string) DiskOptions {
	return DiskOptions{FS: fs, StoreDir: store, DirectIO: devio.DirectOff, SegmentSize: testSegSize,
		RecordBytes: func() int64 { return testRecord }, RecycleSegments: 1,
		Backend:    func(devio.IOEngine) (devio.Backend, error) { return nil, nil },
		ErrNoSpace: errEngineNoSpace, ErrLocked: errEngineLocked}
}

func diskCfg(name string, capacity int64, shared bool, paths ...string) Config {
	return Config{Name: name, Kind: KindDisk, Paths: paths, Capacity: capacity, Shared: shared,
		HighWatermark: 0.8, LowWatermark: 0.6}.WithDefaults()
}

func writeFile(t *testing.T, fs vfs.FS, path string, size int) {
	t.Helper()
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func exists(fs vfs.FS, path string) bool { _, err := fs.Stat(path); return err == nil }

// A local tier's account stays exact through admission, sealing, retirement with and without
// keeping the file, and reuse: Used is always the files' bytes with active segments at their
// reservation, Recycled the kept files'.
func TestLocalDiskAccounting(t *testing.T) {
	fs := vfs.NewMem()
	env := &fakeDiskEnv{stop: make(chan struct{})}
	const capacity = 10 << 20 // 2 MiB above the high watermark: room for two kept files
	d, err := OpenDisk(diskCfg("ssd", capacity, false, "/ssd"), 0, diskOpts(fs, "/store"), env)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ld, ok := d.(*LocalDisk)
	if !ok || d.Shared() || d.Recency() == nil {
		t.Fatalf("OpenDisk of a local tier with a capacity: %T, shared %v, recency %v", d, d.Shared(), d.Recency())
	}
	res := d.Reservation()
	if want := max(int64(testSegSize), format.SegmentHeaderSize+testRecord+format.FooterSize(1)); res != want {
		t.Fatalf("reservation %d, want %d", res, want)
	}
	dir := d.Place(7)
	if dir != "/ssd/"+SegmentDir || len(d.Dirs()) != 1 {
		t.Fatalf("segment 7 placed in %s; dirs %v", dir, d.Dirs())
	}
	sp := d.Space()
	check := func(step string, used, pooled int64) {
		t.Helper()
		if u := d.Usage(); sp.Used() != used || sp.Pooled() != pooled || u.Used != used || u.Recycled != pooled || u.Capacity != capacity {
			t.Fatalf("%s: used %d pooled %d (usage %+v), want %d and %d", step, sp.Used(), sp.Pooled(), u, used, pooled)
		}
	}
	// A dump's segment passes the store's reserve and reserves its largest size; a
	// relocation's skips the store's reserve.
	if reuse, err := d.Admit(7, dir, false); err != nil || reuse != "" {
		t.Fatalf("admit: %q, %v", reuse, err)
	}
	if _, err := d.Admit(8, dir, true); err != nil {
		t.Fatal(err)
	}
	if env.admits.Load() != 1 {
		t.Fatalf("%d store-reserve checks for one dump segment and one relocation", env.admits.Load())
	}
	check("two reservations", 2*res, 0)
	// Sealed: the engine replaces each reservation by the final size.
	const size7, size8 = 300 << 10, 200 << 10
	writeFile(t, fs, wal.SegmentPath(dir, 7), size7)
	writeFile(t, fs, wal.SegmentPath(dir, 8), size8)
	sp.Add(size7 - res)
	sp.Add(size8 - res)
	check("sealed", size7+size8, 0)

	// Retired and recyclable: the file is kept under its recycle name, its bytes pooled.
	kept, err := d.Unlink(7, dir, size7, true)
	if err != nil || !kept || exists(fs, wal.SegmentPath(dir, 7)) || !exists(fs, wal.RecyclePath(dir, 7)) {
		t.Fatalf("unlink recyclable: kept %v, %v", kept, err)
	}
	check("unlinked, not yet released", size7+size8, 0)
	d.Released(dir, 7, size7, kept)
	check("released into the pool", size7+size8, size7)
	if ld.PooledFiles(dir) != 1 {
		t.Fatalf("%d pooled files", ld.PooledFiles(dir))
	}
	// A file whose size is not what the tier accounts for is deleted, and so is any once the
	// pool is full (RecycleSegments 1).
	if kept, err := d.Unlink(8, dir, size8+1, true); err != nil || kept || exists(fs, wal.SegmentPath(dir, 8)) {
		t.Fatalf("unlink of a file of another size: kept %v, %v", kept, err)
	}
	d.Released(dir, 8, size8, false)
	check("deleted", size7, size7)

	// The next segment in the directory reuses the kept file: its bytes become part of the
	// reservation.
	reuse, err := d.Admit(9, dir, false)
	if err != nil || reuse != wal.RecyclePath(dir, 7) {
		t.Fatalf("admit with a pooled file: %q, %v", reuse, err)
	}
	check("reused", res, 0)
	if ld.PooledFiles(dir) != 0 {
		t.Fatalf("%d pooled files after reuse", ld.PooledFiles(dir))
	}
	writeFile(t, fs, wal.SegmentPath(dir, 10), size8)
	sp.Add(size8)
	if kept, err := d.Unlink(10, dir, size8, true); err != nil || !kept {
		t.Fatalf("unlink into an empty pool: kept %v, %v", kept, err)
	}
	d.Released(dir, 10, size8, true)
	writeFile(t, fs, wal.SegmentPath(dir, 11), size8)
	sp.Add(size8)
	if kept, err := d.Unlink(11, dir, size8, true); err != nil || kept {
		t.Fatalf("unlink with the pool full: kept %v, %v", kept, err)
	}
	d.Released(dir, 11, size8, false)
	check("pool full", res+size8, size8)

	// A full tier refuses a dump that cannot wait, asking for reclamation, with both the
	// tier's and the engine's error; the store's reserve refuses before the tier is asked.
	sp.Add(capacity)
	kicks := env.reclaimKicks.Load()
	if _, err := d.Admit(12, dir, false); !errors.Is(err, ErrNoSpace) || !errors.Is(err, errEngineNoSpace) || env.reclaimKicks.Load() == kicks {
		t.Fatalf("admit into a full tier: %v (kicks %d → %d)", err, kicks, env.reclaimKicks.Load())
	}
	env.refuse = errors.New("store file system full")
	if _, err := d.Admit(13, dir, false); !errors.Is(err, env.refuse) {
		t.Fatalf("admit refused by the store's reserve: %v", err)
	}
}

// A recycled file found at Open joins the pool only where a new segment could reuse it.
func TestLocalDiskFoundRecycled(t *testing.T) {
	fs := vfs.NewMem()
	d, err := OpenDisk(diskCfg("ssd", 10<<20, false, "/ssd"), 0, diskOpts(fs, "/store"), &fakeDiskEnv{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dir := d.Dirs()[0]
	big := wal.RecyclePath(dir, 1)
	writeFile(t, fs, big, int(d.Reservation())+1)
	if _, ok := d.FoundRecycled(big, dir); ok {
		t.Fatal("a recycled file larger than a reservation was pooled")
	}
	empty := wal.RecyclePath(dir, 2)
	writeFile(t, fs, empty, 0)
	if _, ok := d.FoundRecycled(empty, dir); ok {
		t.Fatal("an empty recycled file was pooled")
	}
	// The in-memory file system has no kernel descriptor to trim a reused file with.
	fine := wal.RecyclePath(dir, 3)
	writeFile(t, fs, fine, 4096)
	if _, ok := d.FoundRecycled(fine, dir); ok {
		t.Fatal("a recycled file on a file system without descriptors was pooled")
	}
	if u := d.Usage(); u.Used != 0 || u.Recycled != 0 {
		t.Fatalf("refused files accounted: %+v", u)
	}
}

// A shared tier writes in its namespace, never keeps a file (other instances read them), takes
// no recycled file and has no bound of its own: its capacity is global, admitted by its account.
func TestSharedDiskNeverKeepsFiles(t *testing.T) {
	fs := vfs.NewMem()
	env := &fakeDiskEnv{}
	o := diskOpts(fs, "/store")
	o.Instance = format.InstanceID{1, 2, 3}
	d, err := OpenDisk(diskCfg("vol", 4<<20, true, "/vol"), 1, o, env)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sd, ok := d.(*SharedDisk)
	if !ok || !d.Shared() || sd.Account() != nil || d.Pos() != 1 {
		t.Fatalf("OpenDisk of a shared tier: %T", d)
	}
	dir := d.Dirs()[0]
	if want := filepath.Join(NamespaceDir("/vol", o.Instance), SegmentDir); dir != want {
		t.Fatalf("segment dir %s, want %s", dir, want)
	}
	// Unbounded here: past the configured capacity, a dump is still admitted.
	d.Space().Add(8 << 20)
	if reuse, err := d.Admit(5, dir, false); err != nil || reuse != "" {
		t.Fatalf("admit on a shared tier: %q, %v", reuse, err)
	}
	if env.sharerKicks.Load() != 0 {
		t.Fatal("a shared tier without an account kicked the sharer")
	}
	const size = 100 << 10
	writeFile(t, fs, wal.SegmentPath(dir, 5), size)
	d.Space().Add(size - d.Reservation())
	kept, err := d.Unlink(5, dir, size, true)
	if err != nil || kept || exists(fs, wal.SegmentPath(dir, 5)) || exists(fs, wal.RecyclePath(dir, 5)) {
		t.Fatalf("unlink on a shared tier: kept %v, %v", kept, err)
	}
	d.Released(dir, 5, size, kept)
	if u := d.Usage(); u.Used != 8<<20 || u.Recycled != 0 {
		t.Fatalf("after the unlink: %+v", u)
	}
	f := wal.RecyclePath(dir, 6)
	writeFile(t, fs, f, 4096)
	if _, ok := d.FoundRecycled(f, dir); ok {
		t.Fatal("a shared tier pooled a recycled file")
	}
}

// A tier path outside the store directory is locked: a second open fails with ErrLocked (and the
// engine's error) until the first closes. The store directory itself is the store's to lock.
func TestDiskLocksRefuseASecondOpen(t *testing.T) {
	fs := vfs.NewMem()
	cfg := diskCfg("ssd", 0, false, "/ssd")
	d, err := OpenDisk(cfg, 0, diskOpts(fs, "/store"), &fakeDiskEnv{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Recency() != nil {
		t.Fatal("an unlimited last tier keeps recency")
	}
	_, err = OpenDisk(cfg, 0, diskOpts(fs, "/other"), &fakeDiskEnv{})
	if !errors.Is(err, ErrLocked) || !errors.Is(err, errEngineLocked) {
		t.Fatalf("second open of a held path: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := OpenDisk(cfg, 0, diskOpts(fs, "/other"), &fakeDiskEnv{})
	if err != nil {
		t.Fatalf("open after the first closed: %v", err)
	}
	_ = d2.Close()
	own := diskCfg("disk", 0, false, "/store")
	for i := 0; i < 2; i++ {
		d, err := OpenDisk(own, 0, diskOpts(fs, "/store"), &fakeDiskEnv{})
		if err != nil {
			t.Fatalf("the store directory as a tier path, open %d: %v", i, err)
		}
		defer d.Close()
	}
	bad := cfg
	bad.IOEngine = "spdk"
	if _, err := OpenDisk(bad, 0, diskOpts(fs, "/s2"), &fakeDiskEnv{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("unknown io engine: %v", err)
	}
}
