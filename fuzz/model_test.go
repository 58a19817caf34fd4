package fuzz

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
)

// The model's world: 8 block ids, blocks of 2 shards × 4 KiB, 128 KiB segments (9 records
// each, so segments rotate within a few dozen dumps).
const (
	modelIDs      = 8
	modelMaxOps   = 64 // ops per input; the rest of a longer input is ignored
	modelMaxOpens = 4  // close+reopen and crash ops per input (each opens the index)
)

var modelLayout = engine.Layout{Shards: 2, TensorsPerShard: 2, ShardBytes: 4096}

var modelSchema = engine.Schema{Model: "fuzz-model", DType: "bfloat16", KVLayout: "mha", TPRank: 0, TPSize: 1, BlockTokens: 16}

func modelID(i int) engine.BlockID { return md5.Sum([]byte(fmt.Sprintf("model-block-%d", i))) }

// modelPayload is block i's bytes: a function of the id alone, so every dump of a block
// (whole, shard by shard, after Create) writes the same bytes.
func modelPayload(i int) []byte {
	b := make([]byte, modelLayout.BlockBytes())
	id := modelID(i)
	x := binary.LittleEndian.Uint64(id[:8]) | 1
	for j := 0; j+8 <= len(b); j += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[j:], x)
	}
	return b
}

func modelShard(i, sh int) []byte {
	return modelPayload(i)[int64(sh)*modelLayout.ShardBytes : int64(sh+1)*modelLayout.ShardBytes]
}

// Op codes: an input is a sequence of (op, arg) byte pairs; op%opCount picks the operation,
// op/opCount is an extra parameter (a shard, a length). Masks select ids by bit.
const (
	opDump         = iota // Dump(mask)
	opDumpPair            // Dump([a, b]), a = arg&7, b = arg>>3&7 (may be equal)
	opDumpShard           // DumpShard([arg&7], shard x&1)
	opCreate              // Create(mask)
	opCommitTrue          // Commit(mask, true)
	opCommitFalse         // Commit(mask, false)
	opLoad                // Load(mask)
	opLoadShard           // LoadShard(mask, shard x&1)
	opLookup              // Lookup(mask)
	opLookupPrefix        // LookupPrefix(x%9 ids from arg&7, stepping by arg>>3|1)
	opReopen              // Close, Open
	opCrash               // CrashClone with no unsynced data, Open on the clone
	opEvict               // Evict the first tier down to (x%4)×64 KiB: its blocks demote
	opCompact             // Compact at live ratio (x%9+1)/10
	opDumpSidecars        // DumpSidecars(kind x&1+1, mask minus the blocks in assembly)
	opLoadSidecars        // LoadSidecars(kind x&1+1, part x>>1&1, mask)
	opCount
)

// Sidecars of the model: two kinds, two parts (one per shard) of 200 bytes, a function of
// (block, kind).
const modelSidePart = 200

func modelSidecar(i int, kind engine.SidecarKind) []byte {
	p := modelPayload(i)
	out := make([]byte, 2*modelSidePart)
	for j := range out {
		out[j] = p[j] ^ byte(kind)*0x5b
	}
	return out
}

var opNames = [opCount]string{"dump", "dump-pair", "dump-shard", "create", "commit-true", "commit-false", "load",
	"load-shard", "lookup", "lookup-prefix", "reopen", "crash", "evict", "compact", "dump-sidecars", "load-sidecars"}

// model is what the engine must hold.
type model struct {
	stored  [modelIDs]bool
	side    [modelIDs][3]bool // sidecar of kind 1, 2 stored
	staging [modelIDs][]bool  // layer-wise dump in progress: shards arrived (nil: none)
	created [modelIDs][]bool  // created, not committed: shards arrived (nil: not created)
}

func (m *model) stagingCount() int {
	n := 0
	for i := range m.staging {
		if m.staging[i] != nil || m.created[i] != nil {
			n++
		}
	}
	return n
}

