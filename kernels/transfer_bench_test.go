package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/ucm-go/ucm/internal/memcopy"
)

// The benchmark model: 32 layers of vLLM flash-attention caches, 8 KV heads × 128 dims, fp16,
// 256 paged blocks (512 MiB of device memory at 16 tokens per block, 1 GiB at 32, 4 GiB at 128).
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

// newBenchCache registers the benchmark's caches in device memory (Alloc: 2 MiB pages, as a
// GPU's), or, with smallPages, in adopted Go heap memory of 4 KiB pages.
func newBenchCache(b *testing.B, blockSize, threads int, smallPages bool) *benchCache {
	b.Helper()
	dev, err := NewSimDevice(SimOptions{CopyThreads: threads})
	if err != nil {
		b.Fatal(err)
	}
	spec := CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: benchBlocks, BlockSize: blockSize, KVHeads: 8, HeadDim: 128}
	size := mustRegion(b, spec)
	var mem *Memory
	if smallPages {
		if mem, err = dev.Adopt("kv", make([]byte, size*benchLayers)); err != nil {
			b.Fatal(err)
		}
	} else {
		mem = mustAlloc(b, dev, "kv", size*benchLayers)
	}
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
//     same copy routine (memcopy.Stream from 1 MiB): the like-for-like baseline, which differs from
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
// The caches are device memory (2 MiB pages); the "4k-pages" cases hold them in memory of
// 4 KiB pages instead (one size, one thread), to show what the page size costs a gather.
//
//	go test -run '^$' -bench 'BenchmarkTransfer' -benchtime 20x ./kernels/
func BenchmarkTransfer(b *testing.B) {
	type shape struct {
		tokens, threads int
		small           bool
	}
	var shapes []shape
	for _, bs := range []int{16, 32, 128} {
		for _, threads := range []int{1, 2} {
			shapes = append(shapes, shape{bs, threads, false})
		}
	}
	shapes = append(shapes, shape{16, 1, true})
	for _, sh := range shapes {
		bs, threads := sh.tokens, sh.threads
		{
			pages := ""
			if sh.small {
				pages = "4k-pages/"
			}
			var c *benchCache
			for _, mode := range []string{"layer", "blocks"} {
				for _, op := range []string{"gather", "scatter"} {
					b.Run(fmt.Sprintf("tokens=%d/%sthreads=%d/%s/%s", bs, pages, threads, mode, op), func(b *testing.B) {
						if c == nil {
							c = newBenchCache(b, bs, threads, sh.small)
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
	// The baselines move the same bytes between the same staging buffer and a region of device
	// memory as cold as the transfer's: a layer's tensor (the transfer's layer is i, the memcpy's
	// i+11, the dev-memcpy's i+22, modulo 32, so that each layer was last read ten iterations
	// or more before), or a part of the caches of the operation's size. The two baselines never
	// share a region within an iteration: the second of them would find the source the first
	// had just read in the 32 MiB L3 (a 4 MiB layer gather's memcpy then ran at ~38 GB/s, twice
	// the rate of a cold one, and the ratios against it were halved).
	all := memBytes(c.mem)
	parts := int64(len(all)) / n
	region := func(i, k int) []byte { // k: 1 for the memcpy, 2 for the dev-memcpy
		var off int64
		if mode == "layer" {
			off = c.p.layers[(i+11*k)%benchLayers].off
		} else {
			off = (int64(i)*2 + int64(k)) % parts * n
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
		dev := region(i, 2)
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
		if dev := region(i, 1); op == "gather" {
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

// BenchmarkScatteredRuns isolates what a gather's run pattern costs: 4 MiB copied from 512 MiB
// of cold memory into a staging buffer, as one Go copy (memcpy, the baseline), as runs of the
// given size one after another (seq: the same copy routine as a transfer's, on contiguous
// runs), as the same number of runs from random places (random) and as those random runs
// through a gather's copy loop with its prefetch cursor (ahead). Each metric is the variant's
// rate ÷ memcpy's, from median times of interleaved rounds; the memory has 2 MiB pages
// (device memory) or, with pages=4k, 4 KiB pages (Go heap).
//
//	go test -run '^$' -bench 'BenchmarkScatteredRuns' -benchtime 100x -cpu 1 ./kernels/
func BenchmarkScatteredRuns(b *testing.B) {
	const devBytes, total = 512 << 20, 4 << 20
	for _, pages := range []string{"2M", "4k"} {
		var dev []byte
		if pages == "2M" {
			d, err := NewSimDevice(SimOptions{})
			if err != nil {
				b.Fatal(err)
			}
			dev = memBytes(mustAlloc(b, d, "dev", devBytes))
			defer d.Close()
		} else {
			dev = make([]byte, devBytes)
		}
		for i := 0; i < len(dev); i += 4096 {
			dev[i] = byte(i >> 12)
		}
		st, err := NewStaging(total, StagingOptions{HugePages: true})
		if err != nil {
			b.Fatal(err)
		}
		host := st.Bytes()[:total]
		for _, run := range []int{4 << 10, 32 << 10, 256 << 10} {
			b.Run(fmt.Sprintf("pages=%s/run=%d", pages, run), func(b *testing.B) {
				nr := total / run
				slots := rand.New(rand.NewPCG(1, uint64(run))).Perm(devBytes / run)
				rounds := len(slots) / nr // each round reads runs no other round read
				items := make([]xitem, nr)
				mems := [][]byte{dev}
				variants := []struct {
					name string
					fn   func(r int)
				}{
					{"memcpy", func(r int) { o := r % (devBytes / total) * total; copy(host, dev[o:o+total]) }},
					{"seq", func(r int) {
						o := r % (devBytes / total) * total
						for k := 0; k < nr; k++ {
							memcopy.Stream(host[k*run:(k+1)*run], dev[o+k*run:o+(k+1)*run])
						}
						memcopy.Fence()
					}},
					{"random", func(r int) {
						for k := 0; k < nr; k++ {
							o := slots[r%rounds*nr+k] * run
							memcopy.Stream(host[k*run:(k+1)*run], dev[o:o+run])
						}
						memcopy.Fence()
					}},
					{"ahead", func(r int) {
						for k := range items {
							items[k] = xitem{src: int64(slots[r%rounds*nr+k] * run), dst: int64(k * run), n: int64(run)}
						}
						q := runSeq{items: items}
						q.gatherAhead(mems, host, true)
						memcopy.Fence()
					}},
				}
				took := make([][]time.Duration, len(variants))
				for i := 0; i < b.N; i++ {
					for k := range variants {
						w := (i + k) % len(variants)
						t0 := time.Now()
						variants[w].fn(i*len(variants) + k)
						took[w] = append(took[w], time.Since(t0))
					}
				}
				var base float64
				for w, v := range variants {
					slices.Sort(took[w])
					m := took[w][len(took[w])/2].Seconds()
					if w == 0 {
						base = m
						b.ReportMetric(total/m/1e9, "memcpy-GB/s")
						continue
					}
					b.ReportMetric(base/m, v.name)
				}
			})
		}
		_ = st.Close()
	}
}
