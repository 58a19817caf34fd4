package engine

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// Admission on a shared tier (docs/tiers.md, "Shared tiers"). A shared tier's capacity is one
// account for every instance on it. Each instance may hold on the tier only the bytes the
// holder of the reclaimer lease has granted it, less what it gave back: its limit, which its
// tiers.Space enforces like a local tier's capacity (a dump's segment is admitted only if
// used + reservation ≤ limit, else the dump waits and fails with ErrNoSpace; a relocation only
// if used ≤ limit). Its used counts every byte it has on the volume: sealed segments, active
// and prepared segments at their reservation, and retired segments until their grace ends and
// their files are unlinked.
//
// The account is kept in monotone counters, so that no stale read can make it unsafe:
//
//   - the holder grants instance j bytes by raising G_j, the cumulative bytes granted to it
//     (NoteGrant in the holder's manifest, kept there for as long as the holder runs);
//   - j sees G_j ≤ the G_j issued, and gives bytes back by raising R_j, the cumulative bytes
//     returned, first in its Space, then in its manifest (NoteCredit);
//   - so j's limit, G_j(seen) − R_j, is at most G_j(issued) − R_j(published), which the holder
//     counts for it (or j's published used, if more: NoteSpace), and the holder grants only
//     from capacity minus what every instance is counted for;
//   - j asks for bytes beyond the G_j it has seen (NoteSpace's request, published with that
//     G_j in NoteCredit), and the holder grants only what G_j(issued) has not yet covered, so
//     a request is answered once and one left by an instance that stopped is not answered again.
//
// Hence the sum of the limits never exceeds the capacity, and the bytes on the volume never
// exceed capacity + one reservation per instance (the relocation rule).

// sharedAccount is this instance's admission account on one shared tier with a capacity.
type sharedAccount struct {
	nsDir string // the namespace (first path) whose manifest carries the account's notes

	mu       sync.Mutex
	seen     int64                       // the largest G granted to this instance seen
	returned int64                       // R: bytes given back in total
	used     int64                       // as last published
	grace    int64                       // of used, under grace, as last published
	want     int64                       // bytes asked for beyond seen, as last published
	charged  int64                       // the namespace's other files, as accounted in used
	issued   map[format.InstanceID]int64 // as (once) lease holder: G issued per instance
	// last is each instance's share as the holder last read it: an instance whose manifest
	// cannot be read in a pass (ESTALE through a network mount, a rename racing the read) is
	// counted as it was, never as nothing.
	last      map[format.InstanceID]instanceShare
	heldSince time.Time // since when this instance holds the lease (zero: it does not)
}

// openSharedAccount starts the account of shared tier t: admission bounded by the limit the
// account's notes in this instance's newest manifest give (none before its first grant). A
// lookup-only instance keeps one too: it writes nothing, but may hold the lease and grant.
func (e *Engine) openSharedAccount(t *diskTier) error {
	if !t.cfg.Shared || t.cfg.Capacity <= 0 || e.opts.ReadOnly || len(t.dirs) == 0 {
		return nil
	}
	a := &sharedAccount{nsDir: filepath.Dir(t.dirs[0]), issued: map[format.InstanceID]int64{}, last: map[format.InstanceID]instanceShare{}}
	m, err := tiers.ReadManifest(e.fs, a.nsDir, e.instance)
	switch {
	case errors.Is(err, tiers.ErrNoManifest):
	case err != nil:
		return fmt.Errorf("open tier %q: this instance's share of the capacity: %w", t.cfg.Name, err)
	default:
		for _, nt := range m.Notes {
			switch {
			case nt.Kind == format.NoteCredit && nt.Owner == e.instance:
				a.returned, a.seen = max(a.returned, int64(nt.Number)), max(a.seen, int64(nt.Generation))
			case nt.Kind == format.NoteGrant:
				a.issued[nt.Owner] = max(a.issued[nt.Owner], int64(nt.Number))
			}
		}
		a.seen = max(a.seen, a.issued[e.instance])
	}
	t.acct = a
	t.space.SetLimit(max(0, a.seen-a.returned))
	return nil
}