func (m *model) forgetStaging() {
	m.staging = [modelIDs][]bool{}
	m.created = [modelIDs][]bool{}
}

func all(b []bool) bool {
	for _, x := range b {
		if !x {
			return false
		}
	}
	return true
}

func maskIDs(mask byte) (idx []int, ids []engine.BlockID) {
	for i := 0; i < modelIDs; i++ {
		if mask&(1<<i) != 0 {
			idx = append(idx, i)
			ids = append(ids, modelID(i))
		}
	}
	return idx, ids
}

// dumpWhole applies a successful whole-block dump of block i to the model.
func (m *model) dumpWhole(i int) {
	switch {
	case m.stored[i]:
	case m.created[i] != nil:
		for sh := range m.created[i] {
			m.created[i][sh] = true
		}
	default:
		// A layer-wise block in assembly is completed by the whole dump.
		m.staging[i] = nil
		m.stored[i] = true
	}
}

func modelOptions(fs vfs.FS) engine.Options {
	return engine.Options{Layout: modelLayout, Schema: modelSchema, FS: fs, SegmentSize: 2 * engine.MinSegmentSize,
		SyncPolicy: engine.SyncAlways, IOEngine: devio.EnginePsync, DirectIO: devio.DirectOff, QueueDepth: 8,
		TaskTimeout: time.Hour, // staged blocks must not expire under the model
		// Two tiers: eviction of the first demotes to the unlimited second, so no op ever
		// drops a block and the model stays exact; loads from the second promote back.
		Tiers: []tiers.Config{
			{Name: "hot", Kind: tiers.KindDisk, Paths: []string{"/store"}, Capacity: 8 * engine.MinSegmentSize},
			{Name: "cold", Kind: tiers.KindDisk, Paths: []string{"/cold"}},
		}}
}

// engineRun is one input's run: the engine under test, its file system and the model.
type engineRun struct {
	t     *testing.T
	mem   *vfs.MemFS
	e     *engine.Engine
	m     model
	trace []string
}

func (r *engineRun) fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("after ops [%s]: %s", strings.Join(r.trace, " "), fmt.Sprintf(format, args...))
}

func (r *engineRun) open() {
	r.t.Helper()
	e, err := engine.Open("/store", modelOptions(r.mem))
	if err != nil {
		r.fatalf("open: %v", err)
	}
	r.e = e
}

func (r *engineRun) close() {
	if r.e != nil {
		if err := r.e.Close(); err != nil {
			r.fatalf("close: %v", err)
		}
		r.e = nil
	}
}

// check compares every id's visibility, the block count and the staging count with the model.
func (r *engineRun) check() {
	r.t.Helper()
	_, ids := maskIDs(0xff)
	hits := r.e.Lookup(ids)
	for i, hit := range hits {
		if hit != r.m.stored[i] {
			r.fatalf("block %d: lookup %v, model %v", i, hit, r.m.stored[i])
		}
	}
	want := 0
	for _, s := range r.m.stored {
		if s {
			want++
		}
	}
	st := r.e.Stats()
	if partial := st.StagingBlocks + st.BatchOpenBlocks; st.Blocks != int64(want) || partial != r.m.stagingCount() {
		r.fatalf("stats: %d blocks, %d partly dumped (%d staged, %d in open batch records); model %d, %d",
			st.Blocks, partial, st.StagingBlocks, st.BatchOpenBlocks, want, r.m.stagingCount())
	}
}

