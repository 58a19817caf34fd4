package tiers

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/memcopy"
)

// Mooncake error codes the tier tells apart (mooncake-store/include/types.h). A code not listed
// is a transport or service failure.
const (
	mcBufferOverflow   = -10  // the object is larger than the buffer: not the object we wrote
	mcSegmentNotFound  = -101 // the segment that held the object went away (its client died)
	mcNoAvailableSpace = -200 // the pool is full (NO_AVAILABLE_HANDLE)
	mcReplicaNotReady  = -703 // being written: a miss for now
	mcObjectNotFound   = -704 // a plain miss
	mcObjectExists     = -705 // a put of a key another client (or we) already put: fine
	mcLeaseExpired     = -707 // the read lease ran out mid-transfer
	mcReplicaNotFound  = -710 // gone: a miss
	mcReplicaIsGone    = -712 // gone: a miss
	mcReplicaIsBusy    = -714 // busy: a miss for now
)

// mcIsMiss reports whether a get result is that mean "not there (now)", not a failure of the tier.
func mcIsMiss(code int64) bool {
	switch code {
	case mcObjectNotFound, mcReplicaNotReady, mcReplicaNotFound, mcReplicaIsGone, mcReplicaIsBusy, mcSegmentNotFound, mcLeaseExpired:
		return true
	}
	return false
}

// MooncakePool is a client of a Mooncake Store pool, as the tier uses it. The implementation
// over Mooncake's Go binding is in mooncake_client.go (build tag `mooncake`); tests use fakes.
// Buffers passed to Put and Get are slices of memory returned by Alloc.
type MooncakePool interface {
	// Alloc returns size bytes of memory registered with the transfer engine (kept registered
	// across Reset), valid until Close, its pages resident (the first transfers into it pay
	// no page faults).
	Alloc(size int) ([]byte, error)
	// Put stores each bufs[i] under keys[i] and returns a code per key: 0 or a negative
	// Mooncake error code. A non-nil error means the whole batch failed.
	Put(keys []string, bufs [][]byte) ([]int, error)
	// Get reads each keys[i] into bufs[i] and returns per key the object's length (> 0) or a
	// negative Mooncake error code. A non-nil error means the whole batch failed.
	Get(keys []string, bufs [][]byte) ([]int64, error)
	// Exist reports per key whether the object is in the pool.
	Exist(keys []string) ([]bool, error)
	// Healthy reports whether the client is set up and its master answers its pings.
	Healthy() bool
	// Reset drops the client and sets up a new one (after the master was replaced or lost
	// this client). It may fail (the master is still down); the pool is then unhealthy.
	Reset() error
	// Close tears the client down and frees Alloc's memory.
	Close() error
}

// MooncakeStats counts what a MooncakeTier did; a snapshot.
type MooncakeStats struct {
	Up      bool   // the tier is in use (its master answers)
	Hits    uint64 // blocks (or shards) loaded from the pool, verified
	Misses  uint64 // loads the pool did not have
	Skipped uint64 // loads, puts and lookups skipped because the tier was down
	// Rejected counts objects whose header or checksums were not those of the block asked for
	// (stale, foreign, another schema's, truncated or damaged): each was a miss.
	Rejected uint64
	Puts     uint64 // blocks written to the pool
	// PutsLent counts the blocks of Puts put from a payload the tier lent (LendPayload): no
	// copy into a put slot.
	PutsLent uint64
	// PutsDropped counts write-throughs not done: no free staging slot, the tier down, the
	// pool full or refusing.
	PutsDropped uint64
	Errors      uint64 // transport or service failures (each logged, rate-limited)
	Downs       uint64 // times the tier went down
	Rejoins     uint64 // times it came back
	Resets      uint64 // times the client was set up anew
}

