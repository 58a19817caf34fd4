package engine

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// disk is one disk tier of the store: segment files spread by number over its paths, their
// space account, their recency list and the writers that create them. Two kinds implement it:
// localDisk (a local file system, one store per path) and sharedDisk (a file system mounted by
// several instances, one namespace each). The index and the routing of a segment number to its
// tier stay in the engine (segments.go). Safe for concurrent use, except SetCodec, called once
// before the writers open.
type disk interface {
	// Name is the configured name.
	Name() string
	// Config is the tier's configuration as given (with defaults).
	Config() tiers.Config
	// Pos is the tier's position among the disk tiers, 0 = fastest.
	Pos() int
	// Shared reports a tier shared by several instances (sharedDisk).
	Shared() bool
	// Dirs are the segment directories, one per path.
	Dirs() []string
	// Place returns the directory segment n is created in (tiers.PathFor).
	Place(n uint64) string
	// SegmentSize is the size at which segments are sealed (SegmentSizeFor).
	SegmentSize() int64
	// Reservation is the most a new segment can grow to: its segment size, or one record with
	// its header and footer when a record is larger.
	Reservation() int64
	// Space is the tier's exact byte account.
	Space() *tiers.Space
	// LRU is the tier's recency list; nil when the tier never evicts.
	LRU() *tiers.LRU
	// Codec is how raw records are stored on their way into the tier (dumps into the first
	// tier, relocations into any); records already compressed are moved as they are.
	Codec() format.Compression
	// SetCodec sets Codec, once the schema is final and before the writers open.
	SetCodec(format.Compression)
	// Backend and Direct are the tier's I/O backend and direct-I/O mode.
	Backend() devio.Backend
	Direct() devio.DirectMode
	// OpenWriters starts the relocation writer and, when dump is true, the dump writer, from
	// base (the engine's part: hooks, placement, sync policy); the tier sets its segment size,
	// I/O and admission.
	OpenWriters(base wal.Options, dump bool) error
	// Writer returns the relocation writer (compaction, demotion into the tier, promotion
	// from below) or the dump writer (nil below the first tier); nil before OpenWriters.
	Writer(relocation bool) *wal.Writer
	// Admit is a writer's Admit: a new segment in dir reserves Reservation() under the
	// capacity, dumps waiting up to the task timeout for reclamation to make room; it returns
	// a recycled file of dir to reuse ("" for none), its bytes counted towards the reservation.
	Admit(n uint64, dir string, relocation bool) (reuse string, err error)
	// OpenSegment opens sealed segment n of generation in dir for reading.
	OpenSegment(dir string, n, generation uint64) (*wal.Segment, error)
	// Unlink removes retired segment n's file of size bytes in dir, or keeps it for reuse
	// (kept) when recyclable and the tier keeps files, and makes that durable. On an error
	// the file may still be there and its bytes stay accounted.
	Unlink(n uint64, dir string, size int64, recyclable bool) (kept bool, err error)
	// Released returns an unlinked segment's bytes to the account: as pooled bytes when its
	// file was kept, else freed. Called after Unlink, once the engine has forgotten the row.
	Released(dir string, n uint64, size int64, kept bool)
	// FoundRecycled takes a recycled file Open found in dir into the tier's pool, accounted,
	// and reports its size; false when the tier cannot reuse it (the caller deletes it).
	FoundRecycled(path, dir string) (size int64, ok bool)
	// Usage is the tier's own accounting.
	Usage() diskUsage
	// Close releases the path locks (the writers are closed by the engine first).
	Close() error
}

// diskBase is what both disk kinds share.
//
// Lock order: a recycle pool's lock is taken before the tier's tiers.Space lock; neither is
// held while the engine's reclaimMu or the segments' lock is taken.
type diskBase struct {
	pos    int
	cfg    tiers.Config
	dirs   []string
	locks  []io.Closer
	io     devio.Backend
	direct devio.DirectMode
	w, rw  *wal.Writer
	space  *tiers.Space
	lru    *tiers.LRU
	codec  format.Compression
	// segSize is the size at which segments are sealed (SegmentSizeFor).
	segSize int64
	// recordBytes is one block record's size (the layout is final only once the schema is
	// checked, after the tiers are opened).
	recordBytes func() int64
	fs          vfs.FS
	logger      *slog.Logger
	timeout     time.Duration // how long a dump waits for room (Options.TaskTimeout)
	env         diskEnv
}

// localDisk is a disk tier on a local file system: its paths belong to this store alone, and
// retired segment files are kept for reuse (recycle.go).
type localDisk struct {
	diskBase
	// pool holds the retired segment files kept for reuse in the tier's directories, at
	// most recycleMax per directory.
	pool       recyclePool
	recycleMax int
}

