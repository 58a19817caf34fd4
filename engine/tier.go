package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

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
		for _, td := range t.Dirs() {
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
		out = append(out, t.Dirs()...)
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

// openTiers builds the tier chain, one configuration at a time by kind: the cache tiers
// (tiers.OpenCache; the mooncake tier once the schema is final, openCaches) and every disk tier
// (tiers.OpenDisk) with its directories (created unless read-only), locks, I/O backend and
// direct-I/O mode.
func (e *Engine) openTiers() error {
	cfgs := e.opts.tierConfigs(e.dir)
	backends := map[devio.IOEngine]devio.Backend{}
	o := tiers.DiskOptions{
		FS: e.fs, ReadOnly: e.opts.ReadOnly, Instance: e.instance, StoreDir: e.dir,
		IOEngine: e.opts.IOEngine, DirectIO: e.opts.DirectIO,
		RecordBytes: func() int64 { return e.opts.Layout.RecordBytes() }, RecycleSegments: e.opts.RecycleSegments,
		TaskTimeout: e.opts.TaskTimeout, Logger: e.opts.Logger, LockHeld: isLockHeld,
		ErrNoSpace: ErrNoSpace, ErrLocked: ErrLocked,
		Backend: func(eng devio.IOEngine) (devio.Backend, error) {
			if b := backends[eng]; b != nil {
				return b, nil
			}
			b, err := devio.NewBackend(eng, e.opts.QueueDepth, e.opts.Logger)
			if err != nil {
				return nil, err
			}
			backends[eng] = b
			e.backends = append(e.backends, b)
			return b, nil
		},
	}
	disks := 0
	for _, c := range cfgs {
		if c.Kind != tiers.KindMemory && c.Kind != tiers.KindMooncake {
			disks++
		}
	}
	for _, c := range cfgs {
		switch c.Kind {
		case tiers.KindMemory:
			cache, err := tiers.OpenCache(c, e.cacheOptions())
			if err != nil {
				return fmt.Errorf("open %s: %w", e.dir, err)
			}
			e.mem = cache.(*tiers.MemCache)
			e.caches = append(e.caches, cache)
			continue
		case tiers.KindMooncake:
			// Opened once the schema is final (openCaches).
			if err := e.checkMooncakeTier(c); err != nil {
				return err
			}
			continue
		}
		if !c.Shared {
			for _, p := range c.Paths {
				// A shared path is shared by design; any other belongs to one store.
				if other := e.foreignStore(p); other != "" {
					return e.errForeignTierPath(c.Name, p, other, false)
				}
			}
		}
		o.HasLower = len(e.tiers)+1 < disks
		o.SegmentSize = SegmentSizeFor(e.opts.SegmentSize, c.Capacity)
		t, err := tiers.OpenDisk(c, len(e.tiers), o, diskEnv{e})
		if err != nil {
			if errors.Is(err, tiers.ErrInvalidConfig) {
				return fmt.Errorf("open %s: %w: %w", e.dir, ErrInvalidArgument, err)
			}
			return err
		}
		e.tiers = append(e.tiers, t)
		if err := e.openSharedAccount(t); err != nil {
			return err
		}
	}
	if len(e.tiers) == 0 {
		return fmt.Errorf("open %s: no disk tier configured: %w", e.dir, ErrInvalidArgument)
	}
	first := e.tiers[0]
	e.io, e.direct, e.segDir = first.Backend(), first.Direct(), first.Dirs()[0]
	return nil
}

// tierRoot is the directory of tier path p this instance owns: p itself, or for a shared tier
// its namespace under p (tiers.NamespaceDir).
func (e *Engine) tierRoot(c tiers.Config, p string) string { return tiers.TierRoot(c, p, e.instance) }

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

// allocSegment hands out a new segment number, shared by every writer of the store.
func (e *Engine) allocSegment() uint64 { return e.nextSeg.Add(1) - 1 }

// reservation is the most a new segment of t can grow to (tiers.Disk.Reservation).
func (e *Engine) reservation(t tiers.Disk) int64 { return t.Reservation() }

// startWriters starts each tier's relocation writer and the first tier's dump writer.
func (e *Engine) startWriters() error {
	for _, t := range e.tiers {
		err := t.OpenWriters(wal.Options{
			FS: e.fs, Sync: e.opts.SyncPolicy, SyncInterval: e.opts.SyncInterval,
			Instance: e.instance, Schema: e.fingerprint, Hooks: (*walHooks)(e),
			Logger: e.opts.Logger, OnSegment: e.addSegment, Allocate: e.allocSegment,
			DirFor: e.placer(t), OnFlight: e.opts.OnFlight, DataSyncs: &e.stats.dumpSyncs,
			// Layer-wise dumps write batch records through the first tier's dump writer;
			// relocation writers keep the blocks of a batch layer-major (relocateBatches).
			BatchRecords: !e.opts.StageLayerWise,
		}, t.Pos() == 0)
		if err != nil {
			return err
		}
	}
	e.w = e.tiers[0].Writer(false)
	return nil
}

// kickReclaimer asks the reclaimer to look at the tiers now (one that a writer waits on is
// over its high watermark: tiers.Space.OverHigh).
func (e *Engine) kickReclaimer() {
	if e.rc != nil { // nil until the schema is known: nothing to reclaim yet
		e.rc.kick.Kick()
	}
}

// accountSegments accounts every registered segment whose file was found to its tier (also
// for read-only engines, so that TierStats.Used is right for tools).
func (e *Engine) accountSegments() {
	for _, row := range e.ix.Segments() {
		if t := e.tierOf(row.Number); t != nil {
			t.Space().Add(row.Size)
		}
	}
}

// initAccounting accounts every registered segment to its tier and makes it known to the
// tier's recency (tiers.Recency), as not used since Open: recency is not persisted, and write
// order (segment numbers) is the best prior after a restart. Per segment, not per block: Open
// does not walk the index for it.
func (e *Engine) initAccounting() error {
	e.accountSegments()
	for _, t := range e.tiers {
		e.keepsRecency = e.keepsRecency || t.Recency() != nil
	}
	for _, row := range e.ix.Segments() {
		if t := e.tierOf(row.Number); t != nil && row.State != index.SegmentDeleting {
			t.Recency().Track(row.Number)
		}
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

// chain returns every tier, fastest first: the caches, then the disk tiers.
func (e *Engine) chain() []tiers.Tier {
	out := make([]tiers.Tier, 0, len(e.caches)+len(e.tiers))
	for _, c := range e.caches {
		out = append(out, c)
	}
	for _, t := range e.tiers {
		out = append(out, t)
	}
	return out
}

// TierStats returns every cache tier (memory, Mooncake) and every disk tier, fastest first.
func (e *Engine) TierStats() []TierStats {
	var out []TierStats
	start := len(e.caches) // the first disk tier's row
	for _, t := range e.chain() {
		switch t := t.(type) {
		case tiers.Cache:
			s := t.Usage()
			out = append(out, TierStats{Name: t.Name(), Kind: t.Kind(), Capacity: s.Capacity, Used: s.Bytes, LiveBytes: s.Bytes,
				FileBytes: s.Bytes, Blocks: s.Blocks, Hits: s.Hits, Misses: s.Misses, Evictions: s.Evictions, Corrupt: s.Corrupt})
		case tiers.Disk:
			u := t.Usage()
			out = append(out, TierStats{Name: t.Name(), Kind: t.Kind(), Paths: t.Config().Paths, Capacity: u.Capacity,
				SegmentSize: u.SegmentSize, Used: u.Used, Recycled: u.Recycled})
		}
	}
	for _, row := range e.ix.Segments() {
		t := e.tierOf(row.Number)
		if t == nil {
			continue
		}
		s := &out[start+t.Pos()]
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
func (e *Engine) submit(ops []devio.Op, tierOf func(i int) tiers.Disk) error {
	if len(e.backends) == 1 {
		return e.io.Submit(ops)
	}
	groups := map[devio.Backend][]int{}
	for i := range ops {
		b := e.io
		if t := tierOf(i); t != nil {
			b = t.Backend()
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