// MooncakeTier is the mooncake tier: blocks of one layout and schema stored as objects in a
// Mooncake Store pool, written through asynchronously, read with every byte checked against
// the checksums the object's header carries (themselves checked against the caller's). It is
// safe for concurrent use. While its pool is unhealthy it is skipped: loads and lookups miss,
// write-throughs are dropped, each counted; a health loop brings it back.
type MooncakeTier struct {
	name   string
	cfg    MooncakeConfig
	layout format.Layout
	fp     format.Fingerprint
	prefix string // <key_prefix>/<fingerprint hex>/
	shards bool   // one object per shard
	// objBytes is one staged block: one block object, or all its shard objects back to back.
	objBytes int
	log      *slog.Logger
	pool     MooncakePool

	getSlots *slotStack
	putSlots *slotStack
	// Lending (PayloadLender), for block objects whose shards lie back to back: the staging
	// slab is laid out so that every slot's payload starts on a 4 KiB boundary, put slot i
	// being slab[i*stride+lead:][:objBytes] and its payload hdr bytes in. refs counts the
	// holders of lent put slot i: its borrower and its pending put; the last one to let go
	// returns the slot to putSlots.
	lends             bool
	slab              []byte
	stride, lead, hdr int
	putAll            [][]byte
	refs              []atomic.Int32
	putq              chan []mcPut // groups of blocks queued together
	pending           mcPending    // queued puts
	// up is whether the tier is in use. The hot paths read it without a lock; it is written
	// only under stateMu, together with the transition counters.
	up atomic.Bool
	// stateMu orders the tier's state transitions: up, the downs and rejoins that count its
	// changes and unhealthySeen change together under it, and Stats reads them under it, so
	// a snapshot never shows a state without the transition that led to it.
	stateMu sync.Mutex
	// unhealthySeen counts the observations of an unhealthy client (by the health loop or by
	// a failed operation). A rejoin happens only if none was made since the health check
	// that saw the client healthy began (guarded by stateMu).
	unhealthySeen  uint64
	downs, rejoins uint64 // guarded by stateMu
	failures       int    // health checks failed in a row (health loop only)
	stop           chan struct{}
	bg             sync.WaitGroup
	closed         atomic.Bool

	hits, misses, skipped, rejected, puts, putsLent, dropped, errs, resets atomic.Uint64

	// Test hooks, nil outside tests: healthObserved runs in checkHealth between the client's
	// health check and the transition it leads to, statePublished right after a new state
	// became visible to the tier's users, flushStarted in Flush once the write-throughs it
	// waits for are known.
	healthObserved func(healthy bool)
	statePublished func()
	flushStarted   func()
}

// mcPending tracks queued puts by sequence number, so that a flush waits for the puts queued
// before it and not for those queued while it waits (under a steady stream of write-throughs
// the queue is never empty).
type mcPending struct {
	mu   sync.Mutex
	cond *sync.Cond
	next uint64              // the sequence number of the next queued put
	out  map[uint64]struct{} // queued, not yet written or dropped
}

// add records a queued put and returns its sequence number.
func (p *mcPending) add() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cond == nil {
		p.cond, p.out = sync.NewCond(&p.mu), map[uint64]struct{}{}
	}
	seq := p.next
	p.next++
	p.out[seq] = struct{}{}
	return seq
}

// done records that put seq was written or dropped.
func (p *mcPending) done(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.out, seq)
	p.cond.Broadcast()
}

// wait returns once every put queued before the call is done; started (if not nil) runs
// once the puts to wait for are known.
func (p *mcPending) wait(started func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	target := p.next
	if started != nil {
		started()
	}
	for p.outstandingBefore(target) {
		p.cond.Wait()
	}
}

// outstandingBefore reports whether a put numbered below target is not done (p.mu held).
func (p *mcPending) outstandingBefore(target uint64) bool {
	for seq := range p.out {
		if seq < target {
			return true
		}
	}
	return false
}

// mcPutWorkers is the number of write-through batches in flight at once. A batch put is a
// master round trip to allocate, the transfers, and another to commit; with two, one batch's
// round trips overlap the other's transfers, as two callers of the raw client do.
const mcPutWorkers = 2

// mcMaxPutBatch bounds gathering: a writer takes one queued group, then more only while its
// batch holds fewer blocks than this (a group queued by one PutBatch is never split, so a
// batch may hold more). Two dumps' groups of this size go to two writers, in flight side by
// side, rather than into one call.
const mcMaxPutBatch = 8

type mcPut struct {
	id   format.BlockID
	slot []byte
	seq  uint64 // mcPending's number
	lent int    // the index of a lent put slot, or -1 (the block was copied into slot)
}

