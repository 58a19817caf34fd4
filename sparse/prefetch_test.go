package sparse

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ucm-go/ucm/engine"
)

// fakeBlocks is an instrumented BlockLoader: it fills each shard with shardContent, records
// every call in order (with the test's own markers), fails the blocks of fail, and, when hold
// is set, makes each call wait for a token on release (or its context).
type fakeBlocks struct {
	mu      sync.Mutex
	log     []string
	calls   [][]engine.BlockID
	fail    map[engine.BlockID]error
	hold    bool
	release chan struct{}
	started chan struct{}
	wrongN  bool // return an error slice of the wrong length
}

func newFakeBlocks() *fakeBlocks {
	return &fakeBlocks{fail: map[engine.BlockID]error{}, release: make(chan struct{}), started: make(chan struct{}, 64)}
}

func shardContent(id engine.BlockID, layer, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = id[i%len(id)] ^ byte(layer*31) ^ byte(i)
	}
	return b
}

func (f *fakeBlocks) mark(s string) {
	f.mu.Lock()
	f.log = append(f.log, s)
	f.mu.Unlock()
}

func (f *fakeBlocks) LoadShards(ctx context.Context, layer int, ids []engine.BlockID, dst [][]byte) []error {
	f.mu.Lock()
	for _, id := range ids {
		f.log = append(f.log, fmt.Sprintf("load %x/%d", id[:4], layer))
	}
	f.calls = append(f.calls, slices.Clone(ids))
	hold, wrongN := f.hold, f.wrongN
	f.mu.Unlock()
	select {
	case f.started <- struct{}{}:
	default:
	}
	if hold {
		select {
		case <-f.release:
		case <-ctx.Done():
			errs := make([]error, len(ids))
			for i := range errs {
				errs[i] = ctx.Err()
			}
			return errs
		}
	}
	if wrongN {
		return []error{nil}
	}
	var errs []error
	for i, id := range ids {
		f.mu.Lock()
		err := f.fail[id]
		f.mu.Unlock()
		if err != nil {
			if errs == nil {
				errs = make([]error, len(ids))
			}
			errs[i] = err
			continue
		}
		copy(dst[i], shardContent(id, layer, len(dst[i])))
	}
	return errs
}

func (f *fakeBlocks) callLog() ([]string, [][]engine.BlockID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log), slices.Clone(f.calls)
}

func bid(i int) engine.BlockID { return md5.Sum(fmt.Appendf(nil, "prefetch block %d", i)) }

const testShard = 64

func newTestPrefetcher(t *testing.T, f *fakeBlocks, workers, pending, cache int, pol EvictionPolicy) *Prefetcher {
	t.Helper()
	base := runtime.NumGoroutine()
	p, err := NewPrefetcher(PrefetchOptions{Loader: f, ShardBytes: testShard, Workers: workers, MaxPending: pending, CacheBlocks: cache, Eviction: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		waitGoroutines(t, base)
	})
	return p
}

