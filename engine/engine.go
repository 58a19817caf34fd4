package engine

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine/internal/lifecycle"
	"github.com/ucm-go/ucm/engine/internal/seam"
	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
	"golang.org/x/sync/semaphore"
)

// Store directory layout.
const (
	// LockFile is the file in the store directory that Open locks.
	LockFile = tiers.LockFile
	// IndexDir holds the Pebble index.
	IndexDir = "index"
	// SegmentDir holds the segment files.
	SegmentDir = tiers.SegmentDir
)

// Meta keys in the index.
const (
	metaSchema      = "engine.schema"
	metaFingerprint = "engine.fingerprint"
	metaInstance    = "engine.instance"
	metaNextSegment = "engine.next_segment"
	metaFormat      = "engine.format_version"
	metaLayout      = "engine.layout"
	metaTiers       = "engine.tiers"
)

// Engine is an open store. All methods are safe for concurrent use.
type Engine struct {
	opts   Options
	dir    string
	segDir string
	fs     vfs.FS
	lock   io.Closer
	ix     *index.Index
	w      *wal.Writer
	io     devio.Backend
	pool   *devio.BufferPool
	cpu    cpuGate
	// runs shares a layer-wise load's index pass with the loads of its other layers
	// (runcache.go).
	runs   runCache
	direct devio.DirectMode // resolved at Open: DirectOn or DirectOff

	instance    format.InstanceID
	fingerprint format.Fingerprint
	recovery    RecoveryReport
	// pendingRecovered holds, during recovery, sidecars met before their block (recover.go).
	pendingRecovered []recordRef
	stats            counters
	metrics          *metrics

	segs segments // the provider: where every segment lives, and the open files (segments.go)

	share *share.Sharing // shared tiers: publication and the foreign index (share.go); nil without

	foundRecycled []foundFile // recycled files found at Open, pooled once tiers are accounted

	tiers      []tiers.Disk // disk tiers, fastest first
	storedDirs []string     // segment directories of the tiers the store last recorded
	// caches are the cache tiers in front of the disk tiers, fastest first (cache.go); mem is
	// the memory tier among them, or nil (it caches sidecars too).
	caches []tiers.Cache
	mem    *tiers.MemCache
	// laterCaches are the configurations of the cache tiers opened once the schema is final
	// (openCaches): the mooncake tier.
	laterCaches []tiers.Config
	backends    []devio.Backend // one per I/O engine in use
	nextSeg     atomic.Uint64   // the next segment number
	nextSegMu   sync.Mutex      // orders writes of metaNextSegment
	// rc is the reclamation of the disk tiers (reclaim.go), made once the schema is known.
	// Lock order: rc.mu → segs.mu → share.mu.
	rc      *reclaimer
	promote chan BlockID // lower-tier hits waiting to be promoted
	// keepsRecency: some disk tier keeps recency (tiers.Recency) and the engine writes; set
	// once at Open.
	keepsRecency bool
	// touches are cache hits whose disk segments the toucher is to touch (touchServed).
	touches chan touchReq

	mu struct {
		sync.Mutex
		inflight     map[BlockID]*inflightDump // whole-record appends in progress
		staging      map[BlockID]*stagingSlot  // partly dumped blocks
		batches      map[string]*layerBatch    // layer-wise dumps written as batch records, by block list
		stagingBytes int64
		// stagingPeak and stagingPeakBlocks are the highest stagingBytes and staged blocks
		// since Open (Stats.StagingPeakBytes).
		stagingPeak, stagingPeakBlocks int64
	}

	space spaceGuard // the store file system's free space (reserve.go)
	// schemaFromFile: the index had no schema record; the schema came from SchemaFile.
	schemaFromFile bool

	// stagingBudget is Options.MaxStagingBytes as a semaphore (staging.go), made by stagingSem.
	stagingBudget *semaphore.Weighted
	stagingOnce   sync.Once

	// life admits tasks (Dump, Load, Evict, Compact...) until Close begins and makes Close
	// wait for them; its Closed channel ends a task's wait for staging memory.
	life *lifecycle.Runner
	stop chan struct{}
	bg   sync.WaitGroup // background goroutines

	// seam is nil except in tests, which set it (setSeam) to force an interleaving of a load
	// with reclamation or with the sharer at the points seamPoint names.
	seam atomic.Pointer[func(p seamPoint, id BlockID)]
}

