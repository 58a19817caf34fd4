package sparse

import (
	"crypto/md5"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
)

// GSA On-Device on an MLA model (sources §4): one latent KV head of kv_lora_rank + qk_rope_head_dim
// elements hashed by two encoders, query heads reduced by reduction_head_num (strided) and each
// hashed, a token's distance the sum over the reduced heads. There is no MLA model here: the
// tests run on a synthetic shape.

// mlaShape is DeepSeek-V2's structure at a small size: 8 query heads, one latent head of 48 + 16.
var mlaShape = Shape{Layers: 2, QHeads: 8, KVHeads: 1, HeadDim: 64, BlockSize: 8}

const mlaConf = "{hash_topk_tokens: 64, sink_token: 8, recent_token: 16, kv_lora_rank: 48, qk_rope_head_dim: 16, hash_bits_qk_rope: 8, reduction_head_num: 2}"

// mlaSidecars writes the method's hash sidecars of the fixture's keys into a new source and
// returns it with the payloads.
func mlaSidecars(t testing.TB, f *fixture, spec kernels.SidecarSpec) (*MapSidecars, [][]byte) {
	t.Helper()
	src := &MapSidecars{}
	var payloads [][]byte
	for b := range f.ids {
		w, err := kernels.NewSidecarWriter(spec, kernels.Float16)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Begin(f.shape.BlockSize); err != nil {
			t.Fatal(err)
		}
		for l := range f.shape.Layers {
			if err := w.AddLayer(l, f.kb[b][l]); err != nil {
				t.Fatal(err)
			}
		}
		p, err := w.AppendPayload(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := src.Put(engine.SidecarKind(spec.Kind), f.ids[b], f.shape.Layers, p); err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, p)
	}
	return src, payloads
}

// mlaRefScore is block b's score at layer l, the long way: the query heads averaged in r
// strided groups in float64, each hashed by the stored sidecar's two encoders (latent part,
// then RoPE part), and per token the sum over the reduced heads of a bit-loop Hamming distance
// to the token's latent code; the block's is the minimum over its tokens, negated.
func mlaRefScore(t testing.TB, payload []byte, s Shape, r, l int, q []float32) float64 {
	t.Helper()
	sc, err := kernels.DecodeSidecar(payload)
	if err != nil {
		t.Fatal(err)
	}
	encs, err := sc.HashEncoders()
	if err != nil {
		t.Fatal(err)
	}
	if len(encs) != 2 || encs[0].InputDim() != 48 || encs[1].InputDim() != 16 {
		t.Fatalf("stored encoders %d, want MLA's two (48, 16)", len(encs))
	}
	d, heads := s.HeadDim, s.QHeads/r
	c := encs[0].CodeBytes() + encs[1].CodeBytes()
	qcodes := make([][]byte, heads)
	for j := range heads {
		x := make([]float32, d)
		for e := range d {
			var sum float64
			for i := range r {
				sum += float64(q[(j+i*heads)*d+e])
			}
			x[e] = float32(sum / float64(r))
		}
		code := make([]byte, c)
		if err := encs[0].Hash(code[:encs[0].CodeBytes()], x[:48]); err != nil {
			t.Fatal(err)
		}
		if err := encs[1].Hash(code[encs[0].CodeBytes():], x[48:]); err != nil {
			t.Fatal(err)
		}
		qcodes[j] = code
	}
	codes := sc.Codes[l*s.BlockSize*c:]
	best := math.MaxInt
	for tok := range s.BlockSize {
		dist := 0
		for _, qc := range qcodes {
			for i := range c {
				for bit := range 8 {
					if (qc[i]>>bit)&1 != (codes[tok*c+i]>>bit)&1 {
						dist++
					}
				}
			}
		}
		best = min(best, dist)
	}
	return -float64(best)
}

