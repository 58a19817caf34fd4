package engine

import (
	"errors"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/wal"
)

// segInjector fails or delays operations on segment files while armed.
type segInjector struct {
	armed atomic.Bool
	kind  errorfs.OpKind
	err   error
	delay time.Duration
	hits  atomic.Int64
}

func (s *segInjector) String() string { return "seg-injector" }

func (s *segInjector) MaybeError(op errorfs.Op) error {
	if !s.armed.Load() || op.Kind != s.kind || !strings.HasSuffix(op.Path, wal.SegmentExt) {
		return nil
	}
	s.hits.Add(1)
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	return s.err
}

func TestStagingFullIsNoSpace(t *testing.T) {
	_, fs := memFS()
	opts := testOptions(fs, mhaLayout)
	opts.MaxStagingBytes = mhaLayout.RecordBytes() // room for one partly dumped block
	opts.StageLayerWise = true                     // batch records stage only bounce buffers
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	a, b := blockID(1), blockID(2)
	shard := make([]byte, mhaLayout.ShardBytes)
	if err := e.DumpShard([]BlockID{a}, 0, [][]byte{shard}).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := e.DumpShard([]BlockID{b}, 0, [][]byte{shard}).Wait(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("second partly dumped block: %v, want ErrNoSpace", err)
	}
	if errs := e.Create([]BlockID{b}); !errors.Is(errs[0], ErrNoSpace) {
		t.Fatalf("create beyond staging: %v", errs[0])
	}
	// Whole-block dumps do not stage: unaffected.
	dumpBlocks(t, e, ids(10, 12))
}

// TestENOSPCIsNoSpaceAndEngineSurvives: a full disk fails the dumps that hit it with
// ErrNoSpace; the engine keeps serving what it has and accepts dumps again once space returns.
func TestENOSPCIsNoSpaceAndEngineSurvives(t *testing.T) {
	mem := vfs.NewCrashableMem()
	inj := &segInjector{kind: errorfs.OpFileWriteAt, err: syscall.ENOSPC}
	opts := testOptions(errorfs.Wrap(mem, inj), mhaLayout)
	e := mustOpen(t, "/store", opts)
	before := ids(0, 5)
	dumpBlocks(t, e, before)
	inj.armed.Store(true)
	src := [][]byte{blockBytes(mhaLayout, blockID(50))}
	if err := e.Dump([]BlockID{blockID(50)}, src).Wait(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("dump on a full disk: %v", err)
	}
	if e.Lookup([]BlockID{blockID(50)})[0] {
		t.Fatal("a failed dump is visible")
	}
	checkBlocks(t, e, before)
	inj.armed.Store(false)
	after := ids(50, 55)
	dumpBlocks(t, e, after)
	checkBlocks(t, e, append(before, after...))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// The abandoned segment is sealed by the next Open; nothing acknowledged is lost.
	e = mustOpen(t, "/store", opts)
	defer e.Close()
	checkBlocks(t, e, append(before, after...))
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
}

// TestFailedSyncIsNeverSuccess: a failed fdatasync fails the dump with ErrIO, is not retried as
// if it had worked, and the block is not visible.
func TestFailedSyncIsNeverSuccess(t *testing.T) {
	mem := vfs.NewCrashableMem()
	inj := &segInjector{kind: errorfs.OpFileSyncData, err: syscall.EIO}
	e := mustOpen(t, "/store", testOptions(errorfs.Wrap(mem, inj), mhaLayout))
	defer e.Close()
	dumpBlocks(t, e, ids(0, 2))
	inj.armed.Store(true)
	err := e.Dump([]BlockID{blockID(9)}, [][]byte{blockBytes(mhaLayout, blockID(9))}).Wait()
	if !errors.Is(err, ErrIO) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("dump with a failed fsync: %v", err)
	}
	if e.Lookup([]BlockID{blockID(9)})[0] {
		t.Fatal("block visible after its fsync failed")
	}
	inj.armed.Store(false)
	dumpBlocks(t, e, []BlockID{blockID(9)})
	checkBlocks(t, e, append(ids(0, 2), blockID(9)))
}

// TestSlowIOTimesOut: a load whose reads outlast the task timeout fails with ErrTimeout, after
// its in-flight reads drained, and leaves the engine usable.
func TestSlowIOTimesOut(t *testing.T) {
	mem := vfs.NewCrashableMem()
	inj := &segInjector{kind: errorfs.OpFileReadAt, delay: 30 * time.Millisecond}
	opts := testOptions(errorfs.Wrap(mem, inj), mhaLayout)
	opts.TaskTimeout = 20 * time.Millisecond
	opts.QueueDepth = 2
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 8)
	dumpBlocks(t, e, blocks)
	inj.armed.Store(true)
	dst := make([][]byte, len(blocks))
	for i := range dst {
		dst[i] = devio.AlignedBuffer(int(mhaLayout.BlockBytes()))
	}
	task := e.Load(blocks, dst)
	if err := task.Wait(); !errors.Is(err, ErrTimeout) {
		t.Fatalf("slow load: %v, want ErrTimeout", err)
	}
	if done, _ := task.Check(); !done {
		t.Fatal("Wait returned before the task drained")
	}
	inj.armed.Store(false)
	checkBlocks(t, e, blocks)
}

