package wal

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// SegmentExt is the file-name extension of segment files.
const SegmentExt = ".seg"

// SegmentFileName is the file name of segment n: 16 zero-padded decimal digits and SegmentExt,
// so a directory listing sorts in segment order.
func SegmentFileName(n uint64) string { return fmt.Sprintf("%016d%s", n, SegmentExt) }

// ParseSegmentFileName returns the number of a segment file name, ok=false for any other name.
func ParseSegmentFileName(name string) (uint64, bool) {
	base, found := strings.CutSuffix(name, SegmentExt)
	if !found || len(base) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(base, 10, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	return n, true
}

// RecycleExt is appended to a retired segment's file name when the file is kept for reuse
// instead of deleted ("0000000000000007.seg.recycle"). A recycled file is not a segment: its
// old records belong to a retired segment no index entry points into. A new segment reuses it
// by renaming it to its own name and overwriting it (CreateSegment): O_DIRECT writes over blocks
// already written need no extent conversion, so their fdatasync commits no journal
// (docs/performance.md measures 2 MiB dumps at 6.0–6.7 GB/s into recycled files against
// 3.2–3.7 GB/s into fresh ones).
const RecycleExt = ".recycle"

// RecyclePath is the name segment n's file gets in dir while it waits for reuse.
func RecyclePath(dir string, n uint64) string { return SegmentPath(dir, n) + RecycleExt }

// ParseRecycleFileName returns the number of the retired segment a recycled file held,
// ok=false for any other name.
func ParseRecycleFileName(name string) (uint64, bool) {
	base, found := strings.CutSuffix(name, RecycleExt)
	if !found {
		return 0, false
	}
	return ParseSegmentFileName(base)
}

// ErrStaleHeader reports a segment file whose header names another segment: a recycled file
// renamed for a new segment whose own header (written with its first records) never reached
// the disk. Nothing in it belongs to the segment, and nothing was acknowledged from it: the
// header is durable before any of the new segment's records is. Recovery deletes it.
var ErrStaleHeader = errors.New("segment file still holds a retired segment's header")

// ErrSegmentGone is returned when a segment a reader asks for has been deleted (compacted,
// evicted, or removed by its owner). Readers treat it as a miss.
var ErrSegmentGone = errors.New("segment gone")

// ErrNoHeader marks a segment file whose header block is all zeros or missing (a file shorter
// than a header): created, its header never written or never made durable. The header goes to disk with the segment's first records and is durable before any
// of them is acknowledged, so such a file holds nothing anyone was promised; recovery deletes
// it. A scan reports it as a CorruptionError wrapping ErrNoHeader (and format.ErrCorrupt).
var ErrNoHeader = errors.New("segment header never written")

// Segment is one open segment file. Records are read through File with the Backend; readers
// Acquire the segment for the duration of their I/O so that it is not closed or unlinked
// under them.
type Segment struct {
	// Number and Generation identify the segment; every record header repeats them.
	Number     uint64
	Generation uint64
	path       string
	file       *devio.File
	// info is the decoded header of a segment opened for reading (OpenSegmentForRead).
	info format.SegmentHeader

	refs     atomic.Int64 // readers + 1 for the owner's reference
	closeOne sync.Once
	closeErr error
	removeFn func() // set by Retire: unlink after the last reader leaves

	// Active-segment state, owned by the committer goroutine.
	end     int64                // next append offset
	entries []format.FooterEntry // records appended, for the footer
	ordinal uint64               // records appended, for sequence numbers
	// firstPlaced is when the first record was placed (SealOlderThan).
	firstPlaced time.Time
	// allocated: the file was extended to the segment size with fallocate when it was
	// created; seal trims the unused tail.
	allocated bool
	// reused: the segment was created in a recycled file (CreateSegment with reuse), which
	// may extend past its records with a retired segment's bytes until the seal trims it.
	reused bool
	// header is the encoded segment header until it is written: with the first records (one
	// vectored write with them), or by the seal of a segment that never got one.
	header []byte
	// batches are the batch records placed in the segment (committer-owned until the seal),
	// openBatches counts those neither committed nor abandoned: the seal waits for them.
	batches     []*Batch
	openBatches sync.WaitGroup
	// syncs shares fdatasyncs between concurrent batch commits (syncCovering).
	syncs syncGroup
	// dataSyncs, if set, counts the fdatasyncs of the segment (its Writer's
	// Options.DataSyncs).
	dataSyncs *atomic.Int64
	// failed holds the first write or sync error of the segment; appends stop there.
	failed atomic.Pointer[error]
}

// syncData fdatasyncs the segment's file, counted in dataSyncs.
func (s *Segment) syncData() error {
	if s.dataSyncs != nil {
		s.dataSyncs.Add(1)
	}
	return s.file.SyncData()
}

// syncGroup shares fdatasyncs of one file between concurrent callers: a caller needs a sync
// that starts after its writes completed, and one sync serves every caller waiting when it
// starts (group commit).
type syncGroup struct {
	mu      sync.Mutex
	cond    *sync.Cond
	syncing bool
	started uint64 // syncs started
	done    uint64 // syncs finished (in order: one at a time)
	waiters int    // callers waiting for a sync another caller runs
	err     error  // the first failed sync's error: sticky
}

// syncCovering makes every write to s that completed before the call durable, sharing the
// fdatasync with concurrent callers: a caller that finds a sync under way waits for it and
// then for the next one (the one under way may have started before its writes completed).
// Once a sync of s has failed, every call returns that error, also a call whose covering sync
// came after and succeeded: a successful fdatasync after a failed one does not prove the
// earlier writes durable (Linux may drop the failed pages' error state), and the segment is
// failed for good.
func (s *Segment) syncCovering() error {
	g := &s.syncs
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
	target := g.started + 1 // a sync under way may have started before our writes completed
	for g.done < target {
		if g.syncing {
			g.waiters++
			g.cond.Wait()
			g.waiters--
			continue
		}
		g.syncing = true
		g.started++
		n := g.started
		g.mu.Unlock()
		err := s.syncData()
		g.mu.Lock()
		g.syncing, g.done = false, n
		if err != nil && g.err == nil {
			g.err = err
		}
		g.cond.Broadcast()
	}
	return g.err
}

// fail records that a write or sync of the segment failed; it reports whether this was the
// first failure.
func (s *Segment) fail(err error) bool { return s.failed.CompareAndSwap(nil, &err) }

// failure returns the segment's first write or sync error, nil while it is healthy.
func (s *Segment) failure() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func newSegment(number, generation uint64, path string, f *devio.File) *Segment {
	s := &Segment{Number: number, Generation: generation, path: path, file: f}
	s.refs.Store(1)
	return s
}

// Path is the segment file's path.
func (s *Segment) Path() string { return s.path }

// File is the segment's open file, valid while the caller holds a reference.
func (s *Segment) File() *devio.File { return s.file }

// Acquire takes a reader reference. It fails with ErrSegmentGone once the segment has been
// retired and its last reference dropped.
func (s *Segment) Acquire() error {
	for {
		n := s.refs.Load()
		if n <= 0 {
			return fmt.Errorf("segment %d: %w", s.Number, ErrSegmentGone)
		}
		if s.refs.CompareAndSwap(n, n+1) {
			return nil
		}
	}
}

// Release drops a reference taken by Acquire; the last one closes the file (and unlinks it if
// the segment was retired).
func (s *Segment) Release() {
	if s.refs.Add(-1) == 0 {
		s.closeOne.Do(func() {
			s.closeErr = s.file.Close()
			if s.removeFn != nil {
				s.removeFn()
			}
		})
	}
}

// Recyclable reports whether the segment's file can be kept for reuse once the segment is
// retired: it has a kernel descriptor, so the segment that reuses it can lay it out and trim
// it at its seal (devio.File.Allocate, Truncate).
func (s *Segment) Recyclable() bool { return s.file.VFS().Fd() != vfs.InvalidFd }

// Reused reports whether the segment was created in a recycled file.
func (s *Segment) Reused() bool { return s.reused }

// Retire hands the owner's reference over to deletion: remove runs once, after the last reader
// releases the segment (at once if there is none), and later Acquire calls fail with
// ErrSegmentGone. Retire must be called once, by the owner, instead of Release.
func (s *Segment) Retire(remove func()) {
	s.removeFn = remove
	s.Release()
}

// SequenceFor is the store-wide sequence number of the ordinal-th record of segment n:
// segment numbers only grow, so sequence numbers grow in write order without extra state.
func SequenceFor(segment, ordinal uint64) uint64 { return segment<<32 | ordinal }

// SyncDir fsyncs a directory so that creations, renames and removals in it are durable.
func SyncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("open dir %s for sync: %w", dir, err)
	}
	serr := d.Sync()
	cerr := d.Close()
	if serr != nil {
		return fmt.Errorf("sync dir %s: %w", dir, serr)
	}
	return cerr
}