// waitGoroutines waits (bounded) for the goroutine count to fall back to base: every
// goroutine a prefetcher started has ended.
func waitGoroutines(t testing.TB, base int) {
	t.Helper()
	var n int
	for range 300 {
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Fatalf("goroutines: %d, want <= %d\n%s", n, base, buf[:runtime.Stack(buf, true)])
}

func TestPriorityForPosition(t *testing.T) {
	want := map[int]PrefetchPriority{-1: PriorityUrgent, 0: PriorityUrgent, 1: PriorityHigh, 4: PriorityHigh, 5: PriorityNormal,
		16: PriorityNormal, 17: PriorityLow, 1000: PriorityLow}
	for pos, w := range want {
		if got := PriorityForPosition(pos); got != w {
			t.Errorf("position %d: %d, want %d", pos, got, w)
		}
	}
}

// TestPrefetchDispatchRespectsPriority: with the one worker busy, tasks queued in any order
// are loaded most urgent first, in submission order within a priority.
func TestPrefetchDispatchRespectsPriority(t *testing.T) {
	f := newFakeBlocks()
	f.hold = true
	p := newTestPrefetcher(t, f, 1, 16, 100, EvictLRU)
	if err := p.Submit("busy", 0, []engine.BlockID{bid(0)}, nil, PriorityNormal, 0); err != nil {
		t.Fatal(err)
	}
	<-f.started // the worker is inside the loader
	order := []struct {
		req  string
		prio PrefetchPriority
		id   int
	}{{"low", PriorityLow, 1}, {"high", PriorityHigh, 2}, {"normal", PriorityNormal, 3}, {"urgent", PriorityUrgent, 4}, {"urgent2", PriorityUrgent, 5}}
	for _, o := range order {
		if err := p.Submit(o.req, 0, []engine.BlockID{bid(o.id)}, nil, o.prio, 0); err != nil {
			t.Fatal(err)
		}
	}
	if p.WaitForCompletion("urgent", 20*time.Millisecond) {
		t.Fatal("a queued task reported complete")
	}
	close(f.release)
	for _, o := range order {
		if !p.WaitForCompletion(o.req, 0) {
			t.Fatalf("%s not completed", o.req)
		}
	}
	_, calls := f.callLog()
	var got []engine.BlockID
	for _, c := range calls {
		got = append(got, c...)
	}
	want := []engine.BlockID{bid(0), bid(4), bid(5), bid(2), bid(3), bid(1)}
	if !slices.Equal(got, want) {
		t.Fatalf("load order %x\nwant %x", got, want)
	}
	for i := range 6 {
		if !p.Resident(bid(i), 0) {
			t.Errorf("block %d not resident after its prefetch", i)
		}
	}
}

// TestPrefetchWaitAndErrors: wait_for_completion is true for an unknown request; a failed load
// still completes its task and records a *BlockLoadError.
func TestPrefetchWaitAndErrors(t *testing.T) {
	f := newFakeBlocks()
	f.fail[bid(2)] = fmt.Errorf("block %x: %w", bid(2), engine.ErrNotFound)
	p := newTestPrefetcher(t, f, 2, 8, 100, EvictLRU)
	if !p.WaitForCompletion("nobody", time.Millisecond) || p.Err("nobody") != nil {
		t.Fatal("unknown request: want complete, no error")
	}
	if err := p.Submit("r", 3, []engine.BlockID{bid(1), bid(2)}, []float64{0.5, 0.5}, PriorityUrgent, 0); err != nil {
		t.Fatal(err)
	}
	if !p.WaitForCompletion("r", 0) {
		t.Fatal("not complete")
	}
	var le *BlockLoadError
	if err := p.Err("r"); !errors.As(err, &le) || le.ID != bid(2) || le.Layer != 3 || !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("recorded error %v", err)
	}
	if !p.Resident(bid(1), 3) || p.Resident(bid(2), 3) || p.Resident(bid(1), 0) {
		t.Fatal("residency: want block 1 of layer 3 only")
	}
	if st := p.Stats(); st.Prefetched != 1 || st.PrefetchFailed != 1 {
		t.Fatalf("stats %+v", st)
	}
	if err := p.Submit("r", 0, []engine.BlockID{bid(1)}, []float64{1, 2}, PriorityUrgent, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("scores of the wrong length: %v", err)
	}
	p.Forget("r")
	if p.Err("r") != nil {
		t.Fatal("Forget kept the error")
	}
	// A loader answering with the wrong number of errors fails every block of the call.
	f.mu.Lock()
	f.wrongN = true
	f.mu.Unlock()
	l := p.Acquire(context.Background(), 0, []engine.BlockID{bid(7), bid(8)}, nil)
	defer l.Release()
	for i, err := range l.Errs {
		if !errors.Is(err, ErrInvalid) || l.Bufs[i] != nil {
			t.Fatalf("block %d: %v", i, err)
		}
	}
}

// TestPrefetchQueueBound: a full queue refuses a task no more urgent than every queued one and
// drops the least urgent (newest) queued task for a more urgent one, releasing its waiters; a
// second task of the same request and layer replaces the queued one.
func TestPrefetchQueueBound(t *testing.T) {
	f := newFakeBlocks()
	f.hold = true
	p := newTestPrefetcher(t, f, 1, 2, 100, EvictLRU)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(p.Submit("busy", 0, []engine.BlockID{bid(0)}, nil, PriorityUrgent, 0))
	<-f.started
	must(p.Submit("a", 0, []engine.BlockID{bid(1)}, nil, PriorityNormal, 0))
	must(p.Submit("b", 0, []engine.BlockID{bid(2)}, nil, PriorityNormal, 0))
	if err := p.Submit("c", 0, []engine.BlockID{bid(3)}, nil, PriorityNormal, 0); !errors.Is(err, ErrPrefetchFull) {
		t.Fatalf("full queue: %v", err)
	}
	must(p.Submit("d", 0, []engine.BlockID{bid(4)}, nil, PriorityHigh, 0))
	if !p.WaitForCompletion("b", time.Millisecond) {
		t.Fatal("the displaced task's waiters are not released")
	}
	must(p.Submit("a", 0, []engine.BlockID{bid(5)}, nil, PriorityNormal, 0)) // replaces a's
	close(f.release)
	for _, r := range []string{"busy", "a", "d"} {
		p.WaitForCompletion(r, 0)
	}
	_, calls := f.callLog()
	want := [][]engine.BlockID{{bid(0)}, {bid(4)}, {bid(5)}}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("calls %x, want %x", calls, want)
	}
	if st := p.Stats(); st.Rejected != 1 || st.Displaced != 1 || st.Replaced != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAcquire: resident shards are hits, loading ones are waited for, the rest loaded on
