package cli

import (
	"bufio"
	"crypto/md5"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// traceTokensPerBlock is the number of prompt tokens one hash id of a Mooncake trace covers.
const traceTokensPerBlock = 512

// traceBufferBytes bounds the block buffers of one trace worker.
const traceBufferBytes = 64 << 20

// traceRequest is one line of a Mooncake-format trace.
type traceRequest struct {
	Timestamp    float64 `json:"timestamp"` // ms from the start of the trace
	InputLength  int64   `json:"input_length"`
	OutputLength int64   `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`

	ids []format.BlockID
}

// traceBlockID maps a trace hash id to a block id. The trace's ids already encode prefix
// sharing (equal ids = equal prefix blocks), so no chaining is needed.
func traceBlockID(h int64) format.BlockID {
	var b [13]byte
	copy(b[:], "trace")
	binary.LittleEndian.PutUint64(b[5:], uint64(h))
	return md5.Sum(b[:])
}

// readTrace parses a JSONL trace; it returns the requests and the number of distinct ids.
func readTrace(path string) ([]traceRequest, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = f.Close() }()
	var reqs []traceRequest
	distinct := map[int64]struct{}{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var r traceRequest
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, 0, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if r.InputLength < 0 {
			return nil, 0, fmt.Errorf("%s:%d: input_length %d", path, line, r.InputLength)
		}
		r.ids = make([]format.BlockID, len(r.HashIDs))
		for i, h := range r.HashIDs {
			r.ids[i] = traceBlockID(h)
			distinct[h] = struct{}{}
		}
		reqs = append(reqs, r)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("%s: %v", path, err)
	}
	if len(reqs) == 0 {
		return nil, 0, fmt.Errorf("%s: no requests", path)
	}
	return reqs, len(distinct), nil
}

// traceWorkload replays a request trace as a connector would: for each request, look up the
// prompt's blocks (LookupPrefix), load the leading run of hits, dump the rest (blocks already
// stored further on are deduplicated by the engine). Requests are taken in trace order by
// --concurrency workers; with --realtime they are released at their timestamps.
type traceWorkload struct {
	reqs []traceRequest
}

func (*traceWorkload) name() string { return "trace" }

func (*traceWorkload) defaults() map[string]string { return map[string]string{"batch": "64"} }

func (w *traceWorkload) blocks(cfg benchConfig, _ format.Layout) (int, error) {
	if cfg.tracePath == "" {
		return 0, fmt.Errorf("--trace: required by the trace workload")
	}
	if seg := engine.SegmentSizeFor(cfg.segmentSize, cfg.capacity); cfg.capacity > 0 && cfg.capacity/2 < seg {
		return 0, fmt.Errorf("--capacity %d: want at least two segments (--segment-size %d): one segment may be written beyond the capacity", cfg.capacity, seg)
	}
	reqs, distinct, err := readTrace(cfg.tracePath)
	if err != nil {
		return 0, fmt.Errorf("--trace: %v", err)
	}
	w.reqs = reqs
	return distinct, nil
}

