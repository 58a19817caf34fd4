package cli

import (
	"encoding/json"
	"testing"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/lab/eval"
)

// TestEvalPrefetch: eval prefetch on a tiny setting reports every run, in the table and in
// --json (a run without its prefetch_ahead 0 reference has no hidden fraction); bad flags are
// usage errors.
func TestEvalPrefetch(t *testing.T) {
	args := []string{"eval", "prefetch", "--weights", testWeights, "--windows", "1", "--context", "96", "--prefill", "64",
		"--runs", "GSA@0,ESA+lag@1"}
	out, _, code := run(t, args...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "stall µs/step", "hidden", "GSA", "ESA+lag")
	out, _, code = run(t, append(args, "--json")...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	var r struct {
		Results []eval.PrefetchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 2 || r.Results[0].Steps != 32 || r.Results[0].Hidden == nil || r.Results[1].Hidden != nil || r.Results[1].Ahead != 1 {
		t.Fatalf("eval prefetch --json: %+v", r.Results)
	}
	for _, bad := range [][]string{
		{"eval", "prefetch", "--weights", "/nonexistent"},
		{"eval", "prefetch", "--weights", testWeights, "--runs", "GSA"},
		{"eval", "prefetch", "--weights", testWeights, "--runs", "Oracle@1"},
		{"eval", "prefetch", "--weights", testWeights, "--budget", "0"},
		{"eval", "prefetch", "--weights", testWeights, "--prefill", "5"},
	} {
		if _, _, code := run(t, bad...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want %d", bad, code, cliutil.ExitUsage)
		}
	}
}
