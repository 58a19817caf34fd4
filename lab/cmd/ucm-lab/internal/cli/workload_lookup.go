package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
)

// lookupBatch is the number of ids per timed lookup call.
const lookupBatch = 1024

// lookupWorkload indexes --blocks blocks (tiny blocks, big unsynced dump tasks: the index is
// what matters), closes and reopens the store (timed, with the memory the open store holds),
// then times --batches exact lookups of 1024 ids, about half of them stored, and as many
// prefix lookups of 1024 ids whose leading run of stored blocks has a random length.
type lookupWorkload struct{}

func (lookupWorkload) name() string { return "lookup" }

func (lookupWorkload) defaults() map[string]string { return metadataDefaults }

func (lookupWorkload) blocks(cfg benchConfig, _ format.Layout) (int, error) {
	return metadataBlocks(cfg)
}

func metadataBlocks(cfg benchConfig) (int, error) {
	if cfg.blocks < 1 || cfg.blocks > 1<<31 {
		return 0, fmt.Errorf("--blocks %d: want 1 to 2^31", cfg.blocks)
	}
	return cfg.blocks, nil
}

func (lookupWorkload) run(env *benchEnv, res *benchResult) error {
	cfg := env.cfg
	e, err := indexBlocks(env, res)
	if err != nil {
		return err
	}
	if err := e.Close(); err != nil {
		return fmt.Errorf("close after indexing: %w", err)
	}
	e, err = openMeasured(env, env.storeDir, res)
	if err != nil {
		return err
	}
	defer func() { _ = e.Close() }()

	r := rand.New(rand.NewPCG(cfg.seed, 0x6c6f6f6b7570))
	n := env.blocks
	ids := make([]format.BlockID, lookupBatch)
	var (
		idMap   map[format.BlockID]struct{} // --map-baseline: the stored ids in a Go map
		mapTime time.Duration
		mapGot  = make([]bool, lookupBatch)
	)
	if cfg.mapBaseline {
		idMap = make(map[format.BlockID]struct{}, n)
		for i := 0; i < n; i++ {
			idMap[blockID(i)] = struct{}{}
		}
	}
	// lookupMap times the map's answer for ids and checks it has want hits.
	lookupMap := func(b, want int) error {
		start := time.Now()
		for i, id := range ids {
			_, mapGot[i] = idMap[id]
		}
		mapTime += time.Since(start)
		if k := countTrue(mapGot); k != want {
			return fmt.Errorf("map lookup batch %d: %d hits, want %d", b, k, want)
		}
		return nil
	}
	exact := make([]time.Duration, 0, cfg.batches)
	prefix := make([]time.Duration, 0, cfg.batches)
	var hits, prefixHits, total int64
	for b := 0; b < cfg.batches; b++ {
		// Exact: each id stored with probability 1/2.
		want := 0
		for i := range ids {
			if r.IntN(2) == 0 {
				ids[i] = blockID(r.IntN(n))
				want++
			} else {
				ids[i] = blockID(n + r.IntN(1<<30))
			}
		}
		// --map-baseline: the map's lookups of the same ids right before (odd batches) or
		// after (even) the engine's, so that neither always finds the other's cache footprint.
		if idMap != nil && b%2 == 1 {
			if err := lookupMap(b, want); err != nil {
				return err
			}
		}
		start := time.Now()
		got := e.Lookup(ids)
		exact = append(exact, time.Since(start))
		if idMap != nil && b%2 == 0 {
			if err := lookupMap(b, want); err != nil {
				return err
			}
		}
		k := 0
		for _, h := range got {
			if h {
				k++
			}
		}
		if k != want {
			res.mismatch = fmt.Sprintf("exact lookup batch %d: %d hits, want %d", b, k, want)
			return nil
		}
		hits += int64(k)
		total += lookupBatch

		// Prefix: a run of consecutive stored blocks, then blocks never stored.
		run := r.IntN(lookupBatch + 1)
		first := r.IntN(max(1, n-run))
		for i := range ids {
			if i < run {
				ids[i] = blockID((first + i) % n)
			} else {
				ids[i] = blockID(n + r.IntN(1<<30))
			}
		}
		start = time.Now()
		p := e.LookupPrefix(ids)
		prefix = append(prefix, time.Since(start))
		if wantRun := run; p != wantRun {
			res.mismatch = fmt.Sprintf("prefix lookup batch %d: leading run %d, want %d", b, p, wantRun)
			return nil
		}
		prefixHits += int64(p)
	}
	res.LookupBatch, res.LookupBatches = lookupBatch, cfg.batches
	res.P50LookupBatchMs, res.P99LookupBatchMs = percentileMs(exact, 0.50), percentileMs(exact, 0.99)
	res.P50PrefixBatchMs, res.P99PrefixBatchMs = percentileMs(prefix, 0.50), percentileMs(prefix, 0.99)
	var sum time.Duration
	for _, d := range exact {
		sum += d
	}
	if sum > 0 {
		res.LookupsPerSec = float64(total) / sum.Seconds()
	}
	if idMap != nil && mapTime > 0 && sum > 0 {
		res.MapLookupsPerSec = float64(total) / mapTime.Seconds()
		res.LookupMapRatio = res.LookupsPerSec / res.MapLookupsPerSec
	}
	res.LookupHitFraction = float64(hits) / float64(max(1, total))
	res.PrefixHitFraction = float64(prefixHits) / float64(max(1, int64(cfg.batches)*lookupBatch))
	res.Verified = true
	return nil
}

