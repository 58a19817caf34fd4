package cli

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// store is a store directory opened read-only for a tool: the engine holds the directory lock
// for as long as the store is open, so no engine can write it meanwhile.
type store struct {
	dir    string
	segDir string
	eng    *engine.Engine
	ix     *index.Index
	schema string
	layout format.Layout
	fp     format.Fingerprint // SHA-256 of the stored schema text, as in every segment header
}

// checkStoreDir refuses a directory that is not a store before anything opens it (opening
// would otherwise create files in it).
func checkStoreDir(dir string) error {
	for _, sub := range []string{engine.IndexDir, engine.SegmentDir} {
		st, err := os.Stat(filepath.Join(dir, sub))
		if err != nil || !st.IsDir() {
			if _, derr := os.Stat(dir); derr != nil {
				return usageErr("%s: %v", dir, derr)
			}
			return usageErr("%s is not a UCM-Go store (no %s/ directory)", dir, sub)
		}
	}
	return nil
}

// openStoreReadOnly opens the store in dir without writing to it.
func openStoreReadOnly(dir string) (*store, error) {
	if err := checkStoreDir(dir); err != nil {
		return nil, err
	}
	e, err := engine.Open(dir, engine.Options{ReadOnly: true, AdoptStoredSchema: true, IOEngine: devio.EnginePsync})
	if err != nil {
		return nil, usageErr("%v", err)
	}
	s := &store{dir: dir, segDir: filepath.Join(dir, engine.SegmentDir), eng: e, ix: e.Index(),
		schema: e.StoredSchema(), layout: e.Layout()}
	s.fp = sha256.Sum256([]byte(s.schema))
	return s, nil
}

func (s *store) close() error { return s.eng.Close() }

// activeSegments returns the rows of segments still marked active: the store was not closed
// cleanly (or a write failed) and recovery has work to do.
func (s *store) activeSegments() []index.SegmentMeta {
	var out []index.SegmentMeta
	for _, m := range s.ix.Segments() {
		if m.State == index.SegmentActive {
			out = append(out, m)
		}
	}
	return out
}

// recoverStore opens the store read-write, which recovers it (scan, truncate the torn tail
// and seal every segment left active, drop index entries past it), and closes it again.
func recoverStore(dir string) (engine.RecoveryReport, error) {
	e, err := engine.Open(dir, engine.Options{AdoptStoredSchema: true, IOEngine: devio.EnginePsync,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return engine.RecoveryReport{}, usageErr("recover: %v", err)
	}
	rep := e.Recovery()
	if err := e.Close(); err != nil {
		return rep, usageErr("recover: close: %v", err)
	}
	return rep, nil
}

// openRecovered opens dir read-only after recovering it first when a segment is still active
// and recover is set. rep is non-nil when recovery ran.
func openRecovered(dir string, recover bool) (s *store, rep *engine.RecoveryReport, err error) {
	s, err = openStoreReadOnly(dir)
	if err != nil {
		return nil, nil, err
	}
	if !recover || len(s.activeSegments()) == 0 {
		return s, nil, nil
	}
	if err := s.close(); err != nil {
		return nil, nil, usageErr("close %s: %v", dir, err)
	}
	r, err := recoverStore(dir)
	if err != nil {
		return nil, nil, err
	}
	s, err = openStoreReadOnly(dir)
	if err != nil {
		return nil, nil, err
	}
	return s, &r, nil
}

// printRecovery prints what a recovery did.
func printRecovery(w io.Writer, r *engine.RecoveryReport) {
	fmt.Fprintf(w, "recovery: the store was not closed cleanly; recovered it in %v:\n", r.Duration.Round(1e5))
	fmt.Fprintf(w, "  segments recovered (truncated to their valid end and sealed): %d\n", r.SegmentsRecovered)
	fmt.Fprintf(w, "  torn or unpublished tail bytes cut: %d\n", r.TruncatedBytes)
	fmt.Fprintf(w, "  index entries dropped (past a valid end or in a missing segment): %d\n", r.EntriesDropped)
	fmt.Fprintf(w, "  unregistered files removed: %d\n", r.OrphansRemoved)
	if len(r.MissingSegments) > 0 {
		fmt.Fprintf(w, "  sealed segments missing: %v\n", r.MissingSegments)
	}
}

// pendingSegment is what recovery will do to one active segment, found without writing.
type pendingSegment struct {
	Number        uint64 `json:"segment"`
	File          string `json:"file"`
	FileSize      int64  `json:"file_size"`
	ValidEnd      int64  `json:"valid_end"`
	Records       int    `json:"valid_records"`
	CutBytes      int64  `json:"bytes_to_cut"`
	EntriesToDrop int    `json:"index_entries_to_drop"`
	Stop          string `json:"stop,omitempty"`
	Missing       bool   `json:"missing,omitempty"`
	Unreadable    string `json:"unreadable,omitempty"` // header unreadable: recovery quarantines it
	scan          *wal.ScanResult
}

// scanPending scans every active segment read-only (wal.ScanSegment, the scan recovery runs)
// and counts the index entries recovery would drop.
func (s *store) scanPending() ([]*pendingSegment, error) {
	active := s.activeSegments()
	if len(active) == 0 {
		return nil, nil
	}
	backend, err := devio.NewBackend(devio.EnginePsync, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	defer func() { _ = backend.Close() }()
	var out []*pendingSegment
	byNum := map[uint64]*pendingSegment{}
	for _, m := range active {
		p := &pendingSegment{Number: m.Number, File: wal.SegmentFileName(m.Number)}
		out = append(out, p)
		byNum[m.Number] = p
		path := wal.SegmentPath(s.segDir, m.Number)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			p.Missing = true
			continue
		}
		res, err := wal.ScanSegment(vfs.Default, path, devio.DirectOff, backend)
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
		}
		if res.Stop != nil {
			p.Stop = res.Stop.Error()
		}
	}
	err = s.ix.Iterate(func(_ format.BlockID, loc index.Location) bool {
		if p := byNum[loc.Segment]; p != nil && (p.scan == nil || loc.Offset >= p.ValidEnd) {
			p.EntriesToDrop++
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Number < out[j].Number })
	return out, err
}

// printPending prints what recovery will do, for --no-recover.
func printPending(w io.Writer, ps []*pendingSegment) {
	fmt.Fprintf(w, "recovery pending: %d segment(s) still active (the store was not closed cleanly); not recovering (--no-recover). Recovery will:\n", len(ps))
	for _, p := range ps {
		switch {
		case p.Missing:
			fmt.Fprintf(w, "  %s: file missing; drop its %d index entries\n", p.File, p.EntriesToDrop)
		case p.Unreadable != "":
			fmt.Fprintf(w, "  %s: header unreadable (%s); quarantine it and drop its %d index entries\n", p.File, p.Unreadable, p.EntriesToDrop)
		default:
			fmt.Fprintf(w, "  %s: keep %d valid records up to offset %d, cut %d bytes (file is %d), drop %d index entries, seal it\n",
				p.File, p.Records, p.ValidEnd, p.CutBytes, p.FileSize, p.EntriesToDrop)
			if p.Stop != "" {
				fmt.Fprintf(w, "    tail stops at: %s\n", p.Stop)
			}
		}
	}
}
