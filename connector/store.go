package connector

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
)

// maxInstanceRetries bounds the suffixes tried when another live process holds the instance
// name (two workers of one host configured alike): name, name-2, ... name-64.
const maxInstanceRetries = 64

// Store is a UCM store (UcmKVStoreBaseV1) over an engine instance on the configured
// storage_backends: lookups, layer-wise and whole-block transfers between host memory the
// caller owns and the store, as asynchronous tasks named by integer handles. It is safe for
// concurrent use.
//
// Transfers name, per block, a shard index and the memory of that shard: one span per tensor
// of StoreConfig.Tensors (UCM's addresses), or one span of the whole shard. The spans go to
// the engine as they are (engine.Engine.LoadSpans, DumpSpans): loads read from disk straight
// into them (with O_DIRECT, one vectored request per shard, when every span is aligned to
// 4 KiB), dumps copy them once into the record. The memory must stay untouched until the task
// is done.
//
// Task handles are consumed by Wait, as in UCM: a second Wait of a handle, or a Check after
// Wait, fails with ErrUnknownTask. Check does not consume.
type Store struct {
	cfg     *StoreConfig
	eng     *engine.Engine
	metrics *storeMetrics
	log     *slog.Logger

	mu     sync.Mutex
	tasks  map[uint64]*Task
	next   uint64
	closed atomic.Bool
	wg     sync.WaitGroup // prefetches in flight

	// empty: store_pipeline "Empty" (keeps nothing); shm: the directory of an Empty or
	// Cache|Empty store, released at Close.
	empty bool
	shm   *shmDir
}