func TestMetricsCollector(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	dumpBlocks(t, e, ids(0, 3))
	checkBlocks(t, e, ids(0, 3))
	e.Lookup(ids(0, 4))
	reg := prometheus.NewRegistry()
	if err := reg.Register(e.Collector()); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		m := f.GetMetric()[0]
		switch {
		case m.GetCounter() != nil:
			got[f.GetName()] = m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			got[f.GetName()] = m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			got[f.GetName()] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	want := map[string]float64{"ucm_blocks": 3, "ucm_dumped_blocks_total": 3, "ucm_loaded_blocks_total": 3,
		"ucm_kv_cache_hit_rate": 0.75, "ucm_load_latency_seconds": 1, "ucm_dump_latency_seconds": 1, "ucm_corrupt_reads_total": 0,
		"ucm_tier_blocks": 3, "ucm_tier_live_bytes": float64(3 * mhaLayout.RecordBytes()), "ucm_tier_capacity_bytes": 0}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// lockFailFS fails every Lock with what fail returns for the path.
type lockFailFS struct {
	vfs.FS
	fail func(name string) error
}

func (f lockFailFS) Lock(name string) (io.Closer, error) { return nil, f.fail(name) }

// TestLockErrorsSayWhat: no permission on LOCK is reported as that (os.ErrPermission, naming
// the file), not as a store in use; a lock held elsewhere (fcntl's EAGAIN or EACCES) is
// ErrLocked.
func TestLockErrorsSayWhat(t *testing.T) {
	_, mfs := memFS()
	denied := lockFailFS{FS: mfs, fail: func(name string) error {
		return &os.PathError{Op: "open", Path: name, Err: syscall.EACCES}
	}}
	_, err := Open("/store", testOptions(denied, mhaLayout))
	if err == nil || errors.Is(err, ErrLocked) || !errors.Is(err, os.ErrPermission) ||
		!strings.Contains(err.Error(), "/store/"+LockFile) || strings.Contains(err.Error(), "in use") {
		t.Errorf("LOCK without permission: %v", err)
	}
	for _, held := range []error{syscall.EAGAIN, syscall.EACCES} {
		f := lockFailFS{FS: mfs, fail: func(string) error { return held }}
		if _, err := Open("/store", testOptions(f, mhaLayout)); !errors.Is(err, ErrLocked) {
			t.Errorf("fcntl %v: %v, want ErrLocked", held, err)
		}
	}
}

// indexWALInjector fails writes to the index's Pebble WAL while armed.
type indexWALInjector struct {
	armed atomic.Bool
	err   error
}

func (i *indexWALInjector) String() string { return "index-wal-injector" }

func (i *indexWALInjector) MaybeError(op errorfs.Op) error {
	if i.armed.Load() && op.Kind == errorfs.OpFileWrite && strings.Contains(op.Path, "/"+IndexDir+"/") && strings.HasSuffix(op.Path, ".log") {
		return i.err
	}
	return nil
}

// TestIndexFullDiskFailsDumpsNotProcess: the index's WAL hitting a full disk used to turn
// Pebble's Fatalf into a panic that ended the process. Now the dump fails with ErrNoSpace, the
// engine reports itself failed, refuses further dumps at once, keeps serving loads, closes, and
// a reopen serves every acknowledged block and takes dumps again.
func TestIndexFullDiskFailsDumpsNotProcess(t *testing.T) {
	_, mfs := memFS()
	inj := &indexWALInjector{err: syscall.ENOSPC}
	o := testOptions(errorfs.Wrap(mfs, inj), mhaLayout)
	e := mustOpen(t, "/store", o)
	stored := ids(0, 6)
	dumpBlocks(t, e, stored)
	inj.armed.Store(true)
	bb := int(mhaLayout.BlockBytes())
	src := make([]byte, bb)
	var failed error
	// Dumps do not wait for the index to sync (their segments are durable): the failure shows at
	// the next index sync, a segment seal at the latest.
	var acked []BlockID // acknowledged while the WAL was failing: durable in their segments
	for i := 100; i < 400 && failed == nil; i++ {
		b := make([]byte, bb)
		payload(blockID(i), 0, b)
		if failed = e.Dump([]BlockID{blockID(i)}, [][]byte{b}).Wait(); failed == nil {
			acked = append(acked, blockID(i))
		}
	}
	if !errors.Is(failed, ErrNoSpace) {
		t.Fatalf("dumps while the index's WAL cannot be written: %v, want ErrNoSpace", failed)
	}
	if err := e.Failed(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Failed() = %v, want ErrNoSpace", err)
	}
	inj.armed.Store(false)
	if err := e.Dump([]BlockID{blockID(200)}, [][]byte{src}).Wait(); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a dump after the failure: %v, want ErrNoSpace until reopened", err)
	}
	checkBlocks(t, e, stored)
	_ = e.Close()
	e = mustOpen(t, "/store", o)
	defer e.Close()
	checkBlocks(t, e, stored)
	checkBlocks(t, e, acked)
	if err := e.Failed(); err != nil {
		t.Fatalf("reopened engine reports %v", err)
	}
	dumpBlocks(t, e, ids(300, 302))
}

// DumpSyncs counts the dump writer's fdatasyncs: under SyncAlways each acknowledged dump was
// flushed (one at least per dump waited for in turn, none by relocation writers); under
// SyncNone the records are not (only a seal's flush would count).
func TestDumpSyncsCounted(t *testing.T) {
	o := testOptions(vfs.Default, mhaLayout)
	e := mustOpen(t, t.TempDir(), o)
	defer e.Close()
	for i := 0; i < 5; i++ {
		dumpBlocks(t, e, ids(i, i+1))
	}
	if st := e.Stats(); st.DumpSyncs < 5 || st.DumpSyncs > 10 {
		t.Fatalf("%d syncs for 5 dumps waited for in turn (SyncAlways), want 5 to 10", st.DumpSyncs)
	}
	o.SyncPolicy = SyncNone
	e2 := mustOpen(t, t.TempDir(), o)
	defer e2.Close()
	dumpBlocks(t, e2, ids(0, 5))
	if st := e2.Stats(); st.DumpSyncs != 0 {
		t.Fatalf("%d syncs under SyncNone before any seal, want 0", st.DumpSyncs)
	}
}
