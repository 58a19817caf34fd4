package sparse

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ucm-go/ucm/kernels"
)

func newTestReRoPE(t *testing.T, w, train int) *ReRoPE {
	t.Helper()
	c := DefaultReRoPEConfig()
	c.Window, c.TrainingLength = w, train
	m, err := New(c, Env{Role: RoleWorker, Shape: Shape{Layers: 1, QHeads: 2, KVHeads: 1, HeadDim: 16, BlockSize: 4}})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*ReRoPE)
}

// TestReRoPEPage: a page is 3× the K-only page (K_rot, V, K_raw), the kernels' ReRoPE
// record shard, split into three equal tensors in that order; bad shapes and sizes are
// ErrInvalid.
func TestReRoPEPage(t *testing.T) {
	rec, err := Page(16, 8, 128, kernels.Float16)
	if err != nil || rec.ShardBytes != 3*16*8*128*2 || rec.TensorsPerShard != 3 {
		t.Fatalf("%+v %v", rec, err)
	}
	kv, err := kernels.CacheSpec{Layout: kernels.LayoutFlashAttn, DType: kernels.Float16, NumBlocks: 1, BlockSize: 16, KVHeads: 8, HeadDim: 128}.Record(1)
	if err != nil || 2*rec.ShardBytes != 3*kv.ShardBytes {
		t.Fatalf("ReRoPE page %d bytes, K/V page %d: %v", rec.ShardBytes, kv.ShardBytes, err)
	}
	n := int(rec.ShardBytes)
	page := make([]byte, n)
	for i := range page {
		page[i] = byte(i / (n / 3))
	}
	kr, v, kw, err := SplitPage(page, rec)
	if err != nil || len(kr) != n/3 || len(v) != n/3 || len(kw) != n/3 || kr[0] != 0 || v[0] != 1 || kw[len(kw)-1] != 2 {
		t.Fatalf("split: %d %d %d %v", len(kr), len(v), len(kw), err)
	}
	if cap(kr) != n/3 || cap(v) != n/3 {
		t.Fatal("a view may be appended into the next tensor")
	}
	if _, _, _, err := SplitPage(page[1:], rec); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if _, _, _, err := SplitPage(page[:2*kv.TensorBytes], kv); !errors.Is(err, ErrInvalid) {
		t.Fatal("a K/V record split as ReRoPE's")
	}
	for _, bad := range [][3]int{{0, 8, 128}, {16, 0, 128}, {16, 8, -1}, {1 << 20, 1 << 10, 1 << 10}} {
		if _, err := Page(bad[0], bad[1], bad[2], kernels.Float16); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// TestReRoPEScores: within the window the scores are ordinary RoPE's ⟨R(i)q, R(j)k⟩ (times
// the query scale); beyond it they do not depend on the distance; the query scale is 1 up to
// the training length and grows past it.
func TestReRoPEScores(t *testing.T) {
	const w, train, d = 8, 64, 16
	r := newTestReRoPE(t, w, train)
	rng := rand.New(rand.NewPCG(11, 12))
	q, k := randVec(rng, d), randVec(rng, d)
	for _, qpos := range []int{3, 20, 63, 100, 5000} {
		var kpos []int
		for p := 0; p <= qpos; p += 1 + qpos/40 {
			kpos = append(kpos, p)
		}
		kRot, kRaw := make([]float32, len(kpos)*d), make([]float32, len(kpos)*d)
		for j, p := range kpos {
			copy(kRaw[j*d:], k)
			copy(kRot[j*d:], rotated(t, r.rope, k, p))
		}
		got, err := r.Scores(q, qpos, kRot, kRaw, kpos)
		if err != nil {
			t.Fatal(err)
		}
		s := r.QueryScale(qpos)
		qr := rotated(t, r.rope, q, qpos)
		var far []float64
		for j, p := range kpos {
			if qpos-p < w {
				var want float64
				for i := range qr {
					want += float64(qr[i]) * float64(kRot[j*d+i])
				}
				if math.Abs(got[j]-s*want) > 1e-9*max(1, math.Abs(want)) {
					t.Fatalf("query %d key %d (distance %d < w): %v, RoPE %v", qpos, p, qpos-p, got[j], s*want)
				}
			} else {
				far = append(far, got[j])
			}
		}
		for _, f := range far {
			if f != far[0] {
				t.Fatalf("query %d: scores beyond the window differ: %v", qpos, far)
			}
		}
		// Beyond the window the score is RoPE's at distance w exactly.
		if len(far) > 0 {
			var want float64
			a, b := rotated(t, r.rope, q, qpos), rotated(t, r.rope, k, qpos-w)
			for i := range a {
				want += float64(a[i]) * float64(b[i])
			}
			if math.Abs(far[0]-s*want) > 1e-4*max(1, math.Abs(want)) {
				t.Fatalf("query %d: far score %v, RoPE at distance w %v", qpos, far[0], s*want)
			}
		}
	}
	// Ordinary RoPE scores do depend on the distance (so the check above can fail).
	a := rotated(t, r.rope, k, 0)
	b := rotated(t, r.rope, k, 30)
	var s0, s1 float64
	for i := range q {
		s0 += float64(q[i]) * float64(a[i])
		s1 += float64(q[i]) * float64(b[i])
	}
	if math.Abs(s0-s1) < 1e-3 {
		t.Fatal("RoPE scores at distances 0 and 30 agree")
	}
	prev := 0.0
	for pos := 0; pos < 10*train; pos++ {
		sc := r.QueryScale(pos)
		if pos+1 <= train && sc != 1 || pos+1 > train && !(sc > 1) || sc < prev {
			t.Fatalf("scale at %d: %v (previous %v)", pos, sc, prev)
		}
		prev = sc
	}
	for name, f := range map[string]func() error{
		"short query": func() error {
			_, err := r.Scores(q[:3], 5, make([]float32, d), make([]float32, d), []int{0})
			return err
		},
		"short keys":   func() error { _, err := r.Scores(q, 5, make([]float32, d), make([]float32, 2), []int{0}); return err },
		"future key":   func() error { _, err := r.Scores(q, 5, make([]float32, d), make([]float32, d), []int{6}); return err },
		"negative key": func() error { _, err := r.Scores(q, 5, make([]float32, d), make([]float32, d), []int{-1}); return err },
	} {
		if err := f(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestReRoPEConfig: keys and their errors.
func TestReRoPEConfig(t *testing.T) {
	c, err := ParseMethodConfig("ReRoPE", nil)
	if err != nil || *c.(*ReRoPEConfig) != *DefaultReRoPEConfig() {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []*ReRoPEConfig{{Window: 0, TrainingLength: 10, RopeTheta: 10000, RopePairing: "neox"},
		{Window: 4, TrainingLength: 1, RopeTheta: 10000, RopePairing: "neox"}, {Window: 4, TrainingLength: 10, RopeTheta: 0.5, RopePairing: "neox"},
		{Window: 4, TrainingLength: 10, RopeTheta: 10000, RopePairing: "x"}} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := New(DefaultReRoPEConfig(), Env{Shape: Shape{Layers: 1, QHeads: 1, KVHeads: 1, HeadDim: 7, BlockSize: 4}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("odd head dim: %v", err)
	}
}
