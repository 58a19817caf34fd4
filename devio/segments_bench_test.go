package devio_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ucm-go/ucm/devio"
)

// BenchmarkSegments measures what the device charges for the memory layout of a request
// (docs/performance.md, "What the figures say"). Every request is 2 MiB of the file, issued by
// one of 8 concurrent submitters as 128 adjacent ops of 16 KiB (merged into one vectored
// request) or as one op. The 16 KiB pieces come from memory either scattered, 512 KiB apart in
// a huge-page region (a layer's shards of a request when each block has its own buffer), or
// contiguous (a layer's shards laid out slot after slot, as kernels.Pipeline stages them),
// which the kernel merges into one segment. Run with TMPDIR on the disk under test, e.g.
// TMPDIR=/var/tmp go test -tags uring -ldflags=-checklinkname=0 -run '^$' -bench Segments ./devio
func BenchmarkSegments(b *testing.B) {
	const (
		request    = 2 << 20
		piece      = 16 << 10
		submitters = 8
		span       = 256 << 20 // the file region the requests cycle over
	)
	layouts := []struct {
		name          string
		pieces, split int // ops per request; memory distance between pieces
	}{
		{"scattered-16KiB", request / piece, 512 << 10},
		{"contiguous-16KiB", request / piece, piece},
		{"one-2MiB", 1, request},
	}
	for _, dir := range []string{"write", "read"} {
		for _, lay := range layouts {
			b.Run(dir+"/"+lay.name, func(b *testing.B) {
				be := newURing(b, 64)
				defer be.Close()
				f := benchFile(b)
				mem, bufs, err := devio.NewHostBuffers(submitters, lay.pieces*lay.split)
				if err != nil {
					b.Fatal(err)
				}
				defer mem.Close()
				b.Logf("direct=%v huge=%v", f.Direct(), mem.Huge())
				ops := func(w int, off int64, write bool) []devio.Op {
					out := make([]devio.Op, lay.pieces)
					n := request / lay.pieces
					for k := range out {
						out[k] = devio.Op{File: f, Buf: bufs[w][k*lay.split : k*lay.split+n], Off: off + int64(k*n), Write: write}
					}
					return out
				}
				for off := int64(0); off < span; off += request { // the region exists, and reads read written blocks
					if err := be.Submit(ops(0, off, true)); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(request)
				submitConcurrently(b, be, submitters, func(w, _ int, k int64) []devio.Op {
					return ops(w, k*request%span, dir == "write")
				})
			})
		}
	}
}

// BenchmarkFootprint measures what the device charges for how much memory its transfers
// touch (docs/performance.md, "Method"): 8 submitters each issue one 2 MiB op at a time, so 8
// are in flight whatever the case, each submitter cycling through its own 2, 4, 16 or 64 MiB of
// huge-page memory (16 to 512 MiB in all). On the development VMs' virtio disk a small set
// reads faster (3.2 GB/s through 16 MiB, 2.3 through 128 MiB; a host copying into guest memory
// through its own caches would behave so), so a job with a small buffer set (fio's: one buffer
// per request in flight) can outrun one reading into a connector's gigabytes of KV buffers.
// Run as BenchmarkSegments.
func BenchmarkFootprint(b *testing.B) {
	const (
		request    = 2 << 20
		submitters = 8
		span       = 256 << 20 // the file region the requests cycle over
	)
	for _, dir := range []string{"write", "read"} {
		for _, per := range []int{1, 2, 8, 32} { // buffers per submitter
			b.Run(fmt.Sprintf("%s/footprint=%dMiB", dir, submitters*per*request>>20), func(b *testing.B) {
				be := newURing(b, 64)
				defer be.Close()
				f := benchFile(b)
				mem, bufs, err := devio.NewHostBuffers(submitters, per*request)
				if err != nil {
					b.Fatal(err)
				}
				defer mem.Close()
				b.Logf("direct=%v huge=%v", f.Direct(), mem.Huge())
				for off := int64(0); off < span; off += request { // the region exists, and reads read written blocks
					if err := be.Submit([]devio.Op{{File: f, Buf: bufs[0][:request], Off: off, Write: true}}); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(request)
				submitConcurrently(b, be, submitters, func(w, i int, k int64) []devio.Op {
					buf := bufs[w][i%per*request : (i%per+1)*request]
					return []devio.Op{{File: f, Buf: buf, Off: k * request % span, Write: dir == "write"}}
				})
			})
		}
	}
}

// submitConcurrently resets b's timer and submits b.N requests to be from submitters
// goroutines, each submitting one at a time: ops(w, i, k) is submitter w's i-th request, the
// k-th of the run.
func submitConcurrently(b *testing.B, be devio.Backend, submitters int, ops func(w, i int, k int64) []devio.Op) {
	b.ResetTimer()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for w := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				k := next.Add(1) - 1
				if k >= int64(b.N) {
					return
				}
				if err := be.Submit(ops(w, i, k)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
