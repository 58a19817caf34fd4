package cli

import (
	"cmp"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
)

// layerwiseWorkload dumps and loads one shard per task, as a layer-wise connector does, in
// the orders --order selects (layerwise_order.go), each on a fresh store: dump, sync, close,
// reopen (timed), load every shard of every block back checking every page's stamp, and
// finally (untimed) load every block whole and compare it byte for byte.
//
// Connector order: the blocks are split into requests (lengths from --trace, else uniform on
// 1..--request-max-blocks); each request dumps shard i of all its blocks in one task, i =
// 0..L-1, issued back to back and waited for at the end, and later loads shard i of all its
// blocks in one task, --layers-in-flight layers in flight (all by default, as UCM's
// start_load_kv), waited for in layer order, --concurrency requests at a time.
//
// Random order: groups of --batch blocks dumped shard by shard (all of a group's shard tasks
// issued, then waited for), --concurrency groups at a time; then every (group, shard) pair is
// loaded with one task, in a random order across groups and shards, --concurrency in flight.
type layerwiseWorkload struct{}

func (layerwiseWorkload) name() string { return "layerwise" }

func (layerwiseWorkload) defaults() map[string]string { return nil }

func (layerwiseWorkload) blocks(cfg benchConfig, l format.Layout) (int, error) {
	if _, err := layerwiseOrders(cfg.order); err != nil {
		return 0, err
	}
	if cfg.requestMaxBlocks < 1 {
		return 0, fmt.Errorf("--request-max-blocks %d: want at least 1", cfg.requestMaxBlocks)
	}
	return totalBlocks(cfg, l)
}

// layerwiseOrder is one order's figures in a layerwise run.
type layerwiseOrder struct {
	Order string `json:"order"`
	// Connector order: the requests the blocks were split into.
	Requests          int     `json:"requests,omitempty"`
	LayersInFlight    int     `json:"layers_in_flight,omitempty"`
	MeanRequestBlocks float64 `json:"mean_request_blocks,omitempty"`
	MaxRequestBlocks  int     `json:"max_request_blocks,omitempty"`
	DumpMBps          float64 `json:"dump_MBps"`
	LoadMBps          float64 `json:"load_MBps"`
	// The process's CPU time (user and system) during the timed dump and load: what the
	// engine (with the bench's in-line checks) needs of the machine's cores for those bytes.
	DumpCPUSeconds float64 `json:"dump_cpu_s,omitempty"`
	LoadCPUSeconds float64 `json:"load_cpu_s,omitempty"`
	// Ratios against fio in the same round: dump / 2 MiB sequential write, load / 2 MiB
	// sequential read (the disk's sequential speed, the layer-wise target) and / random reads of
	// one shard.
	DumpRatio     float64 `json:"dump_ratio,omitempty"`
	LoadRatio     float64 `json:"load_ratio,omitempty"`
	LoadRandRatio float64 `json:"load_randread_ratio,omitempty"`
	// DumpDurableRatio: the dump against fio's 2 MiB write with the first order's flush
	// interval (benchResult.FioDurableWriteMBps).
	DumpDurableRatio float64 `json:"dump_durable_ratio,omitempty"`
	// What the timed dump and load issued to the device.
	DumpIO *ioShape `json:"dump_io,omitempty"`
	LoadIO *ioShape `json:"load_io,omitempty"`
	// Staging memory of the dump: the engine's high-water marks (Stats.StagingPeakBytes,
	// StagingPeakBlocks) against its bound (Options.MaxStagingBytes, --max-staging).
	StagingPeakBytes  int64 `json:"staging_peak_bytes"`
	StagingPeakBlocks int64 `json:"staging_peak_blocks"`
	// --timings: where the dump's flights and the load's task batches spent their time.
	DumpTimings *dumpTimings `json:"dump_timings,omitempty"`
	LoadTimings *loadTimings `json:"load_timings,omitempty"`

	dumpTime, loadTime time.Duration
}

