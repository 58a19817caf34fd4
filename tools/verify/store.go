package verify

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// Handle is a store directory opened read-only for an offline tool: the engine holds the
// directory lock for as long as the handle is open, so no engine can write the store
// meanwhile. Its fields must not be modified.
type Handle struct {
	// Dir is the store directory and FS the file system it is on.
	Dir string
	FS  vfs.FS
	// SegDirs are the segment directories of every path of every disk tier the store was
	// last opened with, fastest tier first (one, <Dir>/segments, for a store without tiers).
	SegDirs []string
	// Engine is the read-only engine holding the store open, and Index its index.
	Engine *engine.Engine
	Index  *index.Index
	// Schema is the canonical schema text the store recorded and Layout its block layout.
	Schema string
	Layout format.Layout
	// Fingerprint is the SHA-256 of Schema, as in every segment header.
	Fingerprint format.Fingerprint

	tierOfDir map[string]string // segment directory → disk tier name
	// recoverySkipped is why OpenRecovered was asked to recover and could not (nil otherwise).
	recoverySkipped error
}

// RecoverySkipped returns why OpenRecovered, asked to recover the store, could not (the engine
// opened it read-only: its file system is full), or nil. The store is then as the crash left
// it: ScanPending says what recovery will do.
func (h *Handle) RecoverySkipped() error { return h.recoverySkipped }

// checkStoreDir refuses a directory that is not a store before anything opens it (opening
// would otherwise create files in it). The index or the schema file is required: a store with
// tiers may keep all its segments on other paths, and a store whose index was lost still has
// its schema file (engine.SchemaFile).
func checkStoreDir(fs vfs.FS, dir string) error {
	if _, err := fs.Stat(fs.PathJoin(dir, engine.SchemaFile)); err == nil {
		return nil
	}
	st, err := fs.Stat(fs.PathJoin(dir, engine.IndexDir))
	if err != nil || !st.IsDir() {
		if _, derr := fs.Stat(dir); derr != nil {
			return fmt.Errorf("%s: %w", dir, derr)
		}
		return fmt.Errorf("%s is not a UCM-Go store (no %s/ directory)", dir, engine.IndexDir)
	}
	return nil
}

// Open opens the store in dir on fs (nil: vfs.Default) without writing to it, not even to
// recover it. It fails when dir is missing, is not a store, or is in use by an engine.
func Open(dir string, fs vfs.FS) (*Handle, error) {
	if fs == nil {
		fs = vfs.Default
	}
	if err := checkStoreDir(fs, dir); err != nil {
		return nil, err
	}
	e, err := engine.Open(dir, engine.Options{FS: fs, ReadOnly: true, AdoptStoredSchema: true, IOEngine: devio.EnginePsync})
	if err != nil {
		return nil, err
	}
	h := &Handle{Dir: dir, SegDirs: e.SegmentDirs(), FS: fs, Engine: e, Index: e.Index(),
		Schema: e.StoredSchema(), Layout: e.Layout()}
	h.Fingerprint = sha256.Sum256([]byte(h.Schema))
	h.tierOfDir = map[string]string{}
	for _, t := range e.TierStats() {
		for _, p := range t.Paths {
			h.tierOfDir[filepath.Join(p, engine.SegmentDir)] = t.Name
		}
	}
	return h, nil
}

// Close closes the store (and releases its directory lock).
func (h *Handle) Close() error { return h.Engine.Close() }

// SegmentPath returns the path of segment n's file: where the engine found it, or, for a
// segment whose file is missing, where it would be in the first segment directory. It is the
// one way tools locate a segment.
func (h *Handle) SegmentPath(n uint64) string {
	if p, ok := h.Engine.SegmentPath(n); ok {
		return p
	}
	return wal.SegmentPath(h.SegDirs[0], n)
}

// SegmentTier returns the name of the disk tier holding segment n's file ("" when the file
// was not found).
func (h *Handle) SegmentTier(n uint64) string {
	p, ok := h.Engine.SegmentPath(n)
	if !ok {
		return ""
	}
	return h.tierOfDir[filepath.Dir(p)]
}

