package engine

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// diskTier is one disk tier of the store: a local SSD or a mounted shared file system, with
// one or more paths. Its segments are spread across the paths by segment number; its space is
// accounted exactly (tiers.Space) and, when it can run out of room or has a slower tier below
// it, every block in it is tracked for LRU eviction.
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
	// acct is a shared tier's admission account (opened in share_space.go); nil for other
	// tiers and a shared tier without a capacity.
	acct *tiers.ShareAccount
	// sealing: a seal-age request to w (0) or rw (1) is in flight (sealAgedShared).
	sealing [2]atomic.Bool
	// deferred is how long background eviction from this tier has waited for a shared next
	// tier's share while writers wait here (evict). Guarded by the engine's reclaimMu.
	deferred deferral
}

// deferral measures a wait for a shared tier's share in the sharing passes that ran during it
// as well as in time: a grant comes from a pass, and on a loaded machine or a slow shared file
// system a pass takes longer than its interval.
type deferral struct {
	since  time.Time // zero: not waiting
	passes int64     // the sharing passes started when the wait began
}

// over starts the wait if it has not started and says whether it has lasted at least n passes
// and n intervals, or cap (a shared file system that stalls passes does not hold writers up
// past cap).
func (d *deferral) over(passes int64, n int, interval, cap time.Duration) bool {
	if d.since.IsZero() {
		d.since, d.passes = time.Now(), passes
		return false
	}
	waited := time.Since(d.since)
	// A pass counted here started after the wait began; the one after it started once it ended.
	return waited >= cap || (passes-d.passes > int64(n) && waited >= time.Duration(n)*interval)
}

// reset ends the wait: room came, or the blocks went elsewhere.
func (d *deferral) reset() { d.since = time.Time{} }

// segHome says where a segment lives.
type segHome struct {
	tier     *diskTier
	dir      string
	reserved int64 // bytes reserved at creation while active; 0 once sealed or found at Open
}

// tierConfigs returns the configured tiers, or the default: one unlimited disk tier in the
// store directory, with the engine-wide I/O settings.
func (o Options) tierConfigs(dir string) []tiers.Config {
	if len(o.Tiers) > 0 {
		out := make([]tiers.Config, len(o.Tiers))
		for i, c := range o.Tiers {
			out[i] = c.WithDefaults()
		}
		return out
	}
	return []tiers.Config{tiers.Config{Name: "disk", Kind: tiers.KindDisk, Paths: []string{dir}}.WithDefaults()}
}

// loadStoredTiers makes an engine opened by a tool (AdoptStoredSchema, no Tiers given) use the
// tiers the store was last opened with, so that its segments on other paths are found.
func (e *Engine) loadStoredTiers() error {
	ts, err := e.storedTiers()
	if err != nil || !e.opts.AdoptStoredSchema || len(e.opts.Tiers) > 0 {
		return err
	}
	if len(ts) > 0 {
		e.opts.Tiers = ts
	}
	return nil
}

// storedTiers returns the tier configuration the store recorded (nil for none or the default),
// and remembers its segment directories: a segment found in one that no configured tier has
// is refused by recovery rather than forgotten (see checkDroppedPaths).
func (e *Engine) storedTiers() ([]tiers.Config, error) {
	v, ok, err := e.ix.Meta(metaTiers)
	if err != nil || !ok {
		return nil, err
	}
	var ts []tiers.Config
	if err := json.Unmarshal(v, &ts); err != nil {
		return nil, fmt.Errorf("open %s: index meta %s malformed: %w", e.dir, metaTiers, ErrCorrupt)
	}
	adopting := e.opts.AdoptStoredSchema && len(e.opts.Tiers) == 0
	for i := range ts {
		for k, p := range ts[i].Paths {
			p = e.resolveRecordedPath(p)
			ts[i].Paths[k] = p
			if ts[i].Kind == tiers.KindDisk && !ts[i].Shared {
				if other := e.foreignStore(p); other != "" {
					if adopting {
						return nil, e.errForeignTierPath(ts[i].Name, p, other, true)
					}
					// The configuration given replaces it: never look at, refuse for or
					// delete the other store's segments.
					e.opts.Logger.Warn("ucm: the store recorded a tier path inside another store (a copy of it); the configured tiers replace it",
						"dir", e.dir, "tier", ts[i].Name, "path", p, "other_store", other)
					continue
				}
			}
			e.storedDirs = append(e.storedDirs, filepath.Join(e.tierRoot(ts[i], p), SegmentDir))
		}
	}
	if len(ts) > 0 && tiers.Validate(ts) != nil {
		return nil, fmt.Errorf("open %s: index meta %s malformed: %w", e.dir, metaTiers, ErrCorrupt)
	}
	return ts, nil
}

