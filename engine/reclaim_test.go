package engine

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine/internal/lifecycle"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// The reclaimer built without an Engine: a real index, fake tiers and a fake environment, for
// what the engine-level tests cannot reach cheaply (eviction deferred for a shared next tier,
// the order of a segment's retirement).

// fakeReclaimEnv is a reclaimEnv over a map of segment homes. No segment can be pinned: every
// acquire fails with acquireErr (wal.ErrSegmentGone when nil), so a relocation reads nothing.
type fakeReclaimEnv struct {
	ix         *index.Index
	homes      map[uint64]segHome
	acquireErr error
	passes     int64
	stop       chan struct{}
	events     []string // forget, retireShared, unlink, forgetHome, released, in call order
	uncached   []BlockID
}

func (f *fakeReclaimEnv) errAcquire(n uint64) error {
	if f.acquireErr != nil {
		return f.acquireErr
	}
	return fmt.Errorf("segment %d: %w", n, wal.ErrSegmentGone)
}

func (f *fakeReclaimEnv) tierOf(n uint64) tiers.Disk                    { return f.homes[n].tier }
func (f *fakeReclaimEnv) home(n uint64) (segHome, bool)                 { h, ok := f.homes[n]; return h, ok }
func (f *fakeReclaimEnv) acquireSegment(n uint64) (*wal.Segment, error) { return nil, f.errAcquire(n) }
func (f *fakeReclaimEnv) acquireInTier(n uint64) (*wal.Segment, tiers.Disk, error) {
	return nil, nil, f.errAcquire(n)
}
func (f *fakeReclaimEnv) acquireFollowing(_ BlockID, _ format.SidecarKind, loc index.Location) (*wal.Segment, index.Location, tiers.Disk, error) {
	return nil, loc, nil, f.errAcquire(loc.Segment)
}
func (f *fakeReclaimEnv) forgetSegment(n uint64) (*wal.Segment, segHome) {
	f.event("forget", n)
	return nil, f.homes[n]
}
func (f *fakeReclaimEnv) forgetHome(n uint64) {
	f.event("forgetHome", n)
	delete(f.homes, n)
}
func (f *fakeReclaimEnv) entryLike(id BlockID, kind format.SidecarKind, _ index.Location) (index.Location, bool, error) {
	if kind == 0 {
		return f.ix.Get(id)
	}
	return f.ix.GetSidecar(id, kind)
}
func (f *fakeReclaimEnv) submit([]devio.Op, func(int) tiers.Disk) error {
	return errors.New("fake reclaim env: no I/O")
}
func (f *fakeReclaimEnv) putRecord(*wal.Record)                          {}
func (f *fakeReclaimEnv) compressRecord(*wal.Record, format.Compression) {}
func (f *fakeReclaimEnv) chunkBlocks(tiers.Disk, int) int                { return 0 }
func (f *fakeReclaimEnv) uncache(id BlockID)                             { f.uncached = append(f.uncached, id) }
func (f *fakeReclaimEnv) dropBroken(BlockID, index.Location, error) error {
	return errors.New("fake reclaim env: nothing is broken")
}
func (f *fakeReclaimEnv) dropBrokenSidecar(BlockID, SidecarKind, index.Location, error) error {
	return errors.New("fake reclaim env: nothing is broken")
}
func (f *fakeReclaimEnv) retireShared(n uint64, finish func()) {
	f.event("retireShared", n)
	finish()
}
func (f *fakeReclaimEnv) sharingPasses() int64                   { return f.passes }
func (f *fakeReclaimEnv) evictSidecars(tiers.Disk, uint64) error { return nil }
func (f *fakeReclaimEnv) stopped() <-chan struct{}               { return f.stop }

// event records what happened to segment n, with the state of its row at that moment.
func (f *fakeReclaimEnv) event(what string, n uint64) {
	state := "no row"
	if row, ok := f.ix.Segment(n); ok {
		state = row.State.String()
	}
	f.events = append(f.events, what+" ("+state+")")
}

// fakeDisk is a tiers.Disk with what reclamation asks of a tier; any other method panics (the
// embedded interface is nil).
type fakeDisk struct {
	tiers.Disk
	name     string
	pos      int
	capacity int64
	space    *tiers.Space
	shared   bool
	acct     *tiers.ShareAccount // non-nil: a shared tier with a capacity
	recency  *tiers.Recency      // nil: keeps none
	env      *fakeReclaimEnv
}

