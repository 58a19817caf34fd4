// Command ucm-tool is the offline operator tool of a UCM-Go store: verify, inspect, stats and
// bench. Run "ucm-tool help" for the commands and their flags.
package main

import (
	"os"

	"github.com/ucm-go/ucm/tools/ucm-tool/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
