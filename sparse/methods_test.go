package sparse

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
)

// fixture is a context of blocks with random fp16 keys and their sidecars of every kind.
type fixture struct {
	shape    Shape
	k        [][][]float32 // [block][layer] keys, [tokens][kv heads][dim], fp16 values
	kb       [][][]byte    // the same as fp16 bytes
	ids      []engine.BlockID
	payloads map[kernels.SidecarKind][][]byte // [kind][block] payload
	src      *MapSidecars
}

var testShape = Shape{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 16, BlockSize: 8}

func fixtureSpecs(s Shape) []kernels.SidecarSpec {
	base := kernels.SidecarSpec{Layers: s.Layers, Heads: s.KVHeads, Dim: s.HeadDim, BlockSize: s.BlockSize, Elem: kernels.Float16}
	quest, mean, mx, kv, hash := base, base, base, base, base
	quest.Kind, mean.Kind, mx.Kind, kv.Kind = kernels.SidecarQuest, kernels.SidecarESAMean, kernels.SidecarESAMax, kernels.SidecarKVStar
	kv.PruneRatio, kv.Merge = 0.5, 4
	hash.Kind, hash.Elem, hash.HashBits, hash.Seed = kernels.SidecarHash, 0, s.HeadDim&^7, 1
	return []kernels.SidecarSpec{quest, mean, mx, kv, hash}
}

func newFixture(t testing.TB, s Shape, blocks int, seed uint64) *fixture {
	t.Helper()
	return newFixtureElem(t, s, blocks, seed, kernels.Float16)
}

