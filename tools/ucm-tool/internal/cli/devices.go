package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/kernels"
)

// devicesReport is what devices prints (the --json form has these field names).
type devicesReport struct {
	// NVML is the GPU discovery: nvml false with a reason when there is no usable driver.
	NVML kernels.Discovery `json:"nvml"`
	// HostNUMANodes is the host's NUMA topology; HostNUMAError says why it is missing.
	HostNUMANodes []kernels.NUMANode `json:"host_numa_nodes"`
	HostNUMAError string             `json:"host_numa_error,omitempty"`
	// StagingProbe is one small staging buffer mapped per host NUMA node with placement, huge
	// pages and page locking asked for: what the staging layer gets on this machine.
	StagingProbe []kernels.Placement `json:"staging_probe"`
	// Simulated is the simulated device tests and the reference connector use.
	Simulated kernels.DeviceInfo `json:"simulated_device"`
}

func newDevicesCmd(stdout io.Writer) *cobra.Command {
	var asJSON bool
	var library string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "devices",
		Short: "Print the GPUs, host NUMA nodes and staging placement the kernels layer sees",
		Long: `devices prints what the staging layer finds on this machine: the NVML status
(driver library loaded or why not) and each GPU NVML reports (name, UUID, PCI bus id,
memory, PCIe generation and width, current and max, NUMA node, NVLink peers), the host
NUMA nodes, a probe of staging buffers placed on each node (placed, huge pages,
page-locked), and the simulated device.

A machine without an NVIDIA driver is not an error: NVML is reported unavailable
with the reason, and the command exits 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDevices(cmd.Context(), stdout, library, timeout, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	cmd.Flags().StringVar(&library, "nvml-library", kernels.DefaultNVMLLibrary, "the NVML library to load")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up on NVML after this long")
	return cmd
}

func runDevices(ctx context.Context, stdout io.Writer, library string, timeout time.Duration, asJSON bool) error {
	if timeout <= 0 {
		return cliutil.UsageErr("--timeout must be positive")
	}
	var r devicesReport
	// The error is ErrNoDevice with the reason already in the Discovery.
	r.NVML, _ = kernels.Discover(ctx, kernels.DiscoverOptions{LibraryPath: library, Timeout: timeout})
	nodes, err := kernels.HostNUMANodes()
	if err != nil {
		r.HostNUMAError = err.Error()
	}
	r.HostNUMANodes = nodes
	if r.HostNUMANodes == nil {
		r.HostNUMANodes = []kernels.NUMANode{}
	}
	r.StagingProbe = []kernels.Placement{}
	for _, n := range r.HostNUMANodes {
		st, err := kernels.NewStaging(4<<20, kernels.StagingOptions{Place: true, NUMANode: n.ID, HugePages: true, Lock: true})
		if err != nil {
			r.StagingProbe = append(r.StagingProbe, kernels.Placement{RequestedNode: n.ID, Node: -1, Notes: []string{err.Error()}})
			continue
		}
		r.StagingProbe = append(r.StagingProbe, st.Placement())
		_ = st.Close()
	}
	sim, err := kernels.NewSimDevice(kernels.SimOptions{})
	if err != nil {
		return err
	}
	r.Simulated = sim.Info()
	_ = sim.Close()

	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	printDevices(stdout, &r)
	return nil
}

func printDevices(w io.Writer, r *devicesReport) {
	d := r.NVML
	if d.NVML {
		fmt.Fprintf(w, "NVML:        %s, driver %s, NVML %s, CUDA %s\n", d.Library, orDash(d.DriverVersion), orDash(d.NVMLVersion), cudaVersion(d.CUDADriverVersion))
	} else {
		fmt.Fprintf(w, "NVML:        unavailable: %s\n", d.Reason)
	}
	if len(d.GPUs) == 0 {
		fmt.Fprintln(w, "GPUs:        none")
	} else {
		fmt.Fprintln(w, "GPUs:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  index\tname\tbus id\tmemory\tfree\tpcie (now/max)\tnuma\tnvlink peers\tuuid")
		for _, g := range d.GPUs {
			numa := "-"
			if g.NUMANode >= 0 {
				numa = fmt.Sprintf("%d (%s)", g.NUMANode, g.NUMASource)
			}
			peers := make([]string, 0, len(g.NVLinks))
			for _, l := range g.NVLinks {
				p := l.PeerBusID
				if l.PeerIndex >= 0 {
					p = "gpu" + strconv.Itoa(l.PeerIndex)
				}
				peers = append(peers, fmt.Sprintf("%d→%s", l.Link, p))
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\tgen%d x%d / gen%d x%d\t%s\t%s\t%s\n", g.Index, orDash(g.Name), orDash(g.BusID),
				cliutil.HumanBytes(int64(g.MemoryTotal)), cliutil.HumanBytes(int64(g.MemoryFree)), g.PCIe.CurrentGen, g.PCIe.CurrentWidth, g.PCIe.MaxGen, g.PCIe.MaxWidth,
				numa, orDash(strings.Join(peers, ",")), orDash(g.UUID))
		}
		_ = tw.Flush()
		for _, g := range d.GPUs {
			for _, p := range g.Problems {
				fmt.Fprintf(w, "  gpu%d: not reported: %s\n", g.Index, p)
			}
		}
	}
	if r.HostNUMAError != "" {
		fmt.Fprintf(w, "host NUMA:   unknown: %s\n", r.HostNUMAError)
	} else {
		fmt.Fprintln(w, "host NUMA nodes:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  node\tcpus\tmemory\tfree\tstaging probe")
		for i, n := range r.HostNUMANodes {
			probe := "-"
			if i < len(r.StagingProbe) {
				probe = describePlacement(r.StagingProbe[i])
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", n.ID, orDash(cpuRanges(n.CPUs)), cliutil.HumanBytes(n.MemTotal), cliutil.HumanBytes(n.MemFree), probe)
		}
		_ = tw.Flush()
	}
	s := r.Simulated
	link := "unlimited"
	if s.LinkBytesPerSec > 0 {
		link = fmt.Sprintf("%s/s", cliutil.HumanBytes(int64(s.LinkBytesPerSec)))
	}
	memory := "host memory"
	if s.MemoryBytes > 0 {
		memory = cliutil.HumanBytes(s.MemoryBytes)
	}
	fmt.Fprintf(w, "simulated:   %s (%s), memory %s, link %s, latency %v, copy threads %d\n", s.Name, s.Kind, memory, link, s.LinkLatency, s.CopyThreads)
}

func describePlacement(p kernels.Placement) string {
	var parts []string
	if p.Placed {
		parts = append(parts, "placed")
	} else {
		parts = append(parts, fmt.Sprintf("not placed (on node %d)", p.Node))
	}
	if p.HugePages {
		parts = append(parts, "huge pages")
	}
	if p.Pinned {
		parts = append(parts, "page-locked")
	}
	s := strings.Join(parts, ", ")
	if len(p.Notes) > 0 {
		s += "; " + strings.Join(p.Notes, "; ")
	}
	return s
}

// cpuRanges prints a sorted CPU list in the kernel's form: "0-3,8".
func cpuRanges(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", cpus[i], cpus[j])
		} else {
			fmt.Fprintf(&b, "%d", cpus[i])
		}
		i = j + 1
	}
	return b.String()
}

func cudaVersion(v int) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
