package fuzz

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/devio/devtest"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/fuzz/internal/faultfs"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// ---------------------------------------------------------------------------------------------
// Shared helpers (also used by badinput_test.go).

// fLayout is a small MHA-like layout: 4 shards of 8 KiB, a 36 KiB record.
var fLayout = engine.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 2 * 4096}

var fSchema = engine.Schema{Model: "fuzz/faults@1", DType: "bfloat16", KVLayout: "mha", TPSize: 1, BlockTokens: 16}

const storeDir = "/store"

// fOptions are the options of the fault suites: small segments (about 6 records each) so that
// a short workload creates and seals several segments, psync so that every op goes through the
// vfs, SyncAlways so that an acknowledged dump is durable.
func fOptions(fs vfs.FS) engine.Options {
	return engine.Options{Layout: fLayout, Schema: fSchema, FS: fs, SegmentSize: 256 << 10,
		IOEngine: devio.EnginePsync, DirectIO: devio.DirectOff, QueueDepth: 4, TaskTimeout: 5 * time.Second}
}

// alignChecked wraps fs so that misaligned segment I/O fails (MemFS would accept it).
func alignChecked(fs vfs.FS) vfs.FS {
	return devtest.AlignCheckFS(fs, func(p string) bool { return strings.HasSuffix(p, wal.SegmentExt) })
}

// bid is the deterministic id of block n (never zero).
func bid(n int) engine.BlockID {
	s := sha256.Sum256([]byte(fmt.Sprintf("fuzz-block-%d", n)))
	var id engine.BlockID
	copy(id[:], s[:])
	id[0] |= 1
	return id
}

// fillPayload writes the payload of id (a deterministic function of the id) into b.
func fillPayload(id engine.BlockID, b []byte) {
	r := rand.NewPCG(binary.LittleEndian.Uint64(id[:8]), binary.LittleEndian.Uint64(id[8:]))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint64())
	}
}

func blockPayload(id engine.BlockID) []byte {
	b := make([]byte, fLayout.BlockBytes())
	fillPayload(id, b)
	return b
}

func shardPayload(id engine.BlockID, sh int) []byte {
	b := blockPayload(id)
	return b[int64(sh)*fLayout.ShardBytes : int64(sh+1)*fLayout.ShardBytes]
}

func idsOf(ns []int) []engine.BlockID {
	out := make([]engine.BlockID, len(ns))
	for i, n := range ns {
		out[i] = bid(n)
	}
	return out
}

func span(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// dumpNs dumps blocks ns in one Dump call and returns the per-block errors.
func dumpNs(e *engine.Engine, ns []int) []error { return dumpNsWait(e, ns, false) }

// dumpNsWait is dumpNs; with patient it waits without the engine's TaskTimeout (verification
// steps of the slow-I/O cases, whose TaskTimeout is tiny, must not time out on a loaded machine).
func dumpNsWait(e *engine.Engine, ns []int, patient bool) []error {
	ids := idsOf(ns)
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = blockPayload(id)
	}
	t := e.Dump(ids, src)
	if patient {
		_ = t.WaitContext(context.Background())
	} else {
		_ = t.Wait()
	}
	return t.BlockErrors()
}

func mustDump(t testing.TB, e *engine.Engine, ns []int) {
	t.Helper()
	for i, err := range dumpNsWait(e, ns, true) {
		if err != nil {
			t.Fatalf("dump block %d: %v", ns[i], err)
		}
	}
}

// loadNs loads blocks ns in one Load call into aligned buffers and returns the buffers and the
// per-block errors.
func loadNs(e *engine.Engine, ns []int) ([][]byte, []error) { return loadNsWait(e, ns, false) }

func loadNsWait(e *engine.Engine, ns []int, patient bool) ([][]byte, []error) {
	dst := make([][]byte, len(ns))
	for i := range dst {
		dst[i] = devio.AlignedBuffer(int(fLayout.BlockBytes()))
	}
	t := e.Load(idsOf(ns), dst)
	if patient {
		_ = t.WaitContext(context.Background())
	} else {
		_ = t.Wait()
	}
	return dst, t.BlockErrors()
}

// checkServed asserts that every block of ns loads byte-identical.
func checkServed(t errSink, e *engine.Engine, ns []int, what string) {
	t.Helper()
	if len(ns) == 0 {
		return
	}
	hits := e.Lookup(idsOf(ns))
	dst, errs := loadNsWait(e, ns, true)
	lost := 0
	for i, n := range ns {
		switch {
		case errs[i] != nil:
			lost++
			if lost <= 3 {
				t.Errorf("%s: acknowledged block %d (lookup %v): %v", what, n, hits[i], errs[i])
			}
		case !bytes.Equal(dst[i], blockPayload(bid(n))):
			t.Errorf("%s: block %d: WRONG BYTES served", what, n)
		}
	}
	if lost > 0 {
		t.Errorf("%s: %d of %d acknowledged blocks not served", what, lost, len(ns))
	}
}