// seamPoint names a point where Engine.seam is called (the points are in engine/internal/seam,
// where the engine's internal parts name them too).
type seamPoint = seam.Point

// The seam's points, by their engine names.
const (
	seamSidecarLookedUp = seam.SidecarLookedUp
	seamSidecarRead     = seam.SidecarRead
	seamForeignIndexed  = seam.ForeignIndexed
	seamManifestRead    = seam.ManifestRead
	seamForeignMissed   = seam.ForeignMissed
	seamSegmentPinned   = seam.SegmentPinned
)

// atSeam calls the test seam, if any.
func (e *Engine) atSeam(p seamPoint, id BlockID) {
	if f := e.seam.Load(); f != nil {
		(*f)(p, id)
	}
}

// setSeam sets the test seam (nil: none).
func (e *Engine) setSeam(f func(p seamPoint, id BlockID)) {
	if f == nil {
		e.seam.Store(nil)
		return
	}
	e.seam.Store(&f)
}

// RecoveryReport says what Open found and did.
type RecoveryReport struct {
	// SegmentsRecovered counts segments that were active at a crash and were scanned,
	// truncated to their valid end and sealed.
	SegmentsRecovered int
	// TruncatedBytes is what those truncations cut (torn tails). Records that were complete on
	// disk but not indexed are indexed again (they are intact; their dump may not have been
	// acknowledged, which the contract allows: in-flight blocks may be present or absent).
	TruncatedBytes int64
	// EntriesDropped counts index entries removed because their record was not in the valid
	// part of a recovered segment, or their segment file was missing.
	EntriesDropped int
	// OrphansRemoved counts temporary files, and segment files the index does not know that
	// hold no header (created just before a crash, too short or never written), that were
	// deleted.
	OrphansRemoved int
	// SegmentsAdopted counts segment files the index did not register (a lost index being
	// rebuilt, or an index that lost its newest writes) that were recovered and registered;
	// EntriesAdopted the block entries indexed from them or from recovered segments' records
	// the index had lost.
	SegmentsAdopted int
	EntriesAdopted  int
	// RetiredSegmentsDeleted counts segments whose retirement (eviction or compaction) a crash
	// interrupted and recovery finished.
	RetiredSegmentsDeleted int
	// EmptySegmentsDeleted counts segments active at the crash that held no valid record (the
	// dump writer's prepared next segment, or one whose header and first records, written
	// together, never became durable), deleted instead of sealed.
	EmptySegmentsDeleted int
	// MissingSegments lists sealed segments registered in the index whose file is gone.
	MissingSegments []uint64
	// TruncatedSegments lists sealed segments whose file was shorter than recorded: each was
	// sealed again after its last intact record, and the entries of the records cut off are
	// counted in EntriesDropped (and TruncatedBytes what the valid end cut).
	TruncatedSegments []uint64
	// QuarantinedSegments lists segments found unreadable or corrupt by recovery: their
	// blocks are misses, their files kept for inspection (ucm-tool verify reports them).
	QuarantinedSegments []uint64
	// IndexSetAside is where an index Open found unreadable (a damaged or missing MANIFEST,
	// table or marker) was moved (the store directory's index.broken; one copy is kept): the
	// index was rebuilt from the segments, as for a lost index ("" when it was not).
	IndexSetAside string
	// Duration is the time recovery took.
	Duration time.Duration
}

// Open opens (creating if needed) the store in dir. It takes the directory lock (a second
// Open of the same directory, in this or another process and by whatever path, fails with
// ErrLocked), checks the schema fingerprint (ErrSchemaMismatch), recovers segments left
// active by a crash and starts the writer.
func Open(dir string, opts Options) (*Engine, error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, dir: dir, fs: storeFS(opts.FS, opts.FileMode, opts.DirMode, opts.ReadOnly), pool: devio.NewBufferPool(), cpu: newCPUGate(), metrics: newMetrics(),
		segs: newSegments(), stop: make(chan struct{}), life: lifecycle.NewRunner(),
		promote: make(chan BlockID, promoteQueue), touches: make(chan touchReq, touchQueue)}
	e.mu.inflight = map[BlockID]*inflightDump{}
	e.mu.staging = map[BlockID]*stagingSlot{}
	e.mu.batches = map[string]*layerBatch{}
	e.fingerprint = opts.Schema.Fingerprint(opts.Layout)
	err := e.open()
	if err == nil {
		err = e.openCaches()
	}
	if err != nil {
		close(e.stop) // stops what open started before release closes the index
		e.bg.Wait()
		e.release()
		return nil, err
	}
	return e, nil
}

