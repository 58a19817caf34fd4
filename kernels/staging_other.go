//go:build !linux

package kernels

import "errors"

const maxNUMANodes = 1024

var errNoNUMA = errors.New("not supported on this system")

func adviseHugePages(b []byte) error { return errNoNUMA }

func bindToNode(b []byte, node int) error { return errNoNUMA }

func nodeOf(b []byte) (int, error) { return -1, errNoNUMA }

// sysNodeDir does not exist outside Linux: HostNUMANodes reports no nodes.
const sysNodeDir = "/sys/devices/system/node"
