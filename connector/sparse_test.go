package connector

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/sparse"
	"gopkg.in/yaml.v3"
)

// selShape is the test model: 4 layers (the worker store's 4 shards), GQA 2:1.
var selShape = sparse.Shape{Layers: 4, QHeads: 4, KVHeads: 2, HeadDim: 16, BlockSize: 16}

func methodConfig(t testing.TB, name, text string) sparse.MethodConfig {
	t.Helper()
	var node *yaml.Node
	if text != "" {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			t.Fatal(err)
		}
		node = doc.Content[0]
	}
	cfg, err := sparse.ParseMethodConfig(name, node)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newSelector(t testing.TB, s *Store, name, text string) *Selector {
	t.Helper()
	x, err := s.NewSelector(methodConfig(t, name, text), selShape)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return x
}

// randomK is float16 K for n blocks: [block][layer][bs][kv][dim] bytes, block i's values
// drawn around a per-block direction so that blocks score differently.
func randomK(n int, seed uint64) [][][]byte {
	r := rand.New(rand.NewPCG(seed, 7))
	sh := selShape
	out := make([][][]byte, n)
	for i := range out {
		bias := float32(r.NormFloat64())
		out[i] = make([][]byte, sh.Layers)
		for l := range out[i] {
			b := make([]byte, sh.BlockSize*sh.KVHeads*sh.HeadDim*2)
			for j := 0; j < len(b); j += 2 {
				h := kernels.Float32ToFloat16(float32(r.NormFloat64()) + bias*float32(j%7))
				b[j], b[j+1] = byte(h), byte(h>>8)
			}
			out[i][l] = b
		}
	}
	return out
}

