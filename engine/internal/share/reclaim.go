package share

import (
	"cmp"
	"errors"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/ucm-go/ucm/engine/internal/base"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
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
//
// An owner that is gone cannot obey. Liveness is observed, not claimed: every running instance
// rewrites its manifest at least every quarter of SharedOwnerTimeout (a heartbeat), and an
// instance whose newest manifest the holder has seen unchanged for SharedOwnerTimeout, by the
// holder's own clock (no clocks of two hosts are compared), is presumed gone. Its victims the
// holder takes out of the owner's manifest itself, with a NoteReclaimed note each, and unlinks
// their files a grace period (plus the clock skew margin) after the note, if the owner is still
// gone and the file still carries the generation reclaimed. An owner that returns, or that was
// only presumed gone, finds its manifest rewritten at its next refresh, retires the noted
// segments and republishes. Every step leaves readers with hits or misses, never wrong bytes:
// a vanished segment is a miss.

// maxAccessNotes bounds the access notes one manifest carries (the most recent ones).
const maxAccessNotes = 1 << 16

// NoteAccess records a successful read of segment n (own or a foreign alias) of a shared tier.
func (s *Sharing) NoteAccess(n uint64) {
	now := time.Now().UnixNano()
	if IsForeign(n) {
		fs, ok := s.foreignSegment(n)
		if !ok {
			return
		}
		s.mu.Lock()
		s.accessed[foreignKey{fs.inst, fs.number}] = accessNote{fs.generation, now}
		s.mu.Unlock()
		return
	}
	if t := s.env.TierOf(n); t == nil || !t.Shared() {
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
func (s *Sharing) publishNotesLocked() []format.ManifestNote {
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

// obeyNotes retires this instance's segments of tier t that notes of kind in manifest m name:
// NoteRetire in the lease holder's (asked to), NoteReclaimed in its own (taken by a reclaimer
// while it was presumed gone). The generation must match: a reused number is another segment.
// done counts the segments retired.
func (s *Sharing) obeyNotes(t tiers.Disk, m *format.Manifest, kind format.NoteKind, done *atomic.Int64) {
	for _, nt := range m.Notes {
		if nt.Kind != kind || nt.Owner != s.env.Instance() {
			continue
		}
		row, ok := s.env.OwnSegment(nt.Number)
		if !ok || row.State != index.SegmentSealed || row.Generation != nt.Generation || s.env.TierOf(nt.Number) != t {
			continue
		}
		if err := s.env.EvictSegment(t, nt.Number); err != nil {
			s.cfg.Logger.Warn("ucm: could not retire a segment of the shared tier another instance's notes name", "segment", nt.Number, "note", kind, "err", err)
			continue
		}
		done.Add(1)
	}
}

// sharedSegment is one published segment of a shared tier, as the reclaimer ranks them.
type sharedSegment struct {
	owner      format.InstanceID
	number     uint64
	generation uint64
	size       int64
	last       int64       // last access (or publication)
	ns         *nsManifest // the manifest listing it
}

// manifestSeen is the newest manifest sequence of a namespace this instance has seen, and since
// when (its own clock).
type manifestSeen struct {
	seq   uint64
	since time.Time
}

// observe notes the sequence of a namespace's newest manifest, for the liveness of its owner.
func (s *Sharing) observe(m nsManifest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seen, ok := s.seen[m.dir]; !ok || seen.seq != m.Sequence {
		s.seen[m.dir] = manifestSeen{seq: m.Sequence, since: time.Now()}
	}
}

// OwnerGone reports whether the owner of namespace dir is presumed gone: its manifest has not
// changed for SharedOwnerTimeout.
func (s *Sharing) OwnerGone(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen, ok := s.seen[dir]
	return ok && time.Since(seen.since) >= s.cfg.OwnerTimeout
}

// sharedSkew is the difference between hosts' clocks the shared tier tolerates (the lease's
// takeover margin; the reclaimed segments' unlink waits for it too).
func (s *Sharing) sharedSkew() time.Duration {
	return max(5*s.cfg.RefreshInterval, 2*time.Second)
}

// reclaimSharedTier runs the lease holder's pass over shared tier t: when the published bytes
// of every instance are above the high watermark, the least recently used segments are
// retired until they would be at the low watermark. It holds or renews the lease first, and
// does nothing without it. others are the other instances' manifests just read.
func (s *Sharing) reclaimSharedTier(t tiers.Disk, others []nsManifest) {
	if t.Config().Capacity <= 0 || len(t.Config().Paths) == 0 {
		return
	}
	if accountOf(t) != nil {
		accountOf(t).Settle(manifestsOf(others))
	}
	l := &tiers.Leaser{FS: s.cfg.FS, Root: t.Config().Paths[0], Self: s.env.Instance(),
		Duration: 10 * s.cfg.RefreshInterval, Skew: s.sharedSkew(), LockHeld: s.cfg.LockHeld}
	held, _, err := l.Hold(time.Now())
	if err != nil {
		s.cfg.Logger.Warn("ucm: reclaimer lease", "path", t.Config().Paths[0], "err", err)
		return
	}
	s.mu.Lock()
	if !held {
		clear(s.retireReqs)
	}
	s.mu.Unlock()
	s.leaseHeld.Store(held)
	if !held {
		if accountOf(t) != nil {
			accountOf(t).LeaseLost()
		}
		return
	}
	s.unlinkReclaimed(t, others)
	manifests := append([]nsManifest{{Manifest: s.ownManifestFor(t)}}, others...)
	// Last access per segment: the owner's publication and reads, every instance's notes.
	last := map[foreignKey]int64{}
	var segs []sharedSegment
	var used int64
	for i := range manifests {
		m := &manifests[i]
		for _, ent := range m.Segments {
			k := foreignKey{m.Instance, ent.Number}
			last[k] = max(last[k], ent.Sealed, ent.Accessed)
			segs = append(segs, sharedSegment{owner: m.Instance, number: ent.Number, generation: ent.Generation, size: ent.Size, ns: m})
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
	// Admission first: the free bytes go to the instances that ask for room. What cannot be
	// granted is made room for by retiring segments, like bytes above the high watermark: down
	// to where, once the retired files' grace is over, the instances' counts leave room for it.
	var unsatisfied, beyond int64
	if accountOf(t) != nil {
		unsatisfied, beyond = accountOf(t).Grant(manifestsOf(manifests))
	}
	high := int64(float64(t.Config().Capacity) * t.Config().HighWatermark)
	low := int64(float64(t.Config().Capacity) * t.Config().LowWatermark)
	if unsatisfied > 0 {
		low = min(low, t.Config().Capacity-unsatisfied-beyond)
	}
	if used <= high && (unsatisfied == 0 || used <= low) {
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
	ofGone := map[*nsManifest][]format.ManifestEntry{}
	reclaimed := map[*nsManifest]int64{}
	for _, sg := range segs {
		if used <= low {
			break
		}
		used -= sg.size
		if sg.owner == s.env.Instance() {
			if err := s.env.EvictSegment(t, sg.number); err != nil && !errors.Is(err, base.ErrClosed) {
				s.cfg.Logger.Warn("ucm: shared reclaimer could not retire its own segment", "segment", sg.number, "err", err)
			}
			continue
		}
		if s.OwnerGone(sg.ns.dir) {
			ofGone[sg.ns] = append(ofGone[sg.ns], format.ManifestEntry{Number: sg.number, Generation: sg.generation})
			reclaimed[sg.ns] += sg.size
			continue
		}
		reqs[foreignKey{sg.owner, sg.number}] = accessNote{sg.generation, now}
	}
	for ns, victims := range ofGone {
		s.reclaimFromGone(t, ns, victims, reclaimed[ns])
	}
	s.mu.Lock()
	s.retireReqs = reqs
	s.mu.Unlock()
	s.reclaimRounds.Add(1)
	s.Kick()
}

// adoptRecency takes the recency of this instance's segments from its manifest m (its own, as
// read at Open, or as a reclaimer rewrote it): when each was first published and last read. A
// restarted instance would otherwise publish every segment it kept as first published now,
// and the reclaimer would rank its oldest data as the tier's newest. Only segments this
// instance still holds with the generation m lists are adopted; a time never moves later
// (first publication) or earlier (last read).
func (s *Sharing) adoptRecency(m *format.Manifest) {
	gens := map[uint64]uint64{}
	for _, row := range s.env.OwnSegments() {
		gens[row.Number] = row.Generation
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ent := range m.Segments {
		if gen, ok := gens[ent.Number]; !ok || gen != ent.Generation || ent.Sealed <= 0 {
			continue
		}
		if at, ok := s.firstAt[ent.Number]; !ok || ent.Sealed < at {
			s.firstAt[ent.Number] = ent.Sealed
		}
		if ent.Accessed > s.ownAccess[ent.Number] {
			s.ownAccess[ent.Number] = ent.Accessed
		}
	}
}

// ownManifestFor is this instance's published segments of tier t, as the reclaimer counts them,
// with its reads of other instances' segments as access notes: the holder's own reads rank
// segments as much as any other instance's (they would otherwise reach the pass only through
// its published manifest, which the pass does not read).
func (s *Sharing) ownManifestFor(t tiers.Disk) *format.Manifest {
	m := &format.Manifest{Instance: s.env.Instance()}
	dirs := map[string]bool{}
	for _, d := range t.Dirs() {
		dirs[d] = true
	}
	for _, row := range s.env.OwnSegments() {
		if h, ok := s.env.Home(row.Number); row.State == index.SegmentSealed && ok && dirs[h.Dir] {
			m.Segments = append(m.Segments, format.ManifestEntry{Number: row.Number, Generation: row.Generation, Size: row.Size})
		}
	}
	s.mu.Lock() // after Home: the segments' lock is never taken under s.mu
	defer s.mu.Unlock()
	now := time.Now().UnixNano()
	for i := range m.Segments {
		sealed, published := s.firstAt[m.Segments[i].Number]
		if !published {
			sealed = now // sealed since the last publication: the newest there is
		}
		m.Segments[i].Sealed, m.Segments[i].Accessed = sealed, s.ownAccess[m.Segments[i].Number]
	}
	for k, a := range s.accessed {
		m.Notes = append(m.Notes, format.ManifestNote{Kind: format.NoteAccess, Owner: k.inst, Number: k.number, Generation: a.generation, Time: a.at})
	}
	return m
}

// reclaimFromGone takes victims out of the manifest of ns, whose owner is presumed gone: the
// manifest is rewritten without them and with a NoteReclaimed note each (the owner's notes of
// other kinds are stale and dropped), so other instances stop using them at their next refresh
// and the owner retires them when it returns. Their files are unlinked later
// (unlinkReclaimed). The owner's share of the capacity is taken back with them
// (tiers.ShareAccount.CreditOfGone): the reclaimed bytes stay counted for it until the grants
// are redone.
func (s *Sharing) reclaimFromGone(t tiers.Disk, ns *nsManifest, victims []format.ManifestEntry, reclaimed int64) {
	drop := map[uint64]uint64{}
	for _, v := range victims {
		drop[v.Number] = v.Generation
	}
	now := time.Now().UnixNano()
	m := &format.Manifest{Instance: ns.Instance, Schema: ns.Schema, Sequence: max(ns.Sequence+1, uint64(now)), Written: now}
	for _, ent := range ns.Segments {
		if gen, ok := drop[ent.Number]; !ok || gen != ent.Generation {
			m.Segments = append(m.Segments, ent)
		}
	}
	for _, nt := range ns.Notes {
		if (nt.Kind == format.NoteReclaimed && nt.Owner == ns.Instance) || nt.Kind == format.NoteGrant {
			m.Notes = append(m.Notes, nt) // and the grants it issued as holder: they stay counted
		}
	}
	if accountOf(t) != nil {
		m.Notes = append(m.Notes, accountOf(t).CreditOfGone(ns.Manifest, m.Segments, reclaimed)...)
	}
	for _, v := range victims {
		m.Notes = append(m.Notes, format.ManifestNote{Kind: format.NoteReclaimed, Owner: ns.Instance, Number: v.Number, Generation: v.Generation, Time: now})
	}
	if len(m.Notes) > format.MaxManifestNotes {
		slices.SortFunc(m.Notes, func(a, b format.ManifestNote) int { return cmp.Compare(b.Time, a.Time) })
		m.Notes = m.Notes[:format.MaxManifestNotes] // the oldest were unlinked long ago
	}
	slices.SortFunc(m.Notes, func(a, b format.ManifestNote) int { return cmp.Compare(a.Number, b.Number) })
	if err := tiers.WriteManifest(s.cfg.FS, ns.dir, m); err != nil {
		s.cfg.Logger.Warn("ucm: shared reclaimer could not rewrite a gone instance's manifest", "dir", ns.dir, "err", err)
		return
	}
	s.mu.Lock()
	if seen, ok := s.seen[ns.dir]; ok {
		s.seen[ns.dir] = manifestSeen{seq: m.Sequence, since: seen.since} // our write is no sign of life
	}
	s.mu.Unlock()
	s.reclaimedOfGone.Add(int64(len(victims)))
	s.cfg.Logger.Info("ucm: shared reclaimer retired segments of an instance presumed gone",
		"dir", ns.dir, "segments", len(victims), "owner_timeout", s.cfg.OwnerTimeout)
}

// unlinkReclaimed deletes the files of segments reclaimed from gone owners (NoteReclaimed in
// their manifests) once the grace period and the clock skew margin have passed since the note,
// if the owner is still presumed gone and the file still carries the generation reclaimed.
// Any lease holder finishes what an earlier one started.
func (s *Sharing) unlinkReclaimed(t tiers.Disk, others []nsManifest) {
	due := time.Now().Add(-s.cfg.RetireGrace - s.sharedSkew()).UnixNano()
	for _, ns := range others {
		if !s.OwnerGone(ns.dir) {
			continue
		}
		segDir := filepath.Join(ns.dir, tiers.SegmentDir)
		for _, nt := range ns.Notes {
			k := foreignKey{ns.Instance, nt.Number}
			s.mu.Lock()
			done := s.unlinked[k]
			s.mu.Unlock()
			if nt.Kind != format.NoteReclaimed || nt.Owner != ns.Instance || nt.Time > due || done {
				continue
			}
			if _, listed := ns.Find(nt.Number); listed {
				continue // listed again: not ours to delete
			}
			seg, err := wal.OpenSegmentForRead(s.cfg.FS, segDir, nt.Number, nt.Generation, t.Direct(), t.Backend())
			var ce *wal.CorruptionError
			switch {
			case errors.Is(err, wal.ErrSegmentGone), errors.As(err, &ce):
				// Gone already, or another file (or damaged) under that name: leave it.
			case err != nil:
				s.cfg.Logger.Warn("ucm: shared reclaimer could not check a reclaimed segment", "dir", segDir, "segment", nt.Number, "err", err)
				continue
			default:
				path := seg.Path()
				seg.Release()
				if err := s.cfg.FS.Remove(path); err != nil && !oserror.IsNotExist(err) {
					s.cfg.Logger.Warn("ucm: shared reclaimer could not delete a reclaimed segment", "path", path, "err", err)
					continue
				}
				s.unlinkedOfGone.Add(1)
				// Its summary goes with it: nothing reads a summary of an unlisted segment.
				if err := s.cfg.FS.Remove(SummaryPath(ns.dir, nt.Number)); err != nil && !oserror.IsNotExist(err) {
					s.cfg.Logger.Warn("ucm: shared reclaimer could not delete a reclaimed segment's summary", "path", SummaryPath(ns.dir, nt.Number), "err", err)
				}
			}
			s.mu.Lock()
			s.unlinked[k] = true
			s.mu.Unlock()
		}
	}
}

// obeyReclaims reads this instance's newest manifest in each of its shared namespaces when it
// is not the one it last wrote (at Open, or after a reclaimer rewrote it, believing this
// instance gone), retires the segments its NoteReclaimed notes name, and has the manifest
// written again. One directory listing per namespace and interval.
func (s *Sharing) obeyReclaims() {
	if s == nil || s.cfg.ReadOnly {
		return
	}
	for _, t := range s.cfg.Tiers {
		if !t.Shared() {
			continue
		}
		for _, d := range t.Dirs() {
			nsDir := filepath.Dir(d)
			seq, ok, err := tiers.LatestManifest(s.cfg.FS, nsDir)
			if err != nil {
				s.cfg.Logger.Warn("ucm: could not list this instance's manifests", "dir", nsDir, "err", err)
				continue
			}
			s.mu.Lock()
			last, written := s.lastSeq[nsDir]
			s.mu.Unlock()
			if !ok || (written && seq == last) {
				continue
			}
			m, err := tiers.ReadManifest(s.cfg.FS, nsDir, s.env.Instance())
			if err != nil {
				s.cfg.Logger.Warn("ucm: could not read this instance's manifest", "dir", nsDir, "err", err)
				continue
			}
			s.obeyNotes(t, m, format.NoteReclaimed, &s.reclaimedWhileGone)
			if nsDir == filepath.Dir(t.Dirs()[0]) && accountOf(t) != nil {
				accountOf(t).AdoptCredit(m)
			}
			s.adoptRecency(m)
			s.mu.Lock()
			s.lastSeq[nsDir] = m.Sequence
			delete(s.lastPub, nsDir) // publish again, whatever changed
			s.mu.Unlock()
		}
	}
}
