package eval

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/sparse"
)

// LatencyOptions is the shape SelectLatency times a selection at: one layer of a long
// context. The zero value of a field takes DefaultLatency's.
type LatencyOptions struct {
	// Blocks is the context's blocks; BlockTokens the tokens per block.
	Blocks, BlockTokens int
	// QHeads, KVHeads and HeadDim are the layer's attention shape.
	QHeads, KVHeads, HeadDim int
	// Steps is the decode steps timed (after one untimed step that fills the representation
	// pool).
	Steps int
	// Init and Local are the windows in blocks, as in Options.
	Init, Local int
	// Seed seeds the synthetic keys and queries.
	Seed uint64
	// EvictBytes, when positive, is a buffer written between steps (untimed) so that a step
	// reads its rows from memory, not from a cache the previous step warmed: in a model of
	// many layers, the other layers' selections and attention run between two steps of one
	// layer. Make it larger than the last-level cache.
	EvictBytes int
}

// DefaultLatency is a 128K-token context's layer: 1,024 blocks of 128 tokens, 32 query heads on
// 32 KV heads of 128 dims, 200 steps, windows of 1 and 2 blocks, 64 MiB evicted between steps.
var DefaultLatency = LatencyOptions{Blocks: 1024, BlockTokens: 128, QHeads: 32, KVHeads: 32, HeadDim: 128, Steps: 200, Init: 1, Local: 2, Seed: 1, EvictBytes: 64 << 20}

// LatencyResult is one method configuration's selection cost at a LatencyOptions shape.
type LatencyResult struct {
	// Method and Budget are as in Result (the same names and nominal budget).
	Method string  `json:"method"`
	Budget float64 `json:"budget"`
	// Blocks, BlockTokens, QHeads, KVHeads, HeadDim are the shape timed.
	Blocks      int `json:"blocks"`
	BlockTokens int `json:"block_tokens"`
	QHeads      int `json:"q_heads"`
	KVHeads     int `json:"kv_heads"`
	HeadDim     int `json:"head_dim"`
	// Steps is the steps timed; EvictBytes the bytes written between them (LatencyOptions).
	Steps      int `json:"steps"`
	EvictBytes int `json:"evict_bytes"`
	// Attended is the fraction of the layer's (block, KV head) units the steps attended,
	// windows included (what the budget costs at this context).
	Attended float64 `json:"attended_fraction"`
	// CPU*Micros are the process CPU time (user + system, every thread: the selection, any
	// goroutine it starts and the garbage collector) per step: median, 90th percentile and
	// mean. WallMedianMicros is the median wall time, for comparison only (it counts time
	// the machine gave to other processes).
	CPUMedianMicros  float64 `json:"cpu_median_us"`
	CPUP90Micros     float64 `json:"cpu_p90_us"`
	CPUMeanMicros    float64 `json:"cpu_mean_us"`
	WallMedianMicros float64 `json:"wall_median_us"`
}