// referencePayload is what the dump path writes for one block (lab/loop's writer).
func referencePayload(t testing.TB, spec kernels.SidecarSpec, k [][]byte) []byte {
	t.Helper()
	w, err := kernels.NewSidecarWriter(spec, kernels.Float16)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Begin(spec.BlockSize); err != nil {
		t.Fatal(err)
	}
	for l, b := range k {
		if err := w.AddLayer(l, b); err != nil {
			t.Fatal(err)
		}
	}
	p, err := w.AppendPayload(nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func loadReprsAll(t testing.TB, x *Selector, layer int, ids []engine.BlockID) ([]float32, []bool) {
	t.Helper()
	dst := make([]float32, len(ids)*x.Layout().LayerFloats())
	found, err := x.LoadReprs(layer, ids, dst)
	if err != nil {
		t.Fatal(err)
	}
	return dst, found
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// methodCases covers every block-scoring method, with a configuration that selects (not
// dense) on 16-block contexts.
var methodCases = []struct{ name, cfg string }{
	{"ESA", "pool: mean\nsparse_ratio: 0.3\n"},
	{"ESA", "pool: max\nhead_select: kv\nhead_score: softmax\nsparse_ratio: 0.3\n"},
	{"ESA", "retrieval_lag: 1\nsparse_ratio: 0.3\n"},                // a step attends the previous step's retrieval
	{"KVStarMultiStep", "sparse_ratio: 0.5\nretrieval_stride: 2\n"}, // selections held for 2 steps
	{"Quest", "sparse_ratio: 0.3\n"},
	{"GSA", "sparse_ratio: 0.3\n"},
	{"KVStarMultiStep", "sparse_ratio: 0.3\nretrieval_stride: 1\ninit_window_sz: 1\nlocal_window_sz: 2\n"},
	{"GSAOnDevice", "hash_topk_tokens: 64\nsink_token: 16\nrecent_token: 32\nhash_bits: 16\n"},
}

// TestSelectorDumpLoadSurvivesRestart: for every method, representations computed by DumpReprs
// are the bytes the dump path's writer makes, read back by block id; after the store is closed
// and reopened the same values load; a block that is not stored fails alone (its dump with
// ErrNotFound in the failure mask, its load not found), the others are kept.
func TestSelectorDumpLoadSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ids := randomIDs(6)
	k := randomK(len(ids), 1)
	missing := randomIDs(1)[0]
	s := openStore(t, workerJSON(dir, 0, ""))
	dumpLayers(t, s, ids, 0)
	want := map[string][][]float32{} // per case, per layer
	for ci, c := range methodCases {
		x := newSelector(t, s, c.name, c.cfg)
		callIDs := append([]engine.BlockID{missing}, ids...)
		task, err := x.DumpReprs(callIDs, append([][][]byte{k[0]}, k...), kernels.Float16)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		failed := make([]bool, len(callIDs))
		err = s.Wait(task, failed)
		if !errors.Is(err, engine.ErrNotFound) || !failed[0] || strings.Count(fmt.Sprint(failed), "true") != 1 {
			t.Fatalf("%s: dump with a block not stored: %v, failed %v", c.name, err, failed)
		}
		key := fmt.Sprint(ci)
		for l := range selShape.Layers {
			got, found := loadReprsAll(t, x, l, callIDs)
			if found[0] || !all(found[1:]) {
				t.Fatalf("%s layer %d: found %v", c.name, l, found)
			}
			for j, v := range got[:x.Layout().LayerFloats()] {
				if v != 0 {
					t.Fatalf("%s: the missing block's values are not zero (%d: %v)", c.name, j, v)
				}
			}
			// The reference: decode the writer's payload of each block.
			per := x.Layout().LayerFloats()
			for i := range ids {
				ref := referencePayload(t, x.Spec(), k[i])
				off, n, _ := x.Spec().LayerRange(l)
				one := make([]float32, per)
				ch := make([]uint16, 0)
				if x.Spec().Kind == kernels.SidecarKVStar {
					ch = make([]uint16, x.Spec().Heads*x.Spec().Cols())
				}
				if !x.decodePart(ref[off:off+n], l, one, ch) {
					t.Fatalf("%s: reference part does not decode", c.name)
				}
				if !sameBits(one, got[(i+1)*per:(i+2)*per]) {
					t.Fatalf("%s layer %d block %d: loaded values differ from the writer's", c.name, l, i)
				}
			}
			want[key] = append(want[key], got)
		}
	}
	s.Close()
	s = openStore(t, workerJSON(dir, 0, ""))
	for ci, c := range methodCases {
		x := newSelector(t, s, c.name, c.cfg)
		for l := range selShape.Layers {
			got, found := loadReprsAll(t, x, l, append([]engine.BlockID{missing}, ids...))
			if found[0] || !all(found[1:]) || !sameBits(got, want[fmt.Sprint(ci)][l]) {
				t.Fatalf("%s layer %d after reopening: found %v, same values %v", c.name, l, found, sameBits(got, want[fmt.Sprint(ci)][l]))
			}
		}
	}
}

// TestSelectorSelectEqualsHooks: Select answers exactly what the method's AttentionBegin
// answers over the same representations (here an in-memory source with the writer's
// payloads), step after step, per KV head too, for every method.
func TestSelectorSelectEqualsHooks(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	const nBlocks = 16
	ids := randomIDs(nBlocks - 1) // the last block is partial: no id
	k := randomK(len(ids), 2)
	dumpLayers(t, s, ids, 0)
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range methodCases {
		x := newSelector(t, s, c.name, c.cfg)
		task, err := x.DumpReprs(ids, k, kernels.Float16)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(task, nil); err != nil {
			t.Fatal(err)
		}
		src := &sparse.MapSidecars{}
		for i, id := range ids {
			if err := src.Put(engine.SidecarKind(x.Spec().Kind), id, selShape.Layers, referencePayload(t, x.Spec(), k[i])); err != nil {
				t.Fatal(err)
			}
		}
		hooks, err := sparse.New(methodConfig(t, c.name, c.cfg), sparse.Env{Role: sparse.RoleWorker, Shape: selShape, Sidecars: src})
		if err != nil {
			t.Fatal(err)
		}
		selected := 0
		for step := range 3 {
			seqLen := (nBlocks-1)*selShape.BlockSize + 1 + step
			for layer := range selShape.Layers {
				q := make([]float32, selShape.QHeads*selShape.HeadDim)
				for i := range q {
					q[i] = float32(r.NormFloat64())
				}
				got, err := x.Select(SelectArgs{Request: "r", Layer: layer, Step: step, Q: q, IDs: ids, SeqLen: seqLen})
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				table := make([]int, nBlocks)
				for i := range table {
					table[i] = i
				}
				a := &sparse.Attention{Layer: layer, LayerName: fmt.Sprintf("model.layers.%d.self_attn", layer), Phase: sparse.PhaseDecode, Step: step,
					Request: &sparse.Request{ID: "r", NumOutputTokens: step, BlockIDs: ids}, Q: q, BlockTable: table, SeqLen: seqLen}
				if err := hooks.AttentionBegin(a); err != nil {
					t.Fatal(err)
				}
				want := a.Selected
				if want == nil {
					want = table
				}
				if !reflect.DeepEqual(got.Blocks, want) || len(got.Heads) != len(a.HeadSelected) || (a.HeadSelected != nil && !reflect.DeepEqual(got.Heads, a.HeadSelected)) {
					t.Fatalf("%s step %d layer %d: selector %v %v, hooks %v %v", c.name, step, layer, got.Blocks, got.Heads, want, a.HeadSelected)
				}
				if got.Dense != (a.Selected == nil) {
					t.Fatalf("%s: dense %v", c.name, got.Dense)
				}
				if !got.Dense {
					selected++
				}
				_ = hooks.AttentionFinished(a)
			}
		}
		if selected == 0 {
			t.Fatalf("%s: every step was dense: the case proves nothing", c.name)
		}
		_ = hooks.Close()
		if err := x.RequestFinished("r"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSelectorPutReprs: precomputed representations in the float32 layout load back exactly
// (values float16 can hold), for every kind; bad layouts are refused naming the block.
func TestSelectorPutReprs(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range methodCases {
		// Fresh blocks: a block's representation of a kind, once stored, is kept (ESA mean and
		// GSA share one).
		ids := randomIDs(3)
		dumpLayers(t, s, ids, 0)
		x := newSelector(t, s, c.name, c.cfg)
		lay := x.Layout()
		reprs := make([][]float32, len(ids))
		for i := range reprs {
			v := make([]float32, lay.BlockFloats())
			for j := range v {
				switch lay.Kind {
				case kernels.SidecarHash:
					v[j] = float32(r.IntN(256))
				default:
					v[j] = float32(r.IntN(2048)-1024) / 64 // float16-exact
				}
			}
			if lay.Kind == kernels.SidecarKVStar {
				for l := range lay.Layers {
					for h := range lay.Heads {
						for c := range lay.Cols {
							v[l*lay.LayerFloats()+h*lay.Cols+c] = float32(2 * c) // ascending, < dim
						}
					}
				}
			}
			reprs[i] = v
		}
		task, err := x.PutReprs(ids, reprs)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := s.Wait(task, nil); err != nil {
			t.Fatal(err)
		}
		for l := range lay.Layers {
			got, found := loadReprsAll(t, x, l, ids)
			if !all(found) {
				t.Fatalf("%s: found %v", c.name, found)
			}
			for i := range ids {
				if !sameBits(got[i*lay.LayerFloats():(i+1)*lay.LayerFloats()], reprs[i][l*lay.LayerFloats():(l+1)*lay.LayerFloats()]) {
					t.Fatalf("%s layer %d block %d: loaded values differ from those put", c.name, l, i)
				}
			}
		}
		// A short row, and (float kinds) a value float16 cannot hold.
		bad := [][]float32{reprs[0], reprs[1][:len(reprs[1])-1]}
		if _, err := x.PutReprs(ids[:2], bad); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), "position 1") {
			t.Fatalf("%s: short representation: %v", c.name, err)
		}
		if lay.Kind != kernels.SidecarHash {
			nan := append([]float32(nil), reprs[0]...)
			nan[len(nan)-1] = float32(math.NaN())
			if _, err := x.PutReprs(ids[:1], [][]float32{nan}); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), "finite") {
				t.Fatalf("%s: a NaN: %v", c.name, err)
			}
		}
		big := append([]float32(nil), reprs[0]...)
		big[len(big)-1] = 1e9
		if _, err := x.PutReprs(ids[:1], [][]float32{big}); !errors.Is(err, engine.ErrInvalidArgument) || StatusOf(err) != StatusEParam {
			t.Fatalf("%s: a value out of range: %v", c.name, err)
		}
	}
}

// TestSelectorBadInput: every malformed call is ErrInvalidArgument (EPARAM) naming the field.
func TestSelectorBadInput(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	x := newSelector(t, s, "ESA", "")
	ids := randomIDs(2)
	q := make([]float32, selShape.QHeads*selShape.HeadDim)
	k := randomK(2, 9)
	okArgs := SelectArgs{Request: "r", Layer: 0, Q: q, IDs: ids, SeqLen: 40}
	mod := func(f func(a *SelectArgs)) SelectArgs { a := okArgs; f(&a); return a }
	cases := []struct {
		what string
		err  error
	}{
		{"request id", func() error { _, err := x.Select(mod(func(a *SelectArgs) { a.Request = "" })); return err }()},
		{"layer 4", func() error { _, err := x.Select(mod(func(a *SelectArgs) { a.Layer = 4 })); return err }()},
		{"step -1", func() error { _, err := x.Select(mod(func(a *SelectArgs) { a.Step = -1 })); return err }()},
		{"query of 63", func() error { _, err := x.Select(mod(func(a *SelectArgs) { a.Q = q[:63] })); return err }()},
		{"query value 3", func() error {
			_, err := x.Select(mod(func(a *SelectArgs) { a.Q = append([]float32(nil), q...); a.Q[3] = float32(math.NaN()) }))
			return err
		}()},
		{"seq_len 0", func() error { _, err := x.Select(mod(func(a *SelectArgs) { a.SeqLen = 0 })); return err }()},
		{"2 block ids for seq_len 16", func() error { _, err := x.Select(mod(func(a *SelectArgs) { a.SeqLen = 16 })); return err }()},
		{"position 1: zero block id", func() error {
			_, err := x.Select(mod(func(a *SelectArgs) { a.IDs = []engine.BlockID{ids[0], {}} }))
			return err
		}()},
		{"K dtype", func() error { _, err := x.DumpReprs(ids, k, 0); return err }()},
		{"position 1", func() error { _, err := x.DumpReprs(ids, [][][]byte{k[0], k[1][:3]}, kernels.Float16); return err }()},
		{"layer 2: K of 5 bytes", func() error {
			kk := [][][]byte{k[0], {k[1][0], k[1][1], k[1][2][:5], k[1][3]}}
			_, err := x.DumpReprs(ids, kk, kernels.Float16)
			return err
		}()},
		{"layer 9", func() error { _, err := x.LoadReprs(9, ids, make([]float32, 64)); return err }()},
		{"destination of 3 floats", func() error { _, err := x.LoadReprs(0, ids, make([]float32, 3)); return err }()},
	}
	for _, c := range cases {
		if !errors.Is(c.err, engine.ErrInvalidArgument) || StatusOf(c.err) != StatusEParam || !strings.Contains(c.err.Error(), c.what) {
			t.Errorf("%s: %v", c.what, c.err)
		}
	}
	if _, err := x.DumpReprs([]engine.BlockID{ids[0], ids[0]}, [][][]byte{k[0], k[0]}, kernels.Float16); !errors.Is(err, ErrDuplicate) {
		t.Errorf("duplicate ids: %v", err)
	}
	if _, err := s.NewSelector(methodConfig(t, "Blend", ""), selShape); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), "selects no blocks") {
		t.Errorf("Blend: %v", err)
	}
	if _, err := s.NewSelector(methodConfig(t, "ESA", ""), sparse.Shape{Layers: 4, QHeads: 3, KVHeads: 2, HeadDim: 16, BlockSize: 16}); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), "query heads 3") {
		t.Errorf("bad shape: %v", err)
	}
	if _, err := x.Wait(99); !errors.Is(err, ErrUnknownTask) {
		t.Errorf("unknown task: %v", err)
	}
	x.Close()
	if _, err := x.Select(okArgs); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("closed selector: %v", err)
	}
}

