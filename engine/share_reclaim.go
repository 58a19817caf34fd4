package engine

import (
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
)

// evictSegment evicts every live block of sealed segment n of tier t (demoted to the next tier
// when there is one, else dropped) and retires the segment.
func (e *Engine) evictSegment(t tiers.Disk, n uint64) error {
	e.rc.mu.Lock()
	defer e.rc.mu.Unlock()
	refs, err := e.liveRecords(n)
	if err != nil {
		return err
	}
	var ids []BlockID
	for _, r := range refs {
		if r.kind == 0 {
			ids = append(ids, r.id)
		}
	}
	lru := recencyOf(t)
	if lru == nil {
		lru = tiers.NewLRU()
	}
	var rep ReclaimReport
	if err := e.rc.evict(t, lru, ids, false, &rep); err != nil {
		return err
	}
	if err := e.evictSidecars(t, n); err != nil {
		return err
	}
	if row, ok := e.ix.Segment(n); ok && row.LiveRecords == 0 && row.State == index.SegmentSealed {
		return e.retire(n)
	}
	return nil
}
