package sparse

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
)

// countingSource counts the parts a SidecarSource loads, by (block, part).
type countingSource struct {
	SidecarSource
	mu     sync.Mutex
	loaded map[loadKey]int
}

type loadKey struct {
	id   engine.BlockID
	part int
}

func (c *countingSource) LoadSidecars(kind engine.SidecarKind, part int, ids []engine.BlockID, dst []byte) ([]bool, error) {
	c.mu.Lock()
	if c.loaded == nil {
		c.loaded = map[loadKey]int{}
	}
	for _, id := range ids {
		c.loaded[loadKey{id, part}]++
	}
	c.mu.Unlock()
	return c.SidecarSource.LoadSidecars(kind, part, ids, dst)
}

func newMethodEnv(t testing.TB, name, yamlText string, env Env) *blockMethod {
	t.Helper()
	cfg, err := Choose(sparseBlock(t, "ucm_sparse_config:\n  "+name+": "+yamlText+"\n"), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	return m.(*blockMethod)
}

// poolBytesFor is the ReprPoolBytes of a pool of entries blocks for the method's rows.
func poolBytesFor(m *blockMethod, entries int) int64 {
	return int64(m.rowBytes) * int64(m.spec.Layers) * int64(entries)
}

// TestPoolSelectionsEqualUncached: with the representation pool (large, or so small that most
// candidates find no entry), every method selects exactly what it selects without a pool,
// over decode steps of a growing context with random queries and layers; with a large pool
// each (block, layer) part is loaded once, and nothing is scored uncached.
func TestPoolSelectionsEqualUncached(t *testing.T) {
	f := newFixture(t, testShape, 40, 41)
	confs := map[string]string{}
	for k, v := range methodConfigs {
		confs[k] = v
	}
	confs[NameESA+"+int8"] = "{init_window_sz: 2, local_window_sz: 1, sparse_ratio: 0.25, repr_dtype: int8}"
	confs[NameESA+"+softmax"] = "{init_window_sz: 1, local_window_sz: 2, budget: 0.3, head_score: softmax}"
	for label, conf := range confs {
		name, _, _ := cutPlus(label)
		t.Run(label, func(t *testing.T) {
			env := Env{Role: RoleWorker, Shape: testShape}
			env.ReprPoolBytes, env.Sidecars = -1, f.src
			plain := newMethodEnv(t, name, conf, env)
			big := &countingSource{SidecarSource: f.src}
			env.ReprPoolBytes, env.Sidecars = 0, big
			pooled := newMethodEnv(t, name, conf, env)
			env.ReprPoolBytes, env.Sidecars = poolBytesFor(plain, 5), f.src
			tiny := newMethodEnv(t, name, conf, env)
			if plain.pool != nil || pooled.pool == nil || tiny.pool == nil || tiny.pool.capacity != 5 {
				t.Fatalf("pools: %v %v %v", plain.pool, pooled.pool, tiny.pool)
			}
			r := rand.New(rand.NewPCG(42, 43))
			for step := range 80 {
				n := 10 + step*30/80
				layer := r.IntN(testShape.Layers)
				q := randomQuery(r, testShape)
				var sels [3][]int
				for i, m := range []*blockMethod{plain, pooled, tiny} {
					a := f.decodeCall(n, 0, layer, step, q)
					if err := m.AttentionBegin(a); err != nil {
						t.Fatal(err)
					}
					sels[i] = a.Selected
				}
				if !slices.Equal(sels[0], sels[1]) || !slices.Equal(sels[0], sels[2]) {
					t.Fatalf("step %d n %d layer %d: without pool %v, pooled %v, tiny pool %v", step, n, layer, sels[0], sels[1], sels[2])
				}
			}
			for k, c := range big.loaded {
				if c != 1 {
					t.Fatalf("block %x part %d loaded %d times with a pool", k.id[:4], k.part, c)
				}
			}
			if st := pooled.Stats(); st.Uncached != 0 || st.Selections == 0 {
				t.Fatalf("pooled stats %+v", st)
			}
			if st := tiny.Stats(); st.Uncached == 0 {
				t.Fatalf("tiny pool stats %+v: want uncached candidates", st)
			}
		})
	}
}

func cutPlus(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '+' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// TestPoolReclaimsFinishedRequests: entries of a finished request are reused for another
// request's blocks when the pool is full (oldest first), the selections stay those of a method
// without a pool, and a live request's entries are never taken.
func TestPoolReclaimsFinishedRequests(t *testing.T) {
	f := newFixture(t, testShape, 40, 43)
	env := Env{Role: RoleWorker, Shape: testShape, Sidecars: f.src, ReprPoolBytes: -1}
	conf := "{init_window_sz: 1, local_window_sz: 1, budget: 0.5}"
	plain := newMethodEnv(t, NameESA, conf, env)
	env.ReprPoolBytes = poolBytesFor(plain, 10)
	m := newMethodEnv(t, NameESA, conf, env)
	q := randomQuery(rand.New(rand.NewPCG(1, 2)), testShape)
	call := func(m *blockMethod, id string, first int) []int {
		a := f.decodeCall(40, 0, 0, 0, q)
		a.Request.ID = id
		a.Request.BlockIDs = f.ids[first : first+12]
		a.BlockTable, a.SeqLen, a.Request.BlockTable = a.BlockTable[:12], 12*testShape.BlockSize, a.BlockTable[:12]
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		return a.Selected
	}
	if got, want := call(m, "a", 0), call(plain, "a", 0); !slices.Equal(got, want) {
		t.Fatalf("a: %v, want %v", got, want)
	}
	// b's blocks are other blocks; a holds all 10 entries (its candidates): b is scored uncached.
	if got, want := call(m, "b", 20), call(plain, "b", 20); !slices.Equal(got, want) {
		t.Fatalf("b: %v, want %v", got, want)
	}
	if st := m.Stats(); st.Uncached != 10 {
		t.Fatalf("uncached %d, want b's 10 candidates", st.Uncached)
	}
	m.RequestFinished("a")
	m.RequestFinished("b")
	if got, want := call(m, "c", 20), call(plain, "c", 20); !slices.Equal(got, want) {
		t.Fatalf("c: %v, want %v", got, want)
	}
	ps := m.PoolStats()
	if ps.Reclaimed != 10 || ps.Referenced != 10 || ps.Entries != 10 || ps.Capacity != 10 {
		t.Fatalf("pool %+v: want a's 10 candidates' entries given to c", ps)
	}
	if st := m.Stats(); st.Uncached != 10 {
		t.Fatalf("uncached %d: c should have found entries", st.Uncached)
	}
}

// TestPoolRetriesUnusableParts: a candidate whose part is corrupt scores +Inf (kept) and is
// not cached; once a good part is stored it is scored.
func TestPoolRetriesUnusableParts(t *testing.T) {
	f := newFixture(t, testShape, 20, 47)
	src := &MapSidecars{}
	kind := engine.SidecarKind(kernels.SidecarESAMean)
	for b, p := range f.payloads[kernels.SidecarESAMean] {
		if b == 7 {
			bad := slices.Clone(p)
			bad[20] ^= 1
			p = bad
		}
		_ = src.Put(kind, f.ids[b], testShape.Layers, p)
	}
	m := newMethodEnv(t, NameESA, "{init_window_sz: 1, local_window_sz: 1, budget: 0.2}", Env{Role: RoleWorker, Shape: testShape, Sidecars: src})
	q := randomQuery(rand.New(rand.NewPCG(3, 4)), testShape)
	a := f.decodeCall(20, 0, 0, 0, q)
	if err := m.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a.Selected, 7) || m.Stats().Missing != 1 {
		t.Fatalf("selected %v, stats %+v: the corrupt block 7 is kept and counted", a.Selected, m.Stats())
	}
	_ = src.Put(kind, f.ids[7], testShape.Layers, f.payloads[kernels.SidecarESAMean][7])
	a = f.decodeCall(20, 0, 0, 1, q)
	if err := m.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	if m.Stats().Missing != 1 {
		t.Fatalf("stats %+v: the repaired block is scored", m.Stats())
	}
}

// TestInt8Rows: ESA with repr_dtype int8 selects the top-K of Σ_h q̄_h·(scale·round(r/scale)),
// scale = max|r|/127 over the block's layer, computed the long way.
func TestInt8Rows(t *testing.T) {
	f := newFixture(t, testShape, 40, 53)
	s := testShape
	m := newMethod(t, NameESA, f.src, "{init_window_sz: 1, local_window_sz: 2, budget: 0.3, repr_dtype: int8}", s)
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 40 {
		n, layer := 12+r.IntN(28), r.IntN(s.Layers)
		q := randomQuery(r, s)
		a := f.decodeCall(n, 0, layer, trial, q)
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		init, local, k := keepOf(t, m, n, a)
		qr := meanGroups(s, q)
		scores := make([]float64, n)
		for b := init; b < n-local; b++ {
			sc, err := kernels.DecodeSidecar(f.payloads[kernels.SidecarESAMean][b])
			if err != nil {
				t.Fatal(err)
			}
			v := sc.Values[layer*s.KVHeads*s.HeadDim : (layer+1)*s.KVHeads*s.HeadDim]
			var mx float64
			for _, x := range v {
				mx = max(mx, math.Abs(float64(x)))
			}
			scale := float64(float32(mx) / 127)
			for i, x := range v {
				scores[b] += float64(qr[i]) * math.Round(float64(x)/scale) * scale
			}
		}
		want := slices.Concat(seq(0, init), bruteTopK(scores, init, n-local, k), seq(n-local, n))
		if !sameSelection(a.Selected, want, scores, init, n-local) {
			t.Fatalf("n %d: selected %v, reference %v", n, a.Selected, want)
		}
	}
}

// TestQuantizeInt8: every value is within half a step of its quantization, the largest
// magnitude maps to ±127, zeros to zero.
func TestQuantizeInt8(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 200 {
		v := make([]float32, 1+r.IntN(64))
		for i := range v {
			v[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(6)-3)))
		}
		q := make([]int8, len(v))
		scale := quantizeInt8(q, v)
		hit := false
		for i, x := range v {
			if math.Abs(float64(x)-float64(q[i])*float64(scale)) > float64(scale)*0.5001 {
				t.Fatalf("%v → %d × %v", x, q[i], scale)
			}
			hit = hit || q[i] == 127 || q[i] == -127
		}
		if !hit {
			t.Fatalf("no value at ±127: %v", q)
		}
	}
	q := []int8{5, 5}
	if s := quantizeInt8(q, []float32{0, 0}); s != 1 || q[0] != 0 || q[1] != 0 {
		t.Fatalf("zeros: %v, %v", s, q)
	}
}

