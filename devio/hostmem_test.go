package devio_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
)

// TestHostBuffers: the buffers are zeroed, as long as asked, aligned (on a huge page when a
// buffer is that large, on Linux), disjoint, usable for direct I/O, and Close is idempotent.
func TestHostBuffers(t *testing.T) {
	for _, size := range []int{4096, 64 << 10, devio.HugePageSize, devio.HugePageSize + 4096} {
		m, bufs, err := devio.NewHostBuffers(3, size)
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range bufs {
			if len(b) != size || cap(b) != size {
				t.Fatalf("size %d: buffer %d len %d cap %d", size, i, len(b), cap(b))
			}
			if !devio.IsAligned(b) {
				t.Fatalf("size %d: buffer %d misaligned at %#x", size, i, addr(b))
			}
			if runtime.GOOS == "linux" && size >= devio.HugePageSize && addr(b)%devio.HugePageSize != 0 {
				t.Fatalf("size %d: buffer %d not on a huge page boundary: %#x", size, i, addr(b))
			}
			if bytes.ContainsFunc(b, func(r rune) bool { return r != 0 }) {
				t.Fatalf("size %d: buffer %d not zeroed", size, i)
			}
		}
		for i, b := range bufs {
			for j := range b {
				b[j] = byte(i + 1)
			}
		}
		for i, b := range bufs {
			if b[0] != byte(i+1) || b[len(b)-1] != byte(i+1) {
				t.Fatalf("size %d: buffers overlap", size)
			}
		}
		// A direct write from a host buffer and a read back into another.
		dir := t.TempDir()
		mode := devio.DirectOff
		if ok, _ := devio.ProbeDirect(vfs.Default, dir); ok {
			mode = devio.DirectOn
		}
		f, err := devio.OpenFile(vfs.Default, filepath.Join(dir, "f"), true, mode)
		if err != nil {
			t.Fatal(err)
		}
		be, err := devio.NewBackend(devio.EnginePsync, 4, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := be.Submit([]devio.Op{{File: f, Buf: bufs[0], Write: true}}); err != nil {
			t.Fatal(err)
		}
		if err := be.Submit([]devio.Op{{File: f, Buf: bufs[1]}}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bufs[0], bufs[1]) {
			t.Fatalf("size %d: read back differs", size)
		}
		_ = be.Close()
		_ = f.Close()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
}

func TestHostBuffersBadSizes(t *testing.T) {
	for _, c := range [][2]int{{-1, 4096}, {1, -1}, {1 << 40, 1 << 20}} {
		if _, _, err := devio.NewHostBuffers(c[0], c[1]); !errors.Is(err, devio.ErrHostMemory) {
			t.Errorf("NewHostBuffers(%d, %d): %v, want ErrHostMemory", c[0], c[1], err)
		}
	}
	m, bufs, err := devio.NewHostBuffers(0, 4096)
	if err != nil || len(bufs) != 0 || m.Close() != nil {
		t.Errorf("no buffers: %v %v", bufs, err)
	}
}

// TestBufferPoolHostClasses: buffers of 2 MiB and more come from host memory, are reused
// while idle, are released by Close (and when Put after it), and a heap buffer of such a class
// Put into the pool is never unmapped.
func TestBufferPoolHostClasses(t *testing.T) {
	p := devio.NewBufferPool()
	b := p.Get(3 << 20)
	if len(b) != 3<<20 || cap(b) != 4<<20 || !devio.IsAligned(b[:4<<20]) {
		t.Fatalf("Get(3 MiB): len %d cap %d at %#x", len(b), cap(b), addr(b))
	}
	if runtime.GOOS == "linux" && addr(b)%devio.HugePageSize != 0 {
		t.Fatalf("host buffer not on a huge page boundary: %#x", addr(b))
	}
	b[len(b)-1] = 7
	at := addr(b)
	p.Put(b)
	if runtime.GOOS == "linux" && p.IdleHostBytes() != 4<<20 {
		t.Fatalf("idle host bytes %d after Put, want 4 MiB", p.IdleHostBytes())
	}
	b2 := p.Get(4 << 20)
	if runtime.GOOS == "linux" && (addr(b2) != at || b2[3<<20-1] != 7) {
		t.Fatalf("the idle buffer was not reused")
	}
	// Above 2 MiB the classes are multiples of 2 MiB, not powers of two: a 5 MiB payload
	// takes 6 MiB (it took 8), and the buffer is reused for the same class.
	five := p.Get(5 << 20)
	if len(five) != 5<<20 || cap(five) != 6<<20 || !devio.IsAligned(five[:6<<20]) {
		t.Fatalf("Get(5 MiB): len %d cap %d, want cap 6 MiB", len(five), cap(five))
	}
	five[len(five)-1] = 9
	at5 := addr(five)
	p.Put(five)
	if six := p.Get(6 << 20); runtime.GOOS == "linux" && (addr(six) != at5 || six[5<<20-1] != 9) {
		t.Fatalf("the idle 6 MiB buffer was not reused")
	} else {
		p.Put(six)
	}
	// A heap buffer of a host class goes to the heap classes, never to munmap.
	heap := devio.AlignedBuffer(2 << 20)
	heap = heap[: 2<<20 : 2<<20]
	p.Put(heap)
	p.Close()
	p.Close()
	if p.IdleHostBytes() != 0 {
		t.Fatalf("idle host bytes %d after Close", p.IdleHostBytes())
	}
	heap[0], heap[len(heap)-1] = 1, 1 // still mapped: it was never the pool's
	b2[0] = 1                         // in use during Close: still mapped
	p.Put(b2)                         // unmapped now
	if p.IdleHostBytes() != 0 {
		t.Fatalf("a buffer Put after Close is kept idle")
	}
	b3 := p.Get(2 << 20) // Get works after Close
	b3[0] = 1
	p.Put(b3)
}

// The pool keeps at most 512 MiB of idle host buffers and unmaps the rest when they are Put;
// concurrent Get/Put/Close is safe (run under -race).
func TestBufferPoolHostIdleBoundAndConcurrency(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("host buffers are heap buffers here")
	}
	p := devio.NewBufferPool()
	const n = 130 // × 4 MiB = 520 MiB, more than the idle bound
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = p.Get(4 << 20)
		bufs[i][0] = byte(i)
	}
	for _, b := range bufs {
		p.Put(b)
	}
	if got := p.IdleHostBytes(); got != 512<<20 {
		t.Fatalf("idle host bytes %d after putting %d × 4 MiB, want the 512 MiB bound", got, n)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				size := (2 << 20) << ((g + i) % 3) // 2, 4 or 8 MiB classes
				b := p.Get(size)
				b[0], b[len(b)-1] = byte(g), byte(i)
				if b[0] != byte(g) || b[len(b)-1] != byte(i) {
					t.Errorf("buffer shared between goroutines")
				}
				p.Put(b)
			}
		}(g)
	}
	wg.Wait()
	p.Close()
	if got := p.IdleHostBytes(); got != 0 {
		t.Fatalf("idle host bytes %d after Close", got)
	}
}
