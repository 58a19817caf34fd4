package connector

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/sparse"
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

// BenchmarkRetrieveDot1024: ESA's retrieval at 1,024 blocks × 4,096 dims (32 KV heads × 128
// dims of mean keys), one query row, every block a candidate, top 307 (30 %), in its two
// forms: "matrix", sparse.DotTopK over float32 rows the caller keeps (the retriever ABI, UCM's
// RetrievalWorkerBackend); "store", Selector.RetrieveDot reading the same representations
// from the store by block id (one LoadSidecars from the memory tier, verify, fp16 → float32
// into pooled rows) and then the same DotTopK. workers is DotTopK's. Run on one core:
//
//	GOMAXPROCS=1 go test -run '^$' -bench RetrieveDot1024 -benchtime 200x ./connector/
func BenchmarkRetrieveDot1024(b *testing.B) {
	s, err := Open(mustConfig(b, fmt.Sprintf(`{"storage_backends": %q, "device_id": 0, "tensor_size_list": [4096, 4096], "shard_size": 8192, "block_size": 8192, "sync_policy": "none"}`, b.TempDir())))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	shape := sparse.Shape{Layers: 1, QHeads: 32, KVHeads: 32, HeadDim: 128, BlockSize: 128}
	x, err := s.NewSelector(methodConfig(b, "ESA", "pool: mean\n"), shape)
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	const blocks, k = 1024, 307
	dim := x.Layout().LayerFloats()
	ids := randomIDs(blocks)
	body := [][]byte{devio.AlignedBuffer(8192)}
	r := rand.New(rand.NewPCG(1, 2))
	reprs := make([][]float32, blocks)
	for i := range reprs {
		reprs[i] = make([]float32, dim)
		for j := range reprs[i] {
			reprs[i][j] = float32(r.IntN(2048)-1024) / 256 // float16-exact
		}
	}
	for lo := 0; lo < blocks; lo += 256 {
		batch := ids[lo : lo+256]
		bodies := make([][][]byte, len(batch))
		for i := range bodies {
			bodies[i] = body
		}
		for _, call := range []func() (uint64, error){
			func() (uint64, error) { return s.Dump(batch, repeat(0, len(batch)), bodies) },
			func() (uint64, error) { return x.PutReprs(batch, reprs[lo:lo+256]) },
		} {
			t, err := call()
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Wait(t, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	data := make([]float32, blocks*dim)
	if found, err := x.LoadReprs(0, ids, data); err != nil || slices.Contains(found, false) {
		b.Fatalf("load reprs: %v, found %v", err, found)
	}
	q := make([]float32, dim)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	for _, workers := range []int{1, 2} {
		args := func() *sparse.DotArgs {
			return &sparse.DotArgs{Q: q, Dim: dim, K: k, Idx: make([]int32, k), Scores: make([]float32, k)}
		}
		b.Run(fmt.Sprintf("matrix/workers=%d", workers), func(b *testing.B) {
			a := args()
			a.Data = data
			b.SetBytes(int64(len(data) * 4))
			for range b.N {
				if err := sparse.DotTopK(a, workers); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("store/workers=%d", workers), func(b *testing.B) {
			a := args()
			b.SetBytes(int64(len(data) * 2)) // the fp16 parts read
			for range b.N {
				if _, err := x.RetrieveDot(0, ids, a, workers); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func mustConfig(b *testing.B, text string) *StoreConfig {
	b.Helper()
	cfg, err := ParseStoreConfig(text, noEnv)
	if err != nil {
		b.Fatal(err)
	}
	return cfg
}
