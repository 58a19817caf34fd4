package crc32c

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"testing"
)

func reference(crc uint32, p []byte) uint32 { return crc32.Update(crc, table, p) }

// Every length around the thresholds and the chunk size, at every alignment mod 8, from
// zero and from a running CRC, equals hash/crc32's CRC32C.
func TestMatchesHashCRC32(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 3*accelChunkBytes+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	lengths := []int{0, 1, 7, 8, 63, 64, 1023, AccelMinBytes - 1, AccelMinBytes, AccelMinBytes + 1,
		4096, 16 << 10, 64<<10 + 5, accelChunkBytes - 1, accelChunkBytes, accelChunkBytes + 1,
		2*accelChunkBytes + 13, 3 * accelChunkBytes}
	for _, n := range lengths {
		for align := 0; align < 8; align++ {
			p := buf[align : align+n]
			if got, want := Checksum(p), reference(0, p); got != want {
				t.Fatalf("Checksum of %d bytes at offset %d: %08x, hash/crc32 %08x (%s)", n, align, got, want, Implementation())
			}
			seed := r.Uint32()
			if got, want := Update(seed, p), reference(seed, p); got != want {
				t.Fatalf("Update(%08x) of %d bytes at offset %d: %08x, hash/crc32 %08x (%s)", seed, n, align, got, want, Implementation())
			}
		}
	}
}

// A checksum computed piece by piece equals the checksum of the whole, wherever the pieces
// split, across the accelerated threshold.
func TestUpdateComposes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := make([]byte, 700<<10)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	whole := Checksum(p)
	for range 200 {
		var crc uint32
		rest := p
		for len(rest) > 0 {
			n := min(len(rest), 1+r.IntN(2*AccelMinBytes+r.IntN(300<<10)))
			crc = Update(crc, rest[:n])
			rest = rest[n:]
		}
		if crc != whole {
			t.Fatalf("piecewise %08x, whole %08x (%s)", crc, whole, Implementation())
		}
	}
}

// UCM_CRC32C names the implementation a test run expects (the Makefile sets it to what its
// build tags select), so a build that silently fell back to Go's code fails.
func TestImplementation(t *testing.T) {
	want := os.Getenv("UCM_CRC32C")
	if want == "" {
		t.Skipf("UCM_CRC32C unset; this build checksums with %q", Implementation())
	}
	if Implementation() != want {
		t.Fatalf("implementation %q, UCM_CRC32C wants %q", Implementation(), want)
	}
}

func FuzzMatchesHashCRC32(f *testing.F) {
	f.Add(uint32(0), []byte("123456789"))
	f.Add(uint32(0xffffffff), make([]byte, AccelMinBytes+3))
	f.Fuzz(func(t *testing.T, seed uint32, p []byte) {
		if got, want := Update(seed, p), reference(seed, p); got != want {
			t.Fatalf("Update(%08x) of %d bytes: %08x, hash/crc32 %08x", seed, len(p), got, want)
		}
		// The input repeated past AccelMinBytes, so that every input also reaches the
		// accelerated code, at the length and offset within a chunk the input gives.
		if len(p) > 0 {
			q := bytes.Repeat(p, 2+AccelMinBytes/len(p))
			q = q[int(seed%uint32(len(p))):]
			if got, want := Update(seed, q), reference(seed, q); got != want {
				t.Fatalf("Update(%08x) of %d bytes (input repeated): %08x, hash/crc32 %08x", seed, len(q), got, want)
			}
		}
	})
}

// BenchmarkChecksum measures Checksum against hash/crc32 on buffers in cache (one buffer
// checksummed over and over) and out of it (a 512 MiB region walked in 16 MiB steps).
func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{4 << 10, 16 << 10, 256 << 10, 16 << 20} {
		p := make([]byte, n)
		for _, impl := range []struct {
			name string
			f    func(uint32, []byte) uint32
		}{{Implementation(), Update}, {"hash-crc32", reference}} {
			b.Run(fmt.Sprintf("cached/%dKiB/%s", n>>10, impl.name), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					impl.f(0, p)
				}
			})
		}
	}
	const region, step = 512 << 20, 16 << 20
	big := make([]byte, region)
	for i := range big {
		big[i] = byte(i)
	}
	for _, impl := range []struct {
		name string
		f    func(uint32, []byte) uint32
	}{{Implementation(), Update}, {"hash-crc32", reference}} {
		b.Run("uncached/16MiB/"+impl.name, func(b *testing.B) {
			b.SetBytes(step)
			off := 0
			for b.Loop() {
				impl.f(0, big[off:off+step])
				off = (off + step) % region
			}
		})
	}
}

// The standard CRC-32C check value (docs/format.md), and the same bytes repeated past
// AccelMinBytes checksum alike through Checksum and through Update in two pieces.
func TestCheckValue(t *testing.T) {
	if got := Checksum([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("CRC32C(\"123456789\") = %08x, want e3069283", got)
	}
	long := bytes.Repeat([]byte("123456789"), 1000)
	if got, want := Update(Checksum(long[:4500]), long[4500:]), Checksum(long); got != want {
		t.Fatalf("Update in two pieces %08x, whole %08x (%s)", got, want, Implementation())
	}
}
