package kernels

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Pipelined layer-wise transfers on the simulated device with a modelled PCIe link, against
// the bound max(Σ compute, Σ I/O) + one layer (a layer's store I/O, link transfer and compute:
// the fill and drain a two-stage pipeline cannot hide), and against doing the same work
// without overlap. The store is a fake whose reads (writes) of a layer take a fixed delay and
// are served one at a time, like one queue to a disk; compute is a fixed delay per layer on a
// compute stream. ratio = total ÷ bound (≤ 1 is on target); the serial runs show what the
// same work costs without overlap.
//
//	go test -run '^$' -bench 'BenchmarkLayerwise' -benchtime 5x ./kernels/
func BenchmarkLayerwise(b *testing.B) {
	const (
		layers = 32
		moved  = 64  // blocks per request: 4 MiB per layer at 16 tokens
		link   = 8e9 // bytes/s, per direction
		lat    = 20 * time.Microsecond
	)
	spec := CacheSpec{Layout: LayoutFlashAttn, DType: Float16, NumBlocks: benchBlocks, BlockSize: 16, KVHeads: 8, HeadDim: 128}
	dev, err := NewSimDevice(SimOptions{LinkBytesPerSec: link, LinkLatency: lat})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	size := mustRegion(b, spec)
	mem := mustAlloc(b, dev, "kv", size*layers)
	regs := make([]LayerRegion, layers)
	for l := range regs {
		regs[l] = LayerRegion{Mem: mem, Offset: int64(l) * size}
	}
	p, err := Register(spec, regs)
	if err != nil {
		b.Fatal(err)
	}
	blocks := make([]int, moved)
	for i := range blocks {
		blocks[i] = (i * 37) % benchBlocks
	}
	layerBytes := float64(moved) * float64(p.Record().ShardBytes)
	linkTime := lat + time.Duration(layerBytes/link*float64(time.Second))
	for _, c := range []struct {
		name        string
		io, compute time.Duration
	}{
		{"io-bound", 2 * time.Millisecond, 1 * time.Millisecond},
		{"balanced", 1500 * time.Microsecond, 1500 * time.Microsecond},
		{"compute-bound", 1 * time.Millisecond, 2 * time.Millisecond},
	} {
		for _, dir := range []string{"load", "dump"} {
			for _, mode := range []string{"pipelined", "serial"} {
				b.Run(fmt.Sprintf("%s/%s/%s", dir, c.name, mode), func(b *testing.B) {
					pl, err := NewPipeline(p, PipelineOptions{Buffers: 2, MaxBlocks: moved})
					if err != nil {
						b.Fatal(err)
					}
					defer pl.Close()
					xfer, _ := dev.NewStream()
					compute, _ := dev.NewStream()
					defer xfer.Close()
					defer compute.Close()
					// The bound uses the delays as they really were (sleeps overshoot on a
					// loaded machine) and the link time as measured alone.
					var disk sync.Mutex // one request at a time, like one queue to the disk
					var ioSum, computeSum atomic.Int64
					store := func(ctx context.Context, layer int, shards [][]byte) error {
						disk.Lock()
						defer disk.Unlock()
						t := time.Now()
						time.Sleep(c.io)
						ioSum.Add(int64(time.Since(t)))
						return nil
					}
					forward := func() error {
						t := time.Now()
						time.Sleep(c.compute)
						computeSum.Add(int64(time.Since(t)))
						return nil
					}
					linkActual := measureLink(b, p, pl, xfer, blocks)
					var total time.Duration
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						t0 := time.Now()
						var err error
						switch {
						case dir == "load" && mode == "pipelined":
							err = pipelinedLoad(pl, xfer, compute, blocks, store, forward)
						case dir == "load":
							err = serialLoad(p, pl, xfer, compute, blocks, store, forward)
						case mode == "pipelined":
							err = pipelinedDump(dev, pl, xfer, compute, blocks, store, forward)
						default:
							err = serialDump(p, pl, xfer, compute, blocks, store, forward)
						}
						if err != nil {
							b.Fatal(err)
						}
						total += time.Since(t0)
					}
					b.StopTimer()
					avg := total / time.Duration(b.N)
					perIO := time.Duration(ioSum.Load())/time.Duration(b.N*layers) + linkActual
					perC := time.Duration(computeSum.Load()) / time.Duration(b.N*layers)
					bound := max(layers*perC, layers*perIO) + perIO + perC
					b.ReportMetric(float64(avg)/1e6, "total-ms")
					b.ReportMetric(float64(linkTime)/1e6, "link-nominal-ms")
					b.ReportMetric(float64(linkActual)/1e6, "link-ms")
					b.ReportMetric(float64(perIO-linkActual)/1e6, "io-ms")
					b.ReportMetric(float64(perC)/1e6, "compute-ms")
					b.ReportMetric(float64(bound)/1e6, "bound-ms")
					b.ReportMetric(float64(avg)/float64(bound), "ratio")
				})
			}
		}
	}
}

