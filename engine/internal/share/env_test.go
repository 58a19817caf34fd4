package share

import (
	"encoding/binary"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/engine/internal/seam"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// mhaLayout is a record layout of the tests' blocks.
var mhaLayout = format.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 2 * 4096}

// blockID returns a block id made of n.
func blockID(n int) format.BlockID {
	var id format.BlockID
	binary.LittleEndian.PutUint64(id[:], uint64(n)+1)
	return id
}

// These tests build the sharing without an engine, on a fake environment: what the
// engine's two-instance tests (engine/share_test.go) reach only through whole refresh rounds.

// fakeSharingEnv is an Env over a table of own segments; it records the calls the
// sharing makes into the engine.
type fakeSharingEnv struct {
	inst format.InstanceID
	rows map[uint64]index.SegmentMeta
	tier map[uint64]tiers.Disk

	mu        sync.Mutex
	forgotten []uint64 // ForgetOpen's aliases
	uncached  int      // UncacheUnindexedSidecars calls
}

func (f *fakeSharingEnv) Instance() format.InstanceID     { return f.inst }
func (f *fakeSharingEnv) Fingerprint() format.Fingerprint { return format.Fingerprint{} }
func (f *fakeSharingEnv) Layout() format.Layout           { return mhaLayout }
func (f *fakeSharingEnv) Home(n uint64) (Home, bool) {
	t, ok := f.tier[n]
	return Home{Tier: t}, ok
}
func (f *fakeSharingEnv) TierOf(n uint64) tiers.Disk { return f.tier[n] }
func (f *fakeSharingEnv) OwnSegments() []index.SegmentMeta {
	var out []index.SegmentMeta
	for _, r := range f.rows {
		out = append(out, r)
	}
	return out
}
func (f *fakeSharingEnv) OwnSegment(n uint64) (index.SegmentMeta, bool) {
	r, ok := f.rows[n]
	return r, ok
}
func (f *fakeSharingEnv) Indexed(format.BlockID) bool { return false }
func (f *fakeSharingEnv) ForgetOpen(n uint64) *wal.Segment {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = append(f.forgotten, n)
	return nil
}
func (f *fakeSharingEnv) EvictSegment(tiers.Disk, uint64) error { return nil }
func (f *fakeSharingEnv) UncacheUnindexedSidecars([]format.BlockID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uncached++
}
func (f *fakeSharingEnv) AtSeam(seam.Point, format.BlockID) {}

// fakeSharedDisk is a shared tier with configured paths; the sharing asks nothing else of it
// in these tests (any other method panics).
type fakeSharedDisk struct {
	tiers.Disk
	cfg tiers.Config
}

func (d fakeSharedDisk) Config() tiers.Config { return d.cfg }
func (d fakeSharedDisk) Shared() bool         { return true }

func testConfig(fs vfs.FS, grace time.Duration, readOnly bool, ts ...tiers.Disk) Config {
	return Config{FS: fs, Dir: "/store", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ReadOnly: readOnly,
		RefreshInterval: time.Hour, OwnerTimeout: time.Hour, SealAge: -1, RetireGrace: grace, Tiers: ts,
		Stop: make(chan struct{}), BG: &sync.WaitGroup{}}
}

// foreignLoc is a location in foreign segment alias.
func foreignLoc(alias uint64, off int64) index.Location {
	return index.Location{Segment: alias, Offset: off, Layout: mhaLayout, Seq: 1, ShardCRCs: make([]uint32, mhaLayout.Shards)}
}

