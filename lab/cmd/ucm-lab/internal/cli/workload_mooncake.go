package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/crc32c"
	"github.com/ucm-go/ucm/tiers"
)

// mooncakeWorkload benchmarks the mooncake tier (docs/mooncake.md) on a memory | mooncake |
// ssd chain against a running master (UCM_MOONCAKE_MASTER, UCM_MOONCAKE_METADATA: what
// tools/mooncake/harness.sh --master exports), and measures the pool's own put/get rate in the
// same run. The pool's memory is held by a second process (this binary, re-executed with
// UCM_MOONCAKE_HOLD set), so every transfer crosses the transport as it does between machines.
//
//  1. pool: --total bytes of objects of a block object's size put and got back straight
//     through Mooncake's client (batch calls from registered memory, the tasks' batch size and
//     concurrency), then got again with each object checksummed where it landed (the ceiling
//     of a load that copies nothing but checks every byte), paying the holder's first touch
//     of its memory; then a quarter of that in objects four blocks large; then block objects
//     again, each task reusing one buffer of a call's objects (memory the caches hold: the
//     client's best case). Every other raw run moves its objects through as much memory as
//     the tier's staging, a call's worth at a time in turn, as the tier does;
//  2. for each object layout (one object per block, one per shard): the raw client with
//     objects of the layout's size (block objects: --total bytes; shard objects: a quarter,
//     the same bytes per call), the tier alone, without an engine (every block written
//     through with PutBatch, each task waiting for its puts, then loaded back with Load; block
//     objects once more from payloads the tier lends), and the raw client again: the tier's
//     ratios are against the mean of the two raw runs around it, so a transport that changes
//     its pace between minutes moves both sides; then through an engine: dump every block
//     (written through), reopen the store with its memory tier empty, load every block
//     (served by the pool), then one shard of every block;
//  3. a second engine with an empty disk loads every block (sharing: all from the pool);
//  4. 4 × blocks loads drawn from a skewed distribution with a memory tier of a quarter of
//     the blocks: the hit rate of each tier;
//  5. block objects: an engine's dumps of blocks whose shards are named apart (DumpSpans, as
//     a connector names a block's tensors), without the pool and written through.
//
// Every phase also reports this process's CPU seconds per GiB moved.
type mooncakeWorkload struct{}

func (mooncakeWorkload) name() string { return "mooncake" }

func (mooncakeWorkload) defaults() map[string]string {
	return map[string]string{"total": "1GiB", "sync": "none", "batch": "8", "concurrency": "2"}
}

func (mooncakeWorkload) blocks(cfg benchConfig, l format.Layout) (int, error) {
	return totalBlocks(cfg, l)
}

// mooncakeBench is the mooncake workload's part of the result.
type mooncakeBench struct {
	Master string `json:"master"`
	// PoolPutMBps and PoolGetMBps are the raw client's rates with block-object-sized objects
	// (the mean of the two runs around the block objects' tier alone; Pool lists every
	// measurement).
	PoolPutMBps  float64          `json:"pool_put_MBps"`
	PoolGetMBps  float64          `json:"pool_get_MBps"`
	Pool         []mooncakeRawRun `json:"pool"`
	MemoryBytes  int64            `json:"memory_bytes"`
	HolderBytes  int64            `json:"pool_bytes"`
	Layouts      []mooncakeLayoutRun
	SharedMBps   float64 `json:"shared_load_MBps"`
	SharedRatio  float64 `json:"shared_load_ratio"`
	SharedHits   float64 `json:"shared_hit_rate"`
	SkewLoads    int     `json:"skew_loads"`
	SkewMemory   float64 `json:"skew_memory_hit_rate"`
	SkewPool     float64 `json:"skew_pool_hit_rate"`
	SkewDisk     float64 `json:"skew_disk_rate"`
	SkewMBps     float64 `json:"skew_load_MBps"`
	PoolRejected uint64  `json:"pool_rejected"`
	PoolErrors   uint64  `json:"pool_errors"`
}

// mooncakeRawRun is one measurement of the raw client: objects of ObjectBytes, PerCall of them
// per batch call.
type mooncakeRawRun struct {
	What        string `json:"what"`
	ObjectBytes int    `json:"object_bytes"`
	PerCall     int    `json:"per_call"`
	// MemoryBytes is the registered memory the objects were moved from and into, a call's
	// worth at a time in turn.
	MemoryBytes int64   `json:"memory_bytes"`
	PutMBps     float64 `json:"put_MBps"`
	GetMBps     float64 `json:"get_MBps"`
	// PutCPU and GetCPU are this process's CPU seconds (user and system, every thread) per
	// GiB moved; the holder's are not counted.
	PutCPU float64 `json:"put_cpu_s_per_GiB"`
	GetCPU float64 `json:"get_cpu_s_per_GiB"`
	// PutBusy and GetBusy are the share of the machine's CPU time busy meanwhile (every
	// process, the holder's included).
	PutBusy float64 `json:"put_machine_busy"`
	GetBusy float64 `json:"get_machine_busy"`
	// GetChecked* are the same gets again, each object's bytes then checksummed where they
	// landed (CRC32C, as the tier checks them): what a load that copies nothing and still
	// checks every byte could reach, the ceiling of a zero-copy tier load.
	GetCheckedMBps float64 `json:"get_checked_MBps"`
	GetCheckedCPU  float64 `json:"get_checked_cpu_s_per_GiB"`
	GetCheckedBusy float64 `json:"get_checked_machine_busy"`
}

// perGiB is CPU seconds per GiB of bytes.
func perGiB(cpu time.Duration, bytes int64) float64 {
	return cpu.Seconds() / (float64(bytes) / (1 << 30))
}

// machineTicks returns the machine's CPU time so far, busy (anything but idle and iowait:
// every process, the kernel's interrupts, and time the hypervisor took) and in all, in
// /proc/stat's ticks; zeros when it cannot be read.
func machineTicks() (busy, all uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0
		}
		all += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, all
}

