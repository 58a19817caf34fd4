package engine

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
)

// The global capacity of a shared tier (docs/sharing.md). A shared tier's capacity bounds the
// bytes of every instance's published segments together. One instance at a time, the holder of
// the tier's reclaimer lease (tiers.Leaser, at the first path), enforces it: above the high
// watermark it ranks every published segment by its last access — the owner's own reads
// (ManifestEntry.Accessed), the other instances' (NoteAccess in their manifests), else its
// publication — and asks the owners of the least recently used ones, oldest first, to retire
// them until the tier would be at its low watermark: a NoteRetire in the holder's manifest,
// which each owner reads at its next refresh and obeys (only the owner evicts its blocks and
// deletes its files). Its own victims it evicts at once.

// maxAccessNotes bounds the access notes one manifest carries (the most recent ones).
const maxAccessNotes = 1 << 16

// noteAccess records a successful read of segment n (own or a foreign alias) of a shared tier.
func (e *Engine) noteAccess(n uint64) {
	s := e.share
	now := time.Now().UnixNano()
	if isForeign(n) {
		fs, ok := e.foreignSegment(n)
		if !ok {
			return
		}
		s.mu.Lock()
		s.accessed[foreignKey{fs.inst, fs.number}] = accessNote{fs.generation, now}
		s.mu.Unlock()
		return
	}
	if t := e.tierOf(n); t == nil || !t.cfg.Shared {
		return
	}
	s.mu.Lock()
	s.ownAccess[n] = now
	s.mu.Unlock()
}

type accessNote struct {
	generation uint64
	at         int64
}

// publishNotes returns the notes this instance's manifests carry: its reads of other instances'
// segments (the most recent maxAccessNotes) and, as lease holder, its retire requests.
func (e *Engine) publishNotesLocked() []format.ManifestNote {
	s := e.share
	notes := make([]format.ManifestNote, 0, len(s.accessed)+len(s.retireReqs))
	for k, a := range s.accessed {
		notes = append(notes, format.ManifestNote{Kind: format.NoteAccess, Owner: k.inst, Number: k.number, Generation: a.generation, Time: a.at})
	}
	if len(notes) > maxAccessNotes {
		slices.SortFunc(notes, func(a, b format.ManifestNote) int { return cmp.Compare(b.Time, a.Time) })
		for _, n := range notes[maxAccessNotes:] {
			delete(s.accessed, foreignKey{n.Owner, n.Number})
		}
		notes = notes[:maxAccessNotes]
	}
	for k, r := range s.retireReqs {
		notes = append(notes, format.ManifestNote{Kind: format.NoteRetire, Owner: k.inst, Number: k.number, Generation: r.generation, Time: r.at})
	}
	slices.SortFunc(notes, func(a, b format.ManifestNote) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), slices.Compare(a.Owner[:], b.Owner[:]), cmp.Compare(a.Number, b.Number))
	})
	return notes
}

// obeyRetireNotes retires this instance's segments that the lease holder's manifest m asks it to
// (generation must match: a reused number is another segment).
func (e *Engine) obeyRetireNotes(t *diskTier, m *format.Manifest) {
	for _, nt := range m.Notes {
		if nt.Kind != format.NoteRetire || nt.Owner != e.instance {
			continue
		}
		row, ok := e.ix.Segment(nt.Number)
		if !ok || row.State != index.SegmentSealed || row.Generation != nt.Generation || e.tierOf(nt.Number) != t {
			continue
		}
		if err := e.evictSegment(t, nt.Number); err != nil {
			e.opts.Logger.Warn("ucm: could not retire a segment the shared tier's reclaimer asked for", "segment", nt.Number, "err", err)
			continue
		}
		e.share.retiredOnRequest.Add(1)
	}
}

// evictSegment evicts every live block of sealed segment n of tier t (demoted to the next tier
// when there is one, else dropped) and retires the segment.
func (e *Engine) evictSegment(t *diskTier, n uint64) error {
	e.reclaimMu.Lock()
	defer e.reclaimMu.Unlock()
	ids, _, err := e.liveRecords(n)
	if err != nil {
		return err
	}
	lru := t.recency()
	if lru == nil {
		lru = tiers.NewLRU()
	}
	var rep ReclaimReport
	if err := e.evict(t, lru, ids, &rep); err != nil {
		return err
	}
	if row, ok := e.ix.Segment(n); ok && row.LiveRecords == 0 && row.State == index.SegmentSealed {
		return e.retire(n)
	}
	return nil
}