// checkDroppedPaths refuses to forget registered segment row when its file is in a directory of a
// tier the store was last opened with and that the configuration no longer has: a path removed
// from the tiers by mistake would otherwise turn its whole content into misses. Move the
// blocks off it first (ucm-tool evict --tier NAME --to 0) or put the path back. A segment there
// that holds no indexed block is deleted.
func (e *Engine) checkDroppedPaths(row index.SegmentMeta) error {
	n := row.Number
	for _, d := range e.storedDirs {
		if e.dirInUse(d) {
			continue
		}
		path := wal.SegmentPath(d, n)
		if _, err := e.fs.Stat(path); err != nil {
			continue
		}
		if row.LiveRecords == 0 {
			// Nothing in it is indexed: it goes with the path.
			if err := e.fs.Remove(path); err != nil {
				return fmt.Errorf("open %s: remove empty segment %s of a dropped tier path: %w", e.dir, path, err)
			}
			return wal.SyncDir(e.fs, d)
		}
		return fmt.Errorf("open %s: segment %d (%d blocks) is in %s, a path the store's tiers had and the configuration no longer has; put the path back in a tier, or evict its tier to 0 bytes first: %w",
			e.dir, n, row.LiveRecords, filepath.Dir(d), ErrInvalidArgument)
	}
	return nil
}

// dirInUse reports whether segment directory d belongs to a configured tier.
func (e *Engine) dirInUse(d string) bool {
	for _, t := range e.tiers {
		for _, td := range t.dirs {
			if filepath.Clean(td) == filepath.Clean(d) {
				return true
			}
		}
	}
	return false
}

// storedStoreDir stands for the store directory among the recorded tier paths, so that a
// copied or moved store finds its own segments where it is now; other paths inside the store
// are recorded relative to it too, paths outside it absolute (tierpath.go).
const storedStoreDir = "."

// recordTiers records the tier configuration in use, for tools (see loadStoredTiers).
func (e *Engine) recordTiers() error {
	cfgs := withoutMooncake(e.opts.tierConfigs(e.dir))
	for i := range cfgs {
		paths := make([]string, len(cfgs[i].Paths))
		for k, p := range cfgs[i].Paths {
			paths[k] = e.recordedPath(p)
		}
		cfgs[i].Paths = paths
	}
	b, err := json.Marshal(cfgs)
	if err != nil {
		return err
	}
	if old, ok, _ := e.ix.Meta(metaTiers); ok && string(old) == string(b) {
		return nil
	}
	return e.ix.SetMeta(metaTiers, b, true)
}

// SegmentDirs returns the segment directory of every path of every disk tier, fastest tier
// first (for tools).
func (e *Engine) SegmentDirs() []string {
	var out []string
	for _, t := range e.tiers {
		out = append(out, t.dirs...)
	}
	return out
}

// SegmentPath returns the file path of segment n and whether the engine knows it (for tools).
func (e *Engine) SegmentPath(n uint64) (string, bool) {
	h, ok := e.home(n)
	if !ok {
		return "", false
	}
	return wal.SegmentPath(h.dir, n), true
}

