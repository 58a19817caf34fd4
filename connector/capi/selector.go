package main

/*
#include <stddef.h>
#include <stdint.h>
#include <string.h>
*/
import "C"

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ucm-go/ucm/connector"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/sparse"
	"gopkg.in/yaml.v3"
)

// The selector ABI (ucmgo.h, "Sparse attention: selectors"): connector.Selector over a store
// handle. Every export converts its C arguments to raw words and calls the function below it,
// which checks them first (the fuzz target drives those with arbitrary words).

// selEntry is an open selector and the store handle it belongs to (whose ucmgo_wait waits for
// its representation dumps).
type selEntry struct {
	x     *connector.Selector
	store int64
}

var selectors struct {
	sync.Mutex
	m map[int64]*selEntry
}

// Bounds of the selector ABI's text arguments, in bytes.
const (
	maxSelectorText = 1 << 20 // the sparse configuration and the shape
	maxRequestID    = 4096
)

// cText reads a NUL-terminated C string of at most limit bytes; what names the argument.
func cText(what string, p uintptr, limit int) (string, error) {
	if err := region(what, p, 1, 1); err != nil {
		return "", err
	}
	n := int(C.strnlen((*C.char)(at(p)), C.size_t(limit)))
	if n == limit {
		return "", fmt.Errorf("%s: longer than %d bytes (no NUL at the end?): %w", what, limit-1, engine.ErrInvalidArgument)
	}
	return string(bytesAt(p, uint64(n))), nil
}

// shapeDoc is ucmgo_selector_open's shape, JSON.
type shapeDoc struct {
	Layers    int `json:"layers"`
	QHeads    int `json:"q_heads"`
	KVHeads   int `json:"kv_heads"`
	HeadDim   int `json:"head_dim"`
	BlockSize int `json:"block_size"`
}

// parseSparse reads a ucm_sparse_config mapping (or a document with one under the key
// ucm_sparse_config) and returns the method it enables (sparse.Choose, without environment).
func parseSparse(text string) (sparse.MethodConfig, error) {
	var top map[string]yaml.Node
	if err := yaml.Unmarshal([]byte(text), &top); err != nil {
		return nil, fmt.Errorf("sparse config: %v: %w", err, engine.ErrInvalidArgument)
	}
	if node, ok := top["ucm_sparse_config"]; ok {
		top = nil
		if err := node.Decode(&top); err != nil {
			return nil, fmt.Errorf("sparse config: ucm_sparse_config: %v: %w", err, engine.ErrInvalidArgument)
		}
	}
	cfg, err := sparse.Choose(top, nil, "")
	if err != nil {
		return nil, fmt.Errorf("sparse config: %w", err)
	}
	if cfg == nil {
		return nil, fmt.Errorf("sparse config: no method enabled (want a mapping such as {ESA: {sparse_ratio: 0.3}}): %w", engine.ErrInvalidArgument)
	}
	return cfg, nil
}

// parseShape reads ucmgo_selector_open's shape: a JSON object with every field of shapeDoc
// and no other.
func parseShape(text string) (sparse.Shape, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	var d shapeDoc
	if err := dec.Decode(&d); err != nil {
		return sparse.Shape{}, fmt.Errorf("shape: %v (want {\"layers\", \"q_heads\", \"kv_heads\", \"head_dim\", \"block_size\"}): %w", err, engine.ErrInvalidArgument)
	}
	return sparse.Shape{Layers: d.Layers, QHeads: d.QHeads, KVHeads: d.KVHeads, HeadDim: d.HeadDim, BlockSize: d.BlockSize}, nil
}

// ucmgo_selector_open builds a selector over a store: sparse_config is a ucm_sparse_config
// mapping (YAML or JSON) naming one block-scoring method, shape the model's as JSON. Returns a
// selector handle > 0, or a status < 0.
//
//export ucmgo_selector_open
func ucmgo_selector_open(store C.int64_t, sparseConfig *C.char, shape *C.char) C.int64_t {
	return C.int64_t(selectorOpen(int64(store), uintptr(unsafe.Pointer(sparseConfig)), uintptr(unsafe.Pointer(shape))))
}