// errSink is where checks report violations: a *testing.T, or a runReport that collects them
// so that the fault matrix can report them with the op index the fault was injected at.
type errSink interface {
	Helper()
	Errorf(format string, args ...any)
}

// runReport collects the violations of one fault run.
type runReport struct{ msgs []string }

func (r *runReport) Helper() {}

func (r *runReport) Errorf(format string, args ...any) {
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

// isAny reports whether err wraps one of kinds.
func isAny(err error, kinds ...error) bool {
	for _, k := range kinds {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

func kindNames(kinds []error) string {
	var s []string
	for _, k := range kinds {
		s = append(s, k.Error())
	}
	return strings.Join(s, " | ")
}

// goroutineBaseline returns the goroutine count after letting stragglers of earlier tests exit.
func goroutineBaseline() int {
	n := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		time.Sleep(5 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			break
		}
		n = m
	}
	return n
}

// checkNoLeak fails t if goroutines outlive the engines closed since base was taken.
func checkNoLeak(t testing.TB, base int, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("%s: goroutine leak: %d goroutines, %d before Open\n%s", what, n, base, buf)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reopenClone crash-clones mem keeping only synced data, opens the clone and checks that
// every block of acked is served; it returns the number of blocks served.
func reopenClone(t errSink, mem *vfs.MemFS, acked []int, what string) {
	t.Helper()
	clone := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	e, err := engine.Open(storeDir, fOptions(alignChecked(clone)))
	if err != nil {
		t.Errorf("%s: open crash clone: %v", what, err)
		return
	}
	checkServed(t, e, acked, what)
	// Segments left active by the crash (or abandoned after an I/O failure) were sealed, or
	// deleted if nothing in them survived.
	for _, s := range e.Index().Segments() {
		if s.State == index.SegmentActive {
			t.Errorf("%s: segment %d still active after recovery", what, s.Number)
		}
	}
	if err := e.Close(); err != nil {
		t.Errorf("%s: close crash clone: %v", what, err)
	}
}

// ---------------------------------------------------------------------------------------------
// The fault trigger: counts the matching operations while armed and fires at the n-th one
// (and every later one when sticky).

type trigger struct {
	n        int64
	sticky   bool
	armed    atomic.Bool
	seen     atomic.Int64
	fired    atomic.Int64
	mu       sync.Mutex
	firedOps []string // "kind path" of the ops that fired
}

func (tr *trigger) fire(kind, path string, off int64) bool {
	if !tr.armed.Load() {
		return false
	}
	k := tr.seen.Add(1) - 1
	if k == tr.n || (tr.sticky && tr.n >= 0 && k > tr.n) {
		tr.fired.Add(1)
		tr.mu.Lock()
		tr.firedOps = append(tr.firedOps, kind+" "+path+" "+fmt.Sprint(off))
		tr.mu.Unlock()
		return true
	}
	return false
}

func (tr *trigger) firedPaths() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.firedOps...)
}

// efsInjector is an errorfs.Injector driven by a trigger.
type efsInjector struct {
	tr    *trigger
	match func(op errorfs.Op) bool
	err   error
}

func (i *efsInjector) String() string { return "fuzz-trigger" }

func (i *efsInjector) MaybeError(op errorfs.Op) error {
	if i.match(op) && i.tr.fire(fmt.Sprint(op.Kind), op.Path, op.Offset) {
		return i.err
	}
	return nil
}

func isSeg(path string) bool { return strings.HasSuffix(path, wal.SegmentExt) }

func segNumber(path string) (uint64, bool) {
	return wal.ParseSegmentFileName(filepath.Base(path))
}

// faultReachedBlocks reports whether a fault that fired while blocks ns were dumped can have
// touched them: it hit a file other than a segment or the segment directory (the index), or
// the segment the blocks are stored in. A fault on another segment — sealing the full segment
// before it, which the log does behind the dump's writes to the next one — leaves the dump's
// blocks durable, and the dump rightly succeeds. So does a fault on the segment directory: it
// fails the creation of a segment (or a deletion), and the writer creates a new one when the
// creation of the segment it prepared in the background failed; the dump's own segment was
// created whole, which the power-loss checks after it prove.
func faultReachedBlocks(e *engine.Engine, ns []int, fired []string) bool {
	for _, p := range fired {
		f := strings.Fields(p)
		if len(f) < 2 {
			return true
		}
		if filepath.Base(f[1]) == engine.SegmentDir {
			continue
		}
		seg, ok := segNumber(f[1])
		if !ok {
			return true
		}
		for _, b := range ns {
			if loc, ok, err := e.Index().Get(bid(b)); err != nil || !ok || loc.Segment == seg {
				return true
			}
		}
	}
	return false
}

// ---------------------------------------------------------------------------------------------
// The fault matrix.

type faultCase struct {
	name string
	// Exactly one of efs (an errorfs matcher, with efsErr) and ff (a faultfs rule) is set.
	efs    func(op errorfs.Op) bool
	efsErr error
	ff     func(op faultfs.Op) bool
	action faultfs.Action
	// wantDump / wantLoad: the typed errors a task that hit the fault may return.
	wantDump, wantLoad []error
	// mustFail: a dump or load that hit the fault must have failed (false for faults the
	// engine is expected to absorb: short transfers without error, delays).
	mustFail bool
	// segFault: the fault hits a segment write or sync; the dumps concerned must not be
	// visible and the segment must never be appended to again.
	segFault    bool
	taskTimeout time.Duration
	queueDepth  int
	maxRuns     int
}

func faultMatrix() []faultCase {
	eio, enospc := syscall.EIO, syscall.ENOSPC
	segWrite := func(op errorfs.Op) bool { return op.Kind == errorfs.OpFileWriteAt && isSeg(op.Path) }
	segRead := func(op errorfs.Op) bool { return op.Kind == errorfs.OpFileReadAt && isSeg(op.Path) }
	segSync := func(op errorfs.Op) bool { return op.Kind == errorfs.OpFileSyncData && isSeg(op.Path) }
	segDir := storeDir + "/" + engine.SegmentDir
	dirSync := func(op errorfs.Op) bool { return op.Kind == errorfs.OpFileSync && op.Path == segDir }
	dirOpen := func(op errorfs.Op) bool { return op.Kind == errorfs.OpOpenDir && op.Path == segDir }
	ffSegWrite := func(op faultfs.Op) bool { return op.Kind == faultfs.WriteAt && isSeg(op.Path) }
	ffSegRead := func(op faultfs.Op) bool { return op.Kind == faultfs.ReadAt && isSeg(op.Path) }
	half := func(eerr error) faultfs.Action { return faultfs.Action{ShortSet: true, Short: 4096, Err: eerr} }
	readErrs := []error{engine.ErrIO, engine.ErrCorrupt, engine.ErrNotFound}
	return []faultCase{
		{name: "enospc-seg-write", efs: segWrite, efsErr: enospc, wantDump: []error{engine.ErrNoSpace}, mustFail: true, segFault: true},
		{name: "eio-seg-write", efs: segWrite, efsErr: eio, wantDump: []error{engine.ErrIO}, mustFail: true, segFault: true},
		{name: "eio-seg-read", efs: segRead, efsErr: eio, wantLoad: readErrs, mustFail: true},
		{name: "eio-seg-syncdata", efs: segSync, efsErr: eio, wantDump: []error{engine.ErrIO}, mustFail: true, segFault: true},
		{name: "eio-segdir-sync", efs: dirSync, efsErr: eio, wantDump: []error{engine.ErrIO}, mustFail: true},
		{name: "eio-segdir-open", efs: dirOpen, efsErr: eio, wantDump: []error{engine.ErrIO}, mustFail: true},
		{name: "short-write-then-eio", ff: ffSegWrite, action: half(eio), wantDump: []error{engine.ErrIO}, mustFail: true, segFault: true},
		{name: "short-write-then-enospc", ff: ffSegWrite, action: half(enospc), wantDump: []error{engine.ErrNoSpace}, mustFail: true, segFault: true},
		{name: "short-write-no-error", ff: ffSegWrite, action: half(nil)},
		{name: "short-read-no-error", ff: ffSegRead, action: half(nil)},
		{name: "short-read-then-eio", ff: ffSegRead, action: half(eio), wantLoad: readErrs, mustFail: true},
		{name: "short-read-premature-eof", ff: ffSegRead, action: half(io.EOF), wantLoad: readErrs, mustFail: true},
		{name: "slow-read", ff: ffSegRead, action: faultfs.Action{Delay: 120 * time.Millisecond},
			wantLoad: []error{engine.ErrTimeout}, wantDump: []error{engine.ErrTimeout}, taskTimeout: 40 * time.Millisecond, queueDepth: 1, maxRuns: 4},
		{name: "slow-write", ff: ffSegWrite, action: faultfs.Action{Delay: 120 * time.Millisecond},
			wantDump: []error{engine.ErrTimeout}, wantLoad: []error{engine.ErrTimeout}, taskTimeout: 40 * time.Millisecond, maxRuns: 4},
	}
}

// faultRun is the outcome of one run of a case with the fault at one op index.
type faultRun struct {
	seen, fired        int64
	failedDumps, acked int
	failedLoads        int
	timeouts           int
	firedOps           []string
}

// runFault runs the workload with the fault at the n-th matching op (n < 0: count only).
func runFault(t *testing.T, fc faultCase, n int64) (faultRun, *runReport) {
	t.Helper()
	rep := &runReport{}
	tr := &trigger{n: n}
	mem := vfs.NewCrashableMem()
	var fs vfs.FS = mem
	if fc.efs != nil {
		fs = errorfs.Wrap(mem, &efsInjector{tr: tr, match: fc.efs, err: fc.efsErr})
	} else {
		fs = faultfs.Wrap(mem, func(op faultfs.Op) faultfs.Action {
			if fc.ff(op) && tr.fire(op.Kind.String(), op.Path, op.Off) {
				return fc.action
			}
			return faultfs.Action{}
		})
	}
	fs = alignChecked(fs)
	opts := fOptions(fs)
	if fc.taskTimeout > 0 {
		opts.TaskTimeout = fc.taskTimeout
	}
	if fc.queueDepth > 0 {
		opts.QueueDepth = fc.queueDepth
	}
	var res faultRun
	var acked []int
	ackedSet := map[int]bool{}
	ack := func(n int) {
		if !ackedSet[n] {
			ackedSet[n] = true
			acked = append(acked, n)
		}
	}

	// Setup without faults: 12 blocks over two sealed segments, then reopen so that the sealed
	// segments are opened for reading lazily, under the fault.
	e, err := engine.Open(storeDir, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	base := span(0, 12)
	mustDump(t, e, base)
	for _, b := range base {
		ack(b)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if e, err = engine.Open(storeDir, opts); err != nil {
		t.Fatalf("reopen: %v", err)
	}

	// Armed workload: rounds of a 2-block dump, a 3-block load and a shard load.
	tr.armed.Store(true)
	next := 100
	var ackedAfterFault []int
	for round := 0; round < 6; round++ {
		ns := []int{next, next + 1}
		next += 2
		firedBefore := tr.fired.Load()
		errs := dumpNs(e, ns)
		hitDump := tr.fired.Load() > firedBefore
		hits := e.Lookup(idsOf(ns))
		for i, err := range errs {
			switch {
			case err == nil:
				ack(ns[i])
				if tr.fired.Load() > 0 {
					ackedAfterFault = append(ackedAfterFault, ns[i])
				}
				if !hits[i] {
					rep.Errorf("n=%d: dump of block %d succeeded but Lookup misses it", n, ns[i])
				}
			default:
				res.failedDumps++
				if errors.Is(err, engine.ErrTimeout) {
					res.timeouts++
				}
				if !isAny(err, fc.wantDump...) {
					rep.Errorf("n=%d: dump of block %d: %v; want one of %s", n, ns[i], err, kindNames(fc.wantDump))
				}
				if fc.segFault && hits[i] {
					rep.Errorf("n=%d: block %d visible although its dump failed: %v", n, ns[i], err)
				}
				if hits[i] {
					// Visible despite the error: it must at least be right.
					checkServed(rep, e, ns[i:i+1], fmt.Sprintf("n=%d failed-but-visible", n))
				}
			}
		}
		if hitDump && fc.mustFail && len(fc.wantDump) > 0 {
			failed := false
			for _, err := range errs {
				failed = failed || err != nil
			}
			if !failed && faultReachedBlocks(e, ns, tr.firedPaths()) {
				rep.Errorf("n=%d: the fault hit the dump of %v (%v) but the dump reported success", n, ns, tr.firedPaths())
			}
		}

		ls := []int{acked[0], acked[len(acked)/2], acked[len(acked)-1]}
		firedBefore = tr.fired.Load()
		dst, lerrs := loadNs(e, ls)
		hitLoad := tr.fired.Load() > firedBefore
		failed := false
		for i, err := range lerrs {
			switch {
			case err == nil:
				if !bytes.Equal(dst[i], blockPayload(bid(ls[i]))) {
					rep.Errorf("n=%d: load of block %d returned WRONG BYTES", n, ls[i])
				}
			default:
				failed = true
				res.failedLoads++
				if errors.Is(err, engine.ErrTimeout) {
					res.timeouts++
				}
				if !isAny(err, fc.wantLoad...) {
					rep.Errorf("n=%d: load of block %d: %v; want one of %s", n, ls[i], err, kindNames(fc.wantLoad))
				}
			}
		}
		if hitLoad && fc.mustFail && len(fc.wantLoad) > 0 && !failed {
			rep.Errorf("n=%d: the fault hit the load of %v but it reported success", n, ls)
		}
		sh := round % fLayout.Shards
		sdst := [][]byte{make([]byte, fLayout.ShardBytes)}
		st := e.LoadShard(idsOf(ls[:1]), sh, sdst)
		if err := st.Wait(); err == nil {
			if !bytes.Equal(sdst[0], shardPayload(bid(ls[0]), sh)) {
				rep.Errorf("n=%d: shard load of block %d returned WRONG BYTES", n, ls[0])
			}
		} else if !isAny(err, fc.wantLoad...) {
			rep.Errorf("n=%d: shard load of block %d: %v; want one of %s", n, ls[0], err, kindNames(fc.wantLoad))
		}
	}
	tr.armed.Store(false)
	res.seen, res.fired = tr.seen.Load(), tr.fired.Load()

	// The fault has stopped: the engine accepts new dumps and serves everything acknowledged.
	after := span(next, next+4)
	for i, err := range dumpNsWait(e, after, true) {
		if err != nil {
			rep.Errorf("n=%d: dump after the fault stopped, block %d: %v", n, after[i], err)
			continue
		}
		ack(after[i])
		ackedAfterFault = append(ackedAfterFault, after[i])
	}
	checkServed(rep, e, acked, fmt.Sprintf("n=%d after the fault", n))
	res.acked = len(acked)

	// A segment whose write or sync failed is never appended to again.
	if fc.segFault {
		for _, p := range tr.firedPaths() {
			bad, ok := segNumber(strings.Fields(p)[1])
			if !ok {
				continue
			}
			for _, b := range ackedAfterFault {
				loc, ok, err := e.Index().Get(bid(b))
				if err == nil && ok && loc.Segment == bad {
					rep.Errorf("n=%d: block %d acknowledged after the fault was appended to segment %d whose I/O failed", n, b, bad)
				}
			}
		}
	}

	// Power loss now (only synced data survives): every acknowledged block is there.
	reopenClone(rep, mem, acked, fmt.Sprintf("n=%d crash clone before Close", n))
	if err := e.Close(); err != nil {
		rep.Errorf("n=%d: close after the fault stopped: %v", n, err)
	}
	reopenClone(rep, mem, acked, fmt.Sprintf("n=%d crash clone after Close", n))
	res.firedOps = tr.firedPaths()
	return res, rep
}

// TestFaultMatrix injects each fault at the i-th matching operation, for every i the workload
// reaches (sampled down to at most maxRuns), and checks the contract of docs/durability.md;
// every violation fails the subtest.
func TestFaultMatrix(t *testing.T) {
	var totalFired, totalRuns, totalFailedDumps, totalFailedLoads int64
	for _, fc := range faultMatrix() {
		t.Run(fc.name, func(t *testing.T) {
			base := goroutineBaseline()
			dry, rep := runFault(t, fc, -1)
			for _, m := range rep.msgs {
				t.Errorf("without a fault: %s", m)
			}
			if dry.seen == 0 {
				t.Fatalf("the workload issued no matching operation")
			}
			maxRuns := int64(6)
			if fc.maxRuns > 0 {
				maxRuns = int64(fc.maxRuns)
			}
			runs := min(dry.seen, maxRuns)
			var fired, failedDumps, failedLoads, timeouts int64
			for k := int64(0); k < runs; k++ {
				i := k * dry.seen / runs
				r, rep := runFault(t, fc, i)
				fired += r.fired
				failedDumps += int64(r.failedDumps)
				failedLoads += int64(r.failedLoads)
				timeouts += int64(r.timeouts)
				for _, m := range rep.msgs {
					t.Errorf("fault at op %d (%v): %s", i, r.firedOps, m)
				}
			}
			checkNoLeak(t, base, fc.name)
			t.Logf("%s: %d matching ops in the workload, %d runs, %d faults injected, %d dump blocks and %d load blocks failed (%d timeouts)",
				fc.name, dry.seen, runs, fired, failedDumps, failedLoads, timeouts)
			if fc.name == "slow-read" && timeouts == 0 {
				t.Errorf("no load timed out although reads were slower than TaskTimeout")
			}
			totalFired += fired
			totalRuns += runs
			totalFailedDumps += failedDumps
			totalFailedLoads += failedLoads
		})
	}
	t.Logf("fault matrix: %d runs, %d faults injected, %d dump blocks and %d load blocks failed with a typed error",
		totalRuns, totalFired, totalFailedDumps, totalFailedLoads)
}

// TestFaultPersistentThenClose: a fault that does not go away (a dead disk) fails every later
// dump with the fault's typed error (each retry creates a new segment: a failed creation leaves
// no file behind that would wedge the writer), Close returns without panicking (its result is
// logged) and a reopen after the disk recovers serves everything acknowledged before.
func TestFaultPersistentThenClose(t *testing.T) {
	for _, c := range []struct {
		name string
		kind errorfs.OpKind
		err  error
		want error
	}{
		{"enospc-write", errorfs.OpFileWriteAt, syscall.ENOSPC, engine.ErrNoSpace},
		{"eio-write", errorfs.OpFileWriteAt, syscall.EIO, engine.ErrIO},
		{"eio-syncdata", errorfs.OpFileSyncData, syscall.EIO, engine.ErrIO},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := goroutineBaseline()
			tr := &trigger{n: 0, sticky: true}
			mem := vfs.NewCrashableMem()
			fs := alignChecked(errorfs.Wrap(mem, &efsInjector{tr: tr, err: c.err,
				match: func(op errorfs.Op) bool { return op.Kind == c.kind && isSeg(op.Path) }}))
			e, err := engine.Open(storeDir, fOptions(fs))
			if err != nil {
				t.Fatal(err)
			}
			acked := span(0, 8)
			mustDump(t, e, acked)
			tr.armed.Store(true)
			for r := 0; r < 3; r++ {
				if err := dumpNs(e, []int{50 + r})[0]; !errors.Is(err, c.want) {
					t.Errorf("dump %d of 3 on a dead disk: %v, want %v", r+1, err, c.want)
				}
				checkServed(t, e, acked, "dead disk")
			}
			closeErr := e.Close()
			t.Logf("Close with the fault persisting: %v (faults injected: %d)", closeErr, tr.fired.Load())
			tr.armed.Store(false)
			reopenClone(t, mem, acked, "after a persistent fault")
			e, err = engine.Open(storeDir, fOptions(alignChecked(mem)))
			if err != nil {
				t.Fatal(err)
			}
			checkServed(t, e, acked, "reopen after a persistent fault")
			mustDump(t, e, span(60, 64))
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			checkNoLeak(t, base, c.name)
		})
	}
}

// ---------------------------------------------------------------------------------------------
// Pebble (index) I/O faults. Pebble treats a failed WAL write or sync as fatal by design: db.go
// calls Logger.Fatalf("pebble: fatal commit error"). The index recovers that on the committing
// goroutine and fails (index.ErrFailed): dumps are refused with a typed error, loads keep being
// served, and the process survives (an embedded engine must not take down its host). The probe
// still runs the workload in a child process on a real directory, so that a death would be
// observed, not suffered, and the parent reopens the store the child left behind.

const childEnv = "UCM_FUZZ_CHILD"

// pebbleFault describes a fault on Pebble's files for the child.
type pebbleFault struct {
	name string
	kind errorfs.OpKind
	ext  string // file name suffix under the index directory
	err  error  // what the op fails with
}

// pebbleFaults are the index ops the dump workload issues (measured: Pebble writes its WAL
// with Write and syncs it with SyncData; the workload writes no MANIFEST and syncs no directory
// once open).
var pebbleFaults = []pebbleFault{
	{"wal-write", errorfs.OpFileWrite, ".log", syscall.EIO},
	{"wal-syncdata", errorfs.OpFileSyncData, ".log", syscall.EIO},
	{"wal-write-full", errorfs.OpFileWrite, ".log", syscall.ENOSPC},
}

func (pf pebbleFault) match(op errorfs.Op) bool {
	if op.Kind != pf.kind || !strings.Contains(op.Path, "/"+engine.IndexDir) {
		return false
	}
	if strings.HasPrefix(pf.ext, "/") {
		return strings.HasSuffix(op.Path, pf.ext)
	}
	return strings.Contains(filepath.Base(op.Path), strings.TrimPrefix(pf.ext, "."))
}

// Blocks of the Pebble probe: pebbleSetup before the fault is armed, pebbleArmed (dumped two at
// a time) while it is, pebbleAfter once it is disarmed again.
var (
	pebbleSetup = span(0, 8)
	pebbleArmed = span(100, 112)
	pebbleAfter = span(200, 202)
)

// pebbleChild is the child's side: it runs a dump workload on the real directory dir with the
// fault armed at op index n and prints one line per outcome, and "ACK <block>" for every block
// whose dump succeeded, as soon as it is acknowledged (os.Stdout is unbuffered), so that the
// parent knows what must survive the child's death.
func pebbleChild(pf pebbleFault, n int64, dir string) {
	tr := &trigger{n: n}
	fs := errorfs.Wrap(vfs.Default, &efsInjector{tr: tr, match: pf.match, err: pf.err})
	e, err := engine.Open(dir, fOptions(fs))
	if err != nil {
		fmt.Printf("OPEN-ERR %v\n", err)
		return
	}
	dumpPrint := func(ns []int) (ok int, errs []error) {
		for i, err := range dumpNs(e, ns) {
			if err != nil {
				errs = append(errs, err)
			} else {
				fmt.Printf("ACK %d\n", ns[i])
				ok++
			}
		}
		return
	}
	dumpPrint(pebbleSetup)
	tr.armed.Store(true)
	for r := 0; r+1 < len(pebbleArmed); r += 2 {
		ok, errs := dumpPrint(pebbleArmed[r : r+2])
		for _, err := range errs {
			fmt.Printf("DUMP-ERR io=%v nospace=%v %v\n", errors.Is(err, engine.ErrIO), errors.Is(err, engine.ErrNoSpace), err)
		}
		fmt.Printf("DUMP-OK %d\n", ok)
	}
	tr.armed.Store(false)
	fmt.Printf("SEEN %d FIRED %d\n", tr.seen.Load(), tr.fired.Load())
	// The index failed (if the fault fired): loads are still served.
	_, lerrs := loadNsWait(e, pebbleSetup, true)
	failedLoads := 0
	for _, err := range lerrs {
		if err != nil {
			failedLoads++
		}
	}
	fmt.Printf("LOADS-FAILED %d\n", failedLoads)
	ok, errs := dumpPrint(pebbleAfter)
	for _, err := range errs {
		fmt.Printf("DUMP-ERR io=%v nospace=%v %v\n", errors.Is(err, engine.ErrIO), errors.Is(err, engine.ErrNoSpace), err)
	}
	fmt.Printf("AFTER ok=%d\n", ok)
	fmt.Printf("CLOSE %v\n", e.Close())
	fmt.Println("CHILD-DONE")
}

// TestChildProcessHelper is the entry point of the child processes the suites spawn (a
// Pebble fault probe, a second process locking the store); without the environment variable it
// does nothing.
func TestChildProcessHelper(t *testing.T) {
	v := os.Getenv(childEnv)
	if v == "" {
		t.Skip("only runs as a child process")
	}
	args := strings.SplitN(v, " ", 3)
	if args[0] == "lock" && len(args) >= 2 {
		lockChild(strings.Join(args[1:], " "))
		return
	}
	for _, pf := range pebbleFaults {
		if pf.name == args[0] && len(args) == 3 {
			var n int64
			if _, err := fmt.Sscan(args[1], &n); err != nil {
				t.Fatalf("child %q: op index: %v", v, err)
			}
			pebbleChild(pf, n, args[2])
			return
		}
	}
	t.Fatalf("unknown child %q", v)
}

func runChild(t *testing.T, arg string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildProcessHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+arg)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestFaultPebbleIndexIO injects EIO into Pebble's WAL writes and syncs, and ENOSPC into its
// WAL writes, at the first few matching ops, in a child process on a real directory. The child
// must survive (any panic or race report fails the test), report every dump error typed
// (ErrIO, or ErrNoSpace for a full disk), and keep serving loads of what it stored before.
// The parent then reopens the store and asserts that every block the child acknowledged is
// present and byte-identical, that no unacknowledged block is served with wrong bytes, and that
// the reopened store takes dumps.
func TestFaultPebbleIndexIO(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	injected, lost, checked := 0, 0, 0
	for _, pf := range pebbleFaults {
		for _, n := range []int64{0, 3} {
			what := fmt.Sprintf("%s@%d", pf.name, n)
			dir := t.TempDir()
			out, err := runChild(t, fmt.Sprintf("%s %d %s", pf.name, n, dir))
			switch {
			case strings.Contains(out, "WARNING: DATA RACE"):
				t.Errorf("%s: the child reported a data race:\n%s", what, out)
			case strings.Contains(out, "OPEN-ERR"):
				t.Errorf("%s: the child could not open the store:\n%s", what, out)
				continue
			case strings.Contains(out, "panic:") || err != nil || !strings.Contains(out, "CHILD-DONE"):
				t.Errorf("%s: the child died (exit: %v): the engine must survive Pebble's fatal errors\n%s", what, err, out)
			case strings.Contains(out, "FIRED 0"):
				t.Logf("%s: the workload issued fewer than %d matching ops", what, n+1)
			default:
				injected++
			}
			if !strings.Contains(out, "LOADS-FAILED 0") {
				t.Errorf("%s: loads of blocks stored before the fault failed after it:\n%s", what, out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "DUMP-ERR") && !strings.Contains(line, "io=true") && !strings.Contains(line, "nospace=true") {
					t.Errorf("%s: untyped dump error: %s", what, line)
				}
				if pf.err == syscall.ENOSPC && strings.HasPrefix(line, "DUMP-ERR") && !strings.Contains(line, "nospace=true") {
					t.Errorf("%s: a full disk's dump error is not ErrNoSpace: %s", what, line)
				}
			}
			l, c := checkPebbleReopen(t, what, dir, out)
			lost += l
			checked += c
		}
	}
	t.Logf("pebble index faults: %d injected, 0 fatal to the process, %d acknowledged blocks lost (%d checked after reopening)",
		injected, lost, checked)
}

// checkPebbleReopen reopens the store the Pebble probe's child left in dir (in this process, on
// the real disk) and checks the blocks the child acknowledged (its "ACK" lines in out). It
// returns the number of acknowledged blocks lost and the number checked.
func checkPebbleReopen(t *testing.T, what, dir, out string) (lost, checked int) {
	t.Helper()
	acked := map[int]bool{}
	var ackedNs []int
	for _, line := range strings.Split(out, "\n") {
		var n int
		if _, err := fmt.Sscanf(line, "ACK %d", &n); err == nil && !acked[n] {
			acked[n] = true
			ackedNs = append(ackedNs, n)
		}
	}
	if len(ackedNs) < len(pebbleSetup) {
		t.Errorf("%s: the child acknowledged only %d blocks before the fault was armed", what, len(ackedNs))
	}
	e, err := engine.Open(dir, fOptions(alignChecked(vfs.Default)))
	if err != nil {
		t.Errorf("%s: reopen after the child: %v", what, err)
		return len(ackedNs), len(ackedNs)
	}
	defer func() {
		if err := e.Close(); err != nil {
			t.Errorf("%s: close after reopen: %v", what, err)
		}
	}()
	dst, errs := loadNsWait(e, ackedNs, true)
	for i, n := range ackedNs {
		switch {
		case errs[i] != nil:
			lost++
			t.Errorf("%s: acknowledged block %d lost after reopen: %v", what, n, errs[i])
		case !bytes.Equal(dst[i], blockPayload(bid(n))):
			lost++
			t.Errorf("%s: acknowledged block %d: WRONG BYTES after reopen", what, n)
		}
	}
	// A block whose dump was not acknowledged may be present or not, but never wrong.
	var unacked []int
	for _, n := range append(append([]int(nil), pebbleArmed...), pebbleAfter...) {
		if !acked[n] {
			unacked = append(unacked, n)
		}
	}
	if len(unacked) > 0 {
		dst, errs := loadNsWait(e, unacked, true)
		for i, n := range unacked {
			if errs[i] == nil && !bytes.Equal(dst[i], blockPayload(bid(n))) {
				t.Errorf("%s: unacknowledged block %d served with WRONG BYTES after reopen", what, n)
			}
		}
	}
	mustDump(t, e, span(300, 302))
	checkServed(t, e, span(300, 302), what+": dump after reopen")
	return lost, len(ackedNs)
}

// ---------------------------------------------------------------------------------------------
// Regression tests for single faults the matrix exercises, reduced to their minimum.

// oneShot fails the first op matching kind on a segment file with err, once armed.
func oneShot(kind errorfs.OpKind, err error) (*trigger, vfs.FS, *vfs.MemFS) {
	tr := &trigger{n: 0}
	mem := vfs.NewCrashableMem()
	return tr, alignChecked(errorfs.Wrap(mem, &efsInjector{tr: tr, err: err,
		match: func(op errorfs.Op) bool { return op.Kind == kind && isSeg(op.Path) }})), mem
}

// TestFaultFailedSegmentCreationDoesNotWedgeWriter: when writing a new segment's header fails,
// the dump fails with ErrIO, and once the fault is gone the next dump succeeds: the writer uses
// each segment number once and removes the file of a failed creation (wal/writer.go).
func TestFaultFailedSegmentCreationDoesNotWedgeWriter(t *testing.T) {
	tr, fs, _ := oneShot(errorfs.OpFileWriteAt, syscall.EIO)
	e, err := engine.Open(storeDir, fOptions(fs))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tr.armed.Store(true)
	if err := dumpNs(e, []int{1})[0]; !errors.Is(err, engine.ErrIO) {
		t.Fatalf("dump whose segment header write failed: %v, want ErrIO", err)
	}
	tr.armed.Store(false)
	if err := dumpNs(e, []int{2})[0]; err != nil {
		t.Fatalf("dump after the fault stopped: %v", err)
	}
}

// TestFaultTransientOpenErrorKeepsBlock: a transient EIO reading a sealed segment's header when
// the segment is first opened for reading fails the load with ErrIO, is not counted as
// corruption, and keeps the block: it is served once the fault is gone (engine/load.go).
func TestFaultTransientOpenErrorKeepsBlock(t *testing.T) {
	tr, fs, _ := oneShot(errorfs.OpFileReadAt, syscall.EIO)
	e, err := engine.Open(storeDir, fOptions(fs))
	if err != nil {
		t.Fatal(err)
	}
	mustDump(t, e, []int{1})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if e, err = engine.Open(storeDir, fOptions(fs)); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tr.armed.Store(true)
	_, errs := loadNs(e, []int{1})
	tr.armed.Store(false)
	if !errors.Is(errs[0], engine.ErrIO) {
		t.Errorf("load whose segment header read failed with EIO: %v, want ErrIO", errs[0])
	}
	checkServed(t, e, []int{1}, "after a transient read error")
	if st := e.Stats(); st.CorruptReads != 0 {
		t.Errorf("an EIO was counted as %d corrupt reads", st.CorruptReads)
	}
}
