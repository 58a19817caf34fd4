package eval

import (
	"context"
	"math"
	"testing"

	"github.com/ucm-go/ucm/sparse"
)

// TestAttendedFractionByHand: 2 layers of 2 KV heads, layer 0 dense, a 30 % budget: at 10
// blocks layer 0 attends all 10 per KV head and layer 1 ⌊10·0.3⌋ = 3 (a block listed twice
// counts once): 26 of 40 units; a second step at 11 blocks adds 22 + 6 of 44, so the run
// attends 54 of 84 units, 64.3 %, not the nominal 30 %.
func TestAttendedFractionByHand(t *testing.T) {
	if k := sparse.BudgetBlocks(10, 0.3); k != 3 {
		t.Fatalf("BudgetBlocks(10, 0.3) = %d", k)
	}
	var a attendance
	for _, step := range []struct {
		n   int
		sel [][][]int // per layer; nil: dense
	}{
		{10, [][][]int{nil, {{0, 8, 9}, {0, 4, 9, 9}}}},
		{11, [][][]int{nil, {{0, 9, 10}, {0, 9, 10}}}},
	} {
		for _, sel := range step.sel {
			_, units := attendedBlocks(sel, step.n, 2)
			a.add(units, step.n*2)
		}
	}
	if a.units != 54 || a.total != 84 || a.fraction() != 54.0/84 {
		t.Fatalf("attended %d of %d (%v), want 54 of 84", a.units, a.total, a.fraction())
	}
	if (attendance{}).fraction() != 1 {
		t.Fatal("nothing counted: want 1")
	}
}

// TestAttendedFraction: on the model (4 layers, 2 KV heads), 16-token blocks, every decode
// position at 10 blocks, layer 0 dense and a nominal 30 % budget of which the windows (1 + 2
// blocks) are all: the run attends (10 + 3·3)/40 = 47.5 % of its (block, layer, KV head)
// units, for the oracle and for Quest alike, and 3/10 of the sparse layers' units; dense
// attends all of them.
func TestAttendedFraction(t *testing.T) {
	m := loadModel(t)
	o := Options{Model: m, Windows: [][]byte{testWindow(t, 160)}, Prefill: 150, BlockSizes: []int{16}, Budgets: []float64{0.3},
		Methods: []string{Oracle, sparse.NameQuest}, DenseLayers: []int{0}, Init: 1, Local: 2}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || res[0].Attended != 1 || res[0].AttendedSparse != 1 {
		t.Fatalf("results %+v", res)
	}
	for _, r := range res[1:] {
		if r.Budget != 0.3 || r.Attended != 19.0/40 || math.Abs(r.Kept-19.0/40) > 1e-12 {
			t.Errorf("%s: budget %v, attended %v, kept %v; want 0.3, 0.475, 0.475", r.Method, r.Budget, r.Attended, r.Kept)
		}
		if r.AttendedSparse != 9.0/30 {
			t.Errorf("%s: sparse layers attended %v, want 0.3", r.Method, r.AttendedSparse)
		}
	}
}
