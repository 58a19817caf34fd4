//go:build linux && cgo && !nonvml

package kernels

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// newNVML opens the NVML library (go-nvml dlopens it at Init); a seam for tests.
var newNVML = func(path string) nvml.Interface { return nvml.New(nvml.WithLibraryPath(path)) }

func discoverNVML(opts DiscoverOptions) Discovery {
	return discoverWith(newNVML(opts.LibraryPath), opts)
}

// discoverWith runs a discovery against lib.
func discoverWith(lib nvml.Interface, opts DiscoverOptions) Discovery {
	var d Discovery
	if ret := lib.Init(); ret != nvml.SUCCESS {
		switch ret {
		case nvml.ERROR_LIBRARY_NOT_FOUND:
			d.Reason = fmt.Sprintf("cannot load %s (no NVIDIA driver installed, or not a loadable library)", opts.LibraryPath)
		case nvml.ERROR_DRIVER_NOT_LOADED:
			d.Reason = "the NVIDIA kernel driver is not loaded"
		default:
			d.Reason = fmt.Sprintf("nvmlInit: %s", nvmlString(lib, ret))
		}
		return d
	}
	defer lib.Shutdown()
	d.NVML = true
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		d.DriverVersion = v
	}
	if v, ret := lib.SystemGetNVMLVersion(); ret == nvml.SUCCESS {
		d.NVMLVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		d.CUDADriverVersion = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		d.NVML = false
		d.Reason = fmt.Sprintf("nvmlDeviceGetCount: %s", nvmlString(lib, ret))
		return d
	}
	n = min(n, 1024)
	// Newer entry points are looked up before use: calling one the installed driver lacks
	// would jump to an unresolved symbol.
	has := func(sym string) bool { return lib.Extensions().LookupSymbol(sym) == nil }
	hasNUMA := has("nvmlDeviceGetNumaNodeId")
	hasNVLink := has("nvmlDeviceGetNvLinkState") && (has("nvmlDeviceGetNvLinkRemotePciInfo_v2") || has("nvmlDeviceGetNvLinkRemotePciInfo"))
	type linkEnd struct {
		gpu  int
		peer NVLinkPeer
	}
	var links []linkEnd
	for i := 0; i < n; i++ {
		g := GPUInfo{Index: i, NUMANode: -1}
		problem := func(what string, ret nvml.Return) {
			g.Problems = append(g.Problems, fmt.Sprintf("%s: %s", what, nvmlString(lib, ret)))
		}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			problem("handle", ret)
			d.GPUs = append(d.GPUs, g)
			continue
		}
		if g.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
			problem("name", ret)
		}
		if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
			problem("uuid", ret)
		}
		if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
			g.BusID = sysfsBusID(cString(pci.BusId[:]))
		} else {
			problem("pci info", ret)
		}
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			g.MemoryTotal, g.MemoryFree = mem.Total, mem.Free
		} else {
			problem("memory info", ret)
		}
		for _, f := range []struct {
			what string
			get  func() (int, nvml.Return)
			dst  *int
		}{
			{"pcie current generation", dev.GetCurrPcieLinkGeneration, &g.PCIe.CurrentGen},
			{"pcie max generation", dev.GetMaxPcieLinkGeneration, &g.PCIe.MaxGen},
			{"pcie current width", dev.GetCurrPcieLinkWidth, &g.PCIe.CurrentWidth},
			{"pcie max width", dev.GetMaxPcieLinkWidth, &g.PCIe.MaxWidth},
		} {
			if v, ret := f.get(); ret == nvml.SUCCESS {
				*f.dst = v
			} else if ret != nvml.ERROR_NOT_SUPPORTED {
				problem(f.what, ret)
			}
		}
		if hasNUMA {
			if node, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS && node >= 0 && node < maxNUMANodes {
				g.NUMANode, g.NUMASource = node, "nvml"
			}
		}
		if g.NUMANode < 0 {
			if node := sysfsNUMANode(opts.sysfs, g.BusID); node >= 0 {
				g.NUMANode, g.NUMASource = node, "sysfs"
			}
		}
		for l := 0; hasNVLink && l < nvml.NVLINK_MAX_LINKS; l++ {
			state, ret := dev.GetNvLinkState(l)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				break // no NVLink, or no more links
			}
			if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
				continue
			}
			pci, ret := dev.GetNvLinkRemotePciInfo(l)
			if ret != nvml.SUCCESS {
				problem(fmt.Sprintf("nvlink %d remote", l), ret)
				continue
			}
			links = append(links, linkEnd{gpu: i, peer: NVLinkPeer{Link: l, PeerBusID: sysfsBusID(cString(pci.BusId[:])), PeerIndex: -1}})
		}
		d.GPUs = append(d.GPUs, g)
	}
	for _, le := range links {
		for j, g := range d.GPUs {
			if g.BusID != "" && g.BusID == le.peer.PeerBusID {
				le.peer.PeerIndex = j
			}
		}
		d.GPUs[le.gpu].NVLinks = append(d.GPUs[le.gpu].NVLinks, le.peer)
	}
	return d
}

func nvmlString(lib nvml.Interface, ret nvml.Return) string {
	return fmt.Sprintf("%s (%d)", lib.ErrorString(ret), int32(ret))
}

// cString reads a NUL-terminated C char array.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
