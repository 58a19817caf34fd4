package sparse

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/engine"
)

// The prefetch engine (GSA 002, sources §3B) and the cache it fills (GSA 000's "GPU cache",
// sources §3A): a selection names the blocks a decode step attends; those whose KV is not resident are
// loaded from the store. A Prefetcher loads the blocks a selection predicts for the next steps
// in the background, by priority, so that the step needing them finds them resident; Acquire
// is the attention step's side: it returns the resident shards, waits for those in flight and
// loads the rest on demand. The unit is one layer's shard of one block (a layer's selection is
// its own), keyed by (block id, layer).

// Typed errors of the prefetch engine.
var (
	// ErrPrefetchClosed: the prefetcher is closed; queued tasks are dropped with it.
	ErrPrefetchClosed = errors.New("sparse: prefetcher closed")
	// ErrPrefetchFull: the queue holds max_pending_prefetch tasks all at least as urgent.
	ErrPrefetchFull = errors.New("sparse: prefetch queue full")
)

// BlockLoadError is a block shard that failed to load: the block is reported, never attended
// with stale or partial bytes.
type BlockLoadError struct {
	// ID is the block's stored id, Layer the shard.
	ID    engine.BlockID
	Layer int
	// Err is the cause (engine.ErrNotFound, engine.ErrCorrupt, a context's error, ...).
	Err error
}

// Error names the block, the layer and the cause.
func (e *BlockLoadError) Error() string {
	return fmt.Sprintf("sparse: block %s layer %d: load: %v", e.ID, e.Layer, e.Err)
}

// Unwrap returns the cause.
func (e *BlockLoadError) Unwrap() error { return e.Err }

// PrefetchPriority orders prefetch tasks: lower is more urgent (sources §3B).
type PrefetchPriority int

// Priorities.
const (
	// PriorityUrgent: the request runs next.
	PriorityUrgent PrefetchPriority = iota
	// PriorityHigh: the request runs within the next batches.
	PriorityHigh
	// PriorityNormal: an ordinary request.
	PriorityNormal
	// PriorityLow: speculative; the blocks are only promoted (BlockPromoter), not loaded into the
	// cache.
	PriorityLow
)

// PriorityForPosition is 002's compute_priority from a request's position in the batch queue:
// 0 urgent, ≤ 4 high, ≤ 16 normal, else low.
func PriorityForPosition(pos int) PrefetchPriority {
	switch {
	case pos <= 0:
		return PriorityUrgent
	case pos <= 4:
		return PriorityHigh
	case pos <= 16:
		return PriorityNormal
	}
	return PriorityLow
}

// BlockLoader reads stored blocks' KV, one layer's shard of each: dst[i] receives the shard
// layer of block ids[i]. It returns nil when every block loaded, else one error per block (nil
// for those that loaded). It must stop within ctx.
type BlockLoader interface {
	LoadShards(ctx context.Context, layer int, ids []engine.BlockID, dst [][]byte) []error
}

// BlockPromoter is optionally implemented by a BlockLoader: Promote moves blocks nearer to
// memory without loading them into the cache (the engine's Prefetch). Speculative
// (PriorityLow) tasks promote instead of occupying cache entries.
type BlockPromoter interface {
	Promote(ctx context.Context, ids []engine.BlockID) []error
}

// EngineBlocks is the engine as a BlockLoader (LoadShard, a shard being
// Layout().ShardBytes bytes) and a BlockPromoter (Prefetch).
type EngineBlocks struct{ Engine *engine.Engine }

// LoadShards loads through engine.LoadShard and waits within ctx.
func (b EngineBlocks) LoadShards(ctx context.Context, layer int, ids []engine.BlockID, dst [][]byte) []error {
	t := b.Engine.LoadShard(ids, layer, dst)
	if t.WaitContext(ctx) == nil {
		return nil
	}
	return t.BlockErrors()
}

// Promote runs engine.Prefetch and waits within ctx.
func (b EngineBlocks) Promote(ctx context.Context, ids []engine.BlockID) []error {
	t := b.Engine.Prefetch(ids)
	if t.WaitContext(ctx) == nil {
		return nil
	}
	return t.BlockErrors()
}

