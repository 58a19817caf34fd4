//go:build linux

package devio_test

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/ucm-go/ucm/devio"
	"golang.org/x/sys/unix"
)

// resident counts the 4 KiB pages of b (page-aligned) that are in memory.
func resident(t *testing.T, b []byte) (in int) {
	t.Helper()
	vec := make([]byte, (len(b)+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	for _, v := range vec {
		in += int(v & 1)
	}
	return in
}

// TestPopulate: fresh memory is resident after Populate and still zero, and the bytes around a
// buffer that shares its first and last pages with other data are left as they were.
func TestPopulate(t *testing.T) {
	m, err := unix.Mmap(-1, 0, 4<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(m) }()
	// 4 KiB pages, whatever the machine's transparent huge page setting: a huge page would
	// make the page after the populated range resident too.
	if err := unix.Madvise(m, unix.MADV_NOHUGEPAGE); err != nil {
		t.Fatal(err)
	}
	if in := resident(t, m); in != 0 {
		t.Fatalf("%d pages of a fresh mapping already resident", in)
	}
	devio.Populate(m[:3<<20])
	if in := resident(t, m[:3<<20]); in != 3<<20/4096 {
		t.Fatalf("after Populate %d of %d pages resident", in, 3<<20/4096)
	}
	if in := resident(t, m[3<<20:]); in != 0 {
		t.Fatalf("Populate of the first 3 MiB made %d pages after them resident", in)
	}
	if !bytes.Equal(m[:3<<20], make([]byte, 3<<20)) {
		t.Fatal("Populate changed the bytes of fresh memory")
	}

	// A buffer in the middle of other data: its end pages are shared.
	page := m[3<<20:]
	for i := range page {
		page[i] = byte(i*7 + 1)
	}
	want := append([]byte(nil), page...)
	b := page[100 : 100+2*4096+50]
	clear(b) // fresh memory is zero
	copy(want[100:], b)
	devio.Populate(b)
	if !bytes.Equal(page, want) {
		t.Fatal("Populate changed bytes outside its buffer or inside it")
	}
	devio.Populate(nil) // nothing to do
}