// TestFloatRowsOfOtherElements: with bfloat16 and float32 sidecars the rows hold float32
// values, and every float method's selection equals its reference (Quest's reads the fp16 keys,
// whose minima and maxima every one of these elements holds exactly).
func TestFloatRowsOfOtherElements(t *testing.T) {
	for _, elem := range []kernels.DType{kernels.BFloat16, kernels.Float32} {
		f := newFixtureElem(t, testShape, 30, 59, elem)
		r := rand.New(rand.NewPCG(9, 10))
		for _, name := range []string{NameQuest, NameESA, NameGSA, NameKVStar} {
			m := newMethodEnv(t, name, methodConfigs[name], Env{Role: RoleWorker, Shape: testShape, Sidecars: f.src, SidecarElem: elem})
			if m.rowKind != rowF32 {
				t.Fatalf("%s %v: row kind %d", name, elem, m.rowKind)
			}
			for trial := range 20 {
				n, layer := 10+r.IntN(20), r.IntN(testShape.Layers)
				q := randomQuery(r, testShape)
				a := f.decodeCall(n, 0, layer, trial, q)
				if err := m.AttentionBegin(a); err != nil {
					t.Fatal(err)
				}
				init, local, k := keepOf(t, m, n, a)
				if init+local+k >= n {
					continue
				}
				scores := make([]float64, n)
				for b := init; b < n-local; b++ {
					scores[b] = f.refScore(t, name, b, layer, q)
				}
				want := slices.Concat(seq(0, init), bruteTopK(scores, init, n-local, k), seq(n-local, n))
				if !sameSelection(a.Selected, want, scores, init, n-local) {
					t.Fatalf("%s %v n %d: selected %v, reference %v", name, elem, n, a.Selected, want)
				}
			}
			if st := m.Stats(); st.Missing != 0 {
				t.Fatalf("%s %v: %+v", name, elem, st)
			}
		}
	}
}

