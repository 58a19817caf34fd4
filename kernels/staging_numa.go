package kernels

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// NUMANode is one host NUMA node as the kernel reports it in sysfs.
type NUMANode struct {
	// ID is the node number.
	ID int `json:"id"`
	// CPUs lists the node's CPUs.
	CPUs []int `json:"cpus"`
	// MemTotal and MemFree are the node's memory in bytes (0 when unreported).
	MemTotal int64 `json:"mem_total"`
	MemFree  int64 `json:"mem_free"`
}

// HostNUMANodes lists the host's online NUMA nodes from /sys/devices/system/node. It returns an
// error wrapping ErrNoDevice when the system reports no NUMA topology (not Linux, or a kernel
// without NUMA support).
func HostNUMANodes() ([]NUMANode, error) { return hostNUMANodesAt(sysNodeDir) }

func hostNUMANodesAt(dir string) ([]NUMANode, error) {
	online, err := readSmall(filepath.Join(dir, "online"))
	if err != nil {
		return nil, errorf(ErrNoDevice, "no NUMA topology: %v", err)
	}
	ids, err := parseCPUList(online)
	if err != nil {
		return nil, fmt.Errorf("NUMA topology: %s/online: %w", dir, err)
	}
	nodes := make([]NUMANode, 0, len(ids))
	for _, id := range ids {
		n := NUMANode{ID: id}
		nd := filepath.Join(dir, "node"+strconv.Itoa(id))
		if cl, err := readSmall(filepath.Join(nd, "cpulist")); err == nil {
			n.CPUs, _ = parseCPUList(cl)
		}
		if mi, err := readSmall(filepath.Join(nd, "meminfo")); err == nil {
			n.MemTotal, n.MemFree = parseNodeMeminfo(mi)
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// readSmall reads a sysfs file, at most 64 KiB of it.
func readSmall(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	n, err := f.Read(buf)
	if n == 0 && err != nil {
		return "", err
	}
	return string(bytes.TrimSpace(buf[:n])), nil
}

// maxListed bounds the entries a kernel list ("0-3,8") may expand to.
const maxListed = 1 << 16

// parseCPUList parses the kernel's list format: comma-separated numbers and ranges ("0-3,8").
// An empty string is an empty list.
func parseCPUList(s string) ([]int, error) {
	var out []int
	if s = strings.TrimSpace(s); s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, errorf(ErrInvalid, "bad list entry %q", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, errorf(ErrInvalid, "bad list range %q", part)
			}
		}
		if b-a >= maxListed || len(out)+b-a+1 > maxListed {
			return nil, errorf(ErrInvalid, "list %q longer than %d", s, maxListed)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	return out, nil
}

// parseNodeMeminfo reads "Node N MemTotal: X kB" and "Node N MemFree: X kB" lines.
func parseNodeMeminfo(s string) (total, free int64) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		v, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil || v < 0 || v > 1<<50 {
			continue
		}
		if len(f) > 4 && f[4] == "kB" {
			v <<= 10
		}
		switch f[2] {
		case "MemTotal:":
			total = v
		case "MemFree:":
			free = v
		}
	}
	return total, free
}
