package share

import (
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/engine/internal/seam"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Config holds the values the sharing is opened with (Open); none changes afterwards.
type Config struct {
	FS     vfs.FS
	Dir    string // the store directory (the foreign index is under it)
	Logger *slog.Logger
	// ReadOnly: nothing is written (no manifest, no foreign index update); LookupOnly: this
	// instance writes no segment of its own.
	ReadOnly, LookupOnly bool
	// The Options' SharedRefreshInterval, SharedOwnerTimeout, SharedSealAge and
	// SharedRetireGrace.
	RefreshInterval, OwnerTimeout, SealAge, RetireGrace time.Duration
	Tiers                                               []tiers.Disk // the engine's disk tiers, in order
	// LockHeld reports whether a failed FS.Lock means another holder (tiers.Leaser.LockHeld).
	LockHeld func(error) bool
	Stop     <-chan struct{} // closed when the background goroutines must end
	BG       *sync.WaitGroup // the engine's background goroutines (the sharer's among them)
}

// Env is what the sharing needs of the rest of the engine. Lock order: the reclaimer's
// lock → the segments' lock → Sharing.mu. Only the methods marked so may be called with
// Sharing.mu held; the others take the segments' or the reclaimer's lock, or call back into
// the sharing.
type Env interface {
	// Instance, Fingerprint and Layout are the engine's identity and record layout: settled
	// by the end of Open (recovery and the schema check may set them after the sharing
	// opens), before any of the sharing's goroutines start. May be called with Sharing.mu
	// held.
	Instance() format.InstanceID
	Fingerprint() format.Fingerprint
	Layout() format.Layout

	// Home returns where own segment n lives (takes the segments' lock).
	Home(n uint64) (Home, bool)
	// TierOf returns the tier holding segment n: for a foreign alias it asks the sharing
	// (foreignSegment takes Sharing.mu), so never with Sharing.mu held.
	TierOf(n uint64) tiers.Disk
	// OwnSegments and OwnSegment read the engine's own index rows. May be called with
	// Sharing.mu held (the index's own locks are taken under it, never around it).
	OwnSegments() []index.SegmentMeta
	OwnSegment(n uint64) (index.SegmentMeta, bool)
	// Indexed reports whether the engine's own index holds block id. May be called with
	// Sharing.mu held.
	Indexed(id format.BlockID) bool
	// ForgetOpen removes and returns the open handle of foreign alias n, if any (takes the
	// segments' lock).
	ForgetOpen(n uint64) *wal.Segment
	// EvictSegment evicts own segment n of tier t and retires it (takes the reclaimer's lock,
	// then the segments' lock; retiring calls back RetireShared).
	EvictSegment(t tiers.Disk, n uint64) error
	// UncacheUnindexedSidecars drops from the memory tier the cached sidecars of blocks ids
	// (nil: all) that neither index holds; it reads the foreign index, never Sharing.mu.
	UncacheUnindexedSidecars(ids []format.BlockID)
	// AtSeam calls the test seam, if any. Called at the same statements as before the
	// sharing had an environment; the tests' hooks take no engine lock.
	AtSeam(p seam.Point, id format.BlockID)
}
