package cli

import (
	"encoding/json"
	"testing"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/lab/eval"
)

// TestEvalBlend: eval blend on a tiny setting reports the full-recompute reference and every
// run, in the table and in --json; bad flags are usage errors.
func TestEvalBlend(t *testing.T) {
	args := []string{"eval", "blend", "--weights", testWeights, "--windows", "1", "--context", "96", "--suffix", "32",
		"--chunk-tokens", "32", "--ratios", "0.2", "--sources", "standalone", "--selections", "hkvd,random"}
	out, _, code := run(t, args...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "held-out files", "full", "standalone", "recomputed", "Δppl")
	out, _, code = run(t, append(args, "--json")...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	var r struct {
		Results []eval.BlendResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 3 || r.Results[0].Source != "full" || r.Results[1].Source != "standalone" || r.Results[1].Positions != 32 || r.Results[1].Recomputed != 0.1875 ||
		r.Results[1].Selection != "hkvd" || r.Results[2].Selection != "random" || r.Results[2].Recomputed != 0.1875 {
		t.Fatalf("eval blend --json: %+v", r.Results)
	}
	for _, bad := range [][]string{
		{"eval", "blend", "--weights", "/nonexistent"},
		{"eval", "blend", "--weights", testWeights, "--ratios", "1.5"},
		{"eval", "blend", "--weights", testWeights, "--context", "5000"},
		{"eval", "blend", "--weights", testWeights, "--suffix", "30"},
		{"eval", "blend", "--weights", testWeights, "--chunk-tokens", "24"},
		{"eval", "blend", "--weights", testWeights, "--sources", "cached"},
		{"eval", "blend", "--weights", testWeights, "--check-layer", "4"},
		{"eval", "blend", "--weights", testWeights, "--selections", "oracle"},
	} {
		if _, _, code := run(t, bad...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want %d", bad, code, cliutil.ExitUsage)
		}
	}
}