// meter measures one phase of the bench from its start: this process's CPU time and the
// machine's busy and total ticks then.
type meter struct {
	cpu       time.Duration
	busy, all uint64
}

func startMeter() meter {
	busy, all := machineTicks()
	return meter{cpu: processCPU(), busy: busy, all: all}
}

// stop returns the phase's CPU seconds per GiB of bytes and the share of the machine's CPU
// time that was busy meanwhile (0 when unknown).
func (m meter) stop(bytes int64) (cpuPerGiB, busy float64) {
	cpuPerGiB = perGiB(processCPU()-m.cpu, bytes)
	if b, all := machineTicks(); all > m.all {
		busy = float64(b-m.busy) / float64(all-m.all)
	}
	return cpuPerGiB, busy
}

// mooncakeLayoutRun is one object layout's figures; ratios are against the pool's own rates
// with block-object-sized objects, and (Object*) with objects of this layout's size.
type mooncakeLayoutRun struct {
	Object string `json:"object"`
	// ObjectPutMBps and ObjectGetMBps are the raw client's rates with this layout's objects:
	// the mean of the runs right before and right after the tier alone (Pool lists both).
	ObjectPutMBps float64 `json:"object_put_MBps"`
	ObjectGetMBps float64 `json:"object_get_MBps"`
	// ObjectGetCheckedMBps is the same mean of the raw gets checked in place.
	ObjectGetCheckedMBps float64 `json:"object_get_checked_MBps"`
	DumpMBps             float64 `json:"dump_MBps"`
	WriteThroughMBps     float64 `json:"write_through_MBps"`
	WriteThroughRate     float64 `json:"write_through_ratio"`
	WrittenThrough       float64 `json:"written_through"` // fraction of the blocks put in the pool
	LoadMBps             float64 `json:"load_MBps"`
	LoadRatio            float64 `json:"load_ratio"`
	// WriteThroughObjRatio and LoadObjRatio are against ObjectPutMBps and ObjectGetMBps.
	WriteThroughObjRatio float64 `json:"write_through_object_ratio"`
	LoadObjRatio         float64 `json:"load_object_ratio"`
	PoolHitRate          float64 `json:"pool_hit_rate"`
	ShardMBps            float64 `json:"shard_load_MBps"`
	// DumpCPU and LoadCPU are this process's CPU seconds per GiB dumped (written through, the
	// engine's dump included) and loaded (the bench's checks of the bytes included).
	DumpCPU float64 `json:"dump_cpu_s_per_GiB"`
	// DumpShare is the share of the tasks' time in the dump itself (the rest: waiting for the
	// write-through).
	DumpShare float64 `json:"dump_share"`
	LoadCPU   float64 `json:"load_cpu_s_per_GiB"`
	// DumpAloneMBps and DumpAloneCPU are the same dumps into the same chain without the pool
	// (the engine's own rate on this disk); DumpRatio is WriteThroughMBps against it.
	DumpAloneMBps float64 `json:"dump_without_pool_MBps"`
	DumpAloneCPU  float64 `json:"dump_without_pool_cpu_s_per_GiB"`
	DumpRatio     float64 `json:"write_through_dump_ratio"`
	// Tier* are the tier alone (no engine, no disk): its write-through (PutBatch, each task
	// waiting with Flush) and Load rates, ratios against the raw client with objects of this
	// layout's size, and this process's CPU seconds per GiB.
	TierPutMBps  float64 `json:"tier_put_MBps"`
	TierGetMBps  float64 `json:"tier_load_MBps"`
	TierPutRatio float64 `json:"tier_put_object_ratio"`
	TierGetRatio float64 `json:"tier_load_object_ratio"`
	// TierGetCheckedRatio is TierGetMBps against ObjectGetCheckedMBps.
	TierGetCheckedRatio float64 `json:"tier_load_checked_ratio"`
	TierPutCPU          float64 `json:"tier_put_cpu_s_per_GiB"`
	TierGetCPU          float64 `json:"tier_load_cpu_s_per_GiB"`
	// TierPutBusy and TierGetBusy are the share of the machine's CPU time busy meanwhile.
	TierPutBusy float64 `json:"tier_put_machine_busy"`
	TierGetBusy float64 `json:"tier_load_machine_busy"`
	// TierLent* are the tier alone writing through from payloads it lent (block objects
	// only): each task's blocks are written into lent payloads (LendPayload; what an engine's
	// dump copies there anyway), put with PutBatch and waited for, as the raw client puts
	// from registered memory that holds its bytes already.
	TierLentPutMBps  float64 `json:"tier_lent_put_MBps,omitempty"`
	TierLentPutRatio float64 `json:"tier_lent_put_object_ratio,omitempty"`
	TierLentPutCPU   float64 `json:"tier_lent_put_cpu_s_per_GiB,omitempty"`
	TierLentPutBusy  float64 `json:"tier_lent_put_machine_busy,omitempty"`
	// Spans* are the engine's dumps of blocks whose shards are named apart (DumpSpans, as a
	// connector names a block's K and V tensors), which the dump copies into its record (block
	// objects only): without the pool, and written through with each task waiting for its
	// write-throughs; SpansLent is the share of the blocks put from lent payloads (no copy
	// of their own), SpansDumpRatio the written-through rate against the one without the pool.
	SpansDumpAloneMBps float64 `json:"spans_dump_without_pool_MBps,omitempty"`
	SpansDumpAloneCPU  float64 `json:"spans_dump_without_pool_cpu_s_per_GiB,omitempty"`
	SpansDumpMBps      float64 `json:"spans_dump_write_through_MBps,omitempty"`
	SpansDumpCPU       float64 `json:"spans_dump_write_through_cpu_s_per_GiB,omitempty"`
	SpansLent          float64 `json:"spans_put_lent,omitempty"`
	SpansDumpRatio     float64 `json:"spans_write_through_dump_ratio,omitempty"`
}

