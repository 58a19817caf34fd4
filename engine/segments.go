package engine

import (
	"fmt"
	"sync"

	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// segments is the provider of segment files: it knows where every segment of the store lives
// (its tier and directory, recorded before the file is created) and holds the open handles
// readers pin. Routing a segment number to its tier is a map lookup here, never a probe of
// the tiers; a foreign alias (another instance's segment on a shared tier) is routed by the
// sharing state instead (tierOf, acquireSegment).
//
// Lock order: the reclaimer's mu → segments.mu → sharing's mu. mu is never taken under
// sharing's mu, nor under a recycle pool's or a tiers.Space's lock.
type segments struct {
	mu    sync.RWMutex
	open  map[uint64]*wal.Segment // open segment files
	homes map[uint64]segHome      // where every known segment lives
}

// segHome says where a segment lives.
type segHome struct {
	tier     tiers.Disk
	dir      string
	reserved int64 // bytes reserved at creation while active; 0 once sealed or found at Open
}

func newSegments() segments {
	return segments{open: map[uint64]*wal.Segment{}, homes: map[uint64]segHome{}}
}

// home returns where segment n lives.
func (s *segments) home(n uint64) (segHome, bool) {
	s.mu.RLock()
	h, ok := s.homes[n]
	s.mu.RUnlock()
	return h, ok
}

// setHome records where segment n lives.
func (s *segments) setHome(n uint64, h segHome) {
	s.mu.Lock()
	s.homes[n] = h
	s.mu.Unlock()
}

// forgetHome forgets where segment n lives (its file is gone).
func (s *segments) forgetHome(n uint64) {
	s.mu.Lock()
	delete(s.homes, n)
	s.mu.Unlock()
}

// add makes an open segment visible to readers.
func (s *segments) add(seg *wal.Segment) {
	s.mu.Lock()
	s.open[seg.Number] = seg
	s.mu.Unlock()
}

// forget removes segment n's open handle (nil if none was open) and returns it with n's home,
// which stays recorded until the file is gone (forgetHome).
func (s *segments) forget(n uint64) (*wal.Segment, segHome) {
	s.mu.Lock()
	seg := s.open[n]
	delete(s.open, n)
	h := s.homes[n]
	s.mu.Unlock()
	return seg, h
}

// settle marks segment n sealed: its reservation ends. It returns n's home and the bytes that
// were reserved (0 when none, or n is unknown).
func (s *segments) settle(n uint64) (segHome, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.homes[n]
	if !ok {
		return segHome{}, 0
	}
	reserved := h.reserved
	h.reserved = 0
	s.homes[n] = h
	return h, reserved
}

// releaseAll releases and forgets every open handle (on a failed Open and at Close).
func (s *segments) releaseAll() {
	s.mu.Lock()
	for n, seg := range s.open {
		seg.Release()
		delete(s.open, n)
	}
	s.mu.Unlock()
}

// forgetSegment removes segment n's open handle (nil if none) and returns it with n's home
// (segments.forget).
func (e *Engine) forgetSegment(n uint64) (*wal.Segment, segHome) { return e.segs.forget(n) }

// forgetHome forgets where segment n lives (its file is gone).
func (e *Engine) forgetHome(n uint64) { e.segs.forgetHome(n) }

// home returns where segment n lives.
func (e *Engine) home(n uint64) (segHome, bool) { return e.segs.home(n) }

// segPath returns segment n's file path (in the first tier's first directory when unknown).
func (e *Engine) segPath(n uint64) string {
	if h, ok := e.home(n); ok {
		return wal.SegmentPath(h.dir, n)
	}
	return wal.SegmentPath(e.segDir, n)
}

// tierOf returns the tier holding segment n (for a foreign alias, the shared tier it was
// found in), or nil.
func (e *Engine) tierOf(n uint64) tiers.Disk {
	if isForeign(n) {
		fs, _ := e.share.ForeignSegment(n)
		return fs.Tier
	}
	h, ok := e.home(n)
	if !ok {
		return nil
	}
	return h.tier
}

// placer returns the DirFor of t's writers: placement by segment number across t's paths. The
// segment's home is recorded before its file is created, so readers and accounting find it.
func (e *Engine) placer(t tiers.Disk) func(uint64) string {
	return func(n uint64) string {
		dir := tiers.PathFor(t.Dirs(), n)
		e.segs.setHome(n, segHome{tier: t, dir: dir, reserved: e.reservation(t)})
		return dir
	}
}

// addSegment makes a segment the writer opened visible to readers.
func (e *Engine) addSegment(s *wal.Segment) {
	e.segs.add(s)
	if s.Reused() {
		e.stats.segmentsRecycled.Add(1)
	}
}

// settleSealed replaces a sealed segment's reservation by its final size.
func (e *Engine) settleSealed(n uint64, size int64) {
	if h, reserved := e.segs.settle(n); reserved > 0 {
		h.tier.Space().Add(size - reserved)
	}
}

// dropOpen removes and returns the open handle of segment n (nil if none): a foreign alias
// that left the foreign index.
func (e *Engine) dropOpen(n uint64) *wal.Segment {
	s, _ := e.segs.forget(n)
	return s
}

// acquireSegment returns segment n pinned for reading, opening a sealed one on first use. A
// segment that is unknown, being deleted or gone fails with wal.ErrSegmentGone. A foreign
// alias is opened by the sharing state with segments.mu held (it takes only sharing's mu).
func (e *Engine) acquireSegment(n uint64) (*wal.Segment, error) {
	p := &e.segs
	p.mu.RLock()
	s := p.open[n]
	p.mu.RUnlock()
	if s == nil {
		p.mu.Lock()
		if s = p.open[n]; s == nil {
			var err error
			if isForeign(n) {
				s, err = e.share.OpenForeign(n)
			} else {
				meta, ok := e.ix.Segment(n)
				h, known := p.homes[n]
				if !ok || !known || meta.State == index.SegmentDeleting {
					p.mu.Unlock()
					return nil, fmt.Errorf("segment %d: %w", n, wal.ErrSegmentGone)
				}
				s, err = h.tier.OpenSegment(h.dir, n, meta.Generation)
			}
			if err != nil {
				p.mu.Unlock()
				return nil, err
			}
			p.open[n] = s
		}
		p.mu.Unlock()
	}
	if err := s.Acquire(); err != nil {
		return nil, err
	}
	return s, nil
}