// demand; a failed block is reported (no buffer) and loaded again next time; the shards hold
// the loader's bytes.
func TestAcquire(t *testing.T) {
	f := newFakeBlocks()
	p := newTestPrefetcher(t, f, 1, 8, 100, EvictLRU)
	if err := p.Submit("r", 1, []engine.BlockID{bid(1)}, nil, PriorityUrgent, 0); err != nil {
		t.Fatal(err)
	}
	p.WaitForCompletion("r", 0)
	f.fail[bid(3)] = engine.ErrCorrupt
	ids := []engine.BlockID{bid(1), bid(2), bid(3)}
	l := p.Acquire(context.Background(), 1, ids, nil)
	for i, id := range ids[:2] {
		if l.Errs[i] != nil || !bytes.Equal(l.Bufs[i], shardContent(id, 1, testShard)) {
			t.Fatalf("block %d: %v", i, l.Errs[i])
		}
	}
	var le *BlockLoadError
	if !errors.As(l.Errs[2], &le) || le.ID != bid(3) || !errors.Is(l.Errs[2], engine.ErrCorrupt) || l.Bufs[2] != nil {
		t.Fatalf("failed block: %v", l.Errs[2])
	}
	l.Release()
	l.Release()
	if st := p.Stats(); st.Hits != 1 || st.Misses != 2 || st.Failed != 1 {
		t.Fatalf("stats %+v", st)
	}
	delete(f.fail, bid(3))
	l = p.Acquire(context.Background(), 1, ids, nil)
	if l.Errs[2] != nil || !bytes.Equal(l.Bufs[2], shardContent(bid(3), 1, testShard)) {
		t.Fatalf("retry: %v", l.Errs[2])
	}
	l.Release()

	// In flight: the prefetch holds the load; Acquire waits for it instead of loading again.
	f.mu.Lock()
	f.hold = true
	f.mu.Unlock()
	for len(f.started) > 0 {
		<-f.started
	}
	if err := p.Submit("r", 2, []engine.BlockID{bid(9)}, nil, PriorityUrgent, 0); err != nil {
		t.Fatal(err)
	}
	<-f.started
	got := make(chan *Lease)
	go func() { got <- p.Acquire(context.Background(), 2, []engine.BlockID{bid(9)}, nil) }()
	select {
	case <-got:
		t.Fatal("Acquire returned before the load in flight ended")
	case <-time.After(20 * time.Millisecond):
	}
	f.release <- struct{}{}
	l = <-got
	if l.Errs[0] != nil || !bytes.Equal(l.Bufs[0], shardContent(bid(9), 2, testShard)) {
		t.Fatalf("in flight: %v", l.Errs[0])
	}
	l.Release()
	if _, calls := f.callLog(); len(calls) != 4 || p.Stats().InFlight != 1 {
		t.Fatalf("%d loader calls (want 4), stats %+v", len(calls), p.Stats())
	}
	// A context ending while waiting fails the block with its error.
	if err := p.Submit("r", 2, []engine.BlockID{bid(10)}, nil, PriorityUrgent, 0); err != nil {
		t.Fatal(err)
	}
	<-f.started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l = p.Acquire(ctx, 2, []engine.BlockID{bid(10)}, nil)
	if !errors.Is(l.Errs[0], context.Canceled) {
		t.Fatalf("cancelled wait: %v", l.Errs[0])
	}
	l.Release()
	f.release <- struct{}{}
}