func (mooncakeWorkload) run(env *benchEnv, res *benchResult) error {
	if size := os.Getenv("UCM_MOONCAKE_HOLD"); size != "" {
		res.Verified = true // the holder moves no block
		return mooncakeHold(size)
	}
	if !tiers.MooncakeBuilt {
		return fmt.Errorf("the mooncake workload: %w", tiers.ErrMooncakeNotBuilt)
	}
	master, metadata := os.Getenv("UCM_MOONCAKE_MASTER"), os.Getenv("UCM_MOONCAKE_METADATA")
	if master == "" || metadata == "" {
		return errors.New("the mooncake workload needs UCM_MOONCAKE_MASTER and UCM_MOONCAKE_METADATA (run it under tools/mooncake/harness.sh --master, or make bench-mooncake)")
	}
	l := env.opts.Layout
	total := int64(env.blocks) * l.BlockBytes()
	// The holder's memory takes every object of the run without eviction: four runs of raw
	// block objects (the first touch, one buffer per task, then around the tier alone),
	// three quarters of other raw objects (four-block objects, then shard objects around the
	// tier alone), both layouts' objects twice (the tier alone, then through an engine), block
	// objects twice more (the tier alone from lent payloads, an engine's dumps from spans),
	// and a fifth more than all that: its master evicts at about 90 % full, and Mooncake keeps
	// more than the objects.
	objects := 10*total + total*3/4
	mb := &mooncakeBench{Master: master, MemoryBytes: total / 4, HolderBytes: objects*6/5 + (256 << 20)}
	res.Mooncake = mb
	cfg := tiers.MooncakeConfig{LocalHostname: "127.0.0.1", MetadataServer: metadata, MasterServerAddress: master,
		LocalBufferSize: 16 << 20, HealthIntervalMs: 500}

	// The process that holds the pool's memory.
	holder, err := startHolder(env, mb.HolderBytes)
	if err != nil {
		return err
	}
	defer holder()

	// 1. The pool's own rates: block objects (the holder's first touch), four-block objects,
	// block objects from one buffer per task.
	blockObj := tiers.MooncakeObjectBytes(l, false)
	batch, staging := env.cfg.batch, mooncakeTier(env, cfg, "block").StagingBytes
	if _, err := mooncakeRaw(env, cfg, mb, "block objects, first touch", blockObj, env.blocks, batch, staging); err != nil {
		return err
	}
	if _, err := mooncakeRaw(env, cfg, mb, "4-block objects", 4*blockObj, env.blocks/16, max(1, batch/4), staging); err != nil {
		return err
	}
	if _, err := mooncakeRaw(env, cfg, mb, "block objects, one buffer per task", blockObj, env.blocks, batch, 0); err != nil {
		return err
	}

	// 2. The tier, per object layout.
	for _, object := range []string{"block", "shard"} {
		run, err := mooncakeLayout(env, cfg, object, mb)
		if err != nil {
			return err
		}
		mb.Layouts = append(mb.Layouts, run)
		// Its stores are not needed any more (and may be on a memory file system).
		for _, d := range []string{object, "second"} {
			if err := os.RemoveAll(filepath.Join(env.storeDir, d)); err != nil {
				return err
			}
		}
		env.progressf("%s objects: dump %.0f MB/s, dump+write-through %.0f MB/s, load %.0f MB/s, one shard per block %.0f MB/s",
			object, run.DumpMBps, run.WriteThroughMBps, run.LoadMBps, run.ShardMBps)
	}

	// The ratios: against block-sized objects, measured around the block layout's tier alone,
	// and against the objects of each layout's size.
	mb.PoolPutMBps, mb.PoolGetMBps = mb.Layouts[0].ObjectPutMBps, mb.Layouts[0].ObjectGetMBps
	for i := range mb.Layouts {
		r := &mb.Layouts[i]
		r.WriteThroughRate, r.LoadRatio = r.WriteThroughMBps/mb.PoolPutMBps, r.LoadMBps/mb.PoolGetMBps
		r.WriteThroughObjRatio, r.LoadObjRatio = r.WriteThroughMBps/r.ObjectPutMBps, r.LoadMBps/r.ObjectGetMBps
		r.TierPutRatio, r.TierGetRatio = r.TierPutMBps/r.ObjectPutMBps, r.TierGetMBps/r.ObjectGetMBps
		r.TierGetCheckedRatio = r.TierGetMBps / r.ObjectGetCheckedMBps
		r.DumpRatio = r.WriteThroughMBps / r.DumpAloneMBps
		if r.TierLentPutMBps > 0 {
			r.TierLentPutRatio = r.TierLentPutMBps / r.ObjectPutMBps
			r.SpansDumpRatio = r.SpansDumpMBps / r.SpansDumpAloneMBps
		}
	}
	mb.SharedRatio = mb.SharedMBps / mb.PoolGetMBps
	res.DumpMBps, res.LoadMBps = mb.Layouts[0].DumpMBps, mb.Layouts[0].LoadMBps
	res.Verified = true
	return nil
}