// NewMooncakeTier returns the tier named name over pool for blocks of layout l written under
// schema fingerprint fp; cfg is validated (Config.WithDefaults and Validate) by the caller.
// It allocates cfg.StagingBytes of registered memory from the pool and starts the write-through
// worker and the health loop; the tier is up when the pool is healthy.
func NewMooncakeTier(name string, cfg MooncakeConfig, pool MooncakePool, l format.Layout, fp format.Fingerprint, log *slog.Logger) (*MooncakeTier, error) {
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("mooncake tier %q: %w", name, err)
	}
	if l.Shards > MaxMooncakeParts {
		return nil, fmt.Errorf("mooncake tier %q: %d shards: at most %d: %w", name, l.Shards, MaxMooncakeParts, ErrInvalidConfig)
	}
	if log == nil {
		log = slog.Default()
	}
	t := &MooncakeTier{name: name, cfg: cfg, layout: l, fp: fp, shards: cfg.Object == "shard", log: log, pool: pool,
		stop: make(chan struct{})}
	t.prefix = fmt.Sprintf("%s/%x/", cfg.KeyPrefix, fp[:8])
	if t.shards {
		t.objBytes = l.Shards * MooncakeObjectBytes(l, true)
	} else {
		t.objBytes = MooncakeObjectBytes(l, false)
	}
	t.stride = t.objBytes
	if t.lends = !t.shards && l.ShardStride() == l.ShardBytes; t.lends {
		t.hdr = mcHeaderBytes(l.Shards)
		t.stride = int(format.AlignUp(int64(t.hdr)) + l.BlockBytes())
	}
	slots := int(cfg.StagingBytes / int64(t.stride))
	if slots < 4 {
		return nil, &ConfigError{Tier: -1, Name: name, Field: "mooncake.staging_bytes",
			Reason: fmt.Sprintf("%d bytes hold %d staged blocks of %d bytes; want at least 4", cfg.StagingBytes, slots, t.stride)}
	}
	size := slots * t.stride
	if t.lends {
		size += format.Alignment // room to start the first payload on a boundary
	}
	slab, err := pool.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("mooncake tier %q: staging memory (%d bytes): %w", name, size, err)
	}
	if t.lends {
		// The payloads start on 4 KiB boundaries (the stride is a multiple), whatever the
		// alignment of the memory (mapped memory is aligned already: lead is then the
		// header's padding).
		first := uintptr(unsafe.Pointer(unsafe.SliceData(slab))) + uintptr(t.hdr)
		t.lead = int(format.AlignUp(int64(first)) - int64(first))
	}
	all := make([][]byte, slots)
	for i := range all {
		lo := i*t.stride + t.lead
		all[i] = slab[lo : lo+t.objBytes : lo+t.objBytes]
	}
	// putAll is the put slots by index; the stacks own the lists they are given.
	t.slab, t.putAll, t.refs = slab, slices.Clone(all[:slots/2]), make([]atomic.Int32, slots/2)
	t.putSlots, t.getSlots = newSlotStack(all[:slots/2:slots/2]), newSlotStack(all[slots/2:])
	t.putq = make(chan []mcPut, slots/2)
	t.up.Store(pool.Healthy())
	t.bg.Add(1 + mcPutWorkers)
	for w := 0; w < mcPutWorkers; w++ {
		go t.putWorker()
	}
	go t.healthLoop()
	return t, nil
}

// Name returns the tier's configured name.
func (t *MooncakeTier) Name() string { return t.name }

// Kind returns KindMooncake (Cache).
func (t *MooncakeTier) Kind() Kind { return KindMooncake }

// Inclusive returns false: other instances fill the pool too, so lookups ask it (Cache).
func (t *MooncakeTier) Inclusive() bool { return false }

// Remove does nothing (Cache): the pool's objects are shared with other instances, checked on
// every load, and age out by the pool's eviction.
func (t *MooncakeTier) Remove(format.BlockID) {}

// Usage returns the tier's accounting (Cache): its hits, misses and rejected objects (as
// Corrupt). The pool's size and contents are other instances' too, and not counted.
func (t *MooncakeTier) Usage() CacheStats {
	s := t.Stats()
	return CacheStats{Hits: int64(s.Hits), Misses: int64(s.Misses), Corrupt: int64(s.Rejected)}
}

// Up reports whether the tier is in use.
func (t *MooncakeTier) Up() bool { return t.up.Load() }

// Stats returns a snapshot of the tier's counters. Up, Downs and Rejoins are taken together:
// Up is the state the counted transitions led to.
func (t *MooncakeTier) Stats() MooncakeStats {
	t.stateMu.Lock()
	up, downs, rejoins := t.up.Load(), t.downs, t.rejoins
	t.stateMu.Unlock()
	return MooncakeStats{Up: up, Hits: t.hits.Load(), Misses: t.misses.Load(), Skipped: t.skipped.Load(),
		Rejected: t.rejected.Load(), Puts: t.puts.Load(), PutsLent: t.putsLent.Load(), PutsDropped: t.dropped.Load(), Errors: t.errs.Load(),
		Downs: downs, Rejoins: rejoins, Resets: t.resets.Load()}
}