// sharedDisk is a disk tier on a file system several instances mount: this instance writes
// only in its namespace of each path, its files are read by others (never overwritten in
// place, so none is kept for reuse) and its capacity is global, admitted by acct.
type sharedDisk struct {
	diskBase
	// acct is the tier's admission account (opened in share_space.go); nil without a
	// capacity. Set once at Open, before the writers start.
	acct *tiers.ShareAccount
	// sealing: a seal-age request to the dump (0) or relocation (1) writer is in flight.
	sealing [2]atomic.Bool
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
	// HasLower says a slower disk tier follows this one (it then keeps recency to evict by).
	HasLower    bool
	TaskTimeout time.Duration
	Logger      *slog.Logger
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
func newDiskTier(c tiers.Config, pos int, o diskOptions, env diskEnv) (_ disk, err error) {
	local := c.Capacity
	if c.Shared {
		// A shared tier's capacity is global (every instance's bytes together), enforced
		// by the reclaimer lease holder (share_reclaim.go), not per instance: a local
		// bound would evict this instance's blocks by its own recency alone.
		local = 0
	}
	t := &diskBase{pos: pos, cfg: c, space: tiers.NewSpace(local, c.HighWatermark, c.LowWatermark),
		segSize: SegmentSizeFor(o.SegmentSize, c.Capacity),
		fs:      o.FS, logger: o.Logger, timeout: o.TaskTimeout, env: env, recordBytes: o.RecordBytes}
	// Eviction needs recency only where a tier can fill up or can hand blocks down.
	if c.Capacity > 0 || o.HasLower {
		t.lru = tiers.NewLRU()
	}
	defer func() {
		if err != nil {
			_ = t.Close()
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
	if c.Shared {
		return &sharedDisk{diskBase: *t}, nil
	}
	return &localDisk{diskBase: *t, recycleMax: o.RecycleSegments}, nil
}

// tierRoot is the directory of tier path p an instance owns: p itself, or for a shared tier
// its namespace under p (tiers.NamespaceDir).
func tierRoot(c tiers.Config, p string, instance format.InstanceID) string {
	if c.Shared {
		return tiers.NamespaceDir(p, instance)
	}
	return p
}

func (t *diskBase) Name() string                  { return t.cfg.Name }
func (t *diskBase) Config() tiers.Config          { return t.cfg }
func (t *diskBase) Pos() int                      { return t.pos }
func (t *diskBase) Shared() bool                  { return t.cfg.Shared }
func (t *diskBase) Dirs() []string                { return t.dirs }
func (t *diskBase) Place(n uint64) string         { return tiers.PathFor(t.dirs, n) }
func (t *diskBase) SegmentSize() int64            { return t.segSize }
func (t *diskBase) Space() *tiers.Space           { return t.space }
func (t *diskBase) LRU() *tiers.LRU               { return t.lru }
func (t *diskBase) Codec() format.Compression     { return t.codec }
func (t *diskBase) SetCodec(c format.Compression) { t.codec = c }
func (t *diskBase) Backend() devio.Backend        { return t.io }
func (t *diskBase) Direct() devio.DirectMode      { return t.direct }

func (t *diskBase) Reservation() int64 {
	return max(t.segSize, format.SegmentHeaderSize+t.recordBytes()+format.FooterSize(1))
}

func (t *diskBase) Writer(relocation bool) *wal.Writer {
	if relocation {
		return t.rw
	}
	return t.w
}

func (t *diskBase) OpenSegment(dir string, n, generation uint64) (*wal.Segment, error) {
	return wal.OpenSegmentForRead(t.fs, dir, n, generation, t.direct, t.io)
}

// openWriters starts the writers (disk.OpenWriters) with admit as their admission.
func (t *diskBase) openWriters(base wal.Options, dump bool, admit func(n uint64, dir string, relocation bool) (string, error)) error {
	for _, relocation := range []bool{false, true} {
		if !relocation && !dump {
			continue
		}
		o := base
		o.SegmentSize, o.Direct, o.Backend = t.segSize, t.direct, t.io
		o.Admit = func(n uint64, dir string) (string, error) { return admit(n, dir, relocation) }
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

// admit reserves a new segment's room (disk.Admit); kick asks for room while a dump waits, rc
// hands recycled files to the reservation (nil: none).
func (t *diskBase) admit(dir string, relocation bool, kick func(), rc tiers.Recycler) error {
	if !relocation {
		// Relocations are how reclamation frees space: never refused for it.
		if err := t.env.AdmitStore(dir, t.Reservation()); err != nil {
			return fmt.Errorf("tier %q: %w", t.cfg.Name, err)
		}
	}
	if _, err := t.space.Reserve(t.Reservation(), relocation, t.timeout, t.env.Stop(), kick, rc); err != nil {
		t.env.KickReclaimer()
		return fmt.Errorf("tier %q: %w: %w", t.cfg.Name, ErrNoSpace, err)
	}
	return nil
}

// remove deletes retired segment n's file in dir and syncs dir.
func (t *diskBase) remove(n uint64, dir string) error {
	path := wal.SegmentPath(dir, n)
	if err := t.fs.Remove(path); err != nil && !isNotExist(err) {
		return fmt.Errorf("delete retired segment %s: %w", path, err)
	}
	if err := wal.SyncDir(t.fs, dir); err != nil {
		return fmt.Errorf("sync %s after deleting segment %d: %w", dir, n, err)
	}
	return nil
}

// Close releases the tier's path locks.
func (t *diskBase) Close() error {
	var first error
	for _, l := range t.locks {
		if err := l.Close(); err != nil && first == nil {
			first = err
		}
	}
	t.locks = nil
	return first
}

// diskUsage is a disk tier's own accounting (TierStats adds the index's totals).
type diskUsage struct {
	Used, Recycled, Capacity, SegmentSize int64
}

func (t *diskBase) Usage() diskUsage {
	return diskUsage{Used: t.space.Used(), Recycled: t.space.Pooled(), Capacity: t.cfg.Capacity, SegmentSize: t.segSize}
}

func (t *localDisk) OpenWriters(base wal.Options, dump bool) error {
	return t.openWriters(base, dump, t.Admit)
}

func (t *localDisk) Admit(_ uint64, dir string, relocation bool) (string, error) {
	rc := &reservationRecycler{t: t, dir: dir}
	if err := t.admit(dir, relocation, t.env.KickReclaimer, rc); err != nil {
		return "", err
	}
	return rc.taken.path, nil
}

func (t *localDisk) Unlink(n uint64, dir string, size int64, recyclable bool) (kept bool, err error) {
	path := wal.SegmentPath(dir, n)
	// Only a file whose size is what its tier accounts for is kept (a prepared segment dropped
	// unused is laid out beyond its accounted header): the pool's bytes stay exact.
	if !recyclable || !t.poolHasRoom(dir, size) || fileSize(t.fs, path) != size {
		return false, t.remove(n, dir)
	}
	if err := t.fs.Rename(path, wal.RecyclePath(dir, n)); err != nil {
		t.logger.Warn("ucm: could not keep a retired segment's file for reuse; deleting it", "path", path, "err", err)
		return false, t.remove(n, dir)
	}
	if err := wal.SyncDir(t.fs, dir); err != nil {
		return true, fmt.Errorf("sync %s after keeping segment %d for reuse: %w", dir, n, err)
	}
	return true, nil
}

func (t *localDisk) Released(dir string, n uint64, size int64, kept bool) {
	if kept {
		t.addPooled(dir, pooledFile{path: wal.RecyclePath(dir, n), size: size})
		return
	}
	t.space.Add(-size)
}

func (t *localDisk) FoundRecycled(path, dir string) (int64, bool) {
	size := fileSize(t.fs, path)
	if size <= 0 || size > t.Reservation() || !t.poolHasRoom(dir, size) {
		return 0, false
	}
	f, err := t.fs.Open(path)
	if err != nil {
		return 0, false
	}
	ok := f.Fd() != vfs.InvalidFd
	_ = f.Close()
	if !ok {
		return 0, false
	}
	t.space.Add(size)
	t.addPooled(dir, pooledFile{path: path, size: size})
	return size, true
}

func (t *sharedDisk) OpenWriters(base wal.Options, dump bool) error {
	return t.openWriters(base, dump, t.Admit)
}

func (t *sharedDisk) Admit(_ uint64, dir string, relocation bool) (string, error) {
	kick := t.env.KickReclaimer
	if t.acct != nil {
		kick = func() { t.env.KickReclaimer(); t.env.KickSharer() } // ask the lease holder for room
	}
	return "", t.admit(dir, relocation, kick, nil)
}

// Unlink never keeps a shared tier's file: other instances read them.
func (t *sharedDisk) Unlink(n uint64, dir string, _ int64, _ bool) (bool, error) {
	return false, t.remove(n, dir)
}

func (t *sharedDisk) Released(_ string, _ uint64, size int64, _ bool) { t.space.Add(-size) }

// FoundRecycled takes none: a shared tier keeps no file for reuse.
func (t *sharedDisk) FoundRecycled(string, string) (int64, bool) { return 0, false }

// Account is the tier's admission account; nil without a capacity.
func (t *sharedDisk) Account() *tiers.ShareAccount { return t.acct }

// SetAccount sets the admission account, once at Open before the writers start.
func (t *sharedDisk) SetAccount(a *tiers.ShareAccount) { t.acct = a }

// SealAged asks each writer to seal its active segment once its first record is older than
// age, in the background (on bg), one request per writer at a time.
func (t *sharedDisk) SealAged(age time.Duration, bg *sync.WaitGroup) {
	for i, w := range []*wal.Writer{t.w, t.rw} {
		if w == nil || !t.sealing[i].CompareAndSwap(false, true) {
			continue
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			defer t.sealing[i].Store(false)
			if err := w.SealOlderThan(age); err != nil && !errors.Is(err, wal.ErrWriterClosed) {
				t.logger.Warn("ucm: could not seal an aging shared segment", "tier", t.cfg.Name, "err", err)
			}
		}()
	}
}

// accountOf returns shared tier t's admission account; nil for a local tier or a shared one
// without a capacity.
func accountOf(t disk) *tiers.ShareAccount {
	if s, ok := t.(*sharedDisk); ok {
		return s.acct
	}
	return nil
}
