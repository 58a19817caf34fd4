package tiers

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ucm-go/ucm/format"
)

// Admission on a shared tier (docs/tiers.md, "Shared tiers"). A shared tier's capacity is one
// account for every instance on it. Each instance may hold on the tier only the bytes the
// holder of the reclaimer lease has granted it, less what it gave back: its limit, which its
// Space enforces like a local tier's capacity (a dump's segment is admitted only if used ≤
// limit, a relocation only if used + reservation ≤ limit: Space.SetLimit). Its used counts
// every byte it has on the volume: sealed segments, active and prepared segments at their
// reservation, retired segments until their grace ends and their files are unlinked, and the
// namespace's other files.
//
// The account is kept in monotone counters, so that no stale read can make it unsafe:
//
//   - the holder grants instance j bytes by raising G_j, the cumulative bytes granted to it
//     (NoteGrant in the holder's manifest, kept there for as long as the holder runs);
//   - j sees G_j ≤ the G_j issued, and gives bytes back by raising R_j, the cumulative bytes
//     returned, first in its Space, then in its manifest (NoteCredit);
//   - so j's limit, G_j(seen) − R_j, is at most G_j(issued) − R_j(published), which the holder
//     counts for it (or j's published used less one reservation, if more: NoteSpace), and the
//     holder grants only from capacity minus what every instance is counted for;
//   - j asks for bytes beyond the G_j it has seen (NoteSpace's request, published with that
//     G_j in NoteCredit), and the holder grants only what G_j(issued) has not yet covered, so
//     a request is answered once and one left by an instance that stopped is not answered again.
//
// Hence the sum of the limits never exceeds the capacity, and the bytes on the volume never
// exceed capacity + one reservation per instance (the relocation rule).

// ShareEnv is what a ShareAccount needs from the engine that runs it. Its methods are called
// with the account's lock held, except the kicks, which are called after it is released; they
// must not call back into the account.
type ShareEnv interface {
	// Reservation returns the size of one segment's reservation on the tier: the most an
	// active segment may grow to.
	Reservation() int64
	// MetadataCharge returns what the files of this instance's namespace on the tier other
	// than segments take (manifests, publication logs, the lock, and what they may grow by
	// until the next refresh); ok is false when they cannot be listed now, and the charge
	// last counted stands.
	MetadataCharge() (charge int64, ok bool)
	// GraceBytes returns the bytes of this instance's retired segments on the tier whose
	// files wait for their grace to end.
	GraceBytes() int64
	// KickSharer asks for this instance's manifest to be published now rather than an
	// interval later: it carries a new request or a new grant.
	KickSharer()
	// KickReclaimer wakes the reclaimer: an eviction may wait for room just granted.
	KickReclaimer()
	// Now returns the current time, by which a new holder's wait before granting is measured.
	Now() time.Time
}

// ShareConfig says which account a ShareAccount keeps.
type ShareConfig struct {
	// Self is this instance.
	Self format.InstanceID
	// Capacity is the shared tier's capacity in bytes, one for every instance: positive.
	Capacity int64
	// Below says the tier is not the first: it receives only relocations (demotions), which
	// never wait and so never ask, and keeps two reservations of room granted ahead instead.
	Below bool
	// RefreshInterval is the interval of the sharing refresh; a new lease holder grants
	// nothing for two of them: positive.
	RefreshInterval time.Duration
}

