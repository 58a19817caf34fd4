// Package cli implements the commands of ucm-lab: bench, eval and chat. Main runs one command
// line in-process with the given output streams and returns the exit status, so tests drive
// the lab exactly as a user does.
package cli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/ucm-go/ucm/internal/cliutil"
)

// Main runs ucm-lab with args (without the program name), writing to stdout and stderr, and
// returns the process exit status: 0 done, 1 a benchmark failed verification (or fio failed),
// 2 usage errors (cliutil.ExitOK, ExitProblems, ExitUsage).
func Main(args []string, stdout, stderr io.Writer) int {
	return cliutil.Run(newRootCmd(stdout, stderr), "ucm-lab", args, stderr)
}

// labHelp is the root command's help.
const labHelp = `ucm-lab measures UCM-Go: bench runs a store through benchmark workloads (and fio
for a bracket), bench-check compares a short fixed benchmark set's ratios with a
committed baseline (make bench-check), eval measures sparse attention and Blend on the
small real model, and chat replays multi-turn chats through the reference connector
loop with and without a store. The operator's commands (verify, inspect, stats,
compact, gc, evict) are ucm-tool's.

Exit status: 0 when the command ran, 1 when a benchmark failed verification or fio
failed (bench-check: or a ratio dropped below its baseline), 2 on usage errors.`

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := cliutil.NewRoot("ucm-lab", "The lab of UCM-Go: benchmarks, sparse-attention evaluation, chat replay", labHelp, stdout, stderr)
	tc := &cliutil.Config{}
	tc.Register(root, "bench's defaults (directory, block shape, I/O engine, sync, capacities)", false)
	root.AddCommand(newBenchCmd(tc, stdout, stderr), newBenchCheckCmd(stdout, stderr), newEvalCmd(stdout, stderr), newChatCmd(stdout, stderr))
	return root
}
