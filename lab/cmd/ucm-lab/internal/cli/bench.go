package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/crc32c"
	"github.com/ucm-go/ucm/internal/kvgen"
	"github.com/ucm-go/ucm/tiers"
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
	blocks      int // lookup, open: blocks indexed
	instances   int // shared-capacity: instances sharing the tier
	concurrency int
	batch       int
	batches     int  // lookup: batches of each kind timed
	mapBaseline bool // lookup: also time a Go map answering the same batches
	ioEngine    devio.IOEngine
	direct      devio.DirectMode
	sync        engine.SyncPolicy
	segmentSize int64
	recycle     int  // Options.RecycleSegments (0: the engine's default)
	recycled    bool // seq, layerwise: the timed dump writes into recycled segment files
	json        bool
	seed        uint64

	fio        bool
	fioIODepth int
	fioBracket bool // fio before the first round too: each round's ratios against the mean of fio around it
	queueDepth int
	rounds     int    // seq, layerwise: workload (+ fio) runs, medians reported
	buffers    string // huge or heap: where the tasks' payload buffers live
	bufferSpan int64  // seq: the least memory the tasks' buffers span, cycled through (0: what they need)

	tracePath string
	capacity  int64 // trace: disk tier capacity (0: unlimited)
	memory    int64 // trace: memory tier in front (0: none)
	realtime  bool

	compression engine.Compression
	minSaving   float64
	cpuProfile  string

	// layerwise.
	order            string // connector, random or both (layerwise_order.go)
	requestMaxBlocks int    // connector order: longest request, in blocks
	maxStaging       int64  // Options.MaxStagingBytes (0: the engine's default)
	stageLayerWise   bool   // Options.StageLayerWise: block records assembled in staging
	layersInFlight   int    // connector-order loads: layers of a request in flight (0: all)
	hostLayout       string // layerwise: block (a block's shards adjacent) or layer (a layer's shards of a request adjacent)
	timings          bool   // gather and report the engine's flight and load timings
}

