// Package clitest is what the tests of the repository's commands share: running a command
// line in-process and checking its output.
package clitest

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// Main is a command's entry point: it runs args and returns the exit status.
type Main func(args []string, stdout, stderr io.Writer) int

// Run runs the command line args through main in-process, logs it with its output under
// name, and returns what it wrote and its exit status.
func Run(t testing.TB, main Main, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = main(args, &out, &errb)
	t.Logf("%s %s → %d\n%s%s", name, strings.Join(args, " "), code, out.String(), errb.String())
	return out.String(), errb.String(), code
}

// MustContain fails the test (without stopping it) for each of wants that out lacks.
func MustContain(t testing.TB, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}
