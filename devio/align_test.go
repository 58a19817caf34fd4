package devio_test

import (
	"testing"
	"unsafe"

	"github.com/ucm-go/ucm/devio"
)

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func TestAlignUp(t *testing.T) {
	for _, c := range []struct{ in, want int64 }{
		{0, 0}, {1, 4096}, {4095, 4096}, {4096, 4096}, {4097, 8192}, {1 << 30, 1 << 30},
	} {
		if got := devio.AlignUp(c.in); got != c.want {
			t.Errorf("AlignUp(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestAlignedBufferAndIsAligned(t *testing.T) {
	for _, n := range []int{0, 1, 100, 4096, 5000, 8192, 1 << 20, 3<<20 + 17} {
		b := devio.AlignedBuffer(n)
		if len(b) != n || b == nil {
			t.Fatalf("AlignedBuffer(%d): len %d nil=%v", n, len(b), b == nil)
		}
		if n > 0 && addr(b)%devio.DefaultAlignment != 0 {
			t.Fatalf("AlignedBuffer(%d) misaligned at %#x", n, addr(b))
		}
		for i, c := range b {
			if c != 0 {
				t.Fatalf("AlignedBuffer(%d)[%d] = %d, want 0", n, i, c)
			}
		}
		if want := n%devio.DefaultAlignment == 0; devio.IsAligned(b) != want {
			t.Fatalf("IsAligned(AlignedBuffer(%d)) = %v, want %v", n, !want, want)
		}
	}
	b := devio.AlignedBuffer(3 * 4096)
	if !devio.IsAligned(b[4096:8192]) {
		t.Error("aligned sub-slice reported misaligned")
	}
	if devio.IsAligned(b[1:4097]) {
		t.Error("misaligned address reported aligned")
	}
	if devio.IsAligned(b[:4095]) {
		t.Error("misaligned length reported aligned")
	}
	if !devio.IsAligned(nil) || !devio.IsAligned(b[1:1]) {
		t.Error("empty slices must be aligned")
	}
}

func TestBufferPool(t *testing.T) {
	p := devio.NewBufferPool()
	for _, c := range []struct{ n, cap int }{
		{0, 4096}, {1, 4096}, {4096, 4096}, {4097, 8192}, {1 << 20, 1 << 20}, {1<<20 + 1, 2 << 20},
	} {
		b := p.Get(c.n)
		if len(b) != c.n || cap(b) != c.cap {
			t.Fatalf("Get(%d): len %d cap %d, want len %d cap %d", c.n, len(b), cap(b), c.n, c.cap)
		}
		if addr(b[:cap(b)])%devio.DefaultAlignment != 0 {
			t.Fatalf("Get(%d) misaligned", c.n)
		}
		p.Put(b)
	}

	// Reuse: sync.Pool may drop items (always under -race sometimes), so
	// retry; a recycled buffer keeps its address.
	reused := false
	for i := 0; i < 1000 && !reused; i++ {
		b := p.Get(10000)
		a := addr(b[:cap(b)])
		b[0] = 0xAB
		p.Put(b)
		c := p.Get(9000)
		reused = addr(c[:cap(c)]) == a
		if len(c) != 9000 || cap(c) != 16384 || addr(c[:1])%devio.DefaultAlignment != 0 {
			t.Fatalf("Get(9000): len %d cap %d", len(c), cap(c))
		}
		p.Put(c)
	}
	if !reused {
		t.Error("BufferPool never reused a buffer")
	}

	// Foreign slices are dropped, never returned by Get.
	foreign := make([]byte, 4096, 5000)
	misaligned := devio.AlignedBuffer(2 * 8192)[1 : 1+8192 : 1+8192]
	for range 100 {
		p.Put(foreign)
		p.Put(misaligned)
		for _, n := range []int{4096, 8192} {
			b := p.Get(n)
			if addr(b[:1]) == addr(foreign) || addr(b[:1]) == addr(misaligned) {
				t.Fatal("pool handed out a foreign buffer")
			}
		}
	}

	// Oversized requests are served, unpooled.
	if testing.Short() {
		return
	}
	big := p.Get(1<<30 + 1)
	if len(big) != 1<<30+1 || addr(big)%devio.DefaultAlignment != 0 {
		t.Fatal("oversized Get")
	}
	p.Put(big)
}

func TestBufferPoolConcurrent(t *testing.T) {
	p := devio.NewBufferPool()
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				n := (g*977 + i*131) % (70000)
				b := p.Get(n)
				for j := range b {
					b[j] = byte(g)
				}
				for j := range b {
					if b[j] != byte(g) {
						t.Errorf("buffer shared between goroutines")
						return
					}
				}
				p.Put(b)
			}
		}()
	}
	for range 8 {
		<-done
	}
}