func selectorOpen(h int64, config, shape uintptr) int64 {
	s, err := store(h)
	if err != nil {
		return int64(fail(err))
	}
	text, err := cText("sparse config", config, maxSelectorText)
	if err != nil {
		return int64(fail(err))
	}
	cfg, err := parseSparse(text)
	if err != nil {
		return int64(fail(err))
	}
	if text, err = cText("shape", shape, maxSelectorText); err != nil {
		return int64(fail(err))
	}
	sh, err := parseShape(text)
	if err != nil {
		return int64(fail(err))
	}
	x, err := s.NewSelector(cfg, sh)
	if err != nil {
		return int64(fail(err))
	}
	handles.Lock()
	handles.next++
	id := handles.next
	handles.Unlock()
	selectors.Lock()
	if selectors.m == nil {
		selectors.m = map[int64]*selEntry{}
	}
	selectors.m[id] = &selEntry{x: x, store: h}
	selectors.Unlock()
	return id
}

func selector(h int64) (*selEntry, error) {
	selectors.Lock()
	defer selectors.Unlock()
	e, ok := selectors.m[h]
	if !ok {
		return nil, fmt.Errorf("selector handle %d: not open (never opened, or closed): %w", h, engine.ErrInvalidArgument)
	}
	return e, nil
}

// ucmgo_selector_close waits for the selector's selections and frees the handle.
//
//export ucmgo_selector_close
func ucmgo_selector_close(sel C.int64_t) C.int32_t { return C.int32_t(selectorClose(int64(sel))) }