// mooncakeHold is the pool-holding process: a client that contributes size bytes and waits
// for its stdin to close.
func mooncakeHold(size string) error {
	n, err := strconv.ParseInt(size, 10, 64)
	if err != nil {
		return err
	}
	cfg := tiers.MooncakeConfig{LocalHostname: "127.0.0.1", MetadataServer: os.Getenv("UCM_MOONCAKE_METADATA"),
		MasterServerAddress: os.Getenv("UCM_MOONCAKE_MASTER"), GlobalSegmentSize: n, LocalBufferSize: 16 << 20}.WithDefaults()
	pool, err := tiers.OpenMooncakePool(cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if !pool.Healthy() {
		return errors.New("mooncake hold: the master does not answer")
	}
	if err := populateLargest(n); err != nil {
		return fmt.Errorf("mooncake hold: %w", err)
	}
	fmt.Println("HOLDING")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

func startHolder(env *benchEnv, bytes int64) (stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "bench", "--workload", "mooncake", "--dir", filepath.Join(env.cfg.dir, "holder"), "--json")
	cmd.Env = append(os.Environ(), "UCM_MOONCAKE_HOLD="+strconv.FormatInt(bytes, 10))
	cmd.Stderr = env.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop = func() { _ = in.Close(); _ = cmd.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "HOLDING\n" {
		_ = cmd.Process.Kill()
		stop()
		return nil, fmt.Errorf("mooncake pool holder did not start (%q, %v)", line, err)
	}
	return stop, nil
}

// mooncakeRaw measures the raw client (poolRate) with n objects of obj bytes, perCall per
// call, adds the figures to mb.Pool and returns them.
func mooncakeRaw(env *benchEnv, cfg tiers.MooncakeConfig, mb *mooncakeBench, what string, obj, n, perCall int, memory int64) (mooncakeRawRun, error) {
	run, err := poolRate(env, cfg, what, obj, n, perCall, len(mb.Pool), memory)
	if err != nil {
		return run, err
	}
	mb.Pool = append(mb.Pool, run)
	env.progressf("pool, %s (%d bytes, %d per call, %s of memory): put %.0f MB/s, get %.0f MB/s, get checked in place %.0f MB/s", what, obj, perCall, cliutil.HumanBytes(run.MemoryBytes), run.PutMBps, run.GetMBps, run.GetCheckedMBps)
	return run, nil
}

// poolRate puts n objects of obj bytes straight through a client of the pool, from registered
// memory, perCall objects per batch call with --concurrency calls in flight, under keys of its
// own (round tells measurements apart), then gets them back, twice: as they come, and with
// each object's bytes checksummed in place after its call. The rates count obj bytes moved.
// Each task moves its calls' objects through memory/concurrency bytes (at least one call's
// objects: 0 is one buffer per task, reused by every call), a call's worth at a time in turn.
func poolRate(env *benchEnv, cfg tiers.MooncakeConfig, what string, obj, n, perCall, round int, memory int64) (mooncakeRawRun, error) {
	run := mooncakeRawRun{What: what, ObjectBytes: obj, PerCall: perCall}
	pool, err := tiers.OpenMooncakePool(cfg.WithDefaults())
	if err != nil {
		return run, err
	}
	defer pool.Close()
	if !pool.Healthy() {
		return run, errors.New("pool rate: the master does not answer")
	}
	workers := env.cfg.concurrency
	call := int64(perCall) * int64(obj)
	turns := int(max(1, memory/int64(workers)/call))
	run.MemoryBytes = int64(workers*turns) * call
	slabs := make([][]byte, workers*turns)
	for w := range slabs {
		if slabs[w], err = pool.Alloc(perCall * obj); err != nil {
			return run, err
		}
		for off := 0; off < len(slabs[w]); off += len(env.payload.body) {
			copy(slabs[w][off:], env.payload.body)
		}
	}
	type mode int
	const (
		put mode = iota
		get
		getChecked
	)
	phase := func(op mode) (time.Duration, error) {
		var next atomic.Int64
		var wg sync.WaitGroup
		var firstErr atomic.Pointer[error]
		start := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(mine [][]byte) {
				defer wg.Done()
				sums := make([]uint32, perCall) // the checked gets' checksums, kept
				for turn := 0; ; turn++ {
					slab := mine[turn%len(mine)]
					lo := int(next.Add(int64(perCall))) - perCall
					if lo >= n {
						return
					}
					hi := min(n, lo+perCall)
					keys := make([]string, hi-lo)
					bufs := make([][]byte, hi-lo)
					for i := range keys {
						keys[i] = fmt.Sprintf("ucm-bench-raw%d/%d", round, lo+i)
						bufs[i] = slab[i*obj : (i+1)*obj]
					}
					var bad error
					if op == put {
						codes, err := pool.Put(keys, bufs)
						bad = err
						for _, c := range codes {
							if c != 0 && bad == nil {
								bad = fmt.Errorf("put: mooncake error %d", c)
							}
						}
					} else {
						got, err := pool.Get(keys, bufs)
						bad = err
						for i, g := range got {
							if g != int64(obj) && bad == nil {
								bad = fmt.Errorf("get: %d", g)
							}
							if op == getChecked && g == int64(obj) {
								sums[i] = crc32c.Checksum(bufs[i])
							}
						}
					}
					if bad != nil {
						firstErr.CompareAndSwap(nil, &bad)
						return
					}
				}
			}(slabs[w*turns : (w+1)*turns])
		}
		wg.Wait()
		if p := firstErr.Load(); p != nil {
			return 0, *p
		}
		return time.Since(start), nil
	}
	bytes := int64(n) * int64(obj)
	m := startMeter()
	d, err := phase(put)
	if err != nil {
		return run, fmt.Errorf("pool rate, %s: %w", what, err)
	}
	run.PutMBps = mbps(bytes, d)
	run.PutCPU, run.PutBusy = m.stop(bytes)
	m = startMeter()
	if d, err = phase(get); err != nil {
		return run, fmt.Errorf("pool rate, %s: %w", what, err)
	}
	run.GetMBps = mbps(bytes, d)
	run.GetCPU, run.GetBusy = m.stop(bytes)
	m = startMeter()
	if d, err = phase(getChecked); err != nil {
		return run, fmt.Errorf("pool rate, %s, checked: %w", what, err)
	}
	run.GetCheckedMBps = mbps(bytes, d)
	run.GetCheckedCPU, run.GetCheckedBusy = m.stop(bytes)
	return run, nil
}

// mooncakeTier is the bench's pool tier for object layout object: its own key prefix, and
// staging for every task's blocks four times over.
func mooncakeTier(env *benchEnv, cfg tiers.MooncakeConfig, object string) tiers.MooncakeConfig {
	c := cfg
	c.Object = object
	c.KeyPrefix = "ucm-bench-" + object
	c.StagingBytes = int64(4*env.cfg.batch*env.cfg.concurrency) * (env.opts.Layout.BlockBytes() + 64<<10)
	return c
}

// mooncakeOpts is the bench's engine: a memory tier of memory bytes (0: none), the pool tier
// pool (nil: none) and a disk tier in dir.
func mooncakeOpts(env *benchEnv, pool *tiers.MooncakeConfig, dir string, memory int64) engine.Options {
	opts := env.opts
	opts.Tiers = []tiers.Config{{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}}}
	if pool != nil {
		opts.Tiers = append([]tiers.Config{{Name: "pool", Kind: tiers.KindMooncake, Mooncake: pool}}, opts.Tiers...)
	}
	if memory > 0 {
		opts.Tiers = append([]tiers.Config{{Name: "dram", Kind: tiers.KindMemory, Capacity: memory}}, opts.Tiers...)
	}
	return opts
}