// TestSelectorSharedAcrossInstances: representations dumped by one instance are loaded and
// used for selection by another instance on the same backends.
func TestSelectorSharedAcrossInstances(t *testing.T) {
	dir := t.TempDir()
	w0 := openStore(t, workerJSON(dir, 0, ""))
	w1 := openStore(t, workerJSON(dir, 1, ""))
	ids := randomIDs(8)
	k := randomK(len(ids), 11)
	dumpLayers(t, w0, ids, 0)
	x0 := newSelector(t, w0, "ESA", "")
	task, err := x0.DumpReprs(ids, k, kernels.Float16)
	if err != nil {
		t.Fatal(err)
	}
	if err := w0.Wait(task, nil); err != nil {
		t.Fatal(err)
	}
	want, _ := loadReprsAll(t, x0, 2, ids)
	x1 := newSelector(t, w1, "ESA", "")
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, found := loadReprsAll(t, x1, 2, ids)
		if all(found) {
			if !sameBits(got, want) {
				t.Fatal("the other instance loads different values")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other instance finds %v", found)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSelectorAsyncConcurrent: selections submitted from many goroutines for several requests
// (and several steps of one request and layer in a row) complete with the synchronous
// answer; Check, Wait (repeatable) and Release behave as documented. Run with -race.
func TestSelectorAsyncConcurrent(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	ids := randomIDs(15)
	dumpLayers(t, s, ids, 0)
	x := newSelector(t, s, "ESA", "sparse_ratio: 0.3\n")
	task, err := x.DumpReprs(ids, randomK(len(ids), 12), kernels.Float16)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(task, nil); err != nil {
		t.Fatal(err)
	}
	q := make([]float32, selShape.QHeads*selShape.HeadDim)
	for i := range q {
		q[i] = float32(i%5) - 2
	}
	args := SelectArgs{Request: "sync", Layer: 1, Q: q, IDs: ids, SeqLen: 15*16 + 3}
	want, err := x.Select(args)
	if err != nil || want.Dense {
		t.Fatalf("%v %v", want, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := args
			a.Request = fmt.Sprintf("req-%d", g%3)
			var tasks []uint64
			var called sync.Map
			for step := range 4 {
				a.Step = step
				id, err := x.Submit(a, func(sel *Selection, err error) { called.Store(step, true) })
				if err != nil {
					errs <- err
					return
				}
				tasks = append(tasks, id)
			}
			for i, id := range tasks {
				sel, err := x.Wait(id)
				if err != nil || !reflect.DeepEqual(sel.Blocks, want.Blocks) {
					errs <- fmt.Errorf("task %d: %v %v", i, sel, err)
					return
				}
				if _, ok := called.Load(i); !ok {
					errs <- fmt.Errorf("task %d done before its callback ran", i)
					return
				}
				if done, err := x.Check(id); !done || err != nil {
					errs <- fmt.Errorf("check after wait: %v %v", done, err)
					return
				}
				if _, err := x.Wait(id); err != nil {
					errs <- fmt.Errorf("second wait: %v", err)
					return
				}
				if err := x.Release(id); err != nil {
					errs <- err
					return
				}
				if _, err := x.Check(id); !errors.Is(err, ErrUnknownTask) {
					errs <- fmt.Errorf("check after release: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for g := range 3 {
		if err := x.RequestFinished(fmt.Sprintf("req-%d", g)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSelectorRetrieveDot: ESA's retrieval reading the representations from the store by block
// id returns exactly what sparse.DotTopK returns over the matrix LoadReprs gives for the same
// blocks, with every block a candidate and with caller candidates, a block without a
// representation (stored without one, or not stored) being no candidate; bad arguments and a
// method whose representation is not one row per block are ErrInvalidArgument.
func TestSelectorRetrieveDot(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	ids := randomIDs(20)
	dumpLayers(t, s, ids[:19], 0) // ids[19] is not stored
	x := newSelector(t, s, "ESA", "pool: mean\n")
	task, err := x.DumpReprs(ids[:18], randomK(18, 3), kernels.Float16) // ids[18]: stored, no representation
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(task, nil); err != nil {
		t.Fatal(err)
	}
	dim := x.Layout().LayerFloats()
	r := rand.New(rand.NewPCG(8, 9))
	const batch, k = 3, 17 // more than the 18 usable blocks' top: a missing block would show
	q := make([]float32, batch*dim)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	// Caller candidates: width 7, a padding entry, the two blocks without a representation.
	cand := []int32{0, 5, 18, 3, -1, 19, 7, 1, 2, 4, 6, 8, 9, 10, 19, 18, 17, 16, 15, 14, 13}
	for layer := range selShape.Layers {
		data, found := loadReprsAll(t, x, layer, ids)
		all := make([]int32, batch*len(ids))
		for i := range all {
			all[i] = int32(i % len(ids))
			if !found[all[i]] {
				all[i] = -1
			}
		}
		for _, c := range []struct {
			cand, matrixCand []int32
			width, k         int
		}{{[]int32{}, nil, 0, 4}, {nil, all, len(ids), k}, {cand, nil, 7, 4}} {
			want := sparse.DotArgs{Q: q, Data: data, Dim: dim, Cand: c.matrixCand, Width: c.width, K: c.k,
				Idx: make([]int32, batch*c.k), Scores: make([]float32, batch*c.k), Count: make([]int64, batch)}
			if c.cand != nil {
				want.Cand = slices.Clone(c.cand)
				for i, b := range want.Cand {
					if b >= 0 && !found[b] {
						want.Cand[i] = -1
					}
				}
			}
			if err := sparse.DotTopK(&want, 1); err != nil {
				t.Fatal(err)
			}
			got := sparse.DotArgs{Q: q, Dim: dim, Cand: c.cand, Width: c.width, K: c.k,
				Idx: make([]int32, batch*c.k), Scores: make([]float32, batch*c.k), Count: make([]int64, batch)}
			if c.cand != nil && len(c.cand) == 0 {
				// An empty table (no candidates) with blocks missing, on fresh pooled scratch
				// (two collections empty sync.Pool): it must not become "every block".
				runtime.GC()
				runtime.GC()
			}
			gotFound, err := x.RetrieveDot(layer, ids, &got, 2)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(gotFound, found) || found[18] || found[19] {
				t.Fatalf("layer %d: found %v, LoadReprs %v", layer, gotFound, found)
			}
			if !slices.Equal(got.Idx, want.Idx) || !sameBits(got.Scores, want.Scores) || !slices.Equal(got.Count, want.Count) {
				t.Fatalf("layer %d, candidates %v: store form %v %v %v, matrix form %v %v %v", layer, c.cand != nil, got.Idx, got.Scores, got.Count, want.Idx, want.Scores, want.Count)
			}
			if c.cand == nil && got.Count[0] != 17 {
				t.Fatalf("count %v: want 17 (18 usable blocks, top 17)", got.Count)
			}
		}
	}
	if c := []int32{0, 5, 18, 3, -1, 19, 7}; !slices.Equal(cand[:7], c) {
		t.Fatalf("the caller's candidates were written: %v", cand[:7])
	}
	out := func() sparse.DotArgs {
		return sparse.DotArgs{Q: q[:dim], Dim: dim, K: 2, Idx: make([]int32, 2), Scores: make([]float32, 2)}
	}
	for name, call := range map[string]func() error{
		"data given": func() error {
			a := out()
			a.Data = make([]float32, dim)
			_, err := x.RetrieveDot(0, ids, &a, 1)
			return err
		},
		"dim":   func() error { a := out(); a.Dim, a.Q = 8, q[:8]; _, err := x.RetrieveDot(0, ids, &a, 1); return err },
		"layer": func() error { a := out(); _, err := x.RetrieveDot(4, ids, &a, 1); return err },
		"candidate": func() error {
			a := out()
			a.Cand, a.Width = []int32{20}, 1
			_, err := x.RetrieveDot(0, ids, &a, 1)
			return err
		},
		"zero id":  func() error { a := out(); _, err := x.RetrieveDot(0, []engine.BlockID{{}}, &a, 1); return err },
		"nil args": func() error { _, err := x.RetrieveDot(0, ids, nil, 1); return err },
		"quest": func() error {
			a := out()
			_, err := newSelector(t, s, "Quest", "").RetrieveDot(0, ids, &a, 1)
			return err
		},
	} {
		if err := call(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}
