// Package cliutil holds what UCM-Go's commands share (ucm-tool, the operator's tool, and
// ucm-lab, the lab's): exit statuses and how a command ends with one, flags parsed as they are
// read (sizes), progress bars, size formatting and the --config/--instance flags naming the
// engine's configuration. It is internal: only the repository's commands import it.
package cliutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Exit statuses of the commands.
const (
	// ExitOK: the command ran and found nothing wrong.
	ExitOK = 0
	// ExitProblems: the command ran and found problems (verify), a bench failed
	// verification, or compact, gc or evict failed part way (evict: or missed its target).
	ExitProblems = 1
	// ExitUsage: bad arguments, or the store could not be opened.
	ExitUsage = 2
)

// ExitError carries an exit status out of a command: Run prints Err (when not nil) and
// returns Code.
type ExitError struct {
	Code int
	Err  error // nil: nothing more to print
}

// Error is Err's message, or the exit status when Err is nil.
func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

// Unwrap returns Err, so that errors.Is and errors.As see the cause.
func (e *ExitError) Unwrap() error { return e.Err }

// UsageErr reports bad input or an unopenable store (exit status 2).
func UsageErr(format string, args ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf(format, args...)}
}

// ProblemsFound ends a command that already printed its report with exit status 1.
var ProblemsFound = &ExitError{Code: ExitProblems}

// Run executes root with args, under a background context (a command's cmd.Context() is never
// nil), and returns the process exit status: ExitOK when the command returned nil, an ExitError's code (its error printed to stderr as "name: ..."), and ExitUsage
// for cobra's own errors (unknown command or flag, wrong number of arguments), printed with a
// pointer to "name help".
func Run(root *cobra.Command, name string, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintf(stderr, "%s: %v\nRun '%s help' for usage.\n", name, err, name)
	return ExitUsage
}

// NewRoot returns a command's root: errors and usage are left to Run (printed once, with the
// exit status), output goes to stdout and stderr, and there is no completion command.
func NewRoot(use, short, long string, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{Use: use, Short: short, Long: long, SilenceUsage: true, SilenceErrors: true}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.CompletionOptions.DisableDefaultCmd = true
	return root
}

// IsTerminal reports whether w is a character device (an interactive terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
