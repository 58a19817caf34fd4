package engine

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/ucm-go/ucm/devio"
)

// crashState tracks, for every block of a workload, what a crash at any moment may and may
// not lose: set ⊆ recovered ⊆ set ∪ maybe.
type crashState struct {
	mu        sync.Mutex
	started   map[BlockID]bool // a dump was issued: may be present after a crash
	required  map[BlockID]bool // acknowledged durable: must be present after a crash
	discarded map[BlockID]bool // committed false: must never be visible
}

func newCrashState() *crashState {
	return &crashState{started: map[BlockID]bool{}, required: map[BlockID]bool{}, discarded: map[BlockID]bool{}}
}

func (s *crashState) snapshot() (started, required, discarded map[BlockID]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := func(m map[BlockID]bool) map[BlockID]bool {
		out := make(map[BlockID]bool, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	return cp(s.started), cp(s.required), cp(s.discarded)
}

func (s *crashState) mark(m map[BlockID]bool, ids ...BlockID) {
	s.mu.Lock()
	for _, id := range ids {
		m[id] = true
	}
	s.mu.Unlock()
}

// crashPoints is an errorfs injector that, before every mutating file-system operation,
// simulates a power loss: it clones the crash-simulating file system keeping only synced data
// (and again keeping a random half of the unsynced 4 KiB blocks), recovers a store from each
// clone and checks it against the workload's state at that moment.
type crashPoints struct {
	t     *testing.T
	mem   *vfs.MemFS
	state *crashState
	opts  Options

	mu      sync.Mutex
	armed   bool
	n       int
	checked int
	failed  bool
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
	c.n++
	started, required, discarded := c.state.snapshot()
	for _, pct := range []int{0, 50} {
		clone := c.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(c.n), uint64(pct)))})
		if err := checkRecovered(clone, c.opts, started, required, discarded); err != nil {
			c.failed = true
			c.t.Errorf("crash before write op %d (%v %s), unsynced kept %d%%: %v", c.n, op.Kind, op.Path, pct, err)
			return nil
		}
		c.checked++
	}
	return nil
}

// checkRecovered opens a store on a crashed file system and checks the crash contract.
func checkRecovered(fs vfs.FS, opts Options, started, required, discarded map[BlockID]bool) error {
	opts.FS = fs
	e, err := Open("/store", opts)
	if err != nil {
		return fmt.Errorf("recovery failed: %w", err)
	}
	defer e.Close()
	var all []BlockID
	for id := range started {
		all = append(all, id)
	}
	for id := range discarded {
		all = append(all, id)
	}
	hits := e.Lookup(all)
	l := e.Layout()
	for i, id := range all {
		switch {
		case required[id] && !hits[i]:
			return fmt.Errorf("acknowledged block %s lost", id)
		case discarded[id] && hits[i]:
			return fmt.Errorf("discarded block %s visible", id)
		case !hits[i]:
			continue
		}
		dst := devio.AlignedBuffer(int(l.BlockBytes()))
		if err := e.Load([]BlockID{id}, [][]byte{dst}).Wait(); err != nil {
			return fmt.Errorf("visible block %s does not load: %w", id, err)
		}
		if !bytes.Equal(dst, blockBytes(l, id)) {
			return fmt.Errorf("block %s recovered with wrong bytes", id)
		}
	}
	if err := e.ix.CheckAccounting(); err != nil {
		return fmt.Errorf("accounting after recovery: %w", err)
	}
	if err := fileSizesMatch(fs, e); err != nil {
		return err
	}
	return nil
}

func fileSizesMatch(fs vfs.FS, e *Engine) error {
	var total int64
	names, err := fs.List(e.segDir)
	if err != nil {
		return err
	}
	for _, n := range names {
		st, err := fs.Stat(fs.PathJoin(e.segDir, n))
		if err != nil {
			return err
		}
		total += st.Size()
	}
	if _, _, fileBytes := e.ix.Totals(); fileBytes != total {
		return fmt.Errorf("accounted file bytes %d, segment files hold %d", fileBytes, total)
	}
	return nil
}

