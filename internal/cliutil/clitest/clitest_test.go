package clitest

import (
	"fmt"
	"io"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Logf(string, ...any)       {}
func (r *recorder) Errorf(f string, a ...any) { r.errors = append(r.errors, fmt.Sprintf(f, a...)) }

func TestRunAndMustContain(t *testing.T) {
	main := func(args []string, stdout, stderr io.Writer) int {
		fmt.Fprintf(stdout, "out %v", args)
		fmt.Fprint(stderr, "err")
		return 3
	}
	r := &recorder{TB: t}
	out, errOut, code := Run(r, main, "cmd", "a", "b")
	if out != "out [a b]" || errOut != "err" || code != 3 {
		t.Fatalf("Run = %q, %q, %d", out, errOut, code)
	}
	MustContain(r, out, "out", "[a b]")
	if len(r.errors) != 0 {
		t.Fatalf("MustContain failed on present strings: %v", r.errors)
	}
	MustContain(r, out, "out", "missing", "also missing")
	if len(r.errors) != 2 {
		t.Fatalf("MustContain reported %v, want the two missing strings", r.errors)
	}
}
