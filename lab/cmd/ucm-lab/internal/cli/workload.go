package cli

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/wal"
)

// workload is one bench workload. run drives the engine through env and fills in the
// measured fields of the result (throughputs, open time, verification); bench prints it.
type workload interface {
	// name is the --workload value that selects it.
	name() string
	// defaults are flag values (by flag name) used when the user did not set the flag.
	defaults() map[string]string
	// blocks checks the configuration and says how many blocks the workload stores.
	blocks(cfg benchConfig, l format.Layout) (int, error)
	run(env *benchEnv, res *benchResult) error
}

// workloads lists the available workloads by name. Add new ones here.
var workloads = map[string]func() workload{
	"seq":       func() workload { return seqWorkload{} },
	"layerwise": func() workload { return layerwiseWorkload{} },
	"lookup":    func() workload { return lookupWorkload{} },
	"open":      func() workload { return openWorkload{} },
	"trace":     func() workload { return &traceWorkload{} },
	"mooncake":  func() workload { return mooncakeWorkload{} },
	// shared-capacity: instances sharing one tier with a capacity (workload_shared.go).
	"shared-capacity": func() workload { return sharedWorkload{} },
}

// totalBlocks is --total / --block-size, for the workloads that dump --total bytes.
func totalBlocks(cfg benchConfig, l format.Layout) (int, error) {
	if cfg.total < l.BlockBytes() {
		return 0, fmt.Errorf("--total %d is less than one block (%d bytes)", cfg.total, l.BlockBytes())
	}
	blocks := cfg.total / l.BlockBytes()
	if blocks > 1<<31 {
		return 0, fmt.Errorf("--total %d: too many blocks (%d)", cfg.total, blocks)
	}
	return int(blocks), nil
}

// metadataDefaults are the defaults of the workloads that only need many indexed blocks:
// a tiny layout, no syncs and big dump tasks.
var metadataDefaults = map[string]string{"block-size": "4KiB", "shards": "1", "sync": "none", "batch": "1024"}

