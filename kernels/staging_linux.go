//go:build linux

package kernels

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxNUMANodes bounds node numbers (the kernel's MAX_NUMNODES on large configurations).
const maxNUMANodes = 1024

func adviseHugePages(b []byte) error {
	return unix.Madvise(b, unix.MADV_HUGEPAGE)
}

// bindToNode sets a preferred-node memory policy on b's pages (mbind MPOL_PREFERRED), before
// they are first touched, so they are allocated on node when it has room.
func bindToNode(b []byte, node int) error {
	var mask [maxNUMANodes / 64]uint64
	mask[node/64] |= 1 << (uint(node) % 64)
	// maxnode counts the bits the kernel reads, plus one (mbind(2)).
	_, _, errno := unix.Syscall6(unix.SYS_MBIND, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		unix.MPOL_PREFERRED, uintptr(unsafe.Pointer(&mask[0])), maxNUMANodes+1, 0)
	if errno != 0 {
		return fmt.Errorf("mbind: %w", errno)
	}
	return nil
}

// nodeOf returns the NUMA node of b's first page (get_mempolicy MPOL_F_NODE|MPOL_F_ADDR); the
// page must be resident.
func nodeOf(b []byte) (int, error) {
	var node int32
	_, _, errno := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&node)), 0, 0,
		uintptr(unsafe.Pointer(unsafe.SliceData(b))), unix.MPOL_F_NODE|unix.MPOL_F_ADDR, 0)
	if errno != 0 {
		return -1, fmt.Errorf("get_mempolicy: %w", errno)
	}
	return int(node), nil
}

const sysNodeDir = "/sys/devices/system/node"
