package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/lab/eval"
)

// TestEvalSparse: eval sparse on a tiny setting reports the dense baseline and every run, in
// the table and in --json; bad flags are usage errors.
func TestEvalSparse(t *testing.T) {
	args := []string{"eval", "sparse", "--weights", testWeights, "--windows", "1", "--context", "100", "--prefill", "80",
		"--block-tokens", "16", "--budgets", "0.3", "--methods", "quest,ESA"}
	out, _, code := run(t, args...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "held-out files", "dense", "Quest", "ESA", "recall")
	out, _, code = run(t, append(args, "--json")...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	var r struct {
		Results []eval.Result `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 3 || r.Results[0].Method != "dense" || r.Results[1].Method != "Quest" || r.Results[1].Positions != 20 {
		t.Fatalf("eval sparse --json: %+v", r.Results)
	}
	// The second split decodes other text: another dense perplexity.
	out, _, code = run(t, append(args, "--json", "--split", "b")...)
	var rb struct {
		Split   string        `json:"split"`
		Results []eval.Result `json:"results"`
	}
	if code != cliutil.ExitOK || json.Unmarshal([]byte(out), &rb) != nil || rb.Split != "b" || len(rb.Results) != 3 || rb.Results[0].PPL == r.Results[0].PPL {
		t.Fatalf("eval sparse --split b: exit %d, %+v", code, rb)
	}
	for _, bad := range [][]string{
		{"eval", "sparse", "--weights", "/nonexistent"},
		{"eval", "sparse", "--weights", testWeights, "--methods", "Blend"},
		{"eval", "sparse", "--weights", testWeights, "--budgets", "1.5"},
		{"eval", "sparse", "--weights", testWeights, "--context", "5000"},
		{"eval", "sparse", "--weights", testWeights, "--split", "c"},
		{"eval", "sparse", "--weights", testWeights, "--methods", "probe-nosuch"},
	} {
		if _, _, code := run(t, bad...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want %d", bad, code, cliutil.ExitUsage)
		}
	}
}

// TestEvalHeldOutFlags: every eval command takes the same held-out flags and rejects a window
// count or a context the model cannot run with a usage error naming the flag.
func TestEvalHeldOutFlags(t *testing.T) {
	for _, sub := range []string{"sparse", "blend", "prefetch"} {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--windows", "0"}, "--windows 0: want at least 1"},
			{[]string{"--context", "1"}, "--context 1: want [2, "},
			{[]string{"--context", "99999"}, "--context 99999: want [2, "},
			{[]string{"--weights", "/nonexistent"}, "model weights /nonexistent"},
		} {
			args := append([]string{"eval", sub, "--weights", testWeights, "--json"}, c.args...)
			_, errOut, code := run(t, args...)
			if code != cliutil.ExitUsage || !strings.Contains(errOut, c.want) {
				t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", args, code, errOut, c.want)
			}
		}
	}
}