// PrefetchOptions configure a Prefetcher (GSA's prefetch keys).
type PrefetchOptions struct {
	// Loader reads the blocks (required); ShardBytes is one shard's size.
	Loader     BlockLoader
	ShardBytes int
	// Workers is the loads run at once (prefetch_workers); MaxPending the tasks queued at most
	// (max_pending_prefetch); CacheBlocks the shards resident at most (prefetch_cache_size).
	Workers, MaxPending, CacheBlocks int
	// Eviction chooses the resident shard a load replaces when the cache is full.
	Eviction EvictionPolicy
}

// Bounds of PrefetchOptions.
const (
	MaxPrefetchWorkers = 256
	MaxPrefetchPending = 1 << 16
	MaxPrefetchCache   = 1 << 22
)

func (o *PrefetchOptions) validate() error {
	switch {
	case o.Loader == nil:
		return fmt.Errorf("%w: prefetch: no block loader", ErrInvalid)
	case o.ShardBytes < 1:
		return fmt.Errorf("%w: prefetch: shard bytes %d", ErrInvalid, o.ShardBytes)
	case o.Workers < 1 || o.Workers > MaxPrefetchWorkers:
		return fmt.Errorf("%w: prefetch: workers %d not in [1, %d]", ErrInvalid, o.Workers, MaxPrefetchWorkers)
	case o.MaxPending < 1 || o.MaxPending > MaxPrefetchPending:
		return fmt.Errorf("%w: prefetch: max pending %d not in [1, %d]", ErrInvalid, o.MaxPending, MaxPrefetchPending)
	case o.CacheBlocks < 1 || o.CacheBlocks > MaxPrefetchCache:
		return fmt.Errorf("%w: prefetch: cache size %d not in [1, %d]", ErrInvalid, o.CacheBlocks, MaxPrefetchCache)
	case o.Eviction < EvictLRU || o.Eviction > EvictHybrid:
		return fmt.Errorf("%w: prefetch: eviction policy %d", ErrInvalid, int(o.Eviction))
	}
	return nil
}

// PrefetchStats counts what a Prefetcher did.
type PrefetchStats struct {
	// Submitted is the tasks queued; Replaced those that replaced a queued task of the same
	// request and layer (the newest prediction wins); Displaced the queued tasks dropped for a
	// more urgent one when the queue was full; Rejected the submissions refused (queue full).
	Submitted, Replaced, Displaced, Rejected int64
	// Prefetched is the shards the workers loaded, PrefetchFailed those whose load failed,
	// Promoted the blocks promoted by speculative tasks, Skipped the shards a task could not
	// place (every entry in use).
	Prefetched, PrefetchFailed, Promoted, Skipped int64
	// Acquire: Hits found resident, InFlight waited for a load already running, Misses loaded
	// on demand, Failed not delivered (their error is in the lease).
	Hits, InFlight, Misses, Failed int64
	// Evictions is the resident shards evicted.
	Evictions int64
	// Stall is the time Acquire spent waiting for loads (in flight or on demand).
	Stall time.Duration
}

type cacheKey struct {
	id    engine.BlockID
	layer int
}

// cacheEntry is one resident (or loading) shard. Fields are guarded by Prefetcher.mu; buf is
// written by the load alone while loading is true, and read by leases after.
type cacheEntry struct {
	key      cacheKey
	buf      []byte
	loading  bool
	uncached bool          // a demand load that found no room: dropped on release
	done     chan struct{} // closed when the load ends; err is set before
	err      error
	pins     int   // leases using it
	protect  int64 // before this decode step it is evicted only when nothing else can be
	info     EvictionInfo
}

type taskKey struct {
	req   string
	layer int
	spec  bool // SubmitSpeculative's
}

// prefetchTask is one submitted prediction: the shards of one request's layer.
type prefetchTask struct {
	key     taskKey
	ids     []engine.BlockID
	scores  []float64
	prio    PrefetchPriority
	seq     uint64
	protect int64
	index   int // in the heap; -1 when not queued
}

type taskHeap []*prefetchTask

func (h taskHeap) Len() int { return len(h) }
func (h taskHeap) Less(i, j int) bool {
	if h[i].prio != h[j].prio {
		return h[i].prio < h[j].prio
	}
	return h[i].seq < h[j].seq
}
func (h taskHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *taskHeap) Push(x any)   { t := x.(*prefetchTask); t.index = len(*h); *h = append(*h, t) }
func (h *taskHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}

// reqState is a request's tasks queued or running, and the last load error of its tasks.
type reqState struct {
	n      int
	idle   chan struct{} // closed when n drops to 0
	err    error
	forget bool // dropped when n reaches 0
}

