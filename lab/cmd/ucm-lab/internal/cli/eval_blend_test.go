package cli

import (
	"encoding/json"
	"testing"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/lab/eval"
)

// TestEvalBlend: eval blend on a tiny setting reports the full-recompute reference and every
// run, in the table and in --json, and HKVD against its baselines (ratio 0, random at the
// same ratio) from the same run; bad flags are usage errors.
func TestEvalBlend(t *testing.T) {
	args := []string{"eval", "blend", "--weights", testWeights, "--windows", "1", "--context", "96", "--suffix", "32",
		"--chunk-tokens", "32", "--ratios", "0,0.2", "--sources", "standalone", "--selections", "hkvd,random"}
	out, _, code := run(t, args...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "held-out files", "full", "standalone", "recomputed", "Δppl", "KL recovered",
		"HKVD against its baselines", "no recompute")
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
	// full, then hkvd at 0 and 0.2, then random at 0 and 0.2.
	if len(r.Results) != 5 || r.Results[0].Source != "full" || r.Results[2].Source != "standalone" || r.Results[2].Positions != 32 || r.Results[2].Recomputed != 0.1875 ||
		r.Results[2].Selection != "hkvd" || r.Results[4].Selection != "random" || r.Results[4].Recomputed != 0.1875 || r.Results[1].KLRecovered != 0 ||
		r.Results[2].KLRecovered != 1-r.Results[2].KL/r.Results[1].KL {
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
