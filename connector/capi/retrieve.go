package main

/*
#include <stddef.h>
#include <stdint.h>

// ucmgo.h's struct, incomplete here: a file with exports cannot include ucmgo.h (cgo's
// generated declarations of the exports differ from it in const).
typedef struct ucmgo_retrieval ucmgo_retrieval;

// retrieve_layout.c: the layout of ucmgo_retrieval as the C compiler sees it.
size_t ucmgoi_retrieval_offsets(size_t *out);
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/sparse"
)

// The retriever ABI (ucmgo.h, "RETRIEVER"): sparse.Retriever behind int64 handles, with the
// retrieval described by a ucmgo_retrieval the caller fills.

// retrievalArgs mirrors ucmgo_retrieval (checked against the C layout by retrievalLayout).
type retrievalArgs struct {
	Size      uint64
	Method    int32
	TopK      int32
	Batch     int64
	Dim       int64
	Q         uintptr
	Reprs     uintptr
	NReprs    int64
	Cand      uintptr
	CandWidth int64
	OutIdx    uintptr
	OutScores uintptr
	OutCount  uintptr
}

// retrievalLayout returns the C struct's size and field offsets, and the Go mirror's.
func retrievalLayout() (c, g []uintptr) {
	var off [12]C.size_t
	size := C.ucmgoi_retrieval_offsets(&off[0])
	c = []uintptr{uintptr(size)}
	for _, o := range off {
		c = append(c, uintptr(o))
	}
	var a retrievalArgs
	g = []uintptr{unsafe.Sizeof(a), unsafe.Offsetof(a.Method), unsafe.Offsetof(a.TopK), unsafe.Offsetof(a.Batch),
		unsafe.Offsetof(a.Dim), unsafe.Offsetof(a.Q), unsafe.Offsetof(a.Reprs), unsafe.Offsetof(a.NReprs),
		unsafe.Offsetof(a.Cand), unsafe.Offsetof(a.CandWidth), unsafe.Offsetof(a.OutIdx), unsafe.Offsetof(a.OutScores),
		unsafe.Offsetof(a.OutCount)}
	return c, g
}

// retrievalSize is sizeof(ucmgo_retrieval).
var retrievalSize = uint64(unsafe.Sizeof(retrievalArgs{}))

// rmDot is UCMGO_RM_DOT.
const rmDot = 1

// maxRetrieverCPUs bounds ucmgo_retriever_new's CPU list.
const maxRetrieverCPUs = 1024

var retrievers struct {
	sync.Mutex
	m    map[int64]*sparse.Retriever
	next int64
}

func retrieverOf(h int64) (*sparse.Retriever, error) {
	retrievers.Lock()
	defer retrievers.Unlock()
	r, ok := retrievers.m[h]
	if !ok {
		return nil, fmt.Errorf("retriever handle %d: not open (never opened, or freed): %w", h, engine.ErrInvalidArgument)
	}
	return r, nil
}

// ucmgo_retriever_new starts a retriever of workers threads, pinned to cpus when ncpus > 0.
//
//export ucmgo_retriever_new
func ucmgo_retriever_new(workers C.int32_t, cpus *C.int32_t, ncpus C.size_t) C.int64_t {
	return C.int64_t(retrieverNew(int32(workers), uintptr(unsafe.Pointer(cpus)), uint64(ncpus)))
}

func retrieverNew(workers int32, cpus uintptr, ncpus uint64) int64 {
	if ncpus > maxRetrieverCPUs {
		return int64(fail(fmt.Errorf("retriever: %d cpus: more than %d: %w", ncpus, maxRetrieverCPUs, engine.ErrInvalidArgument)))
	}
	if err := region("retriever: cpus", cpus, ncpus, 4); err != nil {
		return int64(fail(err))
	}
	list := make([]int, ncpus)
	for i := range list {
		list[i] = int(*(*int32)(at(cpus + uintptr(4*i))))
	}
	r, err := sparse.NewRetriever(int(workers), list)
	if err != nil {
		return int64(fail(err))
	}
	retrievers.Lock()
	defer retrievers.Unlock()
	if retrievers.m == nil {
		retrievers.m = map[int64]*sparse.Retriever{}
	}
	retrievers.next++
	retrievers.m[retrievers.next] = r
	return retrievers.next
}

// ucmgo_retriever_free waits for the retriever's queued tasks, stops it and frees the handle.
//
//export ucmgo_retriever_free
func ucmgo_retriever_free(h C.int64_t) C.int32_t { return C.int32_t(retrieverFree(int64(h))) }

func retrieverFree(h int64) int32 {
	retrievers.Lock()
	r, ok := retrievers.m[h]
	delete(retrievers.m, h)
	retrievers.Unlock()
	if !ok {
		return int32(fail(fmt.Errorf("retriever free: handle %d: not open: %w", h, engine.ErrInvalidArgument)))
	}
	r.Close()
	return int32(statusOK)
}

// fieldElems checks that a count field is in [0, sparse.MaxRetrieveElems].
func fieldElems(name string, v int64) error {
	if v < 0 || v > sparse.MaxRetrieveElems {
		return fmt.Errorf("ucmgo_retrieval.%s %d: want 0 … %d: %w", name, v, int64(sparse.MaxRetrieveElems), engine.ErrInvalidArgument)
	}
	return nil
}

// product checks that the product of two checked counts is at most sparse.MaxRetrieveElems.
func product(what string, x, y int64) (uint64, error) {
	if p := uint64(x) * uint64(y); p <= sparse.MaxRetrieveElems {
		return p, nil
	}
	return 0, fmt.Errorf("ucmgo_retrieval.%s: %d × %d elements: more than %d: %w", what, x, y, int64(sparse.MaxRetrieveElems), engine.ErrInvalidArgument)
}

// retrieval decodes and checks the ucmgo_retrieval at p: the query and candidates copied, the
// representations and outputs in place in the caller's memory.
func retrieval(p uintptr) (*sparse.DotArgs, error) {
	if err := region("ucmgo_retrieval", p, 1, 8); err != nil {
		return nil, err
	}
	if size := *(*uint64)(at(p)); size != retrievalSize {
		return nil, fmt.Errorf("ucmgo_retrieval.size %d: this library's ucmgo_retrieval is %d bytes: %w", size, retrievalSize, engine.ErrInvalidArgument)
	}
	if err := region("ucmgo_retrieval", p, 1, retrievalSize); err != nil {
		return nil, err
	}
	a := *(*retrievalArgs)(at(p))
	if a.Method != rmDot {
		return nil, fmt.Errorf("ucmgo_retrieval.method %d: want UCMGO_RM_DOT (%d): %w", a.Method, rmDot, engine.ErrInvalidArgument)
	}
	if a.Dim < 1 {
		return nil, fmt.Errorf("ucmgo_retrieval.dim %d: want at least 1: %w", a.Dim, engine.ErrInvalidArgument)
	}
	if a.TopK < 0 {
		return nil, fmt.Errorf("ucmgo_retrieval.topk %d: want at least 0: %w", a.TopK, engine.ErrInvalidArgument)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"dim", a.Dim}, {"batch", a.Batch}, {"n_reprs", a.NReprs}} {
		if err := fieldElems(f.name, f.v); err != nil {
			return nil, err
		}
	}
	nq, err := product("q (batch × dim)", a.Batch, a.Dim)
	if err != nil {
		return nil, err
	}
	nr, err := product("reprs (n_reprs × dim)", a.NReprs, a.Dim)
	if err != nil {
		return nil, err
	}
	nout, err := product("outputs (batch × topk)", a.Batch, int64(a.TopK))
	if err != nil {
		return nil, err
	}
	var nc uint64
	if a.Cand != 0 {
		if err := fieldElems("cand_width", a.CandWidth); err != nil {
			return nil, err
		}
		if nc, err = product("cand (batch × cand_width)", a.Batch, a.CandWidth); err != nil {
			return nil, err
		}
	}
	for _, r := range []struct {
		name    string
		p       uintptr
		n, size uint64
	}{{"q", a.Q, nq, 4}, {"reprs", a.Reprs, nr, 4}, {"cand", a.Cand, nc, 4}, {"out_idx", a.OutIdx, nout, 4},
		{"out_scores", a.OutScores, nout, 4}} {
		if err := region("ucmgo_retrieval."+r.name, r.p, r.n, r.size); err != nil {
			return nil, err
		}
	}
	if a.OutCount != 0 {
		if err := region("ucmgo_retrieval.out_count", a.OutCount, uint64(a.Batch), 8); err != nil {
			return nil, err
		}
	}
	d := &sparse.DotArgs{Dim: int(a.Dim), K: int(a.TopK), Width: int(a.CandWidth), Q: make([]float32, nq)}
	if nq > 0 {
		copy(d.Q, unsafe.Slice((*float32)(at(a.Q)), nq))
	}
	if nr > 0 {
		d.Data = unsafe.Slice((*float32)(at(a.Reprs)), nr)
	}
	if a.Cand != 0 {
		d.Cand = make([]int32, nc)
		if nc > 0 {
			copy(d.Cand, unsafe.Slice((*int32)(at(a.Cand)), nc))
		}
	}
	if nout > 0 {
		d.Idx = unsafe.Slice((*int32)(at(a.OutIdx)), nout)
		d.Scores = unsafe.Slice((*float32)(at(a.OutScores)), nout)
	}
	if a.OutCount != 0 {
		d.Count = make([]int64, 0)
		if a.Batch > 0 {
			d.Count = unsafe.Slice((*int64)(at(a.OutCount)), a.Batch)
		}
	}
	if err := d.Check(); err != nil {
		return nil, fmt.Errorf("ucmgo_retrieval: %w", err)
	}
	return d, nil
}

// ucmgo_retrieve_submit validates *a and queues its retrieval; returns a task > 0.
//
//export ucmgo_retrieve_submit
func ucmgo_retrieve_submit(h C.int64_t, a *C.ucmgo_retrieval) C.int64_t {
	return C.int64_t(retrieveSubmit(int64(h), uintptr(unsafe.Pointer(a))))
}

func retrieveSubmit(h int64, p uintptr) int64 {
	r, err := retrieverOf(h)
	if err != nil {
		return int64(fail(err))
	}
	d, err := retrieval(p)
	if err != nil {
		return int64(fail(err))
	}
	id, err := r.SubmitDot(d)
	if err != nil {
		return int64(fail(err))
	}
	return int64(id)
}

// retrieveTask resolves a retriever handle and checks a task handle.
func retrieveTask(h, task int64) (*sparse.Retriever, error) {
	r, err := retrieverOf(h)
	if err != nil {
		return nil, err
	}
	if task <= 0 {
		return nil, fmt.Errorf("retrieval task %d: task handles are > 0: %w", task, engine.ErrInvalidArgument)
	}
	return r, nil
}

// ucmgo_retrieve_check sets *finished to 1 when the task is done, else 0, without consuming it.
//
//export ucmgo_retrieve_check
func ucmgo_retrieve_check(h C.int64_t, task C.int64_t, finished *C.int32_t) C.int32_t {
	return C.int32_t(retrieveCheck(int64(h), int64(task), uintptr(unsafe.Pointer(finished))))
}

func retrieveCheck(h, task int64, finished uintptr) int32 {
	r, err := retrieveTask(h, task)
	if err != nil {
		return int32(fail(err))
	}
	if err := region("retrieve check: finished", finished, 1, 4); err != nil {
		return int32(fail(err))
	}
	done, err := r.Check(uint64(task))
	if done {
		*(*int32)(at(finished)) = 1
	} else {
		*(*int32)(at(finished)) = 0
	}
	if err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// ucmgo_retrieve_wait blocks until the task is done, without consuming it.
//
//export ucmgo_retrieve_wait
func ucmgo_retrieve_wait(h C.int64_t, task C.int64_t) C.int32_t {
	return C.int32_t(retrieveWait(int64(h), int64(task), false))
}

// ucmgo_retrieve_release waits for the task and consumes it.
//
//export ucmgo_retrieve_release
func ucmgo_retrieve_release(h C.int64_t, task C.int64_t) C.int32_t {
	return C.int32_t(retrieveWait(int64(h), int64(task), true))
}

func retrieveWait(h, task int64, release bool) int32 {
	r, err := retrieveTask(h, task)
	if err != nil {
		return int32(fail(err))
	}
	if release {
		err = r.Release(uint64(task))
	} else {
		err = r.Wait(uint64(task))
	}
	if err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}

// ucmgo_retrieve runs *a to completion on the calling thread with the retriever's helpers.
//
//export ucmgo_retrieve
func ucmgo_retrieve(h C.int64_t, a *C.ucmgo_retrieval) C.int32_t {
	return C.int32_t(retrieveSync(int64(h), uintptr(unsafe.Pointer(a))))
}

func retrieveSync(h int64, p uintptr) int32 {
	r, err := retrieverOf(h)
	if err != nil {
		return int32(fail(err))
	}
	d, err := retrieval(p)
	if err != nil {
		return int32(fail(err))
	}
	if err := sparse.DotTopK(d, r.Workers()); err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}
