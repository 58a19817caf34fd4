package eval

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/ucm-go/ucm/sparse"
)

// TestRunBlend: recomputing every reused token is full recompute bit for bit (top-1 1, KL 0,
// the same perplexity); at lower ratios the reused share and the recomputed share are what was
// asked; rotating reused K to their new positions beats not rotating them.
func TestRunBlend(t *testing.T) {
	m := loadModel(t)
	o := BlendOptions{Model: m, Windows: [][]byte{testWindow(t, 4*32+32+1)}, Suffix: 32, BlockSize: 16, ChunkSize: 32,
		Sources: []string{SourceStandalone, SourceShuffled}, Ratios: []float64{1, 0.25, 0}, CheckLayer: 1, NoCorrection: true, Seed: 1}
	if testing.Short() || raceEnabled {
		o.Sources, o.Ratios = []string{SourceStandalone}, []float64{1, 0}
	}
	res, err := RunBlend(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1+len(o.Sources)*2*len(o.Ratios) || res[0].Source != "full" || res[0].Positions != 32 {
		t.Fatalf("%d results, first %+v", len(res), res[0])
	}
	kl := map[[2]any]float64{}
	for _, r := range res[1:] {
		t.Logf("%-10s corr %-5v ratio %.2f reused %.3f recomputed %.3f work %.3f top1 %.3f KL %.5f ppl %+.3f%%", r.Source, r.Corrected, r.Ratio,
			r.HitFraction, r.Recomputed, r.LayerWork, r.Top1, r.KL, 100*r.PPLChange)
		if r.HitFraction != 128.0/160 || r.Positions != 32 {
			t.Fatalf("%+v: reused %v of the prompt", r, r.HitFraction)
		}
		if want := math.Floor(128*r.Ratio) / 128; math.Abs(r.Recomputed-want) > 1e-12 {
			t.Fatalf("recomputed %v, want %v", r.Recomputed, want)
		}
		if want := (1 + 3*r.Recomputed) / 4; math.Abs(r.LayerWork-want) > 1e-12 { // layer 0 all; 1 (after selecting), 2, 3 the selected
			t.Fatalf("layer work %v, want %v", r.LayerWork, want)
		}
		if r.Ratio == 1 && (r.Top1 != 1 || r.KL != 0 || r.PPL != res[0].PPL || r.KLRecovered != 1) {
			t.Fatalf("ratio 1 is not full recompute (all of ratio 0's KL recovered): %+v", r)
		}
		if r.Ratio == 0 && (r.KL == 0 || r.KLRecovered != 0) {
			t.Fatalf("ratio 0 recovers nothing of its own KL: %+v", r)
		}
		kl[[2]any{r.Source, r.Corrected}] = max(kl[[2]any{r.Source, r.Corrected}], r.KL)
	}
	for _, s := range o.Sources {
		if !(kl[[2]any{s, true}] < kl[[2]any{s, false}]) {
			t.Errorf("%s: KL with position correction %v, without %v", s, kl[[2]any{s, true}], kl[[2]any{s, false}])
		}
	}
	for name, bad := range map[string]func(*BlendOptions){
		"chunk not whole blocks": func(o *BlendOptions) { o.ChunkSize = 24 },
		"check layer":            func(o *BlendOptions) { o.CheckLayer = 9 },
		"suffix":                 func(o *BlendOptions) { o.Suffix = 0 },
		"window not whole":       func(o *BlendOptions) { o.Suffix = 31 },
		"ratio":                  func(o *BlendOptions) { o.Ratios = []float64{2} },
		"source":                 func(o *BlendOptions) { o.Sources = []string{"cached"}; o.Ratios = []float64{0} },
		"selection":              func(o *BlendOptions) { o.Selections = []string{"oracle"}; o.Ratios = []float64{0} },
	} {
		b := o
		bad(&b)
		if _, err := RunBlend(context.Background(), b); !errors.Is(err, sparse.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