// Open opens the store a configuration describes (ParseStoreConfig): the process's instance
// under <storage_backends[0]>/stores/<layout namespace>/<instance> (ucmconfig.Config.InstanceStore:
// one namespace per schema and layout, so a new block size or tensor shape on the same
// backends opens its own store and the old layout's blocks stay for it), the backends as a
// shared tier so that every process configured with them sees the blocks of the others of its
// layout (docs/sharing.md). A worker whose instance name another live process holds retries
// with a numbered suffix. The scheduler's store (no transfer shape) is lookup-only.
//
// store_pipeline "Empty" opens a store that keeps nothing (an empty, lookup-only index in a
// private directory under ShmDir, removed at Close): dumps complete and store nothing, lookups
// are false, loads fail per block with engine.ErrNotFound, as a miss does. "Cache|Empty" opens
// a host-memory cache: a disk tier on tmpfs (ShmDir, by default /dev/shm/ucmgo) of
// cache_buffer_capacity_gb, synced never. Shared (ucmconfig.ConnectorParams.SharedCache), every
// store of the unique_id, in this process or another, is an instance on
// <ShmDir>/cache-<unique_id> and sees the blocks of the others; private, the store has a
// directory of its own. The last store to close removes the directory; a crashed set's is
// removed by the next Empty or Cache|Empty store opened under ShmDir.
func Open(cfg *StoreConfig) (*Store, error) {
	p := cfg.Params
	var (
		shm     *shmDir
		openCfg = cfg.Config
		shared  = true
	)
	if p.KeepsNothing() || p.CacheOnly() {
		var err error
		shm, openCfg, err = openShm(cfg)
		if err != nil {
			return nil, err
		}
		shared = p.SharedCache()
	}
	s, err := openEngine(cfg, openCfg, shared)
	if err != nil {
		if _, rerr := shm.release(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	s.shm, s.empty = shm, p.KeepsNothing()
	return s, nil
}

// openShm takes a share of the directory of an Empty or Cache|Empty store and returns the
// configuration with that directory as storage_backends.
func openShm(cfg *StoreConfig) (*shmDir, *ucmconfig.Config, error) {
	p := cfg.Params
	root := cfg.ShmDir
	if root == DefaultShmDir {
		st, err := os.Stat(shmBase)
		switch {
		case (err != nil || !st.IsDir()) && p.KeepsNothing():
			// An Empty store's directory holds an index that stays empty: any will do.
			root = filepath.Join(os.TempDir(), "ucmgo")
		case err != nil || !st.IsDir():
			return nil, nil, fmt.Errorf("store_pipeline %q: %s does not exist (the store lives on tmpfs): mount it or set UCMGO_SHM_DIR to a tmpfs directory: %w",
				p.StorePipeline, shmBase, engine.ErrInvalidArgument)
		}
	}
	prefix := shmPrivatePrefix
	switch {
	case p.KeepsNothing():
		prefix = shmEmptyPrefix
	case p.SharedCache():
		prefix = shmSharedPrefix
	}
	shm, err := acquireShmDir(root, shmName(prefix, p.UniqueID))
	if err != nil {
		return nil, nil, fmt.Errorf("store_pipeline %q: %w", p.StorePipeline, err)
	}
	c := *cfg.Config
	c.Connectors = append([]ucmconfig.ConnectorConfig(nil), c.Connectors...)
	c.Connectors[0].Config.StorageBackends = ucmconfig.Paths{shm.path}
	return shm, &c, nil
}

// openEngine opens the engine of a store on the configuration c (cfg's, or with the directory
// of an Empty or Cache|Empty store): an instance of the shared backends (shared), or the store
// directory itself.
func openEngine(cfg *StoreConfig, c *ucmconfig.Config, shared bool) (*Store, error) {
	p := c.Connectors[0].Config
	name := cfg.Instance
	var (
		eng *engine.Engine
		err error
	)
	for try := 1; try <= maxInstanceRetries; try++ {
		if try > 1 {
			name = fmt.Sprintf("%s-%d", cfg.Instance, try)
		}
		var (
			dir  string
			opts engine.Options
			derr error
		)
		if shared {
			dir, opts, derr = c.InstanceStore(name, cfg.Schema, cfg.Layout)
			if errors.Is(derr, engine.ErrLocked) {
				err = derr // a store of this name left from before layout namespaces, in use
				continue
			}
		} else {
			dir, opts, derr = c.StoreOptions()
		}
		if derr != nil {
			return nil, derr
		}
		// An Empty store's engine is an index that stays empty (the store routes no transfer to
		// it), in a directory of its own: never lookup-only, which needs a shared tier.
		opts.Layout, opts.Schema, opts.LookupOnly = cfg.Layout, cfg.Schema, cfg.Scheduler && !p.KeepsNothing()
		if !cfg.Scheduler {
			if err := cfg.Config.CheckBlockSize(cfg.Layout); err != nil {
				return nil, err
			}
		}
		if p.CacheOnly() {
			boundCache(opts.Tiers, p.StorageBackends[0])
		}
		eng, err = engine.Open(dir, opts)
		if !shared || !errors.Is(err, engine.ErrLocked) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	log := slog.Default()
	if unused := cfg.Config.Unused(); len(unused) > 0 {
		log.Info("ucmgo: configuration keys accepted with no effect in UCM-Go", "keys", unused)
	}
	s := &Store{cfg: cfg, eng: eng, log: log, tasks: map[uint64]*Task{}}
	s.cfg.Instance = name
	m, err := openMetrics(cfg, eng)
	if err != nil {
		_ = eng.Close()
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// boundCache lowers the capacity of a Cache|Empty store's tier to the size of the tmpfs under
// it: past that, dumps would fail with ENOSPC instead of evicting.
func boundCache(ts []tiers.Config, dir string) {
	size := tmpfsBytes(dir)
	for i := range ts {
		if size > 0 && ts[i].Capacity > size {
			slog.Default().Warn("ucmgo: cache_buffer_capacity_gb exceeds the tmpfs under the cache; bounded by it",
				"dir", dir, "capacity", ts[i].Capacity, "tmpfs", size)
			ts[i].Capacity = size
		}
	}
}

// Config returns the configuration the store was opened with (Instance is the name it got).
func (s *Store) Config() *StoreConfig { return s.cfg }

// Engine returns the engine instance under the store.
func (s *Store) Engine() *engine.Engine { return s.eng }

// Close waits for every task to finish, closes the engine and stops the metrics endpoint
// when this was its last store. Later calls fail with engine.ErrClosed; Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.mu.Lock()
	pending := make([]*Task, 0, len(s.tasks))
	for _, t := range s.tasks {
		pending = append(pending, t)
	}
	s.mu.Unlock()
	for _, t := range pending {
		s.settle(t) // no I/O may use the caller's memory or staging once Close returns
	}
	s.wg.Wait()
	s.metrics.close() // no scrape collects from a closed engine
	err := s.eng.Close()
	if _, rerr := s.shm.release(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

func (s *Store) check() error {
	if s.closed.Load() {
		return engine.ErrClosed
	}
	return nil
}

// Lookup reports for each id whether the block is stored (exact, per block).
func (s *Store) Lookup(ids []engine.BlockID) ([]bool, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	hits := s.eng.Lookup(ids)
	n := 0
	for _, h := range hits {
		if h {
			n++
		}
	}
	s.metrics.lookup(n, len(ids))
	return hits, nil
}

// LookupOnPrefix returns UCM's lookup_on_prefix: the index of the last block of the leading
// run of stored blocks, -1 when the first is not stored.
func (s *Store) LookupOnPrefix(ids []engine.BlockID) (int, error) {
	if err := s.check(); err != nil {
		return -1, err
	}
	n := s.eng.LookupPrefix(ids)
	s.metrics.lookup(n, len(ids))
	return n - 1, nil
}

// Prefetch starts moving the blocks towards the fastest tier and returns at once (UCM's
// fire-and-forget prefetch; blocks not stored are skipped). On the scheduler's lookup-only
// store it does nothing.
func (s *Store) Prefetch(ids []engine.BlockID) error {
	if err := s.check(); err != nil {
		return err
	}
	if s.cfg.Scheduler || s.empty {
		return nil
	}
	t := s.eng.Prefetch(ids)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-t.Done()
	}()
	return nil
}

// Create reserves blocks for a V0 dump (engine.Engine.Create): one error per id.
func (s *Store) Create(ids []engine.BlockID) ([]error, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.empty {
		return make([]error, len(ids)), nil // reserves nothing: Commit publishes nothing
	}
	return s.eng.Create(ids), nil
}

// Commit publishes (ok) or discards blocks reserved by Create (engine.Engine.Commit).
func (s *Store) Commit(ids []engine.BlockID, ok bool) error {
	if err := s.check(); err != nil {
		return err
	}
	if s.empty {
		return nil
	}
	return s.eng.Commit(ids, ok)
}

// Stats returns the engine's counters.
func (s *Store) Stats() (engine.Stats, error) {
	if err := s.check(); err != nil {
		return engine.Stats{}, err
	}
	return s.eng.Stats(), nil
}

// Task is one Load or Dump call: the engine tasks of its shard groups. It is settled
// (outcomes mapped, metrics recorded) by the first Wait, or by a Check that finds
// every engine task done: in the caller's thread, so that a C caller blocked in Wait is woken
// by the engine's completion directly, not through another goroutine (each hop between threads
// costs a wake-up).
type Task struct {
	id   uint64
	load bool
	// sidecars: a Selector's representation dump (no transfer metrics)
	sidecars bool
	ids      []engine.BlockID
	start    time.Time
	bytes    int64
	parts    []*engine.Task
	members  [][]int // call positions of each part's blocks
	settled  sync.Once
	done     chan struct{}
	errs     []error // per block, once done
	err      error
}

// Load reads shard shards[i] of block ids[i] into dst[i] (one span of the shard, or one span per
// tensor) and returns the task's handle. A shard index of engine.AllShards (-1), or an empty
// shards for every block (UCM's whole-block form, as PcStore takes it), loads the whole block:
// dst[i] is one span of the block, one per shard, or one per tensor of every shard, shard after
// shard. Bad arguments fail the call before any I/O, naming the block and the field.
func (s *Store) Load(ids []engine.BlockID, shards []int, dst [][][]byte) (uint64, error) {
	return s.transfer(true, ids, shards, dst)
}

// Dump stores shard shards[i] of block ids[i] from src[i] and returns the task's handle; shard
// indexes and spans are as Load's (-1 or an empty shards: the whole block). A block becomes
// visible when all its shards are durable (engine.Engine.DumpShard).
func (s *Store) Dump(ids []engine.BlockID, shards []int, src [][][]byte) (uint64, error) {
	return s.transfer(false, ids, shards, src)
}

func (s *Store) transfer(load bool, ids []engine.BlockID, shards []int, bufs [][][]byte) (uint64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	op := "dump"
	if load {
		op = "load"
	}
	if s.cfg.Scheduler {
		return 0, fmt.Errorf("%s: the scheduler's store (no shard_size or tensor sizes configured) only looks up: %w", op, engine.ErrInvalidArgument)
	}
	if len(shards) == 0 && len(ids) > 0 {
		// UCM's whole-block form: no shard list, each block's row covers the block.
		shards = make([]int, len(ids))
		for i := range shards {
			shards[i] = engine.AllShards
		}
	}
	if len(shards) != len(ids) || len(bufs) != len(ids) {
		return 0, fmt.Errorf("%s: %d block ids, %d shard indexes, %d address lists: %w", op, len(ids), len(shards), len(bufs), engine.ErrInvalidArgument)
	}
	l := s.cfg.Layout
	type key struct {
		id    engine.BlockID
		shard int
	}
	seen := make(map[key]int, len(ids))
	named := make(map[engine.BlockID]int, len(ids)) // the first position of each block
	var bytes int64
	for i, id := range ids {
		sh := shards[i]
		if sh != engine.AllShards && (sh < 0 || sh >= l.Shards) {
			return 0, fmt.Errorf("%s: block %s (position %d): shard index %d out of range [0, %d) (or -1, the whole block): %w", op, id, i, sh, l.Shards, engine.ErrInvalidArgument)
		}
		if id.IsZero() {
			return 0, fmt.Errorf("%s: position %d: zero block id: %w", op, i, engine.ErrInvalidArgument)
		}
		if j, dup := seen[key{id, sh}]; dup {
			return 0, fmt.Errorf("%s: block %s shard %d at positions %d and %d: %w", op, id, sh, j, i, ErrDuplicate)
		}
		j, ok := named[id] // the block named before: as a whole, it overlaps any shard of it
		if sh != engine.AllShards {
			j, ok = seen[key{id, engine.AllShards}]
		}
		if ok {
			return 0, fmt.Errorf("%s: block %s at positions %d and %d, once as the whole block: %w", op, id, j, i, ErrDuplicate)
		}
		seen[key{id, sh}] = i
		if _, ok := named[id]; !ok {
			named[id] = i
		}
		if sh == engine.AllShards {
			if err := s.checkBlockSpans(bufs[i]); err != nil {
				return 0, fmt.Errorf("%s: block %s (position %d), the whole block: %w", op, id, i, err)
			}
			bytes += int64(l.Shards) * l.ShardBytes
		} else {
			if err := s.checkSpans(bufs[i]); err != nil {
				return 0, fmt.Errorf("%s: block %s (position %d), shard %d: %w", op, id, i, sh, err)
			}
			bytes += l.ShardBytes
		}
	}
	t := &Task{load: load, ids: ids, start: time.Now(), done: make(chan struct{}), bytes: bytes}
	if s.empty {
		// UCM's Empty store: a dump stores nothing and succeeds; a load finds nothing, and
		// fails per block as a miss does (UCM's reports success and leaves the memory as it
		// was, which a caller cannot tell from a hit).
		t.errs = make([]error, len(ids))
		if load {
			for i, id := range ids {
				t.errs[i] = fmt.Errorf("block %s: the Empty store keeps nothing: %w", id, engine.ErrNotFound)
			}
		}
		return s.register(t), nil
	}
	whole := l.Shards == 1
	// One engine task per shard index named (a layer-wise call names one; the whole block is
	// one more).
	groups := map[int][]int{}
	var order []int
	for i, sh := range shards {
		if whole {
			sh = engine.AllShards // shard 0 of a one-shard block is the block
		}
		if _, ok := groups[sh]; !ok {
			order = append(order, sh)
		}
		groups[sh] = append(groups[sh], i)
	}
	parts := make([]*engine.Task, 0, len(order))
	members := make([][]int, 0, len(order))
	for _, sh := range order {
		pos := groups[sh]
		gids := make([]engine.BlockID, len(pos))
		gbufs := make([][][]byte, len(pos))
		for k, i := range pos {
			gids[k], gbufs[k] = ids[i], bufs[i]
		}
		var et *engine.Task
		if load {
			et = s.eng.LoadSpans(gids, sh, gbufs)
		} else {
			et = s.eng.DumpSpans(gids, sh, gbufs)
		}
		parts = append(parts, et)
		members = append(members, pos)
	}
	t.parts, t.members = parts, members
	return s.register(t), nil
}

// register gives a task its handle.
func (s *Store) register(t *Task) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	t.id = s.next
	s.tasks[t.id] = t
	return t.id
}

// checkSpans: one span of the shard, or one span per tensor of the configured sizes.
func (s *Store) checkSpans(spans [][]byte) error {
	l := s.cfg.Layout
	switch {
	case len(spans) == 1 && int64(len(spans[0])) == l.ShardBytes:
		return nil
	case len(spans) == 1 && len(s.cfg.Tensors) != 1:
		return fmt.Errorf("one span of %d bytes, want the whole shard's %d (or %d spans, one per tensor): %w", len(spans[0]), l.ShardBytes, len(s.cfg.Tensors), engine.ErrInvalidArgument)
	case len(spans) != len(s.cfg.Tensors):
		return fmt.Errorf("%d addresses, want %d (one per tensor) or one for the whole shard: %w", len(spans), len(s.cfg.Tensors), engine.ErrInvalidArgument)
	}
	for j, b := range spans {
		if int64(len(b)) != s.cfg.Tensors[j] {
			return fmt.Errorf("tensor %d: %d bytes, want %d (tensor sizes %v): %w", j, len(b), s.cfg.Tensors[j], s.cfg.Tensors, engine.ErrInvalidArgument)
		}
	}
	return nil
}

// checkBlockSpans: the whole block as one span, one span per shard, or one per tensor of every
// shard (shard after shard), each of its configured size.
func (s *Store) checkBlockSpans(spans [][]byte) error {
	l, t := s.cfg.Layout, s.cfg.Tensors
	block := int64(l.Shards) * l.ShardBytes
	switch len(spans) {
	case 1:
		if int64(len(spans[0])) != block {
			return fmt.Errorf("one span of %d bytes, want the block's %d: %w", len(spans[0]), block, engine.ErrInvalidArgument)
		}
	case l.Shards * len(t):
		for j, b := range spans {
			if want := t[j%len(t)]; int64(len(b)) != want {
				return fmt.Errorf("span %d (shard %d, tensor %d): %d bytes, want %d: %w", j, j/len(t), j%len(t), len(b), want, engine.ErrInvalidArgument)
			}
		}
	case l.Shards:
		for j, b := range spans {
			if int64(len(b)) != l.ShardBytes {
				return fmt.Errorf("span %d (shard %d): %d bytes, want the shard's %d: %w", j, j, len(b), l.ShardBytes, engine.ErrInvalidArgument)
			}
		}
	default:
		return fmt.Errorf("%d spans, want 1 (the block, %d bytes), %d (one per shard of %d bytes) or %d (one per tensor of every shard, sizes %v): %w",
			len(spans), block, l.Shards, l.ShardBytes, l.Shards*len(t), t, engine.ErrInvalidArgument)
	}
	return nil
}

// settle waits for the engine tasks (each Wait enforces the timeout), maps their per-block
// outcomes back to call order and records the metrics; once per task.
func (s *Store) settle(t *Task) {
	t.settled.Do(func() {
		if t.errs == nil {
			t.errs = make([]error, len(t.ids))
		}
		for k, et := range t.parts {
			err := et.Wait()
			be := et.BlockErrors()
			for j, i := range t.members[k] {
				switch {
				case j < len(be) && be[j] != nil:
					t.errs[i] = be[j]
				case j >= len(be) && err != nil:
					t.errs[i] = err
				}
			}
		}
		var failed []error
		for _, e := range t.errs {
			if e != nil {
				failed = append(failed, e)
			}
		}
		if len(failed) > 0 {
			t.err = fmt.Errorf("%d of %d blocks failed: %w", len(failed), len(t.ids), errors.Join(failed...))
		}
		if !t.sidecars {
			s.metrics.transfer(t.load, len(t.ids), t.bytes, time.Since(t.start), t.err == nil)
		}
		close(t.done)
	})
}

func (s *Store) task(id uint64) (*Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return nil, fmt.Errorf("task %d: never started or already waited for: %w", id, ErrUnknownTask)
	}
	return t, nil
}

// Wait blocks until task id is done, consumes its handle and returns its error (nil when every
// block succeeded). failed, if not nil, must have one entry per block of the call: it is set
// to whether each block failed (a load's failed blocks are recomputed by the engine).
func (s *Store) Wait(id uint64, failed []bool) error {
	t, err := s.task(id)
	if err != nil {
		return err
	}
	if failed != nil && len(failed) != len(t.ids) {
		return fmt.Errorf("task %d: failure mask of %d entries for %d blocks: %w", id, len(failed), len(t.ids), engine.ErrInvalidArgument)
	}
	s.settle(t)
	s.mu.Lock()
	_, mine := s.tasks[id]
	delete(s.tasks, id)
	s.mu.Unlock()
	if !mine {
		return fmt.Errorf("task %d: waited for by another caller: %w", id, ErrUnknownTask)
	}
	for i := range failed {
		failed[i] = t.errs[i] != nil
	}
	return t.err
}

// Notify calls fn once the I/O of task id is done: in the goroutine that completes the task's
// last engine task (engine.Task.OnDone), or at once if it is done. A waiter outside Go (the C
// ABI's ucmgo_wait) sleeps on its own primitive and is woken by fn; fn may call Wait, which no
// longer blocks, and must not block otherwise.
func (s *Store) Notify(id uint64, fn func()) error {
	t, err := s.task(id)
	if err != nil {
		return err
	}
	// Run by the goroutine that completes the last engine task: no goroutine of its own, one
	// hop fewer between the I/O's completion and the waiter.
	var left atomic.Int32
	left.Store(int32(len(t.parts)))
	if len(t.parts) == 0 {
		fn()
		return nil
	}
	for _, et := range t.parts {
		et.OnDone(func() {
			if left.Add(-1) == 0 {
				fn()
			}
		})
	}
	return nil
}

// Blocks returns the number of blocks of task id (the size of Wait's failure mask).
func (s *Store) Blocks(id uint64) (int, error) {
	t, err := s.task(id)
	if err != nil {
		return 0, err
	}
	return len(t.ids), nil
}

// Check reports whether task id is done, without blocking or consuming it, and its error if so.
func (s *Store) Check(id uint64) (bool, error) {
	t, err := s.task(id)
	if err != nil {
		return false, err
	}
	for _, et := range t.parts {
		select {
		case <-et.Done():
		default:
			return false, nil
		}
	}
	s.settle(t)
	return true, t.err
}
