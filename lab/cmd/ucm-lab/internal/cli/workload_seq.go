package cli

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ucm-go/ucm/format"
)

// seqWorkload dumps every block once, in id order, with `concurrency` whole-block dump tasks
// of `batch` blocks in flight; closes and reopens the store so reads come from disk; then
// loads every block back the same way, checking every page's stamp, and finally (untimed)
// loads and compares every byte once more.
type seqWorkload struct{}

func (seqWorkload) name() string { return "seq" }

func (seqWorkload) defaults() map[string]string { return nil }

func (seqWorkload) blocks(cfg benchConfig, l format.Layout) (int, error) { return totalBlocks(cfg, l) }

func (seqWorkload) run(env *benchEnv, res *benchResult) error {
	e, recycledBefore, err := env.openForDump(res)
	if err != nil {
		return err
	}
	name, direct := e.IOEngine()
	res.IOEngine, res.Direct = name, direct
	blockBytes := e.Layout().BlockBytes()

	// Phase 1: dump.
	before := e.Stats()
	var (
		meter *ioMeter
		cpu   time.Duration
	)
	startMeters := func() { meter, cpu = startIOMeter(env.cfg.dir), processCPU() }
	dumpTime, err := runTasks(env, 0, blockBytes, startMeters, func(ids []format.BlockID, bufs [][]byte) error {
		for i, id := range ids {
			env.payload.fill(bufs[i], id)
		}
		return e.Dump(ids, bufs).Wait()
	})
	res.DumpCPUSeconds = (processCPU() - cpu).Seconds()
	res.DumpIO, res.SyncBytes = meter.end(), syncInterval(before, e.Stats())
	env.countRecycled(e, res, recycledBefore)
	// Phase 2: reopen (timed) and load everything back.
	e, err = env.reopenAfterDump(e, err, res, dumpTime)
	if err != nil {
		return err
	}
	defer func() { _ = e.Close() }()
	if _, direct := e.IOEngine(); !direct {
		res.CachesDropped = dropCaches()
	}
	var mismatch atomic.Pointer[error]
	loadTime, err := runTasks(env, 0, blockBytes, startMeters, func(ids []format.BlockID, bufs [][]byte) error {
		if err := e.Load(ids, bufs).Wait(); err != nil {
			return err
		}
		for i, id := range ids {
			if err := env.payload.checkStamps(bufs[i], id, 0); err != nil {
				mismatch.CompareAndSwap(nil, &err)
			}
		}
		return nil
	})
	res.LoadCPUSeconds = (processCPU() - cpu).Seconds()
	res.LoadIO = meter.end()
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	res.LoadMBps = mbps(res.TotalBytes, loadTime)
	res.loadTime = loadTime
	if err := verifyAll(env, e, &mismatch); err != nil {
		return err
	}
	if p := mismatch.Load(); p != nil {
		res.Verified = false
		res.mismatch = (*p).Error()
		return nil
	}
	res.Verified = true
	return nil
}

// runTasks runs fn over every block in batches (the bench's blocks first, first+1, ...: 0 for
// the workload's own), with cfg.concurrency batches in flight, each worker owning batch
// aligned buffers of blockBytes, or, with --buffer-span, as many groups of them as it takes
// for all the workers' to span it, a batch using the next group; it returns the wall time of
// the whole run. The first error stops new batches. onStart, when not nil, is called once the
// buffers are allocated and filled, right before the clock starts: a phase starts its CPU and
// device meters there, so that they measure what the clock does and not the buffers' first
// touch (on these VMs 1 GiB of fresh buffers takes about 2 s of CPU to fault in).
func runTasks(env *benchEnv, first int, blockBytes int64, onStart func(), fn func(ids []format.BlockID, bufs [][]byte) error) (time.Duration, error) {
	cfg := env.cfg
	var (
		next     atomic.Int64
		firstErr error
		errOnce  sync.Once
		failed   atomic.Bool
		wg       sync.WaitGroup
	)
	round := int64(cfg.concurrency*cfg.batch) * blockBytes // the buffers of one batch per worker
	groups := max(1, int((cfg.bufferSpan+round-1)/round))
	workers, release, err := env.workerBuffers(cfg.batch*groups, blockBytes)
	if err != nil {
		return 0, err
	}
	defer release()
	ids := make([]format.BlockID, env.blocks)
	for i := range ids {
		ids[i] = blockID(first + i)
	}
	if onStart != nil {
		onStart()
	}
	start := time.Now()
	for w := 0; w < cfg.concurrency; w++ {
		wg.Add(1)
		go func(bufs [][]byte) {
			defer wg.Done()
			for g := 0; !failed.Load(); g = (g + 1) % groups {
				lo := int(next.Add(int64(cfg.batch))) - cfg.batch
				if lo >= len(ids) {
					return
				}
				hi := min(len(ids), lo+cfg.batch)
				if err := fn(ids[lo:hi], bufs[g*cfg.batch:g*cfg.batch+hi-lo]); err != nil {
					errOnce.Do(func() { firstErr = err })
					failed.Store(true)
					return
				}
			}
		}(workers[w])
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// mbps is bytes per second in MB (10^6 bytes) per second.
func mbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / 1e6 / d.Seconds()
}

// dropCaches writes back dirty pages and drops the page cache so that loads without O_DIRECT
// read the device; it needs root and reports whether it worked.
func dropCaches() bool {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0) == nil
}
