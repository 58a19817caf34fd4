package index

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ucm-go/ucm/format"
)

// membership is the Index's in-memory membership of its entries (memberTable), built in the
// background after Open so that Open does not read every key: a store of 40 M blocks opens in
// the time its segment table takes, and answers lookups at once.
//
// Until the table is built, every question goes to Pebble (a point read per id, on one
// snapshot per call): slower, never wrong. The loader reads a snapshot taken at Open; the
// entries Apply changes after it are recorded in overlay (their state at the snapshot and now)
// and folded into the table when it is swapped in, under the lock, so the table equals the
// committed state from its first use. A loader that fails (a damaged key) leaves the table
// unbuilt: lookups keep reading Pebble, and CheckAccounting reports the failure.
type membership struct {
	sync.RWMutex
	tab     *memberTable               // nil until built
	overlay map[entryKey]overlayChange // changes since the loader's snapshot, until built
	err     error                      // the loader's failure
	ready   chan struct{}              // closed when the loader is done (built or failed)
	stop    chan struct{}              // closed by Close: the loader gives up
	wg      sync.WaitGroup
}

// overlayChange is an entry's presence at the loader's snapshot and after the latest Apply.
type overlayChange struct{ atSnapshot, now bool }

// loaderYield is how many keys the loader reads between looks at stop.
const loaderYield = 1 << 14

// beforeMembersSwap, if set (tests), runs in the loader once the table is read and before it is
// swapped in: a test holds the build open there to apply changes meanwhile.
var beforeMembersSwap func()

// startMembers starts building the membership table from a snapshot of the DB as it is now;
// Open calls it once nothing else can apply.
func (ix *Index) startMembers() {
	m := &ix.members
	m.overlay = map[entryKey]overlayChange{}
	m.ready, m.stop = make(chan struct{}), make(chan struct{})
	hint := 0
	ix.mu.RLock()
	for _, s := range ix.mu.segments {
		hint += int(s.LiveRecords - s.LiveSidecars)
	}
	ix.mu.RUnlock()
	snap := ix.db.NewSnapshot()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() { _ = snap.Close() }()
		tab, err := ix.buildMembers(snap, hint)
		if hook := beforeMembersSwap; hook != nil && err == nil {
			hook()
		}
		m.Lock()
		defer m.Unlock()
		defer close(m.ready)
		if err != nil {
			m.err = err
			if !errors.Is(err, ErrClosed) {
				ix.log.Error("index: the in-memory membership could not be built; lookups read the DB", "err", err)
			}
			return
		}
		for k, c := range m.overlay {
			if c.atSnapshot == c.now {
				continue
			}
			fp := fingerprint(k.id)
			switch {
			case k.side == 0 && c.now:
				tab.add(fp)
			case k.side == 0:
				tab.remove(fp)
			}
		}
		// Sidecar kinds after the blocks: a kind needs its block's slot.
		for k, c := range m.overlay {
			if k.side == 0 || c.atSnapshot == c.now {
				continue
			}
			if c.now {
				tab.setKind(fingerprint(k.id), k.side)
			} else {
				tab.clearKind(fingerprint(k.id), k.side)
			}
		}
		m.tab, m.overlay = tab, nil
	}()
}

// buildMembers reads every block and sidecar key of snap into a new table.
func (ix *Index) buildMembers(snap *pebble.Snapshot, hint int) (*memberTable, error) {
	tab := newMemberTable(hint)
	n := 0
	stopped := func() bool {
		if n++; n%loaderYield != 0 {
			return false
		}
		select {
		case <-ix.members.stop:
			return true
		default:
			return false
		}
	}
	var kerr error
	if err := scanKeys(snap, prefixBlock, func(k []byte) bool {
		if len(k) != blockKeySize {
			kerr = fmt.Errorf("%w: index: block key of %d bytes", format.ErrCorrupt, len(k))
			return false
		}
		tab.add(fingerprint(format.BlockID(k[1:])))
		return !stopped()
	}); err != nil {
		return nil, err
	}
	if kerr == nil {
		if err := scanKeys(snap, prefixSidecar, func(k []byte) bool {
			id, kind, err := parseSidecarKey(k)
			if err != nil {
				kerr = err
				return false
			}
			tab.setKind(fingerprint(id), kind)
			return !stopped()
		}); err != nil {
			return nil, err
		}
	}
	if kerr != nil {
		return nil, kerr
	}
	select {
	case <-ix.members.stop:
		return nil, ErrClosed
	default:
	}
	return tab, nil
}