// setCodecs picks each tier's record compression; before any writer or background goroutine
// starts, since they read it.
func (e *Engine) setCodecs() {
	dtype := e.opts.Schema.DType
	if e.opts.AdoptStoredSchema {
		dtype = storedDType(e.StoredSchema())
	}
	for _, t := range e.tiers {
		c := e.opts.Compression
		if len(e.opts.Tiers) > 0 {
			c, _ = ParseCompression(t.Config().Compression) // validated by tiers.Validate
		}
		t.SetCodec(codecFor(c, dtype))
	}
}

func (e *Engine) open() error {
	start := time.Now()
	fs := e.fs
	if !e.opts.ReadOnly {
		if err := fs.MkdirAll(e.dir, 0o755); err != nil {
			return fmt.Errorf("open %s: %w", e.dir, err)
		}
	}
	lock, err := fs.Lock(filepath.Join(e.dir, LockFile))
	if err != nil {
		if isLockHeld(err) {
			return fmt.Errorf("open %s: the store is in use by another process or engine: %w", e.dir, ErrLocked)
		}
		return fmt.Errorf("open %s: lock file: %w", e.dir, err)
	}
	e.lock = lock
	if !e.opts.ReadOnly && e.prepareIndexRoom() {
		e.opts.ReadOnly = true // a full file system: loads only, rather than an Open that hangs
	}
	e.ix, err = index.Open(filepath.Join(e.dir, IndexDir), index.Options{FS: fs, Logger: e.opts.Logger, ReadOnly: e.opts.ReadOnly})
	if err != nil && indexDamaged(err) {
		if e.opts.ReadOnly || e.opts.AdoptStoredSchema {
			return fmt.Errorf("open %s: the index is unreadable (%w); it is rebuilt from the segments when the store is opened read-write with its configuration (the connector, or engine.Open with its Schema and Layout); or move %s aside and run the same: %w",
				e.dir, err, filepath.Join(e.dir, IndexDir), ErrCorrupt)
		}
		e.ix, err = e.rebuildIndex(err)
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", e.dir, err)
	}
	if err := e.loadInstance(); err != nil {
		return err
	}
	if err := e.loadStoredTiers(); err != nil {
		return err
	}
	if err := e.openTiers(); err != nil {
		return err
	}
	if err := e.openSharing(); err != nil {
		return err
	}
	if !e.opts.ReadOnly {
		// Make the store's directories themselves durable: a crash must not lose the
		// segments or index directory entry with everything in it.
		for _, d := range []string{e.dir, fs.PathDir(e.dir)} {
			if err := wal.SyncDir(fs, d); err != nil {
				return fmt.Errorf("open %s: %w", e.dir, err)
			}
		}
	}
	known, err := e.checkSchema()
	if err != nil {
		return err
	}
	e.rc = newReclaimer(e)
	if e.opts.ReadOnly {
		if err := e.findSegments(); err != nil {
			return err
		}
		e.accountSegments()
		e.accountFound() // recycled files, left as they are
		e.recovery.Duration = time.Since(start)
		return nil
	}
	next, err := e.recover(!known)
	if err != nil {
		return err
	}
	if !known {
		if err := e.recordSchema(); err != nil {
			return err
		}
	}
	if err := e.writeInstanceFile(); err != nil {
		return err
	}
	if err := e.writeSchemaFile(); err != nil {
		return err
	}
	if err := e.recordTiers(); err != nil {
		return err
	}
	e.nextSeg.Store(next)
	if err := e.initAccounting(); err != nil {
		return err
	}
	e.poolFound()
	e.recovery.Duration = time.Since(start)
	e.setCodecs()
	if err := e.startWriters(); err != nil {
		return err
	}
	if e.space.full.Load() == nil {
		e.keepReserve() // the index's ballast (reserve.go); without room for it, segments wait
	}
	e.bg.Add(3)
	go e.janitor()
	go func() {
		defer e.bg.Done()
		e.rc.run()
	}()
	go e.promoter()
	if e.keepsRecency {
		e.bg.Add(1)
		go e.toucher()
	}
	if e.share != nil {
		e.bg.Add(2)
		go e.share.Run()
		go e.share.RunTailer()
	}
	e.opts.Logger.Info("ucm: store open", "dir", e.dir, "io", e.io.Name(), "direct", e.direct == devio.DirectOn,
		"sync", e.opts.SyncPolicy, "tiers", len(e.tiers), "recovered_segments", e.recovery.SegmentsRecovered, "took", e.recovery.Duration)
	return nil
}

