package index

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ucm-go/ucm/format"
)

// ErrClosed is returned by every method called after Close.
var ErrClosed = errors.New("index: closed")

// ErrFailed is wrapped by every write to an index that Pebble declared unusable (a fatal error
// on a write path: its WAL or MANIFEST could not be written, for instance on a full disk).
// Reads keep working; writes fail until the index is closed and opened again. When the cause
// was a full file system the error also wraps syscall.ENOSPC.
var ErrFailed = errors.New("index: failed")

// Key prefixes: one byte per kind of key. Part of the index's on-disk format.
const (
	prefixBlock   = 'b'
	prefixSidecar = 'c' // block id, then the sidecar kind (uint16 BE): a block's sidecars sort together
	prefixSegment = 's'
	prefixMeta    = 'm'

	blockKeySize   = 1 + format.BlockIDSize
	sidecarKeySize = blockKeySize + 2
	segmentKeySize = 1 + 8
)

// Meta keys reserved by the index itself.
const (
	// MetaPebbleFormat holds the Pebble FormatMajorVersion the DB was created with, decimal text.
	MetaPebbleFormat = "index.pebble_format"
	// MetaIndexVersion holds the version of the index's key/value format, decimal text.
	MetaIndexVersion = "index.version"

	// indexVersion is the version a new index records, and every index without a block of a
	// batch record.
	indexVersion = 2
	// indexVersionNoSidecars is the version written before sidecar entries existed: read as
	// is, and recorded as indexVersion at the first writable open.
	indexVersionNoSidecars = 1
	// indexVersionBatch is recorded by the first Apply that puts the location of a block of a
	// batch record (a version 3 location value), in the same commit: a build that predates
	// batch records then refuses the index, naming the version, instead of failing on
	// entries it cannot decode one load at a time.
	indexVersionBatch = 3
)

// Pebble sizing: the index is small (one short value per block).
const (
	cacheSize    = 32 << 20
	memTableSize = 8 << 20
	maxOpenFiles = 256
)

// Options configures Open.
type Options struct {
	// FS is the file system the Pebble DB lives on: vfs.Default in production, a
	// vfs.NewCrashableMem in crash tests. Required.
	FS vfs.FS
	// Logger receives Pebble's log lines and background errors; nil discards them.
	Logger *slog.Logger
	// ReadOnly opens an existing index without writing to it (offline tools); Apply, SetMeta,
	// Sync and DropSegmentEntries then fail. Open fails if the index does not exist.
	ReadOnly bool
}

// Index maps block ids to record locations and holds the segment table, in one Pebble DB.
// Every method is safe for concurrent use except Close, which must not race with other calls.
type Index struct {
	db       *pebble.DB
	readOnly bool
	log      *slog.Logger
	closed   atomic.Bool
	// failed is set (once) by the first fatal error Pebble raised on a write path.
	failed atomic.Pointer[error]

	// applyMu serializes every mutation of block entries and segment rows (Apply,
	// DropSegmentEntries) so read-modify-write of previous locations is atomic.
	applyMu sync.Mutex
	// version is the index version recorded under MetaIndexVersion (set by init, then by
	// Apply under applyMu when it records indexVersionBatch).
	version int
	// mutations counts the batches committed (see Mutations).
	mutations atomic.Uint64

	// members is the in-memory membership of the entries (membership.go): exact and prefix
	// lookups cost a hash probe, not a Pebble seek, at 10–15 bytes a block; built in the
	// background after Open, the DB answering until then. Updated by Apply after each commit,
	// under applyMu, so it never lacks an entry Pebble has.
	members membership

	mu struct {
		sync.RWMutex
		// segments mirrors the persisted segment table; replaced row by row after each commit.
		segments map[uint64]SegmentMeta
	}
}