// IsGone reports whether err says a file no longer exists: ENOENT, or ESTALE, which a
// distributed file system (NFS, GlusterFS) returns for a file another host deleted while this
// one still had it open or cached.
func IsGone(err error) bool { return oserror.IsNotExist(err) || errors.Is(err, syscall.ESTALE) }

// SegmentPath joins a segment directory and a segment number.
func SegmentPath(dir string, n uint64) string { return filepath.Join(dir, SegmentFileName(n)) }

// OpenSegmentForRead opens sealed segment n of dir for reading and checks that its header
// names segment n with the expected generation (a file replaced under the index is refused).
func OpenSegmentForRead(fs vfs.FS, dir string, n, generation uint64, direct devio.DirectMode, backend devio.Backend) (*Segment, error) {
	path := SegmentPath(dir, n)
	f, err := devio.OpenReadOnly(fs, path, direct)
	if err != nil {
		if IsGone(err) {
			return nil, fmt.Errorf("segment %d (%s): %w: %w", n, path, ErrSegmentGone, err)
		}
		return nil, err
	}
	buf := devio.AlignedBuffer(format.SegmentHeaderSize)
	if err := backend.Submit([]devio.Op{{File: f, Buf: buf}}); err != nil {
		_ = f.Close()
		if IsGone(err) {
			return nil, fmt.Errorf("segment %d (%s): %w: %w", n, path, ErrSegmentGone, err)
		}
		return nil, err
	}
	h, err := format.DecodeSegmentHeader(buf)
	if err == nil && (h.Number != n || h.Generation != generation) {
		err = fmt.Errorf("%w: header names segment %d generation %#x, index expects %d generation %#x",
			format.ErrCorrupt, h.Number, h.Generation, n, generation)
	}
	if err != nil {
		_ = f.Close()
		return nil, &CorruptionError{Path: path, Err: err}
	}
	s := newSegment(n, generation, path, f)
	s.info = h
	return s, nil
}