// engineLoads returns loadAll's load for engine e: whole blocks (shard < 0) or shard `shard`.
func engineLoads(e *engine.Engine, shard int) func(ids []format.BlockID, bufs [][]byte) error {
	return func(ids []format.BlockID, bufs [][]byte) error {
		if shard >= 0 {
			return e.LoadShard(ids, shard, bufs).Wait()
		}
		return e.Load(ids, bufs).Wait()
	}
}

// loadAll loads every block from first on (shard < 0), or shard `shard` of each, with the
// bench's tasks, each task calling load, checks the bytes, and returns the time taken; first
// and onStart are runTasks'.
func loadAll(env *benchEnv, first, shard int, onStart func(), load func(ids []format.BlockID, bufs [][]byte) error) (time.Duration, error) {
	l := env.opts.Layout
	size, off := l.BlockBytes(), int64(0)
	if shard >= 0 {
		size, off = l.ShardBytes, int64(shard)*l.ShardBytes
	}
	var mismatch atomic.Pointer[error]
	d, err := runTasks(env, first, size, onStart, func(ids []format.BlockID, bufs [][]byte) error {
		if err := load(ids, bufs); err != nil {
			return err
		}
		for i, id := range ids {
			if err := env.payload.checkStamps(bufs[i], id, off); err != nil {
				mismatch.CompareAndSwap(nil, &err)
			}
		}
		return nil
	})
	if err == nil && mismatch.Load() != nil {
		err = *mismatch.Load()
	}
	return d, err
}

// tierAlone measures the tier without an engine (phase 2's first part) into run: tasks of the
// bench's blocks written through with PutBatch, each waiting for its puts (Flush), then loaded
// back with Load into the tasks' buffers and checked, with the tier's staging as an engine
// sizes it; for block objects, then blocks of their own written into payloads the tier lends
// (LendPayload) and put from there, checked by loading them back after the clock. The shard
// checksums are computed before the clock starts (an engine's dump has them from its own pass
// over the bytes).
func tierAlone(env *benchEnv, cfg tiers.MooncakeConfig, run *mooncakeLayoutRun) error {
	l := env.opts.Layout
	bytes := int64(env.blocks) * l.BlockBytes()
	c := mooncakeTier(env, cfg, run.Object).WithDefaults()
	c.KeyPrefix = "ucm-bench-tier-" + run.Object
	pool, err := tiers.OpenMooncakePool(c)
	if err != nil {
		return err
	}
	defer pool.Close()
	t, err := tiers.NewMooncakeTier("pool", c, pool, l, format.Fingerprint{1}, nil)
	if err != nil {
		return err
	}
	defer t.Close()
	if !t.Up() {
		return errors.New("the tier alone: the master does not answer")
	}
	// Block objects are put a second time from lent payloads, as blocks of their own (ids
	// after the others).
	n := env.blocks
	if run.Object == "block" {
		n *= 2
	}
	sums := make(map[format.BlockID][]uint32, n)
	block := make([]byte, l.BlockBytes())
	for i := range n {
		id := blockID(i)
		env.payload.fill(block, id)
		crcs := make([]uint32, l.Shards)
		for s := range crcs {
			crcs[s] = format.Checksum(block[int64(s)*l.ShardBytes : int64(s+1)*l.ShardBytes])
		}
		sums[id] = crcs
	}
	var m meter
	startM := func() { m = startMeter() }
	// put writes blocks first.. through with PutBatch, each task waiting for its puts: from
	// the tasks' buffers (copied into put slots), or written into payloads the tier lends.
	put := func(first int, lend bool) (time.Duration, error) {
		return runTasks(env, first, l.BlockBytes(), startM, func(ids []format.BlockID, bufs [][]byte) error {
			data := bufs
			if lend {
				data = make([][]byte, 0, len(ids))
				defer func() {
					for _, p := range data {
						t.ReturnPayload(p)
					}
				}()
				for range ids {
					p := t.LendPayload()
					if p == nil {
						return errors.New("the tier alone: no payload free to lend")
					}
					data = append(data, p)
				}
			}
			crcs := make([][]uint32, len(ids))
			for i, id := range ids {
				env.payload.fill(data[i], id)
				crcs[i] = sums[id]
			}
			t.PutBatch(ids, data, crcs)
			t.Flush()
			return nil
		})
	}
	load := func(ids []format.BlockID, bufs [][]byte) error {
		hits, _ := t.Load(ids, -1, nil, func(i int) []byte { return bufs[i] }, nil)
		if i := slices.Index(hits, false); i >= 0 {
			return fmt.Errorf("the tier alone: block %s missed", ids[i])
		}
		return nil
	}
	d, err := put(0, false)
	if err != nil {
		return err
	}
	run.TierPutMBps = mbps(bytes, d)
	run.TierPutCPU, run.TierPutBusy = m.stop(bytes)
	if s := t.Stats(); s.Puts != uint64(env.blocks) {
		return fmt.Errorf("the tier alone: %d of %d blocks written through (%+v)", s.Puts, env.blocks, s)
	}
	if d, err = loadAll(env, 0, -1, startM, load); err != nil {
		return err
	}
	run.TierGetMBps = mbps(bytes, d)
	run.TierGetCPU, run.TierGetBusy = m.stop(bytes)
	if run.Object != "block" {
		return nil
	}

	// From lent payloads, then every such block loaded back and checked (not recorded).
	lentBefore := t.Stats().PutsLent
	if d, err = put(env.blocks, true); err != nil {
		return err
	}
	run.TierLentPutMBps = mbps(bytes, d)
	run.TierLentPutCPU, run.TierLentPutBusy = m.stop(bytes)
	if n := t.Stats().PutsLent - lentBefore; n != uint64(env.blocks) {
		return fmt.Errorf("the tier alone: %d of %d blocks put from lent payloads (%+v)", n, env.blocks, t.Stats())
	}
	if _, err := loadAll(env, env.blocks, -1, nil, load); err != nil {
		return fmt.Errorf("the tier alone, blocks put from loans: %w", err)
	}
	return nil
}

