package kernels

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// MaxAllocBytes bounds one device allocation (1 TiB): a size above it is refused before
// anything is allocated.
const MaxAllocBytes = 1 << 40

// Device is an accelerator in the spirit of a CUDA device: memory allocations addressed by
// bounds-checked spans, streams that run copies and host functions in order, and events that
// streamMark points in a stream. The only backend today is the simulated device (NewSimDevice): its
// memory is host memory and its copies are real memcpys run by one goroutine per stream. A CUDA
// backend would keep these types and put device pointers behind Memory.
//
// A Device is safe for concurrent use. Close it when done: it stops every stream.
type Device struct {
	opts   SimOptions
	closed chan struct{} // closed by Close
	nextID atomic.Int64

	mu      sync.Mutex
	isDown  bool
	used    int64 // bytes of live Alloc allocations
	streams map[*Stream]struct{}

	h2d, d2h simLink // the modelled host link, one per direction (PCIe is full duplex)
}

// DeviceInfo describes a device.
type DeviceInfo struct {
	// Name is SimOptions.Name ("sim0" by default).
	Name string `json:"name"`
	// Kind is the backend: "sim".
	Kind string `json:"kind"`
	// MemoryBytes is the capacity of device memory; 0 means bounded only by the host.
	MemoryBytes int64 `json:"memory_bytes"`
	// MemoryUsed is the bytes of live allocations made with Alloc.
	MemoryUsed int64 `json:"memory_used"`
	// LinkBytesPerSec is the modelled host link bandwidth per direction; 0 means unlimited.
	LinkBytesPerSec float64 `json:"link_bytes_per_sec"`
	// LinkLatency is the modelled fixed cost of one host copy operation.
	LinkLatency time.Duration `json:"link_latency_ns"`
	// CopyThreads is the most goroutines one large copy operation is split across.
	CopyThreads int `json:"copy_threads"`
}

// Info describes the device and its current memory use.
func (d *Device) Info() DeviceInfo {
	d.mu.Lock()
	used := d.used
	d.mu.Unlock()
	return DeviceInfo{
		Name: d.opts.Name, Kind: "sim", MemoryBytes: d.opts.MemoryBytes, MemoryUsed: used,
		LinkBytesPerSec: d.opts.LinkBytesPerSec, LinkLatency: d.opts.LinkLatency, CopyThreads: d.opts.CopyThreads,
	}
}

// Memory is one device allocation. Its bytes are reached only through spans (Span) and the
// copy operations of a stream, always bounds-checked; it is never a raw pointer.
type Memory struct {
	dev     *Device
	id      int64
	label   string
	size    int64
	adopted bool

	mu    sync.RWMutex
	data  []byte // nil once freed
	freed bool
}

// Label is the name given at Alloc, used in error messages.
func (m *Memory) Label() string { return m.label }

// Size is the allocation's length in bytes.
func (m *Memory) Size() int64 { return m.size }

// String names the allocation for messages: "memory "label" (#id, N bytes)".
func (m *Memory) String() string {
	if m == nil {
		return "memory <nil>"
	}
	return fmt.Sprintf("memory %q (#%d, %d bytes)", m.label, m.id, m.size)
}

