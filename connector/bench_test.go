package connector

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
)

// BenchmarkStoreLoadShard is the Go side of one UCM layer-wise load call (4 blocks × one 64 KiB
// shard into one span each), submit and wait: what the C ABI adds to is measured by
// connector/python/bench.py against ucm-lab bench.
func BenchmarkStoreLoadShard(b *testing.B) {
	dir := b.TempDir()
	cfg, err := ParseStoreConfig(fmt.Sprintf(`{"storage_backends": %q, "device_id": 0, "tensor_size_list": [32768, 32768], "shard_size": 65536, "block_size": 2097152, "sync_policy": "none"}`, dir), noEnv)
	if err != nil {
		b.Fatal(err)
	}
	s, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ids := randomIDs(4)
	bufs := make([][][]byte, len(ids))
	for i := range bufs {
		bufs[i] = [][]byte{devio.AlignedBuffer(65536)}
	}
	for sh := 0; sh < 32; sh++ {
		t, err := s.Dump(ids, repeat(sh, 4), bufs)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Wait(t, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(4 * 65536)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t, err := s.Load(ids, []int{0, 0, 0, 0}, bufs)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Wait(t, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWindowDriver runs connector/python/bench.py's pattern from Go, through
// connector.Store without the C ABI, for bench.py to compare with the same pattern through
// libucmgo.so: one submitter keeping UCMGO_BENCH_WINDOW tasks of UCMGO_BENCH_BATCH blocks in
// flight, dumping UCMGO_BENCH_TOTAL bytes (seq: whole blocks; layerwise: a task per shard),
// reopening, loading every (batch, shard) unit (layerwise: in random order). UCMGO_BENCH_EXTRA
// adds members to the store's JSON configuration. It reports dump-MB/s, load-MB/s, the
// process's CPU per load task and the time per load call; without UCMGO_BENCH_DIR it is skipped.
func BenchmarkWindowDriver(b *testing.B) {
	dir := os.Getenv("UCMGO_BENCH_DIR")
	if dir == "" {
		b.Skip("UCMGO_BENCH_DIR not set (connector/python/bench.py sets it)")
	}
	env := func(k string, def int64) int64 {
		if v, err := strconv.ParseInt(os.Getenv(k), 10, 64); err == nil {
			return v
		}
		return def
	}
	layerwise := os.Getenv("UCMGO_BENCH_WORKLOAD") == "layerwise"
	blockBytes, nShards := env("UCMGO_BENCH_BLOCK", 2<<20), int(env("UCMGO_BENCH_SHARDS", 32))
	total, batch, window := env("UCMGO_BENCH_TOTAL", 2<<30), int(env("UCMGO_BENCH_BATCH", 4)), int(env("UCMGO_BENCH_WINDOW", 16))
	shards := 1
	if layerwise {
		shards = nShards
	}
	shard := blockBytes / int64(shards)
	extra := os.Getenv("UCMGO_BENCH_EXTRA") // more members of the configuration
	if extra != "" {
		extra = ", " + extra
	}
	text := fmt.Sprintf(`{"storage_backends": %q, "device_id": 0, "tensor_size_list": [%d, %d], "shard_size": %d, "block_size": %d, "instance": "bench", "io_engine": %q, "sync_policy": "always"%s}`,
		dir, shard/2, shard/2, shard, blockBytes, os.Getenv("UCMGO_BENCH_IO_ENGINE"), extra)
	cfg, err := ParseStoreConfig(text, noEnv)
	if err != nil {
		b.Fatal(err)
	}
	blocks := int(total / blockBytes)
	var groups [][]engine.BlockID
	for g := 0; g < blocks; g += batch {
		var ids []engine.BlockID
		for i := g; i < min(blocks, g+batch); i++ {
			var id engine.BlockID
			binary.LittleEndian.PutUint64(id[:], uint64(i+1))
			ids = append(ids, id)
		}
		groups = append(groups, ids)
	}
	mem, bufs, err := devio.NewHostBuffers(window*batch, int(blockBytes))
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	for _, buf := range bufs {
		for k := range buf {
			buf[k] = byte(k * 7)
		}
	}
	// Two tensors per shard (K and V), as bench.py passes them: the same calls, without the
	// C ABI.
	spans := func(r, n, s int) [][][]byte {
		out := make([][][]byte, n)
		for j := range out {
			sh := bufs[r*batch+j][int64(s)*shard : int64(s+1)*shard]
			out[j] = [][]byte{sh[:shard/2], sh[shard/2:]}
		}
		return out
	}
	for i := 0; i < b.N; i++ {
		s, err := Open(cfg)
		if err != nil {
			b.Fatal(err)
		}
		pending := make([][]uint64, window)
		free := func(r int) {
			for _, t := range pending[r] {
				if err := s.Wait(t, nil); err != nil {
					b.Fatal(err)
				}
			}
			pending[r] = pending[r][:0]
		}
		start := time.Now()
		for gi, g := range groups {
			r := gi % window
			free(r)
			for sh := 0; sh < shards; sh++ {
				t, err := s.Dump(g, repeat(sh, len(g)), spans(r, len(g), sh))
				if err != nil {
					b.Fatal(err)
				}
				pending[r] = append(pending[r], t)
			}
		}
		for r := range pending {
			free(r)
		}
		dump := time.Since(start)
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		if s, err = Open(cfg); err != nil {
			b.Fatal(err)
		}
		type unit struct{ g, s int }
		var units []unit
		for gi := range groups {
			for sh := 0; sh < shards; sh++ {
				units = append(units, unit{gi, sh})
			}
		}
		if layerwise {
			rand.New(rand.NewPCG(1, 2)).Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
		}
		cpu0, submitting := processCPU(b), time.Duration(0)
		start = time.Now()
		for ui, u := range units {
			r := ui % window
			free(r)
			g := groups[u.g]
			t0 := time.Now()
			t, err := s.Load(g, repeat(u.s, len(g)), spans(r, len(g), u.s))
			submitting += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			pending[r] = append(pending[r], t)
		}
		for r := range pending {
			free(r)
		}
		load := time.Since(start)
		loadCPU := processCPU(b) - cpu0
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		bytes := float64(int64(blocks) * blockBytes)
		b.ReportMetric(bytes/dump.Seconds()/1e6, "dump-MB/s")
		b.ReportMetric(bytes/load.Seconds()/1e6, "load-MB/s")
		b.ReportMetric(float64(loadCPU.Microseconds())/float64(len(units)), "load-cpu-µs/task")
		b.ReportMetric(float64(submitting.Microseconds())/float64(len(units)), "load-submit-µs/task")
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// processCPU is the process's user plus system CPU time so far: the CPU a transfer pattern
// costs, which on a contended machine its throughput alone does not show.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