// TestEvictionPolicies: a full cache evicts the LRU entry, the lowest score, or the lowest
// 0.7·score + 0.3/(age+1); entries in use are never evicted, protected ones last.
func TestEvictionPolicies(t *testing.T) {
	// x: score 0.2, used last at step 10; y: score 0.5, step 0, used second; z: score 0.6,
	// step 0, used first. LRU → z; score → x; hybrid at step 10: x 0.44, y 0.377, z 0.447 → y.
	for pol, victim := range map[EvictionPolicy]int{EvictLRU: 3, EvictScore: 1, EvictHybrid: 2} {
		f := newFakeBlocks()
		p := newTestPrefetcher(t, f, 1, 8, 3, pol)
		acq := func(i int, score float64) {
			p.Acquire(context.Background(), 0, []engine.BlockID{bid(i)}, []float64{score}).Release()
		}
		acq(3, 0.6) // z
		acq(2, 0.5) // y
		p.AdvanceTo(10)
		acq(1, 0.2) // x
		acq(4, 0.9)
		for i := 1; i <= 4; i++ {
			if p.Resident(bid(i), 0) == (i == victim) {
				t.Errorf("%v: block %d resident %v (victim %d)", pol, i, p.Resident(bid(i), 0), victim)
			}
		}
		if p.Stats().Evictions != 1 || p.Len() != 3 {
			t.Errorf("%v: %d evictions, %d resident", pol, p.Stats().Evictions, p.Len())
		}
	}
	if got := EvictHybrid.Priority(EvictionInfo{Score: 0.5, LastStep: 3}, 7); got != 0.7*0.5+0.3/5 {
		t.Fatalf("hybrid priority %v", got)
	}

	// In use: a one-entry cache holding a pinned shard loads another into the lease's own buffer.
	f := newFakeBlocks()
	p := newTestPrefetcher(t, f, 1, 8, 1, EvictLRU)
	a := p.Acquire(context.Background(), 0, []engine.BlockID{bid(1)}, nil)
	b := p.Acquire(context.Background(), 0, []engine.BlockID{bid(2)}, nil)
	if !p.Resident(bid(1), 0) || p.Resident(bid(2), 0) || b.Errs[0] != nil || !bytes.Equal(b.Bufs[0], shardContent(bid(2), 0, testShard)) {
		t.Fatal("a pinned entry was evicted, or the uncached load failed")
	}
	a.Release()
	b.Release()

	// Protected: a prediction protected until step 5 outlives a more recent unprotected entry.
	p = newTestPrefetcher(t, newFakeBlocks(), 1, 8, 2, EvictLRU)
	if err := p.Submit("r", 0, []engine.BlockID{bid(1)}, nil, PriorityUrgent, 5); err != nil {
		t.Fatal(err)
	}
	p.WaitForCompletion("r", 0)
	p.Acquire(context.Background(), 0, []engine.BlockID{bid(2)}, nil).Release()
	p.Acquire(context.Background(), 0, []engine.BlockID{bid(3)}, nil).Release()
	if !p.Resident(bid(1), 0) || p.Resident(bid(2), 0) {
		t.Fatal("the protected prediction was evicted before an unprotected entry")
	}
	p.AdvanceTo(6) // protection over: LRU again
	p.Acquire(context.Background(), 0, []engine.BlockID{bid(4)}, nil).Release()
	if p.Resident(bid(1), 0) {
		t.Fatal("an expired protection still protects")
	}
	// Speculative: an unused speculative shard goes before any used one, whatever the policy.
	for _, pol := range []EvictionPolicy{EvictLRU, EvictScore, EvictHybrid} {
		p = newTestPrefetcher(t, newFakeBlocks(), 1, 8, 2, pol)
		if err := p.SubmitSpeculative("r", 0, []engine.BlockID{bid(1)}, []float64{1}, PriorityUrgent); err != nil {
			t.Fatal(err)
		}
		p.WaitForCompletion("r", 0)
		p.Acquire(context.Background(), 0, []engine.BlockID{bid(2)}, []float64{0}).Release()
		p.Acquire(context.Background(), 0, []engine.BlockID{bid(3)}, []float64{0}).Release()
		if p.Resident(bid(1), 0) || !p.Resident(bid(2), 0) {
			t.Fatalf("%v: an unused speculative shard outlived a used one", pol)
		}
		// Once used, it is an ordinary entry.
		if err := p.SubmitSpeculative("r", 0, []engine.BlockID{bid(4)}, []float64{1}, PriorityUrgent); err != nil {
			t.Fatal(err)
		}
		p.WaitForCompletion("r", 0)
		p.Acquire(context.Background(), 0, []engine.BlockID{bid(4)}, []float64{1}).Release()
		p.Acquire(context.Background(), 0, []engine.BlockID{bid(5)}, []float64{1}).Release()
		if !p.Resident(bid(4), 0) {
			t.Fatalf("%v: a used shard was evicted before an older one", pol)
		}
	}
	if _, err := ParseEvictionPolicy("MRU"); !errors.Is(err, ErrInvalid) {
		t.Fatal("unknown policy accepted")
	}
}