// RetiringSegments returns the rows of segments marked deleting: their retirement (eviction
// or compaction) was interrupted by a crash; recovery finishes it by deleting them. They are
// not corruption.
func (h *Handle) RetiringSegments() []index.SegmentMeta { return h.segmentsIn(index.SegmentDeleting) }

// SegmentFile is a file found in a segment directory.
type SegmentFile struct {
	// Dir is the segment directory, Name the file name and Path both joined.
	Dir, Name, Path string
	// Number is the segment number for a segment file (Segment set), else 0.
	Number  uint64
	Segment bool
	// Temp reports a temporary file of the log (a segment name plus wal.TempSuffix).
	Temp bool
	// Recycled reports a retired segment's file kept for reuse (wal.RecycleExt).
	Recycled bool
}

// ListSegmentFiles lists every file of every segment directory, directory by directory in
// SegDirs order, names sorted. A directory that does not exist is skipped.
func (h *Handle) ListSegmentFiles() ([]SegmentFile, error) {
	var out []SegmentFile
	for _, dir := range h.SegDirs {
		names, err := h.FS.List(dir)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		sort.Strings(names)
		for _, name := range names {
			f := SegmentFile{Dir: dir, Name: name, Path: h.FS.PathJoin(dir, name)}
			if base, ok := strings.CutSuffix(name, wal.TempSuffix); ok {
				_, f.Temp = wal.ParseSegmentFileName(base)
			}
			_, f.Recycled = wal.ParseRecycleFileName(name)
			f.Number, f.Segment = wal.ParseSegmentFileName(name)
			out = append(out, f)
		}
	}
	return out, nil
}

// ActiveSegments returns the rows of segments still marked active: the store was not closed
// cleanly (or a write failed) and recovery has work to do.
func (h *Handle) ActiveSegments() []index.SegmentMeta { return h.segmentsIn(index.SegmentActive) }

// segmentsIn returns the rows of the segments in state st.
func (h *Handle) segmentsIn(st index.SegmentState) []index.SegmentMeta {
	var out []index.SegmentMeta
	for _, m := range h.Index.Segments() {
		if m.State == st {
			out = append(out, m)
		}
	}
	return out
}

// DamagedSegments returns the sealed segments whose file is missing or shorter than the size
// recorded when they were sealed: recovery drops the entries of a missing one, and seals a
// short one again after its last intact record (engine.RecoveryReport MissingSegments,
// TruncatedSegments).
func (h *Handle) DamagedSegments() []index.SegmentMeta {
	var out []index.SegmentMeta
	for _, m := range h.segmentsIn(index.SegmentSealed) {
		if st, err := h.FS.Stat(h.SegmentPath(m.Number)); err != nil || st.Size() < m.Size {
			out = append(out, m)
		}
	}
	return out
}

// NeedsRecovery reports whether opening the store read-write would change it: a segment still
// active (left by a crash), a segment marked deleting (an interrupted retirement), a sealed
// segment missing or cut short (DamagedSegments), or a segment or temporary file in any
// segment directory that the index does not register (what engine recovery seals, deletes,
// adopts or removes).
func (h *Handle) NeedsRecovery() bool {
	if len(h.ActiveSegments()) > 0 || len(h.RetiringSegments()) > 0 || len(h.DamagedSegments()) > 0 {
		return true
	}
	files, err := h.ListSegmentFiles()
	if err != nil {
		return false
	}
	for _, f := range files {
		if f.Temp {
			return true
		}
		if f.Segment {
			if _, registered := h.Index.Segment(f.Number); !registered {
				return true
			}
		}
	}
	return false
}

