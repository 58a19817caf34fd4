package eval

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ucm-go/ucm/internal/fcmp"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/model"
	"github.com/ucm-go/ucm/sparse"
)

// TestRoPECorrectionMatchesModel: the small model's layer-0 K of a chunk computed at position
// s, rotated by t − s, is its K computed at t (layer 0's K depends on the token and its
// position only), within the fp16 cache's rounding; unrotated it is far off.
func TestRoPECorrectionMatchesModel(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	m, _, err := model.LoadDir(filepath.Join(filepath.Dir(file), "..", "model", "weights"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.Config()
	chunk := []byte("func (x *ChunkIndex) Match(prompt []int) []ChunkMatch {\n\treturn nil\n}\n")
	layer0K := func(prefix int) []float32 {
		c, err := model.NewKVCache(cfg, 16, 16)
		if err != nil {
			t.Fatal(err)
		}
		var seq model.Sequence
		toks := make([]int, prefix+len(chunk))
		for i := range prefix {
			toks[i] = 'a' + i%26
		}
		for i, b := range chunk {
			toks[prefix+i] = int(b)
		}
		pos := make([]int, len(toks))
		for i := range pos {
			pos[i] = i
		}
		if err := seq.Reserve(c, len(toks)); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(c, &seq, toks, pos); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, len(chunk)*cfg.KVDim())
		tb := cfg.KVDim() * 2
		for i := range chunk {
			p := prefix + i
			off := c.Offset(0, seq.Blocks[p/16]*16+p%16)
			if err := kernels.DecodeFloat32(out[i*cfg.KVDim():(i+1)*cfg.KVDim()], c.Layer(0)[off:off+tb], kernels.Float16); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	r := sparse.RoPE{Dim: cfg.HeadDim, Theta: float64(cfg.RopeTheta), Pairing: sparse.PairNeoX}
	for _, st := range [][2]int{{3, 77}, {100, 5}, {0, 150}} {
		s, tt := st[0], st[1]
		at, want := layer0K(s), layer0K(tt)
		got := append([]float32(nil), at...)
		if err := r.Rotate(got, tt-s); err != nil {
			t.Fatal(err)
		}
		if d := fcmp.MaxRelDiff(got, want); d > 2e-3 {
			t.Errorf("K at %d rotated to %d: off by %g of the largest element", s, tt, d)
		}
		if d := fcmp.MaxRelDiff(at, want); d < 0.05 {
			t.Errorf("K at %d and %d agree (%g) without rotation: the check cannot fail", s, tt, d)
		}
		wrong := append([]float32(nil), at...)
		_ = (sparse.RoPE{Dim: cfg.HeadDim, Theta: float64(cfg.RopeTheta), Pairing: sparse.PairInterleaved}).Rotate(wrong, tt-s)
		if d := fcmp.MaxRelDiff(wrong, want); d < 0.05 {
			t.Errorf("the interleaved pairing corrects the NeoX model's K (%g)", d)
		}
	}
}
