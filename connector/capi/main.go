// Command capi is UCM-Go's C ABI: built with -buildmode=c-shared into libucmgo.so, with the
// header ucmgo.h (`make lib`). It exports connector.Store to C and to Python (ctypes) with UCM's
// status codes; docs/connector.md is the guide.
package main

/*
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "internal.h" // the library's C side: lasterror.c, tasks.c, queue.c
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/ucm-go/ucm/connector"
	"github.com/ucm-go/ucm/engine"
)

func main() {}

// statusOK is UCMGO_OK.
const statusOK = C.int32_t(connector.StatusOK)

// maxBlocks bounds n in one call: no call sizes an allocation from an unchecked length
// (internal.h, shared with the C side).
const maxBlocks = C.UCMGOI_MAX_BLOCKS

var handles struct {
	sync.Mutex
	stores map[int64]*connector.Store
	next   int64
}

// errorMax bounds the messages ucmgo_last_error returns, in bytes (its buffer less the NUL).
const errorMax = C.UCMGOI_ERROR_MAX - 1

// fail records err as the thread's last error and returns its status.
func fail(err error) C.int32_t {
	msg := clipMessage(err.Error(), errorMax)
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

// Every argument an entry point decodes is checked here before it is read or handed to I/O:
// counts against their bounds, pointers and addresses (with the bytes behind them) against the
// memory a caller can have, shard indexes and address counts against the store's layout. The
// exports convert their C arguments to raw words (uintptr, uint64) and call the functions
// below, which the fuzz target (main_test.go) drives with arbitrary words.

// The memory a caller's pointer can name (internal.h): [minAddr, maxAddr).
const (
	minAddr = uint64(C.UCMGOI_MIN_ADDR)
	maxAddr = uint64(C.UCMGOI_MAX_ADDR)
)

// maxStatsBuffer bounds ucmgo_stats' buffer length: more is not a length but a bug.
const maxStatsBuffer = 1 << 30

// outside says why count entries of size bytes at p cannot be the caller's memory ("" when
// they can): a null pointer, one in the first page, or a range that ends past the top of user
// space or wraps around.
func outside(p uintptr, count, size uint64) string {
	if count == 0 {
		return ""
	}
	a := uint64(p)
	hi, n := bits.Mul64(count, size)
	switch {
	case a == 0:
		return "null"
	case a < minAddr || hi != 0 || a > maxAddr || n > maxAddr-a:
		if hi != 0 {
			return fmt.Sprintf("%d × %d bytes at %#x: more than the address space", count, size, a)
		}
		return fmt.Sprintf("%d bytes at %#x: outside the memory a caller can have [%#x, %#x)", n, a, minAddr, maxAddr)
	}
	return ""
}

// region checks that count entries of size bytes at p can be the caller's memory; what names
// the argument in the error.
func region(what string, p uintptr, count, size uint64) error {
	if why := outside(p, count, size); why != "" {
		if why == "null" {
			why = fmt.Sprintf("null pointer for %d entries", count)
		}
		return fmt.Errorf("%s: %s: %w", what, why, engine.ErrInvalidArgument)
	}
	return nil
}

// at turns an address the checks let through into a pointer. It is the caller's memory, not
// Go's: converting through memory keeps vet's uintptr rule (which is about Go memory) quiet.
func at(a uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&a)) }

// bytesAt is the caller's memory [p, p+n) as a slice; p and n were checked by region.
func bytesAt(p uintptr, n uint64) []byte { return unsafe.Slice((*byte)(at(p)), int(n)) }

func store(h int64) (*connector.Store, error) {
	handles.Lock()
	defer handles.Unlock()
	s, ok := handles.stores[h]
	if !ok {
		return nil, fmt.Errorf("store handle %d: not open (never opened, or closed): %w", h, engine.ErrInvalidArgument)
	}
	return s, nil
}

// blockIDs copies n ids from C memory.
func blockIDs(ids uintptr, n uint64) ([]engine.BlockID, error) {
	if n > maxBlocks {
		return nil, fmt.Errorf("%d block ids: more than %d in one call: %w", n, maxBlocks, engine.ErrInvalidArgument)
	}
	if n == 0 {
		return nil, nil
	}
	if err := region("block ids", ids, n, 16); err != nil {
		return nil, err
	}
	raw := bytesAt(ids, n*16)
	out := make([]engine.BlockID, int(n))
	for i := range out {
		copy(out[i][:], raw[i*16:])
	}
	return out, nil
}

// storeAndIDs resolves a store handle and copies its call's block ids.
func storeAndIDs(h int64, ids uintptr, n uint64) (*connector.Store, []engine.BlockID, error) {
	s, err := store(h)
	if err != nil {
		return nil, nil, err
	}
	bids, err := blockIDs(ids, n)
	return s, bids, err
}

// maxEnv and maxEnvEntry bound ucmgo_open_env's environment: entries, and bytes of one.
const (
	maxEnv      = 1 << 16
	maxEnvEntry = 1 << 20
)

// environment decodes a NULL-terminated array of "NAME=value" strings (envp) into a getenv
// function reading only them (the first entry of a name wins, as getenv(3)); envp 0 is the
// process's environment as the library saw it at load (os.Getenv).
func environment(envp uintptr) (func(string) string, error) {
	if envp == 0 {
		return os.Getenv, nil
	}
	vars := map[string]string{}
	for i := uint64(0); ; i++ {
		if i == maxEnv {
			return nil, fmt.Errorf("environment: more than %d entries (no NULL at the end?): %w", maxEnv, engine.ErrInvalidArgument)
		}
		slot := envp + uintptr(i*8)
		if err := region(fmt.Sprintf("environment entry %d", i), slot, 1, 8); err != nil {
			return nil, err
		}
		p := *(*uintptr)(at(slot))
		if p == 0 {
			break
		}
		if err := region(fmt.Sprintf("environment entry %d", i), p, 1, 1); err != nil {
			return nil, err
		}
		n := uint64(C.strnlen((*C.char)(at(p)), maxEnvEntry))
		if n == maxEnvEntry {
			return nil, fmt.Errorf("environment entry %d: longer than %d bytes (no NUL at the end?): %w", i, maxEnvEntry, engine.ErrInvalidArgument)
		}
		kv := string(bytesAt(p, n))
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("environment entry %d: %.40q is not NAME=value: %w", i, kv, engine.ErrInvalidArgument)
		}
		if _, seen := vars[name]; !seen {
			vars[name] = value
		}
	}
	return func(name string) string { return vars[name] }, nil
}

// openStore is ucmgo_open_env: config (a C string, or 0) read with the environment envp names.
func openStore(config, envp uintptr) int64 {
	text := ""
	if config != 0 {
		if err := region("config", config, 1, 1); err != nil {
			return int64(fail(err))
		}
		text = C.GoString((*C.char)(at(config)))
	}
	getenv, err := environment(envp)
	if err != nil {
		return int64(fail(err))
	}
	cfg, err := connector.ParseStoreConfig(text, getenv)
	if err != nil {
		return int64(fail(err))
	}
	s, err := connector.Open(cfg)
	if err != nil {
		return int64(fail(err))
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
		C.ucmgoi_store_add(C.int64_t(h), C.int64_t(cfg.Layout.Shards), C.size_t(len(cfg.Tensors)), C.int64_t(cfg.Layout.ShardBytes))
	}
	return h
}

// ucmgo_open opens a store from config: YAML or JSON text (a whole UCM configuration, or the
// mapping UCM's connector hands its store), or the path of a file holding one; NULL or "" reads
// the file UCM_CONFIG_FILE names. UCM's environment variables are read from the environment
// the process had when the library was loaded. Returns a store handle > 0, or a status < 0.
//
//export ucmgo_open
func ucmgo_open(config *C.char) C.int64_t {
	return C.int64_t(openStore(uintptr(unsafe.Pointer(config)), 0))
}

// ucmgo_open_env is ucmgo_open with UCM's environment variables (UCM_CONFIG_FILE,
// UCM_STORAGE_PATH, UCM_METRICS_ENABLE, ...) read from env, a NULL-terminated array of
// "NAME=value" strings (as execve's envp), instead of the process's; env NULL is ucmgo_open.
//
//export ucmgo_open_env
func ucmgo_open_env(config *C.char, env **C.char) C.int64_t {
	return C.int64_t(openStore(uintptr(unsafe.Pointer(config)), uintptr(unsafe.Pointer(env))))
}

// ucmgo_close waits for the store's tasks, closes it and frees the handle.
//
//export ucmgo_close
func ucmgo_close(h C.int64_t) C.int32_t { return C.int32_t(closeStore(int64(h))) }

func closeStore(h int64) int32 {
	closeSelectorsOf(h) // their selections read the store
	// Calls queued on the store are submitted before it closes, as if they had entered Go.
	C.ucmgoi_store_drop(C.int64_t(h))
	takeQueue(false)
	C.ucmgoi_queue_flush()
	handles.Lock()
	s, ok := handles.stores[h]
	delete(handles.stores, h)
	handles.Unlock()
	if !ok {
		return int32(fail(fmt.Errorf("close: store handle %d: not open: %w", h, engine.ErrInvalidArgument)))
	}
	err := s.Close()
	C.ucmgoi_tasks_drop(C.int64_t(h)) // later waits on its tasks report the store closed
	if err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// ucmgo_lookup sets found[i] to 1 when block i is stored, else 0.
//
//export ucmgo_lookup
func ucmgo_lookup(h C.int64_t, ids *C.uint8_t, n C.size_t, found *C.uint8_t) C.int32_t {
	return C.int32_t(lookup(int64(h), uintptr(unsafe.Pointer(ids)), uint64(n), uintptr(unsafe.Pointer(found))))
}

func lookup(h int64, ids uintptr, n uint64, found uintptr) int32 {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return int32(fail(err))
	}
	if err := region("lookup: result array", found, n, 1); err != nil {
		return int32(fail(err))
	}
	hits, err := s.Lookup(bids)
	if err != nil {
		return int32(fail(err))
	}
	copyMask(bytesAt(found, uint64(len(hits))), hits)
	return int32(statusOK)
}

// ucmgo_lookup_on_prefix sets *index to the index of the last block of the leading run of
// stored blocks (-1 when the first is not stored), UCM's lookup_on_prefix.
//
//export ucmgo_lookup_on_prefix
func ucmgo_lookup_on_prefix(h C.int64_t, ids *C.uint8_t, n C.size_t, index *C.int64_t) C.int32_t {
	return C.int32_t(lookupOnPrefix(int64(h), uintptr(unsafe.Pointer(ids)), uint64(n), uintptr(unsafe.Pointer(index))))
}

func lookupOnPrefix(h int64, ids uintptr, n uint64, index uintptr) int32 {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return int32(fail(err))
	}
	if err := region("lookup_on_prefix: result pointer", index, 1, 8); err != nil {
		return int32(fail(err))
	}
	last, err := s.LookupOnPrefix(bids)
	if err != nil {
		return int32(fail(err))
	}
	*(*int64)(at(index)) = int64(last)
	return int32(statusOK)
}

// ucmgo_prefetch starts moving the blocks to the fastest tier and returns at once.
//
//export ucmgo_prefetch
func ucmgo_prefetch(h C.int64_t, ids *C.uint8_t, n C.size_t) C.int32_t {
	return C.int32_t(prefetch(int64(h), uintptr(unsafe.Pointer(ids)), uint64(n)))
}

func prefetch(h int64, ids uintptr, n uint64) int32 {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return int32(fail(err))
	}
	if err := s.Prefetch(bids); err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// transferArgs is a load's or dump's arguments, decoded and checked (decodeTransfer).
type transferArgs struct {
	ids    []engine.BlockID
	shards []int     // per block: a shard index, or engine.AllShards (-1) for the whole block
	addrs  []uintptr // n × per addresses, block-major
	sizes  [][]int64 // per block: the bytes behind each of its addresses
}

// rowSizes returns the bytes behind each of per addresses of one block's row: for a shard, one
// address (the shard) or one per tensor; for the whole block (shard -1), one address (the
// block), one per shard, or one per tensor of every shard, shard after shard. nil when per is
// none of those.
func rowSizes(cfg *connector.StoreConfig, whole bool, per uint64) []int64 {
	l, t := cfg.Layout, cfg.Tensors
	shards, tensors := uint64(l.Shards), uint64(len(t))
	switch {
	case whole && per == 1:
		return []int64{int64(l.Shards) * l.ShardBytes}
	case per == 1:
		return []int64{l.ShardBytes}
	case !whole && per == tensors:
		return append([]int64(nil), t...)
	case whole && per == shards*tensors:
		out := make([]int64, 0, per)
		for range l.Shards {
			out = append(out, t...)
		}
		return out
	case whole && per == shards:
		out := make([]int64, per)
		for i := range out {
			out[i] = l.ShardBytes
		}
		return out
	}
	return nil
}

// decodeTransfer reads and checks a load's or dump's arguments against the store's layout:
// the counts, the three tables (ids: n × 16 bytes, shards: n int64, addresses: n × per
// pointers), each shard index, the address count for each block's form and each address with
// the bytes behind it. Nothing is read before the memory it is in has been checked, and no
// address is dereferenced.
func decodeTransfer(cfg *connector.StoreConfig, ids, shards uintptr, n uint64, addrs uintptr, per uint64) (*transferArgs, error) {
	bids, err := blockIDs(ids, n)
	if err != nil || n == 0 {
		return &transferArgs{}, err
	}
	if err := region("shard indexes", shards, n, 8); err != nil {
		return nil, err
	}
	l := cfg.Layout
	maxPer := uint64(l.Shards) * uint64(max(len(cfg.Tensors), 1))
	if per == 0 || per > maxPer {
		return nil, fmt.Errorf("%d addresses per block: want %d (one per tensor) or 1 (the whole shard); for the whole block (shard -1), 1, %d (one per shard) or %d (one per tensor of every shard): %w",
			per, len(cfg.Tensors), l.Shards, maxPer, engine.ErrInvalidArgument)
	}
	if err := region("address table", addrs, n*per, 8); err != nil {
		return nil, err
	}
	raw := unsafe.Slice((*int64)(at(shards)), int(n))
	table := unsafe.Slice((*uintptr)(at(addrs)), int(n*per))
	out := &transferArgs{ids: bids, shards: make([]int, n), addrs: make([]uintptr, n*per), sizes: make([][]int64, n)}
	for i := range out.shards {
		v := raw[i]
		if v != engine.AllShards && (v < 0 || v >= int64(l.Shards)) {
			return nil, fmt.Errorf("block %s (position %d): shard index %d out of range [0, %d) (or -1, the whole block): %w", bids[i], i, v, l.Shards, engine.ErrInvalidArgument)
		}
		out.shards[i] = int(v)
		whole := v == engine.AllShards
		sizes := rowSizes(cfg, whole, per)
		if sizes == nil {
			form := fmt.Sprintf("shard %d: want %d (one per tensor) or 1 (the whole shard)", v, len(cfg.Tensors))
			if whole {
				form = fmt.Sprintf("the whole block: want 1, %d (one per shard) or %d (one per tensor of every shard)", l.Shards, maxPer)
			}
			return nil, fmt.Errorf("block %s (position %d): %d addresses per block for %s: %w", bids[i], i, per, form, engine.ErrInvalidArgument)
		}
		out.sizes[i] = sizes
		for j, size := range sizes {
			a := table[uint64(i)*per+uint64(j)]
			if why := outside(a, 1, uint64(size)); why != "" {
				return nil, fmt.Errorf("block at position %d, address %d: %s: %w", i, j, why, engine.ErrInvalidArgument)
			}
			out.addrs[uint64(i)*per+uint64(j)] = a
		}
	}
	return out, nil
}

// views turns checked arguments into per-block memory views (the caller's memory).
func (a *transferArgs) views() [][][]byte {
	out := make([][][]byte, len(a.ids))
	k := 0
	for i, sizes := range a.sizes {
		block := make([][]byte, len(sizes))
		var total int64
		for j, size := range sizes {
			block[j] = bytesAt(a.addrs[k], uint64(size))
			total += size
			k++
		}
		if one := joined(block, total); one != nil {
			block = [][]byte{one}
		}
		out[i] = block
	}
	return out
}

// joined returns the row as one span when its pieces lie back to back in memory (the K and V
// of one layer often do), else nil. The spans point into C memory.
func joined(pieces [][]byte, total int64) []byte {
	if len(pieces) < 2 {
		return nil
	}
	base := unsafe.Pointer(unsafe.SliceData(pieces[0]))
	var off int64
	for _, t := range pieces {
		if unsafe.Pointer(unsafe.SliceData(t)) != unsafe.Add(base, off) {
			return nil
		}
		off += int64(len(t))
	}
	if off != total {
		return nil
	}
	return unsafe.Slice((*byte)(base), total)
}

// start checks a load or dump's arguments and starts it on the store: the Go task and its store.
func start(load bool, h int64, ids, shards uintptr, n uint64, addrs uintptr, per uint64) (*connector.Store, uint64, error) {
	s, err := store(h)
	if err != nil {
		return nil, 0, err
	}
	op := s.Dump
	if load {
		op = s.Load
	}
	if s.Config().Scheduler {
		// Its layout is no transfer shape to check against: the store says why it does not
		// transfer at all.
		_, err := op(nil, nil, nil)
		return nil, 0, err
	}
	args, err := decodeTransfer(s.Config(), ids, shards, n, addrs, per)
	if err != nil {
		return nil, 0, err
	}
	task, err := op(args.ids, args.shards, args.views())
	return s, task, err
}

// transfer is ucmgoi_load and ucmgoi_dump: a task handle > 0 or a status < 0.
func transfer(load bool, h int64, ids, shards uintptr, n uint64, addrs uintptr, per uint64) int64 {
	s, task, err := start(load, h, ids, shards, n, addrs, per)
	if err != nil {
		return int64(fail(err))
	}
	register(h, s, task, int(n))
	return int64(task)
}

// ucmgoi_load is ucmgo_load (queue.c) for a call it does not queue: it starts loading shard
// shards[i] of block i (the whole block for -1) into the memory at addrs (n × addrs_per_block
// pointers), or reports what is wrong with the arguments. Returns a task handle > 0 or a
// status < 0.
//
//export ucmgoi_load
func ucmgoi_load(h C.int64_t, ids *C.uint8_t, shards *C.int64_t, n C.size_t, addrs *unsafe.Pointer, addrsPerBlock C.size_t) C.int64_t {
	return C.int64_t(transfer(true, int64(h), uintptr(unsafe.Pointer(ids)), uintptr(unsafe.Pointer(shards)), uint64(n), uintptr(unsafe.Pointer(addrs)), uint64(addrsPerBlock)))
}

// ucmgoi_dump is ucmgo_dump (queue.c) for a call it does not queue: it starts storing shard
// shards[i] of block i (the whole block for -1) from the memory at addrs. prerequisite is UCM's
// device event to wait for before copying: host memory has none to wait for, so it is accepted
// and unused. Returns a task handle > 0 or a status < 0.
//
//export ucmgoi_dump
func ucmgoi_dump(h C.int64_t, ids *C.uint8_t, shards *C.int64_t, n C.size_t, addrs *unsafe.Pointer, addrsPerBlock C.size_t, prerequisite C.uint64_t) C.int64_t {
	_ = prerequisite
	return C.int64_t(transfer(false, int64(h), uintptr(unsafe.Pointer(ids)), uintptr(unsafe.Pointer(shards)), uint64(n), uintptr(unsafe.Pointer(addrs)), uint64(addrsPerBlock)))
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
	s, task, err := start(e.load != 0, int64(e.store), uintptr(unsafe.Pointer(e.ids)), uintptr(unsafe.Pointer(e.shards)), uint64(e.n), uintptr(unsafe.Pointer(e.addrs)), uint64(e.per))
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
	return C.int32_t(waitTask(int64(h), int64(task), uintptr(unsafe.Pointer(failed)), uint64(n)))
}

// taskHandle checks a task handle's value: every handle issued is > 0.
func taskHandle(task int64) error {
	if task <= 0 {
		return fmt.Errorf("task %d: not a task handle (they are > 0): %w", task, engine.ErrInvalidArgument)
	}
	return nil
}

func waitTask(h, task int64, failed uintptr, n uint64) int32 {
	s, err := store(h)
	if err != nil {
		return int32(fail(err))
	}
	if err := taskHandle(task); err != nil {
		return int32(fail(err))
	}
	if n > maxBlocks { // no task has that many blocks: the count is wrong whatever the task
		return int32(fail(fmt.Errorf("wait: failure mask of %d entries: more than %d in one call: %w", n, maxBlocks, engine.ErrInvalidArgument)))
	}
	var mask []bool
	if failed != 0 {
		blocks, err := s.Blocks(uint64(task))
		if err != nil {
			return int32(fail(err))
		}
		if n != uint64(blocks) {
			return int32(fail(fmt.Errorf("wait: failure mask of %d entries for a task of %d blocks: %w", n, blocks, engine.ErrInvalidArgument)))
		}
		if err := region("wait: failure mask", failed, n, 1); err != nil {
			return int32(fail(err))
		}
		mask = make([]bool, blocks)
	}
	werr := s.Wait(uint64(task), mask)
	if mask != nil {
		copyMask(bytesAt(failed, uint64(len(mask))), mask)
	}
	if werr != nil {
		return int32(fail(werr))
	}
	return int32(statusOK)
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
//
// A close of the store that ran while the task was being issued may have dropped the store's
// tasks (ucmgoi_tasks_drop) before this record was listed; it is dropped too then, so that a
// wait on it reports the store closed, as waits on every task of a closed store do. Handles
// are never reused, so the drop touches no other store's tasks.
func register(h int64, s *connector.Store, task uint64, n int) {
	rec := C.ucmgoi_task_new(C.int64_t(h), C.int64_t(task), C.size_t(n))
	if rec == nil {
		return
	}
	notify(rec, s, task, n)
	if !isOpen(h, s) {
		C.ucmgoi_tasks_drop(C.int64_t(h))
	}
}

// isOpen reports whether handle h is still s's (ucmgo_close has not taken it away).
func isOpen(h int64, s *connector.Store) bool {
	handles.Lock()
	defer handles.Unlock()
	return handles.stores[h] == s
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
		status, msg = C.int32_t(connector.StatusOf(err)), clipMessage(err.Error(), errorMax)
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
	return C.int32_t(checkTask(int64(h), int64(task), uintptr(unsafe.Pointer(finished))))
}

func checkTask(h, task int64, finished uintptr) int32 {
	s, err := store(h)
	if err != nil {
		return int32(fail(err))
	}
	if err := region("check: result pointer", finished, 1, 4); err != nil {
		return int32(fail(err))
	}
	if err := taskHandle(task); err != nil {
		return int32(fail(err))
	}
	done, err := s.Check(uint64(task))
	out := (*int32)(at(finished))
	*out = 0
	if done {
		*out = 1
	}
	if err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// ucmgo_create reserves blocks for a V0 dump; results[i] is the status of block i
// (UCMGO_EDUPLICATE for a block already stored or being created).
//
//export ucmgo_create
func ucmgo_create(h C.int64_t, ids *C.uint8_t, n C.size_t, results *C.int32_t) C.int32_t {
	return C.int32_t(create(int64(h), uintptr(unsafe.Pointer(ids)), uint64(n), uintptr(unsafe.Pointer(results))))
}

func create(h int64, ids uintptr, n uint64, results uintptr) int32 {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return int32(fail(err))
	}
	if err := region("create: result array", results, n, 4); err != nil {
		return int32(fail(err))
	}
	errs, err := s.Create(bids)
	if err != nil {
		return int32(fail(err))
	}
	if len(errs) == 0 {
		return int32(statusOK)
	}
	out := unsafe.Slice((*int32)(at(results)), len(errs))
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
	return int32(statusOK)
}

// ucmgo_commit publishes (success != 0) or discards blocks reserved by ucmgo_create.
//
//export ucmgo_commit
func ucmgo_commit(h C.int64_t, ids *C.uint8_t, n C.size_t, success C.int32_t) C.int32_t {
	return C.int32_t(commit(int64(h), uintptr(unsafe.Pointer(ids)), uint64(n), int32(success)))
}

func commit(h int64, ids uintptr, n uint64, success int32) int32 {
	s, bids, err := storeAndIDs(h, ids, n)
	if err != nil {
		return int32(fail(err))
	}
	if err := s.Commit(bids, success != 0); err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
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
	return C.int64_t(stats(int64(h), uintptr(unsafe.Pointer(buf)), uint64(n)))
}

func stats(h int64, buf uintptr, n uint64) int64 {
	s, err := store(h)
	if err != nil {
		return int64(fail(err))
	}
	if buf != 0 {
		if n > maxStatsBuffer {
			return int64(fail(fmt.Errorf("stats: buffer of %d bytes: more than %d: %w", n, maxStatsBuffer, engine.ErrInvalidArgument)))
		}
		if err := region("stats: buffer", buf, n, 1); err != nil {
			return int64(fail(err))
		}
	}
	st, err := s.Stats()
	if err != nil {
		return int64(fail(err))
	}
	cfg := s.Config()
	io, direct := s.Engine().IOEngine()
	addr, _ := s.MetricsAddr()
	doc, err := json.Marshal(statsDoc{Instance: cfg.Instance, Scheduler: cfg.Scheduler, Layout: cfg.Layout, Tensors: cfg.Tensors,
		IOEngine: io, Direct: direct, Metrics: addr, Stats: st})
	if err != nil {
		return int64(fail(err))
	}
	if buf != 0 && n > 0 {
		out := bytesAt(buf, n)
		k := copy(out[:len(out)-1], doc)
		out[k] = 0
	}
	return int64(len(doc))
}