// settleSharedSpace brings this instance's limit on shared tier t up to the grants in the
// manifests just read (others), gives back what it does not use (once that is more than one
// reservation) and notes what it asks for: room for the reservation a writer waits for. The
// dump writer asks for its next segment as soon as it starts one, so the request is a whole
// segment ahead of need.
func (e *Engine) settleSharedSpace(t *diskTier, others []nsManifest) {
	a := t.acct
	if a == nil {
		return
	}
	res := e.reservation(t)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range others {
		for _, nt := range m.Notes {
			if nt.Kind == format.NoteGrant && nt.Owner == e.instance {
				a.seen = max(a.seen, int64(nt.Number))
			}
		}
	}
	a.seen = max(a.seen, a.issued[e.instance])
	if charge, ok := e.metadataCharge(a.nsDir); ok && charge != a.charged {
		t.space.Add(charge - a.charged)
		a.charged = charge
	}
	// A tier below the first receives only relocations (demotions), which never wait and so
	// never ask: it keeps two reservations of room ahead instead.
	var headroom int64
	if t.pos > 0 {
		headroom = 2 * res
	}
	if prev, _ := t.space.Limit(); a.seen-a.returned > prev {
		defer e.kickReclaimer() // an eviction may wait for this room to demote into (evict)
	}
	t.space.SetLimit(max(0, a.seen-a.returned))
	a.returned += t.space.ShrinkLimit(headroom, res)
	limit, _ := t.space.Limit()
	a.used, a.grace = t.space.Used(), e.graceBytes(t)
	want := max(t.space.Demand(), a.used+headroom-limit, 0)
	if want > a.want {
		defer e.kickSharing() // publish the request now, not an interval later
	}
	a.want = want
}

// metadataAhead is how far ahead of its size the namespace's other files are accounted: what a
// publication log may grow by until the next refresh.
const metadataAhead = 64 << 10

// metadataCharge is what the files of namespace nsDir other than segments take on the tier
// (the manifest, counted twice: a new one is written before the old is deleted; publication
// logs; the lock), plus metadataAhead: one listing.
func (e *Engine) metadataCharge(nsDir string) (int64, bool) {
	names, err := e.fs.List(nsDir)
	if err != nil {
		return 0, false
	}
	charge := int64(metadataAhead)
	for _, n := range names {
		if n == SegmentDir {
			continue
		}
		st, err := e.fs.Stat(filepath.Join(nsDir, n))
		if err != nil || st.IsDir() {
			continue
		}
		if strings.HasPrefix(n, tiers.ManifestPrefix) {
			charge += st.Size()
		}
		charge += st.Size()
	}
	return charge, true
}

// graceBytes sums this instance's retired segments of tier t waiting for their grace.
func (e *Engine) graceBytes(t *diskTier) int64 {
	s := e.share
	s.mu.Lock()
	ns := make([]uint64, 0, len(s.grace))
	for n := range s.grace {
		ns = append(ns, n)
	}
	s.mu.Unlock()
	var sum int64
	for _, n := range ns {
		if row, ok := e.ix.Segment(n); ok && e.tierOf(n) == t {
			sum += row.Size
		}
	}
	return sum
}

// spaceNotes returns the account notes the manifest of namespace dir carries: this instance's
// credit and space, and the grants it issued as lease holder.
func (e *Engine) spaceNotes(dir string) []format.ManifestNote {
	var notes []format.ManifestNote
	for _, t := range e.tiers {
		a := t.acct
		if a == nil || a.nsDir != dir {
			continue
		}
		a.mu.Lock()
		notes = append(notes,
			format.ManifestNote{Kind: format.NoteCredit, Owner: e.instance, Number: uint64(a.returned), Generation: uint64(a.seen)},
			format.ManifestNote{Kind: format.NoteSpace, Owner: e.instance, Number: uint64(a.used), Generation: uint64(a.grace), Time: a.want})
		for inst, g := range a.issued {
			notes = append(notes, format.ManifestNote{Kind: format.NoteGrant, Owner: inst, Number: uint64(g)})
		}
		a.mu.Unlock()
	}
	slices.SortFunc(notes, func(x, y format.ManifestNote) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), slices.Compare(x.Owner[:], y.Owner[:]))
	})
	return notes
}