// Prefetcher is GSA 002's prefetch engine: a priority queue of tasks, one dispatcher goroutine
// handing the most urgent task to a free worker, Workers workers loading through the
// BlockLoader into a bounded cache of shards, evicting by policy. It is safe for concurrent
// use; Close stops its goroutines.
type Prefetcher struct {
	opts   PrefetchOptions
	ctx    context.Context
	cancel context.CancelFunc
	idle   chan struct{} // one token per free worker
	work   chan *prefetchTask
	wg     sync.WaitGroup

	mu     sync.Mutex
	cond   *sync.Cond // queue not empty, or closed
	queue  taskHeap
	queued map[taskKey]*prefetchTask
	reqs   map[string]*reqState
	cache  map[cacheKey]*cacheEntry
	seq    uint64
	use    uint64
	step   int64
	closed bool

	st struct {
		submitted, replaced, displaced, rejected          atomic.Int64
		prefetched, prefetchFailed, promoted, skipped     atomic.Int64
		hits, inFlight, misses, failed, evictions, stallN atomic.Int64
	}
}

// NewPrefetcher starts a prefetch engine: one dispatcher and opts.Workers workers.
func NewPrefetcher(opts PrefetchOptions) (*Prefetcher, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prefetcher{opts: opts, ctx: ctx, cancel: cancel, idle: make(chan struct{}, opts.Workers),
		work: make(chan *prefetchTask), queued: map[taskKey]*prefetchTask{}, reqs: map[string]*reqState{},
		cache: map[cacheKey]*cacheEntry{}}
	p.cond = sync.NewCond(&p.mu)
	for range opts.Workers {
		p.idle <- struct{}{}
	}
	p.wg.Add(1 + opts.Workers)
	go p.dispatch()
	for range opts.Workers {
		go p.worker()
	}
	return p, nil
}

// Stats returns the counters.
func (p *Prefetcher) Stats() PrefetchStats {
	return PrefetchStats{
		Submitted: p.st.submitted.Load(), Replaced: p.st.replaced.Load(), Displaced: p.st.displaced.Load(), Rejected: p.st.rejected.Load(),
		Prefetched: p.st.prefetched.Load(), PrefetchFailed: p.st.prefetchFailed.Load(), Promoted: p.st.promoted.Load(), Skipped: p.st.skipped.Load(),
		Hits: p.st.hits.Load(), InFlight: p.st.inFlight.Load(), Misses: p.st.misses.Load(), Failed: p.st.failed.Load(),
		Evictions: p.st.evictions.Load(), Stall: time.Duration(p.st.stallN.Load()),
	}
}

// Resident reports whether a block's shard of layer is loaded in the cache.
func (p *Prefetcher) Resident(id engine.BlockID, layer int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.cache[cacheKey{id, layer}]
	return e != nil && !e.loading
}

// Len is the shards in the cache (loaded or loading).
func (p *Prefetcher) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.cache)
}

// AdvanceTo moves the decode-step clock (eviction ages and prefetch_ahead protection) to step
// when it is later.
func (p *Prefetcher) AdvanceTo(step int64) {
	p.mu.Lock()
	p.step = max(p.step, step)
	p.mu.Unlock()
}

// Submit queues a prefetch of the shards of layer of the blocks ids for request req (002's
// submit_prefetch). scores (nil, or one per id, in [0, 1]) feed score-based eviction; before
// decode step protectUntil the loaded shards are evicted only when nothing else can be
// (prefetch_ahead). Shards already resident are refreshed, not reloaded. A queued
// task of the same request and layer is replaced (the newest prediction wins). When the queue is
// full, the least urgent queued task is dropped for a more urgent one; otherwise Submit fails
// with ErrPrefetchFull. After Close it fails with ErrPrefetchClosed.
func (p *Prefetcher) Submit(req string, layer int, ids []engine.BlockID, scores []float64, prio PrefetchPriority, protectUntil int64) error {
	return p.submit(taskKey{req, layer, false}, ids, scores, prio, protectUntil)
}

// SubmitSpeculative is Submit for blocks that may not be needed (a ranking's runners-up): their
// shards are not protected, and until an attention call uses them they are evicted before any
// shard that was used. It is a separate task from Submit's of the same request and layer.
func (p *Prefetcher) SubmitSpeculative(req string, layer int, ids []engine.BlockID, scores []float64, prio PrefetchPriority) error {
	return p.submit(taskKey{req, layer, true}, ids, scores, prio, 0)
}

