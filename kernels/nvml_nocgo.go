//go:build !linux || !cgo

package kernels

// discoverNVML reports that this build cannot reach NVML: go-nvml needs cgo and Linux.
func discoverNVML(opts DiscoverOptions) Discovery {
	return Discovery{Reason: "NVML discovery needs a Linux build with cgo"}
}