// Open opens or creates the Pebble DB in dir and loads the segment table into memory. A new
// DB is created at pebble.FormatNewest and that version is recorded under MetaPebbleFormat; an
// existing DB is opened at the format version it has (it is never ratcheted implicitly). A
// segment row that fails to decode fails Open with an error wrapping format.ErrCorrupt.
func Open(dir string, opts Options) (*Index, error) {
	if opts.FS == nil {
		return nil, fmt.Errorf("%w: index: Options.FS is nil", format.ErrInvalid)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	existing := false
	var fmv pebble.FormatMajorVersion
	if _, err := opts.FS.Stat(dir); err == nil {
		desc, err := pebble.Peek(dir, opts.FS)
		if err != nil {
			return nil, fmt.Errorf("index: open %s: %w", dir, err)
		}
		existing, fmv = desc.Exists, desc.FormatMajorVersion
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("index: open %s: %w", dir, err)
	}
	if !existing {
		if opts.ReadOnly {
			return nil, fmt.Errorf("index: open %s read-only: %w", dir, pebble.ErrDBDoesNotExist)
		}
		fmv = pebble.FormatNewest
	}

	po := &pebble.Options{
		FS:                 opts.FS,
		FormatMajorVersion: fmv,
		CacheSize:          cacheSize,
		MemTableSize:       memTableSize,
		MaxOpenFiles:       maxOpenFiles,
		ReadOnly:           opts.ReadOnly,
		ErrorIfNotExists:   opts.ReadOnly,
		Logger:             pebbleLogger{log},
		EventListener:      eventListener(log),
	}
	po.Levels[0].FilterPolicy = bloom.FilterPolicy(10) // inherited by the other levels
	db, err := openPebble(dir, po)
	if err != nil {
		return nil, fmt.Errorf("index: open %s: %w", dir, err)
	}
	ix := &Index{db: db, readOnly: opts.ReadOnly, log: log}
	if err := ix.init(existing); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("index: open %s: %w", dir, err)
	}
	return ix, nil
}

// openPebble is pebble.Open with a Fatalf during the open (creating the MANIFEST on a full
// disk, say) returned as an error wrapping ErrFailed (and syscall.ENOSPC when that was the
// cause) instead of ending the process. Pebble's directory lock may then stay held until the
// process exits: a retry in the same process reports the store locked.
func openPebble(dir string, po *pebble.Options) (db *pebble.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fatalError(r)
		}
	}()
	return pebble.Open(dir, po)
}

// init records or checks the format versions and loads the segment table.
func (ix *Index) init(existing bool) error {
	v, ok, err := ix.Meta(MetaIndexVersion)
	if err != nil {
		return err
	}
	ix.version = indexVersion
	switch {
	case ok && string(v) == strconv.Itoa(indexVersionNoSidecars) && !ix.readOnly:
		// An index from before sidecars: the same keys, plus sidecar keys from now on. Record
		// the new version so a build that predates sidecars refuses the index instead of
		// deleting blocks without their sidecars.
		if err := ix.db.Set(metaKey(MetaIndexVersion), []byte(strconv.Itoa(indexVersion)), pebble.Sync); err != nil {
			return err
		}
	case ok && string(v) == strconv.Itoa(indexVersionNoSidecars):
		ix.version = indexVersionNoSidecars
	case ok && string(v) == strconv.Itoa(indexVersionBatch):
		ix.version = indexVersionBatch
	case ok && string(v) != strconv.Itoa(indexVersion):
		return fmt.Errorf("%w: meta %s: version %q, this build reads %d, %d and %d", format.ErrCorrupt, MetaIndexVersion, v, indexVersionNoSidecars, indexVersion, indexVersionBatch)
	case !ok && !ix.readOnly:
		// A new DB, or one that crashed before its first meta write: record what it is.
		b := ix.db.NewBatch()
		_ = b.Set(metaKey(MetaIndexVersion), []byte(strconv.Itoa(indexVersion)), nil)
		_ = b.Set(metaKey(MetaPebbleFormat), []byte(strconv.FormatUint(uint64(ix.db.FormatMajorVersion()), 10)), nil)
		if err := ix.db.Apply(b, pebble.Sync); err != nil {
			return err
		}
	}
	if existing {
		if pv, ok, err := ix.Meta(MetaPebbleFormat); err != nil {
			return err
		} else if ok && string(pv) != strconv.FormatUint(uint64(ix.db.FormatMajorVersion()), 10) {
			ix.log.Warn("index: pebble format differs from the recorded one",
				"recorded", string(pv), "actual", uint64(ix.db.FormatMajorVersion()))
		}
	}
	if err := ix.loadSegments(); err != nil {
		return err
	}
	ix.startMembers()
	return nil
}

// loadSegments reads every segment row into memory.
func (ix *Index) loadSegments() error {
	it, err := ix.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{prefixSegment},
		UpperBound: []byte{prefixSegment + 1},
	})
	if err != nil {
		return err
	}
	segs := make(map[uint64]SegmentMeta)
	for valid := it.First(); valid; valid = it.Next() {
		m, err := decodeSegmentEntry(it.Key(), it.Value())
		if err != nil {
			_ = it.Close()
			return err
		}
		segs[m.Number] = m
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	ix.mu.Lock()
	ix.mu.segments = segs
	ix.mu.Unlock()
	return nil
}