// openTiers builds the tier stack: the memory cache and every disk tier with its directories
// (created unless read-only), locks, I/O backend and direct-I/O mode.
func (e *Engine) openTiers() error {
	cfgs := e.opts.tierConfigs(e.dir)
	backends := map[devio.IOEngine]devio.Backend{}
	for _, c := range cfgs {
		if c.Kind == tiers.KindMemory {
			e.mem = tiers.NewMemCache(c.Name, c.Capacity)
			e.caches = append(e.caches, e.mem)
			continue
		}
		if c.Kind == tiers.KindMooncake {
			if err := e.checkMooncakeTier(c); err != nil {
				return err
			}
			continue
		}
		local := c.Capacity
		if c.Shared {
			// A shared tier's capacity is global (every instance's bytes together), enforced
			// by the reclaimer lease holder (share_reclaim.go), not per instance: a local
			// bound would evict this instance's blocks by its own recency alone.
			local = 0
		}
		t := &diskTier{pos: len(e.tiers), cfg: c, space: tiers.NewSpace(local, c.HighWatermark, c.LowWatermark),
			segSize: SegmentSizeFor(e.opts.SegmentSize, c.Capacity)}
		eng := e.opts.IOEngine
		if c.IOEngine != "" && c.IOEngine != "auto" {
			var err error
			if eng, err = devio.ParseIOEngine(c.IOEngine); err != nil {
				return fmt.Errorf("open %s: tier %q: %w: %w", e.dir, c.Name, ErrInvalidArgument, err)
			}
		}
		if b := backends[eng]; b != nil {
			t.io = b
		} else {
			b, err := devio.NewBackend(eng, e.opts.QueueDepth, e.opts.Logger)
			if err != nil {
				return fmt.Errorf("open %s: tier %q: io engine %s: %w", e.dir, c.Name, eng, err)
			}
			backends[eng] = b
			e.backends = append(e.backends, b)
			t.io = b
		}
		mode := e.opts.DirectIO
		if c.DirectIO != "" && c.DirectIO != "auto" {
			var err error
			if mode, err = devio.ParseDirectMode(c.DirectIO); err != nil {
				return fmt.Errorf("open %s: tier %q: %w: %w", e.dir, c.Name, ErrInvalidArgument, err)
			}
		}
		for _, p := range c.Paths {
			if !c.Shared {
				// A shared path is shared by design; any other belongs to one store.
				if other := e.foreignStore(p); other != "" {
					return e.errForeignTierPath(c.Name, p, other, false)
				}
			}
			// A shared path holds one namespace per instance; this one writes only its own.
			own := e.tierRoot(c, p)
			segDir := filepath.Join(own, SegmentDir)
			if !e.opts.ReadOnly {
				if err := e.fs.MkdirAll(segDir, 0o755); err != nil {
					return fmt.Errorf("open tier %q: %w", c.Name, err)
				}
			}
			if filepath.Clean(own) != filepath.Clean(e.dir) {
				// Another store using this path (or namespace) would reuse our segment numbers.
				lock, err := e.fs.Lock(filepath.Join(own, LockFile))
				if err != nil {
					if isLockHeld(err) {
						return fmt.Errorf("open tier %q: path %s is in use by another store: %w", c.Name, p, ErrLocked)
					}
					return fmt.Errorf("open tier %q: lock %s: %w", c.Name, p, err)
				}
				t.locks = append(t.locks, lock)
				if !e.opts.ReadOnly {
					for d := own; ; d = filepath.Dir(d) {
						if err := wal.SyncDir(e.fs, d); err != nil {
							return fmt.Errorf("open tier %q: %w", c.Name, err)
						}
						if d == filepath.Clean(p) || d == filepath.Dir(d) {
							break
						}
					}
				}
			}
			t.dirs = append(t.dirs, segDir)
		}
		if err := e.openSharedAccount(t); err != nil {
			return err
		}
		t.direct = devio.DirectOff
		switch mode {
		case devio.DirectOn:
			t.direct = devio.DirectOn
		case devio.DirectAuto:
			if !e.opts.ReadOnly {
				ok, err := devio.ProbeDirect(e.fs, t.dirs[0])
				if err != nil {
					return fmt.Errorf("open tier %q: %w", c.Name, err)
				}
				if ok {
					t.direct = devio.DirectOn
				}
			}
		}
		e.tiers = append(e.tiers, t)
	}
	if len(e.tiers) == 0 {
		return fmt.Errorf("open %s: no disk tier configured: %w", e.dir, ErrInvalidArgument)
	}
	// Eviction needs recency only where a tier can fill up or can hand blocks down.
	for i, t := range e.tiers {
		if t.cfg.Capacity > 0 || i+1 < len(e.tiers) {
			t.lru = tiers.NewLRU()
		}
	}
	first := e.tiers[0]
	e.io, e.direct, e.segDir = first.io, first.direct, first.dirs[0]
	return nil
}