// SelectLatency times one layer's selection (AttentionBegin and AttentionFinished) of the
// method name (MethodConfig's names, variants included) at budget, in the steady state of
// decoding at o's shape, as process CPU time per step. The sidecars are real representations
// of K-shaped data: each block's fp16 keys ([BlockTokens][KVHeads][HeadDim]: per-channel
// offsets of a few large channels, a per-block component and per-token noise) go through the
// kernels' SidecarWriter as a dump's do; each step's query leans on one block's keys. Per-step
// CPU time is read from the process clock (CLOCK_PROCESS_CPUTIME_ID), so time the machine
// gives to other processes is not counted; run with GOMAXPROCS=1 to time one core's work. While
// a CPU profiler runs, the kernel serves that clock from the process's tick-updated timer, so
// per-step readings are then tick-grained: take the figures from runs without one.
func SelectLatency(name string, budget float64, o LatencyOptions) (LatencyResult, error) {
	d := DefaultLatency
	o.Blocks, o.BlockTokens = cmp0(o.Blocks, d.Blocks), cmp0(o.BlockTokens, d.BlockTokens)
	o.QHeads, o.KVHeads, o.HeadDim = cmp0(o.QHeads, d.QHeads), cmp0(o.KVHeads, d.KVHeads), cmp0(o.HeadDim, d.HeadDim)
	o.Steps, o.Seed = cmp0(o.Steps, d.Steps), cmp0(o.Seed, d.Seed)
	res := LatencyResult{Method: name, Budget: budget, Blocks: o.Blocks, BlockTokens: o.BlockTokens, QHeads: o.QHeads,
		KVHeads: o.KVHeads, HeadDim: o.HeadDim, Steps: o.Steps, EvictBytes: max(o.EvictBytes, 0)}
	if o.QHeads%o.KVHeads != 0 || o.Init < 0 || o.Local < 1 {
		return res, fmt.Errorf("%w: latency: %d query heads on %d KV heads, windows %d and %d", sparse.ErrInvalid, o.QHeads, o.KVHeads, o.Init, o.Local)
	}
	if _, err := processCPU(); err != nil {
		return res, err
	}
	mc, err := MethodConfig(name, budget, o.BlockTokens, o.Init, o.Local)
	if err != nil {
		return res, err
	}
	shape := sparse.Shape{Layers: 1, QHeads: o.QHeads, KVHeads: o.KVHeads, HeadDim: o.HeadDim, BlockSize: o.BlockTokens}
	src := &sparse.MapSidecars{}
	m, err := sparse.New(mc, sparse.Env{Role: sparse.RoleWorker, Sidecars: src, Shape: shape})
	if err != nil {
		return res, err
	}
	ss, ok := m.(sidecarSpecer)
	if !ok {
		return res, fmt.Errorf("%w: %s does not select from sidecars", sparse.ErrInvalid, name)
	}
	r := rand.New(rand.NewPCG(o.Seed, 0x1a7e))
	keys := newSyntheticKeys(r, o)
	ids, err := keys.store(src, ss.SidecarSpec())
	if err != nil {
		return res, err
	}
	var evict []byte
	if o.EvictBytes > 0 {
		evict = make([]byte, o.EvictBytes)
	}
	table := make([]int, o.Blocks)
	for i := range table {
		table[i] = i
	}
	req := &sparse.Request{ID: "latency", BlockIDs: ids, BlockTable: table}
	defer m.RequestFinished(req.ID)
	var units int64
	cpu, wall := make([]float64, 0, o.Steps), make([]float64, 0, o.Steps)
	for i := -1; i < o.Steps; i++ {
		q := keys.query(r)
		for j := 0; j < len(evict); j += 64 { // one write per cache line
			evict[j]++
		}
		a := &sparse.Attention{Phase: sparse.PhaseDecode, Step: i + 1, Request: req, Q: q, BlockTable: table, SeqLen: o.Blocks * o.BlockTokens}
		c0, _ := processCPU()
		w0 := time.Now()
		if err := m.AttentionBegin(a); err != nil {
			return res, fmt.Errorf("latency: %s step %d: %w", name, i+1, err)
		}
		sel, perHead := a.Selected, a.HeadSelected
		if err := m.AttentionFinished(a); err != nil {
			return res, fmt.Errorf("latency: %s step %d: %w", name, i+1, err)
		}
		w1 := time.Since(w0)
		c1, _ := processCPU()
		if i < 0 { // the warm-up: fills the pool
			continue
		}
		cpu = append(cpu, float64(c1-c0)/1e3)
		wall = append(wall, float64(w1)/1e3)
		switch {
		case perHead != nil:
			for _, s := range perHead {
				units += int64(len(s))
			}
		case sel != nil:
			units += int64(len(sel) * o.KVHeads)
		default: // dense: nothing rewritten
			units += int64(o.Blocks * o.KVHeads)
		}
	}
	res.Attended = float64(units) / float64(int64(o.Steps)*int64(o.Blocks*o.KVHeads))
	var sum float64
	for _, c := range cpu {
		sum += c
	}
	res.CPUMeanMicros = sum / float64(len(cpu))
	slices.Sort(cpu)
	slices.Sort(wall)
	res.CPUMedianMicros, res.CPUP90Micros = quantile(cpu, 0.5), quantile(cpu, 0.9)
	res.WallMedianMicros = quantile(wall, 0.5)
	return res, nil
}

