package devio

import (
	"math/bits"
	"sync"
	"unsafe"
)

const (
	minClassShift = 12 // 4 KiB
	maxClassShift = 30 // 1 GiB
	numClasses    = maxClassShift - minClassShift + 1
)

// hostClassShift: buffers of more than 1 MiB are served from huge-page host
// memory (HostMemory), one mapping per buffer, kept while idle up to
// maxIdleHostBytes: a whole-block record is then one
// DMA segment per 2 MiB and is not faulted in again on every use (4 KiB heap
// pages first touched by concurrent copies are scattered: a 2 MiB write from
// them is split into several device requests; see HostMemory). Their sizes are
// multiples of HugePageSize, not powers of two: a 5 MiB payload takes 6 MiB,
// not 8.
const (
	hostClassShift   = 21
	maxIdleHostBytes = 512 << 20
)

// BufferPool recycles DefaultAlignment-aligned buffers in size classes up to
// 1 GiB: powers of two from 4 KiB to 1 MiB, multiples of 2 MiB (HugePageSize)
// above. It is safe for concurrent use; the zero value is not usable, create
// one with NewBufferPool.
//
// A buffer handed to the kernel (through Backend.Submit) must only be Put
// after its completion is reaped, i.e. after Submit has returned; putting it
// earlier lets another goroutine reuse memory the kernel may still be writing.
// Classes below 2 MiB are Go heap memory on sync.Pool: idle buffers may be
// released at any garbage collection. Larger classes are host memory in huge
// pages (Go heap memory where it cannot be mapped): up to 512
// MiB of idle ones are kept for reuse, the rest unmapped when Put; Close
// unmaps the idle ones, and a buffer Put after Close is unmapped at once. A
// buffer must not be used after it is Put.
type BufferPool struct {
	classes [numClasses]sync.Pool

	mu        sync.Mutex
	mapped    map[uintptr]*HostMemory // host buffers handed out or idle, by address
	idle      map[int][][]byte        // idle host buffers, by size
	idleBytes int64
	closed    bool
}

// NewBufferPool returns an empty BufferPool.
func NewBufferPool() *BufferPool {
	return &BufferPool{mapped: make(map[uintptr]*HostMemory), idle: make(map[int][][]byte)}
}

// classFor returns the class index for a buffer of n bytes, or -1 when n
// exceeds the largest class.
func classFor(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	if n > 1<<maxClassShift {
		return -1
	}
	shift := bits.Len(uint(n - 1))
	return shift - minClassShift
}

// Get returns a DefaultAlignment-aligned slice of length n whose capacity is
// n's size class: the next power of two >= max(n, 4096) up to 1 MiB, n
// rounded up to a multiple of HugePageSize above. The contents of a
// recycled buffer are NOT zeroed: callers must overwrite or clear what they
// use. Requests above 1 GiB are served by AlignedBuffer and are not pooled.
// Get panics if n is negative.
func (p *BufferPool) Get(n int) []byte {
	if n < 0 {
		panic("devio: BufferPool.Get with negative size")
	}
	c := classFor(n)
	if c < 0 {
		return AlignedBuffer(n)
	}
	if c+minClassShift >= hostClassShift {
		return p.getHost(n)
	}
	if v := p.classes[c].Get(); v != nil {
		b := *(v.(*[]byte))
		return b[:n]
	}
	size := 1 << (c + minClassShift)
	b := AlignedBuffer(size)
	return b[:n:size]
}

// Put returns b to the pool for reuse by Get. Slices whose capacity is not
// exactly a size class, or whose backing array is not aligned (i.e. slices
// not obtained from Get, or resliced from the front), are silently dropped.
// b must not be used after Put; see the type comment for buffers handed to the
// kernel.
func (p *BufferPool) Put(b []byte) {
	size := cap(b)
	if size < 1<<minClassShift || size > 1<<maxClassShift {
		return
	}
	b = b[:size]
	if uintptr(unsafe.Pointer(&b[0]))%DefaultAlignment != 0 {
		return
	}
	if size >= 1<<hostClassShift && p.putHost(b) {
		return
	}
	if size&(size-1) != 0 {
		return // not a heap class: a heap stand-in for a host buffer, or foreign
	}
	p.classes[bits.Len(uint(size))-1-minClassShift].Put(&b)
}

// hostSize is the capacity of a host buffer for n bytes: n rounded up to a
// multiple of HugePageSize.
func hostSize(n int) int { return (n + HugePageSize - 1) / HugePageSize * HugePageSize }

// getHost returns an idle host buffer of n's size, or maps a new one (a heap
// buffer if mapping fails), sliced to n bytes.
func (p *BufferPool) getHost(n int) []byte {
	size := hostSize(n)
	p.mu.Lock()
	if k := len(p.idle[size]); k > 0 {
		b := p.idle[size][k-1]
		p.idle[size][k-1] = nil
		p.idle[size] = p.idle[size][:k-1]
		p.idleBytes -= int64(cap(b))
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	m, bufs, err := newHostBuffers(1, size, false)
	if err != nil {
		b := AlignedBuffer(size)
		return b[:n:size]
	}
	b := bufs[0]
	p.mu.Lock()
	p.mapped[uintptr(unsafe.Pointer(&b[0]))] = m
	p.mu.Unlock()
	return b[:n]
}

// putHost takes back b (full capacity) if it is one of the pool's host
// buffers: kept idle, or unmapped when the pool is closed or holds enough idle
// memory. It reports false for a heap buffer.
func (p *BufferPool) putHost(b []byte) bool {
	addr := uintptr(unsafe.Pointer(&b[0]))
	p.mu.Lock()
	m, ok := p.mapped[addr]
	if !ok {
		p.mu.Unlock()
		return false
	}
	if p.closed || len(b)%HugePageSize != 0 || p.idleBytes+int64(len(b)) > maxIdleHostBytes {
		// (A capacity cut below the mapping's by the caller matches no size Get asks for.)
		delete(p.mapped, addr)
		p.mu.Unlock()
		_ = m.Close()
		return true
	}
	p.idle[len(b)] = append(p.idle[len(b)], b)
	p.idleBytes += int64(len(b))
	p.mu.Unlock()
	return true
}

// Close unmaps the idle host buffers; buffers still in use are unmapped when
// they are Put. Get keeps working (new host buffers are mapped as needed).
// Close is idempotent.
func (p *BufferPool) Close() {
	p.mu.Lock()
	p.closed = true
	var release []*HostMemory
	for size, bufs := range p.idle {
		for _, b := range bufs {
			addr := uintptr(unsafe.Pointer(&b[0]))
			release = append(release, p.mapped[addr])
			delete(p.mapped, addr)
		}
		delete(p.idle, size)
	}
	p.idleBytes = 0
	p.mu.Unlock()
	for _, m := range release {
		_ = m.Close()
	}
}