func (p *Prefetcher) submit(key taskKey, ids []engine.BlockID, scores []float64, prio PrefetchPriority, protectUntil int64) error {
	req, layer := key.req, key.layer
	if scores != nil && len(scores) != len(ids) {
		return fmt.Errorf("%w: prefetch: %d scores for %d blocks", ErrInvalid, len(scores), len(ids))
	}
	prio = min(max(prio, PriorityUrgent), PriorityLow)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrPrefetchClosed
	}
	var keep []engine.BlockID
	var keepScores []float64
	for i, id := range ids {
		if e := p.cache[cacheKey{id, layer}]; e != nil {
			if scores != nil {
				e.info.Score = scores[i]
			}
			e.protect = max(e.protect, protectUntil)
			e.info.Unused = e.info.Unused && key.spec // predicted now: no longer speculation
			continue
		}
		keep = append(keep, id)
		if scores != nil {
			keepScores = append(keepScores, scores[i])
		}
	}
	if len(keep) == 0 {
		return nil
	}
	p.seq++
	if t := p.queued[key]; t != nil {
		t.ids, t.scores, t.prio, t.protect, t.seq = keep, keepScores, prio, protectUntil, p.seq
		heap.Fix(&p.queue, t.index)
		p.st.replaced.Add(1)
		return nil
	}
	if len(p.queue) >= p.opts.MaxPending {
		worst := 0
		for i, t := range p.queue {
			if t.prio > p.queue[worst].prio || t.prio == p.queue[worst].prio && t.seq > p.queue[worst].seq {
				worst = i
			}
		}
		w := p.queue[worst]
		if w.prio <= prio {
			p.st.rejected.Add(1)
			return fmt.Errorf("prefetch of %d blocks of request %q layer %d: %w", len(keep), req, layer, ErrPrefetchFull)
		}
		heap.Remove(&p.queue, worst)
		delete(p.queued, w.key)
		p.st.displaced.Add(1)
		p.taskDoneLocked(w, nil)
	}
	t := &prefetchTask{key: key, ids: keep, scores: keepScores, prio: prio, seq: p.seq, protect: protectUntil}
	heap.Push(&p.queue, t)
	p.queued[key] = t
	rs := p.reqs[req]
	if rs == nil {
		rs = &reqState{}
		p.reqs[req] = rs
	}
	if rs.n == 0 {
		rs.idle = make(chan struct{})
	}
	rs.n++
	p.st.submitted.Add(1)
	p.cond.Signal()
	return nil
}

