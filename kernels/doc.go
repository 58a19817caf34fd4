// Package kernels is the staging layer between an inference engine's paged KV caches and the
// store, and the kernels run on staged blocks.
//
// Devices. A Device has memory allocations (Memory), addressed through bounds-checked Spans,
// never raw pointers; Streams that run copies (host to device, device to host, device to
// device) and launched functions in order on their own goroutine; and Events that mark points
// in a stream for the host (Synchronize, Query) or other streams (WaitEvent) to wait for, in
// the spirit of CUDA streams. NewSimDevice returns the simulated device that tests and CPU
// deployments use: its memory is host memory, its copies are real memcpys, and SimOptions can
// model the host link's bandwidth and latency so the overlap of copies with compute can be
// measured. Discover lists real GPUs through NVML (github.com/NVIDIA/go-nvml, which dlopens
// libnvidia-ml.so): name, UUID, memory, PCIe link, NUMA node, NVLink peers; without a driver
// it says why, with an error wrapping ErrNoDevice, and never hangs. HostNUMANodes reads the
// host's NUMA topology.
//
// Staging. NewStaging maps host buffers aligned to 4096 (O_DIRECT-ready), optionally on the
// GPU's NUMA node (mbind), with transparent huge pages, page-locked ("pinned"; on a real GPU
// also cudaHostRegister'ed), reporting what placement it got. A staging buffer stays mapped
// while a queued copy uses it.
//
// Paged KV. Register validates per-layer KV caches in the layouts engines use (vLLM
// FlashAttention, FlashInfer, MLA, ReRoPE; float16, bfloat16, float8, float32; explicit
// strides; tensor-parallel head slices) and returns a PagedKV, which maps engine block ids to
// the store's record layout (RecordLayout: one shard per layer, each shard's tensors
// token-major) and gathers (device to host) and scatters (host to device) blocks as coalesced
// copies on a stream, whole blocks (block-major) or one layer of many blocks (layer-major).
// A Pipeline moves layers between the store and the caches through a bounded set of staging
// buffers, so that compute on layer i overlaps the transfer of layer i+1: Load (WaitLayer(i)
// returns once layer i is resident) and Dump (SaveLayer(i, event) as each layer's KV becomes
// final).
//
// Representations. The representation kernels (ESAPool, QuestMinMax, KVStar, HashBlock) run on
// a staged block's K and their outputs are stored as sidecars (SidecarWriter, DecodeSidecar).
//
// Errors wrap ErrInvalid, ErrOutOfRange or ErrNoDevice (test with errors.Is) and name the
// layer, block id, field or allocation at fault. docs/kernels.md has the layouts, the
// semantics and the measured throughput.
package kernels
