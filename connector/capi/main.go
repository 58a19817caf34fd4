// Command capi is UCM-Go's C ABI: built with -buildmode=c-shared into libucmgo.so, with the
// header ucmgo.h (`make lib`). It exports connector.Store to C and to Python (ctypes) with UCM's
// status codes; docs/connector.md is the guide.
package main

/*
#include <stddef.h>
#include <stdint.h>

#include "internal.h" // the library's C side: lasterror.c, tasks.c, queue.c
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/ucm-go/ucm/connector"
	"github.com/ucm-go/ucm/engine"
)

func main() {}

// statusOK is UCMGO_OK.
const statusOK = C.int32_t(connector.StatusOK)

// maxBlocks bounds n in one call: no call sizes an allocation from an unchecked length.
const maxBlocks = 1 << 24

var handles struct {
	sync.Mutex
	stores map[int64]*connector.Store
	next   int64
}

// fail records err as the thread's last error and returns its status.
func fail(err error) C.int32_t {
	msg := err.Error()
	if msg == "" {
		msg = "ucmgo: error"
	}
	b := []byte(msg)
	C.ucmgo_set_error((*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b)))
	st := connector.StatusOf(err)
	if st == connector.StatusOK {
		st = connector.StatusError
	}
	return C.int32_t(st)
}

func store(h C.int64_t) (*connector.Store, error) {
	handles.Lock()
	defer handles.Unlock()
	s, ok := handles.stores[int64(h)]
	if !ok {
		return nil, fmt.Errorf("store handle %d: not open (never opened, or closed): %w", int64(h), engine.ErrInvalidArgument)
	}
	return s, nil
}

// blockIDs copies n ids from C memory.
func blockIDs(ids *C.uint8_t, n C.size_t) ([]engine.BlockID, error) {
	if n > maxBlocks {
		return nil, fmt.Errorf("%d block ids: more than %d in one call: %w", uint64(n), maxBlocks, engine.ErrInvalidArgument)
	}
	if n == 0 {
		return nil, nil
	}
	if ids == nil {
		return nil, fmt.Errorf("block ids: null pointer for %d ids: %w", uint64(n), engine.ErrInvalidArgument)
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(ids)), int(n)*16)
	out := make([]engine.BlockID, int(n))
	for i := range out {
		copy(out[i][:], raw[i*16:])
	}
	return out, nil
}

// storeAndIDs resolves a store handle and copies its call's block ids.
func storeAndIDs(h C.int64_t, ids *C.uint8_t, n C.size_t) (*connector.Store, []engine.BlockID, error) {
	s, err := store(h)
	if err != nil {
		return nil, nil, err
	}
	bids, err := blockIDs(ids, n)
	return s, bids, err
}

// ucmgo_open opens a store from config: YAML or JSON text (a whole UCM configuration, or the
// mapping UCM's connector hands its store), or the path of a file holding one; NULL or "" reads
// the file UCM_CONFIG_FILE names. Returns a store handle > 0, or a status < 0.
//
//export ucmgo_open
func ucmgo_open(config *C.char) C.int64_t {
	text := ""
	if config != nil {
		text = C.GoString(config)
	}
	cfg, err := connector.ParseStoreConfig(text, os.Getenv)
	if err != nil {
		return C.int64_t(fail(err))
	}
	s, err := connector.Open(cfg)
	if err != nil {
		return C.int64_t(fail(err))
	}
	handles.Lock()
	defer handles.Unlock()
	if handles.stores == nil {
		handles.stores = map[int64]*connector.Store{}
	}
	handles.next++
	h := handles.next
	handles.stores[h] = s
	if !cfg.Scheduler {
		// Small loads and dumps on it may take the submission queue (queue.c); when its table
		// is full they enter Go, as every call did before.
		drainer.Do(func() { go drain() })
		C.ucmgoi_store_add(C.int64_t(h), C.int64_t(cfg.Layout.Shards), C.size_t(len(cfg.Tensors)))
	}
	return C.int64_t(h)
}

// ucmgo_close waits for the store's tasks, closes it and frees the handle.
//
//export ucmgo_close
func ucmgo_close(h C.int64_t) C.int32_t {
	// Calls queued on the store are submitted before it closes, as if they had entered Go.
	C.ucmgoi_store_drop(h)
	takeQueue(false)
	C.ucmgoi_queue_flush()
	handles.Lock()
	s, ok := handles.stores[int64(h)]
	delete(handles.stores, int64(h))
	handles.Unlock()
	if !ok {
		return fail(fmt.Errorf("close: store handle %d: not open: %w", int64(h), engine.ErrInvalidArgument))
	}
	err := s.Close()
	C.ucmgoi_tasks_drop(h) // later waits on its tasks report the store closed
	if err != nil {
		return fail(err)
	}
	return statusOK
}

// ucmgo_lookup sets found[i] to 1 when block i is stored, else 0.
//
//export ucmgo_lookup
func ucmgo_lookup(h C.int64_t, ids *C.uint8_t, n C.size_t, found *C.uint8_t) C.int32_t {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return fail(err)
	}
	if n > 0 && found == nil {
		return fail(fmt.Errorf("lookup: null result array: %w", engine.ErrInvalidArgument))
	}
	hits, err := s.Lookup(bids)
	if err != nil {
		return fail(err)
	}
	copyMask(unsafe.Slice((*byte)(unsafe.Pointer(found)), len(hits)), hits)
	return statusOK
}

// ucmgo_lookup_on_prefix sets *index to the index of the last block of the leading run of
// stored blocks (-1 when the first is not stored), UCM's lookup_on_prefix.
//
//export ucmgo_lookup_on_prefix
func ucmgo_lookup_on_prefix(h C.int64_t, ids *C.uint8_t, n C.size_t, index *C.int64_t) C.int32_t {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return fail(err)
	}
	if index == nil {
		return fail(fmt.Errorf("lookup_on_prefix: null result pointer: %w", engine.ErrInvalidArgument))
	}
	last, err := s.LookupOnPrefix(bids)
	if err != nil {
		return fail(err)
	}
	*index = C.int64_t(last)
	return statusOK
}

// ucmgo_prefetch starts moving the blocks to the fastest tier and returns at once.
//
//export ucmgo_prefetch
func ucmgo_prefetch(h C.int64_t, ids *C.uint8_t, n C.size_t) C.int32_t {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return fail(err)
	}
	if err := s.Prefetch(bids); err != nil {
		return fail(err)
	}
	return statusOK
}

// spans turns the address table into per-block memory views (checked for null and count).
func spans(s *connector.Store, n int, addrs *unsafe.Pointer, perBlock C.size_t) ([][][]byte, error) {
	cfg := s.Config()
	tensors := cfg.Tensors
	switch {
	case n == 0:
		return nil, nil
	case addrs == nil:
		return nil, fmt.Errorf("address table: null pointer: %w", engine.ErrInvalidArgument)
	case perBlock != 1 && int(perBlock) != len(tensors):
		return nil, fmt.Errorf("%d addresses per block: want %d (one per tensor) or 1 (the whole shard): %w", uint64(perBlock), len(tensors), engine.ErrInvalidArgument)
	}
	table := unsafe.Slice(addrs, n*int(perBlock))
	out := make([][][]byte, n)
	for i := range out {
		row := table[i*int(perBlock) : (i+1)*int(perBlock)]
		block := make([][]byte, len(row))
		for j, p := range row {
			if p == nil {
				return nil, fmt.Errorf("block at position %d, address %d: null: %w", i, j, engine.ErrInvalidArgument)
			}
			size := cfg.Layout.ShardBytes
			if len(row) > 1 {
				size = tensors[j]
			}
			block[j] = unsafe.Slice((*byte)(p), size)
		}
		if one := joined(block, cfg.Layout.ShardBytes); one != nil {
			block = [][]byte{one}
		}
		out[i] = block
	}
	return out, nil
}

// joined returns the shard as one span when its tensors lie back to back in memory (the K and V
// of one layer often do), else nil. The spans point into C memory.
func joined(tensors [][]byte, shardBytes int64) []byte {
	if len(tensors) < 2 {
		return nil
	}
	base := unsafe.Pointer(unsafe.SliceData(tensors[0]))
	var off int64
	for _, t := range tensors {
		if unsafe.Pointer(unsafe.SliceData(t)) != unsafe.Add(base, off) {
			return nil
		}
		off += int64(len(t))
	}
	if off != shardBytes {
		return nil
	}
	return unsafe.Slice((*byte)(base), shardBytes)
}

// start checks a load or dump's arguments and starts it on the store: the Go task and its store.
func start(load bool, h C.int64_t, ids *C.uint8_t, shards *C.int64_t, n C.size_t, addrs *unsafe.Pointer, perBlock C.size_t) (*connector.Store, uint64, error) {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return nil, 0, err
	}
	if n > 0 && shards == nil {
		return nil, 0, fmt.Errorf("shard indexes: null pointer: %w", engine.ErrInvalidArgument)
	}
	idx := make([]int, int(n))
	if n > 0 {
		for i, v := range unsafe.Slice((*int64)(unsafe.Pointer(shards)), int(n)) {
			if v < 0 || v > 1<<30 {
				return nil, 0, fmt.Errorf("block %s (position %d): shard index %d out of range: %w", bids[i], i, v, engine.ErrInvalidArgument)
			}
			idx[i] = int(v)
		}
	}
	mem, err := spans(s, int(n), addrs, perBlock)
	if err != nil {
		return nil, 0, err
	}
	var task uint64
	if load {
		task, err = s.Load(bids, idx, mem)
	} else {
		task, err = s.Dump(bids, idx, mem)
	}
	return s, task, err
}

func transfer(load bool, h C.int64_t, ids *C.uint8_t, shards *C.int64_t, n C.size_t, addrs *unsafe.Pointer, perBlock C.size_t) C.int64_t {
	s, task, err := start(load, h, ids, shards, n, addrs, perBlock)
	if err != nil {
		return C.int64_t(fail(err))
	}
	register(h, s, task, int(n))
	return C.int64_t(task)
}

// ucmgoi_load is ucmgo_load (queue.c) for a call it does not queue: it starts loading shard
// shards[i] of block i into the memory at addrs (n × addrs_per_block pointers), or reports what
// is wrong with the arguments. Returns a task handle > 0 or a status < 0.
//
//export ucmgoi_load
func ucmgoi_load(h C.int64_t, ids *C.uint8_t, shards *C.int64_t, n C.size_t, addrs *unsafe.Pointer, addrsPerBlock C.size_t) C.int64_t {
	return transfer(true, h, ids, shards, n, addrs, addrsPerBlock)
}

// ucmgoi_dump is ucmgo_dump (queue.c) for a call it does not queue: it starts storing shard
// shards[i] of block i from the memory at addrs. prerequisite is UCM's device event to wait for
// before copying: host memory has none to wait for, so it is accepted and unused. Returns a
// task handle > 0 or a status < 0.
//
//export ucmgoi_dump
func ucmgoi_dump(h C.int64_t, ids *C.uint8_t, shards *C.int64_t, n C.size_t, addrs *unsafe.Pointer, addrsPerBlock C.size_t, prerequisite C.uint64_t) C.int64_t {
	_ = prerequisite
	return transfer(false, h, ids, shards, n, addrs, addrsPerBlock)
}

// drainer starts drain once, at the first open of a store that transfers.
var drainer sync.Once

// drain submits calls queued in C (queue.c) when no completer takes them: it sleeps in C until
// one is queued.
func drain() {
	for {
		takeQueue(true)
	}
}

// takeQueue submits what is queued, all of it (wait: sleeps in C until there is something, then
// submits one batch).
func takeQueue(wait bool) { take(wait, false) }

// take submits queued calls; expecting ends the caller's promise to look (a completer that
// handed its CPU to a waiter: ucmgoi_task_done returned 1).
func take(wait, expecting bool) {
	var batch [64]*C.ucmgo_entry
	for {
		k := int(C.ucmgoi_queue_take(&batch[0], C.size_t(len(batch)), cbool(wait), cbool(expecting)))
		expecting = false
		for _, e := range batch[:k] {
			submit(e)
		}
		if wait || k < len(batch) {
			return
		}
	}
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// submit starts a queued call on its store and hands its task to the record its waiters
// use. queue.c queued it only after every check start makes, so it fails only if the store
// is gone (it is not: ucmgo_close submits what is queued before closing); if it does fail, its
// wait reports why.
func submit(e *C.ucmgo_entry) {
	defer C.ucmgoi_entry_done(e)
	s, task, err := start(e.load != 0, C.int64_t(e.store), e.ids, e.shards, e.n, (*unsafe.Pointer)(unsafe.Pointer(e.addrs)), e.per)
	if err != nil {
		complete(e.task, err, allFailed(int(e.n)))
		return
	}
	notify(e.task, s, task, int(e.n))
}

// ucmgoi_wait is ucmgo_wait (tasks.c) for a task the C side does not hold: one whose
// registration failed (no memory), or a handle it does not know (never issued, consumed, or of a
// closed store), which this reports.
//
//export ucmgoi_wait
func ucmgoi_wait(h C.int64_t, task C.int64_t, failed *C.uint8_t, n C.size_t) C.int32_t {
	s, err := store(h)
	if err != nil {
		return fail(err)
	}
	if task <= 0 {
		return fail(fmt.Errorf("task %d: %w", int64(task), connector.ErrUnknownTask))
	}
	var mask []bool
	if failed != nil {
		blocks, err := s.Blocks(uint64(task))
		if err != nil {
			return fail(err)
		}
		if int(n) != blocks || n > maxBlocks {
			return fail(fmt.Errorf("wait: failure mask of %d entries for a task of %d blocks: %w", uint64(n), blocks, engine.ErrInvalidArgument))
		}
		mask = make([]bool, blocks)
	}
	werr := s.Wait(uint64(task), mask)
	if mask != nil {
		copyMask(unsafe.Slice((*byte)(unsafe.Pointer(failed)), len(mask)), mask)
	}
	if werr != nil {
		return fail(werr)
	}
	return statusOK
}

// copyMask writes mask as bytes, 1 for true, into C memory.
func copyMask(dst []byte, mask []bool) {
	for i, f := range mask {
		dst[i] = 0
		if f {
			dst[i] = 1
		}
	}
}

// register hands task of s to the C side (tasks.c), which answers ucmgo_wait and ucmgo_check
// for it without entering Go: a goroutine settles the task when its I/O is done (consuming it
// here) and fills in its result there. Without memory for the record the task stays with Go.
func register(h C.int64_t, s *connector.Store, task uint64, n int) {
	rec := C.ucmgoi_task_new(h, C.int64_t(task), C.size_t(n))
	if rec == nil {
		return
	}
	notify(rec, s, task, n)
}

// notify has the record rec settled when task of s is done: the engine goroutine that completes
// the task waits for it (which no longer blocks) and fills in rec.
func notify(rec *C.ucmgo_task, s *connector.Store, task uint64, n int) {
	err := s.Notify(task, func() {
		mask := make([]bool, n)
		complete(rec, s.Wait(task, mask), mask)
	})
	if err != nil { // cannot happen for a task just issued; never leave a waiter hanging
		complete(rec, err, allFailed(n))
	}
}

// allFailed is the failure mask of a task none of whose n blocks was started.
func allFailed(n int) []bool {
	mask := make([]bool, n)
	for i := range mask {
		mask[i] = true
	}
	return mask
}

// complete fills in rec's result, err (nil for success) and the per-block failures (one entry
// per block of the task), which wakes its waiters; when it handed the CPU to one of them, it
// submits what that waiter queued.
func complete(rec *C.ucmgo_task, err error, mask []bool) {
	status, msg := statusOK, ""
	if err != nil {
		status, msg = C.int32_t(connector.StatusOf(err)), err.Error()
		if status == statusOK {
			status = C.int32_t(connector.StatusError)
		}
	}
	failed := make([]byte, max(len(mask), 1))
	copyMask(failed, mask)
	var msgPtr *C.char
	if msg != "" {
		b := []byte(msg)
		msgPtr = (*C.char)(unsafe.Pointer(&b[0]))
	}
	if C.ucmgoi_task_done(rec, status, msgPtr, C.size_t(len(msg)), (*C.uint8_t)(unsafe.Pointer(&failed[0]))) != 0 {
		take(false, true)
	}
}

// ucmgoi_check is ucmgo_check (tasks.c) for a task the C side does not hold.
//
//export ucmgoi_check
func ucmgoi_check(h C.int64_t, task C.int64_t, finished *C.int32_t) C.int32_t {
	s, err := store(h)
	if err != nil {
		return fail(err)
	}
	if finished == nil {
		return fail(fmt.Errorf("check: null result pointer: %w", engine.ErrInvalidArgument))
	}
	if task <= 0 {
		return fail(fmt.Errorf("task %d: %w", int64(task), connector.ErrUnknownTask))
	}
	done, err := s.Check(uint64(task))
	*finished = 0
	if done {
		*finished = 1
	}
	if err != nil {
		return fail(err)
	}
	return statusOK
}

// ucmgo_create reserves blocks for a V0 dump; results[i] is the status of block i
// (UCMGO_EDUPLICATE for a block already stored or being created).
//
//export ucmgo_create
func ucmgo_create(h C.int64_t, ids *C.uint8_t, n C.size_t, results *C.int32_t) C.int32_t {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return fail(err)
	}
	if n > 0 && results == nil {
		return fail(fmt.Errorf("create: null result array: %w", engine.ErrInvalidArgument))
	}
	errs, err := s.Create(bids)
	if err != nil {
		return fail(err)
	}
	out := unsafe.Slice((*int32)(unsafe.Pointer(results)), len(errs))
	var first error
	for i, e := range errs {
		out[i] = int32(connector.StatusOf(e))
		if e != nil && first == nil {
			first = e
		}
	}
	if first != nil {
		fail(first) // the message of the first failed block, for the caller that looks
	}
	return statusOK
}

// ucmgo_commit publishes (success != 0) or discards blocks reserved by ucmgo_create.
//
//export ucmgo_commit
func ucmgo_commit(h C.int64_t, ids *C.uint8_t, n C.size_t, success C.int32_t) C.int32_t {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return fail(err)
	}
	if err := s.Commit(bids, success != 0); err != nil {
		return fail(err)
	}
	return statusOK
}

// statsDoc is what ucmgo_stats writes.
type statsDoc struct {
	Instance  string        `json:"instance"`
	Scheduler bool          `json:"scheduler"`
	Layout    engine.Layout `json:"layout"`
	Tensors   []int64       `json:"tensors"`
	IOEngine  string        `json:"io_engine"`
	Direct    bool          `json:"direct_io"`
	Metrics   string        `json:"metrics_address,omitempty"`
	Stats     engine.Stats  `json:"stats"`
}

// ucmgo_stats writes the store's state as a JSON object (instance, layout, tensors, I/O engine,
// metrics address, and the engine's counters under "stats") into buf, NUL-terminated when it
// fits. Returns the JSON's length in bytes: when it is len or more, the text was cut; call
// again with a larger buffer. Below zero: a status.
//
//export ucmgo_stats
func ucmgo_stats(h C.int64_t, buf *C.char, n C.size_t) C.int64_t {
	s, err := store(h)
	if err != nil {
		return C.int64_t(fail(err))
	}
	st, err := s.Stats()
	if err != nil {
		return C.int64_t(fail(err))
	}
	cfg := s.Config()
	io, direct := s.Engine().IOEngine()
	addr, _ := s.MetricsAddr()
	doc, err := json.Marshal(statsDoc{Instance: cfg.Instance, Scheduler: cfg.Scheduler, Layout: cfg.Layout, Tensors: cfg.Tensors,
		IOEngine: io, Direct: direct, Metrics: addr, Stats: st})
	if err != nil {
		return C.int64_t(fail(err))
	}
	if buf != nil && n > 0 {
		out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(min(n, maxBlocks)))
		k := copy(out[:len(out)-1], doc)
		out[k] = 0
	}
	return C.int64_t(len(doc))
}