func (layerwiseWorkload) run(env *benchEnv, res *benchResult) error {
	orders, err := layerwiseOrders(env.cfg.order)
	if err != nil {
		return err
	}
	res.HostLayout = env.cfg.hostLayout
	for k, order := range orders {
		if k > 0 { // each order starts from an empty store, as each round does
			if err := os.RemoveAll(env.storeDir); err != nil {
				return fmt.Errorf("remove the %s order's store: %w", orders[k-1], err)
			}
			settleFS(env.cfg.dir)
		}
		o := layerwiseOrder{Order: order}
		sub := *res
		if err := runLayerwiseOrder(env, &sub, &o); err != nil {
			return fmt.Errorf("%s order: %w", order, err)
		}
		res.IOEngine, res.Direct, res.CachesDropped = sub.IOEngine, sub.Direct, sub.CachesDropped
		o.DumpMBps, o.LoadMBps, o.dumpTime, o.loadTime = sub.DumpMBps, sub.LoadMBps, sub.dumpTime, sub.loadTime
		o.DumpCPUSeconds, o.LoadCPUSeconds = sub.DumpCPUSeconds, sub.LoadCPUSeconds
		o.StagingPeakBytes, o.StagingPeakBlocks = sub.StagingPeakBytes, sub.StagingPeakBlocks
		res.Layerwise = append(res.Layerwise, o)
		if k == 0 {
			// The first order's figures are the run's (the connector order by default).
			res.DumpMBps, res.LoadMBps, res.dumpTime, res.loadTime = o.DumpMBps, o.LoadMBps, o.dumpTime, o.loadTime
			res.DumpCPUSeconds, res.LoadCPUSeconds = o.DumpCPUSeconds, o.LoadCPUSeconds
			res.OpenSeconds, res.StagingPeakBytes, res.StagingPeakBlocks = sub.OpenSeconds, o.StagingPeakBytes, o.StagingPeakBlocks
			res.Recycled, res.SegmentsRecycled = sub.Recycled, sub.SegmentsRecycled
			res.SyncBytes = sub.SyncBytes
		}
		if !sub.Verified {
			res.Verified, res.mismatch = false, fmt.Sprintf("%s order: %s", order, sub.mismatch)
			return nil
		}
	}
	res.Verified = true
	return nil
}