// key names block id's object, or its shard's (shard >= 0) in the shard layout.
func (t *MooncakeTier) key(id format.BlockID, shard int) string {
	k := t.prefix + id.String()
	if shard >= 0 {
		k += "/" + strconv.Itoa(shard)
	}
	return k
}

// blockKeys are the keys of block id's objects: one, or one per shard.
func (t *MooncakeTier) blockKeys(id format.BlockID) []string {
	if !t.shards {
		return []string{t.key(id, -1)}
	}
	keys := make([]string, t.layout.Shards)
	for s := range keys {
		keys[s] = t.key(id, s)
	}
	return keys
}

// object describes the object of block id (shard < 0) or of its shard.
func (t *MooncakeTier) object(id format.BlockID, shard int) mcObject {
	if shard < 0 {
		return mcObject{id: id, fp: t.fp, kind: mcKindBlock, payload: t.layout.BlockBytes(), parts: t.layout.Shards}
	}
	return mcObject{id: id, fp: t.fp, kind: mcKindShard, shard: uint32(shard), payload: t.layout.ShardBytes, parts: 1}
}

// shardObjBytes is the size of one shard object.
func (t *MooncakeTier) shardObjBytes() int { return MooncakeObjectBytes(t.layout, true) }

// Put writes block id (data: its shards back to back, crcs: their format.Checksum) through
// to the pool in the background; the caller may reuse data when Put returns. It never blocks:
// when the tier is down or every put slot is busy the block is not written (counted).
func (t *MooncakeTier) Put(id format.BlockID, data []byte, crcs []uint32) {
	t.PutBatch([]format.BlockID{id}, [][]byte{data}, [][]uint32{crcs})
}

// PutBatch is Put for blocks ids[i] (data[i], crcs[i]), queued together: they are put in one
// batch call (with any other queued blocks) rather than one by one as the pool's writer wakes.
// Blocks of the wrong size, and those with no free put slot, are not written (counted). A
// data[i] the tier lent (LendPayload) is put from where it is, with no copy, and held until
// its put is done.
func (t *MooncakeTier) PutBatch(ids []format.BlockID, data [][]byte, crcs [][]uint32) {
	if t.closed.Load() || len(data) != len(ids) || len(crcs) != len(ids) {
		return
	}
	var group []mcPut
	for i, id := range ids {
		if int64(len(data[i])) != t.layout.BlockBytes() || len(crcs[i]) != t.layout.Shards {
			continue
		}
		if !t.up.Load() {
			t.skipped.Add(1)
			t.dropped.Add(1)
			continue
		}
		if k, ok := t.lentSlot(data[i]); ok && t.hold(k) {
			slot := t.putAll[k]
			encodeHeader(slot, t.object(id, -1), crcs[i])
			group = append(group, mcPut{id: id, slot: slot, seq: t.pending.add(), lent: k})
			continue
		}
		slot := t.putSlots.tryTake()
		if slot == nil {
			t.dropped.Add(1)
			continue
		}
		t.stage(slot, id, data[i], crcs[i])
		group = append(group, mcPut{id: id, slot: slot, seq: t.pending.add(), lent: -1})
	}
	if len(group) > 0 {
		t.putq <- group // never blocks: the queue holds as many groups as there are put slots
	}
}

// LendPayload returns the payload of a free put slot for a block the caller is about to dump
// (PayloadLender): with block objects whose shards lie back to back, while the tier is up and
// a put slot is free; else nil.
func (t *MooncakeTier) LendPayload() []byte {
	if !t.lends || t.closed.Load() || !t.up.Load() {
		return nil
	}
	slot := t.putSlots.tryTake()
	if slot == nil {
		return nil
	}
	k := t.slotIndex(slot)
	t.refs[k].Store(1)
	n := t.hdr + int(t.layout.BlockBytes())
	return slot[t.hdr:n:n]
}

// ReturnPayload gives back a payload LendPayload returned (PayloadLender).
func (t *MooncakeTier) ReturnPayload(p []byte) bool {
	k, ok := t.lentSlot(p)
	if ok {
		t.release(k)
	}
	return ok
}

// slotIndex is the index of put slot slot in putAll.
func (t *MooncakeTier) slotIndex(slot []byte) int {
	return int(uintptr(unsafe.Pointer(unsafe.SliceData(slot)))-uintptr(unsafe.Pointer(unsafe.SliceData(t.slab)))) / t.stride
}