// tierRoot is the directory of tier path p this instance owns: p itself, or for a shared tier
// its namespace under p (tiers.NamespaceDir).
func (e *Engine) tierRoot(c tiers.Config, p string) string {
	if c.Shared {
		return tiers.NamespaceDir(p, e.instance)
	}
	return p
}

// isLockHeld reports whether a failed Lock means another holder: errLockHeld (this process),
// EAGAIN, EWOULDBLOCK or (on some systems) EACCES from fcntl or flock, or the "lock held by
// current process" of Pebble's in-memory file system. Opening the
// LOCK file itself can fail with EACCES too (no permission): that comes wrapped in a
// *fs.PathError and is not a held lock.
func isLockHeld(err error) bool {
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		return false
	}
	return errors.Is(err, errLockHeld) || errorsIsAny(err, syscall.EAGAIN, syscall.EACCES, syscall.EWOULDBLOCK) ||
		strings.Contains(err.Error(), "lock held by current process")
}

// home returns where segment n lives.
func (e *Engine) home(n uint64) (segHome, bool) {
	e.segMu.RLock()
	h, ok := e.homes[n]
	e.segMu.RUnlock()
	return h, ok
}

// segPath returns segment n's file path (in the first tier's first directory when unknown).
func (e *Engine) segPath(n uint64) string {
	if h, ok := e.home(n); ok {
		return wal.SegmentPath(h.dir, n)
	}
	return wal.SegmentPath(e.segDir, n)
}

// tierOf returns the tier holding segment n (for a foreign alias, the shared tier it was
// found in), or nil.
func (e *Engine) tierOf(n uint64) *diskTier {
	if isForeign(n) {
		fs, _ := e.foreignSegment(n)
		return fs.tier
	}
	h, ok := e.home(n)
	if !ok {
		return nil
	}
	return h.tier
}

// allocSegment hands out a new segment number, shared by every writer of the store.
func (e *Engine) allocSegment() uint64 { return e.nextSeg.Add(1) - 1 }

// reservation is the most a new segment of t can grow to: its segment size, or one record with
// its header and footer when a record is larger.
func (e *Engine) reservation(t *diskTier) int64 {
	return max(t.segSize, format.SegmentHeaderSize+e.opts.Layout.RecordBytes()+format.FooterSize(1))
}

// startWriters starts each tier's relocation writer and the first tier's dump writer.
func (e *Engine) startWriters() error {
	for _, t := range e.tiers {
		for _, relocation := range []bool{false, true} {
			if !relocation && t.pos != 0 {
				continue
			}
			var (
				onFlight func(wal.FlightTiming)
				syncs    *atomic.Int64
			)
			if !relocation {
				onFlight, syncs = e.opts.OnFlight, &e.stats.dumpSyncs
			}
			w, err := wal.NewWriter(wal.Options{
				FS: e.fs, SegmentSize: t.segSize, Sync: e.opts.SyncPolicy, SyncInterval: e.opts.SyncInterval,
				Direct: t.direct, Backend: t.io, Instance: e.instance, Schema: e.fingerprint, Hooks: (*walHooks)(e),
				Logger: e.opts.Logger, OnSegment: e.addSegment, Allocate: e.allocSegment,
				DirFor: e.placer(t), Admit: e.admitter(t, relocation),
				// Dumps arrive in streams: have the next segment ready before the active one
				// fills. Relocations come in bursts; their writer creates segments as needed.
				PrepareNext: !relocation,
				OnFlight:    onFlight,
				DataSyncs:   syncs,
				// Layer-wise dumps write batch records through the first tier's dump writer;
				// relocation writers keep the blocks of a batch layer-major (relocateBatches).
				BatchRecords: !e.opts.StageLayerWise,
			})
			if err != nil {
				return err
			}
			if relocation {
				t.rw = w
			} else {
				t.w = w
			}
		}
	}
	e.w = e.tiers[0].w
	return nil
}

