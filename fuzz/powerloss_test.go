package fuzz

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/fuzz/internal/workload"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/tools/verify"
)

// Power-loss simulation: the engine runs on a crash-simulating in-memory file system shared
// with Pebble; before every mutating file-system operation the file system is cloned as a power
// loss would leave it, a store is recovered from the clone and checked.

const plSeed = 7

var plSchema = engine.Schema{Model: "powerloss", DType: "bfloat16", KVLayout: "mha", TPSize: 1, BlockTokens: 16}

// crashState tracks, for every block of the workload, what a crash at any moment may and may
// not lose: required ⊆ recovered ⊆ started, discarded never visible.
//
// Sidecars (kind plSidecar, of the blocks in sideStarted) follow the same contract beside
// their block: an acknowledged one (sideRequired) is there whenever its block is, none is ever
// there without its block, and every one found has its bytes.
type crashState struct {
	mu                        sync.Mutex
	started                   map[engine.BlockID]bool
	required                  map[engine.BlockID]bool
	discarded                 map[engine.BlockID]bool
	sideStarted, sideRequired map[engine.BlockID]bool
}

func newCrashState() *crashState {
	return &crashState{started: map[engine.BlockID]bool{}, required: map[engine.BlockID]bool{}, discarded: map[engine.BlockID]bool{},
		sideStarted: map[engine.BlockID]bool{}, sideRequired: map[engine.BlockID]bool{}}
}

type crashSnapshot struct {
	started, required, discarded map[engine.BlockID]bool
	sideStarted, sideRequired    map[engine.BlockID]bool
}

// The power-loss workloads' sidecars: 4 parts (one per shard) of 96 bytes, a function of the
// block id.
const (
	plSidecar     engine.SidecarKind = 3
	plSideParts                      = 4
	plSidePart                       = 96
	plSidecarSeed                    = plSeed + 100
)

func plSidecarBytes(id engine.BlockID) []byte {
	return workload.Block(id, plSidecarSeed, plSideParts*plSidePart)
}

// dumpPLSidecars stores the sidecars of ids (each marked started first) and returns the error.
func dumpPLSidecars(e *engine.Engine, state *crashState, ids ...engine.BlockID) error {
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = plSidecarBytes(id)
	}
	state.mark(state.sideStarted, ids...)
	return e.DumpSidecars(plSidecar, plSideParts, ids, src).Wait()
}

func (s *crashState) snapshot() crashSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := func(m map[engine.BlockID]bool) map[engine.BlockID]bool {
		out := make(map[engine.BlockID]bool, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	return crashSnapshot{cp(s.started), cp(s.required), cp(s.discarded), cp(s.sideStarted), cp(s.sideRequired)}
}

func (s *crashState) mark(m map[engine.BlockID]bool, ids ...engine.BlockID) {
	s.mu.Lock()
	for _, id := range ids {
		m[id] = true
	}
	s.mu.Unlock()
}

// crashFigures are the counts a run reports (docs/reliability.md quotes them).
type crashFigures struct {
	points, recoveries, nested int
	blocksChecked              int
}

// crashPoints is an errorfs injector that simulates a power loss before every mutating
// file-system operation: it clones the file system keeping only synced data, and again keeping
// a random half of the unsynced 4 KiB blocks, recovers a store from each clone and checks it
// against the workload's state at that moment.
type crashPoints struct {
	t     *testing.T
	mem   *vfs.MemFS
	state *crashState
	opts  engine.Options

	mu     sync.Mutex
	armed  bool
	failed bool
	fig    crashFigures
}

func (c *crashPoints) String() string { return "crash-points" }

func (c *crashPoints) MaybeError(op errorfs.Op) error {
	if op.Kind.ReadOrWrite() != errorfs.OpIsWrite {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed || c.failed {
		return nil
	}
	c.fig.points++
	snap := c.state.snapshot()
	for _, pct := range []int{0, 50} {
		clone := c.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(c.fig.points), uint64(pct)))})
		// Crash again in the middle of recovering, at a few points, then recover that.
		nested := 0
		if c.fig.points%5 == 0 && pct == 0 {
			nested = 3
		}
		if err := c.check(clone, snap, nested); err != nil {
			c.failed = true
			c.t.Errorf("crash before write op %d (%v %s), unsynced kept %d%%: %v\n%s", c.fig.points, op.Kind, op.Path, pct, err, c.diagnose(pct, err))
			return nil
		}
	}
	return nil
}

