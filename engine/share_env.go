package engine

import (
	"github.com/ucm-go/ucm/engine/internal/seam"
	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// engineSharingEnv is the engine's share.Env: the sharing's view of the provider of segment
// homes and open files, the engine's index, the reclaimer, the memory tier and the test seam.
type engineSharingEnv struct{ e *Engine }

func (v engineSharingEnv) Instance() format.InstanceID     { return v.e.instance }
func (v engineSharingEnv) Fingerprint() format.Fingerprint { return v.e.fingerprint }
func (v engineSharingEnv) Layout() format.Layout           { return v.e.opts.Layout }
func (v engineSharingEnv) Home(n uint64) (share.Home, bool) {
	h, ok := v.e.home(n)
	return share.Home{Dir: h.dir, Tier: h.tier}, ok
}
func (v engineSharingEnv) TierOf(n uint64) tiers.Disk       { return v.e.tierOf(n) }
func (v engineSharingEnv) OwnSegments() []index.SegmentMeta { return v.e.ix.Segments() }
func (v engineSharingEnv) Indexed(id BlockID) bool          { return v.e.ix.Contains(id) }
func (v engineSharingEnv) ForgetOpen(n uint64) *wal.Segment { return v.e.dropOpen(n) }
func (v engineSharingEnv) AtSeam(p seam.Point, id BlockID)  { v.e.atSeam(p, id) }
func (v engineSharingEnv) UncacheUnindexedSidecars(ids []BlockID) {
	v.e.uncacheUnindexedSidecars(ids)
}
func (v engineSharingEnv) OwnSegment(n uint64) (index.SegmentMeta, bool) {
	return v.e.ix.Segment(n)
}
func (v engineSharingEnv) EvictSegment(t tiers.Disk, n uint64) error {
	return v.e.evictSegment(t, n)
}