func (d *fakeDisk) Name() string                 { return d.name }
func (d *fakeDisk) Pos() int                     { return d.pos }
func (d *fakeDisk) Config() tiers.Config         { return tiers.Config{Name: d.name, Capacity: d.capacity} }
func (d *fakeDisk) Space() *tiers.Space          { return d.space }
func (d *fakeDisk) Shared() bool                 { return d.shared }
func (d *fakeDisk) Account() *tiers.ShareAccount { return d.acct }
func (d *fakeDisk) Codec() format.Compression    { return format.CompressionNone }
func (d *fakeDisk) Recency() *tiers.Recency      { return d.recency }
func (d *fakeDisk) Writer(bool) *wal.Writer {
	panic("fakeDisk: no writer: nothing should be read to write")
}
func (d *fakeDisk) Unlink(n uint64, _ string, _ int64, _ bool) (bool, error) {
	d.env.event("unlink", n)
	return false, nil
}
func (d *fakeDisk) Released(_ string, n uint64, size int64, _ bool) {
	d.env.event("released", n)
	d.space.Add(-size)
}

func newTestReclaimer(t *testing.T, ts ...tiers.Disk) (*reclaimer, *fakeReclaimEnv) {
	t.Helper()
	ix, err := index.Open(filepath.Join(t.TempDir(), "index"), index.Options{FS: vfs.Default})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ix.Close() })
	env := &fakeReclaimEnv{ix: ix, homes: map[uint64]segHome{}, stop: make(chan struct{})}
	for _, d := range ts {
		d.(*fakeDisk).env = env
	}
	rc := &reclaimer{kick: lifecycle.NewKick(), deferrals: make([]deferral, len(ts)), ix: ix, tiers: ts,
		pool: devio.NewBufferPool(), stats: &counters{}, env: env,
		cfg: reclaimConfig{Layout: mhaLayout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	return rc, env
}

// putBlocks indexes n blocks in sealed segment seg of tier d and returns their ids.
func putBlocks(t *testing.T, rc *reclaimer, env *fakeReclaimEnv, d tiers.Disk, seg uint64, n int) []BlockID {
	t.Helper()
	env.homes[seg] = segHome{tier: d, dir: "dir"}
	b := rc.ix.NewBatch()
	b.SetSegment(index.SegmentMeta{Number: seg, Generation: 1, State: index.SegmentSealed, Size: 1 << 20})
	var ids []BlockID
	for k := 0; k < n; k++ {
		id := blockID(int(seg)*100 + k)
		b.Put(id, index.Location{Segment: seg, Offset: int64(k+1) * mhaLayout.RecordBytes(), Layout: mhaLayout,
			ShardCRCs: make([]uint32, mhaLayout.Shards)})
		ids = append(ids, id)
	}
	if err := rc.ix.Apply(b, false); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestEvictDefersForSharedNextTier: a background eviction whose shared next tier refuses for
// lack of room leaves its victims in place (errEvictionDeferred) while nobody waits for the room
// it would free; when the tier is over its capacity it waits for the share a bounded time (here
// none: the cap is 0) and then drops them; a forced eviction (mayDefer false) drops them at once.
func TestEvictDefersForSharedNextTier(t *testing.T) {
	for _, tc := range []struct {
		name      string
		capacity  int64 // of the first tier; it holds 500 bytes
		mayDefer  bool
		deferrals int // calls that defer before one drops
	}{
		{"within capacity, nobody waiting: deferred without limit", 1000, true, -1},
		{"over capacity: deferred for a bounded wait, then dropped", 100, true, 1},
		{"forced: dropped at once", 100, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			space := tiers.NewSpace(1000, 0.9, 0.8)
			space.Add(500)
			top := &fakeDisk{name: "top", pos: 0, capacity: tc.capacity, space: space}
			next := &fakeDisk{name: "shared", pos: 1, capacity: 1000, space: tiers.NewSpace(1000, 0.9, 0.8), shared: true, acct: &tiers.ShareAccount{}}
			rc, env := newTestReclaimer(t, top, next)
			// The next tier refuses: relocate fails with ErrNoSpace before it moves anything.
			env.acquireErr = fmt.Errorf("pin for a demotion: %w", syscall.ENOSPC)
			ids := putBlocks(t, rc, env, top, 1, 2)
			evict := func() (ReclaimReport, error) {
				rc.mu.Lock()
				defer rc.mu.Unlock()
				var rep ReclaimReport
				err := rc.evict(top, ids, tc.mayDefer, &rep)
				return rep, err
			}
			for call := 0; tc.deferrals < 0 && call < 3 || call < tc.deferrals; call++ {
				if _, err := evict(); !errors.Is(err, errEvictionDeferred) {
					t.Fatalf("call %d: %v, want errEvictionDeferred", call, err)
				}
				for _, id := range ids {
					if !rc.ix.Contains(id) {
						t.Fatalf("call %d: deferred eviction dropped %s", call, id)
					}
				}
				if len(env.uncached) != 0 || len(rc.kick) != 0 {
					t.Fatalf("call %d: deferred eviction uncached %v, kicked %d", call, env.uncached, len(rc.kick))
				}
			}
			if tc.deferrals < 0 {
				if !rc.deferrals[0].since.IsZero() {
					t.Fatal("a deferral that costs nothing started the bounded wait")
				}
				return
			}
			rep, err := evict()
			if err != nil {
				t.Fatalf("evict after %d deferrals: %v", tc.deferrals, err)
			}
			if rep.BlocksEvicted != 2 || rep.BlocksDemoted != 0 {
				t.Fatalf("report %+v, want 2 evicted, none demoted", rep)
			}
			for _, id := range ids {
				if rc.ix.Contains(id) {
					t.Fatalf("%s still indexed after the eviction dropped it", id)
				}
			}
			if !slices.Equal(env.uncached, ids) {
				t.Fatalf("uncached %v, want %v", env.uncached, ids)
			}
			if len(rc.kick) != 1 {
				t.Fatal("dropping for a full next tier did not kick the reclaimer")
			}
			if got := rc.stats.evictedBlocks.Load(); got != 2 {
				t.Fatalf("evicted blocks counter %d, want 2", got)
			}
		})
	}
}

// TestRetireOrder: a segment is marked deleting (durably) before its handle is forgotten, its
// file unlinked after that (after the grace of a shared tier), its row deleted after the unlink,
// its home forgotten and only then its bytes released from its tier: a crash at any point leaves
// a deleting row that the next Open finishes, never an indexed segment without its file.
func TestRetireOrder(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			space := tiers.NewSpace(1<<30, 0.9, 0.8)
			d := &fakeDisk{name: "disk", space: space, shared: shared}
			rc, env := newTestReclaimer(t, d)
			putBlocks(t, rc, env, d, 5, 0)
			space.Add(1 << 20)
			if err := rc.retire(5); err != nil {
				t.Fatal(err)
			}
			want := []string{"forget (deleting)"}
			if shared {
				want = append(want, "retireShared (deleting)")
			}
			want = append(want, "unlink (deleting)", "forgetHome (no row)", "released (no row)")
			if !slices.Equal(env.events, want) {
				t.Fatalf("retire's steps:\n%q\nwant\n%q", env.events, want)
			}
			if space.Used() != 0 || rc.stats.segmentsRetired.Load() != 1 {
				t.Fatalf("after retire: %d bytes used, %d retired; want 0 and 1", space.Used(), rc.stats.segmentsRetired.Load())
			}
		})
	}
}