// WaitForCompletion waits until request req has no prefetch task queued or running, at most
// timeout (≤ 0: no bound), and reports whether it has none (002's wait_for_completion: true for
// a request it does not know). A failed load still completes its task (Err reports it).
func (p *Prefetcher) WaitForCompletion(req string, timeout time.Duration) bool {
	p.mu.Lock()
	rs := p.reqs[req]
	if rs == nil || rs.n == 0 {
		p.mu.Unlock()
		return true
	}
	ch := rs.idle
	p.mu.Unlock()
	if timeout <= 0 {
		<-ch
		return true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// Err returns the last load error of request req's prefetch tasks (a *BlockLoadError), nil
// when none failed.
func (p *Prefetcher) Err(req string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rs := p.reqs[req]; rs != nil {
		return rs.err
	}
	return nil
}

// Forget drops request req's queued tasks (a running one finishes) and its recorded error.
func (p *Prefetcher) Forget(req string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < len(p.queue); {
		t := p.queue[i]
		if t.key.req != req {
			i++
			continue
		}
		heap.Remove(&p.queue, i)
		delete(p.queued, t.key)
		p.taskDoneLocked(t, nil)
		i = 0
	}
	if rs := p.reqs[req]; rs != nil {
		if rs.n == 0 {
			delete(p.reqs, req)
		} else {
			rs.forget = true
		}
	}
}

// Close stops the prefetcher: queued tasks are dropped (their waiters released), running
// loads are cancelled, and Close returns when every goroutine has ended. Later Submit and
// Acquire fail with ErrPrefetchClosed. Close is idempotent.
func (p *Prefetcher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for _, t := range p.queue {
		t.index = -1
		p.taskDoneLocked(t, nil)
	}
	p.queue = nil
	clear(p.queued)
	p.cond.Broadcast()
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	return nil
}

// dispatch hands the most urgent queued task to a free worker. It takes a task off the queue
// only once a worker is free, so the order is the queue's at that moment.
func (p *Prefetcher) dispatch() {
	defer p.wg.Done()
	defer close(p.work)
	for {
		select {
		case <-p.idle:
		case <-p.ctx.Done():
			return
		}
		p.mu.Lock()
		for len(p.queue) == 0 && !p.closed {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			return
		}
		t := heap.Pop(&p.queue).(*prefetchTask)
		delete(p.queued, t.key)
		p.mu.Unlock()
		p.work <- t // the free worker receives it
	}
}

func (p *Prefetcher) worker() {
	defer p.wg.Done()
	for t := range p.work {
		p.run(t)
		p.idle <- struct{}{} // never blocks: one token per worker
	}
}

// run executes one task: promote (speculative) or load its shards not resident yet.
func (p *Prefetcher) run(t *prefetchTask) {
	var lastErr error
	defer func() {
		p.mu.Lock()
		p.taskDoneLocked(t, lastErr)
		p.mu.Unlock()
	}()
	if t.prio == PriorityLow {
		if pr, ok := p.opts.Loader.(BlockPromoter); ok {
			errs := pr.Promote(p.ctx, t.ids)
			for i, id := range t.ids {
				if i < len(errs) && errs[i] != nil {
					lastErr = &BlockLoadError{ID: id, Layer: t.key.layer, Err: errs[i]}
					continue
				}
				p.st.promoted.Add(1)
			}
			return
		}
	}
	p.mu.Lock()
	var need []*cacheEntry
	for i, id := range t.ids {
		k := cacheKey{id, t.key.layer}
		e := p.cache[k]
		if e == nil {
			if e = p.reserveLocked(k); e == nil {
				p.st.skipped.Add(1)
				continue
			}
			e.info.Unused = t.key.spec
			need = append(need, e)
		}
		if t.scores != nil {
			e.info.Score = t.scores[i]
		}
		e.protect = max(e.protect, t.protect)
		e.info.Unused = e.info.Unused && t.key.spec
	}
	p.mu.Unlock()
	if len(need) == 0 {
		return
	}
	for _, err := range p.load(p.ctx, t.key.layer, need) {
		if err != nil {
			lastErr = err
			p.st.prefetchFailed.Add(1)
		} else {
			p.st.prefetched.Add(1)
		}
	}
}

// taskDoneLocked ends a task of a request: the request's waiters are released when it has no
// other; err (a failed load) is recorded.
func (p *Prefetcher) taskDoneLocked(t *prefetchTask, err error) {
	rs := p.reqs[t.key.req]
	if rs == nil {
		return
	}
	if err != nil {
		rs.err = err
	}
	if rs.n--; rs.n == 0 {
		close(rs.idle)
		if rs.forget {
			delete(p.reqs, t.key.req)
		}
	}
}

// reserveLocked inserts a loading entry for k, evicting a resident one when the cache is full;
// nil when every entry is loading or in use.
func (p *Prefetcher) reserveLocked(k cacheKey) *cacheEntry {
	var buf []byte
	if len(p.cache) >= p.opts.CacheBlocks {
		v := p.victimLocked()
		if v == nil {
			return nil
		}
		delete(p.cache, v.key)
		p.st.evictions.Add(1)
		buf = v.buf
	} else {
		buf = make([]byte, p.opts.ShardBytes)
	}
	p.use++
	e := &cacheEntry{key: k, buf: buf, loading: true, done: make(chan struct{}),
		info: EvictionInfo{Score: 1, LastUse: p.use, LastStep: p.step}}
	p.cache[k] = e
	return e
}

// victimLocked is the entry the policy evicts: not loading, not in use; an entry protected by
// prefetch_ahead only when no other can go. O(cache size).
func (p *Prefetcher) victimLocked() *cacheEntry {
	var best, bestProt *cacheEntry
	pol := p.opts.Eviction
	for _, e := range p.cache {
		if e.loading || e.pins > 0 {
			continue
		}
		if p.step < e.protect {
			if bestProt == nil || pol.lowerPriority(e.info, bestProt.info, p.step) {
				bestProt = e
			}
			continue
		}
		if best == nil || pol.lowerPriority(e.info, best.info, p.step) {
			best = e
		}
	}
	if best == nil {
		return bestProt
	}
	return best
}

// load reads the loading entries es (all of one layer) through the loader and completes them:
// loaded entries become resident; failed ones leave the cache with a *BlockLoadError. It
// returns each entry's error.
func (p *Prefetcher) load(ctx context.Context, layer int, es []*cacheEntry) []error {
	ids := make([]engine.BlockID, len(es))
	dst := make([][]byte, len(es))
	for i, e := range es {
		ids[i], dst[i] = e.key.id, e.buf
	}
	errs := p.opts.Loader.LoadShards(ctx, layer, ids, dst)
	if errs != nil && len(errs) != len(ids) {
		bad := fmt.Errorf("%w: loader returned %d errors for %d blocks", ErrInvalid, len(errs), len(ids))
		errs = make([]error, len(ids))
		for i := range errs {
			errs[i] = bad
		}
	}
	out := make([]error, len(es))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, e := range es {
		if errs != nil && errs[i] != nil {
			e.err = &BlockLoadError{ID: e.key.id, Layer: layer, Err: errs[i]}
			out[i] = e.err
			if p.cache[e.key] == e {
				delete(p.cache, e.key) // the next use loads it again
			}
		}
		e.loading = false
		close(e.done)
	}
	return out
}

// Lease is the shards of one attention call's blocks, held in the cache until Release.
type Lease struct {
	// Bufs[i] is the shard of the i-th block (nil when it failed); Errs[i] its failure (a
	// *BlockLoadError), nil when loaded.
	Bufs [][]byte
	Errs []error
	p    *Prefetcher
	es   []*cacheEntry
}

// Release returns the lease's shards to the cache (evictable again). Idempotent.
func (l *Lease) Release() {
	if l == nil || l.p == nil {
		return
	}
	l.p.mu.Lock()
	for _, e := range l.es {
		if e != nil {
			e.pins--
		}
	}
	l.p.mu.Unlock()
	l.p, l.es, l.Bufs = nil, nil, nil
}

// Acquire makes the shards of layer of the blocks ids resident for an attention call and
// returns them pinned: resident ones at once (hits), those a prefetch is loading when it ends,
// the rest loaded now in the caller's goroutine (misses; without room in the cache, into a
// buffer of the lease's own). A block that fails is reported in Errs and has no buffer; the
// call's other blocks are unaffected. scores (nil or one per id) refresh score-based eviction.
// The time spent waiting is counted as Stall. Every lease must be released.
func (p *Prefetcher) Acquire(ctx context.Context, layer int, ids []engine.BlockID, scores []float64) *Lease {
	l := &Lease{Bufs: make([][]byte, len(ids)), Errs: make([]error, len(ids)), p: p, es: make([]*cacheEntry, len(ids))}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		for i, id := range ids {
			l.Errs[i] = &BlockLoadError{ID: id, Layer: layer, Err: ErrPrefetchClosed}
		}
		p.st.failed.Add(int64(len(ids)))
		l.p = nil
		return l
	}
	var demand []*cacheEntry
	var wait []int
	for i, id := range ids {
		k := cacheKey{id, layer}
		e := p.cache[k]
		switch {
		case e == nil:
			if e = p.reserveLocked(k); e == nil {
				e = &cacheEntry{key: k, buf: make([]byte, p.opts.ShardBytes), loading: true, uncached: true, done: make(chan struct{})}
			}
			demand = append(demand, e)
			p.st.misses.Add(1)
		case e.loading:
			wait = append(wait, i)
			p.st.inFlight.Add(1)
		default:
			p.st.hits.Add(1)
		}
		p.use++
		e.pins++
		e.info.LastUse, e.info.LastStep, e.info.Unused = p.use, p.step, false
		if scores != nil {
			e.info.Score = scores[i]
		}
		l.es[i] = e
	}
	p.mu.Unlock()
	if len(demand) == 0 && len(wait) == 0 {
		for i, e := range l.es {
			l.Bufs[i] = e.buf
		}
		return l
	}
	start := time.Now()
	if len(demand) > 0 {
		p.load(ctx, layer, demand)
	}
	for _, i := range wait {
		select {
		case <-l.es[i].done:
		case <-ctx.Done():
			l.Errs[i] = &BlockLoadError{ID: ids[i], Layer: layer, Err: ctx.Err()}
		}
	}
	p.st.stallN.Add(int64(time.Since(start)))
	for i, e := range l.es {
		if l.Errs[i] != nil {
			continue
		}
		p.mu.Lock()
		err := e.err
		p.mu.Unlock()
		if err != nil {
			l.Errs[i] = err
			continue
		}
		l.Bufs[i] = e.buf
	}
	for _, err := range l.Errs {
		if err != nil {
			p.st.failed.Add(1)
		}
	}
	return l
}
