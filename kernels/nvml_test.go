package kernels

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

func TestSysfsBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:C0:00.0": "0001:c0:00.0",
		"garbage":          "garbage",
		"zzzzzzzz:01:00.0": "zzzzzzzz:01:00.0",
	} {
		if got := sysfsBusID(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func TestSysfsNUMANode(t *testing.T) {
	root := t.TempDir()
	writeTestFile(t, filepath.Join(root, "0000:01:00.0", "numa_node"), "3\n")
	writeTestFile(t, filepath.Join(root, "0000:02:00.0", "numa_node"), "-1\n")
	writeTestFile(t, filepath.Join(root, "0000:03:00.0", "numa_node"), "lots\n")
	for bus, want := range map[string]int{"0000:01:00.0": 3, "0000:02:00.0": -1, "0000:03:00.0": -1, "0000:04:00.0": -1, "../x": -1, "": -1} {
		if got := sysfsNUMANode(root, bus); got != want {
			t.Errorf("%q: %d, want %d", bus, got, want)
		}
	}
}

func TestDiscoverNeverFailsHard(t *testing.T) {
	// Whatever the build and machine, Discover answers: NVML, or ErrNoDevice with a reason.
	d, err := Discover(context.Background(), DiscoverOptions{LibraryPath: "/nonexistent/libnvidia-ml.so"})
	if !errors.Is(err, ErrNoDevice) || d.NVML || d.Reason == "" {
		t.Fatalf("%+v %v", d, err)
	}
}
