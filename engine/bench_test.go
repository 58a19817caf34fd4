package engine

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// benchEngine opens a store on the real disk (b.TempDir) with the default options.
func benchEngine(b *testing.B, l Layout, eng devio.IOEngine) *Engine {
	b.Helper()
	opts := Options{Layout: l, Schema: testSchema, FS: vfs.Default, IOEngine: eng}
	e, err := Open(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

// alignedBlocks returns n aligned buffers holding the payloads of blocks 0..n-1.
func alignedBlocks(l Layout, n int) [][]byte {
	src := make([][]byte, n)
	for i := range src {
		src[i] = devio.AlignedBuffer(int(l.BlockBytes()))
		payload(blockID(i), 0, src[i])
	}
	return src
}

// benchDumps dumps tasks of len(src) new blocks (ids from *next on) from src until b is done.
func benchDumps(b *testing.B, e *Engine, src [][]byte, next *int) {
	b.SetBytes(int64(len(src)) * e.Layout().BlockBytes())
	for b.Loop() {
		ids := make([]BlockID, len(src))
		for i := range ids {
			ids[i] = blockID(*next)
			*next++
		}
		if err := e.Dump(ids, src).Wait(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDump measures whole-block dumps of 2 MiB blocks (32 shards), 8 blocks a task, from
// aligned buffers (the zero-copy path), with SyncAlways and group commit.
func BenchmarkDump(b *testing.B) {
	for _, eng := range []devio.IOEngine{devio.EnginePsync, devio.EngineURing} {
		b.Run(eng.String(), func(b *testing.B) {
			if _, err := devio.NewBackend(eng, 1, nil); err != nil {
				b.Skip(err)
			}
			l := Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 64 << 10}
			benchDumps(b, benchEngine(b, l, eng), alignedBlocks(l, 8), new(int))
		})
	}
}

// BenchmarkLoad measures whole-block and single-shard loads of stored blocks (O_DIRECT when the
// file system allows it, so reads come from the device).
func BenchmarkLoad(b *testing.B) {
	l := Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 64 << 10}
	for _, eng := range []devio.IOEngine{devio.EnginePsync, devio.EngineURing} {
		b.Run(eng.String(), func(b *testing.B) {
			if _, err := devio.NewBackend(eng, 1, nil); err != nil {
				b.Skip(err)
			}
			e := benchEngine(b, l, eng)
			const blocks = 64
			ids := make([]BlockID, blocks)
			for i := range ids {
				ids[i] = blockID(i)
			}
			src := alignedBlocks(l, blocks)
			if err := e.Dump(ids, src).Wait(); err != nil {
				b.Fatal(err)
			}
			for _, mode := range []string{"block", "shard"} {
				b.Run(mode, func(b *testing.B) {
					const batch = 8
					dst := make([][]byte, batch)
					size := l.BlockBytes()
					if mode == "shard" {
						size = l.ShardBytes
					}
					for i := range dst {
						dst[i] = devio.AlignedBuffer(int(size))
					}
					b.SetBytes(batch * size)
					n := 0
					for b.Loop() {
						part := make([]BlockID, batch)
						for i := range part {
							part[i] = ids[(n+i*7)%blocks]
						}
						n++
						var err error
						if mode == "block" {
							err = e.Load(part, dst).Wait()
						} else {
							err = e.LoadShard(part, n%l.Shards, dst).Wait()
						}
						if err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// BenchmarkLookup measures a 1024-id batch of mixed hits and misses over a store of 100k
// indexed blocks.
func BenchmarkLookup(b *testing.B) {
	mem := vfs.NewMem()
	l := Layout{Shards: 1, TensorsPerShard: 1, ShardBytes: 4096}
	opts := Options{Layout: l, Schema: testSchema, FS: mem, SyncPolicy: SyncNone}
	e, err := Open("/store", opts)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	const stored = 100_000
	src := make([][]byte, 1000)
	for i := range src {
		src[i] = devio.AlignedBuffer(4096)
	}
	for lo := 0; lo < stored; lo += len(src) {
		if err := e.Dump(ids(lo, lo+len(src)), src).Wait(); err != nil {
			b.Fatal(err)
		}
	}
	batch := make([]BlockID, 1024)
	for i := range batch {
		batch[i] = blockID(i * 2) // half beyond the stored range: misses
	}
	b.Run(fmt.Sprintf("exact-%d", len(batch)), func(b *testing.B) {
		for b.Loop() {
			e.Lookup(batch)
		}
	})
	b.Run(fmt.Sprintf("prefix-%d", len(batch)), func(b *testing.B) {
		chain := ids(0, 1024)
		for b.Loop() {
			if e.LookupPrefix(chain) != 1024 {
				b.Fatal("prefix")
			}
		}
	})
}

// BenchmarkMemoryTier measures what the memory tier costs and brings, on the real disk with
// io_uring when available: dumps with and without a memory tier in front (write-through adds
// one copy per block), and whole-block loads served from memory against loads from the disk
// (O_DIRECT). Compare with BenchmarkMemcpy2MiB in the same run for the ratio to memcpy.
func BenchmarkMemoryTier(b *testing.B) {
	l := Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 64 << 10}
	const batch = 8
	for _, withMem := range []bool{false, true} {
		name := "disk-only"
		if withMem {
			name = "memory-tier"
		}
		b.Run(name, func(b *testing.B) {
			opts := Options{Layout: l, Schema: testSchema, FS: vfs.Default}
			dir := b.TempDir()
			opts.Tiers = []tiers.Config{{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}}}
			if withMem {
				opts.Tiers = append([]tiers.Config{{Name: "dram", Kind: tiers.KindMemory, Capacity: 1 << 30}}, opts.Tiers...)
			}
			e, err := Open(dir, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			src := alignedBlocks(l, batch)
			n := 0
			b.Run("dump", func(b *testing.B) { benchDumps(b, e, src, &n) })
			ids := make([]BlockID, batch)
			for i := range ids {
				ids[i] = blockID(i)
			}
			if err := e.Dump(ids, src).Wait(); err != nil {
				b.Fatal(err)
			}
			dst := make([][]byte, batch)
			for i := range dst {
				dst[i] = devio.AlignedBuffer(int(l.BlockBytes()))
			}
			b.Run("load", func(b *testing.B) {
				b.SetBytes(batch * l.BlockBytes())
				for b.Loop() {
					if err := e.Load(ids, dst).Wait(); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkMemcpy2MiB is the physical limit the memory tier is compared with.
func BenchmarkMemcpy2MiB(b *testing.B) {
	src, dst := make([]byte, 2<<20), make([]byte, 2<<20)
	b.SetBytes(2 << 20)
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkSharedLookup measures lookups of blocks another instance sealed on a shared tier
// (the target: at least 1,000,000 ids/s with no false miss): instance A stores 100,000
// blocks and closes, instance B indexes them from A's manifest, then looks up batches of 1,024
// of them, exact and prefix. Every batch must be all hits (b.Fatal otherwise). Run with
// `go test -run '^$' -bench SharedLookup ./engine`.
func BenchmarkSharedLookup(b *testing.B) {
	mem := vfs.NewMem()
	l := Layout{Shards: 1, TensorsPerShard: 1, ShardBytes: 4096}
	opts := Options{Layout: l, Schema: testSchema, FS: mem, SyncPolicy: SyncNone, SegmentSize: 64 << 20,
		Tiers:                 []tiers.Config{{Name: "shared", Kind: tiers.KindDisk, Paths: []string{"/shared"}, Shared: true}},
		SharedRefreshInterval: 10 * time.Millisecond}
	a, err := Open("/a", opts)
	if err != nil {
		b.Fatal(err)
	}
	const stored = 100_000
	src := make([][]byte, 1000)
	for i := range src {
		src[i] = devio.AlignedBuffer(4096)
	}
	for lo := 0; lo < stored; lo += len(src) {
		if err := a.Dump(ids(lo, lo+len(src)), src).Wait(); err != nil {
			b.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		b.Fatal(err)
	}
	e, err := Open("/b", opts)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	for deadline := time.Now().Add(time.Minute); e.Stats().Sharing.ForeignBlocks < stored; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("B indexed %d of %d foreign blocks", e.Stats().Sharing.ForeignBlocks, stored)
		}
	}
	chain := ids(stored/2, stored/2+1024)
	b.Run("exact-1024", func(b *testing.B) {
		for b.Loop() {
			for i, hit := range e.Lookup(chain) {
				if !hit {
					b.Fatalf("false miss: block %s", chain[i])
				}
			}
		}
		b.ReportMetric(float64(b.N*len(chain))/b.Elapsed().Seconds(), "ids/s")
	})
	b.Run("prefix-1024", func(b *testing.B) {
		for b.Loop() {
			if n := e.LookupPrefix(chain); n != len(chain) {
				b.Fatalf("prefix %d of %d", n, len(chain))
			}
		}
		b.ReportMetric(float64(b.N*len(chain))/b.Elapsed().Seconds(), "ids/s")
	})
}

// BenchmarkLoadSidecarsMemory measures what a top-K scan of one layer costs: LoadSidecars of
// one part of 1,024 blocks' sidecars (a 128K-token context of 128-token blocks) served by the
// memory tier, into one contiguous array. Parts of 2 KiB (8 KV heads × 128 dims, fp16: an ESA
// mean) and 8 KiB (32 heads); 32 parts (layers) per sidecar, each call a different layer.
//
// Every iteration also runs, in rotating order, the physical limit of the same work on one
// core: memcpy, one copy per block of the same part size from separate buffers of the same
// shape into the same array (no lookup, no checksum), and memcpy+crc, the same with the CRC32C
// of each part (what a checked copy cannot avoid). Reported from the median times (a shared
// machine deschedules a few iterations of any of them for milliseconds): load-ms, memcpy-ms,
// memcpy-crc-ms, and ratio = memcpy-ms ÷ load-ms (throughput relative to memcpy).
func BenchmarkLoadSidecarsMemory(b *testing.B) {
	for _, part := range []int{2 << 10, 8 << 10} {
		b.Run(fmt.Sprintf("part=%dKiB", part>>10), func(b *testing.B) {
			const blocks, layers = 1024, 32
			l := Layout{Shards: 1, TensorsPerShard: 2, ShardBytes: 4 << 10}
			opts := Options{Layout: l, Schema: testSchema, FS: vfs.Default, Tiers: []tiers.Config{
				{Name: "dram", Kind: tiers.KindMemory, Capacity: 2 * blocks * int64(layers*part+4<<10)},
				{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{b.TempDir()}},
			}}
			e, err := Open(b.TempDir(), opts)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			ids := make([]BlockID, blocks)
			src := make([][]byte, blocks)
			side := make([][]byte, blocks)
			for i := range ids {
				ids[i] = blockID(i)
				src[i] = make([]byte, l.BlockBytes())
				side[i] = make([]byte, layers*part)
				payload(ids[i], 7, side[i])
			}
			if err := e.Dump(ids, src).Wait(); err != nil {
				b.Fatal(err)
			}
			if err := e.DumpSidecars(1, layers, ids, side).Wait(); err != nil {
				b.Fatal(err)
			}
			dst := make([]byte, blocks*part)
			var sink uint32
			work := [3]func(layer int){
				func(layer int) {
					found, err := e.LoadSidecars(1, layer, ids, dst)
					if err != nil || !found[blocks-1] {
						b.Fatal(err)
					}
				},
				func(layer int) {
					for i := range side {
						copy(dst[i*part:(i+1)*part], side[i][layer*part:])
					}
				},
				func(layer int) {
					for i := range side {
						d := dst[i*part : (i+1)*part]
						copy(d, side[i][layer*part:])
						sink += format.Checksum(d)
					}
				},
			}
			var took [3][]time.Duration
			b.SetBytes(int64(len(dst)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k := range work {
					w := (i + k) % len(work)
					t0 := time.Now()
					work[w](i % layers)
					took[w] = append(took[w], time.Since(t0))
				}
			}
			b.StopTimer()
			if st := e.Stats(); st.SidecarDiskReads != 0 {
				b.Fatalf("%d sidecar reads went to disk", st.SidecarDiskReads)
			}
			var ms [3]float64
			for w := range took {
				slices.Sort(took[w])
				ms[w] = took[w][len(took[w])/2].Seconds() * 1e3
			}
			b.ReportMetric(ms[0], "load-ms")
			b.ReportMetric(ms[1], "memcpy-ms")
			b.ReportMetric(ms[2], "memcpy-crc-ms")
			b.ReportMetric(ms[1]/ms[0], "ratio")
			_ = sink
		})
	}
}

// BenchmarkSharedLookupMiss measures what a miss costs with publication logs to read: a batch
// of 1,024 ids no instance stored (a new prompt), looked up by an instance that shares a path
// on the local disk with eight others, each with a log (UCM's tensor-parallel workers of one
// host). Every miss reads this host's logs first: an fstat per log and a stat per directory.
// Reported beside it, the same lookup by an instance with no shared tier.
func BenchmarkSharedLookupMiss(b *testing.B) {
	root := b.TempDir()
	shared := filepath.Join(root, "shared")
	l := Layout{Shards: 1, TensorsPerShard: 1, ShardBytes: 4096}
	opts := Options{Layout: l, Schema: testSchema, SyncPolicy: SyncNone, SegmentSize: 64 << 20,
		Tiers:                 []tiers.Config{{Name: "shared", Kind: tiers.KindDisk, Paths: []string{shared}, Shared: true}},
		SharedRefreshInterval: time.Hour, SharedOwnerTimeout: 4 * time.Hour, SharedSealAge: time.Hour}
	src := [][]byte{devio.AlignedBuffer(4096)}
	for w := range 8 {
		e, err := Open(filepath.Join(root, fmt.Sprintf("w%d", w)), opts)
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		if err := e.Dump(ids(w*10, w*10+1), src).Wait(); err != nil {
			b.Fatal(err)
		}
	}
	e, err := Open(filepath.Join(root, "reader"), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	local := opts
	local.Tiers = nil
	solo, err := Open(filepath.Join(root, "solo"), local)
	if err != nil {
		b.Fatal(err)
	}
	defer solo.Close()
	if !allHit(e, ids(0, 1)) {
		b.Fatal("a worker's block is not found")
	}
	// Past the window in which an unchanged directory time proves nothing (share.RacyDirWindow),
	// as in steady state: the instances opened long ago.
	time.Sleep(share.RacyDirWindow + 500*time.Millisecond)
	miss := ids(1_000_000, 1_000_000+1024)
	for _, c := range []struct {
		name string
		e    *Engine
	}{{"shared-9-instances", e}, {"no-shared-tier", solo}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				for i, hit := range c.e.Lookup(miss) {
					if hit {
						b.Fatalf("block %s found", miss[i])
					}
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
		})
	}
}