func mooncakeLayout(env *benchEnv, cfg tiers.MooncakeConfig, object string, mb *mooncakeBench) (mooncakeLayoutRun, error) {
	run := mooncakeLayoutRun{Object: object}
	l := env.opts.Layout
	// The raw client with this layout's objects right before and right after the tier alone.
	obj, n, perCall := tiers.MooncakeObjectBytes(l, false), env.blocks, env.cfg.batch
	if object == "shard" {
		obj, n, perCall = tiers.MooncakeObjectBytes(l, true), env.blocks/4*l.Shards, env.cfg.batch*l.Shards
	}
	staging := mooncakeTier(env, cfg, object).StagingBytes
	before, err := mooncakeRaw(env, cfg, mb, object+" objects, before the tier alone", obj, n, perCall, staging)
	if err != nil {
		return run, err
	}
	if err := tierAlone(env, cfg, &run); err != nil {
		return run, fmt.Errorf("%s objects: %w", object, err)
	}
	env.progressf("%s objects, the tier alone: write-through %.0f MB/s, load %.0f MB/s", object, run.TierPutMBps, run.TierGetMBps)
	after, err := mooncakeRaw(env, cfg, mb, object+" objects, after the tier alone", obj, n, perCall, staging)
	if err != nil {
		return run, err
	}
	run.ObjectPutMBps, run.ObjectGetMBps = (before.PutMBps+after.PutMBps)/2, (before.GetMBps+after.GetMBps)/2
	run.ObjectGetCheckedMBps = (before.GetCheckedMBps + after.GetCheckedMBps) / 2
	bytes := int64(env.blocks) * l.BlockBytes()
	// The same dumps into the same chain without the pool, right before: the engine's own
	// rate on this disk, which a dump written through can at best match.
	alone := filepath.Join(env.storeDir, "nopool")
	if err := os.RemoveAll(alone); err != nil {
		return run, err
	}
	e, err := engine.Open(alone, mooncakeOpts(env, nil, alone, mb.MemoryBytes))
	if err != nil {
		return run, err
	}
	var cpu time.Duration
	startCPU := func() { cpu = processCPU() }
	d, err := engineDumps(env, e, 0, false, startCPU, nil)
	run.DumpAloneCPU = perGiB(processCPU()-cpu, bytes)
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.RemoveAll(alone)
	}
	if err != nil {
		return run, fmt.Errorf("%s objects: dump without the pool: %w", object, err)
	}
	run.DumpAloneMBps = mbps(bytes, d)
	dir := filepath.Join(env.storeDir, object)
	if err := os.RemoveAll(dir); err != nil {
		return run, err
	}
	pool := mooncakeTier(env, cfg, object)
	opts := mooncakeOpts(env, &pool, dir, mb.MemoryBytes)
	if e, err = engine.Open(dir, opts); err != nil {
		return run, err
	}
	var split dumpSplit
	dumpTime, err := engineDumps(env, e, 0, false, startCPU, &split)
	run.DumpCPU = perGiB(processCPU()-cpu, bytes)
	run.DumpShare = split.dumpShare()
	s, _ := e.MooncakeStats()
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return run, fmt.Errorf("%s objects: dump: %w", object, err)
	}
	if s.Puts == 0 {
		return run, fmt.Errorf("%s objects: no block written through (%+v)", object, s)
	}
	run.WrittenThrough = float64(s.Puts) / float64(env.blocks)
	// Every task waits for its write-throughs: the dumps' time is the write-throughs' too.
	run.DumpMBps = mbps(bytes, dumpTime)
	run.WriteThroughMBps = run.DumpMBps

	// Reopened: the memory tier is empty, the pool serves.
	if e, err = engine.Open(dir, opts); err != nil {
		return run, err
	}
	defer func() { _ = e.Close() }()
	dropCaches()
	d, err = loadAll(env, 0, -1, startCPU, engineLoads(e, -1))
	if err != nil {
		return run, fmt.Errorf("%s objects: load: %w", object, err)
	}
	run.LoadCPU = perGiB(processCPU()-cpu, bytes)
	s2, _ := e.MooncakeStats()
	run.LoadMBps, run.PoolHitRate = mbps(bytes, d), float64(s2.Hits)/float64(env.blocks)
	// One shard of every block: from a fresh instance (the first's memory tier holds some).
	if err := e.Close(); err != nil {
		return run, err
	}
	if e, err = engine.Open(dir, opts); err != nil {
		return run, err
	}
	if d, err = loadAll(env, 0, l.Shards/2, nil, engineLoads(e, l.Shards/2)); err != nil {
		return run, fmt.Errorf("%s objects: shard loads: %w", object, err)
	}
	run.ShardMBps = mbps(int64(env.blocks)*l.ShardBytes, d)

	if object == "block" {
		if err := sharedAndSkew(env, cfg, opts, e, mb); err != nil {
			return run, err
		}
		if err := spansDumps(env, cfg, mb, &run); err != nil {
			return run, err
		}
	}
	st, _ := e.MooncakeStats()
	mb.PoolRejected += st.Rejected
	mb.PoolErrors += st.Errors
	return run, nil
}

