package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

var library struct {
	once sync.Once
	dir  string
	err  error
}

// buildLibrary builds libucmgo.so (and cgo's generated header) once per test run, as `make lib`
// does, and returns its directory.
func buildLibrary(t *testing.T) string {
	t.Helper()
	library.once.Do(func() {
		library.dir, library.err = os.MkdirTemp("", "ucmgo-lib")
		if library.err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(library.dir, "libucmgo.so"), ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			library.err = fmt.Errorf("go build -buildmode=c-shared: %v\n%s", err, out)
		}
	})
	if library.err != nil {
		t.Fatal(library.err)
	}
	return library.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if library.dir != "" {
		os.RemoveAll(library.dir)
	}
	os.Exit(code)
}

// TestCABI builds the library, compiles testdata/abi.c against ucmgo.h with gcc and runs it:
// the C program checks transfers, lookups, V0, stats and every bad-input case (see abi.c).
func TestCABI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shared library")
	}
	lib := buildLibrary(t)
	bin := filepath.Join(lib, "abi")
	gcc := exec.Command("gcc", "-O1", "-Wall", "-Werror", "-I.", "-o", bin, "testdata/abi.c",
		"-L"+lib, "-lucmgo", "-Wl,-rpath,"+lib, "-lpthread",
		// go-nvml resolves NVML's functions when it loads libnvml: they are undefined until then.
		"-Wl,--allow-shlib-undefined")
	if out, err := gcc.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	run := exec.Command(bin, t.TempDir())
	out, err := run.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("abi: %v\n%s", err, out)
	}
}

// TestHeaderMatchesExports: the public header ucmgo.h declares exactly the functions the
// library exports, with the same parameter types (up to const and names), so that a C caller
// compiled against it calls what is there.
func TestHeaderMatchesExports(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shared library")
	}
	lib := buildLibrary(t)
	generated, err := os.ReadFile(filepath.Join(lib, "libucmgo.h"))
	if err != nil {
		t.Fatal(err)
	}
	public, err := os.ReadFile("ucmgo.h")
	if err != nil {
		t.Fatal(err)
	}
	want := declarations(t, string(generated), `extern ([a-z0-9_]+ \**)(ucmgo_[a-z_]+)\(([^)]*)\);`)
	got := declarations(t, string(public), `((?:const )?[a-z0-9_]+ \**)(ucmgo_[a-z_]+)\(([^)]*)\);`)
	// ucmgo_last_error, ucmgo_wait and ucmgo_check are C (lasterror.c, tasks.c), not Go exports.
	want["ucmgo_last_error"] = got["ucmgo_last_error"]
	want["ucmgo_wait"] = got["ucmgo_wait"]
	want["ucmgo_check"] = got["ucmgo_check"]
	// ucmgo_load and ucmgo_dump are C too (queue.c): what they do not queue goes to the Go
	// exports ucmgoi_load and ucmgoi_dump, which take the same parameters.
	fallback := declarations(t, string(generated), `extern ([a-z0-9_]+ \**)ucmgoi_((?:load|dump))\(([^)]*)\);`)
	for _, name := range []string{"load", "dump"} {
		if fallback[name] == "" {
			t.Fatalf("the library does not export ucmgoi_%s", name)
		}
		want["ucmgo_"+name] = fallback[name]
	}
	for name, sig := range want {
		if got[name] != sig {
			t.Errorf("%s: ucmgo.h declares %q, the library exports %q", name, got[name], sig)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("ucmgo.h declares %s, which the library does not export", name)
		}
	}
}

// declarations maps function names to "ret(type,type,...)" with const, parameter names and
// spacing removed.
func declarations(t *testing.T, text, pattern string) map[string]string {
	t.Helper()
	text = regexp.MustCompile(`\s*\n\s*`).ReplaceAllString(text, " ")
	text = strings.ReplaceAll(text, "; ", ";\n")
	out := map[string]string{}
	for _, m := range regexp.MustCompile(pattern).FindAllStringSubmatch(text, -1) {
		var params []string
		for _, p := range strings.Split(m[3], ",") {
			p = strings.ReplaceAll(p, "const", "")
			p = strings.Join(strings.Fields(p), " ")
			// Drop the parameter name: the last identifier.
			stars := strings.Count(p, "*")
			fields := strings.Fields(strings.ReplaceAll(p, "*", " "))
			if len(fields) > 1 {
				fields = fields[:len(fields)-1]
			}
			params = append(params, strings.Join(fields, " ")+strings.Repeat("*", stars))
		}
		ret := strings.Join(strings.Fields(strings.ReplaceAll(m[1], "const", "")), "")
		out[m[2]] = ret + "(" + strings.Join(params, ",") + ")"
	}
	if len(out) == 0 {
		t.Fatalf("no declarations found by %s", pattern)
	}
	return out
}
