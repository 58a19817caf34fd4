package engine

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// The index must never be starved of space: Pebble cannot open (it replays its WAL into a new
// table) nor commit on a full file system, and it retries the replay without end. So the store
// keeps a ballast file, ReserveFile, in its directory: space it holds back for the index and
// releases when the file system fills (as CockroachDB keeps an emergency ballast).
//
//   - Open, before the index opens: when the file system has less free space than the index
//     needs to open for writing (its WAL's size plus indexRoomSlack), the ballast is deleted;
//     if that is still not enough, the store opens read-only (loads and lookups served, dumps
//     refused with ErrNoSpace naming the path) instead of hanging.
//   - While the engine runs, the dump path looks at the file system at most once per
//     spaceCheckEvery: filled by someone else to below lowWater, the ballast is released (the
//     index gets that room) and dumps are refused with ErrNoSpace until the file system has
//     room for the ballast and a segment again; then the ballast is made again.
//   - A new segment on the store's file system is admitted only if, once it is allocated, the
//     ballast would still fit: the engine's own dumps never fill the file system.
const (
	// ReserveFile is the ballast file's name in the store directory.
	ReserveFile = "RESERVE"
	// DefaultIndexReserve is Options.IndexReserve's default: the ballast is at most this, and
	// at most 1/16 of the file system.
	DefaultIndexReserve = 32 << 20
	// indexRoomSlack is what the index needs beyond its WAL's size to open for writing (a new
	// WAL, MANIFEST and OPTIONS file, table overhead).
	indexRoomSlack = 1 << 20
	// spaceCheckEvery bounds how often the dump path looks at the file system.
	spaceCheckEvery = 100 * time.Millisecond
	// lowWater is the free space below which the file system counts as full: the ballast is
	// released and dumps refused (the index keeps room for the entries in flight).
	lowWater = 2 * indexRoomSlack
)

// spaceGuard is the engine's state of the store's file system.
type spaceGuard struct {
	// full is set while dumps are refused for lack of space (the ballast released, or the
	// store opened read-only on a full file system).
	full atomic.Pointer[error]
	// readOnly: opened read-only because the index had no room to open for writing.
	readOnly bool
	mu       sync.Mutex   // one look at the file system at a time
	checked  atomic.Int64 // when it last looked (Unix ns): dumps in between take no lock
}

// reserveSize is the ballast's size on a file system of total bytes (0: none).
func (e *Engine) reserveSize(total uint64) int64 {
	if e.opts.IndexReserve <= 0 {
		return 0
	}
	return min(e.opts.IndexReserve, int64(total/16)) &^ (format.Alignment - 1)
}

// diskUsage returns the store file system's usage; ok is false where the file system cannot
// tell (in-memory file systems): then nothing is guarded.
func (e *Engine) diskUsage() (vfs.DiskUsage, bool) {
	du, err := e.fs.GetDiskUsage(e.dir)
	return du, err == nil && du.TotalBytes > 0
}

// indexNeeds is the free space the index needs to open for writing: its WAL files' size (the
// replay writes them into a table) plus indexRoomSlack.
func (e *Engine) indexNeeds() int64 {
	dir := e.fs.PathJoin(e.dir, IndexDir)
	names, err := e.fs.List(dir)
	if err != nil {
		return indexRoomSlack
	}
	need := int64(indexRoomSlack)
	for _, n := range names {
		if strings.HasSuffix(n, ".log") {
			if st, err := e.fs.Stat(e.fs.PathJoin(dir, n)); err == nil {
				need += st.Size()
			}
		}
	}
	return need
}

// prepareIndexRoom runs before the index opens for writing: on a file system without the room
// the index needs, it releases the ballast, and if that is not enough switches the open to
// read-only (returning true).
func (e *Engine) prepareIndexRoom() (readOnly bool) {
	du, ok := e.diskUsage()
	if !ok {
		return false
	}
	need := e.indexNeeds()
	if int64(du.AvailBytes) >= need {
		return false
	}
	if released := e.releaseReserve(); released > 0 {
		e.opts.Logger.Error("ucm: file system full: released the index's reserve so that the index can open; dumps are refused until space is freed",
			"path", e.dir, "released", released, "free", du.AvailBytes)
		e.setFull(fmt.Errorf("file system of %s is full (%d bytes free): the index's reserve was released; dumps resume once %d bytes are free: %w",
			e.dir, du.AvailBytes, e.reserveSize(du.TotalBytes)+indexRoomSlack, ErrNoSpace))
		if du, ok = e.diskUsage(); ok && int64(du.AvailBytes) >= need {
			return false
		}
	}
	e.opts.Logger.Error("ucm: file system full: the index has no room to open for writing; opening the store read-only (loads only)",
		"path", e.dir, "free", du.AvailBytes, "needed", need)
	e.space.readOnly = true
	e.setFull(fmt.Errorf("file system of %s is full (%d bytes free, the index needs %d to open for writing): the store was opened read-only; free space and reopen it: %w",
		e.dir, du.AvailBytes, need, ErrNoSpace))
	return true
}