// TestMLASelectionEqualsReference: on MLA, GSA On-Device's selection is the windows plus the
// top-K of the reference score, with and without head reduction, and its sidecar spec is the
// two-encoder one of the latent head.
func TestMLASelectionEqualsReference(t *testing.T) {
	f := newFixture(t, mlaShape, 40, 17)
	for _, r := range []int{1, 2, 8} {
		t.Run(fmt.Sprintf("reduction=%d", r), func(t *testing.T) {
			conf := fmt.Sprintf("{hash_topk_tokens: 64, sink_token: 8, recent_token: 16, kv_lora_rank: 48, qk_rope_head_dim: 16, hash_bits_qk_rope: 8, reduction_head_num: %d}", r)
			probe := newMethod(t, NameGSAOnDevice, &MapSidecars{}, conf, mlaShape)
			spec := probe.(*blockMethod).SidecarSpec()
			if spec.Heads != 1 || spec.Dim != 64 || spec.HashBits != 48 || spec.RopeDim != 16 || spec.RopeBits != 8 {
				t.Fatalf("sidecar spec %+v: want one head of 64, 48 bits of the latent part, 8 of the 16 RoPE dims", spec)
			}
			src, payloads := mlaSidecars(t, f, spec)
			m := newMethod(t, NameGSAOnDevice, src, conf, mlaShape)
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			for trial := range 50 {
				n := 12 + rng.IntN(28)
				layer := rng.IntN(mlaShape.Layers)
				q := randomQuery(rng, mlaShape)
				a := f.decodeCall(n, 0, layer, trial, q)
				if err := m.AttentionBegin(a); err != nil {
					t.Fatal(err)
				}
				init, local, k := keepOf(t, m, n, a)
				scores := make([]float64, n)
				for b := init; b < n-local; b++ {
					scores[b] = mlaRefScore(t, payloads[b], mlaShape, r, layer, q)
				}
				want := slices.Concat(seq(0, init), bruteTopK(scores, init, n-local, k), seq(n-local, n))
				if !slices.Equal(a.Selected, want) {
					t.Fatalf("n %d layer %d: selected %v, reference %v (scores %v)", n, layer, a.Selected, want, scores)
				}
				if err := m.AttentionFinished(a); err != nil {
					t.Fatal(err)
				}
			}
			if st := m.(*blockMethod).Stats(); st.Selections == 0 || st.Missing != 0 {
				t.Fatalf("stats %+v: want selections and no missing sidecar", st)
			}
		})
	}
}

// TestMLAFindsAlignedBlock: the block whose latent keys (both parts) point along the reduced
// query is selected among random ones, at every position of the context.
func TestMLAFindsAlignedBlock(t *testing.T) {
	s := mlaShape
	r := rand.New(rand.NewPCG(21, 22))
	q := randomQuery(r, s)
	mean := make([]float32, s.HeadDim) // the mean query head: the direction every reduced head shares
	for h := range s.QHeads {
		for e := range s.HeadDim {
			mean[e] += q[h*s.HeadDim+e] / float32(s.QHeads)
		}
	}
	for i := range q { // heads close to their mean, so that the direction is the query's
		q[i] = mean[i%s.HeadDim] + 0.2*q[i]
	}
	const blocks = 30
	for target := 2; target < blocks-2; target += 5 {
		f := &fixture{shape: s}
		for b := range blocks {
			f.ids = append(f.ids, md5.Sum(fmt.Appendf(nil, "mla %d", b)))
			var kl [][]byte
			for range s.Layers {
				k := make([]float32, s.BlockSize*s.HeadDim)
				for i := range k {
					k[i] = float32(r.NormFloat64())
					if b == target {
						k[i] = 3*mean[i%s.HeadDim] + 0.3*k[i]
					}
				}
				kb := make([]byte, 2*len(k))
				if err := kernels.EncodeFloat32(kb, k, kernels.Float16); err != nil {
					t.Fatal(err)
				}
				kl = append(kl, kb)
			}
			f.kb = append(f.kb, kl)
		}
		probe := newMethod(t, NameGSAOnDevice, &MapSidecars{}, mlaConf, s)
		src, _ := mlaSidecars(t, f, probe.(*blockMethod).SidecarSpec())
		m := newMethod(t, NameGSAOnDevice, src, mlaConf, s)
		a := f.decodeCall(blocks, 0, 1, 0, q)
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(a.Selected, target) {
			t.Fatalf("aligned block %d not selected: %v", target, a.Selected)
		}
	}
}

// TestMLAConfigMustFitShape: an MLA configuration on a model it does not describe is refused
// at New with the key at fault; head_select kv on MLA is the layer's selection.
func TestMLAConfigMustFitShape(t *testing.T) {
	cases := []struct {
		shape Shape
		conf  string
		key   string
	}{
		{Shape{Layers: 2, QHeads: 8, KVHeads: 2, HeadDim: 64, BlockSize: 8}, mlaConf, "kv_lora_rank"},
		{Shape{Layers: 2, QHeads: 8, KVHeads: 1, HeadDim: 72, BlockSize: 8}, mlaConf, "kv_lora_rank"},
		{Shape{Layers: 2, QHeads: 9, KVHeads: 1, HeadDim: 64, BlockSize: 8}, mlaConf, "reduction_head_num"},
	}
	for _, c := range cases {
		block := sparseBlock(t, "ucm_sparse_config:\n  GSAOnDevice: "+c.conf+"\n")
		cfg, err := Choose(block, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(cfg, Env{Role: RoleWorker, Shape: c.shape, Sidecars: &MapSidecars{}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Key != "ucm_sparse_config.GSAOnDevice."+c.key || !errors.Is(err, ErrInvalid) {
			t.Errorf("shape %+v: %v; want a ConfigError for %s", c.shape, err, c.key)
		}
	}
	m := newMethod(t, NameGSAOnDevice, &MapSidecars{}, "{kv_lora_rank: 48, qk_rope_head_dim: 16, head_select: kv}", mlaShape)
	if m.(*blockMethod).perKV {
		t.Fatal("head_select kv on MLA's single KV head should select per layer")
	}
}
