package tiers

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// The layout of a disk tier's path (of its namespace under the path, for a shared tier).
const (
	// SegmentDir is the directory under a tier path (or namespace) that holds the segments.
	SegmentDir = "segments"
	// LockFile is the file a tier locks in each of its paths (namespaces) outside the store
	// directory, so that no other store uses it meanwhile.
	LockFile = "LOCK"
)

// ErrLocked is wrapped by OpenDisk's error when a tier path is in use by another store.
var ErrLocked = errors.New("tier path locked")

// Disk is one disk tier: segment files spread by number over its paths, their space account,
// their segments' recency and the writers that create them. Two kinds implement it: LocalDisk (a
// local file system, one store per path) and SharedDisk (a file system mounted by several
// instances, one namespace each). The index and the routing of a segment number to its tier
// are the embedding engine's (its provider of segments): a block's index entry names its
// segment, and the segment its Disk, never found by probing the tiers.
//
// A Disk is safe for concurrent use, except SetCodec, called once before OpenWriters.
// Lock order: a LocalDisk's recycle pool lock is taken before its Space's lock; a Disk holds
// neither while it calls its DiskEnv, and never takes the engine's locks.
type Disk interface {
	// Tier: Name, Kind (KindDisk) and Close, which releases the path locks (the engine
	// closes the writers first).
	Tier
	// Config is the tier's configuration as given (with defaults).
	Config() Config
	// Pos is the tier's position among the disk tiers, 0 = fastest.
	Pos() int
	// Shared reports a tier shared by several instances (SharedDisk).
	Shared() bool
	// Dirs are the segment directories, one per path.
	Dirs() []string
	// Place returns the directory segment n is created in: PathFor(Dirs(), n).
	Place(n uint64) string
	// SegmentSize is the size at which segments are sealed.
	SegmentSize() int64
	// Reservation is the most a new segment can grow to: its segment size, or one record with
	// its header and footer when a record is larger.
	Reservation() int64
	// Space is the tier's exact byte account.
	Space() *Space
	// Recency is the recency of the tier's segments, which eviction takes least recently
	// used first; nil when the tier never evicts on its own (eviction then goes by write
	// order).
	Recency() *Recency
	// Codec is how raw records are stored on their way into the tier (dumps into the first
	// tier, relocations into any); records already compressed are moved as they are.
	Codec() format.Compression
	// SetCodec sets Codec, once the schema is final and before OpenWriters.
	SetCodec(format.Compression)
	// Backend and Direct are the tier's I/O backend and direct-I/O mode.
	Backend() devio.Backend
	Direct() devio.DirectMode
	// OpenWriters starts the relocation writer and, when dump is true, the dump writer, from
	// base (the engine's part: hooks, placement, sync policy); the tier sets its segment size,
	// I/O, preparation of the next segment (dumps only) and admission (Admit). base's OnFlight
	// and DataSyncs are the dump writer's only.
	OpenWriters(base wal.Options, dump bool) error
	// Writer returns the relocation writer (compaction, demotion into the tier, promotion
	// from below) or the dump writer (nil below the first tier); nil before OpenWriters.
	Writer(relocation bool) *wal.Writer
	// Admit is a writer's Admit: a new segment in dir reserves Reservation() in Space, dumps
	// (not relocations) waiting up to DiskOptions.TaskTimeout for reclamation to make room
	// and passing DiskEnv.AdmitStore first. It returns a recycled file of dir to reuse ("" for
	// none), its bytes counted towards the reservation. A refusal wraps ErrNoSpace.
	Admit(n uint64, dir string, relocation bool) (reuse string, err error)
	// OpenSegment opens sealed segment n of generation in dir for reading.
	OpenSegment(dir string, n, generation uint64) (*wal.Segment, error)
	// Unlink removes retired segment n's file of size bytes in dir, or keeps it for reuse
	// (kept) when recyclable and the kind keeps files, and makes that durable (dir synced).
	// On an error the file may still be there and its bytes stay accounted.
	Unlink(n uint64, dir string, size int64, recyclable bool) (kept bool, err error)
	// Released returns an unlinked segment's bytes to Space: as pooled bytes when Unlink kept
	// its file, else freed. The engine calls it after Unlink, once it has forgotten the row.
	Released(dir string, n uint64, size int64, kept bool)
	// FoundRecycled takes a recycled file found at Open in dir into the tier's pool, accounted
	// in Space, and returns its size; false when the tier cannot reuse it (the caller deletes
	// it).
	FoundRecycled(path, dir string) (size int64, ok bool)
	// Usage is the tier's own accounting.
	Usage() DiskUsage
}