// wantLoad checks a load's per-block outcome: the block's bytes, or ErrNotFound.
func (r *engineRun) wantLoad(i int, err error, got, want []byte) {
	r.t.Helper()
	if r.m.stored[i] {
		if err != nil {
			r.fatalf("load of stored block %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			r.fatalf("load of block %d: bytes differ", i)
		}
	} else if !errors.Is(err, engine.ErrNotFound) {
		r.fatalf("load of absent block %d: %v, want ErrNotFound", i, err)
	}
}

func (r *engineRun) step(op, x, arg byte) {
	r.t.Helper()
	m := &r.m
	switch op {
	case opDump, opDumpPair:
		var idx []int
		var ids []engine.BlockID
		if op == opDump {
			idx, ids = maskIDs(arg)
		} else {
			idx = []int{int(arg & 7), int(arg >> 3 & 7)}
			ids = []engine.BlockID{modelID(idx[0]), modelID(idx[1])}
		}
		src := make([][]byte, len(ids))
		for k, i := range idx {
			src[k] = modelPayload(i)
		}
		task := r.e.Dump(ids, src)
		if err := task.Wait(); err != nil {
			r.fatalf("dump %v: %v", idx, err)
		}
		for _, i := range idx {
			m.dumpWhole(i)
		}
	case opDumpShard:
		i, sh := int(arg&7), int(x&1)
		if err := r.e.DumpShard([]engine.BlockID{modelID(i)}, sh, [][]byte{modelShard(i, sh)}).Wait(); err != nil {
			r.fatalf("dump shard %d of %d: %v", sh, i, err)
		}
		switch {
		case m.stored[i]:
		case m.created[i] != nil:
			m.created[i][sh] = true
		default:
			if m.staging[i] == nil {
				m.staging[i] = make([]bool, modelLayout.Shards)
			}
			m.staging[i][sh] = true
			if all(m.staging[i]) {
				m.staging[i] = nil
				m.stored[i] = true
			}
		}
	case opCreate:
		idx, ids := maskIDs(arg)
		errs := r.e.Create(ids)
		if len(errs) != len(ids) {
			r.fatalf("create: %d errors for %d ids", len(errs), len(ids))
		}
		for k, i := range idx {
			busy := m.stored[i] || m.staging[i] != nil || m.created[i] != nil
			switch {
			case busy && !errors.Is(errs[k], engine.ErrExists):
				r.fatalf("create of block %d (stored %v, staging %v, created %v): %v, want ErrExists",
					i, m.stored[i], m.staging[i] != nil, m.created[i] != nil, errs[k])
			case !busy && errs[k] != nil:
				r.fatalf("create of block %d: %v", i, errs[k])
			case !busy:
				m.created[i] = make([]bool, modelLayout.Shards)
			}
		}
	case opCommitTrue, opCommitFalse:
		ok := op == opCommitTrue
		idx, ids := maskIDs(arg)
		err := r.e.Commit(ids, ok)
		wantNotFound, wantFailed := false, false
		for _, i := range idx {
			switch {
			case m.created[i] == nil:
				wantNotFound = true
			case !ok:
			case !all(m.created[i]):
				wantFailed = true
			default:
				m.stored[i] = true
			}
			m.created[i] = nil
		}
		if (err == nil) != (!wantNotFound && !wantFailed) || errors.Is(err, engine.ErrNotFound) != wantNotFound ||
			errors.Is(err, engine.ErrBlockFailed) != wantFailed {
			r.fatalf("commit(%v) %v: %v; model: not found %v, block failed %v", ok, idx, err, wantNotFound, wantFailed)
		}
	case opLoad:
		idx, ids := maskIDs(arg)
		dst := make([][]byte, len(ids))
		for k := range dst {
			dst[k] = devio.AlignedBuffer(int(modelLayout.BlockBytes()))
		}
		task := r.e.Load(ids, dst)
		_ = task.Wait()
		errs := task.BlockErrors()
		for k, i := range idx {
			r.wantLoad(i, errs[k], dst[k], modelPayload(i))
		}
	case opLoadShard:
		sh := int(x & 1)
		idx, ids := maskIDs(arg)
		dst := make([][]byte, len(ids))
		for k := range dst {
			dst[k] = make([]byte, modelLayout.ShardBytes)
		}
		task := r.e.LoadShard(ids, sh, dst)
		_ = task.Wait()
		errs := task.BlockErrors()
		for k, i := range idx {
			r.wantLoad(i, errs[k], dst[k], modelShard(i, sh))
		}
	case opLookup:
		idx, ids := maskIDs(arg)
		for k, hit := range r.e.Lookup(ids) {
			if hit != m.stored[idx[k]] {
				r.fatalf("lookup of block %d: %v, model %v", idx[k], hit, m.stored[idx[k]])
			}
		}
	case opLookupPrefix:
		n, start, stride := int(x)%9, int(arg&7), int(arg>>3|1)
		ids := make([]engine.BlockID, n)
		want := -1
		for k := range ids {
			i := (start + k*stride) % modelIDs
			ids[k] = modelID(i)
			if want < 0 && !m.stored[i] {
				want = k
			}
		}
		if want < 0 {
			want = n
		}
		if got := r.e.LookupPrefix(ids); got != want {
			r.fatalf("lookup prefix of %d ids from %d step %d: %d, model %d", n, start, stride, got, want)
		}
	case opReopen:
		r.close()
		m.forgetStaging()
		r.open()
	case opEvict:
		if _, err := r.e.Evict("hot", int64(x%4)*engine.MinSegmentSize); err != nil {
			r.fatalf("evict: %v", err)
		}
	case opCompact:
		if _, err := r.e.Compact(float64(x%9+1)/10, nil); err != nil {
			r.fatalf("compact: %v", err)
		}
	case opDumpSidecars:
		kind := engine.SidecarKind(x&1 + 1)
		var idx []int
		var ids []engine.BlockID
		var src [][]byte
		for i := range modelIDs {
			// A block in assembly would make the dump wait for it (this model never times
			// out): its sidecars are dumped once it is stored.
			if arg&(1<<i) != 0 && m.staging[i] == nil && m.created[i] == nil {
				idx, ids, src = append(idx, i), append(ids, modelID(i)), append(src, modelSidecar(i, kind))
			}
		}
		task := r.e.DumpSidecars(kind, 2, ids, src)
		_ = task.Wait()
		for k, err := range task.BlockErrors() {
			i := idx[k]
			switch {
			case m.stored[i] && err != nil:
				r.fatalf("sidecar %d of stored block %d: %v", kind, i, err)
			case !m.stored[i] && !errors.Is(err, engine.ErrNotFound):
				r.fatalf("sidecar %d of absent block %d: %v, want ErrNotFound", kind, i, err)
			case m.stored[i]:
				m.side[i][kind] = true
			}
		}
	case opLoadSidecars:
		kind, part := engine.SidecarKind(x&1+1), int(x>>1&1)
		idx, ids := maskIDs(arg)
		dst := make([]byte, len(ids)*modelSidePart)
		found, err := r.e.LoadSidecars(kind, part, ids, dst)
		if err != nil {
			r.fatalf("load sidecars: %v", err)
		}
		for k, i := range idx {
			want := m.stored[i] && m.side[i][kind]
			if found[k] != want {
				r.fatalf("sidecar %d of block %d: found %v, model %v", kind, i, found[k], want)
			}
			if want && !bytes.Equal(dst[k*modelSidePart:(k+1)*modelSidePart], modelSidecar(i, kind)[part*modelSidePart:(part+1)*modelSidePart]) {
				r.fatalf("sidecar %d of block %d part %d: bytes differ", kind, i, part)
			}
		}
	case opCrash:
		clone := r.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		_ = r.e.Close() // the old engine's writes go to the discarded file system
		r.e = nil
		r.mem = clone
		m.forgetStaging()
		r.open()
	}
}

// FuzzEngineOps runs a sequence of engine operations decoded from the input against a model
// (see the op codes above) and checks, after every op, that exactly the blocks the model holds
// are visible: an acknowledged dump or Commit(true) makes a block present; Commit(false), a
// Create never committed or a layer-wise block missing a shard leaves it absent; loads return
// the block's bytes or ErrNotFound; LookupPrefix is the model's leading run; close+reopen and
// a power loss (SyncAlways: every acknowledged block is durable) keep exactly the stored set and
// drop partly dumped blocks; eviction (demotion to a second tier), promotion and compaction
// never change it.
func FuzzEngineOps(f *testing.F) {
	for _, seed := range modelSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &engineRun{t: t, mem: vfs.NewCrashableMem()}
		r.open()
		defer func() {
			if r.e != nil {
				_ = r.e.Close()
			}
		}()
		opens := 0
		for p, nops := 0, 0; p < len(data) && nops < modelMaxOps; p, nops = p+2, nops+1 {
			op, x := data[p]%opCount, data[p]/opCount
			var arg byte
			if p+1 < len(data) {
				arg = data[p+1]
			}
			if op == opReopen || op == opCrash {
				if opens >= modelMaxOpens {
					continue
				}
				opens++
			}
			r.trace = append(r.trace, fmt.Sprintf("%s/%d/%#02x", opNames[op], x, arg))
			r.step(op, x, arg)
			r.check()
		}
		// Whatever the sequence, a final crash keeps exactly the stored set.
		r.trace = append(r.trace, "final-crash")
		r.step(opCrash, 0, 0)
		r.check()
	})
}

