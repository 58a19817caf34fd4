package devio

import (
	"errors"
	"fmt"
)

// HugePageSize is the size of a transparent huge page on the platforms UCM-Go runs on
// (x86-64 and arm64 with 4 KiB base pages).
const HugePageSize = 2 << 20

// HostMemory is a region of memory outside the Go heap for buffers that are handed to the
// device again and again: a connector's KV host buffers, the bench's payloads. On Linux it is
// an anonymous mapping advised for transparent huge pages (MADV_HUGEPAGE), so each 2 MiB of a
// buffer is one physically contiguous page and a 2 MiB O_DIRECT write reaches the device as one
// DMA segment. Go heap buffers are made of 4 KiB pages placed wherever the first write to each
// page faulted it in; buffers first filled by concurrent goroutines end up scattered, and a
// 2 MiB write from them is split into several device requests (on the virtio disk here:
// 0.60–0.71 GB/s from such buffers against 1.52–2.08 GB/s from huge pages; docs/performance.md).
// Elsewhere, or when mapping fails, the buffers come from AlignedBuffer.
//
// The memory is released by Close, not by the garbage collector: no slice of it may be used
// after Close.
type HostMemory struct {
	mapping []byte // the whole mapping, for munmap; nil for heap memory
	huge    bool
	closed  bool
}

// ErrHostMemory is wrapped by NewHostBuffers' error when the memory cannot be mapped.
var ErrHostMemory = errors.New("devio: host memory")

// NewHostBuffers allocates count zeroed, resident buffers of size bytes in one HostMemory region
// (every page is faulted in before it returns, as a connector's pinned buffers are). Each
// buffer starts on a HugePageSize boundary when size is at least HugePageSize, else on a
// DefaultAlignment boundary, and is DefaultAlignment-aligned, so it may be used for direct I/O
// when size is a multiple of DefaultAlignment.
func NewHostBuffers(count, size int) (*HostMemory, [][]byte, error) {
	return newHostBuffers(count, size, true)
}

// newHostBuffers is NewHostBuffers, leaving the pages to be faulted in on first use unless
// resident: the buffer pool's buffers are often larger than what is written into them (a
// 5 MiB payload in a 6 MiB class), and populating the rest would be wasted work.
func newHostBuffers(count, size int, resident bool) (*HostMemory, [][]byte, error) {
	if count < 0 || size < 0 {
		return nil, nil, fmt.Errorf("%w: %d buffers of %d bytes", ErrHostMemory, count, size)
	}
	stride := int(AlignUp(int64(size)))
	if size >= HugePageSize {
		stride = (size + HugePageSize - 1) / HugePageSize * HugePageSize
	}
	if count == 0 || stride == 0 {
		return &HostMemory{}, make([][]byte, count), nil
	}
	if stride > 0 && count > (1<<46)/stride {
		return nil, nil, fmt.Errorf("%w: %d buffers of %d bytes is too much", ErrHostMemory, count, size)
	}
	m := &HostMemory{}
	region, err := m.mapRegion(count * stride)
	if err != nil {
		return nil, nil, err
	}
	if resident {
		Populate(region)
	}
	bufs := make([][]byte, count)
	for i := range bufs {
		bufs[i] = region[i*stride : i*stride+size : i*stride+size]
	}
	return m, bufs, nil
}

// Populate makes every page of b resident, so that the first writes into b do not fault them
// in one by one. b must be fresh memory (zeroed, not yet written or shared with another
// goroutine): a buffer just returned by make or mapped. On Linux (5.14 and later) it is one
// madvise(MADV_POPULATE_WRITE), which faults the pages in inside the kernel and leaves their
// bytes as they are; elsewhere, or when the kernel refuses, it writes a zero to each 4 KiB page.
// On the development VMs a fault taken by a write costs more than copying the page: the memory
// tier's first fill of fresh memory ran at 1.86–1.90 GB/s, populated first at 2.78–2.92
// (BenchmarkMemCacheFillFresh; docs/tiers.md, "Memory tier"). With huge pages, a fault
// allocates and clears 2 MiB, which made a first 2 GiB O_DIRECT read pass into unpopulated
// buffers 0.63 of the speed of the next ones (5.3 against 8.3 GB/s).
func Populate(b []byte) {
	if len(b) == 0 || populatePages(b) {
		return
	}
	for off := 0; off < len(b); off += DefaultAlignment {
		b[off] = 0
	}
}

// Huge reports whether the kernel accepted the huge-page advice for the region.
func (m *HostMemory) Huge() bool { return m.huge }

// Close releases the region. It is idempotent.
func (m *HostMemory) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	if m.mapping == nil {
		return nil
	}
	mapping := m.mapping
	m.mapping = nil
	return unmap(mapping)
}