// Close closes the Pebble DB. Writes applied without sync are made durable by Pebble's close
// only as far as Pebble guarantees (they are flushed to the WAL file, not synced). Calling Close
// twice returns ErrClosed. Close must not be called concurrently with other methods.
func (ix *Index) Close() error {
	if ix.closed.Swap(true) {
		return ErrClosed
	}
	ix.stopMembers()
	return ix.db.Close()
}

func (ix *Index) checkOpen() error {
	if ix.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (ix *Index) checkWritable() error {
	if err := ix.checkOpen(); err != nil {
		return err
	}
	if ix.readOnly {
		return fmt.Errorf("%w: index opened read-only", format.ErrInvalid)
	}
	return ix.Failed()
}

// Failed returns the error that put the index in its failed state (wrapping ErrFailed), or
// nil while it is usable.
func (ix *Index) Failed() error {
	if p := ix.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// survive turns a Fatalf of Pebble's on this goroutine (see pebbleLogger.Fatalf) into the
// index's failed state and *err; any other panic continues. Deferred by every method that
// reaches Pebble's write paths.
func (ix *Index) survive(err *error) {
	r := recover()
	if r == nil {
		return
	}
	fail := fatalError(r)
	ix.failed.CompareAndSwap(nil, &fail)
	ix.log.Error("index: failed; writes are refused until the store is reopened", "err", fail)
	*err = ix.Failed()
}

// blockKey writes the key of id into dst (which must have blockKeySize bytes) and returns it.
func blockKey(dst []byte, id format.BlockID) []byte {
	dst[0] = prefixBlock
	copy(dst[1:], id[:])
	return dst[:blockKeySize]
}

func segmentKey(n uint64) []byte {
	k := make([]byte, segmentKeySize)
	k[0] = prefixSegment
	binary.BigEndian.PutUint64(k[1:], n)
	return k
}

func metaKey(name string) []byte {
	k := make([]byte, 1+len(name))
	k[0] = prefixMeta
	copy(k[1:], name)
	return k
}

// decodeBlockEntry decodes one 'b' key and value, naming the block id in any error.
func decodeBlockEntry(k, v []byte) (format.BlockID, Location, error) {
	var id format.BlockID
	if len(k) != blockKeySize || k[0] != prefixBlock {
		return id, Location{}, fmt.Errorf("%w: index: block key %x: bad length %d", format.ErrCorrupt, k, len(k))
	}
	copy(id[:], k[1:])
	loc, err := DecodeLocation(v)
	if err != nil {
		return id, Location{}, fmt.Errorf("index: block %s: %w", id, err)
	}
	return id, loc, nil
}

// decodeSegmentEntry decodes one 's' key and value, naming the segment number in any error.
func decodeSegmentEntry(k, v []byte) (SegmentMeta, error) {
	if len(k) != segmentKeySize || k[0] != prefixSegment {
		return SegmentMeta{}, fmt.Errorf("%w: index: segment key %x: bad length %d", format.ErrCorrupt, k, len(k))
	}
	n := binary.BigEndian.Uint64(k[1:])
	m, err := DecodeSegmentMeta(v)
	if err != nil {
		return SegmentMeta{}, fmt.Errorf("index: segment %d: %w", n, err)
	}
	if m.Number != n {
		return SegmentMeta{}, fmt.Errorf("%w: index: segment %d: row names segment %d", format.ErrCorrupt, n, m.Number)
	}
	return m, nil
}

// Mutations counts the batches the index has committed (Apply, DropSegmentEntries), each
// counted right after it became visible. A lookup made after reading the count n sees every
// batch counted up to n; while the count is still n no later batch has been counted, so the
// lookup's result may be reused (it may miss a batch being committed at that very moment, as
// a lookup made just before that batch would).
func (ix *Index) Mutations() uint64 { return ix.mutations.Load() }

// Get returns the location of id; ok=false if absent. A stored value that fails to decode
// returns an error wrapping format.ErrCorrupt naming the block id. The returned location is the
// caller's to keep (its ShardCRCs is freshly allocated).
func (ix *Index) Get(id format.BlockID) (loc Location, ok bool, err error) {
	if err := ix.checkOpen(); err != nil {
		return Location{}, false, err
	}
	var kb [blockKeySize]byte
	return ix.getLocation(blockKey(kb[:], id), id)
}

func (ix *Index) getLocation(key []byte, id format.BlockID) (Location, bool, error) {
	v, closer, err := ix.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return Location{}, false, nil
	}
	if err != nil {
		return Location{}, false, fmt.Errorf("index: get %s: %w", id, err)
	}
	loc, derr := DecodeLocation(v)
	cerr := closer.Close()
	if derr != nil {
		return Location{}, false, fmt.Errorf("index: block %s: %w", id, derr)
	}
	if cerr != nil {
		return Location{}, false, fmt.Errorf("index: get %s: %w", id, cerr)
	}
	return loc, true, nil
}

// Has sets hits[i] to whether ids[i] has an entry (exact lookup). len(hits) must equal
// len(ids). All lookups of one call see one consistent state of the index. It reads the
// in-memory membership (no I/O, no allocation; until it is built after Open, the DB), which may
// report present an id whose 8-byte prefix another stored id shares (memberTable): a load of
// it then misses. It never reports a stored block absent.
func (ix *Index) Has(ids []format.BlockID, hits []bool) error {
	if len(hits) != len(ids) {
		return fmt.Errorf("%w: index: Has: %d hits for %d ids", format.ErrInvalid, len(hits), len(ids))
	}
	if err := ix.checkOpen(); err != nil {
		return err
	}
	_, err := ix.hasMembers(ids, hits, false)
	return err
}

// Contains reports whether id has an entry, as Has does (a failed read of the DB, before the
// membership is built, reports false).
func (ix *Index) Contains(id format.BlockID) bool {
	n, err := ix.hasMembers([]format.BlockID{id}, nil, true)
	return err == nil && n == 1
}

// PrefixLen returns how many leading ids have an entry (stopping at the first that has not),
// as Has answers them.
func (ix *Index) PrefixLen(ids []format.BlockID) (int, error) {
	if err := ix.checkOpen(); err != nil {
		return 0, err
	}
	return ix.hasMembers(ids, nil, true)
}

// Iterate calls fn for every block entry in id order, on a snapshot taken at the call: entries
// applied during the iteration are not seen. fn returning false stops the iteration. An entry
// that fails to decode stops it with an error wrapping format.ErrCorrupt naming the block id.
func (ix *Index) Iterate(fn func(id format.BlockID, loc Location) bool) error {
	if err := ix.checkOpen(); err != nil {
		return err
	}
	snap := ix.db.NewSnapshot()
	defer func() { _ = snap.Close() }()
	return iterateBlocks(snap, fn)
}

// iterReader is what iterateBlocks needs from a DB or a snapshot.
type iterReader interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

func iterateBlocks(r iterReader, fn func(id format.BlockID, loc Location) bool) error {
	it, err := r.NewIter(&pebble.IterOptions{
		LowerBound: []byte{prefixBlock},
		UpperBound: []byte{prefixBlock + 1},
	})
	if err != nil {
		return fmt.Errorf("index: iterate: %w", err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("index: iterate: %w", err)
		}
		id, loc, err := decodeBlockEntry(it.Key(), v)
		if err != nil {
			_ = it.Close()
			return err
		}
		if !fn(id, loc) {
			break
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("index: iterate: %w", err)
	}
	return nil
}

// Segments returns a copy of the segment table sorted by number.
func (ix *Index) Segments() []SegmentMeta {
	ix.mu.RLock()
	out := make([]SegmentMeta, 0, len(ix.mu.segments))
	for _, m := range ix.mu.segments {
		out = append(out, m)
	}
	ix.mu.RUnlock()
	slices.SortFunc(out, func(a, b SegmentMeta) int {
		switch {
		case a.Number < b.Number:
			return -1
		case a.Number > b.Number:
			return 1
		}
		return 0
	})
	return out
}

// Segment returns the row of segment number; ok=false if there is none. It reflects every
// Apply that has returned.
func (ix *Index) Segment(number uint64) (SegmentMeta, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	m, ok := ix.mu.segments[number]
	return m, ok
}

// Totals returns the number of block entries, the live bytes of every entry (blocks and
// sidecars), and the sum of the segments' Size, all from the in-memory segment table (exact;
// no directory walk).
func (ix *Index) Totals() (blocks, liveBytes, fileBytes int64) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for _, m := range ix.mu.segments {
		blocks += m.LiveRecords - m.LiveSidecars
		liveBytes += m.LiveBytes
		fileBytes += m.Size
	}
	return blocks, liveBytes, fileBytes
}

// Sync makes every batch applied so far durable (it syncs Pebble's WAL).
func (ix *Index) Sync() (err error) {
	if err := ix.checkWritable(); err != nil {
		return err
	}
	defer ix.survive(&err)
	return ix.syncWAL()
}

// Checkpoint writes a consistent copy of the index to dir, which must not exist, as a crash
// would leave it: tables hard-linked, the manifest and the WAL copied as far as Pebble has
// written it (every synced batch, unsynced ones possibly not; nothing is flushed), so that
// opening the copy replays the WAL. A copy of the files made while the index is open is not
// that: Pebble compacts meanwhile, and the copied manifest can name tables the copy lacks.
func (ix *Index) Checkpoint(dir string) error {
	if err := ix.checkOpen(); err != nil {
		return err
	}
	if err := ix.db.Checkpoint(dir); err != nil {
		return fmt.Errorf("index: checkpoint to %s: %w", dir, err)
	}
	return nil
}

// Meta returns a copy of the value stored under the meta name key; ok=false if absent.
func (ix *Index) Meta(key string) ([]byte, bool, error) {
	if err := ix.checkOpen(); err != nil {
		return nil, false, err
	}
	v, closer, err := ix.db.Get(metaKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("index: meta %q: %w", key, err)
	}
	out := bytes.Clone(v)
	if out == nil {
		out = []byte{}
	}
	if err := closer.Close(); err != nil {
		return nil, false, fmt.Errorf("index: meta %q: %w", key, err)
	}
	return out, true, nil
}

// MetaRange calls fn with every meta name starting with prefix and its value, in name order,
// until fn returns false. The value is valid only during the call.
func (ix *Index) MetaRange(prefix string, fn func(key string, val []byte) bool) error {
	if err := ix.checkOpen(); err != nil {
		return err
	}
	lo := metaKey(prefix)
	hi := append(metaKey(prefix), 0xff) // meta names are text: 0xff never occurs in them
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("index: meta range %q: %w", prefix, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		if !fn(string(it.Key()[1:]), it.Value()) {
			break
		}
	}
	if err := it.Error(); err != nil {
		_ = it.Close()
		return fmt.Errorf("index: meta range %q: %w", prefix, err)
	}
	return it.Close()
}

// SetMeta stores val under the meta name key (non-empty), durably before returning if sync.
// Names starting with "index." are reserved for the index itself.
func (ix *Index) SetMeta(key string, val []byte, sync bool) (err error) {
	if err := ix.checkWritable(); err != nil {
		return err
	}
	defer ix.survive(&err)
	if key == "" {
		return fmt.Errorf("%w: index: empty meta name", format.ErrInvalid)
	}
	if err := ix.db.Set(metaKey(key), val, writeOpts(sync)); err != nil {
		return fmt.Errorf("index: set meta %q: %w", key, err)
	}
	return nil
}

func writeOpts(sync bool) *pebble.WriteOptions {
	if sync {
		return pebble.Sync
	}
	return pebble.NoSync
}

// CheckAccounting recomputes, from a consistent scan of every block and sidecar entry, each segment's live
// bytes and records, and compares them with both the in-memory segment table and the persisted
// segment rows; it also checks the in-memory membership set holds exactly the entries and that
// no sidecar outlives its block. It returns nil if all agree and every entry points at a segment with a
// row; otherwise an error listing the first mismatches. It blocks Apply for its duration.
func (ix *Index) CheckAccounting() error {
	if err := ix.checkOpen(); err != nil {
		return err
	}
	ix.applyMu.Lock()
	defer ix.applyMu.Unlock()
	snap := ix.db.NewSnapshot()
	defer func() { _ = snap.Close() }()

	type acc struct{ bytes, records, sidecars int64 }
	got := make(map[uint64]acc)
	if err := ix.WaitMembers(); err != nil {
		return fmt.Errorf("index: the in-memory membership was not built: %w", err)
	}
	entries, notMembers := 0, 0
	ix.members.RLock()
	tab := ix.members.tab
	members := tab.live
	if err := iterateBlocks(snap, func(id format.BlockID, loc Location) bool {
		entries++
		if !tab.has(fingerprint(id)) {
			notMembers++
		}
		a := got[loc.Segment]
		a.bytes += loc.RecordBytes()
		a.records++
		got[loc.Segment] = a
		return true
	}); err != nil {
		ix.members.RUnlock()
		return err
	}
	sidecars, orphans, unlisted := 0, 0, 0
	var kb [blockKeySize]byte
	var oerr error
	if err := iterateSidecars(snap, func(id format.BlockID, kind format.SidecarKind, loc Location) bool {
		sidecars++
		if ok, err := exists(snap, blockKey(kb[:], id)); err != nil {
			oerr = err
			return false
		} else if !ok {
			orphans++
		}
		if tab.kindsOf(fingerprint(id))&(1<<kind) == 0 {
			unlisted++
		}
		a := got[loc.Segment]
		a.bytes += loc.RecordBytes()
		a.records++
		a.sidecars++
		got[loc.Segment] = a
		return true
	}); err != nil || oerr != nil {
		ix.members.RUnlock()
		return errors.Join(err, oerr)
	}
	listed := tab.sidecars()
	ix.members.RUnlock()
	persisted := make(map[uint64]SegmentMeta)
	it, err := snap.NewIter(&pebble.IterOptions{
		LowerBound: []byte{prefixSegment},
		UpperBound: []byte{prefixSegment + 1},
	})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		m, err := decodeSegmentEntry(it.Key(), it.Value())
		if err != nil {
			_ = it.Close()
			return err
		}
		persisted[m.Number] = m
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}

	ix.mu.RLock()
	mem := maps.Clone(ix.mu.segments)
	ix.mu.RUnlock()

	var errs []error
	add := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	if notMembers > 0 || members != entries {
		add("membership holds %d blocks for %d entries (%d entries missing from it)", members, entries, notMembers)
	}
	if orphans > 0 {
		add("%d sidecar entries outlive their block", orphans)
	}
	if unlisted > 0 || listed != sidecars {
		add("sidecar kind sets list %d sidecars for %d entries (%d entries missing from them)", listed, sidecars, unlisted)
	}
	for n, a := range got {
		if _, ok := mem[n]; !ok {
			add("segment %d: %d entries (%d bytes) but no segment row", n, a.records, a.bytes)
		}
	}
	for n, m := range mem {
		a := got[n]
		if m.LiveBytes != a.bytes || m.LiveRecords != a.records || m.LiveSidecars != a.sidecars {
			add("segment %d: table says %d bytes in %d records (%d sidecars), entries sum to %d bytes in %d records (%d sidecars)",
				n, m.LiveBytes, m.LiveRecords, m.LiveSidecars, a.bytes, a.records, a.sidecars)
		}
		if p, ok := persisted[n]; !ok {
			add("segment %d: in memory but not persisted", n)
		} else if p != m {
			add("segment %d: persisted row %+v differs from memory %+v", n, p, m)
		}
	}
	for n := range persisted {
		if _, ok := mem[n]; !ok {
			add("segment %d: persisted but not in memory", n)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("index: accounting mismatch: %w", errors.Join(errs...))
	}
	return nil
}

// DropSegmentEntries deletes every block and sidecar entry pointing into segment number at an offset >=
// from (recovery: entries past a truncated tail), in one batch that also adjusts the segment's
// accounting, and returns how many were dropped. It scans every block entry while holding off
// Apply, so it is meant for recovery and tools. An entry that fails to decode aborts it with an
// error wrapping format.ErrCorrupt and nothing is dropped.
func (ix *Index) DropSegmentEntries(number uint64, from int64, sync bool) (_ int, err error) {
	if err := ix.checkWritable(); err != nil {
		return 0, err
	}
	defer ix.survive(&err)
	n, err := ix.dropSegmentEntries(number, from)
	if err != nil || n == 0 || !sync {
		return n, err
	}
	return n, ix.syncWAL()
}

// dropSegmentEntries deletes the entries, without waiting for durability.
func (ix *Index) dropSegmentEntries(number uint64, from int64) (int, error) {
	ix.applyMu.Lock()
	defer ix.applyMu.Unlock()
	b := ix.NewBatch()
	n := 0
	if err := iterateBlocks(ix.db, func(id format.BlockID, loc Location) bool {
		if loc.Segment == number && loc.Offset >= from {
			b.Delete(id)
			n++
		}
		return true
	}); err != nil {
		return 0, err
	}
	if err := iterateSidecars(ix.db, func(id format.BlockID, kind format.SidecarKind, loc Location) bool {
		if loc.Segment == number && loc.Offset >= from {
			b.DeleteSidecarIf(id, kind, loc)
			n++
		}
		return true
	}); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	if err := ix.applyLocked(b); err != nil {
		return 0, err
	}
	return n, nil
}