// ShareAccount is one instance's admission account on one shared tier with a capacity: the
// bytes it has been granted, has given back, holds and asks for, and, while it holds the
// reclaimer lease, the grants it has issued to every instance. It sets its Space's limit to
// its share (granted − returned) and reaches the engine only through its ShareEnv. The
// manifests it reads are plain values: it does no I/O. It is safe for concurrent use.
//
// Guarantees, for every sequence of reads of the instances' manifests, stale or not:
//
//   - the grants issued never sum to more than the capacity less what every instance is
//     counted for (Grant);
//   - a request is answered once: the holder grants instance j at most seen + asked − issued,
//     whatever number of passes read j's request before j publishes again;
//   - a holder grants nothing until two refresh intervals after it took the lease;
//   - a manifest read stale, or not read in a pass, never lowers what an instance is
//     counted for below what it was last read at;
//   - an instance presumed gone has every byte granted to it counted as returned
//     (CreditOfGone), and adopts that credit if it returns (AdoptCredit).
type ShareAccount struct {
	cfg   ShareConfig
	space *Space
	env   ShareEnv

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

// NewShareAccount starts the account cfg names over space, resuming it from this instance's
// newest manifest own (nil: there is none): its credit, the grant it had seen and the grants
// it issued as holder. The space's limit is set to the share that gives (0 before a first
// grant). A capacity or refresh interval that is not positive, or a nil space or env, is
// refused with an error wrapping ErrInvalidConfig.
func NewShareAccount(cfg ShareConfig, space *Space, env ShareEnv, own *format.Manifest) (*ShareAccount, error) {
	switch {
	case cfg.Capacity <= 0:
		return nil, fmt.Errorf("%w: shared account: capacity %d: must be positive", ErrInvalidConfig, cfg.Capacity)
	case cfg.RefreshInterval <= 0:
		return nil, fmt.Errorf("%w: shared account: refresh interval %v: must be positive", ErrInvalidConfig, cfg.RefreshInterval)
	case space == nil || env == nil:
		return nil, fmt.Errorf("%w: shared account: needs a space and an environment", ErrInvalidConfig)
	}
	a := &ShareAccount{cfg: cfg, space: space, env: env,
		issued: map[format.InstanceID]int64{}, last: map[format.InstanceID]instanceShare{}}
	if own != nil {
		for _, nt := range own.Notes {
			switch {
			case nt.Kind == format.NoteCredit && nt.Owner == cfg.Self:
				a.returned, a.seen = max(a.returned, int64(nt.Number)), max(a.seen, int64(nt.Generation))
			case nt.Kind == format.NoteGrant:
				a.issued[nt.Owner] = max(a.issued[nt.Owner], int64(nt.Number))
			}
		}
		a.seen = max(a.seen, a.issued[cfg.Self])
	}
	space.SetLimit(max(0, a.seen-a.returned))
	return a, nil
}

// Settle brings this instance's limit up to the grants in the manifests just read (others),
// charges the namespace's other files to the space, gives back what it does not use (once that
// is more than one reservation) and notes what it asks for: room for the reservation a writer
// waits for, or, on a tier below the first, two reservations ahead of used. The dump writer
// asks for its next segment as soon as it starts one, so the request is a whole segment ahead
// of need. It kicks the reclaimer when the limit rose and the sharer when the request grew.
func (a *ShareAccount) Settle(others []*format.Manifest) {
	res := a.env.Reservation()
	var kickReclaimer, kickSharer bool
	a.mu.Lock()
	for _, m := range others {
		for _, nt := range m.Notes {
			if nt.Kind == format.NoteGrant && nt.Owner == a.cfg.Self {
				a.seen = max(a.seen, int64(nt.Number))
			}
		}
	}
	a.seen = max(a.seen, a.issued[a.cfg.Self])
	if charge, ok := a.env.MetadataCharge(); ok && charge != a.charged {
		a.space.Add(charge - a.charged)
		a.charged = charge
	}
	var headroom int64
	if a.cfg.Below {
		headroom = 2 * res
	}
	if prev, _ := a.space.Limit(); a.seen-a.returned > prev {
		kickReclaimer = true // an eviction may wait for this room to demote into
	}
	a.space.SetLimit(max(0, a.seen-a.returned))
	a.returned += a.space.ShrinkLimit(headroom, res)
	limit, _ := a.space.Limit()
	a.used, a.grace = a.space.Used(), a.env.GraceBytes()
	want := max(a.space.Demand(), a.used+headroom-limit, 0)
	kickSharer = want > a.want // publish the request now, not an interval later
	a.want = want
	a.mu.Unlock()
	if kickSharer {
		a.env.KickSharer()
	}
	if kickReclaimer {
		a.env.KickReclaimer()
	}
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

// Grant is the lease holder's admission pass, from the manifests of every instance on the
// tier (this instance's own may be among them: its account is taken from this one instead):
// it counts every instance, grants the free bytes to the instances that ask (the smallest
// shares first), and returns the bytes asked for that it could not grant and what the
// instances are counted for beyond their published and grace-held bytes (active segments,
// headroom), for the reclaimer's target. A new holder grants nothing for two refresh
// intervals: another instance taking the lease at the same moment may have granted meanwhile,
// and has by then seen the lease taken from it. The grants issued appear in Notes; a grant to
// this instance raises its limit at once.
func (a *ShareAccount) Grant(manifests []*format.Manifest) (unsatisfied, beyond int64) {
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
	res := a.env.Reservation()
	var kickSharer, kickReclaimer bool
	a.mu.Lock()
	defer func() {
		a.mu.Unlock()
		if kickSharer {
			a.env.KickSharer() // publish the grants now
		}
		if kickReclaimer {
			a.env.KickReclaimer() // an eviction may wait for this room to demote into
		}
	}()
	now := a.env.Now()
	if a.heldSince.IsZero() {
		a.heldSince = now
	}
	waiting := now.Sub(a.heldSince) < 2*a.cfg.RefreshInterval
	self := share(a.cfg.Self)
	self.account = true
	self.returned, self.used, self.grace, self.want, self.seen = a.returned, a.used, a.grace, a.want, a.seen
	self.issued = max(self.issued, a.seen)
	self.issued = max(self.issued, a.issued[a.cfg.Self])
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
	free := a.cfg.Capacity - counted
	slices.SortFunc(list, func(x, y *instanceShare) int {
		return cmp.Or(cmp.Compare(x.counted(res), y.counted(res)), slices.Compare(x.inst[:], y.inst[:]))
	})
	for _, j := range list {
		ask := j.outstanding()
		if ask <= 0 {
			continue
		}
		g := min(ask, max(free, 0))
		if waiting {
			g = 0
		}
		if g > 0 {
			a.issued[j.inst] += g
			free -= g
			kickSharer = true
		}
		unsatisfied += ask - g
	}
	for _, j := range list {
		l := *j
		l.issued = a.issued[j.inst]
		a.last[j.inst] = l
	}
	if granted := max(a.seen, a.issued[a.cfg.Self]); granted > a.seen {
		a.want = max(0, a.want-(granted-a.seen)) // the request stays relative to seen
		a.seen = granted
		a.space.SetLimit(max(0, a.seen-a.returned))
		kickReclaimer = true
	}
	return unsatisfied, beyond
}

// LeaseLost tells the account this instance does not hold the reclaimer lease (any more): if
// it takes the lease again, it waits two refresh intervals again before it grants.
func (a *ShareAccount) LeaseLost() {
	a.mu.Lock()
	a.heldSince = time.Time{}
	a.mu.Unlock()
}

// CreditOfGone returns the account notes a reclaimer writes into the manifest of gone, an
// instance presumed gone whose segments it reclaims: every byte granted to it counted as given
// back, so that the instance, if it returns, starts again from no limit (AdoptCredit), and its
// space as the bytes its manifest still lists (kept) plus those reclaimed and not yet
// unlinked (under grace, with the grace it had published). The grant counted as returned is
// recorded as issued, so the holder keeps counting it.
func (a *ShareAccount) CreditOfGone(gone *format.Manifest, kept []format.ManifestEntry, reclaimed int64) []format.ManifestNote {
	var seen, grace int64
	for _, nt := range gone.Notes {
		switch {
		case nt.Kind == format.NoteCredit && nt.Owner == gone.Instance:
			seen = max(seen, int64(nt.Generation), int64(nt.Number))
		case nt.Kind == format.NoteSpace && nt.Owner == gone.Instance:
			grace = int64(nt.Generation)
		}
	}
	a.mu.Lock()
	issued := max(seen, a.issued[gone.Instance])
	a.issued[gone.Instance] = issued
	a.mu.Unlock()
	var listed int64
	for _, ent := range kept {
		listed += ent.Size
	}
	grace += reclaimed
	return []format.ManifestNote{
		{Kind: format.NoteCredit, Owner: gone.Instance, Number: uint64(issued), Generation: uint64(issued)},
		{Kind: format.NoteSpace, Owner: gone.Instance, Number: uint64(listed + grace), Generation: uint64(grace)},
	}
}

// AdoptCredit takes the credit a reclaimer wrote into this instance's manifest own while it
// was presumed gone (CreditOfGone): its limit falls to what it is granted anew.
func (a *ShareAccount) AdoptCredit(own *format.Manifest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, nt := range own.Notes {
		if nt.Kind == format.NoteCredit && nt.Owner == a.cfg.Self {
			a.returned, a.seen = max(a.returned, int64(nt.Number)), max(a.seen, int64(nt.Generation))
		}
	}
	a.space.SetLimit(max(0, a.seen-a.returned))
}

// Notes returns the notes this instance's manifest carries for the account, sorted by kind and
// owner: its credit (NoteCredit: returned, and the grant seen), its space (NoteSpace: used,
// under grace, asked for) and the grants it issued as lease holder (NoteGrant, one per
// instance). A new account opened from a manifest with these notes resumes this one.
func (a *ShareAccount) Notes() []format.ManifestNote {
	a.mu.Lock()
	notes := make([]format.ManifestNote, 0, 2+len(a.issued))
	notes = append(notes,
		format.ManifestNote{Kind: format.NoteCredit, Owner: a.cfg.Self, Number: uint64(a.returned), Generation: uint64(a.seen)},
		format.ManifestNote{Kind: format.NoteSpace, Owner: a.cfg.Self, Number: uint64(a.used), Generation: uint64(a.grace), Time: a.want})
	for inst, g := range a.issued {
		notes = append(notes, format.ManifestNote{Kind: format.NoteGrant, Owner: inst, Number: uint64(g)})
	}
	a.mu.Unlock()
	slices.SortFunc(notes, func(x, y format.ManifestNote) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), slices.Compare(x.Owner[:], y.Owner[:]))
	})
	return notes
}

