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

// BufferPool recycles DefaultAlignment-aligned buffers in power-of-two size
// classes from 4 KiB to 1 GiB. It is safe for concurrent use; the zero value
// is not usable, create one with NewBufferPool.
//
// A buffer handed to the kernel (through Backend.Submit) must only be Put
// after its completion is reaped, i.e. after Submit has returned; putting it
// earlier lets another goroutine reuse memory the kernel may still be writing.
// Idle buffers may be released at any garbage collection (the pool is built on
// sync.Pool), so the pool bounds allocation churn, not memory.
type BufferPool struct {
	classes [numClasses]sync.Pool
}

// NewBufferPool returns an empty BufferPool.
func NewBufferPool() *BufferPool {
	return &BufferPool{}
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
// n's size class (the next power of two >= max(n, 4096)). The contents of a
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
	if size < 1<<minClassShift || size > 1<<maxClassShift || size&(size-1) != 0 {
		return
	}
	b = b[:size]
	if uintptr(unsafe.Pointer(&b[0]))%DefaultAlignment != 0 {
		return
	}
	c := bits.Len(uint(size)) - 1 - minClassShift
	p.classes[c].Put(&b)
}