// cmp0 is v, or def when v is 0.
func cmp0[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// quantile is the q-quantile of sorted s (nearest rank).
func quantile(s []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// syntheticKeys generates K-shaped data block by block: key[t][h][d] = offset[h][d] +
// topic_b[h][d] + noise, offsets N(0, 1) with one channel in 16 at 4× (the outlier channels of
// real keys), topics N(0, 0.5²) per block, noise N(0, 1) per token. A query of KV head h's
// group is its own N(0, 1) direction plus a random block's topic at 4×, so the score
// distribution over blocks has a few clear winners as decoding's does.
type syntheticKeys struct {
	o      LatencyOptions
	offset []float32 // [KVHeads][HeadDim]
	topics [][]float32
}

func newSyntheticKeys(r *rand.Rand, o LatencyOptions) *syntheticKeys {
	k := &syntheticKeys{o: o, offset: make([]float32, o.KVHeads*o.HeadDim), topics: make([][]float32, o.Blocks)}
	for i := range k.offset {
		k.offset[i] = float32(r.NormFloat64())
		if i%16 == 3 {
			k.offset[i] *= 4
		}
	}
	for b := range k.topics {
		t := make([]float32, o.KVHeads*o.HeadDim)
		for i := range t {
			t[i] = float32(0.5 * r.NormFloat64())
		}
		k.topics[b] = t
	}
	return k
}

// latencySidecars is the last set of sidecars SelectLatency wrote, by spec and shape: the
// configurations of one method that read the same representation share them (writing 1,024
// blocks of 128 tokens × 4,096 values takes seconds).
var latencySidecars struct {
	sync.Mutex
	key      latencyKey
	payloads [][]byte
}

type latencyKey struct {
	spec                                                 kernels.SidecarSpec
	blocks, blockTokens, qHeads, kvHeads, headDim, seedN uint64
}

// noiseLen is the length of the table of normal draws a token's noise is read from (at a
// random offset per token): drawing 537 M values per configuration would take longer than
// timing it.
const noiseLen = 1 << 16

// store writes every block's sidecar of spec (the kernels' writer over the block's fp16 K)
// into src and returns the blocks' ids.
func (k *syntheticKeys) store(src *sparse.MapSidecars, spec kernels.SidecarSpec) ([]engine.BlockID, error) {
	o := k.o
	ids := make([]engine.BlockID, o.Blocks)
	for b := range ids {
		ids[b] = md5.Sum(fmt.Appendf(nil, "latency block %d", b))
	}
	key := latencyKey{spec, uint64(o.Blocks), uint64(o.BlockTokens), uint64(o.QHeads), uint64(o.KVHeads), uint64(o.HeadDim), o.Seed}
	latencySidecars.Lock()
	defer latencySidecars.Unlock()
	if latencySidecars.key != key || latencySidecars.payloads == nil {
		latencySidecars.payloads = nil
		ps, err := k.write(spec)
		if err != nil {
			return nil, err
		}
		latencySidecars.key, latencySidecars.payloads = key, ps
	}
	for b, p := range latencySidecars.payloads {
		if err := src.Put(engine.SidecarKind(spec.Kind), ids[b], 1, p); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// write computes every block's sidecar payload of spec.
func (k *syntheticKeys) write(spec kernels.SidecarSpec) ([][]byte, error) {
	o := k.o
	w, err := kernels.NewSidecarWriter(spec, kernels.Float16)
	if err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	noise := make([]float32, noiseLen)
	for i := range noise {
		noise[i] = float32(r.NormFloat64())
	}
	row := o.KVHeads * o.HeadDim
	kb := make([]byte, o.BlockTokens*row*2)
	out := make([][]byte, o.Blocks)
	for b := range o.Blocks {
		topic := k.topics[b]
		for t := range o.BlockTokens {
			off := r.IntN(noiseLen)
			for i := range row {
				v := k.offset[i] + topic[i] + noise[(off+i)%noiseLen]
				binary.LittleEndian.PutUint16(kb[(t*row+i)*2:], kernels.Float32ToFloat16(v))
			}
		}
		if err := w.Begin(o.BlockTokens); err != nil {
			return nil, err
		}
		if err := w.AddLayer(0, kb); err != nil {
			return nil, err
		}
		if out[b], err = w.AppendPayload(nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// query returns a step's queries, [QHeads][HeadDim].
func (k *syntheticKeys) query(r *rand.Rand) []float32 {
	o := k.o
	q := make([]float32, o.QHeads*o.HeadDim)
	g := o.QHeads / o.KVHeads
	topic := k.topics[r.IntN(o.Blocks)]
	scale := float32(1 / math.Sqrt(float64(o.HeadDim)))
	for h := range o.QHeads {
		kv := h / g
		for d := range o.HeadDim {
			q[h*o.HeadDim+d] = scale * (float32(r.NormFloat64()) + 4*topic[kv*o.HeadDim+d])
		}
	}
	return q
}
