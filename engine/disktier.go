package engine

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// diskTier is one disk tier of the store: a local SSD or a mounted shared file system, with
// one or more paths. Its segments are spread across the paths by segment number; its space is
// accounted exactly (tiers.Space) and, when it can run out of room or has a slower tier below
// it, every block in it is tracked for LRU eviction.
//
// Lock order: a recycle pool's lock is taken before the tier's tiers.Space lock; neither is
// held while the engine's reclaimMu or the segments' lock is taken.
type diskTier struct {
	pos    int // position among the disk tiers, 0 = fastest
	cfg    tiers.Config
	dirs   []string // segment directories, one per path
	locks  []io.Closer
	io     devio.Backend
	direct devio.DirectMode
	// w takes dumps (the first disk tier only); rw takes relocations into this tier:
	// compaction of its own segments, demotion from the tier above, promotion from below.
	w, rw *wal.Writer
	space *tiers.Space
	lru   *tiers.LRU // nil when the tier never evicts
	// codec is how raw records are stored on their way into this tier (dumps into the first
	// tier, relocations into any); records already compressed are moved as they are.
	codec format.Compression
	// segSize is the size at which this tier's segments are sealed (SegmentSizeFor).
	segSize int64
	// recordBytes is one block record's size (the layout is final only once the schema is
	// checked, after the tiers are opened).
	recordBytes func() int64
	// acct is a shared tier's admission account (opened in share_space.go); nil for other
	// tiers and a shared tier without a capacity.
	acct *tiers.ShareAccount
	// sealing: a seal-age request to w (0) or rw (1) is in flight (sealAgedShared).
	sealing [2]atomic.Bool
	// pool holds the retired segment files kept for reuse in t's directories, at most
	// recycleMax per directory (recycle.go).
	pool       recyclePool
	recycleMax int
	fs         vfs.FS
	logger     *slog.Logger
	timeout    time.Duration // how long a dump waits for room (Options.TaskTimeout)
	env        diskEnv
}

// diskOptions is what every disk tier is opened with: the engine-wide settings a tier's own
// configuration may override, and where its I/O backend comes from.
type diskOptions struct {
	FS       vfs.FS
	ReadOnly bool
	// Instance names a shared tier's namespace (tiers.NamespaceDir); StoreDir is the store's
	// directory, which its own lock covers (a tier path elsewhere gets a lock of its own).
	Instance format.InstanceID
	StoreDir string
	IOEngine devio.IOEngine
	DirectIO devio.DirectMode
	// SegmentSize is Options.SegmentSize (0: chosen from the capacity, SegmentSizeFor).
	SegmentSize int64
	// RecordBytes returns one block record's size, the least a segment reserves for.
	RecordBytes     func() int64
	RecycleSegments int
	TaskTimeout     time.Duration
	Logger          *slog.Logger
	// Backend returns the I/O backend of an engine, shared by the tiers that use it.
	Backend func(devio.IOEngine) (devio.Backend, error)
}

// diskEnv is what a disk tier needs from the engine: the store's file-system reserve and the
// kicks of the background workers. Called without any of the tier's locks held.
type diskEnv struct{ e *Engine }

// AdmitStore checks the store file system's reserve for a new segment in dir (reserve.go).
func (v diskEnv) AdmitStore(dir string, reservation int64) error {
	return v.e.admitSpace(dir, reservation)
}

// KickReclaimer asks the reclaimer to look at the tiers now.
func (v diskEnv) KickReclaimer() { v.e.kickReclaimer() }

// KickSharer asks the sharer for a pass (a shared tier's lease holder grants room).
func (v diskEnv) KickSharer() { v.e.kickSharing() }

// Stop is closed when the engine stops.
func (v diskEnv) Stop() <-chan struct{} { return v.e.stop }

