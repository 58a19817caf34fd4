package engine

import (
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// The sharing (share.go, publog.go, share_reclaim.go, share_summary.go, share_space.go) is a
// type of its own: what it needs of the engine is the small environment below, as Pebble's
// commitPipeline has its commitEnv, and the values it was opened with (sharingConfig).

// sharingConfig holds the values the sharing is opened with; none changes afterwards.
type sharingConfig struct {
	FS     vfs.FS
	Dir    string // the store directory (the foreign index is under it)
	Logger *slog.Logger
	// ReadOnly: nothing is written (no manifest, no foreign index update); LookupOnly: this
	// instance writes no segment of its own.
	ReadOnly, LookupOnly bool
	// The Options' SharedRefreshInterval, SharedOwnerTimeout, SharedSealAge and
	// SharedRetireGrace.
	RefreshInterval, OwnerTimeout, SealAge, RetireGrace time.Duration
	Tiers                                               []tiers.Disk    // the engine's disk tiers, in order
	Stop                                                <-chan struct{} // closed when the background goroutines must end
	BG                                                  *sync.WaitGroup // the engine's background goroutines (the sharer's among them)
}

// sharingEnv is what the sharing needs of the rest of the engine. Lock order: the reclaimer's
// lock → the segments' lock → sharing.mu. Only the methods marked so may be called with
// sharing.mu held; the others take the segments' or the reclaimer's lock, or call back into
// the sharing.
type sharingEnv interface {
	// Instance, Fingerprint and Layout are the engine's identity and record layout: settled
	// by the end of Open (recovery and the schema check may set them after the sharing
	// opens), before any of the sharing's goroutines start. May be called with sharing.mu
	// held.
	Instance() format.InstanceID
	Fingerprint() format.Fingerprint
	Layout() format.Layout

	// Home returns where own segment n lives (takes the segments' lock).
	Home(n uint64) (segHome, bool)
	// TierOf returns the tier holding segment n: for a foreign alias it asks the sharing
	// (foreignSegment takes sharing.mu), so never with sharing.mu held.
	TierOf(n uint64) tiers.Disk
	// OwnSegments and OwnSegment read the engine's own index rows. May be called with
	// sharing.mu held (the index's own locks are taken under it, never around it).
	OwnSegments() []index.SegmentMeta
	OwnSegment(n uint64) (index.SegmentMeta, bool)
	// Indexed reports whether the engine's own index holds block id. May be called with
	// sharing.mu held.
	Indexed(id BlockID) bool
	// ForgetOpen removes and returns the open handle of foreign alias n, if any (takes the
	// segments' lock).
	ForgetOpen(n uint64) *wal.Segment
	// EvictSegment evicts own segment n of tier t and retires it (takes the reclaimer's lock,
	// then the segments' lock; retiring calls back retireShared).
	EvictSegment(t tiers.Disk, n uint64) error
	// UncacheUnindexedSidecars drops from the memory tier the cached sidecars of blocks ids
	// (nil: all) that neither index holds; it reads the foreign index, never sharing.mu.
	UncacheUnindexedSidecars(ids []BlockID)
	// AtSeam calls the test seam, if any. Called at the same statements as before the
	// sharing had an environment; the tests' hooks take no engine lock.
	AtSeam(p seamPoint, id BlockID)
}

// engineSharingEnv is the engine's sharingEnv.
type engineSharingEnv struct{ e *Engine }

func (v engineSharingEnv) Instance() format.InstanceID      { return v.e.instance }
func (v engineSharingEnv) Fingerprint() format.Fingerprint  { return v.e.fingerprint }
func (v engineSharingEnv) Layout() format.Layout            { return v.e.opts.Layout }
func (v engineSharingEnv) Home(n uint64) (segHome, bool)    { return v.e.home(n) }
func (v engineSharingEnv) TierOf(n uint64) tiers.Disk       { return v.e.tierOf(n) }
func (v engineSharingEnv) OwnSegments() []index.SegmentMeta { return v.e.ix.Segments() }
func (v engineSharingEnv) Indexed(id BlockID) bool          { return v.e.ix.Contains(id) }
func (v engineSharingEnv) ForgetOpen(n uint64) *wal.Segment { return v.e.dropOpen(n) }
func (v engineSharingEnv) AtSeam(p seamPoint, id BlockID)   { v.e.atSeam(p, id) }
func (v engineSharingEnv) UncacheUnindexedSidecars(ids []BlockID) {
	v.e.uncacheUnindexedSidecars(ids)
}
func (v engineSharingEnv) OwnSegment(n uint64) (index.SegmentMeta, bool) {
	return v.e.ix.Segment(n)
}
func (v engineSharingEnv) EvictSegment(t tiers.Disk, n uint64) error {
	return v.e.evictSegment(t, n)
}