// benchResult is one bench run; the JSON field names are part of the tool's interface. Fields
// that do not apply to a workload are left out of the JSON object.
type benchResult struct {
	Workload    string `json:"workload"`
	BlockBytes  int64  `json:"block_bytes"`
	Shards      int    `json:"shards"`
	ShardBytes  int64  `json:"shard_bytes"`
	Blocks      int    `json:"blocks"`
	TotalBytes  int64  `json:"total_bytes"`
	Concurrency int    `json:"concurrency"`
	Batch       int    `json:"batch"`
	IOEngine    string `json:"io_engine"`
	Direct      bool   `json:"direct"`
	Sync        string `json:"sync"`
	// Checksum is the CRC32C code of this binary (internal/crc32c): "isa-l" or "go".
	Checksum string `json:"checksum"`
	// Buffers is where the tasks' payload buffers live: "huge" (huge-page host memory),
	// "huge (4 KiB pages: advice refused)" or "heap" (every workload's dumps and loads go
	// through worker buffers; the field is set by the one that allocated them).
	Buffers string `json:"buffers,omitempty"`
	// HostBufferBytes is the memory the tasks' payload buffers span: what the engine's dumps
	// write from and its loads read into, and the least fio's buffers must span for a read
	// run of fio to count in a ratio (fioFigures.atFootprint).
	HostBufferBytes int64 `json:"host_buffer_bytes,omitempty"`
	// Recycled: the timed dump wrote into recycled segment files and fio overwrote a file it
	// had written (--recycled); SegmentsRecycled counts the dump's segments that reused a file.
	Recycled bool `json:"recycled,omitempty"`
	// HostLayout is how a layerwise run's buffers hold the shards (--host-layout).
	HostLayout string  `json:"host_layout,omitempty"`
	DumpMBps   float64 `json:"dump_MBps,omitempty"`
	LoadMBps   float64 `json:"load_MBps,omitempty"`
	// CachesDropped: without O_DIRECT, the page cache was dropped before loading (root only).
	CachesDropped bool `json:"caches_dropped,omitempty"`

	// open (and the reopen before seq/layerwise loads): seconds to Open the store.
	OpenSeconds      float64 `json:"open_s,omitempty"`
	OpenCrashSeconds float64 `json:"open_crash_s,omitempty"`
	// CrashRecovery is what Open of the crash copy recovered.
	CrashRecovery    *crashReport `json:"crash_recovery,omitempty"`
	IndexSeconds     float64      `json:"index_s,omitempty"` // lookup, open: time to dump the blocks
	RSSBytesPerBlock float64      `json:"rss_bytes_per_block,omitempty"`
	HeapBytesPerBlk  float64      `json:"heap_bytes_per_block,omitempty"`
	// open, lookup: the first lookup of a batch right after Open (answered from the DB while
	// the in-memory membership builds), and when that membership was ready, from the start of
	// Open. The memory per block above is measured once it is.
	FirstLookupMs       float64 `json:"first_lookup_ms,omitempty"`
	MembersReadySeconds float64 `json:"members_ready_s,omitempty"`

	// lookup: per-batch latencies.
	LookupBatch      int     `json:"lookup_batch,omitempty"`
	LookupBatches    int     `json:"lookup_batches,omitempty"`
	P50LookupBatchMs float64 `json:"p50_lookup_batch_ms,omitempty"`
	P99LookupBatchMs float64 `json:"p99_lookup_batch_ms,omitempty"`
	P50PrefixBatchMs float64 `json:"p50_prefix_batch_ms,omitempty"`
	P99PrefixBatchMs float64 `json:"p99_prefix_batch_ms,omitempty"`
	LookupsPerSec    float64 `json:"lookups_per_s,omitempty"`
	// --map-baseline: a Go map of the stored ids answering the same exact batches, each timed
	// right before or after the engine's (alternately), and the engine's rate over the map's.
	MapLookupsPerSec  float64 `json:"map_lookups_per_s,omitempty"`
	LookupMapRatio    float64 `json:"lookup_map_ratio,omitempty"`
	LookupHitFraction float64 `json:"lookup_hit_fraction,omitempty"`
	PrefixHitFraction float64 `json:"prefix_hit_fraction,omitempty"`

	// trace.
	TraceFile      string   `json:"trace,omitempty"`
	Requests       int      `json:"requests,omitempty"`
	PromptBlocks   int64    `json:"prompt_blocks,omitempty"`
	HitBlocks      int64    `json:"hit_blocks,omitempty"`
	HitRate        *float64 `json:"hit_rate,omitempty"`
	TokenHitRate   float64  `json:"token_hit_rate,omitempty"`
	BytesLoaded    int64    `json:"bytes_loaded,omitempty"`
	BytesDumped    int64    `json:"bytes_dumped,omitempty"`
	ElapsedSeconds float64  `json:"elapsed_s,omitempty"`
	RequestsPerSec float64  `json:"requests_per_s,omitempty"`
	ThroughputMBps float64  `json:"throughput_MBps,omitempty"`
	// trace with --capacity or --memory: the tiers and what they did. PeakUsedBytes is the
	// highest accounted bytes of the disk tier sampled during the run (active segments at
	// their full reservation); CapacityExceededBy is PeakUsedBytes − CapacityBytes when
	// positive (at most one segment by design).
	CapacityBytes   int64  `json:"capacity_bytes,omitempty"`
	MemoryBytes     int64  `json:"memory_bytes,omitempty"`
	EvictedBlocks   *int64 `json:"evicted_blocks,omitempty"`
	SegmentsRetired *int64 `json:"segments_retired,omitempty"`
	// SegmentsRecycled counts segments created in a retired segment's file (--recycle-segments;
	// seq and layerwise with --recycled: during the timed dump).
	SegmentsRecycled   *int64 `json:"segments_recycled,omitempty"`
	PeakUsedBytes      int64  `json:"peak_used_bytes,omitempty"`
	CapacityExceededBy *int64 `json:"capacity_exceeded_by_bytes,omitempty"`
	MemoryHits         *int64 `json:"memory_hits,omitempty"`
	ReloadMisses       int64  `json:"evicted_before_load,omitempty"`

	// seq, layerwise: the process's CPU time (user and system) during the timed dump and
	// load (the engine and the bench's in-line checks; layerwise: the first order's).
	DumpCPUSeconds float64 `json:"dump_cpu_s,omitempty"`
	LoadCPUSeconds float64 `json:"load_cpu_s,omitempty"`

	// --fio.
	Fio          []fioRun `json:"fio,omitempty"`
	FioWriteMBps float64  `json:"fio_write_MBps,omitempty"`
	FioReadMBps  float64  `json:"fio_read_MBps,omitempty"`
	DumpRatio    float64  `json:"dump_ratio,omitempty"`
	LoadRatio    float64  `json:"load_ratio,omitempty"`
	FioNote      string   `json:"fio_note,omitempty"`
	// The durable limit: fio's sequential write with an fdatasync every SyncBytes (the
	// engine's mean record bytes per fdatasync in the round's dump, --sync always), and the
	// dump against it. The plain write job syncs once, at its end.
	SyncBytes           int64   `json:"sync_bytes,omitempty"`
	FioDurableWriteMBps float64 `json:"fio_durable_write_MBps,omitempty"`
	DumpDurableRatio    float64 `json:"dump_durable_ratio,omitempty"`
	// seq: what the timed dump and load issued to the device (requests, sizes, flushes, depth).
	DumpIO *ioShape `json:"dump_io,omitempty"`
	LoadIO *ioShape `json:"load_io,omitempty"`
	// FioBefore and FioAfter are fio's figures just before and just after the round
	// (--fio-bracket): the fio rates above are then their means.
	FioBefore *fioFigures `json:"fio_before,omitempty"`
	FioAfter  *fioFigures `json:"fio_after,omitempty"`

	// Compression is the --compression option; CompressRatio the raw block bytes over the stored
	// payload bytes of the blocks left in the store (compression runs only).
	Compression   string  `json:"compression"`
	CompressRatio float64 `json:"compress_ratio,omitempty"`

	// Rounds holds each round's figures when --rounds > 1; the fields above are then the
	// medians over the rounds (the ratios: the median of each round's own ratio).
	Rounds []roundResult `json:"rounds,omitempty"`

	// Layerwise holds each order's figures of a layerwise run (connector, random); DumpMBps,
	// LoadMBps and the ratios above are the first order's. StagingPeakBytes and
	// StagingPeakBlocks are the engine's staging high-water marks during the (first order's)
	// dump, MaxStagingBytes its bound; FioRandReadMBps is fio's random reads of one shard and
	// LoadRandRatio the load against it (LoadRatio is against fio's 2 MiB sequential reads).
	Layerwise         []layerwiseOrder `json:"layerwise,omitempty"`
	StagingPeakBytes  int64            `json:"staging_peak_bytes,omitempty"`
	StagingPeakBlocks int64            `json:"staging_peak_blocks,omitempty"`
	MaxStagingBytes   int64            `json:"max_staging_bytes,omitempty"`
	FioRandReadMBps   float64          `json:"fio_randread_MBps,omitempty"`
	LoadRandRatio     float64          `json:"load_randread_ratio,omitempty"`

	// Mooncake is the mooncake workload's figures (workload_mooncake.go).
	Mooncake *mooncakeBench `json:"mooncake,omitempty"`
	// Shared is the shared-capacity workload's figures.
	Shared *sharedBench `json:"shared,omitempty"`

	Verified bool `json:"verified"`

	dumpTime, loadTime time.Duration
	mismatch           string // first problem found
	notes              []string
}

// roundResult is one round of a --rounds run: the workload and fio around it, in the same
// minutes.
type roundResult struct {
	DumpMBps       float64 `json:"dump_MBps,omitempty"`
	LoadMBps       float64 `json:"load_MBps,omitempty"`
	DumpCPUSeconds float64 `json:"dump_cpu_s,omitempty"`
	LoadCPUSeconds float64 `json:"load_cpu_s,omitempty"`
	OpenSeconds    float64 `json:"open_s,omitempty"`
	FioWriteMBps   float64 `json:"fio_write_MBps,omitempty"`
	FioReadMBps    float64 `json:"fio_read_MBps,omitempty"`
	DumpRatio      float64 `json:"dump_ratio,omitempty"`
	LoadRatio      float64 `json:"load_ratio,omitempty"`
	// The durable limit and the dump against it (benchResult.FioDurableWriteMBps).
	FioDurableWriteMBps float64 `json:"fio_durable_write_MBps,omitempty"`
	DumpDurableRatio    float64 `json:"dump_durable_ratio,omitempty"`
	// layerwise: fio's random reads of one shard, and each order's figures.
	FioRandReadMBps float64          `json:"fio_randread_MBps,omitempty"`
	Layerwise       []layerwiseOrder `json:"layerwise,omitempty"`
	// FioBefore and FioAfter: fio just before and just after the round (--fio-bracket).
	FioBefore *fioFigures `json:"fio_before,omitempty"`
	FioAfter  *fioFigures `json:"fio_after,omitempty"`
}

