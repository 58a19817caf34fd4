package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
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
	clitest.MustContain(t, out, "held-out files", "dense", "Quest", "ESA", "recall", "nominal", "attended", "100.0%")
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
	if len(r.Results) != 3 || r.Results[0].Method != "dense" || r.Results[1].Method != "Quest" || r.Results[1].Positions != 20 ||
		r.Results[0].Attended != 1 || !(r.Results[1].Attended >= 0.3 && r.Results[1].Attended < 1) {
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
	// --latency-steps times the same configurations at the --latency-* shape: ⌊32·0.3⌋ = 9 of
	// 32 blocks per KV head, next to the quality figures, and in the JSON.
	lat := append(args, "--latency-steps", "3", "--latency-blocks", "32", "--latency-block-tokens", "16", "--latency-q-heads", "4",
		"--latency-kv-heads", "2", "--latency-head-dim", "16", "--latency-evict-mib", "1")
	out, _, code = run(t, lat...)
	if code != cliutil.ExitOK {
		t.Fatalf("eval sparse --latency-steps: exit %d", code)
	}
	clitest.MustContain(t, out, "process CPU time per step", "CPU µs median", "attended sparse layers", "28.1%")
	out, _, code = run(t, append(lat, "--json")...)
	var rl struct {
		Latency []eval.LatencyResult `json:"latency"`
	}
	if code != cliutil.ExitOK || json.Unmarshal([]byte(out), &rl) != nil || len(rl.Latency) != 2 || rl.Latency[1].Method != "ESA" ||
		rl.Latency[0].Attended != 9.0/32 || rl.Latency[0].Steps != 3 || rl.Latency[0].KVHeads != 2 || rl.Latency[0].EvictBytes != 1<<20 {
		t.Fatalf("eval sparse --latency-steps --json: exit %d, %+v", code, rl)
	}
	for _, bad := range [][]string{
		{"eval", "sparse", "--weights", testWeights, "--latency-steps", "-1"},
		{"eval", "sparse", "--weights", testWeights, "--latency-steps", "2", "--latency-q-heads", "3"},
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

// TestEvalText: --text measures on any text file or directory instead of the model's held-out
// Go files, reports what it left out, and refuses a path with no text naming it; without it
// the windows are the held-out Go files' under --corpus, as before.
func TestEvalText(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text")
	write := func(rel string, body []byte) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("text/a.md", []byte(strings.Repeat("plain prose, not Go. ", 10)))
	write("text/b/c.txt", []byte(strings.Repeat("more words here. ", 10)))
	write("text/b/d.bin", []byte("\x7fELF\x00\x00"))
	write("text/e.log", bytes.Repeat([]byte("z"), eval.MaxFileBytes+1))
	args := []string{"eval", "sparse", "--weights", testWeights, "--windows", "1", "--context", "100", "--prefill", "80",
		"--block-tokens", "16", "--budgets", "0.3", "--methods", "quest", "--text", text}
	out, errOut, code := run(t, args...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	clitest.MustContain(t, out, "2 held-out files of "+text, "1 binary and 1 over 262144 bytes left out", "Quest")
	out, _, code = run(t, append(args, "--json")...)
	var r struct {
		Text   string `json:"heldout_text"`
		Files  int    `json:"heldout_files"`
		Bytes  int    `json:"heldout_bytes"`
		Binary int    `json:"heldout_skipped_binary"`
		Large  int    `json:"heldout_skipped_large"`
	}
	if code != cliutil.ExitOK || json.Unmarshal([]byte(out), &r) != nil || r.Text != text || r.Files != 2 || r.Bytes != 380 || r.Binary != 1 || r.Large != 1 {
		t.Fatalf("--text --json: exit %d, %+v", code, r)
	}
	// A single file is the whole text.
	h := heldOutOptions{text: filepath.Join(text, "a.md")}
	w, ho, err := h.heldOutWindows(50, 1)
	if err != nil || ho.Files != 1 || ho.Bytes != 210 || string(w[0]) != strings.Repeat("plain prose, not Go. ", 10)[:50] {
		t.Fatalf("--text file: %q %+v %v", w, ho, err)
	}
	for _, bad := range []string{filepath.Join(dir, "nope"), filepath.Join(text, "b", "d.bin"), filepath.Join(text, "e.log")} {
		_, errOut, code := run(t, "eval", "sparse", "--weights", testWeights, "--json", "--text", bad)
		if code != cliutil.ExitUsage || !strings.Contains(errOut, bad) {
			t.Errorf("--text %s: exit %d, stderr %q; want a usage error naming it", bad, code, errOut)
		}
	}
	// The default is unchanged: the held-out Go files (train.py's split) under --corpus.
	corpus := filepath.Join(dir, "src")
	for i := range 200 {
		write(filepath.Join("src", "p"+string(rune('a'+i%26)), "f"+string(rune('a'+i/26))+".go"), []byte(strings.Repeat(string(rune('A'+i%26)), 60)))
	}
	write("src/notes.txt", []byte(strings.Repeat("n", 60)))
	stream, files, err := eval.HeldOutStream(corpus)
	if err != nil || files == 0 {
		t.Fatalf("held-out stream: %d files, %v", files, err)
	}
	want, err := eval.Windows(stream, 30, 2)
	if err != nil {
		t.Fatal(err)
	}
	h = heldOutOptions{corpus: corpus}
	w, ho, err = h.heldOutWindows(30, 2)
	if err != nil || ho.Files != files || ho.Bytes != len(stream) || ho.Source != "" || len(w) != 2 || !bytes.Equal(w[0], want[0]) || !bytes.Equal(w[1], want[1]) {
		t.Fatalf("default held-out text: %q %+v %v, want %q", w, ho, err, want)
	}
}