// check recovers a store from fs and checks the crash contract; with nested > 0 it first
// crashes the recovery itself at its nested-th mutating operation and recovers from that.
func (c *crashPoints) check(fs *vfs.MemFS, snap crashSnapshot, nested int) error {
	if nested > 0 {
		inner := &recoveryCrash{mem: fs, at: nested}
		opts := c.opts
		opts.FS = errorfs.Wrap(fs, inner)
		if e, err := engine.Open("/store", opts); err == nil {
			e.Close()
		}
		inner.mu.Lock()
		clone := inner.clone
		inner.mu.Unlock()
		if clone != nil {
			c.fig.nested++
			if err := c.check(clone, snap, 0); err != nil {
				return fmt.Errorf("after a crash during recovery: %w", err)
			}
		}
	}
	n, err := checkRecovered(fs, c.opts, snap)
	c.fig.recoveries++
	c.fig.blocksChecked += n
	return err
}

// recoveryCrash clones the file system at the at-th mutating operation of a recovery.
type recoveryCrash struct {
	mu    sync.Mutex
	mem   *vfs.MemFS
	at    int
	n     int
	clone *vfs.MemFS
}

func (r *recoveryCrash) String() string { return "recovery-crash" }

func (r *recoveryCrash) MaybeError(op errorfs.Op) error {
	if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.n++
		if r.n == r.at {
			r.clone = r.mem.CrashClone(vfs.CrashCloneCfg{})
		}
	}
	return nil
}

// checkRecovered opens a store on a crashed file system, checks required ⊆ recovered ⊆ started
// with every visible block byte-identical and no discarded block visible, then runs the store
// verifier (index and log cross-checked both ways, accounting equal to the files). It returns
// the number of blocks it loaded.
func checkRecovered(fs vfs.FS, opts engine.Options, snap crashSnapshot) (_ int, err error) {
	opts.FS = fs
	var logBuf bytes.Buffer
	var logMu sync.Mutex
	opts.Logger = slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logBuf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := engine.Open("/store", opts)
	if err != nil {
		return 0, fmt.Errorf("recovery failed: %w", err)
	}
	defer func() {
		if err != nil {
			logMu.Lock()
			err = fmt.Errorf("%w\nrecovery %+v\nlog:\n%s", err, e.Recovery(), logBuf.String())
			logMu.Unlock()
		}
	}()
	var all []engine.BlockID
	for id := range snap.started {
		all = append(all, id)
	}
	for id := range snap.discarded {
		all = append(all, id)
	}
	hits := e.Lookup(all)
	l := e.Layout()
	loaded := 0
	for i, id := range all {
		switch {
		case snap.required[id] && !hits[i]:
			e.Close()
			return loaded, fmt.Errorf("acknowledged block %s lost", id)
		case snap.discarded[id] && !snap.started[id] && hits[i]:
			e.Close()
			return loaded, fmt.Errorf("discarded block %s visible", id)
		case !hits[i]:
			continue
		}
		dst := devio.AlignedBuffer(int(l.BlockBytes()))
		if err := e.Load([]engine.BlockID{id}, [][]byte{dst}).Wait(); err != nil {
			e.Close()
			return loaded, fmt.Errorf("visible block %s does not load: %w", id, err)
		}
		if err := workload.Check(id, plSeed, 0, dst); err != nil {
			e.Close()
			return loaded, fmt.Errorf("recovered with wrong bytes: %w", err)
		}
		loaded++
	}
	// Sidecars: every part of every one found has its bytes; none without its block; the
	// acknowledged ones of present blocks are there.
	for p := 0; p < plSideParts; p++ {
		dst := make([]byte, len(all)*plSidePart)
		found, err := e.LoadSidecars(plSidecar, p, all, dst)
		if err != nil {
			e.Close()
			return loaded, fmt.Errorf("load sidecars: %w", err)
		}
		for i, id := range all {
			switch {
			case found[i] && !hits[i]:
				e.Close()
				return loaded, fmt.Errorf("sidecar of block %s outlives its block", id)
			case found[i] && !snap.sideStarted[id]:
				e.Close()
				return loaded, fmt.Errorf("sidecar of block %s found, never dumped", id)
			case found[i] && !bytes.Equal(dst[i*plSidePart:(i+1)*plSidePart], plSidecarBytes(id)[p*plSidePart:(p+1)*plSidePart]):
				e.Close()
				return loaded, fmt.Errorf("sidecar of block %s part %d recovered with wrong bytes", id, p)
			case !found[i] && hits[i] && snap.sideRequired[id]:
				e.Close()
				return loaded, fmt.Errorf("acknowledged sidecar of block %s lost", id)
			}
		}
	}
	if err := e.Close(); err != nil {
		return loaded, fmt.Errorf("close after recovery: %w", err)
	}
	rep, err := verify.Store("/store", verify.Options{FS: fs})
	if err != nil {
		return loaded, fmt.Errorf("verify: %w", err)
	}
	if !rep.Clean() {
		var b bytes.Buffer
		for _, p := range rep.Problems {
			fmt.Fprintln(&b, p)
		}
		return loaded, fmt.Errorf("verify after recovery found problems:\n%s", b.String())
	}
	return loaded, nil
}

