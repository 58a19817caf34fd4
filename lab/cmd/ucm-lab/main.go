// Command ucm-lab is UCM-Go's lab, apart from the operator's tool: the benchmarks of a store
// (bench), the sparse-attention evaluation on the small real model (eval) and the chat replay
// through the reference connector loop (chat). Run "ucm-lab help" for the commands and their
// flags.
package main

import (
	"os"

	"github.com/ucm-go/ucm/lab/cmd/ucm-lab/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
