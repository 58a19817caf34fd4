package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// benchSchema is the fixed schema of bench stores.
var benchSchema = engine.Schema{Model: "ucm-tool-bench", DType: "bfloat16", KVLayout: "mha", TPRank: 0, TPSize: 1,
	BlockTokens: 16, Extra: "synthetic payloads"}

// benchConfig is the parsed bench flags.
type benchConfig struct {
	dir         string
	workload    string
	blockBytes  int64
	shards      int
	total       int64
	concurrency int
	batch       int
	ioEngine    devio.IOEngine
	direct      devio.DirectMode
	sync        engine.SyncPolicy
	segmentSize int64
	json        bool
}

// benchResult is one bench run; the JSON field names are part of the tool's interface.
type benchResult struct {
	Workload    string  `json:"workload"`
	BlockBytes  int64   `json:"block_bytes"`
	Shards      int     `json:"shards"`
	Blocks      int     `json:"blocks"`
	TotalBytes  int64   `json:"total_bytes"`
	IOEngine    string  `json:"io_engine"`
	Direct      bool    `json:"direct"`
	Sync        string  `json:"sync"`
	DumpMBps    float64 `json:"dump_MBps"`
	LoadMBps    float64 `json:"load_MBps"`
	OpenSeconds float64 `json:"open_s"`
	Verified    bool    `json:"verified"`

	dumpTime, loadTime time.Duration
	mismatch           string // first block that did not verify
}

func newBenchCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfg                                     benchConfig
		blockSize, total, segSize, ioEng, dirIO string
		syncPol                                 string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure dump and load throughput on a scratch store",
		Long: `bench creates a store at DIR/bench-<block size>-<shards> (removing only that
subdirectory first), dumps --total bytes of distinct blocks whose bytes are a
deterministic function of their id, closes and reopens the store so that loads read
from disk, loads every block back and verifies every byte.

Sizes accept plain bytes or K/KiB, M/MiB, G/GiB (binary units). MB/s is 10^6 bytes per
second. Dump time runs from the first dump task to the last one's completion (durable
per --sync); load time includes the in-line byte comparison. Without O_DIRECT the
reloaded bytes may come from the page cache, and the output says so.

Workloads: seq (dump all blocks, reopen, load all blocks).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if _, ok := workloads[cfg.workload]; !ok {
				return usageErr("--workload %q: unknown workload (available: %s)", cfg.workload, workloadNames())
			}
			if cfg.blockBytes, err = parseSize(blockSize); err != nil {
				return usageErr("--block-size: %v", err)
			}
			if cfg.total, err = parseSize(total); err != nil {
				return usageErr("--total: %v", err)
			}
			if cfg.segmentSize, err = parseSize(segSize); err != nil {
				return usageErr("--segment-size: %v", err)
			}
			if cfg.ioEngine, err = devio.ParseIOEngine(ioEng); err != nil {
				return usageErr("--io-engine: %v", err)
			}
			if cfg.direct, err = devio.ParseDirectMode(dirIO); err != nil {
				return usageErr("--direct: %v", err)
			}
			if cfg.sync, err = wal.ParseSyncPolicy(syncPol); err != nil {
				return usageErr("--sync: %v", err)
			}
			return runBench(cfg, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.dir, "dir", "./ucm-data", "directory for the bench store (only its bench-* subdirectory is replaced)")
	fl.StringVar(&cfg.workload, "workload", "seq", "workload to run (seq)")
	fl.StringVar(&blockSize, "block-size", "2MiB", "bytes of a whole block")
	fl.IntVar(&cfg.shards, "shards", 32, "shards per block (block size / shards = shard bytes, K and V tensors)")
	fl.StringVar(&total, "total", "2GiB", "bytes dumped and loaded (total / block size blocks)")
	fl.IntVar(&cfg.concurrency, "concurrency", 8, "dump/load tasks in flight")
	fl.IntVar(&cfg.batch, "batch", 4, "blocks per task")
	fl.StringVar(&ioEng, "io-engine", "auto", "I/O backend: auto, uring or psync")
	fl.StringVar(&dirIO, "direct", "auto", "O_DIRECT: auto, on or off")
	fl.StringVar(&syncPol, "sync", "always", "sync policy: always, interval or none")
	fl.StringVar(&segSize, "segment-size", "256MiB", "segment file size")
	fl.BoolVar(&cfg.json, "json", false, "print one JSON object")
	return cmd
}

// benchLayout checks the sizes and returns the bench layout: shards × (K, V) tensors.
func benchLayout(cfg benchConfig) (format.Layout, error) {
	if cfg.shards < 1 {
		return format.Layout{}, fmt.Errorf("--shards %d: want at least 1", cfg.shards)
	}
	if cfg.blockBytes < 1 || cfg.blockBytes%int64(cfg.shards) != 0 {
		return format.Layout{}, fmt.Errorf("--block-size %d is not a multiple of --shards %d", cfg.blockBytes, cfg.shards)
	}
	shard := cfg.blockBytes / int64(cfg.shards)
	if shard < 2 || shard%2 != 0 {
		return format.Layout{}, fmt.Errorf("shard of %d bytes (--block-size / --shards) cannot hold a K and a V tensor of whole bytes", shard)
	}
	l := format.Layout{Shards: cfg.shards, TensorsPerShard: 2, ShardBytes: shard}
	if err := l.Validate(); err != nil {
		return l, err
	}
	return l, nil
}

func runBench(cfg benchConfig, stdout, stderr io.Writer) error {
	l, err := benchLayout(cfg)
	if err != nil {
		return usageErr("%v", err)
	}
	switch {
	case cfg.concurrency < 1:
		return usageErr("--concurrency %d: want at least 1", cfg.concurrency)
	case cfg.batch < 1:
		return usageErr("--batch %d: want at least 1", cfg.batch)
	case cfg.total < cfg.blockBytes:
		return usageErr("--total %d is less than one block (%d bytes)", cfg.total, cfg.blockBytes)
	case cfg.segmentSize < engine.MinSegmentSize || cfg.segmentSize%format.Alignment != 0:
		return usageErr("--segment-size %d: want a multiple of %d of at least %s", cfg.segmentSize, format.Alignment, formatSize(engine.MinSegmentSize))
	}
	blocks := cfg.total / cfg.blockBytes
	if blocks > 1<<31 {
		return usageErr("--total %d: too many blocks (%d)", cfg.total, blocks)
	}
	storeDir := filepath.Join(cfg.dir, fmt.Sprintf("bench-%s-%d", formatSize(cfg.blockBytes), cfg.shards))
	if err := os.MkdirAll(cfg.dir, 0o755); err != nil {
		return usageErr("--dir: %v", err)
	}
	if err := os.RemoveAll(storeDir); err != nil {
		return usageErr("remove the previous bench store %s: %v", storeDir, err)
	}
	opts := engine.Options{Layout: l, Schema: benchSchema, SegmentSize: cfg.segmentSize, SyncPolicy: cfg.sync,
		IOEngine: cfg.ioEngine, DirectIO: cfg.direct}
	env := &benchEnv{cfg: cfg, blocks: int(blocks), payload: newPayloadPool(l.BlockBytes()),
		open: func() (*engine.Engine, time.Duration, error) {
			start := time.Now()
			e, err := engine.Open(storeDir, opts)
			if err != nil {
				return nil, 0, &exitError{code: ExitUsage, err: err}
			}
			return e, time.Since(start), nil
		}}
	res := &benchResult{Workload: cfg.workload, BlockBytes: l.BlockBytes(), Shards: l.Shards, Blocks: int(blocks),
		TotalBytes: blocks * l.BlockBytes(), Sync: cfg.sync.String()}
	if !cfg.json {
		fmt.Fprintf(stderr, "bench: %s workload, %d blocks of %s into %s ...\n", cfg.workload, blocks, formatSize(l.BlockBytes()), storeDir)
	}
	if err := workloads[cfg.workload]().run(env, res); err != nil {
		code := ExitProblems
		if errors.As(err, new(*exitError)) {
			code = ExitUsage // the store could not be opened (bad option for this machine)
		}
		return &exitError{code: code, err: fmt.Errorf("bench %s: %w", cfg.workload, err)}
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		printBench(stdout, storeDir, res)
	}
	if !res.Verified {
		return &exitError{code: ExitProblems, err: fmt.Errorf("bench: verification failed: %s", res.mismatch)}
	}
	return nil
}

func printBench(w io.Writer, storeDir string, r *benchResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("store", "%s", storeDir)
	row("workload", "%s", r.Workload)
	row("block size", "%s (%d bytes)", formatSize(r.BlockBytes), r.BlockBytes)
	row("shards", "%d x %s", r.Shards, formatSize(r.BlockBytes/int64(r.Shards)))
	row("blocks", "%d", r.Blocks)
	row("total", "%s (%d bytes)", humanBytes(r.TotalBytes), r.TotalBytes)
	row("io engine", "%s", r.IOEngine)
	direct := "on (O_DIRECT: loads read the device, no page cache)"
	if !r.Direct {
		direct = "off (loads may be served from the page cache)"
	}
	row("direct", "%s", direct)
	row("sync", "%s", r.Sync)
	row("dump", "%.1f MB/s (%v)", r.DumpMBps, r.dumpTime.Round(time.Millisecond))
	row("open", "%.3f s (reopen before loading)", r.OpenSeconds)
	row("load", "%.1f MB/s (%v)", r.LoadMBps, r.loadTime.Round(time.Millisecond))
	if r.Verified {
		row("result", "verified (every byte of every block matched)")
	} else {
		row("result", "FAILED: %s", r.mismatch)
	}
	_ = tw.Flush()
}