// modelSeeds are op sequences covering each operation; testdata/fuzz/FuzzEngineOps holds more.
var modelSeeds = [][]byte{
	{opDump, 0x0f, opLoad, 0xff, opLookupPrefix + 8*opCount, 0x08, opReopen, 0, opLoad, 0x0f},
	{opDumpShard, 0x01, opLookup, 0x01, opDumpShard + opCount, 0x01, opLoadShard + opCount, 0x01, opCrash, 0, opLoad, 0x01},
	{opCreate, 0x03, opDump, 0x01, opDumpShard, 0x02, opCommitTrue, 0x03, opLookup, 0x03, opCommitFalse, 0x01},
	{opCreate, 0x04, opDump, 0x04, opCommitFalse, 0x04, opLookup, 0x04, opCreate, 0x04, opCrash, 0, opCommitTrue, 0x04},
	{opDumpPair, 0x09, opDumpPair, 0x12, opDump, 0xff, opDump, 0xff, opCrash, 0, opLookupPrefix + 5*opCount, 0x1b},
	{opDump, 0xff, opEvict, 0, opLoad, 0x0f, opCompact + 8*opCount, 0, opCrash, 0, opLoad, 0xff, opEvict + opCount, 0, opReopen, 0},
	{opDump, 0x3f, opDumpSidecars, 0x0f, opDumpShard, 0x40, opDumpSidecars + opCount, 0xf0, opLoadSidecars, 0xff, opEvict, 0,
		opLoadSidecars + 2*opCount, 0xff, opCompact + 8*opCount, 0, opCrash, 0, opLoadSidecars + 3*opCount, 0xff, opLoadSidecars, 0x0f},
}