// TestPrefetcherClose: Close cancels the loads in flight, drops queued tasks and releases their
// waiters, ends every goroutine, and later calls fail with ErrPrefetchClosed.
func TestPrefetcherClose(t *testing.T) {
	base := runtime.NumGoroutine()
	f := newFakeBlocks()
	f.hold = true
	p, err := NewPrefetcher(PrefetchOptions{Loader: f, ShardBytes: testShard, Workers: 2, MaxPending: 8, CacheBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := p.Submit(fmt.Sprint("r", i), 0, []engine.BlockID{bid(i)}, nil, PriorityNormal, 0); err != nil {
			t.Fatal(err)
		}
	}
	<-f.started
	<-f.started
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if !p.WaitForCompletion(fmt.Sprint("r", i), time.Second) {
			t.Fatalf("r%d: waiters not released by Close", i)
		}
	}
	if err := p.Submit("x", 0, []engine.BlockID{bid(9)}, nil, PriorityUrgent, 0); !errors.Is(err, ErrPrefetchClosed) {
		t.Fatalf("submit after close: %v", err)
	}
	l := p.Acquire(context.Background(), 0, []engine.BlockID{bid(9)}, nil)
	if !errors.Is(l.Errs[0], ErrPrefetchClosed) || l.Bufs[0] != nil {
		t.Fatalf("acquire after close: %v", l.Errs[0])
	}
	l.Release()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, base)
	for _, bad := range []PrefetchOptions{{}, {Loader: f}, {Loader: f, ShardBytes: 1}, {Loader: f, ShardBytes: 1, Workers: 1},
		{Loader: f, ShardBytes: 1, Workers: 1, MaxPending: 1}, {Loader: f, ShardBytes: 1, Workers: 1, MaxPending: 1, CacheBlocks: 1, Eviction: 9}} {
		if _, err := NewPrefetcher(bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}

// TestPrefetcherConcurrent: many goroutines submitting and acquiring over a small cache under
// the race detector; every delivered shard holds its own block's bytes.
func TestPrefetcherConcurrent(t *testing.T) {
	f := newFakeBlocks()
	for i := 0; i < 40; i += 7 {
		f.fail[bid(i)] = engine.ErrNotFound
	}
	p := newTestPrefetcher(t, f, 3, 4, 12, EvictHybrid)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			req := fmt.Sprint("r", g)
			for step := range 60 {
				p.AdvanceTo(int64(step))
				layer := r.IntN(2)
				ids := make([]engine.BlockID, 1+r.IntN(6))
				for i := range ids {
					ids[i] = bid(r.IntN(40))
				}
				_ = p.Submit(req, layer, ids, nil, PrefetchPriority(r.IntN(3)), int64(step+2))
				l := p.Acquire(context.Background(), layer, ids, nil)
				for i, id := range ids {
					if l.Errs[i] == nil && !bytes.Equal(l.Bufs[i], shardContent(id, layer, testShard)) {
						t.Errorf("block %x layer %d: wrong bytes", id[:4], layer)
					}
				}
				l.Release()
			}
			p.WaitForCompletion(req, 0)
			p.Forget(req)
		}()
	}
	wg.Wait()
	if p.Len() > 12 {
		t.Fatalf("%d shards resident, bound 12", p.Len())
	}
}

// ---------------------------------------------------------------------------------------------
// The methods' side: the attended blocks are loaded, predicted ones prefetched.