// newDiskTier opens disk tier c at position pos: its segment directories (created unless
// read-only), a lock on each path outside the store directory, its I/O backend and direct-I/O
// mode. A shared tier's paths hold one namespace per instance; this one owns only its own.
func newDiskTier(c tiers.Config, pos int, o diskOptions, env diskEnv) (_ *diskTier, err error) {
	local := c.Capacity
	if c.Shared {
		// A shared tier's capacity is global (every instance's bytes together), enforced
		// by the reclaimer lease holder (share_reclaim.go), not per instance: a local
		// bound would evict this instance's blocks by its own recency alone.
		local = 0
	}
	t := &diskTier{pos: pos, cfg: c, space: tiers.NewSpace(local, c.HighWatermark, c.LowWatermark),
		segSize: SegmentSizeFor(o.SegmentSize, c.Capacity), recycleMax: o.RecycleSegments,
		fs: o.FS, logger: o.Logger, timeout: o.TaskTimeout, env: env, recordBytes: o.RecordBytes}
	defer func() {
		if err != nil {
			_ = t.close()
		}
	}()
	eng := o.IOEngine
	if c.IOEngine != "" && c.IOEngine != "auto" {
		if eng, err = devio.ParseIOEngine(c.IOEngine); err != nil {
			return nil, fmt.Errorf("tier %q: %w: %w", c.Name, tiers.ErrInvalidConfig, err)
		}
	}
	if t.io, err = o.Backend(eng); err != nil {
		return nil, fmt.Errorf("open %s: tier %q: io engine %s: %w", o.StoreDir, c.Name, eng, err)
	}
	mode := o.DirectIO
	if c.DirectIO != "" && c.DirectIO != "auto" {
		if mode, err = devio.ParseDirectMode(c.DirectIO); err != nil {
			return nil, fmt.Errorf("tier %q: %w: %w", c.Name, tiers.ErrInvalidConfig, err)
		}
	}
	for _, p := range c.Paths {
		own := tierRoot(c, p, o.Instance)
		segDir := filepath.Join(own, SegmentDir)
		if !o.ReadOnly {
			if err := o.FS.MkdirAll(segDir, 0o755); err != nil {
				return nil, fmt.Errorf("open tier %q: %w", c.Name, err)
			}
		}
		if filepath.Clean(own) != filepath.Clean(o.StoreDir) {
			// Another store using this path (or namespace) would reuse our segment numbers.
			lock, err := o.FS.Lock(filepath.Join(own, LockFile))
			if err != nil {
				if isLockHeld(err) {
					return nil, fmt.Errorf("open tier %q: path %s is in use by another store: %w", c.Name, p, ErrLocked)
				}
				return nil, fmt.Errorf("open tier %q: lock %s: %w", c.Name, p, err)
			}
			t.locks = append(t.locks, lock)
			if !o.ReadOnly {
				for d := own; ; d = filepath.Dir(d) {
					if err := wal.SyncDir(o.FS, d); err != nil {
						return nil, fmt.Errorf("open tier %q: %w", c.Name, err)
					}
					if d == filepath.Clean(p) || d == filepath.Dir(d) {
						break
					}
				}
			}
		}
		t.dirs = append(t.dirs, segDir)
	}
	t.direct = devio.DirectOff
	switch mode {
	case devio.DirectOn:
		t.direct = devio.DirectOn
	case devio.DirectAuto:
		if !o.ReadOnly {
			ok, err := devio.ProbeDirect(o.FS, t.dirs[0])
			if err != nil {
				return nil, fmt.Errorf("open tier %q: %w", c.Name, err)
			}
			if ok {
				t.direct = devio.DirectOn
			}
		}
	}
	return t, nil
}

// tierRoot is the directory of tier path p an instance owns: p itself, or for a shared tier
// its namespace under p (tiers.NamespaceDir).
func tierRoot(c tiers.Config, p string, instance format.InstanceID) string {
	if c.Shared {
		return tiers.NamespaceDir(p, instance)
	}
	return p
}

// reservation is the most a new segment of t can grow to: its segment size, or one record with
// its header and footer when a record is larger.
func (t *diskTier) reservation() int64 {
	return max(t.segSize, format.SegmentHeaderSize+t.recordBytes()+format.FooterSize(1))
}

