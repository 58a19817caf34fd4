package sparse

import (
	"fmt"
	"math"

	"github.com/ucm-go/ucm/kernels"
	"gopkg.in/yaml.v3"
)

// ReRoPE (sources §7): attention beyond the trained context. Within a window of w positions a
// query sees keys with ordinary RoPE (relative distance i − j); beyond it every key is seen at
// the same distance w, so no distance exceeds what training saw. That needs each key both
// rotated (K_rot, RoPE at its position) and raw (K_raw, before RoPE): the cache page holds
// three tensors, K_rot, V, K_raw, and its size is 3·block·kv_heads·head_dim·dtype bytes, not
// the usual 2 (Page: the kernels' LayoutReRoPE). Queries are scaled by max(1, ln(pos+1)/ln(training_length)).

// ReRoPEConfig configures ReRoPE.
type ReRoPEConfig struct {
	// Window is w (rerope_window): keys closer than w positions use ordinary RoPE.
	Window int
	// TrainingLength is the context the model was trained at (training_length): queries
	// past it are scaled up logarithmically.
	TrainingLength int
	// RopeTheta and RopePairing ("neox" or "interleaved") are the model's RoPE.
	RopeTheta   float64
	RopePairing string
}

// Method returns NameReRoPE.
func (*ReRoPEConfig) Method() string { return NameReRoPE }

// DefaultReRoPEConfig is w = 512, training length 4096, θ 10000, NeoX pairing (UCM's sources
// give no defaults; these are the ReRoPE author's example).
func DefaultReRoPEConfig() *ReRoPEConfig {
	return &ReRoPEConfig{Window: 512, TrainingLength: 4096, RopeTheta: 10000, RopePairing: "neox"}
}

// Validate checks the values.
func (c *ReRoPEConfig) Validate() error {
	p := "ucm_sparse_config." + NameReRoPE
	switch {
	case c.Window < 1 || c.Window > 1<<30:
		return configErr(p+".rerope_window", "%d: want a position count in [1, 2^30]", c.Window)
	case c.TrainingLength < 2 || c.TrainingLength > 1<<30:
		return configErr(p+".training_length", "%d: want a position count in [2, 2^30]", c.TrainingLength)
	case !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0):
		return configErr(p+".rope_theta", "%v: want a finite number > 1", c.RopeTheta)
	}
	if _, err := ParsePairing(c.RopePairing); err != nil {
		return configErr(p+".rope_pairing", "%q: want neox or interleaved", c.RopePairing)
	}
	return nil
}

func parseReRoPE(key string, node *yaml.Node) (MethodConfig, error) {
	c := DefaultReRoPEConfig()
	err := parseFields(key, node, []field{
		intField(&c.Window, "rerope_window", "window"),
		intField(&c.TrainingLength, "training_length"),
		floatField(&c.RopeTheta, "rope_theta"),
		stringField(&c.RopePairing, "rope_pairing"),
	})
	return c, err
}

// ReRoPE is the ReRoPE method: its scheduler and worker hooks are the defaults (it selects
// nothing); Scores is its attention scoring and Page / SplitPage its cache layout.
type ReRoPE struct {
	Base
	cfg   ReRoPEConfig
	shape Shape
	rope  RoPE
}

func init() {
	register(NameReRoPE, factory{
		parse: parseReRoPE,
		build: func(mc MethodConfig, env Env) (SparseMethod, error) {
			return NewReRoPE(*mc.(*ReRoPEConfig), env.Shape)
		},
	})
}

