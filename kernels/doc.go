// Package kernels will hold the staging layer: the device abstraction (a simulated host
// device and NVML discovery), gather/scatter transfer kernels between paged KV caches and
// staging buffers, and the representation kernels run on staged blocks.
package kernels