// TestPoolConcurrentUse: requests sharing blocks select concurrently (layers at once, some
// requests finishing) from one small pool, and every selection equals the method's without a
// pool (run under the race detector in CI).
func TestPoolConcurrentUse(t *testing.T) {
	f := newFixture(t, testShape, 40, 61)
	conf := "{init_window_sz: 1, local_window_sz: 2, budget: 0.3}"
	env := Env{Role: RoleWorker, Shape: testShape, Sidecars: f.src, ReprPoolBytes: -1}
	plain := newMethodEnv(t, NameQuest, conf, env)
	env.ReprPoolBytes = poolBytesFor(plain, 48)
	m := newMethodEnv(t, NameQuest, conf, env)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 62))
			for step := range 30 {
				id := string(rune('a'+g)) + string(rune('0'+step/10))
				n, layer := 20+r.IntN(20), r.IntN(testShape.Layers)
				q := randomQuery(r, testShape)
				a, b := f.decodeCall(n, 0, layer, step, q), f.decodeCall(n, 0, layer, step, q)
				a.Request.ID = id
				if err := m.AttentionBegin(a); err != nil {
					errs <- err.Error()
					return
				}
				if err := plain.AttentionBegin(b); err != nil {
					errs <- err.Error()
					return
				}
				if !slices.Equal(a.Selected, b.Selected) {
					errs <- "selection differs from the method without a pool"
					return
				}
				if step%10 == 9 {
					m.RequestFinished(id)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if ps := m.PoolStats(); ps.Entries > 48 {
		t.Fatalf("pool %+v beyond its capacity", ps)
	}
}

// TestKVStarSoftmax: KVStar with head_score softmax selects the top-K of Σ over query heads of
// each block's share of Σ over every candidate's rows of exp(q_h[channels]·row/√D), computed
// the long way from the decoded sidecars; with head_select kv, per KV head.
func TestKVStarSoftmax(t *testing.T) {
	f := newFixture(t, testShape, 40, 79)
	s := testShape
	d, g := s.HeadDim, s.QHeads/s.KVHeads
	r := rand.New(rand.NewPCG(80, 81))
	for _, kv := range []bool{false, true} {
		conf := "{init_window_sz: 1, local_window_sz: 2, budget: 0.3, retrieval_stride: 1, head_score: softmax}"
		if kv {
			conf = "{init_window_sz: 1, local_window_sz: 2, budget: 0.3, retrieval_stride: 1, head_score: softmax, head_select: kv}"
		}
		m := newMethod(t, NameKVStar, f.src, conf, s)
		for trial := range 25 {
			n, layer := 12+r.IntN(28), r.IntN(s.Layers)
			q := randomQuery(r, s)
			a := f.decodeCall(n, 0, layer, trial, q)
			if err := m.AttentionBegin(a); err != nil {
				t.Fatal(err)
			}
			init, local, k := keepOf(t, m, n, a)
			mass := make([][]float64, n) // [block][query head]: Σ_rows exp(logit)
			z := make([]float64, s.QHeads)
			for b := init; b < n-local; b++ {
				sc, err := kernels.DecodeSidecar(f.payloads[kernels.SidecarKVStar][b])
				if err != nil {
					t.Fatal(err)
				}
				dk, rows := sc.Cols(), sc.Rows()
				ch, vals := sc.Channels[layer*s.KVHeads*dk:], sc.Values[layer*rows*s.KVHeads*dk:]
				mass[b] = make([]float64, s.QHeads)
				for qh := range s.QHeads {
					h := qh / g
					for row := range sc.ValidRows() {
						var dot float64
						for j := range dk {
							dot += float64(q[qh*d+int(ch[h*dk+j])]) * float64(vals[(row*s.KVHeads+h)*dk+j])
						}
						e := math.Exp(dot / math.Sqrt(float64(d)))
						mass[b][qh] += e
						z[qh] += e
					}
				}
			}
			groups := 1
			if kv {
				groups = s.KVHeads
			}
			for grp := range groups {
				scores := make([]float64, n)
				for b := init; b < n-local; b++ {
					for qh := range s.QHeads {
						if !kv || qh/g == grp {
							scores[b] += mass[b][qh] / z[qh]
						}
					}
				}
				want := slices.Concat(seq(0, init), bruteTopK(scores, init, n-local, k), seq(n-local, n))
				got := a.Selected
				if kv {
					got = a.HeadSelected[grp]
				}
				if !sameSelection(got, want, scores, init, n-local) {
					t.Fatalf("kv %v group %d n %d: %v, reference %v", kv, grp, n, got, want)
				}
			}
		}
	}
}

// TestPoolIdleListStaysBounded: requests that come and go over the same blocks do not grow the
// pool's idle list beyond its entries, and the pool still reclaims oldest-released first.
func TestPoolIdleListStaysBounded(t *testing.T) {
	f := newFixture(t, testShape, 20, 83)
	env := Env{Role: RoleWorker, Shape: testShape, Sidecars: f.src, ReprPoolBytes: -1}
	plain := newMethodEnv(t, NameESA, "{init_window_sz: 1, local_window_sz: 1, budget: 0.5}", env)
	env.ReprPoolBytes = poolBytesFor(plain, 18)
	m := newMethodEnv(t, NameESA, "{init_window_sz: 1, local_window_sz: 1, budget: 0.5}", env)
	q := randomQuery(rand.New(rand.NewPCG(1, 3)), testShape)
	for i := range 500 {
		a := f.decodeCall(20, 0, 0, 0, q)
		a.Request.ID = string(rune('a' + i%26))
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		m.RequestFinished(a.Request.ID)
	}
	m.pool.mu.Lock()
	n, entries := len(m.pool.idle), len(m.pool.ids)
	m.pool.mu.Unlock()
	if n > 2*entries+64 || entries != 18 {
		t.Fatalf("idle list %d for %d entries", n, entries)
	}
	if st := m.Stats(); st.Uncached != 0 {
		t.Fatalf("stats %+v", st)
	}
}
