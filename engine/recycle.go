package engine

import (
	"github.com/ucm-go/ucm/tiers"
)

// Segment file recycling (docs/tiers.md; the pools are tiers.LocalDisk's). A retired segment's file (evicted, compacted or
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

// fileSize returns the size of the file at path, -1 if it cannot be read.
func (e *Engine) fileSize(path string) int64 {
	st, err := e.fs.Stat(path)
	if err != nil {
		return -1
	}
	return st.Size()
}

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
	tier      tiers.Disk
	dir, path string
}
