package sparse

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/kernels"
)

// refScoreKV is each method's score of block b at layer l per KV head (head_select kv),
// computed the long way as refScore does: Quest summed over the KV head's query heads, ESA's
// dot and GSA's distance per head, KVStar's best row per head, GSA On-Device's minimum over
// tokens of the head's own Hamming distance (a bit loop).
func (f *fixture) refScoreKV(t testing.TB, method string, b, l int, q []float32) []float64 {
	t.Helper()
	s := f.shape
	d, g := s.HeadDim, s.QHeads/s.KVHeads
	qr := meanGroups(s, q)
	out := make([]float64, s.KVHeads)
	decode := func(kind kernels.SidecarKind) *kernels.Sidecar {
		sc, err := kernels.DecodeSidecar(f.payloads[kind][b])
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	switch method {
	case NameQuest:
		for qh := range s.QHeads {
			kv := qh / g
			var head float64
			for c := range d {
				lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
				for tok := range s.BlockSize {
					v := f.k[b][l][(tok*s.KVHeads+kv)*d+c]
					lo, hi = min(lo, v), max(hi, v)
				}
				head += float64(max(q[qh*d+c]*lo, q[qh*d+c]*hi))
			}
			out[kv] += float64(float32(head))
		}
	case NameESA, NameGSA:
		r := decode(kernels.SidecarESAMean).Values[l*s.KVHeads*d:]
		for h := range s.KVHeads {
			var dot, dist float64
			for c := range d {
				x, y := float64(qr[h*d+c]), float64(r[h*d+c])
				dot += x * y
				dist += (x - y) * (x - y)
			}
			out[h] = dot
			if method == NameGSA {
				out[h] = -math.Sqrt(dist)
			}
		}
	case NameKVStar:
		sc := decode(kernels.SidecarKVStar)
		dk, rows := sc.Cols(), sc.Rows()
		ch, vals := sc.Channels[l*s.KVHeads*dk:], sc.Values[l*rows*s.KVHeads*dk:]
		for h := range s.KVHeads {
			best := math.Inf(-1)
			for m := range sc.ValidRows() {
				var dot float64
				for j := range dk {
					dot += float64(qr[h*d+int(ch[h*dk+j])]) * float64(vals[(m*s.KVHeads+h)*dk+j])
				}
				best = max(best, dot)
			}
			out[h] = best
		}
	case NameGSAOnDevice:
		sc := decode(kernels.SidecarHash)
		encs, err := sc.HashEncoders()
		if err != nil {
			t.Fatal(err)
		}
		cb := encs[0].CodeBytes()
		row := s.KVHeads * cb
		codes := sc.Codes[l*s.BlockSize*row:]
		for h := range s.KVHeads {
			qc := make([]byte, cb)
			if err := encs[0].Hash(qc, qr[h*d:(h+1)*d]); err != nil {
				t.Fatal(err)
			}
			best := math.MaxInt
			for tok := range s.BlockSize {
				dist := 0
				for i := range cb {
					for bit := range 8 {
						if (qc[i]>>bit)&1 != (codes[tok*row+h*cb+i]>>bit)&1 {
							dist++
						}
					}
				}
				best = min(best, dist)
			}
			out[h] = -float64(best)
		}
	default:
		t.Fatalf("no reference for %s", method)
	}
	return out
}

// TestHeadSelectKV: with head_select kv every KV head's selection is the windows plus the
// top-K of its own score computed the long way (ESA's softmax variant: the softmax shares of
// the head's query heads), Selected and the rewritten table are their union, and restoring
// clears them; a stride holds every head's selection. Also with one query head per KV head
// (ESA's softmax variant: each KV head's score is its one query head's share).
func TestHeadSelectKV(t *testing.T) {
	f := newFixture(t, testShape, 40, 71)
	headSelectKV(t, f, testShape, "")
	mha := Shape{Layers: 2, QHeads: 2, KVHeads: 2, HeadDim: 16, BlockSize: 8}
	headSelectKV(t, newFixture(t, mha, 40, 74), mha, "mha/")
	s := testShape
	r := rand.New(rand.NewPCG(72, 73))
	// A stride holds each head's selection.
	m := newMethod(t, NameKVStar, f.src, "{init_window_sz: 1, local_window_sz: 2, sparse_ratio: 0.2, retrieval_stride: 4, head_select: kv}", s)
	var held [][]int
	for step := range 12 {
		a := f.decodeCall(30, 0, 1, step, randomQuery(r, s))
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		if step%4 == 0 {
			held = a.HeadSelected
		} else if !slices.EqualFunc(a.HeadSelected, held, slices.Equal) {
			t.Fatalf("step %d: %v changed within the stride window (held %v)", step, a.HeadSelected, held)
		}
	}
	node := sparseBlock(t, "ucm_sparse_config:\n  ESA: {retrieval_lag: 1, head_select: kv}\n")["ESA"]
	if _, err := ParseMethodConfig(NameESA, &node); !isConfigErr(err, "ucm_sparse_config.ESA.retrieval_lag") {
		t.Fatalf("lag with head_select kv: %v", err)
	}
	node = sparseBlock(t, "ucm_sparse_config:\n  Quest: {head_select: token}\n")["Quest"]
	if _, err := ParseMethodConfig(NameQuest, &node); !isConfigErr(err, "ucm_sparse_config.Quest.head_select") {
		t.Fatalf("head_select token: %v", err)
	}
}

// headSelectKV is TestHeadSelectKV's check of every method's per-head selection on fixture f
// of shape s, its subtests named with prefix.
func headSelectKV(t *testing.T, f *fixture, s Shape, prefix string) {
	confs := map[string]string{}
	for name, c := range methodConfigs {
		confs[name] = strings.TrimSuffix(c, "}") + ", head_select: kv}"
	}
	confs[NameESA+"+softmax"] = "{init_window_sz: 1, local_window_sz: 2, budget: 0.3, head_score: softmax, head_select: kv}"
	r := rand.New(rand.NewPCG(72, 73))
	for label, conf := range confs {
		name, variant, _ := cutPlus(label)
		t.Run(prefix+label, func(t *testing.T) {
			m := newMethod(t, name, f.src, conf, s).(*blockMethod)
			if !m.perKV {
				t.Fatal("head_select kv not set")
			}
			differ := false
			for trial := range 40 {
				n, layer := 12+r.IntN(28), r.IntN(s.Layers)
				q := randomQuery(r, s)
				a := f.decodeCall(n, 0, layer, trial, q)
				orig := slices.Clone(a.BlockTable)
				if err := m.AttentionBegin(a); err != nil {
					t.Fatal(err)
				}
				init, local, k := keepOf(t, m, n, a)
				if init+local+k >= n {
					continue
				}
				per := make([][]float64, n)
				for b := init; b < n-local; b++ {
					if variant == "softmax" {
						per[b] = make([]float64, s.QHeads) // per query head first
						sc, err := kernels.DecodeSidecar(f.payloads[kernels.SidecarESAMean][b])
						if err != nil {
							t.Fatal(err)
						}
						for qh := range s.QHeads {
							rv := sc.Values[(layer*s.KVHeads+qh/(s.QHeads/s.KVHeads))*s.HeadDim:]
							for c := range s.HeadDim {
								per[b][qh] += float64(q[qh*s.HeadDim+c]) * float64(rv[c])
							}
						}
						continue
					}
					per[b] = f.refScoreKV(t, name, b, layer, q)
				}
				if variant == "softmax" {
					kvs := make([][]float64, n)
					for b := init; b < n-local; b++ {
						kvs[b] = make([]float64, s.KVHeads)
					}
					sd := math.Sqrt(float64(s.HeadDim))
					for qh := range s.QHeads {
						mx := math.Inf(-1)
						for b := init; b < n-local; b++ {
							mx = max(mx, per[b][qh]/sd)
						}
						var z float64
						for b := init; b < n-local; b++ {
							z += math.Exp(per[b][qh]/sd - mx)
						}
						for b := init; b < n-local; b++ {
							kvs[b][qh/(s.QHeads/s.KVHeads)] += math.Exp(per[b][qh]/sd-mx) / z
						}
					}
					per = kvs
				}
				if len(a.HeadSelected) != s.KVHeads {
					t.Fatalf("head selections %v", a.HeadSelected)
				}
				for h := range s.KVHeads {
					scores := make([]float64, n)
					for b := init; b < n-local; b++ {
						scores[b] = per[b][h]
					}
					want := slices.Concat(seq(0, init), bruteTopK(scores, init, n-local, k), seq(n-local, n))
					if !sameSelection(a.HeadSelected[h], want, scores, init, n-local) {
						t.Fatalf("n %d layer %d head %d: %v, reference %v", n, layer, h, a.HeadSelected[h], want)
					}
				}
				differ = differ || !slices.Equal(a.HeadSelected[0], a.HeadSelected[1])
				if want := unionSorted(a.HeadSelected); !slices.Equal(a.Selected, want) {
					t.Fatalf("selected %v, union of the heads %v", a.Selected, want)
				}
				wantTable, wantLen, _ := RewriteBlockTable(orig, a.Selected, a.origSeqLen, s.BlockSize)
				if !slices.Equal(a.BlockTable, wantTable) || a.SeqLen != wantLen {
					t.Fatalf("rewrite %v %d, want %v %d", a.BlockTable, a.SeqLen, wantTable, wantLen)
				}
				if err := m.AttentionFinished(a); err != nil || a.HeadSelected != nil || a.Selected != nil {
					t.Fatalf("not restored: %v %v %v", err, a.HeadSelected, a.Selected)
				}
			}
			if !differ {
				t.Fatal("the heads always selected the same blocks: the test cannot tell per-head selection apart")
			}
		})
	}
}
