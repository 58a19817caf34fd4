// Package cli implements the commands of ucm-tool. Main runs one command line in-process with
// the given output streams and returns the exit status, so tests drive the tool exactly as an
// operator does.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Exit statuses of ucm-tool.
const (
	// ExitOK: the command ran and found nothing wrong.
	ExitOK = 0
	// ExitProblems: the command ran and found problems (verify), a bench failed
	// verification, or compact, gc or evict failed part way (evict: or missed its target).
	ExitProblems = 1
	// ExitUsage: bad arguments, or the store could not be opened.
	ExitUsage = 2
)

// exitError carries an exit status out of a command.
type exitError struct {
	code int
	err  error // nil: nothing more to print
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageErr reports bad input or an unopenable store (exit status 2).
func usageErr(format string, args ...any) error {
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, args...)}
}

// problemsFound ends a command that already printed its report with exit status 1.
var problemsFound = &exitError{code: ExitProblems}

// Main runs ucm-tool with args (without the program name), writing to stdout and stderr, and
// returns the process exit status: 0 clean, 1 problems found, 2 usage or open errors.
func Main(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "ucm-tool: %v\n", ee.err)
		}
		return ee.code
	}
	// Errors from cobra itself: unknown command or flag, wrong number of arguments.
	fmt.Fprintf(stderr, "ucm-tool: %v\nRun 'ucm-tool help' for usage.\n", err)
	return ExitUsage
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "ucm-tool",
		Short: "Offline operator tool for UCM-Go KV-cache stores",
		Long: `ucm-tool checks, inspects, reclaims space in and benchmarks UCM-Go stores.

Exit status: 0 when the command found nothing wrong, 1 when it found problems
(verify), a benchmark failed verification, or compact, gc or evict failed part way
(evict: or could not reach --to), 2 on usage errors or when the store cannot be
opened (missing, not a store, or in use by a running engine).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.CompletionOptions.DisableDefaultCmd = true
	tc := &toolConfig{}
	tc.register(root)
	root.AddCommand(newVerifyCmd(tc, stdout, stderr), newInspectCmd(tc, stdout, stderr), newStatsCmd(tc, stdout, stderr), newBenchCmd(tc, stdout, stderr),
		newCompactCmd(tc, stdout, stderr), newGCCmd(tc, stdout, stderr), newEvictCmd(tc, stdout, stderr), newDevicesCmd(stdout), newChatCmd(stdout, stderr), newEvalCmd(stdout, stderr))
	return root
}

// isTerminal reports whether w is a character device (an interactive terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
