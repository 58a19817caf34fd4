package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
)

// TestStatsInstances: stats --config FILE without --instance, on a storage_backends shared by
// processes (an instance store per process under stores/, as the connector makes them), lists
// every instance with its state and accounting and a total line, a stopped instance from its
// index and a running one from what it published, and changes nothing.
func TestStatsInstances(t *testing.T) {
	backend := t.TempDir()
	cfgPath := filepath.Join(t.TempDir(), "ucm.yaml")
	yml := fmt.Sprintf("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n      storage_backends: %s\n      io_direct: false\n", backend)
	if err := os.WriteFile(cfgPath, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := ucmconfig.LoadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	open := func(name string) *engine.Engine {
		dir, opts, err := cfg.InstanceStore(name, testSchema, testLayout)
		if err != nil {
			t.Fatal(err)
		}
		opts.Layout, opts.Schema, opts.SegmentSize = testLayout, testSchema, testSegmentSize
		opts.SharedSealAge, opts.SharedRefreshInterval = 10*time.Millisecond, 20*time.Millisecond
		e, err := engine.Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	stopped := open("w0")
	dump(t, stopped, 0, 30)
	if err := stopped.Close(); err != nil {
		t.Fatal(err)
	}
	running := open("w1")
	t.Cleanup(func() { running.Close() })
	dump(t, running, 100, 110)
	if err := os.MkdirAll(filepath.Join(backend, ucmconfig.StoresDir, "junk"), 0o755); err != nil {
		t.Fatal(err)
	}

	// The running instance's blocks reach its manifest once their segment is sealed and
	// published: wait for that (a deadline, not a timing assertion).
	var rep instancesReport
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, errOut, code := run(t, "stats", "--config", cfgPath, "--json")
		if code != cliutil.ExitOK {
			t.Fatalf("stats --config of a shared backend: exit %d\n%s%s", code, out, errOut)
		}
		rep = instancesReport{}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("--json: %v\n%s", err, out)
		}
		if len(rep.Instances) == 3 && slices.ContainsFunc(rep.Instances, func(st instanceStats) bool { return st.Name == "w1" && st.Blocks == 10 }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the running instance's published blocks never reached 10: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	byName := map[string]instanceStats{}
	for _, st := range rep.Instances {
		byName[st.Name] = st
	}
	w0, w1, junk := byName["w0"], byName["w1"], byName["junk"]
	if w0.State != instanceStopped || w0.Blocks != 30 || w0.LiveBytes == nil || *w0.LiveBytes <= 0 ||
		*w0.LiveBytes+*w0.DeadBytes != w0.FileBytes || w0.Error != "" {
		t.Errorf("stopped instance: %+v", w0)
	}
	if w1.State != instanceRunning || w1.Blocks != 10 || w1.FileBytes <= 0 || w1.LiveBytes != nil || w1.Error != "" {
		t.Errorf("running instance: %+v", w1)
	}
	if junk.State != instanceNoStore || junk.Blocks != 0 {
		t.Errorf("directory without a store: %+v", junk)
	}
	if rep.Total.Blocks != 40 || rep.Total.FileBytes != w0.FileBytes+w1.FileBytes || rep.Total.LiveBytes != nil ||
		rep.Total.State != "1 running, 1 stopped" {
		t.Errorf("total: %+v", rep.Total)
	}

	// The table: a row per instance and the total line.
	out, _, code := run(t, "stats", "--config", cfgPath)
	if code != cliutil.ExitOK {
		t.Fatalf("stats: exit %d", code)
	}
	for _, want := range []string{"instance", "w0", "w1", "junk", "total", "running", "stopped", "1 running, 1 stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if f := strings.Fields(lines[len(lines)-3]); len(f) < 3 || f[0] != "total" {
		// the note about running instances follows the table
		t.Errorf("no total line where expected:\n%s", out)
	}

	// Once every instance is stopped, live and dead bytes are known for the total too.
	if err := running.Close(); err != nil {
		t.Fatal(err)
	}
	out, _, _ = run(t, "stats", "--config", cfgPath, "--json")
	rep = instancesReport{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Total.LiveBytes == nil || rep.Total.Blocks != 40 || rep.Total.State != "0 running, 2 stopped" {
		t.Errorf("total of stopped instances: %+v", rep.Total)
	}
	// --instance still picks one instance store.
	if out, _, code := run(t, "stats", "--config", cfgPath, "--instance", "w0", "--json"); code != cliutil.ExitOK || !strings.Contains(out, `"blocks": 30`) {
		t.Errorf("--instance w0: %d %s", code, out)
	}
}
