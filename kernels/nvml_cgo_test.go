//go:build linux && cgo && !nonvml

package kernels

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func TestDiscoverWithoutDriver(t *testing.T) {
	// This machine (and CI) has no NVIDIA driver; elsewhere point at a library that is not
	// there.
	for _, path := range []string{"", "/nonexistent/libnvidia-ml.so.1", writeGarbageLib(t)} {
		start := time.Now()
		d, err := Discover(context.Background(), DiscoverOptions{LibraryPath: path})
		if path == "" && err == nil {
			t.Skipf("NVML is present here: %+v", d)
		}
		if !errors.Is(err, ErrNoDevice) || d.NVML || d.Reason == "" || d.GPUs == nil || len(d.GPUs) != 0 {
			t.Fatalf("%q: %+v, %v", path, d, err)
		}
		if !strings.Contains(err.Error(), "NVML unavailable") || !strings.Contains(d.Reason, "cannot load") {
			t.Fatalf("%q: reason %q, error %v", path, d.Reason, err)
		}
		t.Logf("%q: %v (%v)", path, err, time.Since(start))
	}
}

func writeGarbageLib(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	if err := os.WriteFile(p, []byte("not an ELF file"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func pciInfo(bus string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(bus) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(bus[i])
	}
	return p
}

// fakeGPU is a mock device with every entry point Discover uses.
func fakeGPU(name, bus string, numa int, links map[int]string) *mock.Device {
	return &mock.Device{
		GetNameFunc:                   func() (string, nvml.Return) { return name, nvml.SUCCESS },
		GetUUIDFunc:                   func() (string, nvml.Return) { return "GPU-" + name + "-" + bus, nvml.SUCCESS },
		GetPciInfoFunc:                func() (nvml.PciInfo, nvml.Return) { return pciInfo(bus), nvml.SUCCESS },
		GetMemoryInfoFunc:             func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 80 << 30, Free: 79 << 30}, nvml.SUCCESS },
		GetCurrPcieLinkGenerationFunc: func() (int, nvml.Return) { return 4, nvml.SUCCESS },
		GetMaxPcieLinkGenerationFunc:  func() (int, nvml.Return) { return 5, nvml.SUCCESS },
		GetCurrPcieLinkWidthFunc:      func() (int, nvml.Return) { return 16, nvml.SUCCESS },
		GetMaxPcieLinkWidthFunc:       func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN },
		GetNumaNodeIdFunc: func() (int, nvml.Return) {
			if numa < 0 {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return numa, nvml.SUCCESS
		},
		GetNvLinkStateFunc: func(l int) (nvml.EnableState, nvml.Return) {
			if links == nil {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if l >= 4 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if _, ok := links[l]; ok {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		},
		GetNvLinkRemotePciInfoFunc: func(l int) (nvml.PciInfo, nvml.Return) { return pciInfo(links[l]), nvml.SUCCESS },
	}
}

func fakeNVML(devs []nvml.Device, symbols bool, init func() nvml.Return) *mock.Interface {
	return &mock.Interface{
		InitFunc:                       init,
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc:                func(r nvml.Return) string { return r.Error() },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		SystemGetNVMLVersionFunc:       func() (string, nvml.Return) { return "12.550.54.15", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 12040, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i == 2 {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return devs[i], nvml.SUCCESS
		},
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error {
				if symbols {
					return nil
				}
				return errors.New("undefined symbol")
			}}
		},
	}
}

func withFakeNVML(t *testing.T, lib nvml.Interface) {
	old := newNVML
	newNVML = func(string) nvml.Interface { return lib }
	t.Cleanup(func() { newNVML = old })
}

func TestDiscoverGPUs(t *testing.T) {
	sysfs := t.TempDir()
	writeTestFile(t, filepath.Join(sysfs, "0000:b1:00.0", "numa_node"), "1\n")
	devs := []nvml.Device{
		fakeGPU("H100", "00000000:3B:00.0", 0, map[int]string{0: "00000000:B1:00.0", 2: "00000000:C0:00.0"}),
		fakeGPU("H100", "00000000:B1:00.0", -1, map[int]string{1: "00000000:3B:00.0"}),
		nil, // lost
	}
	withFakeNVML(t, fakeNVML(devs, true, func() nvml.Return { return nvml.SUCCESS }))
	d, err := Discover(context.Background(), DiscoverOptions{sysfs: sysfs})
	if err != nil {
		t.Fatal(err)
	}
	if !d.NVML || d.DriverVersion != "550.54.15" || d.CUDADriverVersion != 12040 || len(d.GPUs) != 3 {
		t.Fatalf("%+v", d)
	}
	g0, g1 := d.GPUs[0], d.GPUs[1]
	if g0.BusID != "0000:3b:00.0" || g0.Name != "H100" || g0.MemoryTotal != 80<<30 || g0.PCIe != (PCIeLink{CurrentGen: 4, MaxGen: 5, CurrentWidth: 16}) {
		t.Fatalf("gpu 0: %+v", g0)
	}
	if g0.NUMANode != 0 || g0.NUMASource != "nvml" || g1.NUMANode != 1 || g1.NUMASource != "sysfs" {
		t.Fatalf("numa: %+v / %+v", g0, g1)
	}
	if len(g0.NVLinks) != 2 || g0.NVLinks[0] != (NVLinkPeer{Link: 0, PeerBusID: "0000:b1:00.0", PeerIndex: 1}) || g0.NVLinks[1].PeerIndex != -1 {
		t.Fatalf("gpu 0 links: %+v", g0.NVLinks)
	}
	if len(g1.NVLinks) != 1 || g1.NVLinks[0].PeerIndex != 0 {
		t.Fatalf("gpu 1 links: %+v", g1.NVLinks)
	}
	if len(g0.Problems) != 1 || !strings.Contains(g0.Problems[0], "pcie max width") {
		t.Fatalf("problems: %v", g0.Problems)
	}
	if g2 := d.GPUs[2]; len(g2.Problems) != 1 || !strings.Contains(g2.Problems[0], "handle") || g2.NUMANode != -1 {
		t.Fatalf("lost gpu: %+v", g2)
	}

	// A driver without the newer entry points: NUMA from sysfs only, no NVLink walk.
	withFakeNVML(t, fakeNVML(devs[:2], false, func() nvml.Return { return nvml.SUCCESS }))
	d, err = Discover(context.Background(), DiscoverOptions{sysfs: sysfs})
	if err != nil {
		t.Fatal(err)
	}
	if d.GPUs[0].NUMANode != -1 || d.GPUs[1].NUMASource != "sysfs" || len(d.GPUs[0].NVLinks) != 0 {
		t.Fatalf("old driver: %+v", d.GPUs)
	}
}

func TestDiscoverFailures(t *testing.T) {
	withFakeNVML(t, fakeNVML(nil, true, func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }))
	d, err := Discover(context.Background(), DiscoverOptions{})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(d.Reason, "kernel driver") {
		t.Fatalf("driver not loaded: %+v %v", d, err)
	}
	// A mock missing an entry point panics inside go-nvml's mock: reported, not propagated.
	withFakeNVML(t, &mock.Interface{InitFunc: func() nvml.Return { return nvml.SUCCESS }, ShutdownFunc: func() nvml.Return { return nvml.SUCCESS }})
	d, err = Discover(context.Background(), DiscoverOptions{})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(d.Reason, "panicked") {
		t.Fatalf("panic: %+v %v", d, err)
	}
	// A wedged driver: Discover gives up after its timeout, and a second call while the first
	// is stuck says so instead of queueing behind it.
	release := make(chan struct{})
	withFakeNVML(t, fakeNVML(nil, true, func() nvml.Return { <-release; return nvml.ERROR_UNKNOWN }))
	d, err = Discover(context.Background(), DiscoverOptions{Timeout: 20 * time.Millisecond})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(d.Reason, "no answer") {
		t.Fatalf("timeout: %+v %v", d, err)
	}
	d, err = Discover(context.Background(), DiscoverOptions{Timeout: 20 * time.Millisecond})
	if !errors.Is(err, ErrNoDevice) || !strings.Contains(d.Reason, "has not returned") {
		t.Fatalf("second call: %+v %v", d, err)
	}
	close(release)
	nvmlBusy <- struct{}{} // wait for the stuck call to return
	<-nvmlBusy
	// Once the stuck call returns, discovery works again.
	withFakeNVML(t, fakeNVML(nil, true, func() nvml.Return { return nvml.SUCCESS }))
	if _, err := Discover(context.Background(), DiscoverOptions{Timeout: 5 * time.Second}); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}