// HostBytes returns the allocation's bytes as host memory, which the simulated device's memory
// is, so that host-side code (tests, CPU kernels standing in for device kernels) can read and
// write it. ok is false once the allocation is freed. Accesses race with stream operations on
// the same bytes unless ordered by Synchronize or an event.
func (m *Memory) HostBytes() (b []byte, ok bool) {
	if m == nil {
		return nil, false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.freed {
		return nil, false
	}
	return m.data, true
}

// bytesFor returns the backing bytes for an operation on dev, or an error naming the memory.
func (m *Memory) bytesFor(dev *Device) ([]byte, error) {
	if m == nil {
		return nil, errorf(ErrInvalid, "nil memory")
	}
	if m.dev != dev {
		return nil, errorf(ErrInvalid, "%v belongs to device %q, not %q", m, m.dev.opts.Name, dev.opts.Name)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.freed {
		return nil, errorf(ErrInvalid, "%v was freed", m)
	}
	return m.data, nil
}

// Span is a bounds-checked range of a device allocation: what device addresses are in this
// API. The zero Span is invalid.
type Span struct {
	mem *Memory
	off int64
	n   int64
}

// Span returns the range [off, off+n) of m, or an error wrapping ErrOutOfRange that names the
// allocation and the range when it does not lie inside m.
func (m *Memory) Span(off, n int64) (Span, error) {
	if m == nil {
		return Span{}, errorf(ErrInvalid, "span of nil memory")
	}
	if err := checkRange(m, off, n); err != nil {
		return Span{}, err
	}
	return Span{mem: m, off: off, n: n}, nil
}

// Whole is the span of all of m.
func (m *Memory) Whole() Span { return Span{mem: m, off: 0, n: m.size} }

// Memory is the allocation the span lies in.
func (s Span) Memory() *Memory { return s.mem }

// Offset is the span's start within its allocation.
func (s Span) Offset() int64 { return s.off }

// Len is the span's length in bytes.
func (s Span) Len() int64 { return s.n }

// String names the span for messages.
func (s Span) String() string {
	return fmt.Sprintf("[%d, %d) of %v", s.off, s.off+s.n, s.mem)
}

func checkRange(m *Memory, off, n int64) error {
	if off < 0 || n < 0 || off > m.size || n > m.size-off {
		return errorf(ErrOutOfRange, "range [%d, %d) outside %v", off, off+n, m)
	}
	return nil
}

// resolve returns the span's bytes for an operation on dev, re-checking its bounds (a Span
// built by hand, or whose memory was freed, is refused).
func (s Span) resolve(dev *Device) ([]byte, error) {
	data, err := s.mem.bytesFor(dev)
	if err != nil {
		return nil, err
	}
	if err := checkRange(s.mem, s.off, s.n); err != nil {
		return nil, err
	}
	return data[s.off : s.off+s.n : s.off+s.n], nil
}

// Alloc allocates size bytes of device memory, zeroed, aligned to 4096. label names it in
// errors. Sizes outside [1, MaxAllocBytes], or beyond the device's remaining capacity, are
// refused with ErrInvalid before anything is allocated.
func (d *Device) Alloc(label string, size int64) (*Memory, error) {
	if size < 1 || size > MaxAllocBytes {
		return nil, errorf(ErrInvalid, "alloc %q: size %d outside [1, %d]", label, size, int64(MaxAllocBytes))
	}
	d.mu.Lock()
	if d.isDown {
		d.mu.Unlock()
		return nil, errorf(ErrNoDevice, "alloc %q: device %q closed", label, d.opts.Name)
	}
	if d.opts.MemoryBytes > 0 && size > d.opts.MemoryBytes-d.used {
		used := d.used
		d.mu.Unlock()
		return nil, errorf(ErrInvalid, "alloc %q: %d bytes exceed device %q's free memory (%d of %d used)", label, size, d.opts.Name, used, d.opts.MemoryBytes)
	}
	d.used += size
	d.mu.Unlock()
	data, err := allocAligned(size)
	if err != nil {
		d.mu.Lock()
		d.used -= size
		d.mu.Unlock()
		return nil, fmt.Errorf("alloc %q: %w", label, err)
	}
	return &Memory{dev: d, id: d.nextID.Add(1), label: label, size: size, data: data}, nil
}

// Adopt makes existing host memory b an allocation of the simulated device without copying,
// so a caller that already holds its KV cache in host memory (a CPU model, a buffer shared
// through the C ABI) can register it. b stays the caller's: Free only detaches it, and the
// caller must keep it valid until then.
func (d *Device) Adopt(label string, b []byte) (*Memory, error) {
	if len(b) == 0 {
		return nil, errorf(ErrInvalid, "adopt %q: empty buffer", label)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isDown {
		return nil, errorf(ErrNoDevice, "adopt %q: device %q closed", label, d.opts.Name)
	}
	return &Memory{dev: d, id: d.nextID.Add(1), label: label, size: int64(len(b)), data: b[:len(b):len(b)], adopted: true}, nil
}

// Free releases m. Operations already queued on a stream complete on the old bytes; operations
// enqueued afterwards, and spans resolved afterwards, fail with ErrInvalid. Freeing twice, or
// memory of another device, is an ErrInvalid error.
func (d *Device) Free(m *Memory) error {
	if m == nil || m.dev != d {
		return errorf(ErrInvalid, "free: %v is not an allocation of device %q", m, d.opts.Name)
	}
	m.mu.Lock()
	if m.freed {
		m.mu.Unlock()
		return errorf(ErrInvalid, "free: %v freed twice", m)
	}
	m.freed = true
	m.data = nil
	m.mu.Unlock()
	if !m.adopted {
		d.mu.Lock()
		d.used -= m.size
		d.mu.Unlock()
	}
	return nil
}

// allocAligned returns size zeroed bytes whose start is aligned to 4096, or, from
// hugePageBytes up, to hugePageBytes with transparent huge pages advised for the whole pages
// (best effort): the page size a GPU maps its memory with, and the one that keeps a gather of
// runs scattered over a large cache from paying a page walk per run (docs/kernels.md). The
// memory is Go heap memory, so an operation still holding it after Free can never fault.
func allocAligned(size int64) (b []byte, err error) {
	align := int64(4096)
	if size >= hugePageBytes {
		align = hugePageBytes
	}
	defer func() {
		// make panics when the heap cannot grow; report it instead.
		if r := recover(); r != nil {
			b, err = nil, errorf(ErrInvalid, "cannot allocate %d bytes: %v", size, r)
		}
	}()
	raw := make([]byte, size+align)
	skip := int64(0)
	if rem := int64(addrOf(raw) % uintptr(align)); rem != 0 {
		skip = align - rem
	}
	b = raw[skip : skip+size : skip+size]
	if align == hugePageBytes {
		_ = adviseHugePages(b[:size&^(hugePageBytes-1)]) // best effort: 4 KiB pages otherwise
	}
	return b, nil
}

// Synchronize waits until every stream of the device has run all work enqueued before the
// call, and returns the first error any of them reported (clearing it, as Stream.Synchronize
// does).
func (d *Device) Synchronize() error {
	d.mu.Lock()
	if d.isDown {
		d.mu.Unlock()
		return errorf(ErrNoDevice, "device %q closed", d.opts.Name)
	}
	ss := make([]*Stream, 0, len(d.streams))
	for s := range d.streams {
		ss = append(ss, s)
	}
	d.mu.Unlock()
	var first error
	for _, s := range ss {
		if err := s.Synchronize(); err != nil && first == nil && !s.isClosed() {
			first = err
		}
	}
	return first
}

// Close stops the device: operations not yet started fail with ErrNoDevice (so every event
// and waiter is released), running ones finish, every stream's goroutine exits before Close
// returns, and later calls fail with ErrNoDevice. Closing twice is a no-op.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.isDown {
		d.mu.Unlock()
		return nil
	}
	d.isDown = true
	close(d.closed)
	ss := make([]*Stream, 0, len(d.streams))
	for s := range d.streams {
		ss = append(ss, s)
	}
	d.mu.Unlock()
	for _, s := range ss {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
		<-s.exited
	}
	return nil
}

func (d *Device) errClosed() error {
	return errorf(ErrNoDevice, "device %q closed", d.opts.Name)
}
