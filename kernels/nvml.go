package kernels

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultNVMLLibrary is the library Discover loads unless told otherwise.
const DefaultNVMLLibrary = "libnvidia-ml.so.1"

// DiscoverOptions configures Discover.
type DiscoverOptions struct {
	// LibraryPath is the NVML library to load (dlopen); default DefaultNVMLLibrary.
	LibraryPath string
	// Timeout bounds the whole discovery (a wedged driver can block NVML calls for minutes);
	// default 10 s.
	Timeout time.Duration

	// sysfs is the root of the PCI device tree, for tests; default /sys/bus/pci/devices.
	sysfs string
}

// Discovery is what Discover found. When NVML is unavailable, NVML is false, Reason says why
// and GPUs is empty.
type Discovery struct {
	NVML   bool   `json:"nvml"`
	Reason string `json:"reason,omitempty"`
	// Library is the NVML library asked for.
	Library string `json:"library"`
	// DriverVersion, NVMLVersion and CUDADriverVersion (e.g. 12040 for 12.4) are empty or 0
	// when NVML could not report them.
	DriverVersion     string    `json:"driver_version,omitempty"`
	NVMLVersion       string    `json:"nvml_version,omitempty"`
	CUDADriverVersion int       `json:"cuda_driver_version,omitempty"`
	GPUs              []GPUInfo `json:"gpus"`
}

// GPUInfo describes one GPU as NVML reports it. Fields NVML could not report are left zero
// (NUMANode -1) and named in Problems.
type GPUInfo struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	// BusID is the PCI address in sysfs form, "0000:3b:00.0".
	BusID       string   `json:"bus_id"`
	MemoryTotal uint64   `json:"memory_total"`
	MemoryFree  uint64   `json:"memory_free"`
	PCIe        PCIeLink `json:"pcie"`
	// NUMANode is the host NUMA node the GPU is attached to, -1 when unknown; NUMASource says
	// where it came from ("nvml" or "sysfs"). Staging buffers for this GPU belong there
	// (StagingOptions.NUMANode).
	NUMANode   int          `json:"numa_node"`
	NUMASource string       `json:"numa_source,omitempty"`
	NVLinks    []NVLinkPeer `json:"nvlinks,omitempty"`
	Problems   []string     `json:"problems,omitempty"`
}

// PCIeLink is a GPU's PCIe link: generation and lane width, as trained now and at most.
type PCIeLink struct {
	CurrentGen   int `json:"current_gen"`
	MaxGen       int `json:"max_gen"`
	CurrentWidth int `json:"current_width"`
	MaxWidth     int `json:"max_width"`
}

// NVLinkPeer is one active NVLink of a GPU and what is at its other end.
type NVLinkPeer struct {
	Link int `json:"link"`
	// PeerBusID is the remote end's PCI address (sysfs form); PeerIndex the index of that GPU
	// in this Discovery, or -1 when it is not one of them (an NVSwitch, say).
	PeerBusID string `json:"peer_bus_id"`
	PeerIndex int    `json:"peer_index"`
}

// nvmlBusy is held by a discovery in progress: NVML calls are not cancellable, so a discovery
// that timed out keeps it until its calls return, and later ones report that rather than pile
// up behind a wedged driver.
var nvmlBusy = make(chan struct{}, 1)

// Discover lists the GPUs NVML reports. It never panics and never blocks past opts.Timeout or
// ctx: when NVML is unusable (no driver library, which is the case on machines without an
// NVIDIA driver; a driver that fails to initialise; a build without cgo; a timeout) it
// returns a Discovery saying why together with an error wrapping ErrNoDevice. A machine with
// NVML and no GPUs is not an error.
func Discover(ctx context.Context, opts DiscoverOptions) (Discovery, error) {
	if opts.LibraryPath == "" {
		opts.LibraryPath = DefaultNVMLLibrary
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.sysfs == "" {
		opts.sysfs = "/sys/bus/pci/devices"
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	unavailable := func(reason string) (Discovery, error) {
		return Discovery{Library: opts.LibraryPath, Reason: reason, GPUs: []GPUInfo{}}, errorf(ErrNoDevice, "NVML unavailable: %s", reason)
	}
	select {
	case nvmlBusy <- struct{}{}:
	case <-ctx.Done():
		return unavailable("an earlier NVML discovery has not returned (driver not responding)")
	}
	done := make(chan Discovery, 1)
	go func() {
		defer func() { <-nvmlBusy }()
		var d Discovery
		func() {
			defer func() {
				if r := recover(); r != nil {
					d = Discovery{Reason: fmt.Sprintf("NVML discovery panicked: %v", r)}
				}
			}()
			d = discoverNVML(opts)
		}()
		d.Library = opts.LibraryPath
		if d.GPUs == nil {
			d.GPUs = []GPUInfo{}
		}
		done <- d
	}()
	select {
	case d := <-done:
		if !d.NVML {
			return d, errorf(ErrNoDevice, "NVML unavailable: %s", d.Reason)
		}
		return d, nil
	case <-ctx.Done():
		return unavailable(fmt.Sprintf("no answer from NVML within %v: %v", opts.Timeout, ctx.Err()))
	}
}

// sysfsBusID turns NVML's bus id ("00000000:3B:00.0", 8-digit domain, upper case) into the
// sysfs form ("0000:3b:00.0"); other strings are returned lower-cased.
func sysfsBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if ok && len(dom) > 4 {
		if _, err := strconv.ParseUint(dom, 16, 32); err == nil {
			dom = dom[len(dom)-4:]
		}
	}
	if !ok {
		return s
	}
	return dom + ":" + rest
}

// sysfsNUMANode reads the NUMA node of a PCI device from sysfs; -1 when unknown.
func sysfsNUMANode(root, busID string) int {
	if busID == "" || strings.ContainsAny(busID, "/\\") || strings.Contains(busID, "..") {
		return -1
	}
	s, err := readSmall(filepath.Join(root, busID, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= maxNUMANodes {
		return -1
	}
	return n
}
