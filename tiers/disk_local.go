package tiers

import (
	"fmt"
	"sync"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/wal"
)

// LocalDisk is a disk tier on a local file system: each of its paths belongs to one store, and
// the files of retired segments are kept for reuse, up to DiskOptions.RecycleSegments per
// directory and within the headroom above the high watermark (Space.PoolRoom), under their
// recycle names (wal.RecyclePath); the next segment created in the directory reuses one
// (Admit). A kept file's bytes stay in Space's used bytes, marked pooled, so the account stays
// exact: Used is always what the files hold, active segments at their reservation.
//
// Lock order: the pool's lock is taken before Space's, never the other way round, so that the
// pool's files and the pooled bytes change together.
type LocalDisk struct {
	*diskBase
	pool       recyclePool
	recycleMax int
}

// pooledFile is a recycled segment file waiting for reuse.
type pooledFile struct {
	path string
	size int64
}

// recyclePool holds the recycled files of a LocalDisk's directories, oldest first.
type recyclePool struct {
	mu    sync.Mutex
	files map[string][]pooledFile
}

// OpenWriters starts the tier's writers (Disk.OpenWriters).
func (t *LocalDisk) OpenWriters(base wal.Options, dump bool) error {
	return t.openWriters(base, dump, t.Admit)
}

// Admit reserves a new segment's room, taking dir's oldest recycled file for it when there is
// one (Disk.Admit); while a dump waits for room it kicks the reclaimer.
func (t *LocalDisk) Admit(_ uint64, dir string, relocation bool) (string, error) {
	rc := &reservationRecycler{t: t, dir: dir}
	if err := t.admit(dir, relocation, t.env.KickReclaimer, rc); err != nil {
		return "", err
	}
	return rc.taken.path, nil
}

// Unlink keeps a recyclable retired file for reuse when dir's pool has room and the file is the
// size the tier accounts for; it deletes it otherwise (Disk.Unlink).
func (t *LocalDisk) Unlink(n uint64, dir string, size int64, recyclable bool) (bool, error) {
	path := wal.SegmentPath(dir, n)
	// Only a file whose size is what the tier accounts for is kept (a prepared segment dropped
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

// Released pools a kept file's bytes, or frees them (Disk.Released). A pool filled meanwhile
// by another retirement gets the kept file deleted instead.
func (t *LocalDisk) Released(dir string, n uint64, size int64, kept bool) {
	if kept {
		t.addPooled(dir, pooledFile{path: wal.RecyclePath(dir, n), size: size})
		return
	}
	t.space.Add(-size)
}

// FoundRecycled pools a recycled file found at Open when a new segment could reuse it: not
// empty, not larger than Reservation, room in dir's pool, and on a file system that can trim a
// reused file (a kernel descriptor).
func (t *LocalDisk) FoundRecycled(path, dir string) (int64, bool) {
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

// PooledFiles returns how many recycled files dir's pool holds.
func (t *LocalDisk) PooledFiles(dir string) int {
	t.pool.mu.Lock()
	defer t.pool.mu.Unlock()
	return len(t.pool.files[dir])
}

// poolHasRoom reports whether dir's pool takes one more file, of size bytes: at most
// recycleMax files per directory, and no more bytes than the headroom above the high
// watermark (Space.PoolRoom), so that kept files never take room from blocks.
func (t *LocalDisk) poolHasRoom(dir string, size int64) bool {
	t.pool.mu.Lock()
	defer t.pool.mu.Unlock()
	return len(t.pool.files[dir]) < t.recycleMax && t.space.PoolRoom(size)
}

// addPooled puts a recycled file into dir's pool and accounts it as pooled (its bytes are in
// used already). A pool filled meanwhile gets the file deleted instead.
func (t *LocalDisk) addPooled(dir string, f pooledFile) {
	t.pool.mu.Lock()
	if len(t.pool.files[dir]) < t.recycleMax && t.space.PoolRoom(f.size) {
		if t.pool.files == nil {
			t.pool.files = map[string][]pooledFile{}
		}
		t.pool.files[dir] = append(t.pool.files[dir], f)
		t.space.Pool(f.size)
		t.pool.mu.Unlock()
		return
	}
	t.pool.mu.Unlock()
	if err := t.fs.Remove(f.path); err != nil && !oserror.IsNotExist(err) {
		// Its bytes stay accounted: the file is still there, and the next Open deletes it.
		t.logger.Error("ucm: could not delete a recycled segment file; the next Open will", "path", f.path, "err", err)
		return
	}
	t.space.Add(-f.size)
}

// takePooled removes the oldest recycled file of dir from its pool and from the pooled bytes
// (they stay in used: the caller reuses the file or deletes it and frees them).
func (t *LocalDisk) takePooled(dir string) (pooledFile, bool) {
	t.pool.mu.Lock()
	files := t.pool.files[dir]
	if len(files) == 0 {
		t.pool.mu.Unlock()
		return pooledFile{}, false
	}
	f := files[0]
	t.pool.files[dir] = files[1:]
	t.space.Unpool(f.size)
	t.pool.mu.Unlock()
	return f, true
}

// releasePooled deletes recycled files until need bytes are freed or none is left, and returns
// the bytes freed: Space calls it when a new segment does not fit only because of them.
func (t *LocalDisk) releasePooled(need int64) int64 {
	var freed int64
	for _, dir := range t.dirs {
		for freed < need {
			f, ok := t.takePooled(dir)
			if !ok {
				break
			}
			if err := t.fs.Remove(f.path); err != nil && !oserror.IsNotExist(err) {
				t.logger.Error("ucm: could not delete a recycled segment file", "path", f.path, "err", err)
				t.addPooled(dir, f) // still there: keep it pooled
				return freed
			}
			t.space.Add(-f.size)
			freed += f.size
		}
	}
	return freed
}

// reservationRecycler is the Recycler of one segment's reservation in dir: it takes dir's
// oldest recycled file for the segment, gives it back if the reservation waits, and deletes
// recycled files of the tier to make room.
type reservationRecycler struct {
	t     *LocalDisk
	dir   string
	taken pooledFile // the file the segment reuses (path "" if none)
}

func (r *reservationRecycler) Take() int64 {
	f, ok := r.t.takePooled(r.dir)
	if !ok {
		return 0
	}
	r.taken = f
	return f.size
}

func (r *reservationRecycler) Return() {
	if r.taken.path != "" {
		r.t.addPooled(r.dir, r.taken)
		r.taken = pooledFile{}
	}
}

func (r *reservationRecycler) Release(need int64) int64 { return r.t.releasePooled(need) }
