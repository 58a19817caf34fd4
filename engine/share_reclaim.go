package engine

import "github.com/ucm-go/ucm/tiers"

// evictSegment evicts every live block of sealed segment n of tier t (demoted to the next tier
// when there is one, else dropped) and retires the segment (reclaimer.evictSegment, keeping
// nothing: the sharing code frees the shared tier's capacity by whole segments).
func (e *Engine) evictSegment(t tiers.Disk, n uint64) error {
	e.rc.mu.Lock()
	defer e.rc.mu.Unlock()
	var rep ReclaimReport
	return e.rc.evictSegment(t, n, false, false, &rep)
}