// runLayerwiseOrder runs one order on a fresh store, filling res as a workload run does and
// o's order-specific fields.
func runLayerwiseOrder(env *benchEnv, res *benchResult, o *layerwiseOrder) error {
	cfg := env.cfg
	e, recycledBefore, err := env.openForDump(res)
	if err != nil {
		return err
	}
	res.IOEngine, res.Direct = e.IOEngine()
	l := e.Layout()
	var (
		reqs []lwRequest
		maxN int
	)
	if o.Order == orderConnector {
		next := uniformLengths(cfg.requestMaxBlocks, cfg.seed)
		if cfg.tracePath != "" {
			trace, _, err := readTrace(cfg.tracePath)
			if err == nil {
				next, err = traceLengths(trace)
			}
			if err != nil {
				_ = e.Close()
				return fmt.Errorf("--trace: %w", err)
			}
		}
		reqs = connectorRequests(env.blocks, cfg.requestMaxBlocks, next)
		for _, r := range reqs {
			maxN = max(maxN, r.n)
		}
		o.Requests, o.MeanRequestBlocks, o.MaxRequestBlocks = len(reqs), float64(env.blocks)/float64(len(reqs)), maxN
	} else {
		// A group of the random order is a request of --batch blocks.
		reqs = connectorRequests(env.blocks, cfg.batch, func() int { return cfg.batch })
		maxN = min(cfg.batch, env.blocks)
	}
	ids := func(r lwRequest) []format.BlockID {
		out := make([]format.BlockID, r.n)
		for j := range out {
			out[j] = blockID(r.first + j)
		}
		return out
	}
	// Phase 1: dump each request (group) layer by layer: all its shard tasks issued, then
	// waited for. Both orders dump this way; they differ in the requests' lengths.
	host, release, err := newHostShards(env, maxN, l)
	if err != nil {
		_ = e.Close()
		return err
	}
	defer release()
	env.takeTimings() // nothing before the timed phase
	before := e.Stats()
	queue := env.sampleQueue()
	meter := startIOMeter(cfg.dir)
	cpu := processCPU()
	dumpTime, err := parallel(len(reqs), cfg.concurrency, func(w, r int) error {
		req := reqs[r]
		rids := ids(req)
		for j, id := range rids {
			host.fill(env.payload, w, j, id)
		}
		tasks := make([]*engine.Task, 0, l.Shards)
		for _, t := range req.layerTasks(l.Shards) {
			src := make([][]byte, t.n)
			for j := range src {
				src[j] = host.at(w, j, t.layer)
			}
			tasks = append(tasks, e.DumpShard(rids, t.layer, src))
		}
		var first error
		for _, t := range tasks {
			if err := t.Wait(); err != nil && first == nil {
				first = err
			}
		}
		return first
	})
	dumpQueue := queue.end()
	o.DumpIO = meter.end()
	if syncBytes := syncInterval(before, e.Stats()); res.SyncBytes == 0 {
		res.SyncBytes = syncBytes // the first order's: the durable fio job's flush interval
	}
	res.DumpCPUSeconds = (processCPU() - cpu).Seconds()
	env.countRecycled(e, res, recycledBefore)
	e, err = env.reopenAfterDump(e, err, res, dumpTime)
	if err != nil {
		return err
	}
	defer func() { _ = e.Close() }()
	if flights, _ := env.takeTimings(); env.timings != nil {
		o.DumpTimings = dumpSummary(flights)
		if o.DumpTimings != nil {
			o.DumpTimings.Queue = dumpQueue
		}
	}
	if !res.Direct {
		res.CachesDropped = dropCaches()
	}

	// Phase 2: load.
	shardBufs, releaseShards, err := env.workerBuffers(maxN, l.ShardBytes)
	if err != nil {
		return err
	}
	defer releaseShards()
	var mismatch atomic.Pointer[error]
	check := func(rids []format.BlockID, t lwTask, dst [][]byte) {
		for j, id := range rids {
			if err := env.payload.checkStamps(dst[j], id, int64(t.layer)*l.ShardBytes); err != nil {
				err = fmt.Errorf("shard %d: %w", t.layer, err)
				mismatch.CompareAndSwap(nil, &err)
			}
		}
	}
	loadShards := func(w int, t lwTask) error {
		rids := ids(lwRequest{first: t.first, n: t.n})
		dst := shardBufs[w][:t.n]
		if err := e.LoadShard(rids, t.layer, dst).Wait(); err != nil {
			return err
		}
		check(rids, t, dst)
		return nil
	}
	queue = env.sampleQueue()
	meter = startIOMeter(cfg.dir)
	cpu = processCPU()
	var loadTime time.Duration
	if o.Order == orderConnector {
		// --layers-in-flight layers of a request in flight (all: UCM's start_load_kv issues
		// every layer's load before the forward pass), waited for in layer order
		// (wait_for_layer_load), each layer into its own part of the worker's block buffers;
		// --concurrency requests at a time.
		window := cfg.layersInFlight
		if window <= 0 {
			window = l.Shards
		}
		o.LayersInFlight = window
		loadTime, err = parallel(len(reqs), cfg.concurrency, func(w, r int) error {
			tasks := reqs[r].layerTasks(l.Shards)
			rids := ids(reqs[r])
			pending := make([]*engine.Task, len(tasks))
			dsts := make([][][]byte, len(tasks))
			issue := func(k int) {
				t := tasks[k]
				dsts[k] = make([][]byte, t.n)
				for j := range dsts[k] {
					dsts[k][j] = host.at(w, j, t.layer)
				}
				pending[k] = e.LoadShard(rids, t.layer, dsts[k])
			}
			next := 0
			for ; next < len(tasks) && next < window; next++ {
				issue(next)
			}
			var first error
			for k, t := range tasks {
				// Every issued task is waited for, also after a failure: its reads land in
				// the worker's buffers, which the next request reuses.
				if err := pending[k].Wait(); err != nil {
					first = cmp.Or(first, err)
				} else if first == nil {
					check(rids, t, dsts[k])
				}
				if next < len(tasks) && first == nil {
					issue(next)
					next++
				}
			}
			return first
		})
	} else {
		units := randomUnits(len(reqs), l.Shards, cfg.seed)
		loadTime, err = parallel(len(units), cfg.concurrency, func(w, u int) error {
			r := reqs[int(units[u])/l.Shards]
			return loadShards(w, lwTask{layer: int(units[u]) % l.Shards, first: r.first, n: r.n})
		})
	}
	loadQueue := queue.end()
	o.LoadIO = meter.end()
	res.LoadCPUSeconds = (processCPU() - cpu).Seconds()
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	if _, loads := env.takeTimings(); env.timings != nil {
		o.LoadTimings = loadSummary(loads)
		if o.LoadTimings != nil {
			o.LoadTimings.Queue = loadQueue
		}
	}
	res.LoadMBps = mbps(res.TotalBytes, loadTime)
	res.loadTime = loadTime
	if err := verifyAll(env, e, &mismatch); err != nil {
		return err
	}
	if p := mismatch.Load(); p != nil {
		res.mismatch = (*p).Error()
		return nil
	}
	res.Verified = true
	return nil
}