// dumpSplit adds up the nanoseconds an engine's dump tasks spent in their dumps and waiting
// for their write-throughs.
type dumpSplit struct{ inDump, inFlush atomic.Int64 }

// dumpShare is the share of the tasks' time in the dumps themselves.
func (s *dumpSplit) dumpShare() float64 {
	if tot := s.inDump.Load() + s.inFlush.Load(); tot > 0 {
		return float64(s.inDump.Load()) / float64(tot)
	}
	return 0
}

// engineDumps dumps blocks first.. with the bench's tasks into e and returns the time taken.
// Each block goes from its task's buffer, or with spans from its shards named apart
// (DumpSpans, as a connector names a block's tensors: the dump copies them into its record).
// With split each task then waits for its write-throughs (FlushMooncake), so the time is
// that of dumps that are in the pool when they return, and split adds up where it went.
func engineDumps(env *benchEnv, e *engine.Engine, first int, spans bool, onStart func(), split *dumpSplit) (time.Duration, error) {
	l := env.opts.Layout
	return runTasks(env, first, l.BlockBytes(), onStart, func(ids []format.BlockID, bufs [][]byte) error {
		for i, id := range ids {
			env.payload.fill(bufs[i], id)
		}
		t0 := time.Now()
		var err error
		if spans {
			src := make([][][]byte, len(ids))
			for i, b := range bufs {
				for sh := int64(0); sh < int64(l.Shards); sh++ {
					src[i] = append(src[i], b[sh*l.ShardBytes:(sh+1)*l.ShardBytes])
				}
			}
			err = e.DumpSpans(ids, engine.AllShards, src).Wait()
		} else {
			err = e.Dump(ids, bufs).Wait()
		}
		if err != nil || split == nil {
			return err
		}
		// Write-throughs never hold a dump back, and a burst larger than the tier's put
		// slots is dropped; here every dump waits for them.
		t1 := time.Now()
		e.FlushMooncake()
		split.inDump.Add(int64(t1.Sub(t0)))
		split.inFlush.Add(int64(time.Since(t1)))
		return nil
	})
}

// spansDumps measures an engine's dumps of blocks named shard by shard (engineDumps with
// spans), into a store of their own without the pool and then with it, the blocks after
// every other phase's (new keys in the pool).
func spansDumps(env *benchEnv, cfg tiers.MooncakeConfig, mb *mooncakeBench, run *mooncakeLayoutRun) error {
	bytes := int64(env.blocks) * env.opts.Layout.BlockBytes()
	pool := mooncakeTier(env, cfg, "block")
	var cpu time.Duration
	startCPU := func() { cpu = processCPU() }
	for _, withPool := range []bool{false, true} {
		dir := filepath.Join(env.storeDir, "spans")
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		var p *tiers.MooncakeConfig
		var split *dumpSplit
		if withPool {
			p, split = &pool, &dumpSplit{}
		}
		e, err := engine.Open(dir, mooncakeOpts(env, p, dir, mb.MemoryBytes))
		if err != nil {
			return err
		}
		d, err := engineDumps(env, e, env.blocks, true, startCPU, split)
		used := perGiB(processCPU()-cpu, bytes)
		s, _ := e.MooncakeStats()
		if cerr := e.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.RemoveAll(dir)
		}
		if err != nil {
			return fmt.Errorf("block objects: dumps from spans (pool %v): %w", withPool, err)
		}
		if !withPool {
			run.SpansDumpAloneMBps, run.SpansDumpAloneCPU = mbps(bytes, d), used
			continue
		}
		if s.Puts != uint64(env.blocks) {
			return fmt.Errorf("block objects: dumps from spans: %d of %d blocks written through (%+v)", s.Puts, env.blocks, s)
		}
		run.SpansDumpMBps, run.SpansDumpCPU = mbps(bytes, d), used
		run.SpansLent = float64(s.PutsLent) / float64(env.blocks)
		mb.PoolRejected += s.Rejected
		mb.PoolErrors += s.Errors
	}
	env.progressf("block objects, dumps from spans: %.0f MB/s without the pool, %.0f MB/s written through (%.2f from lent payloads)",
		run.SpansDumpAloneMBps, run.SpansDumpMBps, run.SpansLent)
	return nil
}