// putForeignSegment writes what indexForeign writes for a segment: its row, its entries and
// its alias key (inst, number, generation, directory).
func putForeignSegment(t *testing.T, fx *index.Index, alias uint64, inst format.InstanceID, number uint64, dir string, ids ...format.BlockID) {
	t.Helper()
	b := fx.NewBatch()
	b.SetSegment(index.SegmentMeta{Number: alias, Generation: 1, State: index.SegmentSealed, Size: 1 << 20})
	for i, id := range ids {
		b.Put(id, foreignLoc(alias, int64(i)<<16))
	}
	val := make([]byte, foreignSegPrefix, foreignSegPrefix+len(dir))
	copy(val, inst[:])
	binary.LittleEndian.PutUint64(val[16:], number)
	binary.LittleEndian.PutUint64(val[24:], 1)
	b.SetMeta(aliasKey(alias), append(val, dir...))
	if err := fx.Apply(b, false); err != nil {
		t.Fatal(err)
	}
}

// TestSharingAliasBookkeeping: reopening the sharing loads every alias its foreign index
// recorded for a configured shared path (segment, key and next alias); a key without its row
// and one of a path no longer configured are removed (and the latter's entries with it) by a
// read-write open and kept by a read-only one. Dropping a segment forgets its alias, row, key
// and entries, moves a block to the copy another segment holds, and has the engine forget the
// alias's open file and the sidecars cached of it.
func TestSharingAliasBookkeeping(t *testing.T) {
	fs := vfs.NewMem()
	root, gone := "/shared", "/unconfigured"
	disk := &fakeSharedDisk{cfg: tiers.Config{Name: "shared", Paths: []string{root}, Shared: true}}
	other := format.InstanceID{7}
	env := &fakeSharingEnv{inst: format.InstanceID{1}}
	segDir := filepath.Join(tiers.NamespaceDir(root, other), tiers.SegmentDir)

	s, err := Open(testConfig(fs, time.Hour, false, disk), env)
	if err != nil {
		t.Fatal(err)
	}
	var a1, a2, a3, a9 uint64 = foreignAlias | 5, foreignAlias | 6, foreignAlias | 3, foreignAlias | 9
	putForeignSegment(t, s.fx, a1, other, 70, segDir, blockID(1))
	putForeignSegment(t, s.fx, a2, other, 71, segDir, blockID(2))
	putForeignSegment(t, s.fx, a3, other, 72, filepath.Join(tiers.NamespaceDir(gone, other), tiers.SegmentDir), blockID(3))
	b := s.fx.NewBatch()
	b.SetMeta(aliasKey(a9), make([]byte, foreignSegPrefix+4)) // no row: the leftover of a drop
	b.SetMeta(copyKey(blockID(1), 0, a2), index.EncodeLocation(nil, foreignLoc(a2, 1<<20)))
	if err := s.fx.Apply(b, false); err != nil {
		t.Fatal(err)
	}
	if err := s.fx.Close(); err != nil {
		t.Fatal(err)
	}

	keys := func(s *Sharing) []string {
		var ks []string
		if err := s.fx.MetaRange(metaForeignSeg, func(k string, _ []byte) bool { ks = append(ks, k); return true }); err != nil {
			t.Fatal(err)
		}
		return ks
	}
	ro, err := Open(testConfig(fs, time.Hour, true, disk), env)
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(ro); len(got) != 4 {
		t.Fatalf("read-only open: alias keys %q, want the 4 written (nothing removed)", got)
	}
	if _, ok := ro.foreignSegment(a3); ok {
		t.Fatal("read-only open: the segment of an unconfigured path has an alias")
	}
	if err := ro.fx.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(testConfig(fs, time.Hour, false, disk), env)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.fx.Close() }()
	for _, a := range []uint64{a1, a2} {
		seg, ok := s.foreignSegment(a)
		if !ok || seg.inst != other || seg.dir != segDir || seg.tier == nil || seg.tier.Config().Name != "shared" {
			t.Fatalf("alias %#x after reopen: %+v, %v", a, seg, ok)
		}
	}
	if s.aliases[foreignKey{other, 70}] != a1 || s.aliases[foreignKey{other, 71}] != a2 || len(s.aliases) != 2 {
		t.Fatalf("aliases after reopen: %v", s.aliases)
	}
	if s.next != a2&^foreignAlias+1 {
		t.Fatalf("next alias %d, want %d (past every alias loaded)", s.next, a2&^foreignAlias+1)
	}
	if got, want := keys(s), []string{aliasKey(a1), aliasKey(a2)}; !slices.Equal(got, want) {
		t.Fatalf("alias keys after a read-write open %q, want %q", got, want)
	}
	if _, ok := s.fx.Segment(a3); ok || s.fx.Contains(blockID(3)) {
		t.Fatal("the unconfigured path's segment kept its row or entries")
	}

	s.dropForeign(a1, foreignAlias|42) // an alias never indexed is ignored
	if _, ok := s.foreignSegment(a1); ok {
		t.Fatal("dropped alias still stands for its segment")
	}
	if _, ok := s.aliases[foreignKey{other, 70}]; ok {
		t.Fatal("dropped segment still has an alias")
	}
	if _, ok := s.fx.Segment(a1); ok {
		t.Fatal("dropped segment kept its row")
	}
	if got := keys(s); !slices.Equal(got, []string{aliasKey(a2)}) {
		t.Fatalf("alias keys after the drop %q", got)
	}
	loc, ok, err := s.fx.Get(blockID(1))
	if err != nil || !ok || loc.Segment != a2 || loc.Offset != 1<<20 {
		t.Fatalf("block 1 after its segment's drop: %+v %v %v, want its copy in %#x", loc, ok, err, a2)
	}
	if !slices.Equal(env.forgotten, []uint64{a1}) || env.uncached != 1 {
		t.Fatalf("engine asked to forget open files %#x and uncache sidecars %d times; want [%#x] and once", env.forgotten, env.uncached, a1)
	}
	if s.dropped.Load() != 1 {
		t.Fatalf("dropped counter %d, want 1", s.dropped.Load())
	}
}