// placer returns the DirFor of t's writers: placement by segment number across t's paths. The
// segment's home is recorded before its file is created, so readers and accounting find it.
func (e *Engine) placer(t *diskTier) func(uint64) string {
	return func(n uint64) string {
		dir := tiers.PathFor(t.dirs, n)
		e.segMu.Lock()
		e.homes[n] = segHome{tier: t, dir: dir, reserved: e.reservation(t)}
		e.segMu.Unlock()
		return dir
	}
}

// admitter returns the Admit of one of t's writers: a new segment reserves its largest size
// under t's capacity; dumps wait (up to TaskTimeout) for reclamation to make room. A recycled
// file in the segment's directory is handed to the writer to reuse, its bytes counted towards
// the reservation.
func (e *Engine) admitter(t *diskTier, relocation bool) func(uint64, string) (string, error) {
	return func(n uint64, dir string) (string, error) {
		if !relocation {
			// Relocations are how reclamation frees space: never refused for it.
			if err := e.admitSpace(t, dir); err != nil {
				return "", fmt.Errorf("tier %q: %w", t.cfg.Name, err)
			}
		}
		rc := &reservationRecycler{e: e, t: t, dir: dir}
		kick := e.kickReclaimer
		if t.acct != nil {
			kick = func() { e.kickReclaimer(); e.kickSharing() } // ask the lease holder for room
		}
		if _, err := t.space.Reserve(e.reservation(t), relocation, e.opts.TaskTimeout, e.stop, kick, rc); err != nil {
			e.kickReclaimer()
			return "", fmt.Errorf("tier %q: %w: %w", t.cfg.Name, ErrNoSpace, err)
		}
		return rc.taken.path, nil
	}
}

// kickReclaimer asks the reclaimer to look at the tiers now (one that a writer waits on is
// over its high watermark: tiers.Space.OverHigh).
func (e *Engine) kickReclaimer() {
	select {
	case e.reclaimKick <- struct{}{}:
	default:
	}
}

// settleSealed replaces a sealed segment's reservation by its final size.
func (e *Engine) settleSealed(n uint64, size int64) {
	e.segMu.Lock()
	h, ok := e.homes[n]
	if ok {
		reserved := h.reserved
		h.reserved = 0
		e.homes[n] = h
		e.segMu.Unlock()
		if reserved > 0 {
			h.tier.space.Add(size - reserved)
		}
		return
	}
	e.segMu.Unlock()
}

// accountSegments accounts every registered segment whose file was found to its tier (also
// for read-only engines, so that TierStats.Used is right for tools).
func (e *Engine) accountSegments() {
	for _, row := range e.ix.Segments() {
		if t := e.tierOf(row.Number); t != nil {
			t.space.Add(row.Size)
		}
	}
}

// initAccounting accounts every registered segment to its tier and, for tiers that evict,
// loads every block into the tier's recency list, oldest written first (recency is not
// persisted: write order is the best prior after a restart).
func (e *Engine) initAccounting() error {
	e.accountSegments()
	need := false
	for _, t := range e.tiers {
		need = need || t.lru != nil
	}
	if !need {
		close(e.recencyReady)
		return nil
	}
	// Recency is rebuilt in the background: Open does not wait for a walk of the whole index
	// (1M blocks: ~2 s). Blocks dumped or touched meanwhile keep their place ahead of the
	// loaded ones (AddColdest); eviction waits for the fill (see waitRecency).
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		defer close(e.recencyReady)
		err := e.fillWriteOrder(func(loc index.Location) *tiers.LRU {
			if t := e.tierOf(loc.Segment); t != nil {
				return t.lru
			}
			return nil
		})
		if err != nil && !errors.Is(err, ErrClosed) {
			e.opts.Logger.Error("ucm: loading recency failed; eviction falls back to what was touched since Open", "err", err)
		}
	}()
	return nil
}

// waitRecency waits until the recency lists are loaded; false if the engine stops first.
func (e *Engine) waitRecency() bool {
	select {
	case <-e.recencyReady:
		return true
	case <-e.stop:
		return false
	}
}