// scanKeys calls fn with every key under prefix in snap (no values read) until fn returns false.
func scanKeys(snap *pebble.Snapshot, prefix byte, fn func(k []byte) bool) error {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		if !fn(it.Key()) {
			break
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// stopMembers stops the loader and waits for it (Close).
func (ix *Index) stopMembers() {
	if ix.members.stop == nil {
		return
	}
	close(ix.members.stop)
	ix.members.wg.Wait()
}

// WaitMembers waits until the in-memory membership is built (or its loader failed, which it
// returns): lookups answer from memory from then on. Lookups need not wait: until then they
// read the DB.
func (ix *Index) WaitMembers() error {
	<-ix.members.ready
	ix.members.RLock()
	defer ix.members.RUnlock()
	return ix.members.err
}

// MembersBytes returns the memory the in-memory membership holds (0 until it is built).
func (ix *Index) MembersBytes() int64 {
	ix.members.RLock()
	defer ix.members.RUnlock()
	if ix.members.tab == nil {
		return 0
	}
	return ix.members.tab.bytes()
}

// noteChange records, in the overlay of a membership still being built, that entry k went from
// present (before) to now; m is locked.
func (m *membership) noteChange(k entryKey, before, now bool) {
	c, seen := m.overlay[k]
	if !seen {
		c.atSnapshot = before
	}
	c.now = now
	m.overlay[k] = c
}

// hasMembers reports in hits (nil: not wanted) whether each id has a block entry, from the
// table once built, else from one snapshot of the DB, and returns how many leading ids have one
// (with prefix, it stops at the first that has not).
func (ix *Index) hasMembers(ids []format.BlockID, hits []bool, prefix bool) (int, error) {
	m := &ix.members
	m.RLock()
	if m.tab != nil {
		defer m.RUnlock()
		for i := range ids {
			ok := m.tab.has(fingerprint(ids[i]))
			if hits != nil {
				hits[i] = ok
			}
			if prefix && !ok {
				return i, nil
			}
		}
		return len(ids), nil
	}
	m.RUnlock()
	snap := ix.db.NewSnapshot()
	defer func() { _ = snap.Close() }()
	var kb [blockKeySize]byte
	for i := range ids {
		ok, err := exists(snap, blockKey(kb[:], ids[i]))
		if err != nil {
			return i, fmt.Errorf("index: lookup %s: %w", ids[i], err)
		}
		if hits != nil {
			hits[i] = ok
		}
		if prefix && !ok {
			return i, nil
		}
	}
	return len(ids), nil
}

// exists reports whether key has a value in r.
func exists(r pebble.Reader, key []byte) (bool, error) {
	_, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, closer.Close()
}

// sidecarKindsOf returns the kinds of id's sidecars (a superset once the table is built: see
// memberTable), from the table or, until it is built, from the DB.
func (ix *Index) sidecarKindsOf(id format.BlockID) uint64 {
	m := &ix.members
	m.RLock()
	if m.tab != nil {
		defer m.RUnlock()
		return m.tab.kindsOf(fingerprint(id))
	}
	m.RUnlock()
	var kinds uint64
	_ = iterateSidecarsOf(ix.db, id, func(kind format.SidecarKind) { kinds |= 1 << kind })
	return kinds
}

// iterateSidecarsOf calls fn with the kind of every sidecar entry of id in r.
func iterateSidecarsOf(r iterReader, id format.BlockID, fn func(kind format.SidecarKind)) error {
	var lo, hi [sidecarKeySize]byte
	it, err := r.NewIter(&pebble.IterOptions{
		LowerBound: sidecarKey(lo[:], id, 0),
		UpperBound: sidecarKey(hi[:], id, format.MaxSidecarKind+1),
	})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		if _, kind, err := parseSidecarKey(it.Key()); err == nil {
			fn(kind)
		}
	}
	return errors.Join(it.Error(), it.Close())
}
