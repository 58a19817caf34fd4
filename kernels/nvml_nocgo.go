//go:build !linux || !cgo || nonvml

package kernels

// discoverNVML reports that this build cannot reach NVML: go-nvml needs cgo and Linux, and
// the nonvml build tag leaves it out (the C ABI's shared library, libucmgo.so: go-nvml's
// bindings leave NVML's symbols unresolved, which an executable tolerates and a shared
// library its users link against does not).
func discoverNVML(opts DiscoverOptions) Discovery {
	return Discovery{Reason: "NVML discovery needs a Linux build with cgo, without the nonvml tag"}
}