// DiskUsage is a disk tier's own accounting (the engine adds its index's totals).
type DiskUsage struct {
	// Used is Space().Used(): every segment file's size, active segments at their
	// reservation, and the retired files kept for reuse.
	Used int64
	// Recycled is the part of Used held by retired files kept for reuse.
	Recycled int64
	// Capacity is the configured capacity (0: unlimited); SegmentSize the seal size.
	Capacity, SegmentSize int64
}

// DiskEnv is what a disk tier needs from the engine that embeds it. Its methods are called
// without any of the tier's locks held.
type DiskEnv interface {
	// AdmitStore checks the store file system's own reserve before a dump's new segment of
	// reservation bytes is created in dir (nil when dir is on another file system).
	AdmitStore(dir string, reservation int64) error
	// KickReclaimer asks the reclaimer to look at the tiers now (a writer waits for room).
	KickReclaimer()
	// KickSharer asks the sharer for a pass: the lease holder grants a SharedDisk room.
	KickSharer()
	// Stop is closed when the engine stops: a waiting Admit gives up.
	Stop() <-chan struct{}
}

// DiskOptions is what every disk tier is opened with: the engine-wide settings a tier's own
// configuration may override, and where its I/O backend comes from.
type DiskOptions struct {
	FS       vfs.FS
	ReadOnly bool
	// Instance names a SharedDisk's namespace (NamespaceDir).
	Instance format.InstanceID
	// StoreDir is the store's directory: its own lock covers a tier path equal to it, every
	// other path (namespace) gets a lock of its own (LockFile).
	StoreDir string
	// IOEngine and DirectIO apply where the tier's Config leaves them "" or "auto".
	IOEngine devio.IOEngine
	DirectIO devio.DirectMode
	// SegmentSize is the tier's seal size (the engine's choice from the capacity).
	SegmentSize int64
	// RecordBytes returns one block record's size, the least a segment reserves for (a
	// function: the layout may become final only after the tiers are opened).
	RecordBytes func() int64
	// RecycleSegments is how many retired files a LocalDisk keeps per directory (<= 0: none).
	RecycleSegments int
	// TaskTimeout bounds a dump's wait for room in Admit.
	TaskTimeout time.Duration
	// HasLower says a slower disk tier follows this one: it then keeps recency (Recency) to
	// evict by, as does a tier with a capacity.
	HasLower bool
	Logger   *slog.Logger
	// Backend returns the I/O backend of an engine, shared by the tiers that use it.
	Backend func(devio.IOEngine) (devio.Backend, error)
	// LockHeld reports whether a failed lock means another holder (nil: every lock error
	// does).
	LockHeld func(error) bool
	// ErrNoSpace and ErrLocked, when set, are wrapped too by an admission refusal and a held
	// lock, so that the engine's callers test its own errors.
	ErrNoSpace, ErrLocked error
}