func newLoadingMethod(t *testing.T, name, yamlText string, f *fixture, blocks BlockLoader) SparseMethod {
	t.Helper()
	block := sparseBlock(t, "ucm_sparse_config:\n  "+name+": "+yamlText+"\n")
	cfg, err := Choose(block, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	m, err := New(cfg, Env{Role: RoleWorker, Shape: f.shape, Sidecars: f.src, Blocks: blocks, ShardBytes: testShard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		waitGoroutines(t, base)
	})
	return m
}

// TestLoadingMethodOptions: a method given a block loader without a shard size is refused
// (and starts nothing); without a loader it loads nothing and hands no shards.
func TestLoadingMethodOptions(t *testing.T) {
	f := newFixture(t, testShape, 8, 91)
	base := runtime.NumGoroutine()
	for _, name := range []string{NameGSA, NameESA} {
		cfg, err := ParseMethodConfig(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(cfg, Env{Role: RoleWorker, Shape: testShape, Sidecars: f.src, Blocks: newFakeBlocks()}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s without a shard size: %v", name, err)
		}
	}
	waitGoroutines(t, base)
	m := newMethod(t, NameGSA, f.src, "{budget: 0.5, min_blocks: 0}", testShape)
	a := f.decodeCall(8, 0, 0, 0, randomQuery(rand.New(rand.NewPCG(1, 2)), testShape))
	if err := m.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	if a.KV != nil || a.Selected == nil || m.(*blockMethod).Prefetcher() != nil || m.Close() != nil {
		t.Fatal("a method without a loader loaded blocks")
	}
}

// checkKV: the call's shards are the attended blocks' own bytes, aligned with Selected.
func checkKV(t *testing.T, f *fixture, a *Attention) {
	t.Helper()
	if len(a.KV) != len(a.Selected) {
		t.Fatalf("%d shards for %d blocks", len(a.KV), len(a.Selected))
	}
	for j, b := range a.Selected {
		if b >= len(a.Request.BlockIDs) {
			if a.KV[j] != nil {
				t.Fatalf("block %d has no id but a shard", b)
			}
			continue
		}
		if !bytes.Equal(a.KV[j], shardContent(a.Request.BlockIDs[b], a.Layer, testShard)) {
			t.Fatalf("block %d: shard of another block", b)
		}
	}
}

// TestLagPrefetchesAhead: with ESA's retrieval lag the blocks a step attends were retrieved
// the step before; the prefetch engine loads them between the two steps, so every step after
// the first finds them resident: each attended block's load is issued before the step begins
// (the loader's log, with the test's markers), and only the first step loads on demand. With
// the asynchronous engine the retrieval itself runs after the step began, and queues its
// prefetch as it finishes, during the rest of the step.
func TestLagPrefetchesAhead(t *testing.T) {
	for _, workers := range []int{0, 4} {
		t.Run(fmt.Sprintf("retrieval_workers=%d", workers), func(t *testing.T) { testLagPrefetchesAhead(t, workers) })
	}
}

func testLagPrefetchesAhead(t *testing.T, workers int) {
	f := newFixture(t, testShape, 32, 41)
	fb := newFakeBlocks()
	m := newLoadingMethod(t, NameESA, fmt.Sprintf("{init_window_sz: 1, local_window_sz: 2, budget: 0.25, retrieval_lag: 1, prefetch_cache_size: 200, retrieval_workers: %d}", workers), f, fb)
	p := m.(*blockMethod).Prefetcher()
	r := rand.New(rand.NewPCG(42, 43))
	for step := range 10 {
		fb.mark(fmt.Sprint("step ", step))
		missesBefore := p.Stats().Misses
		a := f.decodeCall(32, 0, 1, step, randomQuery(r, testShape))
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		checkKV(t, f, a)
		log, _ := fb.callLog()
		begin := slices.Index(log, fmt.Sprint("step ", step))
		for _, b := range a.Selected {
			id := f.ids[b]
			at := slices.Index(log, fmt.Sprintf("load %x/%d", id[:4], 1))
			if at < 0 || step > 0 && at > begin {
				t.Fatalf("step %d: block %d loaded at log entry %d, the step began at %d", step, b, at, begin)
			}
		}
		if misses := p.Stats().Misses - missesBefore; step > 0 && misses != 0 {
			t.Fatalf("step %d: %d demand loads", step, misses)
		}
		if err := m.AttentionFinished(a); err != nil {
			t.Fatal(err)
		}
		if a.KV != nil || a.Selected != nil {
			t.Fatal("AttentionFinished kept the shards")
		}
		// The model computes the rest of the step; the retrieval and the prefetch of the next
		// step's blocks run meanwhile (002's worker waits for the prefetch before the next
		// attention).
		waitRetrievals(m.(*blockMethod))
		if !p.WaitForCompletion("r", 0) || p.Err("r") != nil {
			t.Fatal(p.Err("r"))
		}
	}
	if st := p.Stats(); st.Prefetched == 0 || st.Hits == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// waitRetrievals waits for m's background retrievals (none without the asynchronous engine).
func waitRetrievals(m *blockMethod) {
	m.mu.Lock()
	var pending []*retrieval
	for _, h := range m.held {
		if h.pending != nil {
			pending = append(pending, h.pending)
		}
	}
	m.mu.Unlock()
	for _, t := range pending {
		<-t.done
	}
}

// TestGSAPredictsRunnersUp: GSA's step prefetches its selection and, speculatively, the next
// best candidates, prefetch_ahead × k in all: exactly the selection a budget of twice k would
// make.
func TestGSAPredictsRunnersUp(t *testing.T) {
	f := newFixture(t, testShape, 32, 51)
	fb := newFakeBlocks()
	// 32 blocks, budget 0.25: 8 kept, k = 5; twice k: 13 blocks, budget 13/32.
	m := newLoadingMethod(t, NameGSA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.25, min_blocks: 0, prefetch_ahead: 2}", f, fb)
	wide := newMethod(t, NameGSA, f.src, "{init_window_sz: 1, local_window_sz: 2, budget: 0.40625, min_blocks: 0}", testShape)
	p := m.(*blockMethod).Prefetcher()
	q := randomQuery(rand.New(rand.NewPCG(52, 53)), testShape)
	a, w := f.decodeCall(32, 0, 0, 0, q), f.decodeCall(32, 0, 0, 0, q)
	if err := m.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	if err := wide.AttentionBegin(w); err != nil {
		t.Fatal(err)
	}
	if len(a.Selected) != 8 || len(w.Selected) != 13 {
		t.Fatalf("selections of %d and %d blocks", len(a.Selected), len(w.Selected))
	}
	checkKV(t, f, a)
	if err := m.AttentionFinished(a); err != nil {
		t.Fatal(err)
	}
	p.WaitForCompletion("r", 0)
	for b := range 32 {
		if p.Resident(f.ids[b], 0) != slices.Contains(w.Selected, b) {
			t.Fatalf("block %d resident %v; predicted %v", b, p.Resident(f.ids[b], 0), w.Selected)
		}
	}
	if st := p.Stats(); st.Misses != 8 || st.Prefetched != 5 {
		t.Fatalf("stats %+v: want 8 demand loads and 5 prefetched", st)
	}
}

// TestFailedBlockIsLeftOut: a selected block that fails to load is reported and not attended:
// the table, seq_len and shards cover the others; nothing is attended with missing bytes.
func TestFailedBlockIsLeftOut(t *testing.T) {
	f := newFixture(t, testShape, 32, 61)
	fb := newFakeBlocks()
	fb.fail[f.ids[0]] = fmt.Errorf("evicted: %w", engine.ErrNotFound)
	m := newLoadingMethod(t, NameGSA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.25, min_blocks: 0}", f, fb)
	q := randomQuery(rand.New(rand.NewPCG(62, 63)), testShape)
	a := f.decodeCall(32, 5, 1, 0, q) // partial last block: 5 tokens
	table := slices.Clone(a.BlockTable)
	if err := m.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	var le *BlockLoadError
	if !slices.Equal(a.LoadFailed, []int{0}) || !errors.As(a.LoadErr, &le) || le.ID != f.ids[0] || !errors.Is(a.LoadErr, engine.ErrNotFound) {
		t.Fatalf("failed %v, error %v", a.LoadFailed, a.LoadErr)
	}
	if len(a.Selected) != 7 || slices.Contains(a.Selected, 0) {
		t.Fatalf("selected %v", a.Selected)
	}
	seq := 0
	for j, b := range a.Selected {
		if a.BlockTable[j] != table[b] {
			t.Fatalf("table %v for %v", a.BlockTable, a.Selected)
		}
		seq += testShape.BlockSize
		if b == 31 {
			seq += 5 - testShape.BlockSize
		}
	}
	if a.SeqLen != seq {
		t.Fatalf("seq_len %d, want %d", a.SeqLen, seq)
	}
	checkKV(t, f, a)
	if err := m.AttentionFinished(a); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.BlockTable, table) || a.SeqLen != 31*testShape.BlockSize+5 {
		t.Fatal("not restored")
	}
	// With per-KV-head selections, no head keeps the failed block.
	mk := newLoadingMethod(t, NameGSA, "{init_window_sz: 1, local_window_sz: 2, budget: 0.25, min_blocks: 0, head_select: kv}", f, fb)
	a = f.decodeCall(32, 5, 1, 0, q)
	if err := mk.AttentionBegin(a); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.LoadFailed, []int{0}) || len(a.HeadSelected) != testShape.KVHeads {
		t.Fatalf("failed %v, heads %v", a.LoadFailed, a.HeadSelected)
	}
	for h, hs := range a.HeadSelected {
		if slices.Contains(hs, 0) || len(hs) == 0 {
			t.Fatalf("head %d attends %v", h, hs)
		}
		for _, b := range hs {
			if !slices.Contains(a.Selected, b) {
				t.Fatalf("head %d block %d not in the attended union %v", h, b, a.Selected)
			}
		}
	}
	checkKV(t, f, a)
	if err := mk.AttentionFinished(a); err != nil {
		t.Fatal(err)
	}
}

// TestPrefetchThroughEngine: EngineBlocks loads the shards the engine stores (LoadShard) and
// promotes speculative tasks (Prefetch); a block the store lacks is ErrNotFound.
func TestPrefetchThroughEngine(t *testing.T) {
	s := testShape
	f := newFixture(t, s, 6, 71)
	shard := 2 * s.BlockSize * s.KVHeads * s.HeadDim * 2
	e, err := engine.Open(t.TempDir(), engine.Options{
		Layout: engine.Layout{Shards: s.Layers, TensorsPerShard: 2, ShardBytes: int64(shard)},
		Schema: engine.Schema{Model: "sparse-test", DType: "float16", KVLayout: "flash_attn", TPSize: 1, BlockTokens: s.BlockSize},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	src := make([][]byte, 5)
	for b := range src {
		src[b] = make([]byte, s.Layers*shard)
		for l := range s.Layers {
			copy(src[b][l*shard:], f.kb[b][l])
		}
	}
	if err := e.Dump(f.ids[:5], src).Wait(); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	p, err := NewPrefetcher(PrefetchOptions{Loader: EngineBlocks{e}, ShardBytes: shard, Workers: 2, MaxPending: 8, CacheBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Submit("r", 1, f.ids[:3], nil, PriorityUrgent, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Submit("s", 1, f.ids[3:5], nil, PriorityLow, 0); err != nil {
		t.Fatal(err)
	}
	p.WaitForCompletion("r", 0)
	p.WaitForCompletion("s", 0)
	if p.Err("r") != nil || p.Err("s") != nil || p.Stats().Promoted != 2 || p.Stats().Prefetched != 3 {
		t.Fatalf("errors %v %v, stats %+v", p.Err("r"), p.Err("s"), p.Stats())
	}
	// A speculative task naming a block the store lacks records the engine's error.
	if err := p.Submit("t", 1, f.ids[5:], nil, PriorityLow, 0); err != nil {
		t.Fatal(err)
	}
	p.WaitForCompletion("t", 0)
	if err := p.Err("t"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("promotion of an unstored block: %v", err)
	}
	l := p.Acquire(context.Background(), 1, f.ids, nil)
	for b := range 5 {
		if l.Errs[b] != nil || !bytes.Equal(l.Bufs[b], src[b][shard:2*shard]) {
			t.Fatalf("block %d: %v", b, l.Errs[b])
		}
	}
	if !errors.Is(l.Errs[5], engine.ErrNotFound) {
		t.Fatalf("unstored block: %v", l.Errs[5])
	}
	l.Release()
	if st := p.Stats(); st.Hits != 3 || st.Misses != 3 {
		t.Fatalf("stats %+v", st)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, base)
}

// TestAccessCountScore: GSA's block_score: access_count selects the top-K of 0.5·count +
// linspace(0.1, 1, B), count being the steps that selected the block, without reading a
// sidecar.
func TestAccessCountScore(t *testing.T) {
	f := newFixture(t, testShape, 40, 81)
	m := newMethod(t, NameGSA, f.src, "{init_window_sz: 1, local_window_sz: 2, budget: 0.25, min_blocks: 0, block_score: access_count}", testShape)
	loads := f.src.Loads()
	counts := make([]int, 40)
	r := rand.New(rand.NewPCG(82, 83))
	for step := range 12 {
		n := 28 + step
		a := f.decodeCall(n, 0, 0, step, randomQuery(r, testShape))
		if err := m.AttentionBegin(a); err != nil {
			t.Fatal(err)
		}
		scores := make([]float64, n)
		for i := range scores {
			scores[i] = 0.5*float64(counts[i]) + Linspace(0.1, 1, n, i)
		}
		init, local, k := 1, 2, BudgetBlocks(n, 0.25)-3
		idx := make([]int, 0, n)
		for i := init; i < n-local; i++ {
			idx = append(idx, i)
		}
		slices.SortStableFunc(idx, func(x, y int) int {
			if better(scores[x], x, scores[y], y) {
				return -1
			}
			return 1
		})
		want := append([]int{0}, idx[:k]...)
		want = append(want, n-2, n-1)
		slices.Sort(want)
		if !slices.Equal(a.Selected, want) {
			t.Fatalf("step %d: %v, want %v", step, a.Selected, want)
		}
		for _, b := range a.Selected {
			counts[b]++
		}
	}
	if f.src.Loads() != loads {
		t.Fatal("the access-count score read sidecars")
	}
	if Linspace(0.1, 1, 1, 0) != 0.1 || Linspace(0.1, 1, 10, 9) != 1 || Linspace(0.1, 1, 10, 0) != 0.1 || Linspace(0, 1, 5, 2) != 0.5 {
		t.Fatal("linspace ends")
	}
}

func TestPrefetchConfigKeys(t *testing.T) {
	node := sparseBlock(t, "ucm_sparse_config:\n  GSA: {prefetch_workers: 2, max_pending_prefetch: 8, prefetch_ahead: 3, prefetch_cache_size: 50, eviction_policy: hybrid, block_score: access_count}\n")["GSA"]
	c, err := ParseMethodConfig(NameGSA, &node)
	if err != nil {
		t.Fatal(err)
	}
	g := c.(*GSAConfig)
	if g.Workers != 2 || g.MaxPending != 8 || g.Ahead != 3 || g.CacheSize != 50 || g.Eviction != "hybrid" || g.BlockScore != "access_count" {
		t.Fatalf("%+v", g)
	}
	o, err := g.options(newFakeBlocks(), 10)
	if err != nil || o.Workers != 2 || o.MaxPending != 8 || o.CacheBlocks != 50 || o.Eviction != EvictHybrid {
		t.Fatalf("%+v %v", o, err)
	}
	for _, c := range []struct{ text, key string }{
		{"GSA: {prefetch_workers: 0}", "ucm_sparse_config.GSA.prefetch_workers"},
		{"GSA: {max_pending_prefetch: -1}", "ucm_sparse_config.GSA.max_pending_prefetch"},
		{"GSA: {prefetch_ahead: -1}", "ucm_sparse_config.GSA.prefetch_ahead"},
		{"GSA: {prefetch_cache_size: 0}", "ucm_sparse_config.GSA.prefetch_cache_size"},
		{"GSA: {eviction_policy: mru}", "ucm_sparse_config.GSA.eviction_policy"},
		{"GSA: {block_score: random}", "ucm_sparse_config.GSA.block_score"},
		{"ESA: {prefetch_workers: 1000}", "ucm_sparse_config.ESA.prefetch_workers"},
	} {
		name := c.text[:3]
		node := sparseBlock(t, "ucm_sparse_config:\n  "+c.text+"\n")[name]
		if _, err := ParseMethodConfig(name, &node); !isConfigErr(err, c.key) {
			t.Errorf("%s: %v", c.text, err)
		}
	}
}
