package sparse

import (
	"crypto/md5"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
)

// benchShapes are a 128K-token context's layer: 1,024 blocks of 128 tokens, 32 KV heads × 128
// dims (and 32 query heads), the shape of the ≤ 1 ms selection-latency target (docs/sparse.md);
// and the GQA shape of Llama-3-8B (32 query heads on 8 KV heads), whose sidecars are a quarter of
// the size.
var benchShapes = []struct {
	name  string
	shape Shape
}{
	{"kv32", Shape{Layers: 1, QHeads: 32, KVHeads: 32, HeadDim: 128, BlockSize: 128}},
	{"kv8", Shape{Layers: 1, QHeads: 32, KVHeads: 8, HeadDim: 128, BlockSize: 128}},
}

const benchBlocks = 1024

// benchSidecars fills src with synthetic sidecars of spec (random values, random codes) for
// benchBlocks blocks, encoded as the writers encode them, and returns their ids.
func benchSidecars(b *testing.B, src *MapSidecars, spec kernels.SidecarSpec) []engine.BlockID {
	b.Helper()
	kind, s := spec.Kind, spec
	h := kernels.SidecarHeader{SidecarSpec: spec, Input: kernels.Float16, Tokens: s.BlockSize}
	if kind == kernels.SidecarHash {
		encs, err := spec.HashEncoders()
		if err != nil {
			b.Fatal(err)
		}
		h.Fingerprint = kernels.HashFingerprint(encs...)
	}
	r := rand.New(rand.NewPCG(1, 2))
	ids := make([]engine.BlockID, benchBlocks)
	for i := range ids {
		ids[i] = md5.Sum(fmt.Appendf(nil, "bench %d", i))
		sc := &kernels.Sidecar{SidecarHeader: h}
		n := h.Rows() * h.Heads * h.Cols()
		switch kind {
		case kernels.SidecarHash:
			sc.Codes = make([]byte, n)
			for j := range sc.Codes {
				sc.Codes[j] = byte(r.Uint32())
			}
		default:
			sc.Values = make([]float32, n)
			for j := range sc.Values {
				sc.Values[j] = float32(r.NormFloat64())
			}
			if kind == kernels.SidecarQuest { // min ≤ max
				half := n / 2
				for j := range half {
					lo, hi := sc.Values[j], sc.Values[half+j]
					sc.Values[j], sc.Values[half+j] = min(lo, hi), max(lo, hi)
				}
			}
			if kind == kernels.SidecarKVStar {
				dk := h.Cols()
				sc.Channels = make([]uint16, h.Heads*dk)
				for hd := range h.Heads {
					for j := range dk {
						sc.Channels[hd*dk+j] = uint16(2 * j)
					}
				}
			}
		}
		p, err := kernels.EncodeSidecar(nil, sc)
		if err != nil {
			b.Fatal(err)
		}
		if err := src.Put(engine.SidecarKind(kind), ids[i], s.Layers, p); err != nil {
			b.Fatal(err)
		}
	}
	return ids
}

// BenchmarkSelect1024: one layer's selection over 1,024 blocks × 32 heads × 128 dims at a 10 %
// budget, per shape and method, in the steady state of decoding: the representation pool
// already holds the blocks' rows (one warm-up step fills it), so a step scores the rows in
// place, takes the top-K and rewrites. "cold" runs every step without a pool: load the parts
// from memory (one copy), verify them, convert and score, as a step does for blocks it has not
// seen. Each run also times one copy of the bytes its steps read (floor-ms, the memory floor of
// the same run) and reports the ratio (x-floor). Run alone, on one core:
//
//	GOMAXPROCS=1 go test -run '^$' -bench Select1024 -benchtime 20x ./sparse/
func BenchmarkSelect1024(b *testing.B) {
	for _, sh := range benchShapes {
		b.Run(sh.name, func(b *testing.B) { benchSelect(b, sh.shape, benchCases) })
	}
	// DeepSeek-V2's MLA: 128 query heads on one latent head of 512 + 64, UCM's configuration
	// (hash bits = widths, reduction_head_num 2: 64 hashed query heads).
	b.Run("mla", func(b *testing.B) {
		benchSelect(b, Shape{Layers: 1, QHeads: 128, KVHeads: 1, HeadDim: 576, BlockSize: 128}, []selectCase{
			{"GSAOnDevice-r2", NameGSAOnDevice, "{sink_token: 128, recent_token: 256, budget: 0.1, kv_lora_rank: 512, qk_rope_head_dim: 64, reduction_head_num: 2}", false},
		})
	})
}

