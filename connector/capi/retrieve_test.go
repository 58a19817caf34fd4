//go:build cgo

package main

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRetrievalLayout: retrieve.go's mirror of ucmgo_retrieval has the C struct's size and
// field offsets.
func TestRetrievalLayout(t *testing.T) {
	c, g := retrievalLayout()
	if !slices.Equal(c, g) {
		t.Fatalf("ucmgo_retrieval: C size and offsets %v, Go mirror %v", c, g)
	}
}

// TestCRetrieveABI builds the library, compiles testdata/retrieve.c against ucmgo.h and runs
// it (see retrieve.c: results against a reference, task states, each bad field refused).
func TestCRetrieveABI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shared library")
	}
	lib := buildLibrary(t)
	bin := filepath.Join(lib, "retrieve")
	gcc := exec.Command("gcc", "-O1", "-Wall", "-Werror", "-I.", "-o", bin, "testdata/retrieve.c",
		"-L"+lib, "-lucmgo", "-Wl,-rpath,"+lib, "-lm",
		// go-nvml resolves NVML's functions when it loads libnvml: they are undefined until then.
		"-Wl,--allow-shlib-undefined")
	if out, err := gcc.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("retrieve: %v\n%s", err, out)
	}
}