// sharedSegment is one published segment of a shared tier, as the reclaimer ranks them.
type sharedSegment struct {
	owner      format.InstanceID
	number     uint64
	generation uint64
	size       int64
	last       int64 // last access (or publication)
}

// reclaimSharedTier runs the lease holder's pass over shared tier t: when the published bytes
// of every instance are above the high watermark, the least recently used segments are
// retired until they would be at the low watermark. It holds or renews the lease first, and
// does nothing without it. others are the other instances' manifests just read.
func (e *Engine) reclaimSharedTier(t *diskTier, others []*format.Manifest) {
	s := e.share
	if t.cfg.Capacity <= 0 || len(t.cfg.Paths) == 0 {
		return
	}
	l := &tiers.Leaser{FS: e.fs, Root: t.cfg.Paths[0], Self: e.instance,
		Duration: 10 * e.opts.SharedRefreshInterval, Skew: max(5*e.opts.SharedRefreshInterval, 2*time.Second)}
	held, _, err := l.Hold(time.Now())
	if err != nil {
		e.opts.Logger.Warn("ucm: reclaimer lease", "path", t.cfg.Paths[0], "err", err)
		return
	}
	s.mu.Lock()
	if !held {
		clear(s.retireReqs)
	}
	s.mu.Unlock()
	s.leaseHeld.Store(held)
	if !held {
		return
	}
	manifests := append([]*format.Manifest{e.ownManifestFor(t)}, others...)
	// Last access per segment: the owner's publication and reads, every instance's notes.
	last := map[foreignKey]int64{}
	var segs []sharedSegment
	var used int64
	for _, m := range manifests {
		for _, ent := range m.Segments {
			k := foreignKey{m.Instance, ent.Number}
			last[k] = max(last[k], ent.Sealed, ent.Accessed)
			segs = append(segs, sharedSegment{owner: m.Instance, number: ent.Number, generation: ent.Generation, size: ent.Size})
			used += ent.Size
		}
	}
	for _, m := range manifests {
		for _, nt := range m.Notes {
			if k := (foreignKey{nt.Owner, nt.Number}); nt.Kind == format.NoteAccess {
				if _, listed := last[k]; listed {
					last[k] = max(last[k], nt.Time)
				}
			}
		}
	}
	s.sharedUsed.Store(used)
	high := int64(float64(t.cfg.Capacity) * t.cfg.HighWatermark)
	low := int64(float64(t.cfg.Capacity) * t.cfg.LowWatermark)
	if used <= high {
		s.mu.Lock()
		clear(s.retireReqs)
		s.mu.Unlock()
		return
	}
	for i := range segs {
		segs[i].last = last[foreignKey{segs[i].owner, segs[i].number}]
	}
	slices.SortFunc(segs, func(a, b sharedSegment) int {
		return cmp.Or(cmp.Compare(a.last, b.last), cmp.Compare(a.number, b.number))
	})
	now := time.Now().UnixNano()
	reqs := map[foreignKey]accessNote{}
	for _, sg := range segs {
		if used <= low {
			break
		}
		used -= sg.size
		if sg.owner == e.instance {
			if err := e.evictSegment(t, sg.number); err != nil && !errors.Is(err, ErrClosed) {
				e.opts.Logger.Warn("ucm: shared reclaimer could not retire its own segment", "segment", sg.number, "err", err)
			}
			continue
		}
		reqs[foreignKey{sg.owner, sg.number}] = accessNote{sg.generation, now}
	}
	s.mu.Lock()
	s.retireReqs = reqs
	s.mu.Unlock()
	s.reclaimRounds.Add(1)
	e.kickSharing()
}

// ownManifestFor is this instance's published segments of tier t, as the reclaimer counts them.
func (e *Engine) ownManifestFor(t *diskTier) *format.Manifest {
	m := &format.Manifest{Instance: e.instance}
	dirs := map[string]bool{}
	for _, d := range t.dirs {
		dirs[d] = true
	}
	for _, row := range e.ix.Segments() {
		if h, ok := e.home(row.Number); row.State == index.SegmentSealed && ok && dirs[h.dir] {
			m.Segments = append(m.Segments, format.ManifestEntry{Number: row.Number, Generation: row.Generation, Size: row.Size})
		}
	}
	e.share.mu.Lock() // after home: segMu is never taken under share.mu
	defer e.share.mu.Unlock()
	for i := range m.Segments {
		m.Segments[i].Sealed, m.Segments[i].Accessed = e.share.firstAt[m.Segments[i].Number], e.share.ownAccess[m.Segments[i].Number]
	}
	return m
}