// sharedAndSkew runs phases 3 and 4 against the block-object store e.
func sharedAndSkew(env *benchEnv, cfg tiers.MooncakeConfig, opts engine.Options, e *engine.Engine, mb *mooncakeBench) error {
	l := env.opts.Layout
	bytes := int64(env.blocks) * l.BlockBytes()
	// 3. Another instance, nothing on its disk.
	dir2 := filepath.Join(env.storeDir, "second")
	if err := os.RemoveAll(dir2); err != nil {
		return err
	}
	opts2 := opts
	pool := mooncakeTier(env, cfg, "block")
	opts2.Tiers = mooncakeOpts(env, &pool, dir2, mb.MemoryBytes).Tiers
	e2, err := engine.Open(dir2, opts2)
	if err != nil {
		return err
	}
	d, err := loadAll(env, 0, -1, nil, engineLoads(e2, -1))
	s, _ := e2.MooncakeStats()
	_ = e2.Close()
	if err != nil {
		return fmt.Errorf("second instance: %w", err)
	}
	mb.SharedMBps, mb.SharedHits = mbps(bytes, d), float64(s.Hits)/float64(env.blocks)
	env.progressf("second instance: load %.0f MB/s, pool hit rate %.3f", mb.SharedMBps, mb.SharedHits)

	// 4. Skewed reuse: block i with probability ∝ 1/(i+1) (Zipf, s = 1).
	before, _ := e.MooncakeStats()
	memBefore := e.Stats().MemoryHits
	mb.SkewLoads = 4 * env.blocks
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.1, 1, uint64(env.blocks-1))
	picks := make([]int, mb.SkewLoads)
	for i := range picks {
		picks[i] = int(z.Uint64())
	}
	buf := make([]byte, l.BlockBytes())
	start := time.Now()
	for _, p := range picks {
		id := blockID(p)
		if err := e.Load([]format.BlockID{id}, [][]byte{buf}).Wait(); err != nil {
			return fmt.Errorf("skewed loads: %w", err)
		}
		if err := env.payload.checkStamps(buf, id, 0); err != nil {
			return fmt.Errorf("skewed loads: %w", err)
		}
	}
	elapsed := time.Since(start)
	after, _ := e.MooncakeStats()
	n := float64(mb.SkewLoads)
	mb.SkewMemory = float64(e.Stats().MemoryHits-memBefore) / n
	mb.SkewPool = float64(after.Hits-before.Hits) / n
	mb.SkewDisk = 1 - mb.SkewMemory - mb.SkewPool
	mb.SkewMBps = mbps(int64(mb.SkewLoads)*l.BlockBytes(), elapsed)
	env.progressf("skewed loads: memory %.3f, pool %.3f, disk %.3f of %d loads, %.0f MB/s", mb.SkewMemory, mb.SkewPool, mb.SkewDisk, mb.SkewLoads, mb.SkewMBps)
	return nil
}

// printMooncake prints the mooncake workload's rows.
func printMooncake(row func(k, format string, args ...any), m *mooncakeBench) {
	row("mooncake master", "%s (pool: %s held by a second process; memory tier %s)", m.Master, cliutil.HumanBytes(m.HolderBytes), cliutil.HumanBytes(m.MemoryBytes))
	for _, r := range m.Pool {
		row("pool (raw client)", "%s (%d bytes, %d per call, %s of memory): put %.1f MB/s, get %.1f MB/s, get checked in place %.1f MB/s; CPU %.2f / %.2f / %.2f s per GiB; machine busy %.2f / %.2f / %.2f",
			r.What, r.ObjectBytes, r.PerCall, cliutil.HumanBytes(r.MemoryBytes), r.PutMBps, r.GetMBps, r.GetCheckedMBps, r.PutCPU, r.GetCPU, r.GetCheckedCPU, r.PutBusy, r.GetBusy, r.GetCheckedBusy)
	}
	for _, r := range m.Layouts {
		row(r.Object+" objects", "the tier alone: write-through %.1f MB/s (%.2f x raw put of these objects), load %.1f MB/s (%.2f x raw get, %.2f x raw get checked in place); CPU %.2f / %.2f s per GiB; machine busy %.2f / %.2f",
			r.TierPutMBps, r.TierPutRatio, r.TierGetMBps, r.TierGetRatio, r.TierGetCheckedRatio, r.TierPutCPU, r.TierGetCPU, r.TierPutBusy, r.TierGetBusy)
		row(r.Object+" objects", "dump+write-through %.1f MB/s (%.2f x pool put, %.2f x raw put of these objects; %.3f of blocks in the pool); load %.1f MB/s (%.2f x pool get, %.2f x raw get of these objects; pool hit rate %.3f); one shard per block %.1f MB/s",
			r.WriteThroughMBps, r.WriteThroughRate, r.WriteThroughObjRatio, r.WrittenThrough, r.LoadMBps, r.LoadRatio, r.LoadObjRatio, r.PoolHitRate, r.ShardMBps)
		row(r.Object+" objects", "dump without the pool %.1f MB/s: dump+write-through at %.2f x that", r.DumpAloneMBps, r.DumpRatio)
		row(r.Object+" objects", "CPU: dump+write-through %.2f s per GiB (without the pool %.2f), load %.2f s per GiB; tasks' time in the dump itself %.2f, waiting for the write-through %.2f", r.DumpCPU, r.DumpAloneCPU, r.LoadCPU, r.DumpShare, 1-r.DumpShare)
		if r.TierLentPutMBps > 0 {
			row(r.Object+" objects", "the tier alone from lent payloads: write-through %.1f MB/s (%.2f x raw put of these objects); CPU %.2f s per GiB; machine busy %.2f",
				r.TierLentPutMBps, r.TierLentPutRatio, r.TierLentPutCPU, r.TierLentPutBusy)
			row(r.Object+" objects", "dumps from spans (copied into the record): %.1f MB/s without the pool, %.1f MB/s written through (%.2f x that; %.3f of blocks put from lent payloads); CPU %.2f / %.2f s per GiB",
				r.SpansDumpAloneMBps, r.SpansDumpMBps, r.SpansDumpRatio, r.SpansLent, r.SpansDumpAloneCPU, r.SpansDumpCPU)
		}
	}
	row("second instance", "load %.1f MB/s (%.2f x pool get), pool hit rate %.3f", m.SharedMBps, m.SharedRatio, m.SharedHits)
	row("skewed loads", "%d: memory %.3f, pool %.3f, disk %.3f; %.1f MB/s", m.SkewLoads, m.SkewMemory, m.SkewPool, m.SkewDisk, m.SkewMBps)
	row("pool problems", "%d objects rejected, %d errors", m.PoolRejected, m.PoolErrors)
}
