package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
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

// BenchmarkTransfer measures gathers and scatters against a plain memcpy of the same number of
// bytes (one contiguous copy, single-threaded, between the same device memory and staging
// buffer), interleaved in every iteration so that both see the same machine: the reported
// xfer-GB/s, memcpy-GB/s and ratio (xfer ÷ memcpy) are what to compare; ns/op covers both.
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
	run(0) // warm
	b.SetBytes(n)
	b.ResetTimer()
	var tx, tm time.Duration
	memcpy := func(i int) {
		if dev := region(i); op == "gather" {
			copy(host, dev)
		} else {
			copy(dev, host)
		}
	}
	for i := 0; i < b.N; i++ {
		// Alternate which goes first, so neither always follows the other's cache footprint.
		t0 := time.Now()
		if i%2 == 0 {
			run(i % benchLayers)
		} else {
			memcpy(i)
		}
		t1 := time.Now()
		if i%2 == 0 {
			memcpy(i)
		} else {
			run(i % benchLayers)
		}
		t2 := time.Now()
		if i%2 == 0 {
			tx, tm = tx+t1.Sub(t0), tm+t2.Sub(t1)
		} else {
			tm, tx = tm+t1.Sub(t0), tx+t2.Sub(t1)
		}
	}
	b.StopTimer()
	gbs := func(d time.Duration) float64 { return float64(n) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbs(tx), "xfer-GB/s")
	b.ReportMetric(gbs(tm), "memcpy-GB/s")
	b.ReportMetric(tm.Seconds()/tx.Seconds(), "ratio")
}
