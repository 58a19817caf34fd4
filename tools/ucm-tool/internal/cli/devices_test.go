package cli

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/internal/cliutil"
)

func TestDevicesJSON(t *testing.T) {
	// A library that cannot be there: NVML is unavailable on every machine.
	out, _, code := run(t, "devices", "--json", "--nvml-library", "/nonexistent/libnvidia-ml.so.1")
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	var r devicesReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.NVML.NVML || r.NVML.Reason == "" || r.NVML.GPUs == nil || len(r.NVML.GPUs) != 0 || r.NVML.Library != "/nonexistent/libnvidia-ml.so.1" {
		t.Fatalf("nvml: %+v", r.NVML)
	}
	if r.Simulated.Name != "sim0" || r.Simulated.Kind != "sim" || r.Simulated.CopyThreads < 1 {
		t.Fatalf("simulated device: %+v", r.Simulated)
	}
	if runtime.GOOS == "linux" && r.HostNUMAError == "" {
		if len(r.HostNUMANodes) == 0 || len(r.StagingProbe) != len(r.HostNUMANodes) {
			t.Fatalf("numa: %+v, probe %+v", r.HostNUMANodes, r.StagingProbe)
		}
		for i, p := range r.StagingProbe {
			if p.RequestedNode != r.HostNUMANodes[i].ID {
				t.Fatalf("probe %d asked for node %d", i, p.RequestedNode)
			}
		}
	}
	// The raw JSON uses the documented names.
	for _, key := range []string{`"nvml"`, `"reason"`, `"gpus"`, `"host_numa_nodes"`, `"staging_probe"`, `"simulated_device"`} {
		if !strings.Contains(out, key) {
			t.Fatalf("JSON lacks %s", key)
		}
	}
}

func TestDevicesText(t *testing.T) {
	out, _, code := run(t, "devices", "--nvml-library", "/nonexistent/libnvidia-ml.so.1")
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"NVML:        unavailable: cannot load /nonexistent/libnvidia-ml.so.1", "GPUs:        none", "simulated:   sim0 (sim)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	// The default library: whatever this machine has, the command answers and exits 0.
	if _, _, code := run(t, "devices"); code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	if _, _, code := run(t, "devices", "--timeout", "0s"); code != cliutil.ExitUsage {
		t.Fatalf("zero timeout: exit %d", code)
	}
	if _, _, code := run(t, "devices", "extra"); code != cliutil.ExitUsage {
		t.Fatalf("extra argument: exit %d", code)
	}
}

func TestCPURanges(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{{nil, ""}, {[]int{0}, "0"}, {[]int{0, 1, 2, 3}, "0-3"}, {[]int{0, 1, 4, 6, 7}, "0-1,4,6-7"}} {
		if got := cpuRanges(c.in); got != c.want {
			t.Errorf("%v: %q, want %q", c.in, got, c.want)
		}
	}
	if cudaVersion(12040) != "12.4" || cudaVersion(0) != "-" {
		t.Fatal(cudaVersion(12040))
	}
}