func workloadNames() string {
	var names []string
	for n := range workloads {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// benchEnv is what a workload gets: the configuration, a way to (re)open the bench store,
// and the deterministic payloads.
type benchEnv struct {
	cfg     benchConfig
	blocks  int
	payload *payloadPool
	// storeDir is the bench store; opts open it.
	storeDir string
	opts     engine.Options
	stderr   io.Writer
	// buffers says where the last workerBuffers' buffers live (benchResult.Buffers), and
	// bufferBytes how much memory the largest set of them spans (benchResult.HostBufferBytes).
	buffers     string
	bufferBytes int64
	// timings gathers the engine's flight and load timings (--timings); nil without.
	timings *timingCollector
	// filled is how many blocks --recycled's fill dumped into the open store (openForDump).
	filled int64
}

// takeTimings returns the engine timings gathered since the last call (none without
// --timings).
func (env *benchEnv) takeTimings() ([]wal.FlightTiming, []engine.LoadTiming) {
	if env.timings == nil {
		return nil, nil
	}
	return env.timings.take()
}

// sampleQueue starts sampling the device queue of --dir with --timings; nil (whose end returns
// nil) without.
func (env *benchEnv) sampleQueue() *queueSampler {
	if env.timings == nil {
		return nil
	}
	return sampleQueue(env.cfg.dir)
}

// open opens the bench store (creating it the first time) and says how long it took.
func (env *benchEnv) open() (*engine.Engine, time.Duration, error) { return env.openDir(env.storeDir) }

// openDir opens the store in dir with the bench options.
func (env *benchEnv) openDir(dir string) (*engine.Engine, time.Duration, error) {
	opts := env.opts
	if opts.Tiers != nil {
		// The disk tier lives in the store directory: in dir's, not the bench store's.
		opts.Tiers = benchTiers(env.cfg, dir)
	}
	return env.openDirWith(dir, opts)
}

// openDirWith opens the store in dir with opts (a workload's variant of the bench options).
func (env *benchEnv) openDirWith(dir string, opts engine.Options) (*engine.Engine, time.Duration, error) {
	start := time.Now()
	e, err := engine.Open(dir, opts)
	if err != nil {
		return nil, 0, &cliutil.ExitError{Code: cliutil.ExitUsage, Err: err}
	}
	return e, time.Since(start), nil
}

// recycledFirst numbers the blocks --recycled fills the store with: far from the workload's.
const recycledFirst = 1 << 40

// openForDump opens the bench store for a seq or layerwise run's timed dump and returns the
// engine's count of recycled segments at that point. With --recycled it first fills the store
// with as many other blocks (untimed) and evicts them all, so that the timed dump writes into
// the segment files they leave (engine.Options.RecycleSegments), as a store at capacity does:
// their blocks are allocated and written, where a new file's writes pay for block allocation
// and for converting unwritten extents (on ext4 and XFS in the journal; on ext4 without one,
// by synchronous metadata writes in the next fdatasync: docs/performance.md).
func (env *benchEnv) openForDump(res *benchResult) (*engine.Engine, int64, error) {
	env.filled = 0
	e, _, err := env.open()
	if err != nil || !env.cfg.recycled {
		return e, 0, err
	}
	res.Recycled = true
	env.progressf("recycled: filling the store with %d other blocks, then evicting them", env.blocks)
	l := e.Layout()
	_, err = runTasks(env, recycledFirst, l.BlockBytes(), nil, func(ids []format.BlockID, bufs [][]byte) error {
		return e.Dump(ids, bufs).Wait()
	})
	if err == nil {
		// Segments are sealed in the background once their records are published, and only
		// sealed ones are retired: Sync waits for the seals, so that the eviction retires
		// every segment the fill filled and the timed dump finds all their files pooled.
		err = e.Sync()
	}
	if err == nil {
		_, err = e.Evict("", 0)
	}
	if err != nil {
		_ = e.Close()
		return nil, 0, fmt.Errorf("--recycled: fill and evict: %w", err)
	}
	st := e.Stats()
	env.filled = st.DumpedBlocks
	return e, st.SegmentsRecycled, nil
}

// countRecycled records in res, with --recycled, how many segments of the timed dump reused a
// file (before: openForDump's count).
func (env *benchEnv) countRecycled(e *engine.Engine, res *benchResult, before int64) {
	if env.cfg.recycled {
		n := e.Stats().SegmentsRecycled - before
		res.SegmentsRecycled = &n
	}
}

// progressf prints a progress line on stderr unless the output is JSON.
func (env *benchEnv) progressf(format string, args ...any) {
	if !env.cfg.json {
		fmt.Fprintf(env.stderr, "bench: "+format+"\n", args...)
	}
}

// blockID is the id of the bench's i-th block: MD5 of the counter.
func blockID(i int) format.BlockID {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	return md5.Sum(b[:])
}

// payloadSeed seeds the payload body: any reader that knows it regenerates it and checks
// every block's bytes without an oracle.
const payloadSeed = 0x75636d2d62656e63 // "ucm-benc"

// stampPage is the unit the payload is stamped in.
const stampPage = 4096

// payloadPool makes the bench's deterministic payloads: block id's bytes are a pseudo-random
// body (the same for every block) whose every 4 KiB page starts with a 16-byte stamp of (id,
// page number). A check therefore catches another block's bytes, a page at the wrong offset
// and a stale page, while filling a reused buffer only rewrites the stamps: payload generation
// stays out of the timed I/O (a connector's device-to-host copy is not the engine's cost).
type payloadPool struct {
	body []byte
}

func newPayloadPool(blockBytes int64) *payloadPool {
	b := make([]byte, blockBytes)
	r := rand.New(rand.NewPCG(payloadSeed, 0))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint64())
	}
	return &payloadPool{body: b}
}

// stamp returns the 16 bytes that start page `page` of block id.
func stamp(id format.BlockID, page int64) [16]byte {
	s := id
	binary.LittleEndian.PutUint64(s[:8], binary.LittleEndian.Uint64(id[:8])^uint64(page)*0x9e3779b97f4a7c15)
	return s
}

// fill writes block id's bytes into dst (len = block bytes). A buffer that already holds the
// body (it was filled before) only gets its stamps rewritten.
func (p *payloadPool) fill(dst []byte, id format.BlockID) { p.fillRange(dst, id, 0) }