// TestSharingGrace: a retired shared segment waits for its grace period; its bytes count in
// GraceBytes of its own tier only; a second retirement of the same number replaces the first
// (whose unlink never runs); Close cuts the grace short and runs each pending unlink once; an
// unlink whose grace has passed runs once and not again at Close.
func TestSharingGrace(t *testing.T) {
	t1 := &fakeSharedDisk{cfg: tiers.Config{Name: "one", Paths: []string{"/one"}, Shared: true}}
	t2 := &fakeSharedDisk{cfg: tiers.Config{Name: "two", Paths: []string{"/two"}, Shared: true}}
	env := &fakeSharingEnv{
		rows: map[uint64]index.SegmentMeta{10: {Number: 10, Size: 1000}, 11: {Number: 11, Size: 200}, 12: {Number: 12, Size: 30}},
		tier: map[uint64]tiers.Disk{10: t1, 11: t2, 12: t1},
	}
	s, err := Open(testConfig(vfs.NewMem(), time.Hour, false, t1, t2), env)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.fx.Close() }()
	var mu sync.Mutex
	runs := map[string]int{}
	finish := func(name string) func() {
		return func() { mu.Lock(); runs[name]++; mu.Unlock() }
	}
	s.RetireShared(10, finish("10 first"))
	select {
	case <-s.kick:
	default:
		t.Fatal("retiring a shared segment did not kick the sharer to publish the manifest without it")
	}
	s.RetireShared(11, finish("11"))
	s.RetireShared(10, finish("10 again"))
	if got := s.GraceBytes(t1); got != 1000 {
		t.Fatalf("GraceBytes(one) = %d, want 1000 (segment 10 only)", got)
	}
	if got := s.GraceBytes(t2); got != 200 {
		t.Fatalf("GraceBytes(two) = %d, want 200", got)
	}
	mu.Lock()
	if len(runs) != 0 {
		t.Fatalf("unlinks ran before their grace: %v", runs)
	}
	mu.Unlock()
	s.FinishGrace()
	mu.Lock()
	if runs["10 again"] != 1 || runs["11"] != 1 || runs["10 first"] != 0 || len(runs) != 2 {
		t.Fatalf("unlinks run at close: %v; want each pending one once, the replaced one never", runs)
	}
	mu.Unlock()
	if got := s.GraceBytes(t1) + s.GraceBytes(t2); got != 0 {
		t.Fatalf("bytes under grace after close: %d", got)
	}

	short, err := Open(testConfig(vfs.NewMem(), time.Nanosecond, false, t1), env)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = short.fx.Close() }()
	short.RetireShared(12, finish("12"))
	testwait.Until(t, "the unlink after a short grace", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return runs["12"] == 1
	})
	if got := short.GraceBytes(t1); got != 0 {
		t.Fatalf("bytes under grace once it passed: %d", got)
	}
	short.FinishGrace()
	mu.Lock()
	defer mu.Unlock()
	if runs["12"] != 1 {
		t.Fatalf("unlink whose grace passed ran %d times (Close must not run it again)", runs["12"])
	}
}