// OpenDisk opens disk tier c at position pos: its segment directories (created unless
// read-only), a lock on each path outside the store directory (a second open of a path fails
// with ErrLocked), its I/O backend and direct-I/O mode. A shared tier (c.Shared) is a
// SharedDisk whose paths hold one namespace per instance, this one owning only its own; any
// other a LocalDisk. A setting that does not parse fails with ErrInvalidConfig.
func OpenDisk(c Config, pos int, o DiskOptions, env DiskEnv) (_ Disk, err error) {
	local := c.Capacity
	if c.Shared {
		// A shared tier's capacity is global (every instance's bytes together), enforced by
		// the reclaimer lease holder, not per instance: a local bound would evict this
		// instance's blocks by its own recency alone.
		local = 0
	}
	t := &diskBase{pos: pos, cfg: c, space: NewSpace(local, c.HighWatermark, c.LowWatermark),
		segSize: o.SegmentSize, fs: o.FS, logger: o.Logger, timeout: o.TaskTimeout, env: env,
		recordBytes: o.RecordBytes, errNoSpace: o.ErrNoSpace}
	if t.logger == nil {
		t.logger = slog.Default()
	}
	// Eviction needs recency only where a tier can fill up or can hand blocks down.
	if c.Capacity > 0 || o.HasLower {
		t.recency = NewRecency()
	}
	defer func() {
		if err != nil {
			_ = t.Close()
		}
	}()
	eng := o.IOEngine
	if c.IOEngine != "" && c.IOEngine != "auto" {
		if eng, err = devio.ParseIOEngine(c.IOEngine); err != nil {
			return nil, fmt.Errorf("tier %q: %w: %w", c.Name, ErrInvalidConfig, err)
		}
	}
	if t.io, err = o.Backend(eng); err != nil {
		return nil, fmt.Errorf("open %s: tier %q: io engine %s: %w", o.StoreDir, c.Name, eng, err)
	}
	mode := o.DirectIO
	if c.DirectIO != "" && c.DirectIO != "auto" {
		if mode, err = devio.ParseDirectMode(c.DirectIO); err != nil {
			return nil, fmt.Errorf("tier %q: %w: %w", c.Name, ErrInvalidConfig, err)
		}
	}
	for _, p := range c.Paths {
		own := TierRoot(c, p, o.Instance)
		segDir := filepath.Join(own, SegmentDir)
		if !o.ReadOnly {
			if err := MkdirAllStale(o.FS, segDir, 0o755); err != nil {
				return nil, fmt.Errorf("open tier %q: %w", c.Name, err)
			}
		}
		if filepath.Clean(own) != filepath.Clean(o.StoreDir) {
			// Another store using this path (or namespace) would reuse our segment numbers.
			lock, err := o.FS.Lock(filepath.Join(own, LockFile))
			if err != nil {
				if o.LockHeld == nil || o.LockHeld(err) {
					if o.ErrLocked != nil {
						return nil, fmt.Errorf("open tier %q: path %s is in use by another store: %w: %w", c.Name, p, o.ErrLocked, ErrLocked)
					}
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
		return &SharedDisk{diskBase: t}, nil
	}
	return &LocalDisk{diskBase: t, recycleMax: o.RecycleSegments}, nil
}

// TierRoot is the directory of tier path p that instance owns: p itself, or for a shared tier
// its namespace under p (NamespaceDir).
func TierRoot(c Config, p string, instance format.InstanceID) string {
	if c.Shared {
		return NamespaceDir(p, instance)
	}
	return p
}

// diskBase is what both disk kinds share.
type diskBase struct {
	pos     int
	cfg     Config
	dirs    []string
	locks   []io.Closer
	io      devio.Backend
	direct  devio.DirectMode
	w, rw   *wal.Writer
	space   *Space
	recency *Recency
	codec   format.Compression
	// segSize is the size at which segments are sealed.
	segSize     int64
	recordBytes func() int64
	fs          vfs.FS
	logger      *slog.Logger
	timeout     time.Duration // how long a dump waits for room
	env         DiskEnv
	errNoSpace  error
}

// Name is the configured name.
func (t *diskBase) Name() string { return t.cfg.Name }

// Kind is KindDisk.
func (t *diskBase) Kind() Kind { return KindDisk }

// Config is the tier's configuration.
func (t *diskBase) Config() Config { return t.cfg }

// Pos is the tier's position among the disk tiers.
func (t *diskBase) Pos() int { return t.pos }

// Shared reports a shared tier.
func (t *diskBase) Shared() bool { return t.cfg.Shared }

// Dirs are the segment directories, one per path.
func (t *diskBase) Dirs() []string { return t.dirs }

// Place returns the directory segment n is created in.
func (t *diskBase) Place(n uint64) string { return PathFor(t.dirs, n) }

// SegmentSize is the seal size.
func (t *diskBase) SegmentSize() int64 { return t.segSize }

// Space is the tier's byte account.
func (t *diskBase) Space() *Space { return t.space }

// Recency is the recency of the tier's segments, or nil.
func (t *diskBase) Recency() *Recency { return t.recency }

// Codec is the tier's record compression.
func (t *diskBase) Codec() format.Compression { return t.codec }

// SetCodec sets Codec, before OpenWriters.
func (t *diskBase) SetCodec(c format.Compression) { t.codec = c }

// Backend is the tier's I/O backend.
func (t *diskBase) Backend() devio.Backend { return t.io }

// Direct is the tier's direct-I/O mode.
func (t *diskBase) Direct() devio.DirectMode { return t.direct }

// Reservation is the most a new segment can grow to.
func (t *diskBase) Reservation() int64 {
	return max(t.segSize, format.SegmentHeaderSize+t.recordBytes()+format.FooterSize(1))
}

// Writer returns the relocation or the dump writer.
func (t *diskBase) Writer(relocation bool) *wal.Writer {
	if relocation {
		return t.rw
	}
	return t.w
}

// OpenSegment opens sealed segment n for reading.
func (t *diskBase) OpenSegment(dir string, n, generation uint64) (*wal.Segment, error) {
	return wal.OpenSegmentForRead(t.fs, dir, n, generation, t.direct, t.io)
}

// Usage is the tier's own accounting.
func (t *diskBase) Usage() DiskUsage {
	return DiskUsage{Used: t.space.Used(), Recycled: t.space.Pooled(), Capacity: t.cfg.Capacity, SegmentSize: t.segSize}
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

// openWriters starts the writers (Disk.OpenWriters) with admit as their admission.
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
			o.OnFlight, o.DataSyncs = nil, nil // the dump writer's diagnostics
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

// admit reserves a new segment's room (Disk.Admit); kick asks for room while a dump waits, rc
// hands recycled files to the reservation (nil: none).
func (t *diskBase) admit(dir string, relocation bool, kick func(), rc Recycler) error {
	if !relocation {
		// Relocations are how reclamation frees space: never refused for it.
		if err := t.env.AdmitStore(dir, t.Reservation()); err != nil {
			return fmt.Errorf("tier %q: %w", t.cfg.Name, err)
		}
	}
	if _, err := t.space.Reserve(t.Reservation(), relocation, t.timeout, t.env.Stop(), kick, rc); err != nil {
		t.env.KickReclaimer()
		if t.errNoSpace != nil {
			return fmt.Errorf("tier %q: %w: %w", t.cfg.Name, t.errNoSpace, err)
		}
		return fmt.Errorf("tier %q: %w", t.cfg.Name, err)
	}
	return nil
}

// remove deletes retired segment n's file in dir and syncs dir.
func (t *diskBase) remove(n uint64, dir string) error {
	path := wal.SegmentPath(dir, n)
	if err := t.fs.Remove(path); err != nil && !oserror.IsNotExist(err) {
		return fmt.Errorf("delete retired segment %s: %w", path, err)
	}
	if err := wal.SyncDir(t.fs, dir); err != nil {
		return fmt.Errorf("sync %s after deleting segment %d: %w", dir, n, err)
	}
	return nil
}

// fileSize returns the size of the file at path, -1 if it cannot be read.
func fileSize(fs vfs.FS, path string) int64 {
	st, err := fs.Stat(path)
	if err != nil {
		return -1
	}
	return st.Size()
}

var (
	_ Disk = (*LocalDisk)(nil)
	_ Disk = (*SharedDisk)(nil)
)