// NewReRoPE builds ReRoPE for a model shape (an even head dim).
func NewReRoPE(c ReRoPEConfig, s Shape) (*ReRoPE, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	pair, _ := ParsePairing(c.RopePairing)
	r := &ReRoPE{cfg: c, shape: s, rope: RoPE{Dim: s.HeadDim, Theta: c.RopeTheta, Pairing: pair}}
	if err := r.rope.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// Name returns NameReRoPE.
func (*ReRoPE) Name() string { return NameReRoPE }

// Page returns the store record shard of one layer of one block in ReRoPE's layout: the
// kernels' LayoutReRoPE ([3, num_blocks, block_size, kv_heads, head_dim] in the cache), three
// tensors K_rot, V, K_raw of blockSize·kvHeads·headDim elements of dt each, so ShardBytes =
// 3·TensorBytes (3/2 of an ordinary K/V page: nothing may assume 2 tensors).
func Page(blockSize, kvHeads, headDim int, dt kernels.DType) (kernels.RecordLayout, error) {
	rec, err := kernels.CacheSpec{Layout: kernels.LayoutReRoPE, DType: dt, NumBlocks: 1, BlockSize: blockSize,
		KVHeads: kvHeads, HeadDim: headDim}.Record(1)
	if err != nil {
		return rec, fmt.Errorf("%w: rerope: page of %d tokens × %d heads × %d %v: %v", ErrInvalid, blockSize, kvHeads, headDim, dt, err)
	}
	return rec, nil
}

// SplitPage returns the three tensors of a page (one shard of Page's layout), in this order:
// K_rot, V, K_raw, each [blockSize][kvHeads][headDim], capped so that an append cannot spill
// into the next.
func SplitPage(page []byte, rec kernels.RecordLayout) (kRot, v, kRaw []byte, err error) {
	t := int(rec.TensorBytes)
	if rec.TensorsPerShard != 3 || int(rec.ShardBytes) != 3*t || len(page) != 3*t {
		return nil, nil, nil, fmt.Errorf("%w: rerope: page of %d bytes for a record %+v", ErrInvalid, len(page), rec)
	}
	return page[:t:t], page[t : 2*t : 2*t], page[2*t:], nil
}

// QueryScale is max(1, ln(pos+1)/ln(TrainingLength)): 1 up to the trained context, growing
// logarithmically past it.
func (r *ReRoPE) QueryScale(pos int) float64 {
	return max(1, math.Log(float64(pos)+1)/math.Log(float64(r.cfg.TrainingLength)))
}

// Scores returns one query head's scores against n keys of one KV head (sources §7 [DECISION]):
// q is the query before RoPE ([headDim]) at position qpos; kRot and kRaw are the keys'
// K_rot (after RoPE at kpos[j]) and K_raw (before RoPE), [n][headDim]; with s the query scale,
// score_j = s·⟨RoPE(q, qpos), kRot_j⟩ when qpos − kpos[j] < w, else s·⟨RoPE(q, w), kRaw_j⟩.
// Keys after the query (kpos[j] > qpos) are ErrInvalid (the mask is the caller's).
func (r *ReRoPE) Scores(q []float32, qpos int, kRot, kRaw []float32, kpos []int) ([]float64, error) {
	d := r.rope.Dim
	n := len(kpos)
	if len(q) != d || len(kRot) != n*d || len(kRaw) != n*d || qpos < 0 {
		return nil, fmt.Errorf("%w: rerope: query of %d at %d, %d/%d key elements for %d positions of %d", ErrInvalid, len(q), qpos, len(kRot), len(kRaw), n, d)
	}
	s := r.QueryScale(qpos)
	q1 := append([]float32(nil), q...)
	q2 := append([]float32(nil), q...)
	if err := r.rope.Rotate(q1, qpos); err != nil {
		return nil, err
	}
	if err := r.rope.Rotate(q2, r.cfg.Window); err != nil {
		return nil, err
	}
	out := make([]float64, n)
	for j, p := range kpos {
		if p < 0 || p > qpos {
			return nil, fmt.Errorf("%w: rerope: key position %d for a query at %d", ErrInvalid, p, qpos)
		}
		qq, kk := q1, kRot[j*d:(j+1)*d]
		if qpos-p >= r.cfg.Window {
			qq, kk = q2, kRaw[j*d:(j+1)*d]
		}
		var dot float64
		for i, v := range qq {
			dot += float64(v) * float64(kk[i])
		}
		out[j] = s * dot
	}
	return out, nil
}
