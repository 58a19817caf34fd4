package engine

import (
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Segment file recycling (docs/tiers.md). A retired segment's file (evicted, compacted or
// dropped) is kept in its directory under its recycle name (wal.RecyclePath) instead of deleted,
// up to Options.RecycleSegments files per directory, and the next segment created in that
// directory reuses it: renamed to the new segment's name and overwritten. On ext4 (and XFS) an
// O_DIRECT write over blocks already written needs no extent conversion, so the fdatasync that
// acknowledges it commits no journal transaction: a store at capacity, which retires and
// creates segments all the time, dumps at up to twice the rate it would into fresh files
// (docs/performance.md).
//
// Safety rests on three facts. A segment is retired only once no index entry points into it
// (marked deleting, durably, before its file is renamed). The new segment's header, with a new
// generation, goes out with its first records, so until they are durable the file still names
// the retired segment, which recovery reports as wal.ErrStaleHeader and deletes: nothing in it
// was acknowledged. And a scan rejects every record and footer of another segment or
// generation, so the retired segment's bytes past the new records are never read as the new
// segment's (the seal trims them).
//
// Accounting stays exact (tiers.Space): a pooled file's bytes stay in its tier's used bytes
// and are marked pooled, so reclamation does not evict for them; reusing a file converts its
// bytes into the new segment's reservation, and a segment that does not fit while files are
// pooled has some deleted instead of waiting.

// DefaultRecycleSegments is how many retired segment files each segment directory keeps for
// reuse (Options.RecycleSegments).
const DefaultRecycleSegments = 4

// MaxRecycleSegments bounds Options.RecycleSegments.
const MaxRecycleSegments = 1024

// pooledFile is a recycled segment file waiting for reuse.
type pooledFile struct {
	path string
	size int64
}

// recyclePool holds the recycled files of one local tier's segment directories, oldest first (a
// directory belongs to one tier). Its lock is taken before the tier's tiers.Space lock (never
// the other way round), so that the pool's files and the tier's pooled bytes change together.
type recyclePool struct {
	mu    sync.Mutex
	files map[string][]pooledFile
}

// poolHasRoom reports whether dir's pool takes one more file, of size bytes: at most
// t.recycleMax files per directory, and no more bytes than t's headroom above its high
// watermark (tiers.Space.PoolRoom), so that kept files never take room from blocks.
func (t *localDisk) poolHasRoom(dir string, size int64) bool {
	t.pool.mu.Lock()
	defer t.pool.mu.Unlock()
	return len(t.pool.files[dir]) < t.recycleMax && t.space.PoolRoom(size)
}

// addPooled puts a recycled file into dir's pool and accounts it as pooled (its bytes are in
// t's used bytes already). A pool filled meanwhile by another retirement gets the file deleted
// instead.
func (t *localDisk) addPooled(dir string, f pooledFile) {
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
	if err := t.fs.Remove(f.path); err != nil && !isNotExist(err) {
		// Its bytes stay accounted: the file is still there, and the next Open deletes it.
		t.logger.Error("ucm: could not delete a recycled segment file; the next Open will", "path", f.path, "err", err)
		return
	}
	t.space.Add(-f.size)
}

// takePooled removes the oldest recycled file of dir from its pool and from t's pooled bytes
// (they stay in used: the caller reuses the file or deletes it and frees them).
func (t *localDisk) takePooled(dir string) (pooledFile, bool) {
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

// reservationRecycler is the tiers.Recycler of one segment's reservation in dir: it takes
// dir's oldest recycled file for the segment, gives it back if the reservation waits, and
// deletes recycled files of the tier to make room.
type reservationRecycler struct {
	t     *localDisk
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

// releasePooled deletes recycled files of t until need bytes are freed or none is left, and
// returns the bytes freed: tiers.Space calls it when a new segment does not fit only because
// of them.
func (t *localDisk) releasePooled(need int64) int64 {
	var freed int64
	for _, dir := range t.dirs {
		for freed < need {
			f, ok := t.takePooled(dir)
			if !ok {
				break
			}
			if err := t.fs.Remove(f.path); err != nil && !isNotExist(err) {
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

// fileSize returns the size of the file at path, -1 if it cannot be read.
func fileSize(fs vfs.FS, path string) int64 {
	st, err := fs.Stat(path)
	if err != nil {
		return -1
	}
	return st.Size()
}

// fileSize returns the size of the file at path, -1 if it cannot be read.
func (e *Engine) fileSize(path string) int64 { return fileSize(e.fs, path) }

// poolFound puts the recycled files Open found back into their tiers' pools (accounted to their
// tier), up to each pool's size, and deletes the others: those beyond it, those a new segment
// could not reuse (empty, or larger than a segment's reservation), those on file systems that
// cannot trim a reused file (no kernel descriptor) and any on a tier that keeps none.
func (e *Engine) poolFound() {
	for _, r := range e.foundRecycled {
		if _, ok := r.tier.FoundRecycled(r.path, r.dir); ok {
			continue
		}
		if err := e.fs.Remove(r.path); err != nil && !isNotExist(err) {
			e.opts.Logger.Warn("ucm: could not delete a recycled segment file", "path", r.path, "err", err)
		}
	}
	e.foundRecycled = nil
}

// accountFound accounts the recycled files a read-only Open found as pooled, changing nothing
// on disk, so that TierStats.Used is what the tier holds.
func (e *Engine) accountFound() {
	for _, r := range e.foundRecycled {
		if size := e.fileSize(r.path); size > 0 {
			r.tier.Space().Add(size)
			r.tier.Space().Pool(size)
		}
	}
	e.foundRecycled = nil
}

// foundFile is a recycled file found at Open.
type foundFile struct {
	tier      disk
	dir, path string
}