// lentSlot returns the index of the put slot whose payload p is, if p is one that is lent.
func (t *MooncakeTier) lentSlot(p []byte) (int, bool) {
	if !t.lends || int64(len(p)) != t.layout.BlockBytes() {
		return 0, false
	}
	at, first := uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(unsafe.Pointer(unsafe.SliceData(t.slab)))+uintptr(t.lead+t.hdr)
	if at < first || (at-first)%uintptr(t.stride) != 0 {
		return 0, false
	}
	k := int((at - first) / uintptr(t.stride))
	if k >= len(t.putAll) || t.refs[k].Load() <= 0 {
		return 0, false
	}
	return k, true
}

// hold adds a holder to lent put slot k, unless it has none left (it was returned meanwhile).
func (t *MooncakeTier) hold(k int) bool {
	for {
		n := t.refs[k].Load()
		if n <= 0 {
			return false
		}
		if t.refs[k].CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release drops a holder of lent put slot k; the last one returns the slot to putSlots. A
// release of a slot with no holder (a payload returned twice) does nothing.
func (t *MooncakeTier) release(k int) {
	for {
		n := t.refs[k].Load()
		if n <= 0 {
			return
		}
		if t.refs[k].CompareAndSwap(n, n-1) {
			if n == 1 {
				t.putSlots.put(t.putAll[k])
			}
			return
		}
	}
}

// done returns a queued put's slot: to putSlots, or a lent one's hold.
func (t *MooncakeTier) done(p mcPut) {
	if p.lent >= 0 {
		t.release(p.lent)
	} else {
		t.putSlots.put(p.slot)
	}
	t.pending.done(p.seq)
}

// stage writes block id's object(s) into slot.
func (t *MooncakeTier) stage(slot []byte, id format.BlockID, data []byte, crcs []uint32) {
	if t.shards {
		sb, n := int(t.layout.ShardBytes), t.shardObjBytes()
		for s := 0; s < t.layout.Shards; s++ {
			obj := slot[s*n : (s+1)*n]
			h := encodeHeader(obj, t.object(id, s), crcs[s:s+1])
			copy(obj[h:], data[s*sb:(s+1)*sb])
		}
		return
	}
	h := encodeHeader(slot, t.object(id, -1), crcs)
	copy(slot[h:], data)
}

// Flush waits until every write-through queued before the call has been written or dropped;
// write-throughs queued while it waits do not hold it back.
func (t *MooncakeTier) Flush() { t.pending.wait(t.flushStarted) }

func (t *MooncakeTier) putWorker() {
	defer t.bg.Done()
	for {
		var batch []mcPut
		select {
		case <-t.stop:
			// Drain: what is queued is dropped.
			for {
				select {
				case g := <-t.putq:
					for _, p := range g {
						t.dropped.Add(1)
						t.done(p)
					}
				default:
					return
				}
			}
		case g := <-t.putq:
			batch = append(batch, g...)
		}
	gather:
		for len(batch) < mcMaxPutBatch {
			select {
			case g := <-t.putq:
				batch = append(batch, g...)
			default:
				break gather
			}
		}
		t.putBatch(batch)
		for _, p := range batch {
			t.done(p)
		}
	}
}

func (t *MooncakeTier) putBatch(batch []mcPut) {
	if !t.up.Load() {
		t.skipped.Add(uint64(len(batch)))
		t.dropped.Add(uint64(len(batch)))
		return
	}
	var (
		keys  []string
		bufs  [][]byte
		owner []int
	)
	for k, p := range batch {
		if t.shards {
			n := t.shardObjBytes()
			for s, key := range t.blockKeys(p.id) {
				keys, bufs, owner = append(keys, key), append(bufs, p.slot[s*n:(s+1)*n]), append(owner, k)
			}
		} else {
			keys, bufs, owner = append(keys, t.key(p.id, -1)), append(bufs, p.slot), append(owner, k)
		}
	}
	codes, err := t.pool.Put(keys, bufs)
	if err == nil && len(codes) != len(keys) {
		err = fmt.Errorf("put returned %d results for %d keys", len(codes), len(keys))
	}
	if err != nil {
		t.dropped.Add(uint64(len(batch)))
		t.failed("put", err)
		return
	}
	failed := make([]bool, len(batch))
	var firstBad int
	for i, c := range codes {
		if c == 0 || c == mcObjectExists {
			continue
		}
		failed[owner[i]] = true
		if firstBad == 0 {
			firstBad = c
		}
	}
	for k, p := range batch {
		if failed[k] {
			t.dropped.Add(1)
			continue
		}
		t.puts.Add(1)
		if p.lent >= 0 {
			t.putsLent.Add(1)
		}
	}
	if firstBad != 0 && firstBad != mcNoAvailableSpace {
		// A full pool is the cache working as designed (its master evicts); anything else is
		// a failure worth a log line and a health check.
		t.failed("put", fmt.Errorf("mooncake error %d", firstBad))
	}
}

// Load loads blocks from the pool (Cache): for each i with want nil or want[i], ids[i]'s whole
// block (shard < 0) or its shard `shard` into dst(i) (Layout().BlockBytes() or ShardBytes
// bytes), asked for only once the block's objects were read. It returns which it loaded; every
// byte of those was checked against the checksums of the object's header, and the header
// against the block, schema and layout asked for. Anything else is a miss: absent, evicted, in
// a segment whose client died, stale, foreign or damaged (counted in Rejected and logged, not
// returned: the error is always nil), or the tier down (Skipped). A loaded dst(i) is complete;
// a missed one's contents are unspecified. When crcs is not nil and whole blocks are loaded,
// crcs[i] receives the shard checksums of each loaded block (those its bytes were checked
// against).
func (t *MooncakeTier) Load(ids []format.BlockID, shard int, want []bool, dst func(int) []byte, crcs [][]uint32) ([]bool, error) {
	hits := make([]bool, len(ids))
	var todo []int
	for i := range ids {
		if want == nil || want[i] {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 || t.closed.Load() {
		return hits, nil
	}
	if !t.up.Load() {
		t.skipped.Add(uint64(len(todo)))
		return hits, nil
	}
	for len(todo) > 0 {
		// As many blocks as there are free slots (at least one: wait for it).
		slots := t.getSlots.take(len(todo))
		n := len(slots)
		// Split in two gets, both in flight at once: the first half is checked and copied
		// out while the second is still moving, so the pool is not idle while this caller
		// works through the bytes.
		h := (n + 1) / 2
		first := t.prepare(ids, shard, todo[:h], slots[:h])
		var second *mcFetch
		if h < n {
			second = t.prepare(ids, shard, todo[h:n], slots[h:n])
			second.done = make(chan struct{})
			go func() {
				defer close(second.done)
				second.get(t.pool)
			}()
		}
		first.get(t.pool)
		t.check(first, ids, shard, dst, hits, crcs)
		if second != nil {
			<-second.done
			t.check(second, ids, shard, dst, hits, crcs)
		}
		t.getSlots.put(slots...)
		todo = todo[n:]
		if !t.up.Load() {
			t.skipped.Add(uint64(len(todo)))
			break
		}
	}
	return hits, nil
}

// mcFetch is one batch get: blocks idx (indexes of the caller's ids) read into slots.
type mcFetch struct {
	idx   []int
	keys  []string
	bufs  [][]byte
	spans []mcSpan // per block: its keys
	got   []int64  // per key: the object's length or a Mooncake error code
	err   error    // the whole batch failed
	done  chan struct{}
}

// mcSpan is the range keys[lo:hi] of one block's objects.
type mcSpan struct{ lo, hi int }

// prepare lists the keys and buffers of the objects of blocks idx, read into slots.
func (t *MooncakeTier) prepare(ids []format.BlockID, shard int, idx []int, slots [][]byte) *mcFetch {
	f := &mcFetch{idx: idx}
	for k, i := range idx {
		lo := len(f.keys)
		switch {
		case !t.shards:
			f.keys, f.bufs = append(f.keys, t.key(ids[i], -1)), append(f.bufs, slots[k])
		case shard >= 0:
			f.keys, f.bufs = append(f.keys, t.key(ids[i], shard)), append(f.bufs, slots[k][:t.shardObjBytes()])
		default:
			n := t.shardObjBytes()
			for s := 0; s < t.layout.Shards; s++ {
				f.keys, f.bufs = append(f.keys, t.key(ids[i], s)), append(f.bufs, slots[k][s*n:(s+1)*n])
			}
		}
		f.spans = append(f.spans, mcSpan{lo, len(f.keys)})
	}
	return f
}

// get reads the objects.
func (f *mcFetch) get(pool MooncakePool) {
	f.got, f.err = pool.Get(f.keys, f.bufs)
	if f.err == nil && len(f.got) != len(f.keys) {
		f.err = fmt.Errorf("get returned %d results for %d keys", len(f.got), len(f.keys))
	}
}

// check verifies what f read and copies each verified block's payload into dst, marking it in
// hits (and its checksums in crcs); everything else is counted as a miss.
func (t *MooncakeTier) check(f *mcFetch, ids []format.BlockID, shard int, dst func(int) []byte, hits []bool, crcs [][]uint32) {
	if f.err != nil {
		t.misses.Add(uint64(len(f.idx)))
		t.failed("get", f.err)
		return
	}
	got, bufs := f.got, f.bufs
	var transport int64
	for k, i := range f.idx {
		sp := f.spans[k]
		ok := true
		for j := sp.lo; j < sp.hi && ok; j++ {
			if got[j] <= 0 {
				ok = false
				if !mcIsMiss(got[j]) && got[j] != mcBufferOverflow && transport == 0 {
					transport = got[j]
				}
				if got[j] == mcBufferOverflow {
					t.reject(ids[i], fmt.Errorf("%w: larger than the %d bytes expected", ErrMooncakeObject, len(bufs[j])))
				}
			}
		}
		if ok {
			var sums []uint32
			if crcs != nil && shard < 0 {
				sums = make([]uint32, 0, t.layout.Shards)
			}
			if ok = t.verify(ids[i], shard, dst(i), bufs[sp.lo:sp.hi], got[sp.lo:sp.hi], &sums); ok && sums != nil {
				crcs[i] = sums
			}
		}
		if ok {
			hits[i] = true
			t.hits.Add(1)
		} else {
			t.misses.Add(1)
		}
	}
	if transport != 0 {
		t.failed("get", fmt.Errorf("mooncake error %d", transport))
	}
}

// verify checks the objects read for block id and copies the payload asked for into dst;
// when *sums is not nil the checksums checked are appended to it.
func (t *MooncakeTier) verify(id format.BlockID, shard int, dst []byte, objs [][]byte, got []int64, sums *[]uint32) bool {
	l := t.layout
	switch {
	case t.shards:
		first := max(shard, 0)
		sb := int(l.ShardBytes)
		stream := len(objs)*sb >= memcopy.MinOp // a whole block's shards
		for k, obj := range objs {
			s := first + k
			crcs, err := decodeHeader(obj, got[k], t.object(id, s))
			if err == nil {
				h := mcHeaderBytes(1)
				if bad := copyChecked(dst[k*sb:(k+1)*sb], obj[h:h+sb], crcs, stream); bad >= 0 {
					err = fmt.Errorf("%w: shard %d checksum mismatch", ErrMooncakeObject, s)
				} else if *sums != nil {
					*sums = append(*sums, crcs...)
				}
			}
			if err != nil {
				t.reject(id, err)
				return false
			}
		}
		return true
	default:
		crcs, err := decodeHeader(objs[0], got[0], t.object(id, -1))
		if err != nil {
			t.reject(id, err)
			return false
		}
		h := mcHeaderBytes(l.Shards)
		payload := objs[0][h : h+int(l.BlockBytes())]
		part := crcs
		if shard >= 0 {
			sb := int(l.ShardBytes)
			payload, part = payload[shard*sb:(shard+1)*sb], crcs[shard:shard+1]
		}
		if bad := copyChecked(dst, payload, part, len(payload) >= memcopy.MinOp); bad >= 0 {
			t.reject(id, fmt.Errorf("%w: part %d checksum mismatch", ErrMooncakeObject, bad))
			return false
		}
		if *sums != nil {
			*sums = append(*sums, part...)
		}
		return true
	}
}

func (t *MooncakeTier) reject(id format.BlockID, err error) {
	if n := t.rejected.Add(1); n&(n-1) == 0 { // logged at 1, 2, 4, 8, ... rejections
		t.log.Warn("ucm: mooncake tier: object rejected (a miss)", "tier", t.name, "block", id, "rejected", n, "err", err)
	}
}

// Lookup reports for each id with want[i] (every id when want is nil) whether the pool holds
// its object(s) (Cache). It is a hint for lookups: a later Load may still miss.
func (t *MooncakeTier) Lookup(ids []format.BlockID, want []bool) []bool {
	out := make([]bool, len(ids))
	if t.closed.Load() {
		return out
	}
	var (
		keys []string
		idx  []int
	)
	for i, id := range ids {
		if want == nil || want[i] {
			// With shard objects, the first and last shard stand for the block (a block is
			// written whole; a load that finds one missing misses).
			if t.shards {
				keys = append(keys, t.key(id, 0), t.key(id, t.layout.Shards-1))
			} else {
				keys = append(keys, t.key(id, -1))
			}
			idx = append(idx, i)
		}
	}
	if len(keys) == 0 {
		return out
	}
	if !t.up.Load() {
		t.skipped.Add(uint64(len(idx)))
		return out
	}
	ex, err := t.pool.Exist(keys)
	if err == nil && len(ex) != len(keys) {
		err = fmt.Errorf("exist returned %d results for %d keys", len(ex), len(keys))
	}
	if err != nil {
		t.failed("exist", err)
		return out
	}
	per := len(keys) / len(idx)
	for k, i := range idx {
		all := true
		for _, e := range ex[k*per : (k+1)*per] {
			all = all && e
		}
		out[i] = all
	}
	return out
}

// failed counts a transport or service failure, logs it (at 1, 2, 4, ... failures) and takes
// the tier down if its client is no longer healthy.
func (t *MooncakeTier) failed(op string, err error) {
	n := t.errs.Add(1)
	if n&(n-1) == 0 {
		t.log.Error("ucm: mooncake tier: "+op+" failed", "tier", t.name, "errors", n, "err", err)
	}
	if !t.pool.Healthy() {
		t.down(fmt.Errorf("%s: %w", op, err))
	}
}

// down records an observation of an unhealthy client and takes the tier down if it is up.
// A down always wins over a concurrent rejoin: at worst the tier is skipped for one more
// health interval while its master answers, rather than used after a failure was seen.
func (t *MooncakeTier) down(cause error) {
	t.stateMu.Lock()
	t.unhealthySeen++
	wasUp := t.up.Load()
	if wasUp {
		t.downs++
		t.up.Store(false)
	}
	t.stateMu.Unlock()
	if wasUp {
		t.published()
		t.log.Error("ucm: mooncake tier down: skipped until its master answers", "tier", t.name, "master", t.cfg.MasterServerAddress, "err", cause)
	}
}

// rejoin brings the tier back up after a health check that began when unhealthySeen was seen
// and found the client healthy, unless an unhealthy client was observed since (the check's
// result is then stale: the master may have gone in between). It reports whether the tier
// came back.
func (t *MooncakeTier) rejoin(seen uint64) bool {
	t.stateMu.Lock()
	ok := !t.up.Load() && t.unhealthySeen == seen
	if ok {
		t.rejoins++
		t.up.Store(true)
	}
	t.stateMu.Unlock()
	if ok {
		t.published()
	}
	return ok
}

func (t *MooncakeTier) published() {
	if t.statePublished != nil {
		t.statePublished()
	}
}

func (t *MooncakeTier) healthLoop() {
	defer t.bg.Done()
	tick := time.NewTicker(time.Duration(t.cfg.HealthIntervalMs) * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			t.checkHealth()
		}
	}
}

// checkHealth is one round of the health loop: it takes the tier down when the client lost its
// master, brings it back when the master answers again (and nothing saw it unhealthy while it
// was being asked), and sets up a new client after ResetAfter failed rounds in a row.
func (t *MooncakeTier) checkHealth() {
	t.stateMu.Lock()
	seen := t.unhealthySeen
	t.stateMu.Unlock()
	healthy := t.pool.Healthy()
	if t.healthObserved != nil {
		t.healthObserved(healthy)
	}
	if healthy {
		t.failures = 0
		if t.rejoin(seen) {
			t.log.Info("ucm: mooncake tier rejoined", "tier", t.name, "master", t.cfg.MasterServerAddress)
		}
		return
	}
	t.down(errors.New("health check: master unreachable"))
	if t.failures++; t.failures >= t.cfg.ResetAfter {
		t.failures = 0
		t.resets.Add(1)
		if err := t.pool.Reset(); err != nil {
			t.log.Debug("ucm: mooncake tier: client reset failed", "tier", t.name, "err", err)
		}
	}
}

// Close stops the tier: queued write-throughs are dropped, and the pool's client is closed.
// The caller guarantees no Load, Put or Lookup runs concurrently with or after Close.
func (t *MooncakeTier) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(t.stop)
	t.bg.Wait()
	return t.pool.Close()
}

var (
	_ BatchPutter   = (*MooncakeTier)(nil)
	_ PayloadLender = (*MooncakeTier)(nil)
)