func selectorClose(h int64) int32 {
	selectors.Lock()
	e, ok := selectors.m[h]
	delete(selectors.m, h)
	selectors.Unlock()
	if !ok {
		return int32(fail(fmt.Errorf("selector close: selector handle %d: not open: %w", h, engine.ErrInvalidArgument)))
	}
	if err := e.x.Close(); err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// closeSelectorsOf closes the selectors of store handle h (ucmgo_close closes them first).
func closeSelectorsOf(h int64) {
	selectors.Lock()
	var mine []*connector.Selector
	for id, e := range selectors.m {
		if e.store == h {
			mine = append(mine, e.x)
			delete(selectors.m, id)
		}
	}
	selectors.Unlock()
	for _, x := range mine {
		_ = x.Close()
	}
}

// ucmgo_reprs_shape writes the float32 layout of one block's representation: layers, rows,
// heads and cols (a layer is rows × heads × cols values) and the sidecar kind.
//
//export ucmgo_reprs_shape
func ucmgo_reprs_shape(sel C.int64_t, layers, rows, heads, cols *C.int64_t, kind *C.int32_t) C.int32_t {
	return C.int32_t(reprsShape(int64(sel), uintptr(unsafe.Pointer(layers)), uintptr(unsafe.Pointer(rows)), uintptr(unsafe.Pointer(heads)),
		uintptr(unsafe.Pointer(cols)), uintptr(unsafe.Pointer(kind))))
}

func reprsShape(h int64, layers, rows, heads, cols, kind uintptr) int32 {
	e, err := selector(h)
	if err != nil {
		return int32(fail(err))
	}
	for i, p := range []uintptr{layers, rows, heads, cols} {
		if err := region([]string{"reprs_shape: layers", "reprs_shape: rows", "reprs_shape: heads", "reprs_shape: cols"}[i], p, 1, 8); err != nil {
			return int32(fail(err))
		}
	}
	if err := region("reprs_shape: kind", kind, 1, 4); err != nil {
		return int32(fail(err))
	}
	l := e.x.Layout()
	*(*int64)(at(layers)), *(*int64)(at(rows)), *(*int64)(at(heads)), *(*int64)(at(cols)) = int64(l.Layers), int64(l.Rows), int64(l.Heads), int64(l.Cols)
	*(*int32)(at(kind)) = int32(l.Kind)
	return int32(statusOK)
}

// ucmgo_reprs_dump computes the representation of each block from its K (k_addrs: n ×
// addrs_per_block pointers, block-major, one per layer, each [block_size][kv_heads][head_dim]
// of k_dtype) and starts storing it as the block's sidecar. Returns a task of the selector's
// store (ucmgo_wait, ucmgo_check), or a status < 0.
//
//export ucmgo_reprs_dump
func ucmgo_reprs_dump(sel C.int64_t, ids *C.uint8_t, n C.size_t, kAddrs *unsafe.Pointer, addrsPerBlock C.size_t, kDtype C.int32_t) C.int64_t {
	return C.int64_t(reprsDump(int64(sel), uintptr(unsafe.Pointer(ids)), uint64(n), uintptr(unsafe.Pointer(kAddrs)), uint64(addrsPerBlock), int32(kDtype)))
}

func reprsDump(h int64, ids uintptr, n uint64, addrs uintptr, per uint64, dtype int32) int64 {
	e, err := selector(h)
	if err != nil {
		return int64(fail(err))
	}
	bids, err := blockIDs(ids, n)
	if err != nil {
		return int64(fail(err))
	}
	sh := e.x.Shape()
	dt := kernels.DType(dtype)
	if dtype < 0 || dtype > 255 || !dt.Valid() {
		return int64(fail(fmt.Errorf("reprs_dump: k_dtype %d: want 1 (float16), 2 (bfloat16), 3 (float8 e4m3), 4 (float8 e5m2) or 5 (float32): %w", dtype, engine.ErrInvalidArgument)))
	}
	if per != uint64(sh.Layers) {
		return int64(fail(fmt.Errorf("reprs_dump: addrs_per_block %d: want the layers, %d: %w", per, sh.Layers, engine.ErrInvalidArgument)))
	}
	if err := region("reprs_dump: K address table", addrs, n*per, 8); err != nil {
		return int64(fail(err))
	}
	size := uint64(sh.BlockSize) * uint64(sh.KVHeads) * uint64(sh.HeadDim) * uint64(dt.Size())
	table := unsafe.Slice((*uintptr)(at(addrs)), int(n*per))
	k := make([][][]byte, n)
	for i := range k {
		k[i] = make([][]byte, per)
		for l := range k[i] {
			a := table[uint64(i)*per+uint64(l)]
			if why := outside(a, 1, size); why != "" {
				return int64(fail(fmt.Errorf("reprs_dump: block at position %d, layer %d: K address: %s: %w", i, l, why, engine.ErrInvalidArgument)))
			}
			k[i][l] = bytesAt(a, size)
		}
	}
	task, err := e.x.DumpReprs(bids, k, dt)
	if err != nil {
		return int64(fail(err))
	}
	return int64(registerStoreTask(e, task, int(n)))
}

// registerStoreTask hands a representation dump's store task to the C side (tasks.c), as a
// load or dump is, so that ucmgo_wait and ucmgo_check on the store answer for it.
func registerStoreTask(e *selEntry, task uint64, n int) uint64 {
	s, err := store(e.store)
	if err == nil {
		register(e.store, s, task, n)
	}
	return task
}

// ucmgo_reprs_put starts storing precomputed representations as the blocks' sidecars: reprs
// is n × floats_per_block float32 (the whole block, every layer, in ucmgo_reprs_shape's
// layout). Returns a task of the selector's store, or a status < 0.
//
//export ucmgo_reprs_put
func ucmgo_reprs_put(sel C.int64_t, ids *C.uint8_t, n C.size_t, reprs *C.float, floatsPerBlock C.size_t) C.int64_t {
	return C.int64_t(reprsPut(int64(sel), uintptr(unsafe.Pointer(ids)), uint64(n), uintptr(unsafe.Pointer(reprs)), uint64(floatsPerBlock)))
}

func reprsPut(h int64, ids uintptr, n uint64, reprs uintptr, per uint64) int64 {
	e, err := selector(h)
	if err != nil {
		return int64(fail(err))
	}
	bids, err := blockIDs(ids, n)
	if err != nil {
		return int64(fail(err))
	}
	if want := uint64(e.x.Layout().BlockFloats()); per != want {
		return int64(fail(fmt.Errorf("reprs_put: floats_per_block %d: want %d (layers × rows × heads × cols): %w", per, want, engine.ErrInvalidArgument)))
	}
	if err := region("reprs_put: representations", reprs, n*per, 4); err != nil {
		return int64(fail(err))
	}
	rows := make([][]float32, n)
	if n > 0 {
		all := unsafe.Slice((*float32)(at(reprs)), int(n*per))
		for i := range rows {
			rows[i] = all[uint64(i)*per : uint64(i+1)*per]
		}
	}
	task, err := e.x.PutReprs(bids, rows)
	if err != nil {
		return int64(fail(err))
	}
	return int64(registerStoreTask(e, task, int(n)))
}

// ucmgo_reprs_load reads layer's representation of each block into dst (n × floats_per_block
// float32, floats_per_block = rows × heads × cols) and sets found[i] to 1 for the blocks that
// have one, else 0 (their values zero).
//
//export ucmgo_reprs_load
func ucmgo_reprs_load(sel C.int64_t, layer C.int32_t, ids *C.uint8_t, n C.size_t, dst *C.float, floatsPerBlock C.size_t, found *C.uint8_t) C.int32_t {
	return C.int32_t(reprsLoad(int64(sel), int32(layer), uintptr(unsafe.Pointer(ids)), uint64(n), uintptr(unsafe.Pointer(dst)), uint64(floatsPerBlock), uintptr(unsafe.Pointer(found))))
}

func reprsLoad(h int64, layer int32, ids uintptr, n uint64, dst uintptr, per uint64, found uintptr) int32 {
	e, err := selector(h)
	if err != nil {
		return int32(fail(err))
	}
	bids, err := blockIDs(ids, n)
	if err != nil {
		return int32(fail(err))
	}
	if want := uint64(e.x.Layout().LayerFloats()); per != want {
		return int32(fail(fmt.Errorf("reprs_load: floats_per_block %d: want %d (rows × heads × cols of a layer): %w", per, want, engine.ErrInvalidArgument)))
	}
	if err := region("reprs_load: destination", dst, n*per, 4); err != nil {
		return int32(fail(err))
	}
	if err := region("reprs_load: found", found, n, 1); err != nil {
		return int32(fail(err))
	}
	var out []float32
	if n > 0 {
		out = unsafe.Slice((*float32)(at(dst)), int(n*per))
	}
	hits, err := e.x.LoadReprs(int(layer), bids, out)
	if err != nil {
		return int32(fail(err))
	}
	if n > 0 {
		copyMask(bytesAt(found, n), hits)
	}
	return int32(statusOK)
}

// selectCall is a selection's arguments, decoded and checked, with its output memory.
type selectCall struct {
	args              connector.SelectArgs
	blocks, count     uintptr // int32[capacity], int64
	heads, headCounts uintptr // int32[kv_heads × capacity], int64[kv_heads], or 0
	capacity          uint64
	kvHeads           int
}

// decodeSelect reads and checks a selection's arguments (the selector's own checks follow in
// Submit).
func decodeSelect(e *selEntry, request uintptr, layer int32, step int64, q uintptr, qLen uint64, ids uintptr, n uint64, seqLen int64,
	blocks uintptr, capacity uint64, count, heads, headCounts uintptr) (*selectCall, error) {
	req, err := cText("request id", request, maxRequestID)
	if err != nil {
		return nil, err
	}
	sh := e.x.Shape()
	maxQ := uint64(sh.QHeads*sh.HeadDim) * 4096 // 4096 tokens of queries at most
	if qLen == 0 || qLen > maxQ {
		return nil, fmt.Errorf("select: q_len %d not in [1, %d]: %w", qLen, maxQ, engine.ErrInvalidArgument)
	}
	if err := region("select: query", q, qLen, 4); err != nil {
		return nil, err
	}
	bids, err := blockIDs(ids, n)
	if err != nil {
		return nil, err
	}
	if seqLen < 1 || seqLen > int64(maxBlocks)*int64(sh.BlockSize) {
		return nil, fmt.Errorf("select: seq_len %d not in [1, %d]: %w", seqLen, int64(maxBlocks)*int64(sh.BlockSize), engine.ErrInvalidArgument)
	}
	if step < 0 || step > 1<<40 {
		return nil, fmt.Errorf("select: step %d not in [0, 2^40]: %w", step, engine.ErrInvalidArgument)
	}
	nb := uint64((seqLen + int64(sh.BlockSize) - 1) / int64(sh.BlockSize))
	if capacity < nb || capacity > maxBlocks {
		return nil, fmt.Errorf("select: out_capacity %d: want at least the context's %d blocks (seq_len %d, block size %d), at most %d: %w",
			capacity, nb, seqLen, sh.BlockSize, maxBlocks, engine.ErrInvalidArgument)
	}
	if err := region("select: out_blocks", blocks, capacity, 4); err != nil {
		return nil, err
	}
	if err := region("select: out_count", count, 1, 8); err != nil {
		return nil, err
	}
	if (heads == 0) != (headCounts == 0) {
		return nil, fmt.Errorf("select: out_heads and out_head_counts: both or neither: %w", engine.ErrInvalidArgument)
	}
	if heads != 0 {
		if err := region("select: out_heads", heads, uint64(sh.KVHeads)*capacity, 4); err != nil {
			return nil, err
		}
		if err := region("select: out_head_counts", headCounts, uint64(sh.KVHeads), 8); err != nil {
			return nil, err
		}
	}
	qv := unsafe.Slice((*float32)(at(q)), int(qLen))
	return &selectCall{args: connector.SelectArgs{Request: req, Layer: int(layer), Step: int(step), Q: qv, IDs: bids, SeqLen: int(seqLen)},
		blocks: blocks, count: count, heads: heads, headCounts: headCounts, capacity: capacity, kvHeads: sh.KVHeads}, nil
}

// write puts a selection into the caller's output memory: blocks and count; per KV head, its
// own selection (head_select kv) or the blocks.
func (c *selectCall) write(sel *connector.Selection) {
	put := func(dst uintptr, v []int) {
		out := unsafe.Slice((*int32)(at(dst)), len(v))
		for i, b := range v {
			out[i] = int32(b)
		}
	}
	put(c.blocks, sel.Blocks)
	*(*int64)(at(c.count)) = int64(len(sel.Blocks))
	if c.heads == 0 {
		return
	}
	counts := unsafe.Slice((*int64)(at(c.headCounts)), c.kvHeads)
	for h := range c.kvHeads {
		v := sel.Blocks
		if sel.Heads != nil {
			v = sel.Heads[h]
		}
		put(c.heads+uintptr(uint64(h)*c.capacity*4), v)
		counts[h] = int64(len(v))
	}
}

// ucmgo_select_submit starts a selection (ucmgo.h): it returns a selection task > 0 whose
// outputs are written before ucmgo_select_check reports it finished or ucmgo_select_wait
// returns, or a status < 0.
//
//export ucmgo_select_submit
func ucmgo_select_submit(sel C.int64_t, request *C.char, layer C.int32_t, step C.int64_t, q *C.float, qLen C.size_t, ids *C.uint8_t, n C.size_t,
	seqLen C.int64_t, outBlocks *C.int32_t, outCapacity C.size_t, outCount *C.int64_t, outHeads *C.int32_t, outHeadCounts *C.int64_t) C.int64_t {
	return C.int64_t(selectSubmit(int64(sel), uintptr(unsafe.Pointer(request)), int32(layer), int64(step), uintptr(unsafe.Pointer(q)), uint64(qLen),
		uintptr(unsafe.Pointer(ids)), uint64(n), int64(seqLen), uintptr(unsafe.Pointer(outBlocks)), uint64(outCapacity), uintptr(unsafe.Pointer(outCount)),
		uintptr(unsafe.Pointer(outHeads)), uintptr(unsafe.Pointer(outHeadCounts))))
}

func selectSubmit(h int64, request uintptr, layer int32, step int64, q uintptr, qLen uint64, ids uintptr, n uint64, seqLen int64,
	blocks uintptr, capacity uint64, count, heads, headCounts uintptr) int64 {
	e, err := selector(h)
	if err != nil {
		return int64(fail(err))
	}
	c, err := decodeSelect(e, request, layer, step, q, qLen, ids, n, seqLen, blocks, capacity, count, heads, headCounts)
	if err != nil {
		return int64(fail(err))
	}
	task, err := e.x.Submit(c.args, func(sel *connector.Selection, err error) {
		if err == nil {
			c.write(sel)
		}
	})
	if err != nil {
		return int64(fail(err))
	}
	return int64(task)
}

// ucmgo_select is ucmgo_select_submit, then ucmgo_select_wait and ucmgo_select_release, run on
// the calling thread: returns the selection's status, its outputs written.
//
//export ucmgo_select
func ucmgo_select(sel C.int64_t, request *C.char, layer C.int32_t, step C.int64_t, q *C.float, qLen C.size_t, ids *C.uint8_t, n C.size_t,
	seqLen C.int64_t, outBlocks *C.int32_t, outCapacity C.size_t, outCount *C.int64_t, outHeads *C.int32_t, outHeadCounts *C.int64_t) C.int32_t {
	return C.int32_t(selectSync(int64(sel), uintptr(unsafe.Pointer(request)), int32(layer), int64(step), uintptr(unsafe.Pointer(q)), uint64(qLen),
		uintptr(unsafe.Pointer(ids)), uint64(n), int64(seqLen), uintptr(unsafe.Pointer(outBlocks)), uint64(outCapacity), uintptr(unsafe.Pointer(outCount)),
		uintptr(unsafe.Pointer(outHeads)), uintptr(unsafe.Pointer(outHeadCounts))))
}

func selectSync(h int64, request uintptr, layer int32, step int64, q uintptr, qLen uint64, ids uintptr, n uint64, seqLen int64,
	blocks uintptr, capacity uint64, count, heads, headCounts uintptr) int32 {
	e, err := selector(h)
	if err != nil {
		return int32(fail(err))
	}
	c, err := decodeSelect(e, request, layer, step, q, qLen, ids, n, seqLen, blocks, capacity, count, heads, headCounts)
	if err != nil {
		return int32(fail(err))
	}
	sel, err := e.x.Select(c.args) // on this thread: no goroutine between the caller and the method
	if err != nil {
		return int32(fail(err))
	}
	c.write(sel)
	return int32(statusOK)
}

// ucmgo_select_check sets *finished to 1 when the selection task is done (its outputs
// written), else 0, without consuming it; returns UCMGO_OK, or the selection's failure status
// once it is done.
//
//export ucmgo_select_check
func ucmgo_select_check(sel C.int64_t, task C.int64_t, finished *C.int32_t) C.int32_t {
	return C.int32_t(selectCheck(int64(sel), int64(task), uintptr(unsafe.Pointer(finished))))
}

func selectCheck(h, task int64, finished uintptr) int32 {
	e, err := selector(h)
	if err != nil {
		return int32(fail(err))
	}
	if err := region("select_check: result pointer", finished, 1, 4); err != nil {
		return int32(fail(err))
	}
	if err := taskHandle(task); err != nil {
		return int32(fail(err))
	}
	done, err := e.x.Check(uint64(task))
	*(*int32)(at(finished)) = 0
	if done {
		*(*int32)(at(finished)) = 1
	}
	if err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// ucmgo_select_wait blocks until the selection task is done and returns its status; it does
// not consume the task.
//
//export ucmgo_select_wait
func ucmgo_select_wait(sel C.int64_t, task C.int64_t) C.int32_t {
	return C.int32_t(selectWait(int64(sel), int64(task), false))
}

// ucmgo_select_release waits for the selection task to be done and frees it: the library
// writes nothing into its outputs afterwards, and the handle is unknown (UCMGO_ENOOBJ).
//
//export ucmgo_select_release
func ucmgo_select_release(sel C.int64_t, task C.int64_t) C.int32_t {
	return C.int32_t(selectWait(int64(sel), int64(task), true))
}

// selectWait waits for selection task task of selector h, and frees it when release is set.
func selectWait(h, task int64, release bool) int32 {
	e, err := selector(h)
	if err != nil {
		return int32(fail(err))
	}
	if err := taskHandle(task); err != nil {
		return int32(fail(err))
	}
	if release {
		err = e.x.Release(uint64(task))
	} else {
		_, err = e.x.Wait(uint64(task))
	}
	if err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// ucmgo_selector_request_finished forgets a request's state in the selector's method (held
// selections, lag, pool references) once its selections in flight are done.
//
//export ucmgo_selector_request_finished
func ucmgo_selector_request_finished(sel C.int64_t, request *C.char) C.int32_t {
	return C.int32_t(selectorRequestFinished(int64(sel), uintptr(unsafe.Pointer(request))))
}

func selectorRequestFinished(h int64, request uintptr) int32 {
	e, err := selector(h)
	if err != nil {
		return int32(fail(err))
	}
	req, err := cText("request id", request, maxRequestID)
	if err != nil {
		return int32(fail(err))
	}
	if err := e.x.RequestFinished(req); err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}