// openWriters starts t's relocation writer and, when dump is true, its dump writer, from base
// (the engine's part: hooks, placement, sync policy); t sets its segment size, I/O and
// admission.
func (t *diskTier) openWriters(base wal.Options, dump bool) error {
	for _, relocation := range []bool{false, true} {
		if !relocation && !dump {
			continue
		}
		o := base
		o.SegmentSize, o.Direct, o.Backend = t.segSize, t.direct, t.io
		o.Admit = t.admitter(relocation)
		// Dumps arrive in streams: have the next segment ready before the active one
		// fills. Relocations come in bursts; their writer creates segments as needed.
		o.PrepareNext = !relocation
		if relocation {
			o.OnFlight = nil
		}
		w, err := wal.NewWriter(o)
		if err != nil {
			return err
		}
		if relocation {
			t.rw = w
		} else {
			t.w = w
		}
	}
	return nil
}

// admitter returns the Admit of one of t's writers (admit).
func (t *diskTier) admitter(relocation bool) func(uint64, string) (string, error) {
	return func(n uint64, dir string) (string, error) { return t.admit(n, dir, relocation) }
}

// admit is a writer's Admit: a new segment reserves its largest size under t's capacity;
// dumps wait (up to the task timeout) for reclamation to make room. A recycled file in the
// segment's directory is handed back to reuse ("" for none), its bytes counted towards the
// reservation.
func (t *diskTier) admit(_ uint64, dir string, relocation bool) (string, error) {
	if !relocation {
		// Relocations are how reclamation frees space: never refused for it.
		if err := t.env.AdmitStore(dir, t.reservation()); err != nil {
			return "", fmt.Errorf("tier %q: %w", t.cfg.Name, err)
		}
	}
	rc := &reservationRecycler{t: t, dir: dir}
	kick := t.env.KickReclaimer
	if t.acct != nil {
		kick = func() { t.env.KickReclaimer(); t.env.KickSharer() } // ask the lease holder for room
	}
	if _, err := t.space.Reserve(t.reservation(), relocation, t.timeout, t.env.Stop(), kick, rc); err != nil {
		t.env.KickReclaimer()
		return "", fmt.Errorf("tier %q: %w: %w", t.cfg.Name, ErrNoSpace, err)
	}
	return rc.taken.path, nil
}

// unlink removes retired segment n's file of size bytes in dir, or renames it for reuse when
// recyclable and dir's pool has room, and makes that durable. kept says the file was kept;
// on an error the file may still be there (the caller leaves its row for the next Open).
func (t *diskTier) unlink(n uint64, dir string, size int64, recyclable bool) (kept bool, err error) {
	path := wal.SegmentPath(dir, n)
	// Only a file whose size is what its tier accounts for is kept (a prepared segment dropped
	// unused is laid out beyond its accounted header): the pool's bytes stay exact.
	keep := recyclable && t.poolHasRoom(dir, size) && fileSize(t.fs, path) == size
	if keep {
		if err := t.fs.Rename(path, wal.RecyclePath(dir, n)); err != nil {
			t.logger.Warn("ucm: could not keep a retired segment's file for reuse; deleting it", "path", path, "err", err)
			keep = false
		}
	}
	if !keep {
		if err := t.fs.Remove(path); err != nil && !isNotExist(err) {
			return false, fmt.Errorf("delete retired segment %s: %w", path, err)
		}
	}
	if err := wal.SyncDir(t.fs, dir); err != nil {
		return keep, fmt.Errorf("sync %s after deleting segment %d: %w", dir, n, err)
	}
	return keep, nil
}

// released returns an unlinked segment's size bytes to t's account: as pooled bytes when its
// file was kept for reuse (unlink's kept), else freed.
func (t *diskTier) released(dir string, n uint64, size int64, kept bool) {
	if kept {
		t.addPooled(dir, pooledFile{path: wal.RecyclePath(dir, n), size: size})
		return
	}
	t.space.Add(-size)
}

// diskUsage is a disk tier's own accounting (TierStats adds the index's totals).
type diskUsage struct {
	Used, Recycled, Capacity, SegmentSize int64
}

// usage returns t's accounted bytes.
func (t *diskTier) usage() diskUsage {
	return diskUsage{Used: t.space.Used(), Recycled: t.space.Pooled(), Capacity: t.cfg.Capacity, SegmentSize: t.segSize}
}

// close releases t's path locks.
func (t *diskTier) close() error {
	var first error
	for _, l := range t.locks {
		if err := l.Close(); err != nil && first == nil {
			first = err
		}
	}
	t.locks = nil
	return first
}
