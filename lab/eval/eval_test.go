package eval

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ucm-go/ucm/lab/model"
	"github.com/ucm-go/ucm/sparse"
)

func loadModel(t testing.TB) *model.Model {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	m, _, err := model.LoadDir(filepath.Join(filepath.Dir(file), "..", "model", "weights"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testWindow is Go source from this repository (the model's kind of text).
func testWindow(t testing.TB, n int) []byte {
	t.Helper()
	b, err := os.ReadFile("eval.go")
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

// TestFullBudgetIsDense: at a budget of 100 % every method attends densely, so every measure
// equals full attention exactly; at 30 % the measures move and stay in range.
func TestFullBudgetIsDense(t *testing.T) {
	m := loadModel(t)
	n, prefill, methods := 200, 150, append(SelectionMethods(), Oracle)
	if testing.Short() || raceEnabled { // the forward pass is slow under the race detector
		n, prefill, methods = 120, 100, []string{sparse.NameQuest, sparse.NameKVStar}
	}
	o := Options{Model: m, Windows: [][]byte{testWindow(t, n)}, Prefill: prefill, BlockSizes: []int{16}, Budgets: []float64{1, 0.3},
		Methods: methods}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1+2*len(o.Methods) {
		t.Fatalf("%d results", len(res))
	}
	dense := res[0]
	if dense.Method != "dense" || dense.Positions != n-1-prefill || !(dense.PPL > 1 && dense.PPL < 256) {
		t.Fatalf("dense baseline %+v", dense)
	}
	for _, r := range res[1:] {
		t.Logf("%-16s %3.0f%% kept %.3f recall %.4f (min %.3f) top1 %.3f KL %.5f ppl %+.3f%% err %v sel %.1fµs",
			r.Method, 100*r.Budget, r.Kept, r.Recall, r.MinRecall, r.Top1, r.KL, 100*r.PPLChange, r.LayerRelErr, r.SelectMicros)
		if r.Positions != dense.Positions || r.DensePPL != dense.PPL {
			t.Fatalf("%s: %d positions, dense ppl %v", r.Method, r.Positions, r.DensePPL)
		}
		if r.Budget == 1 {
			if r.Top1 != 1 || r.KL != 0 || r.PPL != dense.PPL || r.Recall != 1 || r.Kept != 1 {
				t.Fatalf("%s at 100%%: not dense: %+v", r.Method, r)
			}
			continue
		}
		if !(r.Kept < 0.5 && r.Recall > 0 && r.Recall < 1 && r.MinRecall <= r.Recall && r.KL > 0 && r.Top1 > 0.3 && !math.IsNaN(r.PPL)) {
			t.Fatalf("%s at 30%%: measures out of range: %+v", r.Method, r)
		}
	}
}

// TestDenseLayers: a layer every method leaves dense has no attention error and counts as
// wholly kept.
func TestDenseLayers(t *testing.T) {
	m := loadModel(t)
	o := Options{Model: m, Windows: [][]byte{testWindow(t, 140)}, Prefill: 120, BlockSizes: []int{8}, Budgets: []float64{0.2},
		Methods: []string{sparse.NameQuest}, DenseLayers: []int{0, 2}}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	r := res[1]
	if r.LayerRelErr[0] > 1e-12 || r.LayerRelErr[2] > 1e-12 || r.LayerRelErr[1] == 0 || r.LayerRelErr[3] == 0 || !(r.Kept > 0.5 && r.Kept < 1) {
		t.Fatalf("dense layers 0 and 2: %+v", r)
	}
}

// TestHeldOutSplit: IsHeldOut is train.py's split (is_heldout), on paths on either side of it:
// the values are train.py's (sha256 of the path, first 8 bytes big-endian, mod 1000: flags.go
// 1, os/file.go 13, both below HeldOutPermille; fmt/print.go 395, net/http/server.go 677).
func TestHeldOutSplit(t *testing.T) {
	for p, want := range map[string]bool{
		"cmd/asm/internal/flags/flags.go": true, // the golden prompt's file (docs/model.md)
		"os/file.go":                      true,
		"fmt/print.go":                    false,
		"net/http/server.go":              false,
	} {
		if got := IsHeldOut(p); got != want {
			t.Errorf("IsHeldOut(%q) = %v, want %v (train.py's split)", p, got, want)
		}
	}
	w, err := Windows([]byte("0123456789"), 4, 3)
	if err != nil || string(w[0]) != "0123" || string(w[1]) != "3456" || string(w[2]) != "6789" {
		t.Fatalf("windows %q, %v", w, err)
	}
}

// TestVariants: method names with several variants configure each; per-KV-head selection and
// the per-KV oracle run, dense at a full budget and in range at 30 %.
func TestVariants(t *testing.T) {
	cfg, err := MethodConfig("ESA+softmax+kv+int8", 0.3, 16, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.(*sparse.ESAConfig); c.HeadScore != "softmax" || c.HeadSelect != "kv" || c.ReprDType != "int8" || c.Budget != 0.3 {
		t.Fatalf("ESA+softmax+kv+int8: %+v", c)
	}
	if cfg, err = MethodConfig("GSAOnDevice+kv", 0.3, 16, 1, 2); err != nil || cfg.(*sparse.GSAOnDeviceConfig).HeadSelect != "kv" {
		t.Fatalf("GSAOnDevice+kv: %+v, %v", cfg, err)
	}
	if cfg, err = MethodConfig("KVStarMultiStep+kv+retrieval_stride=1+blk_repre_inner_token_merge=2", 0.3, 16, 1, 2); err != nil {
		t.Fatal(err)
	}
	if c := cfg.(*sparse.KVStarConfig); c.RetrievalStride != 1 || c.Merge != 2 || c.HeadSelect != "kv" || c.PruneRatio != 0.5 {
		t.Fatalf("KVStar keys: %+v", c)
	}
	if _, err := MethodConfig("ESA+no_such_key=1", 0.3, 16, 1, 2); err == nil {
		t.Fatal("an unknown key accepted")
	}
	if _, err := MethodConfig("Quest+int8", 0.3, 16, 1, 2); err == nil {
		t.Fatal("Quest+int8 accepted")
	}
	if name, err := CanonicalMethod("ORACLE+KV"); err != nil || name != OracleKV {
		t.Fatalf("oracle+kv: %q, %v", name, err)
	}
	m := loadModel(t)
	o := Options{Model: m, Windows: [][]byte{testWindow(t, 140)}, Prefill: 110, BlockSizes: []int{8}, Budgets: []float64{1, 0.3},
		Methods: []string{sparse.NameESA + "+kv", OracleKV}}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res[1:] {
		if r.Budget == 1 {
			if r.Top1 != 1 || r.KL != 0 || r.Recall != 1 || r.Kept != 1 {
				t.Fatalf("%s at 100%%: not dense: %+v", r.Method, r)
			}
			continue
		}
		if !(r.Kept < 0.5 && r.Recall > 0 && r.Recall < 1 && r.KL > 0 && !math.IsNaN(r.PPL)) {
			t.Fatalf("%s at 30%%: measures out of range: %+v", r.Method, r)
		}
	}
}

// TestWindowsB: the second split's windows are in order and overlap none of the first's at the
// shape the eval uses (8 windows of 1,025 bytes of a 1.2 MB text).
func TestWindowsB(t *testing.T) {
	stream := make([]byte, 1202210)
	a, err := Windows(stream, 1025, 8)
	if err != nil {
		t.Fatal(err)
	}
	b, err := WindowsB(stream, 1025, 8)
	if err != nil {
		t.Fatal(err)
	}
	start := func(w []byte) int { return len(stream) - cap(w) } // sub-slices of stream
	for i, wb := range b {
		sb := start(wb)
		if len(wb) != 1025 || sb < 0 || sb+1025 > len(stream) {
			t.Fatalf("window b%d at %d, %d bytes", i, sb, len(wb))
		}
		for j, wa := range a {
			if sa := start(wa); sa < sb+1025 && sb < sa+1025 {
				t.Fatalf("window b%d [%d, %d) overlaps a%d [%d, %d)", i, sb, sb+1025, j, sa, sa+1025)
			}
		}
		if i > 0 && sb <= start(b[i-1]) {
			t.Fatalf("window b%d at %d not after b%d", i, sb, i-1)
		}
	}
	if _, err := WindowsB(stream[:10], 20, 2); err == nil {
		t.Fatal("a stream shorter than a window accepted")
	}
}

// TestProbes: probe names parse (unknown estimators and options refused); the mean-key probe
// selects as ESA's softmax head score per KV head does (up to the fp16 rounding of the stored
// mean); pooling the heads' budget keeps as many (head, block) pairs; at a full budget a probe
// is dense.
func TestProbes(t *testing.T) {
	for _, bad := range []string{"probe-nosuch", "probe-mean:Z=1", "probe-rank:R=9", "probe-mean:T=x"} {
		if _, err := CanonicalMethod(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	for _, good := range []string{"probe-exact", "probe-rank:R=2", "probe-minterp:A=0.5,pool", "probe-outlier:R=3", "probe-gauss:cap,T=2"} {
		if n, err := CanonicalMethod(good); err != nil || n != good {
			t.Errorf("%s: %q, %v", good, n, err)
		}
	}
	m := loadModel(t)
	o := Options{Model: m, Windows: [][]byte{testWindow(t, 180)}, Prefill: 140, BlockSizes: []int{8}, Budgets: []float64{1, 0.3},
		Methods: []string{"ESA+softmax+kv", "probe-mean", "probe-mean:pool", "probe-exact", "probe-kmeans:R=16,carry=1,cap", "probe-outlier:R=16,qcap",
			"probe-hash", "probe-rank:R=2,T=2", "probe-minterp:A=0.5"}}
	if testing.Short() || raceEnabled {
		o.Windows[0], o.Prefill = o.Windows[0][:140], 110
	}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]Result{}
	for _, r := range res[1:] {
		if r.Budget == 1 {
			if r.Top1 != 1 || r.KL != 0 || r.Recall != 1 || r.Kept != 1 {
				t.Fatalf("%s at 100%%: not dense: %+v", r.Method, r)
			}
			continue
		}
		by[r.Method] = r
	}
	esa, mean, pool, exact := by["ESA+softmax+kv"], by["probe-mean"], by["probe-mean:pool"], by["probe-exact"]
	t.Logf("recall: ESA %.4f, mean %.4f, pooled %.4f, exact %.4f", esa.Recall, mean.Recall, pool.Recall, exact.Recall)
	if esa.Kept != mean.Kept || math.Abs(esa.Recall-mean.Recall) > 0.01 {
		t.Fatalf("probe-mean %+v against ESA+softmax+kv %+v", mean, esa)
	}
	if math.Abs(pool.Kept-mean.Kept) > 1e-12 {
		t.Fatalf("pooled kept %v, per head %v", pool.Kept, mean.Kept)
	}
	for name, r := range by {
		if r.Kept != mean.Kept || !(r.Recall > 0 && r.Recall < 1) || math.IsNaN(r.KL) || math.IsNaN(r.PPL) {
			t.Fatalf("%s: %+v", name, r)
		}
	}
	if !(exact.Recall > mean.Recall) {
		t.Fatalf("the exact log-sum-exp recalls %v, the mean key %v", exact.Recall, mean.Recall)
	}
	if _, err := Run(context.Background(), Options{Model: m, Windows: o.Windows, Prefill: o.Prefill, BlockSizes: []int{6},
		Budgets: []float64{0.3}, Methods: []string{"probe-mean"}}); err == nil {
		t.Fatal("a probe over 6-token blocks accepted")
	}
}

// TestLayerBudgets: the reference selections take a budget per layer: a full budget in every
// layer is dense whatever Budgets says, a full budget in one layer leaves that layer exact,
// and a list of the wrong length is refused.
func TestLayerBudgets(t *testing.T) {
	m := loadModel(t)
	o := Options{Model: m, Windows: [][]byte{testWindow(t, 140)}, Prefill: 120, BlockSizes: []int{8}, Budgets: []float64{0.2},
		Methods: []string{OracleKV, "probe-max"}, LayerBudgets: []float64{1, 1, 1, 1}}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res[1:] {
		if r.Top1 != 1 || r.KL != 0 || r.Kept != 1 || r.Budget != 0.2 {
			t.Fatalf("%s with full layer budgets: %+v", r.Method, r)
		}
	}
	o.LayerBudgets = []float64{0.2, 1, 0.2, 0.2}
	if res, err = Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	for _, r := range res[1:] {
		if r.LayerRelErr[1] > 1e-12 || r.LayerRelErr[0] == 0 || r.Kept == 1 {
			t.Fatalf("%s with layer 1's budget full: %+v", r.Method, r)
		}
	}
	o.LayerBudgets = []float64{0.2, 0.2}
	if _, err := Run(context.Background(), o); err == nil {
		t.Fatal("2 layer budgets for 4 layers accepted")
	}
}