func (w *traceWorkload) run(env *benchEnv, res *benchResult) error {
	cfg := env.cfg
	e, _, err := env.open()
	if err != nil {
		return err
	}
	defer func() { _ = e.Close() }()
	res.IOEngine, res.Direct = e.IOEngine()
	res.TraceFile = cfg.tracePath
	res.Requests = len(w.reqs)
	blockBytes := e.Layout().BlockBytes()
	chunk := max(1, min(cfg.batch, int(traceBufferBytes/blockBytes)))
	res.Batch = chunk

	var (
		hitBlocks, promptBlocks, hitTokens, tokens, loaded, gone atomic.Int64
		mismatch                                                 atomic.Pointer[error]
	)
	before := e.Stats()
	// With a capacity, sample the disk tier's accounted bytes for its peak.
	var peak atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, t := range e.TierStats() {
				if t.Kind == tiers.KindDisk && t.Used > peak.Load() {
					peak.Store(t.Used)
				}
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()
	workerBufs, release, err := env.workerBuffers(chunk, blockBytes)
	if err != nil {
		return err
	}
	defer release()
	work := make(chan *traceRequest)
	errs := make(chan error, cfg.concurrency)
	var wg sync.WaitGroup
	for w := range cfg.concurrency {
		wg.Add(1)
		go func(bufs [][]byte) {
			defer wg.Done()
			for r := range work {
				n, err := replayRequest(env, e, r, bufs, &mismatch, &gone)
				if err != nil {
					errs <- err
					for range work { // drain
					}
					return
				}
				hitBlocks.Add(int64(n))
				promptBlocks.Add(int64(len(r.ids)))
				hitTokens.Add(min(int64(n)*traceTokensPerBlock, r.InputLength))
				tokens.Add(r.InputLength)
				loaded.Add(int64(n) * blockBytes)
			}
		}(workerBufs[w])
	}
	env.progressf("replaying %d requests ...", len(w.reqs))
	start := time.Now()
	t0 := w.reqs[0].Timestamp
	for i := range w.reqs {
		if cfg.realtime {
			if d := time.Duration((w.reqs[i].Timestamp-t0)*1e6) - time.Since(start); d > 0 {
				time.Sleep(d)
			}
		}
		work <- &w.reqs[i]
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	close(stopSampling)
	<-sampled
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	after := e.Stats()

	res.ElapsedSeconds = elapsed.Seconds()
	res.PromptBlocks = promptBlocks.Load()
	res.HitBlocks = hitBlocks.Load()
	hr := float64(res.HitBlocks) / float64(max(1, res.PromptBlocks))
	res.HitRate = &hr
	res.TokenHitRate = float64(hitTokens.Load()) / float64(max(1, tokens.Load()))
	res.BytesLoaded = loaded.Load()
	res.BytesDumped = after.DumpedBytes - before.DumpedBytes
	res.RequestsPerSec = float64(len(w.reqs)) / elapsed.Seconds()
	res.ThroughputMBps = mbps(res.BytesLoaded+res.BytesDumped, elapsed)
	if cfg.capacity > 0 || cfg.memory > 0 {
		evicted, retired := after.EvictedBlocks-before.EvictedBlocks, after.SegmentsRetired-before.SegmentsRetired
		recycled := after.SegmentsRecycled - before.SegmentsRecycled
		res.EvictedBlocks, res.SegmentsRetired, res.SegmentsRecycled, res.ReloadMisses = &evicted, &retired, &recycled, gone.Load()
	}
	if cfg.capacity > 0 {
		res.CapacityBytes, res.PeakUsedBytes = cfg.capacity, peak.Load()
		over := max(0, res.PeakUsedBytes-cfg.capacity)
		res.CapacityExceededBy = &over
	}
	if cfg.memory > 0 {
		hits := after.MemoryHits - before.MemoryHits
		res.MemoryBytes, res.MemoryHits = cfg.memory, &hits
	}
	if p := mismatch.Load(); p != nil {
		res.mismatch = (*p).Error()
		return nil
	}
	res.Verified = true
	return nil
}

// replayRequest serves one request: it returns the length of the leading run of stored blocks,
// which it loaded (and checked), after dumping the rest. With a capacity a block found by the
// lookup can be evicted before its load: the run ends there (counted in gone) and the rest is
// dumped again.
func replayRequest(env *benchEnv, e *engine.Engine, r *traceRequest, bufs [][]byte, mismatch *atomic.Pointer[error], gone *atomic.Int64) (int, error) {
	n := e.LookupPrefix(r.ids)
load:
	for lo := 0; lo < n; lo += len(bufs) {
		ids := r.ids[lo:min(n, lo+len(bufs))]
		dst := bufs[:len(ids)]
		t := e.Load(ids, dst)
		if err := t.Wait(); err != nil {
			errs := t.BlockErrors()
			first := -1
			for i, be := range errs {
				if be != nil {
					if !errors.Is(be, engine.ErrNotFound) {
						return 0, fmt.Errorf("load: %w", err)
					}
					if first < 0 {
						first = i
					}
				}
			}
			if first < 0 {
				return 0, fmt.Errorf("load: %w", err)
			}
			gone.Add(int64(n - (lo + first)))
			ids, dst = ids[:first], dst[:first]
			n = lo + first
			for i, id := range ids {
				if err := env.payload.check(dst[i], id); err != nil {
					mismatch.CompareAndSwap(nil, &err)
				}
			}
			break load
		}
		for i, id := range ids {
			if err := env.payload.check(dst[i], id); err != nil {
				mismatch.CompareAndSwap(nil, &err)
			}
		}
	}
	for lo := n; lo < len(r.ids); lo += len(bufs) {
		ids := r.ids[lo:min(len(r.ids), lo+len(bufs))]
		src := bufs[:len(ids)]
		for i, id := range ids {
			env.payload.fill(src[i], id)
		}
		if err := e.Dump(ids, src).Wait(); err != nil {
			return 0, fmt.Errorf("dump: %w", err)
		}
	}
	return n, nil
}