// TestSharingPendingSidecars: another instance's sidecar met before its block was indexed
// waits, per segment, until the block is; then it is indexed beside it and no longer pending.
// The pending sidecars of a dropped segment are forgotten with it.
func TestSharingPendingSidecars(t *testing.T) {
	root := "/shared"
	disk := &fakeSharedDisk{cfg: tiers.Config{Name: "shared", Paths: []string{root}, Shared: true}}
	other := format.InstanceID{7}
	segDir := filepath.Join(tiers.NamespaceDir(root, other), tiers.SegmentDir)
	s, err := Open(testConfig(vfs.NewMem(), time.Hour, false, disk), &fakeSharingEnv{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.fx.Close() }()
	var a1, a2 uint64 = foreignAlias | 1, foreignAlias | 2
	putForeignSegment(t, s.fx, a1, other, 10, segDir, blockID(1))
	putForeignSegment(t, s.fx, a2, other, 11, segDir)
	s.mu.Lock()
	s.segs[a1] = foreignSeg{inst: other, number: 10, dir: segDir, tier: disk}
	s.segs[a2] = foreignSeg{inst: other, number: 11, dir: segDir, tier: disk}
	s.pendingSidecars[a2] = []pendingSidecar{{blockID(1), 1, foreignLoc(a2, 0)}, {blockID(5), 1, foreignLoc(a2, 1<<16)}}
	s.pendingSidecars[a1] = []pendingSidecar{{blockID(9), 2, foreignLoc(a1, 1<<17)}}
	s.mu.Unlock()
	pending := func(alias uint64) int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.pendingSidecars[alias])
	}

	s.indexPendingSidecars()
	if !s.fx.HasSidecar(blockID(1), 1) {
		t.Fatal("a pending sidecar whose block is indexed was not indexed")
	}
	if s.fx.HasSidecar(blockID(5), 1) || pending(a2) != 1 {
		t.Fatalf("the sidecar of a block not indexed: indexed %v, pending %d (want kept pending)", s.fx.HasSidecar(blockID(5), 1), pending(a2))
	}
	b := s.fx.NewBatch()
	b.Put(blockID(5), foreignLoc(a1, 1<<18))
	if err := s.fx.Apply(b, false); err != nil {
		t.Fatal(err)
	}
	s.indexPendingSidecars()
	if !s.fx.HasSidecar(blockID(5), 1) || pending(a2) != 0 {
		t.Fatalf("once its block is indexed: sidecar indexed %v, pending %d", s.fx.HasSidecar(blockID(5), 1), pending(a2))
	}
	s.mu.Lock()
	_, kept := s.pendingSidecars[a2]
	s.mu.Unlock()
	if kept {
		t.Fatal("a segment with no pending sidecar left keeps an empty list")
	}

	s.dropForeign(a1)
	s.mu.Lock()
	_, kept = s.pendingSidecars[a1]
	s.mu.Unlock()
	if kept {
		t.Fatal("the pending sidecars of a dropped segment were not forgotten")
	}
}
