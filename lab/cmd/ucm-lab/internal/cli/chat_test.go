package cli

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/lab/loop"
)

const testWeights = "../../../../model/weights"

// TestChat: the chat replay on the small model serves later turns from the store and answers
// as without it; --json carries the same; bad flags are usage errors.
func TestChat(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "chat")
	root, err := loop.GoRoot()
	if err != nil {
		t.Fatal(err)
	}
	corpus := filepath.Join(root, "src", "strings")
	// Small: the model's forward pass is slow under the race detector.
	args := []string{"chat", "--dir", dir, "--weights", testWeights, "--corpus", corpus,
		"--conversations", "2", "--turns", "2", "--system", "32", "--user", "20", "--answer", "2"}
	out, _, code := run(t, append(args, "--conversations", "1", "--turns", "1")...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "TTFT no store", "from the store", "answers identical with and without the store: true")
	out, _, code = run(t, append(args, "--json")...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	var r chatJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if !r.AnswersSame || len(r.Turns) != 4 || r.HitTokens == 0 || r.DumpedSidecars != 3*r.DumpedBlocks {
		t.Fatalf("chat --json: %+v", r)
	}
	for _, bad := range [][]string{
		{"chat", "--dir", filepath.Join(t.TempDir(), "bad"), "--weights", "/nonexistent"},
		{"chat", "--dir", filepath.Join(t.TempDir(), "bad"), "--weights", testWeights, "--sidecars", "nope"},
		{"chat", "--dir", filepath.Join(t.TempDir(), "bad"), "--weights", testWeights, "--corpus", corpus, "--turns", "1000"},
	} {
		if _, _, code := run(t, bad...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want %d", bad, code, cliutil.ExitUsage)
		}
	}
}