// selectCase is one method configuration of BenchmarkSelect1024; cold runs without a pool.
type selectCase struct {
	name, method, conf string
	cold               bool
}

var benchCases = []selectCase{
	{NameQuest, NameQuest, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1}", false},
	{NameESA, NameESA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1}", false},
	{"ESA-int8", NameESA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1, repr_dtype: int8}", false},
	{"ESA-softmax", NameESA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1, head_score: softmax}", false},
	{"ESA-softmax-kv", NameESA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1, head_score: softmax, head_select: kv}", false},
	{NameGSA, NameGSA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1, min_blocks: 0}", false},
	{NameKVStar, NameKVStar, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1, retrieval_stride: 1}", false},
	{"KVStar-softmax", NameKVStar, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1, retrieval_stride: 1, head_score: softmax}", false},
	{NameGSAOnDevice, NameGSAOnDevice, "{sink_token: 128, recent_token: 256, budget: 0.1, hash_bits: 128}", false},
	{"ESA-cold", NameESA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.1}", true},
}

func benchSelect(b *testing.B, benchShape Shape, cases []selectCase) {
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			src := &MapSidecars{}
			env := Env{Role: RoleWorker, Shape: benchShape, Sidecars: src}
			if c.cold {
				env.ReprPoolBytes = -1
			}
			cfg, err := Choose(sparseBlock(b, "ucm_sparse_config:\n  "+c.method+": "+c.conf+"\n"), nil, "")
			if err != nil {
				b.Fatal(err)
			}
			mm, err := New(cfg, env)
			if err != nil {
				b.Fatal(err)
			}
			m := mm.(*blockMethod)
			ids := benchSidecars(b, src, m.spec)
			q := randomQuery(rand.New(rand.NewPCG(3, 4)), benchShape)
			table := make([]int, benchBlocks)
			for i := range table {
				table[i] = i
			}
			req := &Request{ID: "bench", BlockIDs: ids, BlockTable: table}
			step := func(i int) {
				a := &Attention{Phase: PhaseDecode, Step: i, Request: req, Q: q, BlockTable: table, SeqLen: benchBlocks * benchShape.BlockSize}
				if err := m.AttentionBegin(a); err != nil {
					b.Fatal(err)
				}
				// head_select kv: every KV head keeps its own 102 (Selected is their union).
				for h, sel := range a.HeadSelected {
					if len(sel) != 102 {
						b.Fatalf("KV head %d: %d selected", h, len(sel))
					}
				}
				if a.HeadSelected == nil && len(a.Selected) != 102 {
					b.Fatalf("%d selected", len(a.Selected))
				}
			}
			step(-1) // warm-up: fills the pool
			b.ResetTimer()
			for i := range b.N {
				step(i)
			}
			b.StopTimer()
			perStep := b.Elapsed().Seconds() / float64(b.N)
			// The floor: one copy of the bytes a step reads (the candidates' rows, or their parts).
			candidates := benchBlocks - 3
			n := candidates * m.rowBytes
			if c.cold {
				n = candidates * m.spec.PartBytes()
			}
			srcb, dst := make([]byte, n), make([]byte, n)
			for i := range srcb {
				srcb[i] = byte(i)
			}
			copy(dst, srcb)
			const reps = 20
			start := time.Now()
			for range reps {
				copy(dst, srcb)
			}
			floor := time.Since(start).Seconds() / reps
			b.ReportMetric(perStep*1000, "ms/layer")
			b.ReportMetric(floor*1000, "floor-ms")
			b.ReportMetric(perStep/floor, "x-floor")
			b.ReportMetric(float64(n)/(1<<20), "MiB-read")
			if ps := m.PoolStats(); !c.cold && ps.Entries != candidates {
				b.Fatalf("pool %+v: want %d entries", ps, candidates)
			}
		})
	}
}