// TestPowerLossAtEveryWrite runs a workload of whole-block, layer-wise, V0 commit/discard and
// duplicate dumps across many segment rotations and simulates a power loss before every
// mutating file-system operation (segment writes and syncs, directory syncs, Pebble's WAL and
// manifest), keeping none or a random half of the unsynced data, and at every fifth point also
// crashes the recovery itself. After recovery every acknowledged block is present and
// byte-identical, no torn, discarded or never-dumped block is visible, acknowledged sidecars are
// there beside their blocks and none outlives its block, and ucm-tool's verifier finds the
// store clean (accounting equal to the files).
func TestPowerLossAtEveryWrite(t *testing.T) {
	for _, policy := range []engine.SyncPolicy{engine.SyncAlways, engine.SyncInterval} {
		t.Run(policy.String(), func(t *testing.T) {
			start := time.Now()
			mem := vfs.NewCrashableMem()
			state := newCrashState()
			l := engine.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 4096}
			opts := engine.Options{Layout: l, Schema: plSchema, SegmentSize: 128 << 10, SyncPolicy: policy, TaskTimeout: 10 * time.Second}
			if policy == engine.SyncInterval {
				opts.SyncInterval = 1 << 40 // no periodic sync: only the workload's explicit Sync calls
			}
			cp := &crashPoints{t: t, mem: mem, state: state, opts: opts}
			opts.FS = errorfs.Wrap(mem, cp)
			e, err := engine.Open("/store", opts)
			if err != nil {
				t.Fatal(err)
			}
			cp.mu.Lock()
			cp.armed = true
			cp.mu.Unlock()

			block := func(id engine.BlockID) []byte { return workload.Block(id, plSeed, l.BlockBytes()) }
			ack := func(ids ...engine.BlockID) {
				if policy == engine.SyncAlways {
					state.mark(state.required, ids...)
				}
			}
			var acked, sided []engine.BlockID
			n := 0
			next := func(k workload.Kind) engine.BlockID { n++; return workload.ID(plSeed, 0, k, n) }
			for round := 0; round < 6; round++ {
				a, b := next(workload.Whole), next(workload.Whole)
				state.mark(state.started, a, b)
				if err := e.Dump([]engine.BlockID{a, b}, [][]byte{block(a), block(b)}).Wait(); err != nil {
					t.Fatal(err)
				}
				ack(a, b)
				acked = append(acked, a, b)
				if err := dumpPLSidecars(e, state, a, b); err != nil {
					t.Fatal(err)
				}
				if policy == engine.SyncAlways {
					state.mark(state.sideRequired, a, b)
				}
				sided = append(sided, a, b)
				c := next(workload.LayerWise)
				full := block(c)
				state.mark(state.started, c)
				for sh := l.Shards - 1; sh >= 0; sh-- {
					if err := e.DumpShard([]engine.BlockID{c}, sh, [][]byte{full[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]}).Wait(); err != nil {
						t.Fatal(err)
					}
				}
				ack(c)
				acked = append(acked, c)
				d, x := next(workload.V0Commit), next(workload.V0Discard)
				if errs := e.Create([]engine.BlockID{d, x}); errs[0] != nil || errs[1] != nil {
					t.Fatal(errs)
				}
				state.mark(state.discarded, x)
				if err := e.Dump([]engine.BlockID{d, x}, [][]byte{block(d), block(x)}).Wait(); err != nil {
					t.Fatal(err)
				}
				state.mark(state.started, d)
				if err := e.Commit([]engine.BlockID{d}, true); err != nil {
					t.Fatal(err)
				}
				ack(d)
				acked = append(acked, d)
				if err := e.Commit([]engine.BlockID{x}, false); err != nil {
					t.Fatal(err)
				}
				if err := e.Dump([]engine.BlockID{a}, [][]byte{block(a)}).Wait(); err != nil {
					t.Fatal(err)
				}
				if policy == engine.SyncInterval && round%2 == 1 {
					if err := e.Sync(); err != nil {
						t.Fatal(err)
					}
					state.mark(state.required, acked...)
					state.mark(state.sideRequired, sided...)
				}
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			state.mark(state.required, acked...) // a clean Close makes everything durable
			state.mark(state.sideRequired, sided...)
			cp.mu.Lock()
			cp.armed = false
			fig := cp.fig
			cp.mu.Unlock()
			if _, err := checkRecovered(mem.CrashClone(vfs.CrashCloneCfg{}), cp.opts, state.snapshot()); err != nil {
				t.Fatal(err)
			}
			t.Logf("powerloss %s: %d crash points, %d recoveries checked (%d after a crash during recovery), %d block loads verified, %v",
				policy, fig.points, fig.recoveries, fig.nested, fig.blocksChecked, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestPowerLossDuringReclamation simulates a power loss before every mutating file-system
// operation of workloads that keep a two-path first tier over its capacity, so that blocks are
// evicted, segments compacted and retired, both automatically and by Evict and Compact:
//
//   - demote: a second, unlimited tier takes the evicted blocks and gives them back on hits
//     (promotion). No block is ever dropped, so after recovery every acknowledged block must be
//     present and byte-identical, wherever it lives, with its acknowledged sidecar;
//   - drop: a single tier, whose victims are deleted. Any block may be gone after a crash, but
//     every visible one must load byte-identical.
//
// In both, the verifier must find no dangling pointer and no orphan file.
func TestPowerLossDuringReclamation(t *testing.T) {
	ssd := tiers.Config{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/store", "/ssd2"}, Capacity: 512 << 10}
	cold := tiers.Config{Name: "cold", Kind: tiers.KindDisk, Paths: []string{"/cold"}}
	for _, tc := range []struct {
		name  string
		tiers []tiers.Config
		keeps bool // every acknowledged block survives
	}{
		{"demote", []tiers.Config{ssd, cold}, true},
		{"drop", []tiers.Config{ssd}, false},
	} {
		t.Run(tc.name, func(t *testing.T) { powerLossReclaiming(t, tc.tiers, tc.keeps) })
	}
}

func powerLossReclaiming(t *testing.T, ts []tiers.Config, keeps bool) {
	start := time.Now()
	mem := vfs.NewCrashableMem()
	state := newCrashState()
	l := engine.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 4096}
	// Every write op of the engine recovers two clones first, so reclamation runs slowly here
	// (seconds under -race on a loaded machine): dumps waiting for room get minutes.
	opts := engine.Options{Layout: l, Schema: plSchema, SegmentSize: 128 << 10, TaskTimeout: 5 * time.Minute, Tiers: ts}
	cp := &crashPoints{t: t, mem: mem, state: state, opts: opts}
	opts.FS = errorfs.Wrap(mem, cp)
	e, err := engine.Open("/store", opts)
	if err != nil {
		t.Fatal(err)
	}
	cp.mu.Lock()
	cp.armed = true
	cp.mu.Unlock()
	block := func(id engine.BlockID) []byte { return workload.Block(id, plSeed, l.BlockBytes()) }
	var acked []engine.BlockID
	n := 0
	for round := 0; round < 8; round++ {
		ids := make([]engine.BlockID, 5)
		src := make([][]byte, len(ids))
		for i := range ids {
			n++
			ids[i] = workload.ID(plSeed, 1, workload.Whole, n)
			src[i] = block(ids[i])
		}
		state.mark(state.started, ids...)
		if round%4 == 1 {
			// Layer-wise (rounds 1 and 5): one layer-major batch record, which demotion and
			// compaction move as batch records again.
			for sh := 0; sh < l.Shards; sh++ {
				shards := make([][]byte, len(ids))
				for i := range ids {
					shards[i] = src[i][int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]
				}
				if err := e.DumpShard(ids, sh, shards).Wait(); err != nil {
					t.Fatal(err)
				}
			}
		} else if err := e.Dump(ids, src).Wait(); err != nil {
			t.Fatal(err)
		}
		if keeps {
			state.mark(state.required, ids...)
		}
		acked = append(acked, ids...)
		// Sidecars of the first three: they must follow their blocks through demotion,
		// promotion, compaction and eviction.
		if err := dumpPLSidecars(e, state, ids[:3]...); err != nil && (keeps || !errors.Is(err, engine.ErrNotFound)) {
			t.Fatal(err) // without a second tier a block may be evicted before its sidecar comes
		}
		if keeps {
			// Required beside their blocks, as the blocks are (the check loads them while
			// the recovered store's reclaimer demotes and compacts: docs/sidecars.md).
			state.mark(state.sideRequired, ids[:3]...)
		}
		// A hit on an old block promotes it back when it was demoted.
		old := acked[(round*3)%len(acked)]
		dst := devio.AlignedBuffer(int(l.BlockBytes()))
		if err := e.Load([]engine.BlockID{old}, [][]byte{dst}).Wait(); err != nil && keeps {
			t.Fatal(err)
		}
		switch round % 3 {
		case 1:
			if _, err := e.Evict("ssd", 256<<10); err != nil {
				t.Fatal(err)
			}
		case 2:
			if _, err := e.Compact(0.6, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := e.Stats()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	cp.mu.Lock()
	cp.armed = false
	fig := cp.fig
	cp.mu.Unlock()
	if st.EvictedBlocks == 0 || st.SegmentsRetired == 0 || st.BatchRecords == 0 {
		t.Fatalf("the workload reclaimed nothing or wrote no batch record: %+v", st)
	}
	if _, err := checkRecovered(mem.CrashClone(vfs.CrashCloneCfg{}), cp.opts, state.snapshot()); err != nil {
		t.Fatal(err)
	}
	t.Logf("powerloss reclamation: %d crash points, %d recoveries checked (%d after a crash during recovery), %d block loads verified; %d blocks evicted, %d segments retired, %d promotions, %v",
		fig.points, fig.recoveries, fig.nested, fig.blocksChecked, st.EvictedBlocks, st.SegmentsRetired, st.Promotions, time.Since(start).Round(time.Millisecond))
}