// TestCrashAtEveryWrite runs a workload of whole-block, layer-wise and V0 dumps across
// several segment rotations and simulates a power loss before every mutating file-system
// operation (segment writes and syncs, directory syncs, Pebble's WAL and manifest): after
// recovery every acknowledged block is present and byte-identical, no torn, discarded or
// never-dumped block is visible, and the space accounting equals the files.
func TestCrashAtEveryWrite(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncInterval} {
		t.Run(policy.String(), func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			state := newCrashState()
			l := Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 4096}
			opts := testOptions(nil, l)
			opts.SegmentSize = 128 << 10 // 5 records a segment: many rotations
			opts.SyncPolicy = policy
			cp := &crashPoints{t: t, mem: mem, state: state, opts: opts}
			opts.FS = errorfs.Wrap(mem, cp)
			if policy == SyncInterval {
				opts.SyncInterval = 1 << 40 // no periodic sync: only the workload's explicit Sync calls
			}
			cp.opts.SyncInterval = opts.SyncInterval
			e := mustOpen(t, "/store", opts)
			cp.mu.Lock()
			cp.armed = true
			cp.mu.Unlock()

			ack := func(ids ...BlockID) {
				if policy == SyncAlways {
					state.mark(state.required, ids...)
				}
			}
			var acked []BlockID
			n := 0
			next := func() BlockID { n++; return blockID(n) }
			for round := 0; round < 6; round++ {
				// Whole blocks, two per task.
				a, b := next(), next()
				state.mark(state.started, a, b)
				if err := e.Dump([]BlockID{a, b}, [][]byte{blockBytes(l, a), blockBytes(l, b)}).Wait(); err != nil {
					t.Fatal(err)
				}
				ack(a, b)
				acked = append(acked, a, b)
				// Layer-wise, shards in reverse order.
				c := next()
				full := blockBytes(l, c)
				state.mark(state.started, c)
				for sh := l.Shards - 1; sh >= 0; sh-- {
					if err := e.DumpShard([]BlockID{c}, sh, [][]byte{full[int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]}).Wait(); err != nil {
						t.Fatal(err)
					}
				}
				ack(c)
				acked = append(acked, c)
				// V0: one committed, one discarded.
				d, x := next(), next()
				if errs := e.Create([]BlockID{d, x}); errs[0] != nil || errs[1] != nil {
					t.Fatal(errs)
				}
				state.mark(state.discarded, x)
				if err := e.Dump([]BlockID{d, x}, [][]byte{blockBytes(l, d), blockBytes(l, x)}).Wait(); err != nil {
					t.Fatal(err)
				}
				state.mark(state.started, d)
				if err := e.Commit([]BlockID{d}, true); err != nil {
					t.Fatal(err)
				}
				ack(d)
				acked = append(acked, d)
				if err := e.Commit([]BlockID{x}, false); err != nil {
					t.Fatal(err)
				}
				// A duplicate of an acknowledged block.
				if err := e.Dump([]BlockID{a}, [][]byte{blockBytes(l, a)}).Wait(); err != nil {
					t.Fatal(err)
				}
				if policy == SyncInterval && round%2 == 1 {
					if err := e.Sync(); err != nil {
						t.Fatal(err)
					}
					state.mark(state.required, acked...)
				}
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			state.mark(state.required, acked...) // a clean Close makes everything durable
			cp.mu.Lock()
			cp.armed = false
			t.Logf("%s: %d crash points, %d recoveries checked", policy, cp.n, cp.checked)
			cp.mu.Unlock()
			// And after the clean close, a final check.
			started, required, discarded := state.snapshot()
			if err := checkRecovered(mem.CrashClone(vfs.CrashCloneCfg{}), cp.opts, started, required, discarded); err != nil {
				t.Fatal(err)
			}
		})
	}
}