// TestRetireRefusesLiveSegment: a segment that entries still point into is never retired.
func TestRetireRefusesLiveSegment(t *testing.T) {
	d := &fakeDisk{name: "disk", space: tiers.NewSpace(1<<30, 0.9, 0.8)}
	rc, env := newTestReclaimer(t, d)
	putBlocks(t, rc, env, d, 7, 1)
	if err := rc.retire(7); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("retire a segment with a live record: %v, want ErrCorrupt", err)
	}
	if row, ok := rc.ix.Segment(7); !ok || row.State != index.SegmentSealed || len(env.events) != 0 {
		t.Fatalf("refused retire changed the segment: row %+v (%v), steps %q", row, ok, env.events)
	}
}

// TestEvictDeferralRestarts: a bounded wait for a shared next tier's share ends when the next
// tier answers otherwise than "no room" (here an I/O error, which eviction returns): a later
// refusal starts a new wait rather than dropping the blocks at once for the old one.
func TestEvictDeferralRestarts(t *testing.T) {
	space := tiers.NewSpace(1000, 0.9, 0.8)
	space.Add(500)
	top := &fakeDisk{name: "top", pos: 0, capacity: 100, space: space}
	next := &fakeDisk{name: "shared", pos: 1, capacity: 1000, space: tiers.NewSpace(1000, 0.9, 0.8), shared: true, acct: &tiers.ShareAccount{}}
	rc, env := newTestReclaimer(t, top, next)
	ids := putBlocks(t, rc, env, top, 1, 2)
	evict := func(cause error) error {
		env.acquireErr = fmt.Errorf("pin for a demotion: %w", cause)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		var rep ReclaimReport
		return rc.evict(top, ids, true, &rep)
	}
	if err := evict(syscall.ENOSPC); !errors.Is(err, errEvictionDeferred) || rc.deferrals[0].since.IsZero() {
		t.Fatalf("first refusal: %v, wait started %v; want deferred and the wait started", err, !rc.deferrals[0].since.IsZero())
	}
	if err := evict(syscall.EIO); !errors.Is(err, ErrIO) {
		t.Fatalf("an I/O error from the next tier: %v, want ErrIO", err)
	}
	if !rc.deferrals[0].since.IsZero() {
		t.Fatal("the wait for room went on after the next tier answered otherwise")
	}
	if err := evict(syscall.ENOSPC); !errors.Is(err, errEvictionDeferred) {
		t.Fatalf("a refusal after the wait ended: %v, want deferred again (a new wait)", err)
	}
	for _, id := range ids {
		if !rc.ix.Contains(id) {
			t.Fatalf("%s dropped although every wait was deferred", id)
		}
	}
}
