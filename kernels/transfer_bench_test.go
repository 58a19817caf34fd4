package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

// The benchmark model: 32 layers of vLLM flash-attention caches, 8 KV heads × 128 dims, fp16,
// 256 paged blocks (512 MiB of device memory at 16 tokens per block, 4 GiB at 128).
const (
	benchLayers = 32
	benchBlocks = 256
	benchMoved  = 64 // blocks one gather or scatter moves, in random order
)

type benchCache struct {
	dev    *Device
	p      *PagedKV
	mem    *Memory
	blocks []int
}

func newBenchCache(b *testing.B, blockSize, threads int) *benchCache {
	b.Helper()
	dev, err := NewSimDevice(SimOptions{CopyThreads: threads})
	if err != nil {
		b.Fatal(err)
	}
	spec := CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: benchBlocks, BlockSize: blockSize, KVHeads: 8, HeadDim: 128}
	size := mustRegion(b, spec)
	mem := mustAlloc(b, dev, "kv", size*benchLayers)
	buf := memBytes(mem)
	for i := 0; i < len(buf); i += 4096 { // touch every page: no zero-page reads
		buf[i] = byte(i >> 12)
	}
	regs := make([]LayerRegion, benchLayers)
	for l := range regs {
		regs[l] = LayerRegion{Mem: mem, Offset: int64(l) * size}
	}
	p, err := Register(spec, regs)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(blockSize), 7))
	return &benchCache{dev: dev, p: p, mem: mem, blocks: rng.Perm(benchBlocks)[:benchMoved]}
}

// BenchmarkTransfer measures gathers and scatters against two baselines moving the same number
// of bytes between the same staging buffer and equally cold device memory, in one contiguous
// piece (the physical limit: nothing moves those bytes faster than one copy of that many bytes):
//
//   - dev-memcpy: the device's own contiguous copy (Stream.CopyD2H / CopyH2D of one span) on
//     the same stream, so it pays the same stream round trip, uses the same CopyThreads and the
//     same copy routine (copyStream from 1 MiB): the like-for-like baseline, which differs from
//     the transfer only in being one piece;
//   - memcpy: Go's copy (runtime·memmove), single-threaded, on the benchmark's goroutine (no
//     stream): what a plain Go program moving the same bytes gets.
//
// The three are interleaved in every iteration, in rotating order, so that all see the same
// machine, and each is timed per iteration: xfer-GB/s, dev-memcpy-GB/s and memcpy-GB/s are
// from the median times, and ratio (xfer ÷ dev-memcpy) and ratio-inline (xfer ÷ memcpy) are
// ratios of median throughputs. Medians, because on a shared machine a few iterations of any of
// the three get descheduled for milliseconds, which would dominate sums. ns/op covers all three.
//
//	go test -run '^$' -bench 'BenchmarkTransfer' -benchtime 20x ./kernels/
func BenchmarkTransfer(b *testing.B) {
	for _, bs := range []int{16, 128} {
		for _, threads := range []int{1, 2} {
			var c *benchCache
			for _, mode := range []string{"layer", "blocks"} {
				for _, op := range []string{"gather", "scatter"} {
					b.Run(fmt.Sprintf("tokens=%d/threads=%d/%s/%s", bs, threads, mode, op), func(b *testing.B) {
						if c == nil {
							c = newBenchCache(b, bs, threads)
						}
						benchTransfer(b, c, mode, op)
					})
				}
			}
			if c != nil {
				_ = c.dev.Close() // free the caches before the next size
				c = nil
				runtime.GC()
			}
		}
	}
}

func benchTransfer(b *testing.B, c *benchCache, mode, op string) {
	rec := c.p.Record()
	n := int64(len(c.blocks)) * rec.BlockBytes()
	if mode == "layer" {
		n = int64(len(c.blocks)) * rec.ShardBytes
	}
	st, err := NewStaging(n, StagingOptions{HugePages: true})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	host := st.Bytes()[:n]
	for i := range host {
		host[i] = byte(i)
	}
	s, err := c.dev.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// The memcpy moves the same bytes between the same staging buffer and the region of device
	// memory the transfer of that iteration reads or writes (the layer's tensor, or the part of
	// the caches its turn falls on), so neither side runs from a warmer cache.
	all := memBytes(c.mem)
	region := func(i int) []byte {
		var off int64
		if mode == "layer" {
			off = c.p.layers[(i+benchLayers/2)%benchLayers].off // a layer as cold as the transfer's
		} else {
			off = int64(i) % (int64(len(all)) / n) * n
		}
		return all[off : off+n]
	}
	run := func(layer int) {
		var err error
		switch {
		case mode == "layer" && op == "gather":
			err = c.p.GatherLayer(s, layer, c.blocks, host)
		case mode == "layer":
			err = c.p.ScatterLayer(s, layer, c.blocks, host)
		case op == "gather":
			err = c.p.GatherBlocks(s, c.blocks, host)
		default:
			err = c.p.ScatterBlocks(s, c.blocks, host)
		}
		if err == nil {
			err = s.Synchronize()
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	span := func(i int) Span {
		dev := region(i)
		off := int64(addrOf(dev) - addrOf(all))
		sp, err := c.mem.Span(off, int64(len(dev)))
		if err != nil {
			b.Fatal(err)
		}
		return sp
	}
	devMemcpy := func(i int) {
		var err error
		if op == "gather" {
			err = s.CopyD2H(host, span(i))
		} else {
			err = s.CopyH2D(span(i), host)
		}
		if err == nil {
			err = s.Synchronize()
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	memcpy := func(i int) {
		if dev := region(i); op == "gather" {
			copy(host, dev)
		} else {
			copy(dev, host)
		}
	}
	run(0) // warm
	devMemcpy(0)
	b.SetBytes(n)
	b.ResetTimer()
	var took [3][]time.Duration // transfer, dev-memcpy, memcpy
	for i := 0; i < b.N; i++ {
		// Rotate which goes first, so that none always follows another's cache footprint.
		for k := 0; k < 3; k++ {
			w := (i + k) % 3
			t0 := time.Now()
			switch w {
			case 0:
				run(i % benchLayers)
			case 1:
				devMemcpy(i)
			case 2:
				memcpy(i)
			}
			took[w] = append(took[w], time.Since(t0))
		}
	}
	b.StopTimer()
	var med [3]float64
	for w := range took {
		slices.Sort(took[w])
		med[w] = took[w][len(took[w])/2].Seconds()
	}
	b.ReportMetric(float64(n)/med[0]/1e9, "xfer-GB/s")
	b.ReportMetric(float64(n)/med[1]/1e9, "dev-memcpy-GB/s")
	b.ReportMetric(float64(n)/med[2]/1e9, "memcpy-GB/s")
	b.ReportMetric(med[1]/med[0], "ratio")
	b.ReportMetric(med[2]/med[0], "ratio-inline")
}