// instanceShare is one instance's part of a shared tier's account as the holder counts it.
type instanceShare struct {
	inst              format.InstanceID
	issued, returned  int64
	used, grace, want int64
	seen              int64 // the grant it had seen when it asked for want
	published         int64 // bytes its manifest lists
	account           bool  // it keeps an account (else only its published bytes count)
}

// counted is what the holder counts instance j for: its limit, or what it holds beyond the one
// segment in flight its limit allows (res: a reservation), if more (after a restart, or an
// instance reclaimed while presumed gone).
func (j *instanceShare) counted(res int64) int64 {
	if !j.account {
		return j.published
	}
	return max(j.issued-j.returned, j.used-res)
}

// outstanding is what instance j's request still lacks: it asked for want bytes beyond the
// grant it had seen, and whatever was issued to it since counts against that. So a request is
// answered once, however many passes read it before j publishes again, and the request an
// instance that stopped left in its manifest is not granted over and over.
func (j *instanceShare) outstanding() int64 {
	if !j.account {
		return 0
	}
	return max(0, j.seen+j.want-j.issued)
}

// grantSharedSpace is the holder's admission pass over shared tier t, from the manifests of
// every instance (own first): it counts every instance, grants the free bytes to the instances
// that ask (the smallest shares first), and returns the bytes asked for that it could not
// grant and what the instances are counted for beyond their published and grace-held bytes
// (active segments, headroom), for the reclaimer's target. A new holder grants nothing for two
// refresh intervals: another instance taking the lease at the same moment may have granted
// meanwhile, and has by then seen the lease taken from it.
func (e *Engine) grantSharedSpace(t *diskTier, manifests []nsManifest) (unsatisfied, beyond int64) {
	a := t.acct
	if a == nil {
		return 0, 0
	}
	shares := map[format.InstanceID]*instanceShare{}
	share := func(inst format.InstanceID) *instanceShare {
		j := shares[inst]
		if j == nil {
			j = &instanceShare{inst: inst}
			shares[inst] = j
		}
		return j
	}
	for _, m := range manifests {
		j := share(m.Instance)
		for _, ent := range m.Segments {
			j.published += ent.Size
		}
		for _, nt := range m.Notes {
			switch {
			case nt.Kind == format.NoteGrant:
				g := share(nt.Owner)
				g.issued = max(g.issued, int64(nt.Number))
			case nt.Kind == format.NoteCredit && nt.Owner == m.Instance:
				j.account = true
				j.returned, j.seen = max(j.returned, int64(nt.Number)), max(j.seen, int64(nt.Generation))
				j.issued = max(j.issued, j.seen)
			case nt.Kind == format.NoteSpace && nt.Owner == m.Instance:
				j.account = true
				j.used, j.grace, j.want = int64(nt.Number), int64(nt.Generation), nt.Time
			}
		}
	}
	res := e.reservation(t)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.heldSince.IsZero() {
		a.heldSince = time.Now()
	}
	self := share(e.instance)
	self.account = true
	self.returned, self.used, self.grace, self.want, self.seen = a.returned, a.used, a.grace, a.want, a.seen
	self.issued = max(self.issued, a.seen)
	self.issued = max(self.issued, a.issued[e.instance])
	for inst, j := range a.last {
		if _, read := shares[inst]; !read {
			j.want = 0 // counted as last read; asks nothing until read again
			shares[inst] = &j
		}
	}
	for inst, g := range a.issued {
		if _, known := shares[inst]; !known {
			shares[inst] = &instanceShare{inst: inst, account: true, issued: g}
		}
	}
	var counted int64
	list := make([]*instanceShare, 0, len(shares))
	for _, j := range shares {
		j.issued = max(j.issued, a.issued[j.inst])
		a.issued[j.inst] = j.issued
		if l, ok := a.last[j.inst]; ok {
			j.returned = max(j.returned, l.returned) // a stale read never lowers it
		}
		counted += j.counted(res)
		beyond += max(0, j.counted(res)-j.published-j.grace)
		list = append(list, j)
	}
	free := t.cfg.Capacity - counted
	slices.SortFunc(list, func(x, y *instanceShare) int {
		return cmp.Or(cmp.Compare(x.counted(res), y.counted(res)), slices.Compare(x.inst[:], y.inst[:]))
	})
	for _, j := range list {
		ask := j.outstanding()
		if ask <= 0 {
			continue
		}
		g := min(ask, max(free, 0))
		if time.Since(a.heldSince) < 2*e.opts.SharedRefreshInterval {
			g = 0
		}
		if g > 0 {
			a.issued[j.inst] += g
			free -= g
			defer e.kickSharing() // publish the grant now
		}
		unsatisfied += ask - g
	}
	for _, j := range list {
		l := *j
		l.issued = a.issued[j.inst]
		a.last[j.inst] = l
	}
	if granted := max(a.seen, a.issued[e.instance]); granted > a.seen {
		a.want = max(0, a.want-(granted-a.seen)) // the request stays relative to seen
		a.seen = granted
		t.space.SetLimit(max(0, a.seen-a.returned))
		defer e.kickReclaimer() // an eviction may wait for this room to demote into (evict)
	}
	return unsatisfied, beyond
}