// pipelinedLoad is a layer-wise load as a connector drives it: compute on layer i starts once
// WaitLayer(i) returns, while later layers are still being read and copied.
func pipelinedLoad(pl *Pipeline, xfer, compute *Stream, blocks []int, store LoadFunc, forward func() error) error {
	load, err := pl.Load(context.Background(), xfer, blocks, store)
	if err != nil {
		return err
	}
	defer load.Close()
	for l := 0; l < pl.p.Layers(); l++ {
		if err := load.WaitLayer(l); err != nil {
			return err
		}
		if err := compute.Launch("forward", forward); err != nil {
			return err
		}
	}
	return compute.Synchronize()
}

// serialLoad does the same work without overlap: read, copy and compute each layer in turn.
func serialLoad(p *PagedKV, pl *Pipeline, xfer, compute *Stream, blocks []int, store LoadFunc, forward func() error) error {
	buf := pl.bufs[0]
	n := int64(len(blocks))
	for l := 0; l < p.Layers(); l++ {
		if err := store(context.Background(), l, buf.slots[:n]); err != nil {
			return err
		}
		if err := p.ScatterLayer(xfer, l, blocks, buf.st.Bytes()[:n*p.rec.ShardBytes]); err != nil {
			return err
		}
		if err := xfer.Synchronize(); err != nil {
			return err
		}
		_ = compute.Launch("forward", forward)
		if err := compute.Synchronize(); err != nil {
			return err
		}
	}
	return nil
}

// pipelinedDump computes each layer and saves it as soon as its compute is done (an event),
// while the next layer computes.
func pipelinedDump(dev *Device, pl *Pipeline, xfer, compute *Stream, blocks []int, store DumpFunc, forward func() error) error {
	dump, err := pl.Dump(context.Background(), xfer, blocks, store)
	if err != nil {
		return err
	}
	defer dump.Close()
	ev, err := dev.NewEvent()
	if err != nil {
		return err
	}
	for l := 0; l < pl.p.Layers(); l++ {
		_ = compute.Launch("forward", forward)
		_ = compute.Record(ev)
		if err := dump.SaveLayer(l, ev); err != nil {
			return err
		}
	}
	return dump.Finish()
}

func serialDump(p *PagedKV, pl *Pipeline, xfer, compute *Stream, blocks []int, store DumpFunc, forward func() error) error {
	buf := pl.bufs[0]
	n := int64(len(blocks))
	for l := 0; l < p.Layers(); l++ {
		_ = compute.Launch("forward", forward)
		if err := compute.Synchronize(); err != nil {
			return err
		}
		if err := p.GatherLayer(xfer, l, blocks, buf.st.Bytes()[:n*p.rec.ShardBytes]); err != nil {
			return err
		}
		if err := xfer.Synchronize(); err != nil {
			return err
		}
		if err := store(context.Background(), l, buf.slots[:n]); err != nil {
			return err
		}
	}
	return nil
}

// measureLink returns the average time one layer's transfer takes alone on the modelled link.
func measureLink(b *testing.B, p *PagedKV, pl *Pipeline, s *Stream, blocks []int) time.Duration {
	buf := pl.bufs[0]
	n := int64(len(blocks))
	const reps = 8
	t := time.Now()
	for i := 0; i < reps; i++ {
		if err := p.ScatterLayer(s, i, blocks, buf.st.Bytes()[:n*p.rec.ShardBytes]); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(t) / reps
}