// fillWriteOrder adds every indexed block to the recency list pick returns for its location
// (none when nil) behind the blocks it already holds, newest first, so that the list ends in
// write order. It stops with ErrClosed when the engine stops.
func (e *Engine) fillWriteOrder(pick func(index.Location) *tiers.LRU) error {
	type entry struct {
		lru  *tiers.LRU
		id   BlockID
		seq  uint64
		size int64
	}
	var all []entry
	stopped := false
	err := e.ix.Iterate(func(id BlockID, loc index.Location) bool {
		if lru := pick(loc); lru != nil {
			all = append(all, entry{lru, id, loc.Seq, loc.RecordBytes()})
		}
		if len(all)%4096 == 0 {
			select {
			case <-e.stop:
				stopped = true
				return false
			default:
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	if stopped {
		return ErrClosed
	}
	slices.SortFunc(all, func(a, b entry) int { return cmp.Compare(b.seq, a.seq) })
	for _, x := range all {
		x.lru.AddColdest(x.id, x.size)
	}
	return nil
}

// TierStats is the state of one tier.
type TierStats struct {
	Name     string
	Kind     tiers.Kind
	Paths    []string
	Capacity int64 // bytes; 0: unlimited
	// SegmentSize is the size at which the tier's segments are sealed (disk tiers; chosen
	// from Capacity unless Options.SegmentSize sets it: SegmentSizeFor).
	SegmentSize int64
	// Used is the accounted bytes: every segment file's size, active segments at their
	// reservation, and the retired files kept for reuse. It never exceeds Capacity by more
	// than one segment.
	Used int64
	// Recycled is the part of Used held by retired segment files kept for reuse
	// (Options.RecycleSegments): within the headroom above the high watermark.
	Recycled  int64
	FileBytes int64 // sum of the segment rows' sizes
	LiveBytes int64 // bytes of records the index points at
	DeadBytes int64 // FileBytes − LiveBytes: reclaimable by compaction
	Blocks    int64
	// Sidecars is the number of sidecar records live in the tier (their bytes are in LiveBytes).
	Sidecars int64
	Segments int
	// Cache tiers (memory, Mooncake) only: tiers.CacheStats. Corrupt counts blocks whose cached
	// bytes failed their checksums on a hit (dropped, and loaded from a lower tier instead);
	// for the mooncake tier, objects rejected (tiers.MooncakeStats.Rejected).
	Hits, Misses, Evictions, Corrupt int64
}

// TierStats returns every cache tier (memory, Mooncake) and every disk tier, fastest first.
func (e *Engine) TierStats() []TierStats {
	out := e.cacheTierStats()
	start := len(out)
	for _, t := range e.tiers {
		out = append(out, TierStats{Name: t.cfg.Name, Kind: tiers.KindDisk, Paths: t.cfg.Paths, Capacity: t.cfg.Capacity, SegmentSize: t.segSize, Used: t.space.Used(), Recycled: t.space.Pooled()})
	}
	for _, row := range e.ix.Segments() {
		t := e.tierOf(row.Number)
		if t == nil {
			continue
		}
		s := &out[start+t.pos]
		s.FileBytes += row.Size
		s.LiveBytes += row.LiveBytes
		s.Blocks += row.LiveRecords - row.LiveSidecars
		s.Sidecars += row.LiveSidecars
		s.Segments++
	}
	for i := start; i < len(out); i++ {
		out[i].DeadBytes = out[i].FileBytes - out[i].LiveBytes
	}
	return out
}

// submit runs ops, each on the I/O backend of the tier tierOf(i) names (the first tier's when
// nil); with one backend (the usual case) it is a single Submit. Per-op errors are in ops.
func (e *Engine) submit(ops []devio.Op, tierOf func(i int) *diskTier) error {
	if len(e.backends) == 1 {
		return e.io.Submit(ops)
	}
	groups := map[devio.Backend][]int{}
	for i := range ops {
		b := e.io
		if t := tierOf(i); t != nil {
			b = t.io
		}
		groups[b] = append(groups[b], i)
	}
	var first error
	for b, idx := range groups {
		sub := make([]devio.Op, len(idx))
		for k, i := range idx {
			sub[k] = ops[i]
		}
		err := b.Submit(sub)
		for k, i := range idx {
			ops[i].Err = sub[k].Err
		}
		if first == nil {
			first = err
		}
	}
	return first
}
