package cliutil

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestRun: a command's nil is exit 0 and its context is never nil; an ExitError gives its code
// and prints its error once, prefixed with the command's name; ProblemsFound prints nothing;
// cobra's own errors are exit 2 with a pointer to help.
func TestRun(t *testing.T) {
	cause := errors.New("the cause")
	for _, c := range []struct {
		args    []string
		code    int
		wantErr string
	}{
		{[]string{"ok"}, ExitOK, ""},
		{[]string{"usage"}, ExitUsage, "tool: --x 5: want less\n"},
		{[]string{"problems"}, ExitProblems, ""},
		{[]string{"wrapped"}, ExitProblems, "tool: the cause\n"},
		{[]string{"nosuch"}, ExitUsage, "Run 'tool help' for usage."},
		{[]string{"ok", "--bogus"}, ExitUsage, "unknown flag: --bogus"},
	} {
		var out, errb bytes.Buffer
		root := NewRoot("tool", "short", "long", &out, &errb)
		add := func(name string, err error) {
			root.AddCommand(&cobra.Command{Use: name, RunE: func(cmd *cobra.Command, args []string) error {
				if cmd.Context() == nil {
					t.Errorf("%s: nil context", name)
				}
				return err
			}})
		}
		add("ok", nil)
		add("usage", UsageErr("--x %d: want less", 5))
		add("problems", ProblemsFound)
		add("wrapped", &ExitError{Code: ExitProblems, Err: cause})
		code := Run(root, "tool", c.args, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.wantErr) || (c.wantErr == "" && errb.Len() != 0) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, code, errb.String(), c.code, c.wantErr)
		}
		if strings.Count(errb.String(), "tool:") > 1 {
			t.Errorf("%v: the error is printed more than once: %q", c.args, errb.String())
		}
	}
	if err := error(&ExitError{Code: ExitProblems, Err: cause}); !errors.Is(err, cause) {
		t.Errorf("ExitError does not unwrap to its cause")
	}
}