// Layouts of the caller's buffers in a layer-wise run (--host-layout).
const (
	// hostLayoutBlock: a buffer per block, its shards adjacent in layer order, so a layer's
	// shards of a request are a block's size apart.
	hostLayoutBlock = "block"
	// hostLayoutLayer: a request's shards of one layer adjacent in block order, as in a
	// per-layer KV cache tensor whose slots the request holds in a run.
	hostLayoutLayer = "layer"
)

// hostShards is a layer-wise run's caller buffers, shard `layer` of slot j of worker w at
// at(w, j, layer), in the --host-layout the run asked for.
type hostShards struct {
	bufs       [][][]byte // block: [worker][slot] a block each; layer: [worker][0], layer-major
	slots      int
	shards     int
	shardBytes int64
	layerMajor bool
}

// newHostShards allocates --concurrency workers' buffers for slots blocks each, holding the
// payload body (see workerBuffers).
func newHostShards(env *benchEnv, slots int, l engine.Layout) (hostShards, func(), error) {
	h := hostShards{slots: slots, shards: l.Shards, shardBytes: l.ShardBytes, layerMajor: env.cfg.hostLayout == hostLayoutLayer}
	var err error
	var release func()
	if !h.layerMajor {
		h.bufs, release, err = env.workerBuffers(slots, l.BlockBytes())
		return h, release, err
	}
	h.bufs, release, err = env.workerBuffers(1, int64(slots)*l.BlockBytes())
	if err != nil {
		return h, nil, err
	}
	for w := range h.bufs {
		for j := 0; j < slots; j++ {
			h.fill(env.payload, w, j, format.BlockID{})
		}
	}
	return h, release, nil
}

// at returns shard layer of slot j of worker w.
func (h hostShards) at(w, j, layer int) []byte {
	if h.layerMajor {
		off := (int64(layer)*int64(h.slots) + int64(j)) * h.shardBytes
		return h.bufs[w][0][off : off+h.shardBytes : off+h.shardBytes]
	}
	off := int64(layer) * h.shardBytes
	return h.bufs[w][j][off : off+h.shardBytes : off+h.shardBytes]
}

// fill writes block id's bytes into slot j of worker w (payloadPool.fill).
func (h hostShards) fill(p *payloadPool, w, j int, id format.BlockID) {
	if !h.layerMajor {
		p.fill(h.bufs[w][j], id)
		return
	}
	for s := 0; s < h.shards; s++ {
		p.fillRange(h.at(w, j, s), id, int64(s)*h.shardBytes)
	}
}