// creditOfGone is the account a reclaimer writes into the manifest of a gone owner whose
// segments it reclaims (reclaimFromGone): every byte granted to it counted as given back, so
// that the owner, if it returns, starts again from no limit (adoptCredit), and its space as
// the bytes still listed plus those reclaimed and not yet unlinked (under grace).
func (e *Engine) creditOfGone(t *diskTier, ns *nsManifest, kept []format.ManifestEntry, reclaimed int64) []format.ManifestNote {
	a := t.acct
	if a == nil {
		return nil
	}
	var seen, grace int64
	for _, nt := range ns.Notes {
		switch {
		case nt.Kind == format.NoteCredit && nt.Owner == ns.Instance:
			seen = max(seen, int64(nt.Generation), int64(nt.Number))
		case nt.Kind == format.NoteSpace && nt.Owner == ns.Instance:
			grace = int64(nt.Generation)
		}
	}
	a.mu.Lock()
	issued := max(seen, a.issued[ns.Instance])
	a.issued[ns.Instance] = issued
	a.mu.Unlock()
	var listed int64
	for _, ent := range kept {
		listed += ent.Size
	}
	grace += reclaimed
	return []format.ManifestNote{
		{Kind: format.NoteCredit, Owner: ns.Instance, Number: uint64(issued), Generation: uint64(issued)},
		{Kind: format.NoteSpace, Owner: ns.Instance, Number: uint64(listed + grace), Generation: uint64(grace)},
	}
}

// adoptCredit takes the credit a reclaimer wrote into this instance's manifest m of tier t
// while it was presumed gone: its limit falls to what it is granted anew.
func (e *Engine) adoptCredit(t *diskTier, m *format.Manifest) {
	a := t.acct
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, nt := range m.Notes {
		if nt.Kind == format.NoteCredit && nt.Owner == e.instance {
			a.returned, a.seen = max(a.returned, int64(nt.Number)), max(a.seen, int64(nt.Generation))
		}
	}
	t.space.SetLimit(max(0, a.seen-a.returned))
}

// shareStats sums this instance's shares, held bytes and requests over its shared tiers.
func (e *Engine) shareStats() (share, held, asked int64) {
	for _, t := range e.tiers {
		if t.acct == nil {
			continue
		}
		l, _ := t.space.Limit()
		share += l
		held += t.space.Used()
		t.acct.mu.Lock()
		asked += t.acct.want
		t.acct.mu.Unlock()
	}
	return share, held, asked
}