// TestBadShardOfStoredBlockFailsLaterDumps: a layer-wise dump with a wrong-sized buffer for a
// block that is already stored leaves a tombstone staging slot for it (engine.failSlot does
// not check the index, unlike stageShard), so the next dump of the intact, stored block fails
// with ErrBlockFailed and Stats counts a staging block that does not exist. Dump's contract is
// that dumping a stored block succeeds without writing it again.
func TestBadShardOfStoredBlockFailsLaterDumps(t *testing.T) {
	r := &engineRun{t: t, mem: vfs.NewCrashableMem()}
	r.open()
	defer r.close()
	id := []engine.BlockID{modelID(0)}
	if err := r.e.Dump(id, [][]byte{modelPayload(0)}).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := r.e.DumpShard(id, 0, [][]byte{make([]byte, 10)}).Wait(); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("wrong-sized shard: %v, want ErrInvalidArgument", err)
	}
	if n := r.e.Stats().StagingBlocks; n != 0 {
		t.Errorf("a stored block has a staging slot: %d staging blocks", n)
	}
	if err := r.e.Dump(id, [][]byte{modelPayload(0)}).Wait(); err != nil {
		t.Errorf("dump of the stored block: %v, want nil", err)
	}
	if !r.e.Lookup(id)[0] {
		t.Error("stored block lost")
	}
}