// fillRange writes bytes [off, off+len(dst)) of block id into dst, as fill does for a whole
// block: the body is copied only where dst does not hold it already, the stamps always.
func (p *payloadPool) fillRange(dst []byte, id format.BlockID, off int64) {
	end := off + int64(len(dst))
	if len(dst) < 64 || !bytes.Equal(dst[16:64], p.body[off+16:off+64]) {
		copy(dst, p.body[off:end])
	}
	for page := off / stampPage * stampPage; page < end; page += stampPage {
		s := stamp(id, page/stampPage)
		if lo, hi := max(page, off), min(page+int64(len(s)), end); lo < hi {
			copy(dst[lo-off:hi-off], s[lo-page:hi-page])
		}
	}
}

// checkRange reports where dst differs from bytes [off, off+len(dst)) of block id.
func (p *payloadPool) checkRange(dst []byte, id format.BlockID, off int64) error {
	if off < 0 || off+int64(len(dst)) > int64(len(p.body)) {
		return fmt.Errorf("block %s: %d bytes at %d, block is %d", id, len(dst), off, len(p.body))
	}
	end := off + int64(len(dst))
	for page := off / stampPage * stampPage; page < end; page += stampPage {
		s := stamp(id, page/stampPage)
		lo, hi := max(page, off), min(page+stampPage, end)
		for j := lo; j < hi; j++ {
			want := p.body[j]
			if j-page < int64(len(s)) {
				want = s[j-page]
			} else if bytes.Equal(dst[j-off:hi-off], p.body[j:hi]) {
				break
			}
			if dst[j-off] != want {
				return fmt.Errorf("block %s: byte %d is %#02x, want %#02x", id, j, dst[j-off], want)
			}
		}
	}
	return nil
}

// checkStamps reports the first 4 KiB page of dst, holding bytes [off, off+len(dst)) of block
// id, whose stamp is not (id, page): a page of another block, of another place in this block,
// or never written. It reads 16 bytes a page, so the timed loads can afford it on every page;
// the rest of each page is the shared body, which the engine's checksums cover and verifyAll
// compares after the timing.
func (p *payloadPool) checkStamps(dst []byte, id format.BlockID, off int64) error {
	if off < 0 || off+int64(len(dst)) > int64(len(p.body)) {
		return fmt.Errorf("block %s: %d bytes at %d, block is %d", id, len(dst), off, len(p.body))
	}
	end := off + int64(len(dst))
	for page := off / stampPage * stampPage; page < end; page += stampPage {
		s := stamp(id, page/stampPage)
		lo, hi := max(page, off), min(page+int64(len(s)), end)
		if lo < hi && !bytes.Equal(dst[lo-off:hi-off], s[lo-page:hi-page]) {
			return fmt.Errorf("block %s: page %d (bytes %d..%d) holds another page's stamp %x", id, page/stampPage, lo, hi, dst[lo-off:hi-off])
		}
	}
	return nil
}

