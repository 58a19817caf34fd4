package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCSelectorABI builds the library, compiles testdata/selector.c against ucmgo.h with gcc and
// runs it: representations dumped from K and put precomputed, loaded back by id, selections
// synchronous and as tasks, and every bad-input case (see selector.c).
func TestCSelectorABI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shared library")
	}
	lib := buildLibrary(t)
	bin := filepath.Join(lib, "selector")
	gcc := exec.Command("gcc", "-O1", "-Wall", "-Werror", "-I.", "-o", bin, "testdata/selector.c",
		"-L"+lib, "-lucmgo", "-Wl,-rpath,"+lib, "-lm")
	if out, err := gcc.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, t.TempDir()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("selector: %v\n%s", err, out)
	}
}