// crashReport is the engine's recovery report for the crash copy, in JSON-friendly units.
type crashReport struct {
	SegmentsRecovered int     `json:"segments_recovered"`
	TruncatedBytes    int64   `json:"truncated_bytes"`
	EntriesDropped    int     `json:"entries_dropped"`
	OrphansRemoved    int     `json:"orphans_removed"`
	Seconds           float64 `json:"recovery_s"`
	BlocksAfter       int64   `json:"blocks_after"`
}

func newBenchCmd(tc *cliutil.Config, stdout, stderr io.Writer) *cobra.Command {
	var cfg benchConfig
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure dump, load, lookup, open and trace-replay performance on a scratch store",
		Long: `bench creates a store under DIR (removing only its own bench-* subdirectory first),
runs a workload on it and prints a table, or one JSON object with --json. Payloads are a
deterministic function of the block id (a shared body with every 4 KiB page stamped with
the block id and page number) and every loaded byte is verified: seq and layerwise check
each page's stamp during the timed load (the engine checks its CRCs) and, after the timing,
load every block again and compare it byte for byte.

Workloads:
  seq        dump --total bytes of whole blocks, close, reopen (timed), load them all back.
             Loads are fresh reads: O_DIRECT, or with --direct off the page cache is dropped
             first when running as root.
  layerwise  the same with one shard per task, as a layer-wise connector does (32–80 shards
             of 16 KiB–1 MiB are typical), in two orders (--order, default both, each on a
             fresh store). connector: the blocks are split into requests (1..--request-max-blocks
             long, uniformly, or the --trace's request lengths); a request dumps shard i of all
             its blocks in one task, i = 0..L-1, and later loads them the same way, every layer's
             load issued at once and waited for in layer order (as UCM's start_load_kv and
             wait_for_layer_load; --layers-in-flight N bounds them), --concurrency requests at
             a time. random: groups of --batch
             blocks dumped shard by shard, shards loaded in random order across groups. Each
             order reports its rates and the engine's staging memory high-water mark (bounded
             by --max-staging). A request's layers are written as layer-major batch records
             (--stage-layer-wise: whole blocks assembled in staging memory, the format before
             them); --timings adds where the dump's flights and the load's tasks spent their
             time and the device queue sampled every millisecond. The tasks' buffers hold a
             request's shards of one layer slot after slot (--host-layout layer, as the
             staging pipeline holds a layer), or a buffer per block (--host-layout block).
  lookup     index --blocks blocks (default 1,000,000; a tiny 1 × 4 KiB layout, sync none,
             1024 blocks per task unless set), reopen, then time --batches batches of 1024
             mixed hit/miss exact lookups and as many prefix lookups (p50/p99 per batch).
  open       index --blocks blocks the same way, copy the store while the engine is still
             open (the copy is what a crash leaves: an unsealed active segment and an
             unflushed index WAL), close it, then time Open of the clean store and of the copy.
  shared-capacity
             --instances instances (own store directories) share one tier of --capacity
             (default 64 MiB, 4 MiB segments) and each dumps --total (default 64 MiB) of 256 KiB
             blocks at once. Reports the bytes on the shared volume sampled every 10 ms against
             the capacity and the bound the admission keeps (capacity + one segment per
             instance; the run fails above it), the blocks refused for lack of room, how soon
             the next instance finds a block after its dump's Wait (p50/p99), lookups/s of all
             instances at once, and loads of other instances' blocks checked byte for byte.
  trace      replay a Mooncake-format JSONL trace (--trace) as a connector would: look up each
             prompt's prefix, load the leading run of hits, dump the rest. --block-size is
             the bytes stored per hash id (one 512-token block). Requests run in order,
             --concurrency at a time (1: strictly sequential), ignoring timestamps unless
             --realtime. --capacity bounds the store's disk tier (the least recently used
             segments are evicted beyond it) and --memory puts a memory tier in front; the
             report then adds the capacity, the peak accounted bytes sampled during the run
             and by how much it exceeded the capacity (at most one segment by design), the
             blocks evicted, segments retired and how many new segments reused their
             files (--recycle-segments). Pick --segment-size well below --capacity.

--fio runs fio (apt-get install fio) on a file in --dir with the same block size, direct
flag, I/O engine and size, at --fio-iodepth and at 64, from malloc buffers and, where
hugetlb pages are reserved (sysctl -w vm.nr_hugepages=160), from huge pages as the engine's
buffers are, and prints engine/fio ratios against the best of these: seq compares dump with
fio sequential writes and load with sequential reads; layerwise compares dump with 2 MiB
sequential writes and load with 2 MiB sequential reads (the disk's sequential speed) and
with random reads of one shard. fio runs after every round and, with --fio-bracket (the
default), once more before the first: each round is compared with the mean of the fio runs
just before and just after it, which cancels the drift of a disk whose speed moves from one
minute to the next (the shared development VMs' moves by a third between rounds).

--recycled (seq, layerwise) measures a store at capacity: before the timed dump the store is
filled with as many other blocks, which are then all evicted, so the timed dump writes into
the segment files they leave (recycled, their blocks allocated and written) instead of new
ones; fio then overwrites a file it wrote first. On ext4 a write into a new file also pays for
converting its unwritten extents in the journal (here 0.5-0.7 of the rate of an overwrite, for
fio as for the engine).

Sizes accept plain bytes or K/KiB, M/MiB, G/GiB, T/TiB (binary units). MB/s is 10^6 bytes
per second. Dump time runs from the first dump task to the last one's completion (durable
per --sync); load time includes the in-line byte comparison.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			w, ok := workloads[cfg.workload]
			if !ok {
				return cliutil.UsageErr("--workload %q: unknown workload (available: %s)", cfg.workload, workloadNames())
			}
			// Flags the user did not set: the workload's own defaults, then the configuration's
			// values for the others.
			fl := cmd.Flags()
			if err := benchDefaults(tc, fl, w().defaults()); err != nil {
				return err
			}
			for name, val := range w().defaults() {
				if !fl.Changed(name) {
					if err := fl.Set(name, val); err != nil {
						return cliutil.UsageErr("--%s: %v", name, err)
					}
				}
			}
			return runBench(cfg, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.dir, "dir", "./ucm-data", "directory for the bench store (only its bench-* subdirectories are replaced)")
	fl.StringVar(&cfg.workload, "workload", "seq", "workload to run: "+workloadNames())
	fl.Var(cliutil.SizeFlag(&cfg.blockBytes, "2MiB"), "block-size", "bytes of a whole block (trace: bytes stored per hash id; lookup, open: default 4KiB)")
	fl.IntVar(&cfg.shards, "shards", 32, "shards per block (block size / shards = shard bytes, K and V tensors; lookup, open, trace: default 1)")
	fl.Var(cliutil.SizeFlag(&cfg.total, "2GiB"), "total", "seq, layerwise: bytes dumped and loaded (total / block size blocks)")
	fl.IntVar(&cfg.blocks, "blocks", 1_000_000, "lookup, open: blocks indexed")
	fl.IntVar(&cfg.instances, "instances", 4, "shared-capacity: instances sharing the tier, each dumping --total")
	fl.IntVar(&cfg.concurrency, "concurrency", 16, "dump/load tasks (trace: requests) in flight; 16 tasks of 4 blocks keep 64 I/Os in flight, matching fio at iodepth 64")
	fl.IntVar(&cfg.batch, "batch", 4, "blocks per task (lookup, open: default 1024)")
	fl.IntVar(&cfg.batches, "batches", 2000, "lookup: batches of 1024 ids timed, of each kind")
	fl.BoolVar(&cfg.mapBaseline, "map-baseline", false, "lookup: also time a Go map of the stored ids answering each exact batch right before or after the engine (alternately) and report the engine's rate over the map's (lookup_map_ratio)")
	fl.Var(cliutil.NewParsedFlag(&cfg.ioEngine, "engine", "auto", devio.ParseIOEngine), "io-engine", "I/O backend: auto, uring or psync")
	fl.Var(cliutil.NewParsedFlag(&cfg.direct, "mode", "auto", devio.ParseDirectMode), "direct", "O_DIRECT: auto, on or off")
	fl.Var(cliutil.NewParsedFlag(&cfg.sync, "policy", "always", wal.ParseSyncPolicy), "sync", "sync policy: always, interval or none (lookup, open: default none)")
	fl.Var(cliutil.NewParsedFlag(&cfg.segmentSize, "size", "auto", cliutil.ParseSizeOrAuto), "segment-size", "segment file size (auto: the engine's choice from the capacity, engine.SegmentSizeFor)")
	fl.IntVar(&cfg.recycle, "recycle-segments", 0, fmt.Sprintf("retired segment files kept per directory for reuse by new segments (0: the engine's default, %d; -1: none)", engine.DefaultRecycleSegments))
	fl.BoolVar(&cfg.recycled, "recycled", false, "seq, layerwise: dump into recycled segment files, as a store at capacity does: the store is first filled with --total of other blocks, which are all evicted (untimed), and fio overwrites a file it wrote before instead of writing a new one")
	fl.Uint64Var(&cfg.seed, "seed", 1, "seed of the random orders and lookup mixes")
	fl.BoolVar(&cfg.fio, "fio", false, "also run fio with the same parameters and print engine/fio ratios (seq, layerwise)")
	fl.IntVar(&cfg.queueDepth, "queue-depth", engine.DefaultQueueDepth, "engine I/O operations in flight (Options.QueueDepth)")
	fl.StringVar(&cfg.buffers, "buffers", "huge", "where the tasks' payload buffers live: huge (host memory in transparent huge pages, as a connector's pinned KV buffers) or heap (Go heap, 4 KiB pages)")
	fl.Var(cliutil.SizeFlag(&cfg.bufferSpan, "0"), "buffer-span", "seq: the tasks' buffers span at least this much memory, each task cycling through its share batch by batch, as loads land all over a connector's KV buffers (0: one batch's worth per task)")
	fl.IntVar(&cfg.rounds, "rounds", 1, "seq, layerwise: run the workload (then fio, with --fio) this many times and report medians, each ratio taken within its round")
	fl.BoolVar(&cfg.fioBracket, "fio-bracket", true, "with --fio: also run fio before the first round, and take each round's ratios against the mean of fio just before and just after it")
	fl.IntVar(&cfg.fioIODepth, "fio-iodepth", 16, "fio queue depth (fio also runs at 64; the better is the denominator, for reads of the runs whose buffers span the tasks')")
	fl.StringVar(&cfg.tracePath, "trace", "", "trace: the JSONL request trace (timestamp, input_length, output_length, hash_ids)")
	fl.Var(cliutil.SizeFlag(&cfg.capacity, "0"), "capacity", "trace, lookup, open: capacity of the store's disk tier in bytes (0: unlimited); the least recently used segments are evicted beyond it (lookup, open: measures what recency tracking costs)")
	fl.Var(cliutil.SizeFlag(&cfg.memory, "0"), "memory", "trace: bytes of a memory tier in front of the disk tier (0: none)")
	fl.BoolVar(&cfg.realtime, "realtime", false, "trace: issue requests at their timestamps instead of back to back")
	fl.Var(cliutil.NewParsedFlag(&cfg.compression, "kind", "off", engine.ParseCompression), "compression", "block compression: off or lz4 (lz4 runs use KV-shaped bf16 payloads, which compress like real KV)")
	fl.Float64Var(&cfg.minSaving, "compress-min-saving", engine.DefaultCompressMinSaving, "lz4: fraction of a record's payload compression must save to be kept")
	fl.BoolVar(&cfg.json, "json", false, "print one JSON object")
	fl.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the workload (not of fio) to this file")
	fl.StringVar(&cfg.order, "order", orderBoth, "layerwise: connector (requests layer by layer, as UCM's layer-wise connector), random (shards of --batch-block groups in random order) or both (connector, then random, each on a fresh store)")
	fl.IntVar(&cfg.requestMaxBlocks, "request-max-blocks", 64, "layerwise, connector order: requests are 1..N blocks long, uniformly (with --trace: the trace's request lengths, capped at N)")
	fl.Var(cliutil.SizeFlag(&cfg.maxStaging, "0"), "max-staging", "layerwise: memory for partly dumped blocks (Options.MaxStagingBytes; 0: the engine's default)")
	fl.IntVar(&cfg.layersInFlight, "layers-in-flight", 0, "layerwise, connector order: layers of a request whose loads are in flight at once, waited for in layer order (0: all, as UCM's start_load_kv issues them; 1: one at a time)")
	fl.StringVar(&cfg.hostLayout, "host-layout", hostLayoutLayer, "layerwise: how the caller's buffers hold the shards: layer (a request's shards of one layer adjacent, slot after slot, as kernels.Pipeline stages a layer) or block (a buffer per block, its shards adjacent: a layer's shards of a request are a block apart)")
	fl.BoolVar(&cfg.stageLayerWise, "stage-layer-wise", false, "layerwise: assemble whole blocks in staging memory and write block records (Options.StageLayerWise) instead of layer-major batch records")
	fl.BoolVar(&cfg.timings, "timings", false, "layerwise: report where the dump's flights and the load's tasks spent their time, and the device queue sampled every millisecond")
	return cmd
}

// benchTiers returns the bench store's tiers: none (the default unlimited disk tier) unless
// --capacity or --memory is set, else an optional memory tier and one disk tier in the store
// directory with --capacity.
func benchTiers(cfg benchConfig, storeDir string) []tiers.Config {
	if cfg.capacity == 0 && cfg.memory == 0 {
		return nil
	}
	var ts []tiers.Config
	if cfg.memory > 0 {
		ts = append(ts, tiers.Config{Name: "memory", Kind: tiers.KindMemory, Capacity: cfg.memory})
	}
	return append(ts, tiers.Config{Name: "disk", Kind: tiers.KindDisk, Paths: []string{storeDir}, Capacity: cfg.capacity})
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
		return cliutil.UsageErr("%v", err)
	}
	w := workloads[cfg.workload]()
	switch {
	case cfg.concurrency < 1:
		return cliutil.UsageErr("--concurrency %d: want at least 1", cfg.concurrency)
	case cfg.batch < 1:
		return cliutil.UsageErr("--batch %d: want at least 1", cfg.batch)
	case cfg.segmentSize != 0 && (cfg.segmentSize < engine.MinSegmentSize || cfg.segmentSize%format.Alignment != 0):
		return cliutil.UsageErr("--segment-size %d: want a multiple of %d of at least %s", cfg.segmentSize, format.Alignment, cliutil.FormatSize(engine.MinSegmentSize))
	case cfg.queueDepth < 1 || cfg.queueDepth > 4096:
		return cliutil.UsageErr("--queue-depth %d: want 1 to 4096", cfg.queueDepth)
	case cfg.fioIODepth < 1:
		return cliutil.UsageErr("--fio-iodepth %d: want at least 1", cfg.fioIODepth)
	case cfg.buffers != "huge" && cfg.buffers != "heap":
		return cliutil.UsageErr("--buffers %q: want huge or heap", cfg.buffers)
	case cfg.rounds < 1:
		return cliutil.UsageErr("--rounds %d: want at least 1", cfg.rounds)
	case cfg.bufferSpan < 0:
		return cliutil.UsageErr("--buffer-span %d: want 0 (one batch per task) or more", cfg.bufferSpan)
	case cfg.bufferSpan > 0 && cfg.workload != "seq":
		return cliutil.UsageErr("--buffer-span: only the seq workload cycles through its buffers")
	case cfg.rounds > 1 && cfg.workload != "seq" && cfg.workload != "layerwise":
		return cliutil.UsageErr("--rounds: only the seq and layerwise workloads repeat")
	case cfg.capacity != 0 && cfg.workload != "trace" && cfg.workload != "lookup" && cfg.workload != "open" && cfg.workload != "shared-capacity":
		return cliutil.UsageErr("--capacity: only the trace, lookup, open and shared-capacity workloads take a capacity")
	case cfg.memory != 0 && cfg.workload != "trace":
		return cliutil.UsageErr("--memory: only the trace workload takes a memory tier")
	case cfg.maxStaging < 0:
		return cliutil.UsageErr("--max-staging %d: want 0 (the default) or more", cfg.maxStaging)
	case cfg.layersInFlight < 0:
		return cliutil.UsageErr("--layers-in-flight %d: want 0 (all) or more", cfg.layersInFlight)
	case cfg.hostLayout != hostLayoutBlock && cfg.hostLayout != hostLayoutLayer:
		return cliutil.UsageErr("--host-layout %q: want %s or %s", cfg.hostLayout, hostLayoutBlock, hostLayoutLayer)
	}
	if ts := benchTiers(cfg, "bench"); ts != nil {
		if err := tiers.Validate(ts); err != nil {
			return cliutil.UsageErr("--capacity/--memory: %v", err)
		}
	}
	blocks, err := w.blocks(cfg, l)
	if err != nil {
		return cliutil.UsageErr("%v", err)
	}
	name := fmt.Sprintf("bench-%s-%s-%d", cfg.workload, cliutil.FormatSize(l.BlockBytes()), l.Shards)
	if cfg.workload == "seq" {
		name = fmt.Sprintf("bench-%s-%d", cliutil.FormatSize(l.BlockBytes()), l.Shards) // as before
	}
	storeDir := filepath.Join(cfg.dir, name)
	if err := os.MkdirAll(cfg.dir, 0o755); err != nil {
		return cliutil.UsageErr("--dir: %v", err)
	}
	opts := engine.Options{Layout: l, Schema: benchSchema, SegmentSize: cfg.segmentSize, SyncPolicy: cfg.sync,
		IOEngine: cfg.ioEngine, DirectIO: cfg.direct, Compression: cfg.compression, QueueDepth: cfg.queueDepth,
		CompressMinSaving: cfg.minSaving, Tiers: benchTiers(cfg, storeDir), RecycleSegments: cfg.recycle,
		MaxStagingBytes: cfg.maxStaging, StageLayerWise: cfg.stageLayerWise}
	if cfg.recycled && cfg.recycle == 0 {
		opts.RecycleSegments = engine.MaxRecycleSegments // every file the fill retires, for the timed dump
	}
	var timings *timingCollector
	if cfg.timings {
		timings = &timingCollector{}
		opts.OnFlight, opts.OnLoad = timings.onFlight, timings.onLoad
	}
	payload := newPayloadPool(l.BlockBytes())
	if cfg.compression != engine.CompressionOff {
		payload = newKVPayloadPool(l.BlockBytes())
	}
	env := &benchEnv{cfg: cfg, blocks: blocks, payload: payload, storeDir: storeDir, opts: opts,
		stderr: stderr, timings: timings}
	maxStagingBytes := int64(0)
	if cfg.workload == "layerwise" {
		maxStagingBytes = cfg.maxStaging
		if maxStagingBytes == 0 {
			maxStagingBytes = engine.DefaultMaxStagingBytes
		}
	}
	newResult := func() *benchResult {
		return &benchResult{Workload: cfg.workload, BlockBytes: l.BlockBytes(), Shards: l.Shards, ShardBytes: l.ShardBytes,
			Blocks: blocks, TotalBytes: int64(blocks) * l.BlockBytes(), Sync: cfg.sync.String(),
			Concurrency: cfg.concurrency, Batch: cfg.batch, Compression: cfg.compression.String(), MaxStagingBytes: maxStagingBytes,
			Checksum: crc32c.Implementation()}
	}
	if !cfg.json {
		fmt.Fprintf(stderr, "bench: %s workload, %d blocks of %s into %s ...\n", cfg.workload, blocks, cliutil.FormatSize(l.BlockBytes()), storeDir)
	}
	var (
		rounds  []*benchResult
		lastFio *fioFigures // fio's figures just before the next round (--fio-bracket)
	)
	if cfg.fio && cfg.fioBracket {
		res := newResult()
		if err := probeIOEngine(env, res); err != nil {
			return &cliutil.ExitError{Code: cliutil.ExitUsage, Err: fmt.Errorf("bench %s: %w", cfg.workload, err)}
		}
		fig, note, err := measureFio(cfg, res, stderr)
		if err != nil {
			return &cliutil.ExitError{Code: cliutil.ExitProblems, Err: fmt.Errorf("bench %s: fio: %w", cfg.workload, err)}
		}
		if note != "" && !cfg.json {
			fmt.Fprintf(stderr, "bench: %s\n", note)
		}
		lastFio = fig
	}
	for r := 0; r < cfg.rounds; r++ {
		if cfg.rounds > 1 && !cfg.json {
			fmt.Fprintf(stderr, "bench: round %d of %d ...\n", r+1, cfg.rounds)
		}
		if err := os.RemoveAll(storeDir); err != nil { // every round starts from an empty store
			return cliutil.UsageErr("remove the previous bench store %s: %v", storeDir, err)
		}
		settleFS(cfg.dir)
		res := newResult()
		profile := ""
		if r == 0 {
			profile = cfg.cpuProfile
		}
		stopProfile, err := startCPUProfile(profile)
		if err != nil {
			return cliutil.UsageErr("--cpuprofile: %v", err)
		}
		err = w.run(env, res)
		stopProfile()
		res.Buffers, res.HostBufferBytes = env.buffers, env.bufferBytes
		if err != nil {
			code := cliutil.ExitProblems
			if errors.As(err, new(*cliutil.ExitError)) {
				code = cliutil.ExitUsage // the store could not be opened (bad option for this machine)
			}
			return &cliutil.ExitError{Code: code, Err: fmt.Errorf("bench %s: %w", cfg.workload, err)}
		}
		if cfg.compression != engine.CompressionOff {
			res.CompressRatio = storedRatio(storeDir)
		}
		if cfg.fio {
			fig, note, err := measureFio(cfg, res, stderr)
			if err != nil {
				return &cliutil.ExitError{Code: cliutil.ExitProblems, Err: fmt.Errorf("bench %s: fio: %w", cfg.workload, err)}
			}
			res.FioNote = note
			applyFio(res, lastFio, fig)
			if cfg.fioBracket {
				lastFio = fig // the next round's "before"
			}
		}
		rounds = append(rounds, res)
		if !res.Verified {
			break
		}
	}
	res := combineRounds(rounds)
	if cfg.json {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		printBench(stdout, storeDir, res)
	}
	if !res.Verified {
		return &cliutil.ExitError{Code: cliutil.ExitProblems, Err: fmt.Errorf("bench: verification failed: %s", res.mismatch)}
	}
	return nil
}

// combineRounds returns the result of a run of one or more rounds: the only round as it is,
// or the last round's result with every rate, time and ratio replaced by its median over the
// rounds, each round's figures in Rounds, and Verified only if every round verified.
func combineRounds(rounds []*benchResult) *benchResult {
	last := rounds[len(rounds)-1]
	if len(rounds) == 1 {
		return last
	}
	res := *last
	res.Fio, res.FioBefore, res.FioAfter = nil, nil, nil // each round's fio figures are in Rounds
	res.Rounds = make([]roundResult, len(rounds))
	for i, r := range rounds {
		res.Rounds[i] = roundResult{DumpMBps: r.DumpMBps, LoadMBps: r.LoadMBps, DumpCPUSeconds: r.DumpCPUSeconds,
			LoadCPUSeconds: r.LoadCPUSeconds, OpenSeconds: r.OpenSeconds,
			FioWriteMBps: r.FioWriteMBps, FioReadMBps: r.FioReadMBps, DumpRatio: r.DumpRatio, LoadRatio: r.LoadRatio,
			FioDurableWriteMBps: r.FioDurableWriteMBps, DumpDurableRatio: r.DumpDurableRatio,
			FioRandReadMBps: r.FioRandReadMBps, Layerwise: r.Layerwise, FioBefore: r.FioBefore, FioAfter: r.FioAfter}
		if !r.Verified && res.Verified {
			res.Verified, res.mismatch = false, r.mismatch
		}
	}
	med := func(f func(roundResult) float64) float64 {
		vs := make([]float64, len(res.Rounds))
		for i, r := range res.Rounds {
			vs[i] = f(r)
		}
		return median(vs)
	}
	res.DumpMBps = med(func(r roundResult) float64 { return r.DumpMBps })
	res.LoadMBps = med(func(r roundResult) float64 { return r.LoadMBps })
	res.DumpCPUSeconds = med(func(r roundResult) float64 { return r.DumpCPUSeconds })
	res.LoadCPUSeconds = med(func(r roundResult) float64 { return r.LoadCPUSeconds })
	res.OpenSeconds = med(func(r roundResult) float64 { return r.OpenSeconds })
	res.FioWriteMBps = med(func(r roundResult) float64 { return r.FioWriteMBps })
	res.FioReadMBps = med(func(r roundResult) float64 { return r.FioReadMBps })
	res.DumpRatio = med(func(r roundResult) float64 { return r.DumpRatio })
	res.LoadRatio = med(func(r roundResult) float64 { return r.LoadRatio })
	res.FioDurableWriteMBps = med(func(r roundResult) float64 { return r.FioDurableWriteMBps })
	res.DumpDurableRatio = med(func(r roundResult) float64 { return r.DumpDurableRatio })
	res.FioRandReadMBps = med(func(r roundResult) float64 { return r.FioRandReadMBps })
	res.dumpTime, res.loadTime = 0, 0
	res.LoadRandRatio, res.StagingPeakBytes, res.StagingPeakBlocks = 0, 0, 0
	// Each layerwise order: the medians of its rounds' figures; the staging peaks are the
	// highest of any round, the timings the last round's.
	res.Layerwise = nil
	for k := range last.Layerwise {
		o := last.Layerwise[k]
		o.dumpTime, o.loadTime = 0, 0
		of := func(f func(layerwiseOrder) float64) float64 {
			return med(func(r roundResult) float64 {
				if k < len(r.Layerwise) {
					return f(r.Layerwise[k])
				}
				return 0
			})
		}
		o.DumpMBps = of(func(o layerwiseOrder) float64 { return o.DumpMBps })
		o.LoadMBps = of(func(o layerwiseOrder) float64 { return o.LoadMBps })
		o.DumpCPUSeconds = of(func(o layerwiseOrder) float64 { return o.DumpCPUSeconds })
		o.LoadCPUSeconds = of(func(o layerwiseOrder) float64 { return o.LoadCPUSeconds })
		o.DumpRatio = of(func(o layerwiseOrder) float64 { return o.DumpRatio })
		o.DumpDurableRatio = of(func(o layerwiseOrder) float64 { return o.DumpDurableRatio })
		o.LoadRatio = of(func(o layerwiseOrder) float64 { return o.LoadRatio })
		o.LoadRandRatio = of(func(o layerwiseOrder) float64 { return o.LoadRandRatio })
		for _, r := range res.Rounds {
			if k < len(r.Layerwise) {
				o.StagingPeakBytes = max(o.StagingPeakBytes, r.Layerwise[k].StagingPeakBytes)
				o.StagingPeakBlocks = max(o.StagingPeakBlocks, r.Layerwise[k].StagingPeakBlocks)
			}
		}
		res.Layerwise = append(res.Layerwise, o)
	}
	if len(res.Layerwise) > 0 {
		first := res.Layerwise[0]
		res.LoadRandRatio, res.StagingPeakBytes, res.StagingPeakBlocks = first.LoadRandRatio, first.StagingPeakBytes, first.StagingPeakBlocks
	}
	return &res
}

// median returns the median of vs (the mean of the middle two for an even count); vs is
// reordered.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// newKVPayloadPool is newPayloadPool with a KV-shaped body (bf16, normal values with per-channel
// scales; internal/kvgen) instead of random bytes: what compression runs need, as random bytes
// never compress and regular patterns compress far better than real KV. Stamps and checks are
// the same.
func newKVPayloadPool(blockBytes int64) *payloadPool {
	b := make([]byte, blockBytes)
	kvgen.Fill(b, kvgen.BF16, payloadSeed)
	return &payloadPool{body: b}
}

// storedRatio returns the raw block bytes over the stored payload bytes of the store in dir
// (0 if it cannot be opened or is empty).
func storedRatio(dir string) float64 {
	e, err := engine.Open(dir, engine.Options{AdoptStoredSchema: true, ReadOnly: true})
	if err != nil {
		return 0
	}
	defer func() { _ = e.Close() }()
	st := e.Stats()
	stored := st.LiveBytes - st.Blocks*format.RecordHeaderSize
	if st.Blocks == 0 || stored <= 0 {
		return 0
	}
	return float64(st.Blocks*e.Layout().BlockBytes()) / float64(stored)
}

func printBench(w io.Writer, storeDir string, r *benchResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("store", "%s", storeDir)
	row("workload", "%s", r.Workload)
	row("block size", "%s (%d bytes)", cliutil.FormatSize(r.BlockBytes), r.BlockBytes)
	row("shards", "%d x %s", r.Shards, cliutil.FormatSize(r.ShardBytes))
	row("blocks", "%d", r.Blocks)
	row("total", "%s (%d bytes)", cliutil.HumanBytes(r.TotalBytes), r.TotalBytes)
	row("tasks", "%d in flight, %d blocks each", r.Concurrency, r.Batch)
	if r.Compression != engine.CompressionOff.String() {
		row("compression", "%s, ratio %.3f (raw / stored payload bytes)", r.Compression, r.CompressRatio)
	}
	row("io engine", "%s", r.IOEngine)
	direct := "on (O_DIRECT: loads read the device, no page cache)"
	if !r.Direct {
		direct = "off (loads may be served from the page cache)"
		if r.CachesDropped {
			direct = "off (page cache dropped before loading)"
		}
	}
	row("direct", "%s", direct)
	row("sync", "%s", r.Sync)
	row("checksum", "CRC32C by %s", r.Checksum)
	if r.Buffers != "" {
		span := ""
		if r.HostBufferBytes > 0 {
			span = fmt.Sprintf(", %s in all (fio's reads count runs whose buffers span as much, or its largest)", cliutil.FormatSize(r.HostBufferBytes))
		}
		row("buffers", "%s%s", r.Buffers, span)
	}
	if r.HostLayout != "" {
		row("layout", "%s (--host-layout)", r.HostLayout)
	}
	if r.IndexSeconds > 0 {
		row("index", "%.2f s to dump %d blocks", r.IndexSeconds, r.Blocks)
	}
	if len(r.Rounds) > 0 {
		row("rounds", "%d (dump, load, open and fio: medians; ratios: median of each round's ratio)", len(r.Rounds))
	}
	if r.DumpMBps > 0 {
		row("dump", "%.1f MB/s%s%s%s%s", r.DumpMBps, elapsed(r.dumpTime), cpuText(r.DumpCPUSeconds, r.TotalBytes), ratioText(r.DumpRatio, r.FioWriteMBps, "write"),
			durableText(r.DumpDurableRatio, r.FioDurableWriteMBps, r.SyncBytes))
		if r.DumpIO != nil {
			row("dump i/o", "%s", r.DumpIO)
		}
	}
	if r.OpenSeconds > 0 {
		what := "reopen before loading"
		switch r.Workload {
		case "open":
			what = "clean store"
		case "lookup":
			what = "reopen before the lookups"
		}
		row("open", "%.3f s (%s)", r.OpenSeconds, what)
	}
	if c := r.CrashRecovery; c != nil {
		row("open after crash", "%.3f s (recovered %d segment(s), cut %d bytes, dropped %d entries; %d blocks after)",
			r.OpenCrashSeconds, c.SegmentsRecovered, c.TruncatedBytes, c.EntriesDropped, c.BlocksAfter)
	}
	if r.RSSBytesPerBlock != 0 || r.HeapBytesPerBlk != 0 {
		row("memory", "%.0f bytes/block resident (VmRSS), %.0f bytes/block Go heap, once the membership is built", r.RSSBytesPerBlock, r.HeapBytesPerBlk)
	}
	if r.MembersReadySeconds > 0 {
		row("membership", "built %.3f s after Open began; a first lookup of %d ids right after Open took %.3f ms", r.MembersReadySeconds, r.LookupBatch, r.FirstLookupMs)
	}
	if r.LoadMBps > 0 {
		row("load", "%.1f MB/s%s%s%s", r.LoadMBps, elapsed(r.loadTime), cpuText(r.LoadCPUSeconds, r.TotalBytes), ratioText(r.LoadRatio, r.FioReadMBps, "read"))
		if r.LoadIO != nil {
			row("load i/o", "%s", r.LoadIO)
		}
	}
	if r.LookupBatches > 0 {
		row("lookup", "p50 %.3f ms, p99 %.3f ms per batch of %d (%.0f%% hits); %.1f M ids/s",
			r.P50LookupBatchMs, r.P99LookupBatchMs, r.LookupBatch, 100*r.LookupHitFraction, r.LookupsPerSec/1e6)
		if r.LookupMapRatio > 0 {
			row("map baseline", "%.1f M ids/s from a Go map of the stored ids, same batches interleaved; engine / map %.2f", r.MapLookupsPerSec/1e6, r.LookupMapRatio)
		}
		row("prefix lookup", "p50 %.3f ms, p99 %.3f ms per batch of %d (%.0f%% of ids in the leading run)",
			r.P50PrefixBatchMs, r.P99PrefixBatchMs, r.LookupBatch, 100*r.PrefixHitFraction)
	}
	for _, o := range r.Layerwise {
		printLayerwiseOrder(row, r, o)
	}
	if r.Mooncake != nil {
		printMooncake(row, r.Mooncake)
	}
	if r.Shared != nil {
		printShared(row, r.Shared)
	}
	if r.Workload == "trace" {
		row("trace", "%s: %d requests, %d prompt blocks", r.TraceFile, r.Requests, r.PromptBlocks)
		row("hit rate", "%.4f (%d of %d prompt blocks loaded as a leading run of hits)", *r.HitRate, r.HitBlocks, r.PromptBlocks)
		row("token hit rate", "%.4f", r.TokenHitRate)
		row("loaded", "%s (%d bytes)", cliutil.HumanBytes(r.BytesLoaded), r.BytesLoaded)
		row("dumped", "%s (%d bytes)", cliutil.HumanBytes(r.BytesDumped), r.BytesDumped)
		row("throughput", "%.1f MB/s loaded+dumped, %.1f requests/s, %.2f s", r.ThroughputMBps, r.RequestsPerSec, r.ElapsedSeconds)
		if r.CapacityExceededBy != nil {
			row("capacity", "%s (%d bytes); peak used %s (%d bytes), exceeded by %d bytes", cliutil.HumanBytes(r.CapacityBytes), r.CapacityBytes,
				cliutil.HumanBytes(r.PeakUsedBytes), r.PeakUsedBytes, *r.CapacityExceededBy)
		}
		if r.EvictedBlocks != nil {
			row("eviction", "%d blocks evicted, %d segments retired (%d new segments reused their files), %d prompt blocks evicted between lookup and load", *r.EvictedBlocks, *r.SegmentsRetired, *r.SegmentsRecycled, r.ReloadMisses)
		}
		if r.MemoryHits != nil {
			row("memory tier", "%s (%d bytes), %d hits", cliutil.HumanBytes(r.MemoryBytes), r.MemoryBytes, *r.MemoryHits)
		}
	}
	for i, rr := range r.Rounds {
		fio := ""
		if rr.DumpRatio > 0 || rr.LoadRatio > 0 {
			fio = fmt.Sprintf("; fio write %.1f, read %.1f MB/s%s; ratios %.2f, %.2f", rr.FioWriteMBps, rr.FioReadMBps,
				bracketText(rr.FioBefore, rr.FioAfter), rr.DumpRatio, rr.LoadRatio)
		}
		row(fmt.Sprintf("round %d", i+1), "dump %.1f MB/s, load %.1f MB/s%s", rr.DumpMBps, rr.LoadMBps, fio)
		for _, o := range rr.Layerwise {
			row("", "%s order: dump %.1f MB/s (%.2f), load %.1f MB/s (%.2f; %.2f x randread %.1f MB/s)",
				o.Order, o.DumpMBps, o.DumpRatio, o.LoadMBps, o.LoadRatio, o.LoadRandRatio, rr.FioRandReadMBps)
		}
	}
	for _, f := range r.Fio {
		synced := ""
		if f.FdatasyncEvery > 0 {
			synced = fmt.Sprintf(" fdatasync=%d", f.FdatasyncEvery)
		}
		row("fio", "%s bs=%s iodepth=%d mem=%s%s: %.1f MB/s", f.RW, cliutil.FormatSize(f.BlockSize), f.IODepth, f.Mem, synced, f.MBps)
		if f.IO != nil {
			row("fio i/o", "%s", f.IO)
		}
	}
	if t := bracketText(r.FioBefore, r.FioAfter); t != "" {
		row("fio", "ratios against the%s", t)
	}
	if r.FioNote != "" {
		row("fio", "%s", r.FioNote)
	}
	for _, n := range r.notes {
		row("note", "%s", n)
	}
	if r.Verified {
		row("result", "verified")
	} else {
		row("result", "FAILED: %s", r.mismatch)
	}
	_ = tw.Flush()
}

// elapsed formats a phase's wall time for the table, nothing for a median over rounds.
func elapsed(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf(" (%v)", d.Round(time.Millisecond))
}

// cpuText gives the CPU time a phase of bytes took, and per GiB; empty when not measured.
func cpuText(seconds float64, bytes int64) string {
	if seconds <= 0 || bytes <= 0 {
		return ""
	}
	return fmt.Sprintf("; CPU %.2f s, %.2f s/GiB", seconds, seconds/(float64(bytes)/(1<<30)))
}

// bracketText says what fio did just before and just after a round, when both were measured.
func bracketText(before, after *fioFigures) string {
	if before == nil || after == nil {
		return ""
	}
	return fmt.Sprintf(" (means of write %.1f/%.1f, read %.1f/%.1f before/after)",
		before.WriteMBps, after.WriteMBps, before.ReadMBps, after.ReadMBps)
}

// probeIOEngine opens the bench store once, empty, to learn the I/O engine and direct flag the
// workload will run with (fio runs before the first round with the same), and removes it.
func probeIOEngine(env *benchEnv, res *benchResult) error {
	if err := os.RemoveAll(env.storeDir); err != nil {
		return fmt.Errorf("remove the previous bench store %s: %w", env.storeDir, err)
	}
	e, _, err := env.open()
	if err != nil {
		return err
	}
	res.IOEngine, res.Direct = e.IOEngine()
	if err := e.Close(); err != nil {
		return err
	}
	return os.RemoveAll(env.storeDir)
}

func ratioText(ratio, fioMBps float64, what string) string {
	if ratio == 0 {
		return ""
	}
	return fmt.Sprintf(" = %.2f x fio %s (%.1f MB/s)", ratio, what, fioMBps)
}

// durableText is the dump against the durable limit, fio's write with an fdatasync every
// syncBytes ("" when it was not measured).
func durableText(ratio, fioMBps float64, syncBytes int64) string {
	if ratio == 0 {
		return ""
	}
	return fmt.Sprintf(", %.2f x fio durable write (an fdatasync every %s: %.1f MB/s)", ratio, cliutil.HumanBytes(syncBytes), fioMBps)
}

// startCPUProfile starts a CPU profile into path (nothing when path is empty) and returns the
// function that stops it.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