// newFixtureElem is newFixture with float sidecars of element type elem.
func newFixtureElem(t testing.TB, s Shape, blocks int, seed uint64, elem kernels.DType) *fixture {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 99))
	f := &fixture{shape: s, payloads: map[kernels.SidecarKind][][]byte{}, src: &MapSidecars{}}
	n := s.KVHeads * s.HeadDim
	for b := range blocks {
		f.ids = append(f.ids, md5.Sum(fmt.Appendf(nil, "block %d seed %d", b, seed)))
		var kl [][]float32
		var kbl [][]byte
		for range s.Layers {
			bias := make([]float32, n) // a per-block direction, so blocks differ in relevance
			for i := range bias {
				bias[i] = float32(r.NormFloat64() * r.Float64() * 2)
			}
			k := make([]float32, s.BlockSize*n)
			for i := range k {
				k[i] = float32(r.NormFloat64()) + bias[i%n]
			}
			kbytes := make([]byte, 2*len(k))
			if err := kernels.EncodeFloat32(kbytes, k, kernels.Float16); err != nil {
				t.Fatal(err)
			}
			if err := kernels.DecodeFloat32(k, kbytes, kernels.Float16); err != nil {
				t.Fatal(err)
			}
			kl, kbl = append(kl, k), append(kbl, kbytes)
		}
		f.k, f.kb = append(f.k, kl), append(f.kb, kbl)
	}
	for _, spec := range fixtureSpecs(s) {
		if spec.Kind != kernels.SidecarHash {
			spec.Elem = elem
		}
		for b := range blocks {
			w, err := kernels.NewSidecarWriter(spec, kernels.Float16)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Begin(s.BlockSize); err != nil {
				t.Fatal(err)
			}
			for l := range s.Layers {
				if err := w.AddLayer(l, f.kb[b][l]); err != nil {
					t.Fatal(err)
				}
			}
			p, err := w.AppendPayload(nil)
			if err != nil {
				t.Fatal(err)
			}
			f.payloads[spec.Kind] = append(f.payloads[spec.Kind], p)
			if err := f.src.Put(engine.SidecarKind(spec.Kind), f.ids[b], s.Layers, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

func randomQuery(r *rand.Rand, s Shape) []float32 {
	q := make([]float32, s.QHeads*s.HeadDim)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	return q
}

func meanGroups(s Shape, q []float32) []float32 {
	g := s.QHeads / s.KVHeads
	out := make([]float32, s.KVHeads*s.HeadDim)
	for h := range s.KVHeads {
		for d := range s.HeadDim {
			var sum float64
			for i := range g {
				sum += float64(q[(h*g+i)*s.HeadDim+d])
			}
			out[h*s.HeadDim+d] = float32(sum / float64(g))
		}
	}
	return out
}

// refScore is each method's score of block b at layer l, computed the long way: Quest from
// the keys themselves, the others from the whole decoded payload.
func (f *fixture) refScore(t testing.TB, method string, b, l int, q []float32) float64 {
	t.Helper()
	s := f.shape
	d := s.HeadDim
	qr := meanGroups(s, q)
	decode := func(kind kernels.SidecarKind) *kernels.Sidecar {
		sc, err := kernels.DecodeSidecar(f.payloads[kind][b])
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	switch method {
	case NameQuest:
		var sum float64
		for qh := range s.QHeads {
			kv := qh / (s.QHeads / s.KVHeads)
			var head float64
			for c := range d {
				lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
				for tok := range s.BlockSize {
					v := f.k[b][l][(tok*s.KVHeads+kv)*d+c]
					lo, hi = min(lo, v), max(hi, v)
				}
				x := q[qh*d+c]
				head += float64(max(x*lo, x*hi))
			}
			sum += float64(float32(head))
		}
		return sum
	case NameESA, NameGSA:
		sc := decode(kernels.SidecarESAMean)
		r := sc.Values[l*s.KVHeads*d : (l+1)*s.KVHeads*d]
		var sum float64
		for h := range s.KVHeads {
			var dot, dist float64
			for c := range d {
				x, y := float64(qr[h*d+c]), float64(r[h*d+c])
				dot += x * y
				dist += (x - y) * (x - y)
			}
			if method == NameESA {
				sum += dot
			} else {
				sum -= math.Sqrt(dist)
			}
		}
		return sum
	case NameKVStar:
		sc := decode(kernels.SidecarKVStar)
		dk, rows := sc.Cols(), sc.Rows()
		ch := sc.Channels[l*s.KVHeads*dk:]
		vals := sc.Values[l*rows*s.KVHeads*dk:]
		var sum float64
		for h := range s.KVHeads {
			best := math.Inf(-1)
			for m := range sc.ValidRows() {
				var dot float64
				for j := range dk {
					dot += float64(qr[h*d+int(ch[h*dk+j])]) * float64(vals[(m*s.KVHeads+h)*dk+j])
				}
				best = max(best, dot)
			}
			sum += best
		}
		return sum
	case NameGSAOnDevice:
		sc := decode(kernels.SidecarHash)
		encs, err := sc.HashEncoders()
		if err != nil {
			t.Fatal(err)
		}
		cb := encs[0].CodeBytes()
		qcode := make([]byte, s.KVHeads*cb)
		for h := range s.KVHeads {
			if err := encs[0].Hash(qcode[h*cb:(h+1)*cb], qr[h*d:(h+1)*d]); err != nil {
				t.Fatal(err)
			}
		}
		row := s.KVHeads * cb
		codes := sc.Codes[l*s.BlockSize*row:]
		best := math.MaxInt
		for tok := range s.BlockSize {
			dist := 0
			for i := range row { // a bit loop: the reference for Hamming
				for bit := range 8 {
					if (qcode[i]>>bit)&1 != (codes[tok*row+i]>>bit)&1 {
						dist++
					}
				}
			}
			best = min(best, dist)
		}
		return -float64(best)
	}
	t.Fatalf("no reference for %s", method)
	return 0
}

func newMethod(t testing.TB, name string, src SidecarSource, yamlText string, s Shape) SparseMethod {
	t.Helper()
	block := sparseBlock(t, "ucm_sparse_config:\n  "+name+": "+yamlText+"\n")
	cfg, err := Choose(block, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(cfg, Env{Role: RoleWorker, Shape: s, Sidecars: src})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// decodeCall builds a decode attention call over the fixture's first n blocks (the last one
// holding tokens%bs tokens, 0 meaning full).
func (f *fixture) decodeCall(n, partial, layer, step int, q []float32) *Attention {
	seqLen := n * f.shape.BlockSize
	if partial > 0 {
		seqLen += partial - f.shape.BlockSize
	}
	table := make([]int, n)
	for i := range table {
		table[i] = 100 + 3*i
	}
	return &Attention{Layer: layer, LayerName: fmt.Sprintf("model.layers.%d.self_attn", layer), Phase: PhaseDecode, Step: step,
		Request: &Request{ID: "r", BlockIDs: f.ids[:n], BlockTable: table, NumOutputTokens: step}, Q: q, BlockTable: table, SeqLen: seqLen}
}

var methodConfigs = map[string]string{
	NameQuest:       "{init_window_sz: 1, local_window_sz: 2, budget: 0.3}",
	NameESA:         "{init_window_sz: 2, local_window_sz: 1, sparse_ratio: 0.25}",
	NameGSA:         "{init_window_sz: 1, local_window_sz: 2, sparse_ratio: 0.3, min_blocks: 4}",
	NameKVStar:      "{init_window_sz: 1, local_window_sz: 2, sparse_ratio: 0.3, retrieval_stride: 1}",
	NameGSAOnDevice: "{hash_topk_tokens: 64, sink_token: 8, recent_token: 16}",
}

// TestSelectionEqualsReference: every method's selection equals the windows plus the top-K
// of its score computed the long way, by a full sort, over random contexts, queries and layers;
// the block table and seq_len are rewritten as sources §3A says and restored after attention.
func TestSelectionEqualsReference(t *testing.T) {
	f := newFixture(t, testShape, 40, 7)
	r := rand.New(rand.NewPCG(8, 9))
	for name, conf := range methodConfigs {
		t.Run(name, func(t *testing.T) {
			m := newMethod(t, name, f.src, conf, testShape)
			for trial := range 60 {
				n := 1 + r.IntN(40)
				partial := r.IntN(testShape.BlockSize)
				layer := r.IntN(testShape.Layers)
				q := randomQuery(r, testShape)
				a := f.decodeCall(n, partial, layer, trial, q)
				origTable, origLen := slices.Clone(a.BlockTable), a.SeqLen
				if err := m.AttentionBegin(a); err != nil {
					t.Fatal(err)
				}
				init, local, k := keepOf(t, m, n, a)
				if init+local+k >= n {
					if a.Selected != nil {
						t.Fatalf("n %d: windows and budget cover the context, but %v selected", n, a.Selected)
					}
					continue
				}
				scores := make([]float64, n)
				for b := init; b < n-local; b++ {
					scores[b] = f.refScore(t, name, b, layer, q)
				}
				want := slices.Concat(seq(0, init), bruteTopK(scores, init, n-local, k), seq(n-local, n))
				if !sameSelection(a.Selected, want, scores, init, n-local) {
					t.Fatalf("n %d layer %d: selected %v, reference %v (scores %v)", n, layer, a.Selected, want, scores)
				}
				want = a.Selected // equal, or equal up to float32 near ties
				wantTable, wantLen, _ := RewriteBlockTable(origTable, want, origLen, testShape.BlockSize)
				if !slices.Equal(a.BlockTable, wantTable) || a.SeqLen != wantLen {
					t.Fatalf("rewrite: table %v seq_len %d, want %v %d", a.BlockTable, a.SeqLen, wantTable, wantLen)
				}
				if err := m.AttentionFinished(a); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(a.BlockTable, origTable) || a.SeqLen != origLen || a.Selected != nil {
					t.Fatalf("AttentionFinished did not restore the block table and seq_len")
				}
			}
			if st := m.(*blockMethod).Stats(); st.Selections == 0 || st.Missing != 0 {
				t.Fatalf("stats %+v: want selections and no missing sidecar", st)
			}
		})
	}
}

// sameSelection reports whether a method's selection got equals the reference want (computed
// in float64 from scores) but for blocks whose reference scores tie with the boundary of the
// top-K within the float32 rounding of the kernels (relative 1e-4): the windows and the size
// must be equal, and every block in one but not the other must score within the tolerance of
// the lowest selected reference score.
func sameSelection(got, want []int, scores []float64, s, e int) bool {
	if slices.Equal(got, want) {
		return true
	}
	if len(got) != len(want) {
		return false
	}
	kth := math.Inf(1)
	for _, b := range want {
		if b >= s && b < e {
			kth = min(kth, scores[b])
		}
	}
	tol := 1e-4 * (1 + math.Abs(kth))
	for _, b := range got {
		if b < s || b >= e {
			if !slices.Contains(want, b) {
				return false
			}
			continue
		}
		if !slices.Contains(want, b) && math.Abs(scores[b]-kth) > tol {
			return false
		}
	}
	for _, b := range want {
		if b >= s && b < e && !slices.Contains(got, b) && math.Abs(scores[b]-kth) > tol {
			return false
		}
	}
	return true
}

func seq(a, b int) []int {
	var out []int
	for i := a; i < b; i++ {
		out = append(out, i)
	}
	return out
}

// keepOf asks the method its window split (as AttentionBegin did).
func keepOf(t testing.TB, m SparseMethod, n int, a *Attention) (int, int, int) {
	bm, ok := m.(*blockMethod)
	if !ok {
		t.Fatalf("%T is not a block method", m)
	}
	seqLen := a.SeqLen
	if a.rewritten {
		seqLen = a.origSeqLen
	}
	return bm.keep(n, seqLen)
}

// TestQuestBoundsAttention: Quest's block score bounds the largest q·k of the block's keys,
// head by head and so summed (the property that makes it the anchor).
func TestQuestBoundsAttention(t *testing.T) {
	f := newFixture(t, testShape, 12, 3)
	r := rand.New(rand.NewPCG(4, 5))
	s := testShape
	for range 200 {
		q := randomQuery(r, s)
		b, l := r.IntN(12), r.IntN(s.Layers)
		var maxSum float64
		for qh := range s.QHeads {
			kv := qh / (s.QHeads / s.KVHeads)
			best := math.Inf(-1)
			for tok := range s.BlockSize {
				var dot float64
				for c := range s.HeadDim {
					dot += float64(q[qh*s.HeadDim+c]) * float64(f.k[b][l][(tok*s.KVHeads+kv)*s.HeadDim+c])
				}
				best = max(best, dot)
			}
			maxSum += best
		}
		if bound := f.refScore(t, NameQuest, b, l, q); bound < maxSum-1e-3 {
			t.Fatalf("Quest bound %v below the block's largest q·k sum %v", bound, maxSum)
		}
	}
}

// TestMissingSidecarsAreKept: blocks without a usable sidecar (not stored, corrupt, another
// spec) are kept first within the budget, and counted.
func TestMissingSidecarsAreKept(t *testing.T) {
	f := newFixture(t, testShape, 30, 11)
	src := &MapSidecars{}
	kind := engine.SidecarKind(kernels.SidecarQuest)
	for b, p := range f.payloads[kernels.SidecarQuest] {
		switch b {
		case 5: // absent
		case 9: // corrupt: a flipped byte in layer 0's header
			bad := slices.Clone(p)
			bad[20] ^= 1
			_ = src.Put(kind, f.ids[b], testShape.Layers, bad)
		default:
			_ = src.Put(kind, f.ids[b], testShape.Layers, p)
		}
	}
	m := newMethod(t, NameQuest, src, "{init_window_sz: 1, local_window_sz: 1, budget: 0.2}", testShape)
	a := f.decodeCall(30, 0, 0, 0, randomQuery(rand.New(rand.NewPCG(1, 1)), testShape))
	if err := m.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a.Selected, 5) || !slices.Contains(a.Selected, 9) || len(a.Selected) != 6 {
		t.Fatalf("selected %v: want blocks 5 and 9 kept within 6", a.Selected)
	}
	if st := m.(*blockMethod).Stats(); st.Missing != 2 {
		t.Fatalf("missing %d, want 2", st.Missing)
	}
	// A context longer than the stored ids: the blocks without an id are kept too.
	a = f.decodeCall(30, 0, 0, 1, randomQuery(rand.New(rand.NewPCG(1, 2)), testShape))
	a.Request.BlockIDs = a.Request.BlockIDs[:20]
	if err := m.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	// The 4 candidates of the budget go to the first unscored blocks: 5 and 9, then 20, 21.
	if want := []int{0, 5, 9, 20, 21, 29}; !slices.Equal(a.Selected, want) {
		t.Fatalf("selected %v, want %v: blocks without an id are kept first", a.Selected, want)
	}
}

// TestStrideHoldsSelection: with retrieval_stride s, the selected candidates are constant
// within each window of s decode steps (KVStar MultiStep), recomputed at the next.
func TestStrideHoldsSelection(t *testing.T) {
	f := newFixture(t, testShape, 40, 13)
	m := newMethod(t, NameKVStar, f.src, "{init_window_sz: 1, local_window_sz: 2, sparse_ratio: 0.2, retrieval_stride: 4}", testShape)
	r := rand.New(rand.NewPCG(2, 3))
	var held []int
	changed := false
	for step := range 24 {
		a := f.decodeCall(30, 0, 1, step, randomQuery(r, testShape))
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		mid := a.Selected[1 : len(a.Selected)-2]
		if step%4 == 0 {
			changed = changed || held != nil && !slices.Equal(mid, held)
			held = slices.Clone(mid)
		} else if !slices.Equal(mid, held) {
			t.Fatalf("step %d: selection %v changed within the stride window (held %v)", step, mid, held)
		}
	}
	if !changed {
		t.Fatal("the selection never changed across stride windows (random queries)")
	}
	if st := m.(*blockMethod).Stats(); st.Held != 18 {
		t.Fatalf("held %d selections, want 18", st.Held)
	}
}

// TestRollbackLayersAndPrefillAreDense: GSA On-Device's rollback layers and every prefill
// attend densely.
func TestRollbackLayersAndPrefillAreDense(t *testing.T) {
	f := newFixture(t, testShape, 40, 17)
	m := newMethod(t, NameGSAOnDevice, f.src, "{hash_topk_tokens: 64, sink_token: 8, recent_token: 16, rollback_layers: [1]}", testShape)
	q := randomQuery(rand.New(rand.NewPCG(5, 5)), testShape)
	for layer, want := range []bool{true, false} {
		a := f.decodeCall(40, 0, layer, 0, q)
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		if (a.Selected != nil) != want {
			t.Fatalf("layer %d: selected %v", layer, a.Selected)
		}
	}
	a := f.decodeCall(40, 0, 0, 0, slices.Repeat(q, 3))
	a.Phase = PhasePrefill
	if err := m.AttentionBegin(a); err != nil || a.Selected != nil {
		t.Fatalf("prefill: %v, %v", a.Selected, err)
	}
}

// TestSkipHashLayers: a skip-hash layer attends the selection its step's earlier layer
// computed, not its own; without one at that step (a new step starting at the skip layer) it
// selects for itself. UCM's per-layer booleans name the same layers as indices do.
func TestSkipHashLayers(t *testing.T) {
	f := newFixture(t, testShape, 40, 17)
	for _, conf := range []string{"skip_hash_layers: [1]", "vllm_hash_attention_skip_layers: [false, true]"} {
		m := newMethod(t, NameGSAOnDevice, f.src, "{hash_topk_tokens: 64, sink_token: 8, recent_token: 16, "+conf+"}", testShape)
		plain := newMethod(t, NameGSAOnDevice, f.src, "{hash_topk_tokens: 64, sink_token: 8, recent_token: 16}", testShape)
		r := rand.New(rand.NewPCG(5, 6))
		differ := 0
		for step := range 20 {
			q0, q1 := randomQuery(r, testShape), randomQuery(r, testShape)
			sel := func(m SparseMethod, layer int, q []float32) []int {
				a := f.decodeCall(40, 0, layer, step, q)
				if err := m.AttentionBegin(a); err != nil {
					t.Fatal(err)
				}
				return a.Selected
			}
			if step%5 == 4 { // the step starts at the skip layer: it selects for itself
				if got, own := sel(m, 1, q1), sel(plain, 1, q1); !slices.Equal(got, own) {
					t.Fatalf("%s step %d: skip layer first selected %v, its own selection is %v", conf, step, got, own)
				}
				continue
			}
			first, own := sel(m, 0, q0), sel(plain, 1, q1)
			if got := sel(m, 1, q1); !slices.Equal(got, first) {
				t.Fatalf("%s step %d: skip layer selected %v, layer 0 %v", conf, step, got, first)
			}
			if !slices.Equal(own, first) {
				differ++
			}
		}
		if st := m.(*blockMethod).Stats(); st.Reused != 16 || differ == 0 {
			t.Fatalf("%s: %d reused (want 16), %d steps where the layers' own selections differ", conf, st.Reused, differ)
		}
		m.RequestFinished("r")
		if len(m.(*blockMethod).lastSel) != 0 {
			t.Fatal("RequestFinished kept the request's last selection")
		}
	}
}

// TestSelectionReadsNoBlock: selection through a real engine loads sidecar parts only: the
// engine's whole-block and shard load counters do not move, and the selection equals the one
// from the same sidecars in memory.
func TestSelectionReadsNoBlock(t *testing.T) {
	s := testShape
	f := newFixture(t, s, 32, 21)
	shard := 2 * s.BlockSize * s.KVHeads * s.HeadDim * 2
	e, err := engine.Open(t.TempDir(), engine.Options{
		Layout: engine.Layout{Shards: s.Layers, TensorsPerShard: 2, ShardBytes: int64(shard)},
		Schema: engine.Schema{Model: "sparse-test", DType: "float16", KVLayout: "flash_attn", TPSize: 1, BlockTokens: s.BlockSize},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	src := make([][]byte, len(f.ids))
	for b := range f.ids {
		rec := make([]byte, s.Layers*shard)
		for l := range s.Layers {
			copy(rec[l*shard:], f.kb[b][l]) // K; V left zero
		}
		src[b] = rec
	}
	if err := e.Dump(f.ids, src).Wait(); err != nil {
		t.Fatal(err)
	}
	for kind, ps := range f.payloads {
		if err := e.DumpSidecars(engine.SidecarKind(kind), s.Layers, f.ids, ps).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	before := e.Stats()
	r := rand.New(rand.NewPCG(6, 7))
	for name, conf := range methodConfigs {
		viaEngine := newMethod(t, name, e, conf, s)
		inMemory := newMethod(t, name, f.src, conf, s)
		for trial := range 10 {
			q := randomQuery(r, s)
			a, b := f.decodeCall(32, 0, trial%2, trial, q), f.decodeCall(32, 0, trial%2, trial, q)
			if err := viaEngine.AttentionBegin(a); err != nil {
				t.Fatal(err)
			}
			if err := inMemory.AttentionBegin(b); err != nil {
				t.Fatal(err)
			}
			if a.Selected == nil || !slices.Equal(a.Selected, b.Selected) {
				t.Fatalf("%s: through the engine %v, in memory %v", name, a.Selected, b.Selected)
			}
		}
	}
	after := e.Stats()
	if after.LoadedBlocks != before.LoadedBlocks || after.LoadedShards != before.LoadedShards || after.LoadTasks != before.LoadTasks {
		t.Fatalf("selection loaded blocks: blocks %d → %d, shards %d → %d, load tasks %d → %d",
			before.LoadedBlocks, after.LoadedBlocks, before.LoadedShards, after.LoadedShards, before.LoadTasks, after.LoadTasks)
	}
	// The counters can move: a real load does.
	dst := [][]byte{make([]byte, s.Layers*shard)}
	if err := e.Load(f.ids[:1], dst).Wait(); err != nil {
		t.Fatal(err)
	}
	if e.Stats().LoadedBlocks != after.LoadedBlocks+1 {
		t.Fatal("a whole-block load is not counted: the check above proves nothing")
	}
}

// FuzzScorePart: whatever bytes a sidecar source returns for a candidate, scoring never
// panics and either rejects the part or gives a number (the part is then valid for the spec).
func FuzzScorePart(f *testing.F) {
	fx := newFixture(f, testShape, 2, 5)
	kinds := []kernels.SidecarKind{kernels.SidecarQuest, kernels.SidecarESAMean, kernels.SidecarKVStar, kernels.SidecarHash}
	names := []string{NameQuest, NameESA, NameKVStar, NameGSAOnDevice}
	for i, k := range kinds {
		pb := len(fx.payloads[k][0]) / testShape.Layers
		f.Add(uint8(i), uint16(0), byte(0), fx.payloads[k][0][:pb])
		f.Add(uint8(i), uint16(70), byte(0x40), fx.payloads[k][1][pb:])
	}
	methods := make([]*blockMethod, len(names))
	for i, n := range names {
		methods[i] = newMethod(f, n, fx.src, methodConfigs[n], testShape).(*blockMethod)
	}
	queries := make([][]float32, len(names))
	for i := range queries {
		queries[i] = randomQuery(rand.New(rand.NewPCG(1, 1)), testShape)
	}
	// GSA On-Device on MLA: its own shape, two-encoder codes.
	mla := newMethod(f, NameGSAOnDevice, &MapSidecars{}, mlaConf, mlaShape).(*blockMethod)
	_, mp := mlaSidecars(f, newFixture(f, mlaShape, 2, 5), mla.SidecarSpec())
	pb := len(mp[0]) / mlaShape.Layers
	f.Add(uint8(len(methods)), uint16(0), byte(0), mp[0][:pb])
	f.Add(uint8(len(methods)), uint16(90), byte(0x11), mp[1][pb:])
	methods = append(methods, mla)
	queries = append(queries, randomQuery(rand.New(rand.NewPCG(1, 1)), mlaShape))
	f.Fuzz(func(t *testing.T, which uint8, at uint16, flip byte, part []byte) {
		i := int(which) % len(methods)
		m := methods[i]
		part = slices.Clone(part)
		if len(part) > 0 {
			part[int(at)%len(part)] ^= flip
		}
		st := &stepState{q: slices.Clone(queries[i])}
		if err := m.prepare(st); err != nil {
			t.Fatal(err)
		}
		for layer := range m.shape.Layers {
			if s, ok := m.scorePart(st, layer, part); ok && math.IsNaN(s) {
				t.Fatalf("layer %d: NaN score accepted", layer)
			}
		}
	})
}

// TestSoftmaxHeadScore: with head_score: softmax, ESA's and Quest's selection equals the
// top-K of Σ over query heads of each head's softmax (over the candidates) of its score/√D,
// computed the long way. A block whose ESA row holds a NaN (for one KV head) gets no share
// from that head's query heads and changes nothing else: it does not poison the softmax.
func TestSoftmaxHeadScore(t *testing.T) {
	f := newFixture(t, testShape, 40, 23)
	r := rand.New(rand.NewPCG(12, 13))
	s := testShape
	d := s.HeadDim
	for _, variant := range []string{NameESA, NameQuest, "ESA, a NaN row"} {
		name := variant
		if variant != NameQuest && variant != NameESA {
			name = NameESA
			poisonESARow(t, f, 3)
		}
		m := newMethod(t, name, f.src, "{init_window_sz: 1, local_window_sz: 2, budget: 0.25, head_score: softmax}", s)
		for trial := range 30 {
			n, layer := 12+r.IntN(28), r.IntN(s.Layers)
			q := randomQuery(r, s)
			a := f.decodeCall(n, 0, layer, trial, q)
			if err := m.AttentionBegin(a); err != nil {
				t.Fatal(err)
			}
			init, local, k := keepOf(t, m, n, a)
			per := make([][]float64, n) // [block][query head]
			for b := init; b < n-local; b++ {
				per[b] = make([]float64, s.QHeads)
				for qh := range s.QHeads {
					kv := qh / (s.QHeads / s.KVHeads)
					if name == NameQuest {
						var head float64
						for c := range d {
							lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
							for tok := range s.BlockSize {
								v := f.k[b][layer][(tok*s.KVHeads+kv)*d+c]
								lo, hi = min(lo, v), max(hi, v)
							}
							head += float64(max(q[qh*d+c]*lo, q[qh*d+c]*hi))
						}
						per[b][qh] = float64(float32(head))
					} else {
						sc, err := kernels.DecodeSidecar(f.payloads[kernels.SidecarESAMean][b])
						if err != nil {
							t.Fatal(err)
						}
						rv := sc.Values[(layer*s.KVHeads+kv)*d:]
						var dot float64
						for c := range d {
							dot += float64(q[qh*d+c]) * float64(rv[c])
						}
						per[b][qh] = dot
					}
				}
			}
			scores := make([]float64, n)
			for qh := range s.QHeads {
				mx := math.Inf(-1)
				for b := init; b < n-local; b++ {
					if v := per[b][qh] / math.Sqrt(float64(d)); v > mx { // a NaN adds nothing
						mx = v
					}
				}
				var z float64
				for b := init; b < n-local; b++ {
					if e := math.Exp(per[b][qh]/math.Sqrt(float64(d)) - mx); e == e {
						z += e
					}
				}
				for b := init; b < n-local; b++ {
					if e := math.Exp(per[b][qh]/math.Sqrt(float64(d)) - mx); e == e {
						scores[b] += e / z
					}
				}
			}
			want := slices.Concat(seq(0, init), bruteTopK(scores, init, n-local, k), seq(n-local, n))
			if !sameSelection(a.Selected, want, scores, init, n-local) {
				t.Fatalf("%s n %d: selected %v, reference %v", variant, n, a.Selected, want)
			}
		}
	}
}

// poisonESARow replaces block b's esa-mean sidecar (in f.src and f.payloads) by one whose
// first key of KV head 0 is NaN in every layer, so that the block's mean of that head is NaN.
func poisonESARow(t *testing.T, f *fixture, b int) {
	t.Helper()
	s := f.shape
	var spec kernels.SidecarSpec
	for _, sp := range fixtureSpecs(s) {
		if sp.Kind == kernels.SidecarESAMean {
			spec = sp
		}
	}
	w, err := kernels.NewSidecarWriter(spec, kernels.Float16)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Begin(s.BlockSize); err != nil {
		t.Fatal(err)
	}
	for l := range s.Layers {
		kb := slices.Clone(f.kb[b][l])
		binary.LittleEndian.PutUint16(kb, 0x7e00) // quiet NaN
		if err := w.AddLayer(l, kb); err != nil {
			t.Fatal(err)
		}
	}
	p, err := w.AppendPayload(nil)
	if err != nil {
		t.Fatal(err)
	}
	f.payloads[kernels.SidecarESAMean][b] = p
	if err := f.src.Put(engine.SidecarKind(spec.Kind), f.ids[b], s.Layers, p); err != nil {
		t.Fatal(err)
	}
}

// TestRetrievalLag: with retrieval_lag 1 (ESA's asynchronous retrieval), every step attends
// exactly what the synchronous method selected at the step before (the first step its own):
// the asynchronous result equals the synchronous one, one step late.
func TestRetrievalLag(t *testing.T) {
	f := newFixture(t, testShape, 40, 29)
	conf := "{init_window_sz: 1, local_window_sz: 2, budget: 0.25%s}"
	sync := newMethod(t, NameESA, f.src, fmt.Sprintf(conf, ""), testShape)
	lagged := newMethod(t, NameESA, f.src, fmt.Sprintf(conf, ", retrieval_lag: 1, retrieval_workers: 0"), testShape)
	async := newMethod(t, NameESA, f.src, fmt.Sprintf(conf, ", retrieval_lag: 1"), testShape)
	if async.(*blockMethod).workers == nil || lagged.(*blockMethod).workers != nil {
		t.Fatal("retrieval_lag 1 should retrieve in the background by default, and synchronously with retrieval_workers 0")
	}
	r := rand.New(rand.NewPCG(30, 31))
	var prev []int
	for step := range 12 {
		q := randomQuery(r, testShape)
		n := 30 + step/4 // the context grows
		a, b, c := f.decodeCall(n, 0, 1, step, q), f.decodeCall(n, 0, 1, step, q), f.decodeCall(n, 0, 1, step, q)
		for _, x := range []struct {
			m SparseMethod
			a *Attention
		}{{sync, a}, {lagged, b}, {async, c}} {
			if err := x.m.AttentionBegin(x.a); err != nil {
				t.Fatal(err)
			}
		}
		want := prev
		if step == 0 {
			want = a.Selected
		}
		if !slices.Equal(b.Selected, want) {
			t.Fatalf("step %d: lagged %v, synchronous one step before %v", step, b.Selected, want)
		}
		if !slices.Equal(c.Selected, b.Selected) { // sources §10: async result equals sync result
			t.Fatalf("step %d: asynchronous %v, synchronous lag %v", step, c.Selected, b.Selected)
		}
		prev = heldSelection(a.Selected[1:len(a.Selected)-2], n+(step+1)/4-step/4, 1, 2)
	}
	if st := async.(*blockMethod).Stats(); st.Held != 11 {
		t.Fatalf("asynchronous engine: %d steps attended the previous retrieval, want 11", st.Held)
	}
	async.RequestFinished("r") // waits for the last retrieval
	if len(async.(*blockMethod).held) != 0 {
		t.Fatal("RequestFinished kept the request's retrieval state")
	}
	node := sparseBlock(t, "ucm_sparse_config:\n  ESA: {retrieval_lag: 1, retrieval_stride: 4}\n")["ESA"]
	if _, err := ParseMethodConfig(NameESA, &node); !isConfigErr(err, "ucm_sparse_config.ESA.retrieval_lag") {
		t.Fatalf("lag with a stride: %v", err)
	}
}

// failingSource fails every load while fail is set.
type failingSource struct {
	SidecarSource
	fail atomic.Bool
}

var errSidecarStore = errors.New("sidecar store unavailable")

func (f *failingSource) LoadSidecars(kind engine.SidecarKind, part int, ids []engine.BlockID, dst []byte) ([]bool, error) {
	if f.fail.Load() {
		return nil, errSidecarStore
	}
	return f.SidecarSource.LoadSidecars(kind, part, ids, dst)
}

// TestAsyncRetrievalError: a background retrieval that fails reports its error at the next
// step (naming the layer and the step it served), and the step after retrieves again.
func TestAsyncRetrievalError(t *testing.T) {
	f := newFixture(t, testShape, 40, 31)
	src := &failingSource{SidecarSource: f.src}
	m := newMethodEnv(t, NameESA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.25, retrieval_lag: 1}", Env{Role: RoleWorker, Shape: testShape, Sidecars: src, ReprPoolBytes: -1})
	r := rand.New(rand.NewPCG(32, 33))
	step := func(i int) error { return m.AttentionBegin(f.decodeCall(32, 0, 1, i, randomQuery(r, testShape))) }
	if err := step(0); err != nil { // synchronous: the first step
		t.Fatal(err)
	}
	if err := step(1); err != nil { // submits step 1's retrieval
		t.Fatal(err)
	}
	waitRetrievals(m)
	src.fail.Store(true)
	if err := step(2); err != nil { // attends step 1's; step 2's retrieval fails in the background
		t.Fatal(err)
	}
	waitRetrievals(m)
	src.fail.Store(false)
	err := step(3)
	if !errors.Is(err, errSidecarStore) || !strings.Contains(err.Error(), "layer 1: background retrieval of step 2") {
		t.Fatalf("step 3: %v; want the background retrieval's error naming layer 1 and step 2", err)
	}
	if err := step(4); err != nil {
		t.Fatalf("step 4 after the failure: %v", err)
	}
	m.RequestFinished("r")
}
