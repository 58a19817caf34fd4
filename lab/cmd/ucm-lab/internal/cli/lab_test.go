package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/tools/verify"
)

// run runs ucm-lab in-process.
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return clitest.Run(t, Main, "ucm-lab", args...)
}

// verifyStore verifies the store in dir as ucm-tool verify does (recovering it first when a
// crash left it so) and fails the test unless it is clean.
func verifyStore(t *testing.T, dir string) *verify.Report {
	t.Helper()
	r, err := verify.Store(dir, verify.Options{Recover: true})
	if err != nil {
		t.Fatalf("verify %s: %v", dir, err)
	}
	if !r.Clean() {
		t.Errorf("verify %s: %d problems: %v", dir, len(r.Problems), r.Problems)
	}
	return r
}

// TestBenchUsageErrors: bad bench flags are usage errors, and a directory that is not a store
// is left untouched.
func TestBenchUsageErrors(t *testing.T) {
	notStore := t.TempDir()
	for _, args := range [][]string{
		{"bench", "--workload", "random", "--dir", notStore},
		{"bench", "--block-size", "1000", "--shards", "3", "--dir", notStore},
		{"bench", "--total", "8MB", "--dir", notStore},
		{"nosuchcommand"},
		{"verify", notStore},
	} {
		if _, _, code := run(t, args...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if ents, _ := os.ReadDir(notStore); len(ents) != 0 {
		t.Errorf("a failed command wrote into %s: %v", notStore, ents)
	}
}

func TestBenchEndToEnd(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep-me")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"bench", "--dir", dir, "--total", "8MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB"}
	out, _, code := run(t, args...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "verified", "dump", "load", "MB/s", "seq", "blocks      32")
	out, _, code = run(t, append(args, "--json", "--io-engine", "psync", "--direct", "off", "--sync", "none")...)
	if code != cliutil.ExitOK {
		t.Fatalf("--json: exit %d", code)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("bench --json does not parse: %v", err)
	}
	for _, k := range []string{"workload", "block_bytes", "shards", "blocks", "total_bytes", "io_engine", "direct", "sync",
		"dump_MBps", "load_MBps", "open_s", "verified"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if m["verified"] != true || m["blocks"] != 32.0 || m["total_bytes"] != float64(8<<20) || m["direct"] != false ||
		m["sync"] != "none" || m["io_engine"] != "psync" || m["shards"] != 4.0 {
		t.Errorf("JSON %v", m)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("bench removed a file it does not own: %v", err)
	}
	// The bench store is a valid store.
	verifyStore(t, filepath.Join(dir, "bench-256KiB-4"))
}

func TestPayloadPoolDetectsMismatch(t *testing.T) {
	p := newPayloadPool(64 << 10)
	b := make([]byte, 64<<10)
	id := blockID(5)
	p.fill(b, id)
	if err := p.check(b, id); err != nil {
		t.Fatal(err)
	}
	if err := p.check(b, blockID(6)); err == nil {
		t.Error("another block's bytes verified")
	}
	b[40000] ^= 1
	if err := p.check(b, id); err == nil || !strings.Contains(err.Error(), "byte 40000") {
		t.Errorf("flipped byte: %v", err)
	}
}

// TestBenchConfigFlag: bench takes its store directory and block shape from --config.
func TestBenchConfigFlag(t *testing.T) {
	benchDir := t.TempDir()
	benchCfg := filepath.Join(t.TempDir(), "bench.yaml")
	os.WriteFile(benchCfg, []byte(fmt.Sprintf("ucm_connectors:\n  - ucm_connector_config:\n      storage_backends: %s\n      block_size: 262144\n      shard_size: 65536\n      sync_policy: none\n", benchDir)), 0o644)
	out, errOut, code := run(t, "bench", "--config", benchCfg, "--total", "4MiB", "--workload", "layerwise", "--json")
	if code != cliutil.ExitOK || !strings.Contains(out, `"shards":4`) || !strings.Contains(out, `"block_bytes":262144`) {
		t.Fatalf("bench with --config: %d\n%s%s", code, out, errOut)
	}
	if m, _ := filepath.Glob(filepath.Join(benchDir, "bench-*")); len(m) == 0 {
		t.Fatalf("bench did not use the configured directory %s", benchDir)
	}
}

// TestBenchCheckBadBaseline: bench-check refuses a malformed baseline before measuring
// anything, naming the file and the field, with the usage exit status; --update does not
// replace it either.
func TestBenchCheckBadBaseline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "baseline.json")
	if err := os.WriteFile(path, []byte(`{"cases":[{"name":"seq/dump/fio","ratio":-0.5}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, extra := range [][]string{nil, {"--update"}} {
		var stdout, stderr bytes.Buffer
		code := Main(append([]string{"bench-check", "--baseline", path}, extra...), &stdout, &stderr)
		if code != cliutil.ExitUsage {
			t.Fatalf("%v: exit %d, want %d; stderr:\n%s", extra, code, cliutil.ExitUsage, stderr.String())
		}
		if msg := stderr.String(); !strings.Contains(msg, path) || !strings.Contains(msg, "cases[0].ratio") {
			t.Errorf("%v: stderr %q does not name the file and the field", extra, msg)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"bench-check", "--baseline", path, "--rounds", "0"}, &stdout, &stderr); code != cliutil.ExitUsage {
		t.Errorf("--rounds 0: exit %d, want %d", code, cliutil.ExitUsage)
	}
}