// indexBlocks opens the bench store and dumps env.blocks blocks into it, timed.
func indexBlocks(env *benchEnv, res *benchResult) (*engine.Engine, error) {
	e, _, err := env.open()
	if err != nil {
		return nil, err
	}
	res.IOEngine, res.Direct = e.IOEngine()
	blockBytes := e.Layout().BlockBytes()
	env.progressf("indexing %d blocks ...", env.blocks)
	d, err := runTasks(env, 0, blockBytes, nil, func(ids []format.BlockID, bufs [][]byte) error {
		for i, id := range ids {
			env.payload.fill(bufs[i], id)
		}
		return e.Dump(ids, bufs).Wait()
	})
	if err != nil {
		_ = e.Close()
		return nil, fmt.Errorf("index %d blocks: %w", env.blocks, err)
	}
	res.IndexSeconds = d.Seconds()
	res.DumpMBps = mbps(res.TotalBytes, d)
	res.dumpTime = d
	env.progressf("indexed %d blocks in %v", env.blocks, d.Round(time.Millisecond))
	return e, nil
}

// openMeasured opens the store in dir, timed, and records in res how much memory the open
// store holds per block: resident set (VmRSS) and Go heap in use, after a GC, measured
// before and after Open. Both include the index's block cache as filled by Open.
func openMeasured(env *benchEnv, dir string, res *benchResult) (*engine.Engine, error) {
	rss0, heap0 := memNow()
	start := time.Now()
	e, d, err := env.openDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	// A first lookup at once, while the membership is built: a batch of stored ids.
	batch := make([]format.BlockID, min(lookupBatch, env.blocks))
	for i := range batch {
		batch[i] = blockID(i % env.blocks)
	}
	t0 := time.Now()
	_ = e.Lookup(batch)
	res.FirstLookupMs = float64(time.Since(t0)) / 1e6
	res.LookupBatch = len(batch)
	if err := e.Index().WaitMembers(); err != nil {
		_ = e.Close()
		return nil, fmt.Errorf("open: the index's membership: %w", err)
	}
	res.MembersReadySeconds = time.Since(start).Seconds()
	rss1, heap1 := memNow()
	res.OpenSeconds = d.Seconds()
	blocks := e.Stats().Blocks
	if blocks > 0 {
		res.RSSBytesPerBlock = float64(rss1-rss0) / float64(blocks)
		res.HeapBytesPerBlk = float64(heap1-heap0) / float64(blocks)
	}
	if blocks != int64(env.blocks) {
		_ = e.Close()
		return nil, fmt.Errorf("open: %d blocks in the store, want %d", blocks, env.blocks)
	}
	return e, nil
}

// memNow returns the process's resident set and the Go heap in use, in bytes, after a GC
// that also returns freed memory to the OS.
func memNow() (rss, heap int64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return vmRSS(), int64(ms.HeapInuse)
}

// vmRSS reads VmRSS from /proc/self/status (0 where there is none).
func vmRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			fields := bytes.Fields(v)
			if len(fields) > 0 {
				kb, _ := strconv.ParseInt(string(fields[0]), 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// percentileMs is the q-quantile of ds (nearest rank) in milliseconds.
func percentileMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, int(q*float64(len(s))))
	return float64(s[i].Nanoseconds()) / 1e6
}

// countTrue returns how many of bs are true.
func countTrue(bs []bool) int {
	k := 0
	for _, b := range bs {
		if b {
			k++
		}
	}
	return k
}