// checkSchema compares the requested schema with the one the store recorded. known is false
// for a store that has none yet (new, or whose index was lost).
func (e *Engine) checkSchema() (known bool, err error) {
	fp, ok, err := e.ix.Meta(metaFingerprint)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", e.dir, err)
	}
	if ok && e.opts.AdoptStoredSchema {
		if err := e.adoptStoredSchema(fp); err != nil {
			return true, err
		}
	}
	if !ok && e.opts.AdoptStoredSchema {
		// The index lost its schema record (or never got it): the schema file has it.
		if st, l, found := e.readSchemaFile(); found {
			e.opts.Schema, e.opts.Layout, e.fingerprint = st, l, st.Fingerprint(l)
			e.opts.MaxStagingBytes = max(e.opts.MaxStagingBytes, l.RecordBytes())
			e.schemaFromFile = true
			e.opts.Logger.Warn("ucm: the index has no schema record; using the schema file", "path", filepath.Join(e.dir, SchemaFile))
			return false, nil
		}
	}
	if !ok {
		if e.opts.ReadOnly || e.opts.AdoptStoredSchema {
			return false, fmt.Errorf("open %s: not a store, or one whose index lost its schema record (killed while it was created, or its index's newest writes lost): opening it read-write with its configuration (the connector, or engine.Open with its Schema and Layout) records the schema again and indexes its segments: %w", e.dir, ErrNotFound)
		}
		return false, nil
	}
	if string(fp) != string(e.fingerprint[:]) {
		stored, _, _ := e.ix.Meta(metaSchema)
		return true, fmt.Errorf("open %s: the store holds KV of another configuration; stored schema:\n%s\nrequested:\n%s%w",
			e.dir, stored, e.opts.Schema.Canonical(e.opts.Layout), ErrSchemaMismatch)
	}
	inst, ok, err := e.ix.Meta(metaInstance)
	if err != nil || !ok || len(inst) != len(e.instance) {
		return true, fmt.Errorf("open %s: index meta %s missing or malformed: %w", e.dir, metaInstance, ErrCorrupt)
	}
	copy(e.instance[:], inst)
	return true, nil
}

// adoptStoredSchema makes the engine use the layout and fingerprint the store recorded.
func (e *Engine) adoptStoredSchema(fp []byte) error {
	lb, ok, err := e.ix.Meta(metaLayout)
	if err != nil || !ok || len(lb) != 24 || len(fp) != len(e.fingerprint) {
		return fmt.Errorf("open %s: index meta %s missing or malformed: %w", e.dir, metaLayout, ErrCorrupt)
	}
	l := Layout{Shards: int(binary.LittleEndian.Uint64(lb)), TensorsPerShard: int(binary.LittleEndian.Uint64(lb[8:])),
		ShardBytes: int64(binary.LittleEndian.Uint64(lb[16:]))}
	if err := l.Validate(); err != nil {
		return fmt.Errorf("open %s: stored layout: %w: %w", e.dir, ErrCorrupt, err)
	}
	e.opts.Layout = l
	copy(e.fingerprint[:], fp)
	if e.opts.MaxStagingBytes < l.RecordBytes() {
		e.opts.MaxStagingBytes = l.RecordBytes()
	}
	return nil
}

// StoredSchema returns the canonical schema text the store recorded at creation.
func (e *Engine) StoredSchema() string {
	s, ok, _ := e.ix.Meta(metaSchema)
	if !ok && e.schemaFromFile {
		return e.opts.Schema.Canonical(e.opts.Layout)
	}
	return string(s)
}