// Info returns the header of a segment opened by OpenSegmentForRead (the zero header for one a
// writer created): its creator instance and schema fingerprint among others.
func (s *Segment) Info() format.SegmentHeader { return s.info }

// ReadFooter reads and checks the footer of sealed segment seg, whose file is size bytes (the
// size the index recorded at the seal): the list of every record in it, without scanning them.
// A footer that fails its checks is a *CorruptionError.
func ReadFooter(seg *Segment, size int64, backend devio.Backend) ([]format.FooterEntry, error) {
	if size < format.SegmentHeaderSize+format.Alignment || size%format.Alignment != 0 {
		return nil, &CorruptionError{Path: seg.path, Err: fmt.Errorf("%w: sealed size %d", format.ErrCorrupt, size)}
	}
	tail := devio.AlignedBuffer(format.Alignment)
	if err := backend.Submit([]devio.Op{{File: seg.file, Buf: tail, Off: size - format.Alignment}}); err != nil {
		return nil, fmt.Errorf("read footer of segment %d: %w", seg.Number, err)
	}
	t, err := format.DecodeTrailer(tail, size)
	if err == nil && (t.Segment != seg.Number || t.Generation != seg.Generation) {
		err = fmt.Errorf("%w: footer names segment %d generation %#x", format.ErrCorrupt, t.Segment, t.Generation)
	}
	if err != nil {
		return nil, &CorruptionError{Path: seg.path, Err: err}
	}
	foot := devio.AlignedBuffer(int(size - t.DataEnd)) // bounded by the file size, checked above
	if err := backend.Submit([]devio.Op{{File: seg.file, Buf: foot, Off: t.DataEnd}}); err != nil {
		return nil, fmt.Errorf("read footer of segment %d: %w", seg.Number, err)
	}
	entries, err := format.DecodeFooterEntries(foot, t)
	if err != nil {
		return nil, &CorruptionError{Path: seg.path, Err: err}
	}
	return entries, nil
}

// ReplaceFile makes data the content of path atomically and durably: it is written to tmp (in
// the same directory), synced, renamed over path and the directory synced, so a reader sees
// the old content or the new one, whole, and a crash leaves one of them. Small metadata files
// (manifests, leases, the instance id) are written this way.
func ReplaceFile(fs vfs.FS, path, tmp string, data []byte) error {
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fs.Rename(tmp, path)
	}
	if err == nil {
		err = SyncDir(fs, filepath.Dir(path))
	}
	return err
}