// Stats returns this instance's share (its limit), the bytes it holds on the tier and the
// bytes it asks for, as last settled.
func (a *ShareAccount) Stats() (share, held, asked int64) {
	share, _ = a.space.Limit()
	held = a.space.Used()
	a.mu.Lock()
	asked = a.want
	a.mu.Unlock()
	return share, held, asked
}

// Issued returns the bytes this instance, as lease holder, has granted inst in total.
func (a *ShareAccount) Issued(inst format.InstanceID) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.issued[inst]
}

// String describes the account: the limit, used bytes, the grant seen, the bytes returned and
// asked for, and the grants issued, for a log or a failure message.
func (a *ShareAccount) String() string {
	limit, _ := a.space.Limit()
	used := a.space.Used()
	a.mu.Lock()
	defer a.mu.Unlock()
	insts := make([]format.InstanceID, 0, len(a.issued))
	for inst := range a.issued {
		insts = append(insts, inst)
	}
	slices.SortFunc(insts, func(x, y format.InstanceID) int { return slices.Compare(x[:], y[:]) })
	var b strings.Builder
	fmt.Fprintf(&b, "limit %d used %d granted %d returned %d asks %d issued [", limit, used, a.seen, a.returned, a.want)
	for i, inst := range insts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%x:%d", inst[:4], a.issued[inst])
	}
	b.WriteByte(']')
	return b.String()
}
