package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
)

// TestConfigFlag: every command takes --config FILE (UCM's own YAML) for the store when DIR is
// omitted, and --instance picks a sharing process's instance store; a bad file or no store at
// all is a usage error naming it.
func TestConfigFlag(t *testing.T) {
	dir := buildStore(t, 6)
	cfgPath := filepath.Join(t.TempDir(), "ucm.yaml")
	yml := fmt.Sprintf("ucm_connectors:\n  - ucm_connector_name: UcmPipelineStore\n    ucm_connector_config:\n      store_pipeline: Posix\n      storage_backends: %s\n      io_direct: false\nenable_event_sync: true\nuse_layerwise: true\n", dir)
	if err := os.WriteFile(cfgPath, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"stats"}, {"verify"}, {"inspect"}, {"gc"}, {"compact"}, {"evict", "--to", "0"}} {
		args := append(append([]string(nil), cmd...), "--config", cfgPath)
		out, errOut, code := run(t, args...)
		if code != cliutil.ExitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	t.Setenv("UCM_CONFIG_FILE", cfgPath)
	if out, _, code := run(t, "stats", "--json"); code != cliutil.ExitOK || !strings.Contains(out, "blocks") {
		t.Fatalf("stats from UCM_CONFIG_FILE: %d %s", code, out)
	}
	t.Setenv("UCM_CONFIG_FILE", "")
	_, errOut, code := run(t, "stats", "--config", cfgPath, "--instance", "w0")
	if code != cliutil.ExitUsage || !strings.Contains(errOut, `no store of instance "w0"`) || !strings.Contains(errOut, filepath.Join(dir, "stores")) {
		t.Fatalf("--instance of a store that does not exist: %d %s", code, errOut)
	}
	testInstanceFlag(t)
	_, errOut, code = run(t, "stats")
	if code != cliutil.ExitUsage || !strings.Contains(errOut, "--config") {
		t.Fatalf("no store: %d %s", code, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("ucm_connectors:\n  - ucm_connector_config:\n      storage_backends: /x\n      sync_polcy: none\n"), 0o644)
	_, errOut, code = run(t, "verify", "--config", bad)
	if code != cliutil.ExitUsage || !strings.Contains(errOut, "sync_polcy") {
		t.Fatalf("bad config: %d %s", code, errOut)
	}
}

// testInstanceFlag: --instance finds the instance store the connector places in its layout's
// namespace (<backend>/stores/<namespace>/NAME); an instance with stores of two layouts is a
// usage error listing both, either of which works as DIR.
func testInstanceFlag(t *testing.T) {
	backend := t.TempDir()
	cfgPath := filepath.Join(t.TempDir(), "ucm.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n      storage_backends: %s\n      io_direct: false\n", backend)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := ucmconfig.LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	create := func(l engine.Layout, blocks int) string {
		dir, opts, err := cfg.InstanceStore("w0", testSchema, l)
		if err != nil {
			t.Fatal(err)
		}
		opts.SegmentSize = testSegmentSize
		e, err := engine.Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		if blocks > 0 {
			dump(t, e, 0, blocks)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	first := create(testLayout, 3)
	out, errOut, code := run(t, "stats", "--json", "--config", cfgPath, "--instance", "w0")
	if code != cliutil.ExitOK || !strings.Contains(out, `"blocks": 3`) {
		t.Fatalf("stats --instance w0: %d\n%s%s", code, out, errOut)
	}
	other := testLayout
	other.Shards *= 2
	second := create(other, 0)
	_, errOut, code = run(t, "stats", "--config", cfgPath, "--instance", "w0")
	if code != cliutil.ExitUsage || !strings.Contains(errOut, first) || !strings.Contains(errOut, second) {
		t.Fatalf("stats --instance w0 with two layouts: %d %s", code, errOut)
	}
	if out, errOut, code := run(t, "stats", "--json", first); code != cliutil.ExitOK || !strings.Contains(out, `"blocks": 3`) {
		t.Fatalf("stats %s: %d\n%s%s", first, code, out, errOut)
	}
}
