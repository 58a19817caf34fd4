package tiers

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/testwait"
)

// fakeShareEnv is a ShareAccount's environment without an engine: a fixed reservation, a
// metadata charge and grace bytes the test sets, kicks counted, and a clock the test moves.
type fakeShareEnv struct {
	res                       int64
	charge                    int64
	chargeOK                  bool
	grace                     int64
	now                       time.Time
	sharerKicks, reclaimKicks int
}

func (f *fakeShareEnv) Reservation() int64            { return f.res }
func (f *fakeShareEnv) MetadataCharge() (int64, bool) { return f.charge, f.chargeOK }
func (f *fakeShareEnv) GraceBytes() int64             { return f.grace }
func (f *fakeShareEnv) KickSharer()                   { f.sharerKicks++ }
func (f *fakeShareEnv) KickReclaimer()                { f.reclaimKicks++ }
func (f *fakeShareEnv) Now() time.Time                { return f.now }
func (f *fakeShareEnv) advance(d time.Duration)       { f.now = f.now.Add(d) }

const (
	testRes      = 100
	testInterval = time.Second
)

func shareInst(b byte) format.InstanceID { return format.InstanceID{b} }

func creditNote(owner format.InstanceID, returned, seen int64) format.ManifestNote {
	return format.ManifestNote{Kind: format.NoteCredit, Owner: owner, Number: uint64(returned), Generation: uint64(seen)}
}

func spaceNote(owner format.InstanceID, used, grace, want int64) format.ManifestNote {
	return format.ManifestNote{Kind: format.NoteSpace, Owner: owner, Number: uint64(used), Generation: uint64(grace), Time: want}
}

func grantNote(owner format.InstanceID, granted int64) format.ManifestNote {
	return format.ManifestNote{Kind: format.NoteGrant, Owner: owner, Number: uint64(granted)}
}

// shareManifest is instance inst's manifest listing one segment per size, with notes.
func shareManifest(inst format.InstanceID, sizes []int64, notes ...format.ManifestNote) *format.Manifest {
	m := &format.Manifest{Instance: inst, Notes: notes}
	for i, sz := range sizes {
		m.Segments = append(m.Segments, format.ManifestEntry{Number: uint64(i + 1), Size: sz})
	}
	return m
}

// asker is an instance keeping an account that holds used bytes (all published) and asks for
// want beyond the grant seen, having given back returned.
func asker(inst format.InstanceID, returned, seen, used, want int64) *format.Manifest {
	var sizes []int64
	if used > 0 {
		sizes = []int64{used}
	}
	return shareManifest(inst, sizes, creditNote(inst, returned, seen), spaceNote(inst, used, 0, want))
}