// OpenWritable opens the store in dir on fs (nil: vfs.Default) read-write for an offline
// maintenance command (ucm-tool compact, evict, gc), adopting the schema and the tiers the store
// recorded, with segment recycling off. Opening recovers a store left by a crash
// (Engine.Recovery says what it did). It fails when dir is missing, is not a store, or is in use
// by an engine. logger nil: discard.
func OpenWritable(dir string, fs vfs.FS, logger *slog.Logger) (*engine.Engine, error) {
	if fs == nil {
		fs = vfs.Default
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// The segment size is not recorded: new segments (compaction, demotion) get the size of
	// the largest existing one, so that a tier's capacity is not asked for the default
	// segment size's reservation.
	h, err := Open(dir, fs)
	if err != nil {
		return nil, err
	}
	var segSize int64
	for _, m := range h.Index.Segments() {
		segSize = max(segSize, m.Size)
	}
	if err := h.Close(); err != nil {
		return nil, err
	}
	if segSize > 0 {
		segSize = max(engine.MinSegmentSize, (segSize+format.Alignment-1)/format.Alignment*format.Alignment)
	}
	// Maintenance commands free disk space: retired segments' files are deleted, not kept for
	// reuse, and those kept by the engine are deleted at Open.
	return engine.Open(dir, engine.Options{FS: fs, AdoptStoredSchema: true, IOEngine: devio.EnginePsync, Logger: logger,
		SegmentSize: segSize, RecycleSegments: -1})
}

// recoverStore opens the store read-write, which recovers it (scan, truncate the torn tail
// and seal every segment left active, drop index entries past it), and closes it again.
// skipped is why recovery did not run although the open succeeded: the engine opened the
// store read-only (its file system is full).
func recoverStore(fs vfs.FS, dir string) (rep engine.RecoveryReport, skipped, err error) {
	e, err := engine.Open(dir, engine.Options{FS: fs, AdoptStoredSchema: true, IOEngine: devio.EnginePsync,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return engine.RecoveryReport{}, nil, fmt.Errorf("recover: %w", err)
	}
	if e.ReadOnly() {
		skipped = e.Failed()
		if skipped == nil {
			skipped = errors.New("the engine opened the store read-only")
		}
		skipped = fmt.Errorf("recovery could not run: %w", skipped)
	} else {
		rep = e.Recovery()
	}
	if err := e.Close(); err != nil {
		return rep, skipped, fmt.Errorf("recover: close: %w", err)
	}
	return rep, skipped, nil
}

// OpenRecovered is Open after recovering the store first when recover is set and a segment is
// still active (a crash left it): recovery, as opening an engine does, truncates the torn tail
// of every active segment, seals it and drops the index entries past it. rep is non-nil when
// recovery ran. When it could not (the engine opened the store read-only: its file system is
// full), rep is nil and Handle.RecoverySkipped says why.
func OpenRecovered(dir string, fs vfs.FS, recover bool) (h *Handle, rep *engine.RecoveryReport, err error) {
	h, err = Open(dir, fs)
	if err != nil && recover && indexMissing(fs, dir) {
		// The index is gone but the schema file is there: recovery rebuilds the index from
		// the segments; a read-only open cannot.
		r, skipped, rerr := recoverStore(fsOrDefault(fs), dir)
		if rerr == nil {
			rerr = skipped
		}
		if rerr != nil {
			return nil, nil, fmt.Errorf("%w (rebuilding the index: %w)", err, rerr)
		}
		if h, err = Open(dir, fs); err != nil {
			return nil, nil, err
		}
		return h, &r, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if !recover || !h.NeedsRecovery() {
		return h, nil, nil
	}
	if err := h.Close(); err != nil {
		return nil, nil, fmt.Errorf("close %s: %w", dir, err)
	}
	r, skipped, err := recoverStore(h.FS, dir)
	if err != nil {
		return nil, nil, err
	}
	h, err = Open(dir, h.FS)
	if err != nil {
		return nil, nil, err
	}
	if skipped != nil {
		h.recoverySkipped = skipped
		return h, nil, nil
	}
	return h, &r, nil
}

// indexMissing reports whether dir has a schema file but no index directory.
func indexMissing(fs vfs.FS, dir string) bool {
	fs = fsOrDefault(fs)
	_, serr := fs.Stat(fs.PathJoin(dir, engine.SchemaFile))
	_, ierr := fs.Stat(fs.PathJoin(dir, engine.IndexDir))
	return serr == nil && errors.Is(ierr, os.ErrNotExist)
}

func fsOrDefault(fs vfs.FS) vfs.FS {
	if fs == nil {
		return vfs.Default
	}
	return fs
}

// PendingSegment is what recovery will do to one active, retiring or damaged segment, found
// without writing.
type PendingSegment struct {
	// Number is the segment's number and File its file name.
	Number uint64 `json:"segment"`
	File   string `json:"file"`
	// FileSize is the file's size and ValidEnd the end of its last valid record: recovery
	// keeps Records valid records and cuts CutBytes after ValidEnd.
	FileSize int64 `json:"file_size"`
	ValidEnd int64 `json:"valid_end"`
	Records  int   `json:"valid_records"`
	CutBytes int64 `json:"bytes_to_cut"`
	// EntriesToDrop counts the index entries recovery drops (past ValidEnd, or all of them
	// for a missing or unreadable segment).
	EntriesToDrop int `json:"index_entries_to_drop"`
	// Stop is why the log ends before the end of the file ("" at a clean end).
	Stop string `json:"stop,omitempty"`
	// Missing reports that the segment file is gone.
	Missing bool `json:"missing,omitempty"`
	// Unreadable is why the segment header could not be read ("" when it could): recovery
	// quarantines such a segment.
	Unreadable string `json:"unreadable,omitempty"`
	// Retiring reports a segment marked deleting, whose retirement a crash interrupted:
	// recovery deletes its file (FileSize bytes; Missing when already gone) and its row.
	Retiring bool `json:"retiring,omitempty"`
	// Truncated reports a sealed segment whose file is shorter than recorded (or Missing):
	// recovery seals it again after its last intact record (or drops its entries).
	Truncated bool `json:"truncated,omitempty"`
	// Empty reports an active segment without a valid record (the dump writer's prepared next
	// segment, or one whose first records never became durable): recovery deletes it.
	Empty bool `json:"empty,omitempty"`
	scan  *wal.ScanResult
}

// ScanPending scans every active segment read-only (wal.ScanSegment, the scan recovery runs),
// lists the segments marked deleting (Retiring) and counts the index entries recovery would
// drop. It returns nothing for a store without active or deleting segments.
func (h *Handle) ScanPending() ([]*PendingSegment, error) {
	active := h.ActiveSegments()
	retiring := h.RetiringSegments()
	damaged := h.DamagedSegments()
	if len(active) == 0 && len(retiring) == 0 && len(damaged) == 0 {
		return nil, nil
	}
	backend, err := devio.NewBackend(devio.EnginePsync, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	defer func() { _ = backend.Close() }()
	var out []*PendingSegment
	byNum := map[uint64]*PendingSegment{}
	for _, m := range retiring {
		p := &PendingSegment{Number: m.Number, File: wal.SegmentFileName(m.Number), Retiring: true}
		out = append(out, p)
		byNum[m.Number] = p
		if st, err := h.FS.Stat(h.SegmentPath(m.Number)); err == nil {
			p.FileSize = st.Size()
		} else {
			p.Missing = true
		}
	}
	for _, m := range append(active, damaged...) {
		p := &PendingSegment{Number: m.Number, File: wal.SegmentFileName(m.Number), Truncated: m.State == index.SegmentSealed}
		out = append(out, p)
		byNum[m.Number] = p
		path := h.SegmentPath(m.Number)
		st, statErr := h.FS.Stat(path)
		if errors.Is(statErr, os.ErrNotExist) {
			p.Missing = true
			continue
		}
		res, err := wal.ScanSegment(h.FS, path, devio.DirectOff, backend)
		if errors.Is(err, wal.ErrNoHeader) {
			p.Empty = true // created, its header never written
			if statErr == nil {
				p.FileSize = st.Size()
			}
			continue
		}
		if err != nil {
			var ce *wal.CorruptionError
			if !errors.As(err, &ce) {
				return nil, fmt.Errorf("scan %s: %w", path, err)
			}
			p.Unreadable = err.Error()
			continue
		}
		p.scan = res
		p.FileSize, p.ValidEnd, p.Records = res.FileSize, res.ValidEnd, len(res.Records)
		if !res.Sealed {
			p.CutBytes = res.FileSize - res.ValidEnd
			p.Empty = len(res.Records) == 0 && !p.Truncated
		}
		if res.Stop != nil {
			p.Stop = res.Stop.Error()
		}
	}
	err = h.Index.Iterate(func(_ format.BlockID, loc index.Location) bool {
		if p := byNum[loc.Segment]; p != nil && (p.Retiring || p.scan == nil || loc.Offset >= p.ValidEnd) {
			p.EntriesToDrop++
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Number < out[j].Number })
	return out, err
}