// recordSchema records the schema of a new store (or of one whose index was rebuilt). The
// fingerprint is written last: its presence means the rest is there.
func (e *Engine) recordSchema() error {
	if e.instance == (format.InstanceID{}) {
		if _, err := rand.Read(e.instance[:]); err != nil {
			return err
		}
	}
	for _, kv := range []struct {
		k string
		v []byte
	}{
		{metaSchema, []byte(e.opts.Schema.Canonical(e.opts.Layout))},
		{metaInstance, e.instance[:]},
		{metaFormat, []byte(fmt.Sprint(format.Version))},
		{metaLayout, layoutBytes(e.opts.Layout)},
		{metaFingerprint, e.fingerprint[:]},
	} {
		if err := e.ix.SetMeta(kv.k, kv.v, true); err != nil {
			return fmt.Errorf("open %s: %w", e.dir, err)
		}
	}
	return nil
}

func layoutBytes(l Layout) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b, uint64(l.Shards))
	binary.LittleEndian.PutUint64(b[8:], uint64(l.TensorsPerShard))
	binary.LittleEndian.PutUint64(b[16:], uint64(l.ShardBytes))
	return b
}

// release closes whatever open() got to; used on a failed Open and by Close.
func (e *Engine) release() {
	e.segs.releaseAll()
	for _, b := range e.backends {
		_ = b.Close()
	}
	e.pool.Close() // the idle host buffers; the I/O that used them has ended
	if e.ix != nil {
		_ = e.ix.Close()
	}
	if e.share != nil && e.share.ForeignIndex() != nil {
		_ = e.share.ForeignIndex().Close()
	}
	for _, t := range e.tiers {
		_ = t.Close()
	}
	if e.lock != nil {
		_ = e.lock.Close()
	}
}

// Close waits for running tasks, makes everything written durable, seals the active segment
// and releases the directory. Tasks started after Close began fail with ErrClosed; partly
// dumped blocks are discarded. Close is idempotent.
//
// The order: the tasks (life.Close: none enters after it began, every one entered before has
// ended), then the cache tiers, then the background workers (stop; the reclaimer's and the
// sharer's passes end), then sharing's grace, the staged blocks, the writers (sealing), the
// last publication and the files.
func (e *Engine) Close() error {
	if !e.life.Close() { // refuses new tasks, ends waits for staging memory, waits for the tasks
		return nil
	}
	e.closeCaches()
	close(e.stop)
	e.bg.Wait()
	e.share.FinishGrace()
	e.mu.Lock()
	for id, s := range e.mu.staging {
		e.dropSlotLocked(id, s, fmt.Errorf("engine closed before the block was complete: %w", ErrClosed))
	}
	e.expireLayerBatchesLocked(time.Now(), true, func(BlockID) error {
		return fmt.Errorf("engine closed before every layer was dumped: %w", ErrClosed)
	})
	e.mu.Unlock()
	var errs []error
	for _, w := range e.writers() {
		errs = append(errs, w.Close())
	}
	e.share.Publish() // the segments the writers just sealed
	e.share.WriteSummaries()
	if e.share != nil {
		e.share.ClosePublogs()
	}
	err := errors.Join(errs...)
	e.release()
	if err != nil {
		return fmt.Errorf("close %s: %w", e.dir, wrapIO(err))
	}
	return nil
}

// Dir returns the store directory.
func (e *Engine) Dir() string { return e.dir }

// Layout returns the store's block layout.
func (e *Engine) Layout() Layout { return e.opts.Layout }

// Recovery returns what Open found and repaired.
func (e *Engine) Recovery() RecoveryReport { return e.recovery }

// Failed returns why the engine refuses dumps, or nil while it takes them: once Pebble has
// failed a write of the index (its WAL on a full disk, an I/O error), the index cannot record
// blocks until the store is reopened; while the store's file system is full (its index reserve
// released, or the store opened read-only on it: reserve.go) dumps are refused until space is
// freed. Loads and lookups are still served. The error wraps ErrNoSpace (full file system) or
// ErrIO.
func (e *Engine) Failed() error {
	if err := e.ix.Failed(); err != nil {
		return wrapIO(err)
	}
	return e.spaceFull() // as the dump path last saw it: asking never touches the file system
}