// verifyAll loads every one of the env's blocks whole, cfg.concurrency tasks at a time, and
// compares every byte; it runs after the timed phases, so a workload's rates measure the
// engine (with the stamp checks above), not the bench comparing gigabytes. It returns the
// first mismatch in *mismatch (unless one is there already) and any load error.
func verifyAll(env *benchEnv, e *engine.Engine, mismatch *atomic.Pointer[error]) error {
	_, err := runTasks(env, 0, e.Layout().BlockBytes(), nil, func(ids []format.BlockID, bufs [][]byte) error {
		if err := e.Load(ids, bufs).Wait(); err != nil {
			return err
		}
		for i, id := range ids {
			if err := env.payload.check(bufs[i], id); err != nil {
				mismatch.CompareAndSwap(nil, &err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

// check reports where dst differs from block id's bytes, nil when it matches.
func (p *payloadPool) check(dst []byte, id format.BlockID) error {
	if len(dst) != len(p.body) {
		return fmt.Errorf("block %s: %d bytes, want %d", id, len(dst), len(p.body))
	}
	return p.checkRange(dst, id, 0)
}

// parallel calls fn(worker, i) for every i in [0, n), with `workers` goroutines taking the
// next i in order, and returns the wall time. The first error stops new calls.
func parallel(n, workers int, fn func(worker, i int) error) (time.Duration, error) {
	var (
		next     atomic.Int64
		firstErr error
		errOnce  sync.Once
		failed   atomic.Bool
		wg       sync.WaitGroup
	)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(w, i); err != nil {
					errOnce.Do(func() { firstErr = err })
					failed.Store(true)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// workerBuffers returns --concurrency × perWorker buffers of size bytes for the tasks'
// payloads, [worker][slot]: from huge-page host memory (--buffers huge, the default: what a
// connector's pinned KV buffer pool is; devio.HostMemory) or from the Go heap (--buffers
// heap), and records which in env.buffers for the report. release frees them once no task
// uses them.
//
// The buffers are resident and hold the payload body before any clock starts, as a
// connector's pinned buffers are and as fio fills its buffers before its jobs run: a timed
// dump then only rewrites each block's stamps, and no timed phase pays for faulting in fresh
// memory (on a VM, first touch of 512 MiB of huge pages took longer than writing them out).
func (env *benchEnv) workerBuffers(perWorker int, size int64) (bufs [][][]byte, release func(), err error) {
	bufs, release, err = env.allocBuffers(perWorker, size)
	if err != nil {
		return nil, nil, err
	}
	for _, w := range bufs {
		for _, b := range w {
			if len(b) == len(env.payload.body) {
				copy(b, env.payload.body)
			} else {
				clear(b)
			}
		}
	}
	return bufs, release, nil
}

// allocBuffers allocates workerBuffers' buffers.
func (env *benchEnv) allocBuffers(perWorker int, size int64) (bufs [][][]byte, release func(), err error) {
	cfg := env.cfg
	bufs = make([][][]byte, cfg.concurrency)
	env.bufferBytes = max(env.bufferBytes, int64(cfg.concurrency*perWorker)*size)
	if cfg.buffers == "heap" {
		for w := range bufs {
			bufs[w] = make([][]byte, perWorker)
			for j := range bufs[w] {
				bufs[w][j] = devio.AlignedBuffer(int(size))
			}
		}
		env.buffers = "heap"
		return bufs, func() {}, nil
	}
	m, flat, err := devio.NewHostBuffers(cfg.concurrency*perWorker, int(size))
	if err != nil {
		return nil, nil, fmt.Errorf("--buffers huge: %w (--buffers heap uses Go heap memory)", err)
	}
	env.buffers = "huge"
	if !m.Huge() {
		env.buffers = "huge (4 KiB pages: advice refused)"
	}
	for w := range bufs {
		bufs[w] = flat[w*perWorker : (w+1)*perWorker : (w+1)*perWorker]
	}
	return bufs, func() { _ = m.Close() }, nil
}

// reopenAfterDump ends a timed dump phase: it syncs (inside the timed dump) and closes the
// engine (failing with the dump's error if there was one), records the dump rate, and reopens
// the store, recording the open time, so that the load phase reads from disk.
func (env *benchEnv) reopenAfterDump(e *engine.Engine, dumpErr error, res *benchResult, dumpTime time.Duration) (*engine.Engine, error) {
	if dumpErr != nil {
		_ = e.Close()
		return nil, fmt.Errorf("dump: %w", dumpErr)
	}
	st := e.Stats()
	if st.DumpedBlocks-env.filled != int64(res.Blocks) {
		_ = e.Close()
		return nil, fmt.Errorf("dump wrote %d of %d blocks (%d deduplicated): the store was not fresh, the rate would be meaningless",
			st.DumpedBlocks, res.Blocks, st.DedupedDumps)
	}
	res.StagingPeakBytes, res.StagingPeakBlocks = st.StagingPeakBytes, st.StagingPeakBlocks
	// The dump is timed until its bytes are durable, as fio's write job is timed until its
	// end_fsync: with --sync none the flush happens here, not in the dumps.
	syncStart := time.Now()
	if err := e.Sync(); err != nil {
		_ = e.Close()
		return nil, fmt.Errorf("sync after dump: %w", err)
	}
	dumpTime += time.Since(syncStart)
	if err := e.Close(); err != nil {
		return nil, fmt.Errorf("close after dump: %w", err)
	}
	res.DumpMBps = mbps(res.TotalBytes, dumpTime)
	res.dumpTime = dumpTime
	e, openTime, err := env.open()
	if err != nil {
		return nil, fmt.Errorf("reopen: %w", err)
	}
	res.OpenSeconds = openTime.Seconds()
	return e, nil
}
