// Command gen rewrites the generated status code text in the files that declare UCM's status
// codes (statuscodes.Files), from the table in package statuscodes. It runs in the connector
// directory (go generate ./connector/).
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/ucm-go/ucm/connector/internal/statuscodes"
)

func main() {
	for _, f := range statuscodes.Files() {
		old, err := os.ReadFile(f)
		if err != nil {
			fail(err)
		}
		updated, err := statuscodes.Render(f, old)
		if err != nil {
			fail(err)
		}
		if bytes.Equal(old, updated) {
			continue
		}
		if err := os.WriteFile(f, updated, 0o644); err != nil {
			fail(err)
		}
		fmt.Println("statuscodes: rewrote", f)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