// IOEngine returns the name of the I/O backend in use ("uring" or "psync") and whether
// segments use O_DIRECT.
func (e *Engine) IOEngine() (name string, direct bool) {
	return e.io.Name(), e.direct == devio.DirectOn
}

// Sync makes every block dumped so far durable (useful under SyncInterval and SyncNone).
func (e *Engine) Sync() error {
	if e.life.Closing() {
		return ErrClosed
	}
	var errs []error
	for _, w := range e.writers() {
		errs = append(errs, w.Sync())
	}
	return wrapIO(errors.Join(errs...))
}

// writers returns every open log writer: the dump writer and each tier's relocation writer.
func (e *Engine) writers() []*wal.Writer {
	var ws []*wal.Writer
	for _, t := range e.tiers {
		for _, w := range []*wal.Writer{t.Writer(false), t.Writer(true)} {
			if w != nil {
				ws = append(ws, w)
			}
		}
	}
	return ws
}

// indexDamaged reports whether index.Open failed because the index's files are damaged
// (Pebble's "malformed manifest", a missing MANIFEST or table, a marker gone), rather than
// for a reason that says nothing about them: a lock held, no permission, a full or read-only
// file system, an I/O error (worth retrying, not rebuilding over).
func indexDamaged(err error) bool {
	switch {
	case isLockHeld(err), errors.Is(err, os.ErrPermission), errors.Is(err, index.ErrFailed),
		errorsIsAny(err, syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.EIO, syscall.EINTR, syscall.ENOMEM):
		return false
	}
	return true
}

// IndexBrokenDir is where a damaged index is moved before it is rebuilt (in the store
// directory).
const IndexBrokenDir = IndexDir + ".broken"

// rebuildIndex moves the damaged index aside (replacing an older copy: one is kept) and opens
// a new one, which recovery fills from the segments as it does for a lost index.
func (e *Engine) rebuildIndex(cause error) (*index.Index, error) {
	fs := e.fs
	src, dst := fs.PathJoin(e.dir, IndexDir), fs.PathJoin(e.dir, IndexBrokenDir)
	if err := fs.RemoveAll(dst); err != nil {
		return nil, fmt.Errorf("index unreadable (%w); removing the older copy %s: %w", cause, dst, err)
	}
	if err := fs.Rename(src, dst); err != nil {
		return nil, fmt.Errorf("index unreadable (%w); setting it aside: %w", cause, err)
	}
	if err := wal.SyncDir(fs, e.dir); err != nil {
		return nil, err
	}
	e.opts.Logger.Error("ucm: index unreadable: set aside and rebuilt from the segments", "index", src, "kept_at", dst, "err", cause)
	e.recovery.IndexSetAside = dst
	return index.Open(src, index.Options{FS: fs, Logger: e.opts.Logger})
}

// wrapIO classifies an error from the file system for the caller.
func wrapIO(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	case errors.Is(err, wal.ErrWriterClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrCorrupt), errors.Is(err, ErrNoSpace):
		return err
	}
	return fmt.Errorf("%w: %w", ErrIO, err)
}

func isNotExist(err error) bool { return oserror.IsNotExist(err) }

func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// Stats returns the engine's counters and the space accounting from the index.
func (e *Engine) Stats() Stats {
	st := e.stats.snapshot()
	st.Blocks, st.LiveBytes, st.FileBytes = e.ix.Totals()
	st.Sidecars = int64(e.ix.SidecarCount())
	st.Segments = len(e.ix.Segments())
	if e.share != nil {
		st.Sharing = SharingStats(e.share.Stats())
	}
	e.mu.Lock()
	st.StagingBytes = e.mu.stagingBytes
	st.StagingBlocks = len(e.mu.staging)
	for _, lb := range e.mu.batches {
		if lb.done {
			continue
		}
		for _, id := range lb.ids {
			if !e.ix.Contains(id) { // not stored meanwhile by a dump of its own
				st.BatchOpenBlocks++
			}
		}
	}
	st.StagingPeakBytes, st.StagingPeakBlocks = e.mu.stagingPeak, e.mu.stagingPeakBlocks
	e.mu.Unlock()
	return st
}