// newTestAccount opens instance 1's account on a tier of the given capacity, with no manifest.
func newTestAccount(t *testing.T, capacity int64, below bool) (*ShareAccount, *Space, *fakeShareEnv) {
	t.Helper()
	env := &fakeShareEnv{res: testRes, now: time.Unix(1000, 0)}
	space := NewSpace(0, 0.95, 0.85)
	a, err := NewShareAccount(ShareConfig{Self: shareInst(1), Capacity: capacity, Below: below, RefreshInterval: testInterval}, space, env, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a, space, env
}

// holding makes a the lease holder past its wait before granting.
func holding(a *ShareAccount, env *fakeShareEnv) {
	a.Grant(nil)
	env.advance(2 * testInterval)
}

func TestShareAccountRefusesBadConfig(t *testing.T) {
	env := &fakeShareEnv{res: testRes}
	good := ShareConfig{Self: shareInst(1), Capacity: 1000, RefreshInterval: testInterval}
	for _, tc := range []struct {
		name  string
		cfg   func(ShareConfig) ShareConfig
		space *Space
		env   ShareEnv
	}{
		{"capacity 0", func(c ShareConfig) ShareConfig { c.Capacity = 0; return c }, NewSpace(0, 0.9, 0.8), env},
		{"negative capacity", func(c ShareConfig) ShareConfig { c.Capacity = -1; return c }, NewSpace(0, 0.9, 0.8), env},
		{"no refresh interval", func(c ShareConfig) ShareConfig { c.RefreshInterval = 0; return c }, NewSpace(0, 0.9, 0.8), env},
		{"no space", func(c ShareConfig) ShareConfig { return c }, nil, env},
		{"no environment", func(c ShareConfig) ShareConfig { return c }, NewSpace(0, 0.9, 0.8), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewShareAccount(tc.cfg(good), tc.space, tc.env, nil); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// An account resumes from its newest manifest: the share is the largest grant seen (in its
// credit, or issued to itself as holder) less what it gave back, and the grants it issued
// stay counted.
func TestShareAccountOpensFromManifest(t *testing.T) {
	self, other := shareInst(1), shareInst(2)
	for _, tc := range []struct {
		name        string
		own         *format.Manifest
		limit       int64
		issuedOther int64
	}{
		{"no manifest: no share before a grant", nil, 0, 0},
		{"credit", shareManifest(self, nil, creditNote(self, 100, 500)), 400, 0},
		{"a grant it issued itself is seen", shareManifest(self, nil, creditNote(self, 100, 500), grantNote(self, 700)), 600, 0},
		{"grants issued to others are kept", shareManifest(self, nil, creditNote(self, 0, 300), grantNote(other, 900)), 300, 900},
		{"another's credit is not this instance's", shareManifest(self, nil, creditNote(other, 0, 800)), 0, 0},
		{"never below zero", shareManifest(self, nil, creditNote(self, 900, 500)), 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			space := NewSpace(0, 0.95, 0.85)
			a, err := NewShareAccount(ShareConfig{Self: self, Capacity: 1000, RefreshInterval: testInterval}, space, &fakeShareEnv{res: testRes}, tc.own)
			if err != nil {
				t.Fatal(err)
			}
			if l, ok := space.Limit(); !ok || l != tc.limit {
				t.Fatalf("limit %d (set %v), want %d", l, ok, tc.limit)
			}
			if got := a.Issued(other); got != tc.issuedOther {
				t.Fatalf("issued to the other %d, want %d", got, tc.issuedOther)
			}
		})
	}
}

// A new holder grants nothing for two refresh intervals, and again after it lost the lease.
func TestShareAccountNewHolderWaits(t *testing.T) {
	a, _, env := newTestAccount(t, 1000, false)
	j := shareInst(2)
	ms := []*format.Manifest{asker(j, 0, 0, 0, 300)}
	if uns, _ := a.Grant(ms); uns != 300 || a.Issued(j) != 0 {
		t.Fatalf("just took the lease: unsatisfied %d, issued %d; want 300, 0", uns, a.Issued(j))
	}
	env.advance(2*testInterval - time.Nanosecond)
	if uns, _ := a.Grant(ms); uns != 300 || a.Issued(j) != 0 {
		t.Fatalf("just before two intervals: unsatisfied %d, issued %d; want 300, 0", uns, a.Issued(j))
	}
	env.advance(time.Nanosecond)
	if uns, _ := a.Grant(ms); uns != 0 || a.Issued(j) != 300 {
		t.Fatalf("after two intervals: unsatisfied %d, issued %d; want 0, 300", uns, a.Issued(j))
	}
	if env.sharerKicks == 0 {
		t.Fatal("a grant did not kick the sharer to publish it")
	}
	a.LeaseLost()
	ms = []*format.Manifest{asker(j, 0, 300, 0, 200)}
	if a.Grant(ms); a.Issued(j) != 300 {
		t.Fatalf("lease taken again: issued %d, want 300 (no grant yet)", a.Issued(j))
	}
	env.advance(2 * testInterval)
	if a.Grant(ms); a.Issued(j) != 500 {
		t.Fatalf("two intervals after taking the lease again: issued %d, want 500", a.Issued(j))
	}
}

// A request is answered once: seen + asked − issued, however many passes read it before its
// instance publishes again, and one an instance that stopped left behind is not answered
// again.
func TestShareAccountRequestAnsweredOnce(t *testing.T) {
	for _, tc := range []struct {
		name                string
		seen, want, passes  int64
		issuedBefore, after int64
	}{
		{"one pass", 0, 300, 1, 0, 300},
		{"many passes of one request", 0, 300, 10, 0, 300},
		{"issued since the grant seen counts against it", 200, 300, 5, 400, 500},
		{"issued already beyond it", 200, 100, 5, 400, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := shareInst(2)
			var own *format.Manifest
			if tc.issuedBefore > 0 {
				own = shareManifest(shareInst(1), nil, grantNote(j, tc.issuedBefore))
			}
			env := &fakeShareEnv{res: testRes, now: time.Unix(1000, 0)}
			a, err := NewShareAccount(ShareConfig{Self: shareInst(1), Capacity: 10000, RefreshInterval: testInterval}, NewSpace(0, 0.95, 0.85), env, own)
			if err != nil {
				t.Fatal(err)
			}
			holding(a, env)
			for range tc.passes {
				a.Grant([]*format.Manifest{asker(j, 0, tc.seen, 0, tc.want)})
			}
			if got := a.Issued(j); got != tc.after {
				t.Fatalf("issued %d after %d passes, want %d", got, tc.passes, tc.after)
			}
		})
	}
}

// The free bytes go to the smallest shares first, and what cannot be granted is reported.
func TestShareAccountSmallestFirst(t *testing.T) {
	a, _, env := newTestAccount(t, 1000, false)
	holding(a, env)
	small, big := shareInst(3), shareInst(2)
	ms := []*format.Manifest{asker(big, 0, 500, 0, 300), asker(small, 0, 200, 0, 300)}
	uns, _ := a.Grant(ms)
	if a.Issued(small) != 500 || a.Issued(big) != 500 || uns != 300 {
		t.Fatalf("issued small %d big %d, unsatisfied %d; want 500, 500, 300", a.Issued(small), a.Issued(big), uns)
	}
}

// The instances' counts beyond their published and grace-held bytes are reported for the
// reclaimer's target: a limit not yet filled, an instance's used beyond what it published.
func TestShareAccountBeyond(t *testing.T) {
	a, _, env := newTestAccount(t, 10000, false)
	holding(a, env)
	j, k, l := shareInst(2), shareInst(3), shareInst(4)
	ms := []*format.Manifest{
		shareManifest(j, []int64{300}, creditNote(j, 0, 1000), spaceNote(j, 300, 0, 0)), // 700 of its share unused
		shareManifest(k, []int64{200}, creditNote(k, 0, 0), spaceNote(k, 800, 100, 0)),  // 700 − 200 − 100 beyond
		shareManifest(l, []int64{400}), // no account: its bytes only
	}
	if _, beyond := a.Grant(ms); beyond != 700+400 {
		t.Fatalf("beyond %d, want %d", beyond, 700+400)
	}
}

// A manifest read stale never lowers an instance's returned count, and an instance not read in
// a pass is counted as it was last read, not as nothing (nor asks).
func TestShareAccountStaleReads(t *testing.T) {
	j, k := shareInst(2), shareInst(3)
	t.Run("stale credit", func(t *testing.T) {
		a, _, env := newTestAccount(t, 1000, false)
		holding(a, env)
		a.Grant([]*format.Manifest{asker(j, 400, 500, 100, 0)}) // j counted 500 − 400 = 100
		stale := asker(j, 0, 500, 100, 0)                       // before it gave 400 back
		a.Grant([]*format.Manifest{stale, asker(k, 0, 0, 0, 1000)})
		if got := a.Issued(k); got != 900 {
			t.Fatalf("granted %d to k beside a stale read of j, want 900", got)
		}
	})
	t.Run("not read", func(t *testing.T) {
		a, _, env := newTestAccount(t, 1000, false)
		holding(a, env)
		// j resumed with 800 bytes and no grant yet: counted for 800 − one reservation.
		a.Grant([]*format.Manifest{asker(j, 0, 0, 800, 500)})
		if got := a.Issued(j); got != 300 {
			t.Fatalf("granted j %d, want 300", got)
		}
		a.Grant([]*format.Manifest{asker(k, 0, 0, 0, 1000)}) // j's manifest not read
		if got := a.Issued(k); got != 300 {
			t.Fatalf("granted %d to k, want 300: j, not read, is still counted for the 700 it holds beyond one segment", got)
		}
		if got := a.Issued(j); got != 300 {
			t.Fatalf("j, not read, granted again: issued %d, want 300", got)
		}
	})
}

// Whatever the instances ask, give back, hold, and however stale or missing their manifests
// are in a pass, the shares issued never sum to more than the capacity: Σ (issued − returned)
// ≤ capacity, with the returned counts as they truly are.
func TestShareAccountGrantsNeverExceedCapacity(t *testing.T) {
	const capacity, n, passes = 2000, 5, 2000
	rng := rand.New(rand.NewPCG(7, 11))
	a, _, env := newTestAccount(t, capacity, false)
	holding(a, env)
	type inst struct {
		id                   format.InstanceID
		seen, returned, used int64
		history              []*format.Manifest
	}
	insts := make([]*inst, n)
	for i := range insts {
		insts[i] = &inst{id: shareInst(byte(i + 2))}
	}
	for p := range passes {
		var ms []*format.Manifest
		for _, j := range insts {
			if rng.IntN(3) == 0 {
				j.seen = a.Issued(j.id) // the holder's manifest read
			}
			limit := j.seen - j.returned
			j.used = rng.Int64N(limit + testRes + 1) // within the limit and one segment in flight
			if give := limit - j.used; give > 0 && rng.IntN(4) == 0 {
				j.returned += rng.Int64N(give + 1)
			}
			m := asker(j.id, j.returned, j.seen, j.used, rng.Int64N(4*testRes))
			j.history = append(j.history, m)
			switch r := rng.IntN(10); {
			case r == 0: // not read in this pass
			case r <= 2: // read stale
				ms = append(ms, j.history[rng.IntN(len(j.history))])
			default:
				ms = append(ms, m)
			}
		}
		a.Grant(ms)
		var sum int64
		for _, j := range insts {
			sum += a.Issued(j.id) - j.returned
		}
		if sum > capacity {
			t.Fatalf("pass %d: the shares issued sum to %d, over the capacity %d: %v", p, sum, capacity, a)
		}
	}
	var issued int64
	for _, j := range insts {
		issued += a.Issued(j.id)
	}
	if issued <= capacity {
		t.Fatalf("only %d bytes granted in %d passes: the test does not exercise giving back and granting again", issued, passes)
	}
}

// A grant to the holder itself raises its limit at once and counts against its request.
func TestShareAccountGrantsItself(t *testing.T) {
	a, space, env := newTestAccount(t, 1000, false)
	holding(a, env)
	space.Add(150)
	env.chargeOK = true
	a.Settle(nil) // used 150 against a limit of 0: asks 150
	if _, _, asked := a.Stats(); asked != 150 {
		t.Fatalf("asks %d, want 150", asked)
	}
	kicks := env.reclaimKicks
	a.Grant(nil)
	if l, _ := space.Limit(); l != 150 {
		t.Fatalf("limit %d after granting itself, want 150", l)
	}
	if share, held, asked := a.Stats(); share != 150 || held != 150 || asked != 0 {
		t.Fatalf("stats share %d held %d asked %d, want 150, 150, 0", share, held, asked)
	}
	if env.reclaimKicks == kicks {
		t.Fatal("room granted to itself did not kick the reclaimer")
	}
}

// Settle takes the grants the holder's manifest shows, charges the namespace's other files,
// gives back what is unused beyond one reservation and asks for what it lacks.
func TestShareAccountSettle(t *testing.T) {
	self, holder := shareInst(1), shareInst(9)
	t.Run("takes grants and gives back the unused", func(t *testing.T) {
		a, space, env := newTestAccount(t, 10000, false)
		space.Add(300)
		a.Settle([]*format.Manifest{shareManifest(holder, nil, grantNote(self, 350))})
		if l, _ := space.Limit(); l != 350 {
			t.Fatalf("limit %d, want 350 (unused 50 ≤ one reservation: kept)", l)
		}
		if env.reclaimKicks != 1 {
			t.Fatalf("%d reclaimer kicks after the limit rose, want 1", env.reclaimKicks)
		}
		a.Settle([]*format.Manifest{shareManifest(holder, nil, grantNote(self, 1000))})
		if l, _ := space.Limit(); l != 300 {
			t.Fatalf("limit %d, want 300 (unused 700 > one reservation: given back)", l)
		}
		want := []format.ManifestNote{creditNote(self, 700, 1000), spaceNote(self, 300, 0, 0)}
		if got := a.Notes(); !slices.Equal(got, want) {
			t.Fatalf("notes %v, want %v", got, want)
		}
		// A stale manifest of the holder never lowers the grant seen.
		a.Settle([]*format.Manifest{shareManifest(holder, nil, grantNote(self, 350))})
		if l, _ := space.Limit(); l != 300 {
			t.Fatalf("limit %d after a stale grant, want 300", l)
		}
	})
	t.Run("metadata charge and grace", func(t *testing.T) {
		a, space, env := newTestAccount(t, 10000, false)
		env.charge, env.chargeOK, env.grace = 70, true, 40
		a.Settle(nil)
		if space.Used() != 70 {
			t.Fatalf("used %d, want the charge 70", space.Used())
		}
		env.charge = 50
		a.Settle(nil)
		env.chargeOK, env.charge = false, 999 // not listed: the charge stands
		a.Settle(nil)
		if space.Used() != 50 {
			t.Fatalf("used %d, want the charge 50", space.Used())
		}
		if got := a.Notes()[1]; got != spaceNote(self, 50, 40, 50) {
			t.Fatalf("space note %v, want used 50, grace 40, asking 50", got)
		}
	})
	t.Run("a tier below the first keeps two reservations ahead", func(t *testing.T) {
		a, space, env := newTestAccount(t, 10000, true)
		space.Add(100)
		a.Settle([]*format.Manifest{shareManifest(holder, nil, grantNote(self, 150))})
		if _, _, asked := a.Stats(); asked != 100+2*testRes-150 {
			t.Fatalf("asks %d, want %d", asked, 100+2*testRes-150)
		}
		if env.sharerKicks != 1 {
			t.Fatalf("%d sharer kicks for a new request, want 1", env.sharerKicks)
		}
		a.Settle(nil)
		if env.sharerKicks != 1 {
			t.Fatalf("%d sharer kicks for the same request, want 1", env.sharerKicks)
		}
		a.Settle([]*format.Manifest{shareManifest(holder, nil, grantNote(self, 1000))})
		if l, _ := space.Limit(); l != 100+2*testRes {
			t.Fatalf("limit %d, want used + two reservations %d", l, 100+2*testRes)
		}
	})
	t.Run("a waiting writer asks", func(t *testing.T) {
		a, space, env := newTestAccount(t, 10000, false)
		space.Add(10) // above the limit of 0: a dump's segment waits
		stop := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := space.Reserve(testRes, false, time.Hour, stop, nil, nil)
			done <- err
		}()
		testwait.Until(t, "the writer waiting", func() bool { return space.Demand() > 0 })
		a.Settle(nil)
		if _, _, asked := a.Stats(); asked != 10+testRes {
			t.Fatalf("asks %d, want %d: the waiting reservation", asked, 10+testRes)
		}
		if env.sharerKicks != 1 {
			t.Fatalf("%d sharer kicks for a new request, want 1", env.sharerKicks)
		}
		close(stop)
		if err := <-done; err == nil {
			t.Fatal("the writer was admitted without a grant")
		}
	})
}

// The credit a reclaimer writes for a gone instance counts every byte granted to it as given
// back and its bytes as still held; the instance adopts it if it returns.
func TestShareAccountCreditOfGone(t *testing.T) {
	holderID, gone := shareInst(1), shareInst(2)
	own := shareManifest(holderID, nil, grantNote(gone, 700))
	env := &fakeShareEnv{res: testRes, now: time.Unix(1000, 0)}
	a, err := NewShareAccount(ShareConfig{Self: holderID, Capacity: 10000, RefreshInterval: testInterval}, NewSpace(0, 0.95, 0.85), env, own)
	if err != nil {
		t.Fatal(err)
	}
	m := shareManifest(gone, []int64{200, 300}, creditNote(gone, 100, 600), spaceNote(gone, 500, 50, 0))
	notes := a.CreditOfGone(m, m.Segments[:1], 300)
	want := []format.ManifestNote{creditNote(gone, 700, 700), spaceNote(gone, 200+50+300, 50+300, 0)}
	if !slices.Equal(notes, want) {
		t.Fatalf("credit of the gone instance %v, want %v", notes, want)
	}
	// The holder counts it for its bytes still there, less one reservation, not its old share.
	holding(a, env)
	rewritten := shareManifest(gone, []int64{200}, notes...)
	k := shareInst(3)
	a.Grant([]*format.Manifest{rewritten, asker(k, 0, 0, 0, 20000)})
	if got := a.Issued(k); got != 10000-(550-testRes) {
		t.Fatalf("granted %d beside the reclaimed instance, want %d", got, 10000-(550-testRes))
	}
	// The instance returns and adopts the credit: no share until granted anew.
	space := NewSpace(0, 0.95, 0.85)
	b, err := NewShareAccount(ShareConfig{Self: gone, Capacity: 10000, RefreshInterval: testInterval}, space, &fakeShareEnv{res: testRes}, m)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := space.Limit(); l != 500 {
		t.Fatalf("limit %d before adopting, want 500", l)
	}
	b.AdoptCredit(rewritten)
	if l, _ := space.Limit(); l != 0 {
		t.Fatalf("limit %d after adopting the credit, want 0", l)
	}
}

// Notes resume the account: an account opened from a manifest carrying them has the same
// share and the same grants issued.
func TestShareAccountNotesResume(t *testing.T) {
	a, space, env := newTestAccount(t, 1000, false)
	holding(a, env)
	space.Add(50)
	a.Settle(nil)
	j := shareInst(2)
	a.Grant([]*format.Manifest{asker(j, 0, 0, 0, 400)})
	notes := a.Notes()
	if !slices.IsSortedFunc(notes, func(x, y format.ManifestNote) int {
		if x.Kind != y.Kind {
			return int(x.Kind) - int(y.Kind)
		}
		return slices.Compare(x.Owner[:], y.Owner[:])
	}) {
		t.Fatalf("notes not sorted by kind and owner: %v", notes)
	}
	space2 := NewSpace(0, 0.95, 0.85)
	b, err := NewShareAccount(ShareConfig{Self: shareInst(1), Capacity: 1000, RefreshInterval: testInterval}, space2, env, shareManifest(shareInst(1), nil, notes...))
	if err != nil {
		t.Fatal(err)
	}
	l1, _ := space.Limit()
	l2, _ := space2.Limit()
	if l1 != 50 || l2 != l1 || b.Issued(j) != 400 || b.Issued(shareInst(1)) != 50 {
		t.Fatalf("resumed limit %d (was %d), issued j %d self %d; want 50, 400, 50", l2, l1, b.Issued(j), b.Issued(shareInst(1)))
	}
}
