// Package cli implements the commands of ucm-tool. Main runs one command line in-process with
// the given output streams and returns the exit status, so tests drive the tool exactly as an
// operator does.
package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/ucm-go/ucm/internal/cliutil"
)

// Main runs ucm-tool with args (without the program name), writing to stdout and stderr, and
// returns the process exit status: 0 clean, 1 problems found, 2 usage or open errors
// (cliutil.ExitOK, ExitProblems, ExitUsage).
func Main(args []string, stdout, stderr io.Writer) int {
	return cliutil.Run(newRootCmd(stdout, stderr), "ucm-tool", args, stderr)
}

// toolHelp is the root command's help.
const toolHelp = `ucm-tool checks, inspects and reclaims space in UCM-Go stores, and shows the
devices the staging layer sees. The benchmarks, the sparse evaluation and the chat
replay are ucm-lab's (ucm-lab bench, eval, chat).

Exit status: 0 when the command found nothing wrong, 1 when it found problems
(verify), or compact, gc or evict failed part way (evict: or could not reach --to),
2 on usage errors or when the store cannot be opened (missing, not a store, or in
use by a running engine).`

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := cliutil.NewRoot("ucm-tool", "Offline operator tool for UCM-Go KV-cache stores", toolHelp, stdout, stderr)
	tc := &cliutil.Config{}
	tc.Register(root, "the store directory when DIR is omitted", true)
	root.AddCommand(newVerifyCmd(tc, stdout, stderr), newInspectCmd(tc, stdout, stderr), newStatsCmd(tc, stdout, stderr),
		newCompactCmd(tc, stdout, stderr), newGCCmd(tc, stdout, stderr), newEvictCmd(tc, stdout, stderr), newDevicesCmd(stdout))
	for _, name := range []string{"bench", "eval", "chat"} {
		root.AddCommand(newMovedCmd(name))
	}
	return root
}

// ErrMoved is the error of a command that moved to ucm-lab (bench, eval, chat): its message
// names the ucm-lab command to run instead; exit status 2.
var ErrMoved = errors.New("moved to ucm-lab")

// newMovedCmd is a hidden command standing where one of the lab's commands was: whatever its
// arguments, it fails with ErrMoved naming "ucm-lab NAME", so that an old command line says
// where to go instead of "unknown command".
func newMovedCmd(name string) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return &cliutil.ExitError{Code: cliutil.ExitUsage,
				Err: fmt.Errorf("%s: %w: run `ucm-lab %s` (make build puts it in bin/)", name, ErrMoved, name)}
		},
	}
}