func (e *Engine) setFull(err error) { e.space.full.Store(&err) }

// spaceFull returns why dumps are refused for lack of space as last seen, or nil, without
// looking at the file system.
func (e *Engine) spaceFull() error {
	if p := e.space.full.Load(); p != nil {
		return *p
	}
	return nil
}

// spaceError returns why dumps are refused for lack of space, or nil. At most once per
// spaceCheckEvery it looks at the file system: when someone else has filled it to below
// lowWater, it releases the ballast (the index gets that room for the entries of the dumps
// in flight) and refuses dumps; once there is room again, it makes the ballast again and lets
// dumps through.
func (e *Engine) spaceError() error {
	current := e.spaceFull
	due := func() bool { return time.Now().UnixNano()-e.space.checked.Load() >= int64(spaceCheckEvery) }
	if e.opts.ReadOnly || !due() {
		return current() // a read-only engine (also the full-disk fallback) never writes
	}
	e.space.mu.Lock()
	defer e.space.mu.Unlock()
	if !due() {
		return current()
	}
	e.space.checked.Store(time.Now().UnixNano())
	if p := e.space.full.Load(); p != nil {
		if e.keepReserve() {
			e.space.full.Store(nil)
			e.opts.Logger.Warn("ucm: space is back: the index's reserve was made again; dumps resume", "path", e.dir)
			return nil
		}
		return *p
	}
	du, ok := e.diskUsage()
	if !ok || int64(du.AvailBytes) >= lowWater {
		return nil
	}
	released := e.releaseReserve()
	e.opts.Logger.Error("ucm: file system full: dumps are refused until space is freed", "path", e.dir,
		"free", du.AvailBytes, "reserve_released", released)
	e.setFull(fmt.Errorf("file system of %s is full (%d bytes free): dumps resume once %d bytes are free: %w",
		e.dir, du.AvailBytes, e.reserveSize(du.TotalBytes)+e.reservation(e.tiers[0])+indexRoomSlack, ErrNoSpace))
	return *e.space.full.Load()
}

// releaseReserve deletes the ballast, if there is one, and returns the bytes it held.
func (e *Engine) releaseReserve() int64 {
	path := e.fs.PathJoin(e.dir, ReserveFile)
	st, err := e.fs.Stat(path)
	if err != nil || e.fs.Remove(path) != nil {
		return 0
	}
	_ = wal.SyncDir(e.fs, e.dir)
	return st.Size()
}

// keepReserve makes the ballast if it is missing and the file system has room for it and one
// more segment; it reports whether the ballast is in place (or none is wanted).
func (e *Engine) keepReserve() bool {
	du, ok := e.diskUsage()
	if !ok {
		return true
	}
	size := e.reserveSize(du.TotalBytes)
	if size == 0 {
		return true
	}
	path := e.fs.PathJoin(e.dir, ReserveFile)
	if st, err := e.fs.Stat(path); err == nil && st.Size() >= size {
		return true
	}
	if int64(du.AvailBytes) < size+e.reservation(e.tiers[0])+indexRoomSlack {
		return false
	}
	if err := e.writeReserve(path, size); err != nil {
		e.opts.Logger.Warn("ucm: could not make the index's reserve", "path", path, "err", err)
		_ = e.fs.Remove(path)
		return false
	}
	return true
}

// writeReserve allocates the ballast file (allocated blocks, not a sparse file) and makes it
// durable.
func (e *Engine) writeReserve(path string, size int64) error {
	f, err := e.fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	err = f.Preallocate(0, size)
	if err == nil {
		// Preallocate keeps the file's size; write its last block so the size shows it.
		_, err = f.WriteAt(make([]byte, format.Alignment), size-format.Alignment)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return wal.SyncDir(e.fs, e.dir)
}

// sameFS reports whether dir is on the store directory's file system.
func (e *Engine) sameFS(dir string) bool {
	a, err1 := e.fs.Stat(dir)
	b, err2 := e.fs.Stat(e.dir)
	return err1 == nil && err2 == nil && sameDevice(a, b)
}

// admitSpace is checked before a new segment reserving reservation bytes is created in dir: on
// the store's own file system, the segment must leave room for the ballast (or for the index,
// when the ballast is gone), so that the engine's dumps never fill the file system.
func (e *Engine) admitSpace(dir string, reservation int64) error {
	if !e.sameFS(dir) {
		return nil
	}
	du, ok := e.diskUsage()
	if !ok {
		return nil
	}
	need := reservation + indexRoomSlack
	if _, err := e.fs.Stat(e.fs.PathJoin(e.dir, ReserveFile)); errors.Is(err, os.ErrNotExist) {
		need += e.reserveSize(du.TotalBytes)
	}
	if int64(du.AvailBytes) < need {
		return fmt.Errorf("file system of %s has %d bytes free, below the %d a new segment and the index's reserve need: %w",
			dir, du.AvailBytes, need, ErrNoSpace)
	}
	return nil
}
