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
	"github.com/ucm-go/ucm/kernels"
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
	QDtype    int32
	RDtype    int32
	QHeads    int64
	KVHeads   int64
	RowsPer   int64
	Channels  uintptr
	Kept      int64
	RowTopK   uintptr
	Init      int32
	Local     int32
}

// retrievalLayout returns the C struct's size and field offsets, and the Go mirror's.
func retrievalLayout() (c, g []uintptr) {
	var off [22]C.size_t
	size := C.ucmgoi_retrieval_offsets(&off[0])
	c = []uintptr{uintptr(size)}
	for _, o := range off {
		c = append(c, uintptr(o))
	}
	var a retrievalArgs
	g = []uintptr{unsafe.Sizeof(a), unsafe.Offsetof(a.Method), unsafe.Offsetof(a.TopK), unsafe.Offsetof(a.Batch),
		unsafe.Offsetof(a.Dim), unsafe.Offsetof(a.Q), unsafe.Offsetof(a.Reprs), unsafe.Offsetof(a.NReprs),
		unsafe.Offsetof(a.Cand), unsafe.Offsetof(a.CandWidth), unsafe.Offsetof(a.OutIdx), unsafe.Offsetof(a.OutScores),
		unsafe.Offsetof(a.OutCount), unsafe.Offsetof(a.QDtype), unsafe.Offsetof(a.RDtype), unsafe.Offsetof(a.QHeads),
		unsafe.Offsetof(a.KVHeads), unsafe.Offsetof(a.RowsPer), unsafe.Offsetof(a.Channels), unsafe.Offsetof(a.Kept),
		unsafe.Offsetof(a.RowTopK), unsafe.Offsetof(a.Init), unsafe.Offsetof(a.Local)}
	return c, g
}

// retrievalSize is sizeof(ucmgo_retrieval).
var retrievalSize = uint64(unsafe.Sizeof(retrievalArgs{}))

// The methods (UCMGO_RM_*) and the dtypes a retrieval takes (UCMGO_DTYPE_*).
const (
	rmDot     = 1
	rmMaxDot  = 2
	rmSoftmax = 3
	dtF16     = 1
	dtF32     = 5
)

// methodNames names the methods in errors.
var methodNames = map[int32]string{rmDot: "UCMGO_RM_DOT", rmMaxDot: "UCMGO_RM_MAXDOT", rmSoftmax: "UCMGO_RM_SOFTMAX"}

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

// retrievalJob is a decoded ucmgo_retrieval: one of the three methods' arguments.
type retrievalJob struct {
	dot    *sparse.DotArgs
	maxdot *sparse.MaxDotBatch
	soft   *sparse.SoftmaxArgs
	// SOFTMAX's outputs in the caller's memory: out_idx (topk) and out_count (1 or none).
	softIdx   []int32
	softCount []int64
}

// softDone writes a SOFTMAX retrieval's n ids to the caller's out_idx, then -1 up to topk.
func (j *retrievalJob) softDone(n int) {
	for i := range j.softIdx {
		if i < n {
			j.softIdx[i] = int32(j.soft.Idx[i])
		} else {
			j.softIdx[i] = -1
		}
	}
	if j.softCount != nil {
		j.softCount[0] = int64(n)
	}
}

// submit queues the job on r.
func (j *retrievalJob) submit(r *sparse.Retriever) (uint64, error) {
	switch {
	case j.dot != nil:
		return r.SubmitDot(j.dot)
	case j.maxdot != nil:
		return r.SubmitMaxDot(j.maxdot)
	}
	return r.SubmitSoftmax(j.soft, j.softDone)
}

// run runs the job on the calling goroutine and up to workers-1 helpers.
func (j *retrievalJob) run(workers int) error {
	switch {
	case j.dot != nil:
		return sparse.DotTopK(j.dot, workers)
	case j.maxdot != nil:
		return sparse.MaxDotBatchTopK(j.maxdot, workers)
	}
	n, err := sparse.SoftmaxTopK(j.soft, workers)
	if err == nil {
		j.softDone(n)
	}
	return err
}

// span is one of the caller's arrays a retrieval names: its field, address, entries and
// entry size.
type span struct {
	name    string
	p       uintptr
	n, size uint64
}

// retrieval decodes and checks the ucmgo_retrieval at p: the query, candidates, channels and
// lengths copied, the representations and outputs in place in the caller's memory.
func retrieval(p uintptr) (*retrievalJob, error) {
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
	name, ok := methodNames[a.Method]
	if !ok {
		return nil, fmt.Errorf("ucmgo_retrieval.method %d: want UCMGO_RM_DOT (%d), UCMGO_RM_MAXDOT (%d) or UCMGO_RM_SOFTMAX (%d): %w",
			a.Method, rmDot, rmMaxDot, rmSoftmax, engine.ErrInvalidArgument)
	}
	// The fields the method does not use must be zero.
	unused := map[int32][]struct {
		name string
		set  bool
	}{
		rmDot: {{"q_heads", a.QHeads != 0}, {"kv_heads", a.KVHeads != 0}, {"rows_per_block", a.RowsPer != 0},
			{"channels", a.Channels != 0}, {"kept", a.Kept != 0}, {"row_topk", a.RowTopK != 0}, {"init", a.Init != 0}, {"local", a.Local != 0}},
		rmMaxDot:  {{"out_scores", a.OutScores != 0}, {"channels", a.Channels != 0}, {"kept", a.Kept != 0}},
		rmSoftmax: {{"out_scores", a.OutScores != 0}, {"cand", a.Cand != 0}, {"cand_width", a.CandWidth != 0}, {"row_topk", a.RowTopK != 0}, {"init", a.Init != 0}, {"local", a.Local != 0}},
	}
	for _, f := range unused[a.Method] {
		if f.set {
			return nil, fmt.Errorf("ucmgo_retrieval.%s: not used by %s: want 0: %w", f.name, name, engine.ErrInvalidArgument)
		}
	}
	want := int32(dtF32)
	if a.Method == rmSoftmax {
		want = dtF16
	}
	for _, f := range []struct {
		name string
		v    int32
	}{{"q_dtype", a.QDtype}, {"r_dtype", a.RDtype}} {
		if f.v != 0 && f.v != want {
			return nil, fmt.Errorf("ucmgo_retrieval.%s %d: %s takes %d (or 0): %w", f.name, f.v, name, want, engine.ErrInvalidArgument)
		}
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
	}{{"dim", a.Dim}, {"batch", a.Batch}, {"n_reprs", a.NReprs}, {"q_heads", a.QHeads}, {"kv_heads", a.KVHeads},
		{"rows_per_block", a.RowsPer}, {"kept", a.Kept}} {
		if err := fieldElems(f.name, f.v); err != nil {
			return nil, err
		}
	}
	if a.Method != rmDot {
		if a.QHeads < 1 || a.KVHeads < 1 || a.QHeads%a.KVHeads != 0 || a.QHeads > kernels.MaxHeads {
			return nil, fmt.Errorf("ucmgo_retrieval.q_heads %d over kv_heads %d: want a multiple, 1 … %d: %w", a.QHeads, a.KVHeads, kernels.MaxHeads, engine.ErrInvalidArgument)
		}
		if a.RowsPer < 1 {
			return nil, fmt.Errorf("ucmgo_retrieval.rows_per_block %d: want at least 1: %w", a.RowsPer, engine.ErrInvalidArgument)
		}
	}
	switch a.Method {
	case rmMaxDot:
		return maxDotRetrieval(&a)
	case rmSoftmax:
		return softmaxRetrieval(&a)
	}
	return dotRetrieval(&a)
}

// checkSpans checks that each array is the caller's memory for its extent.
func checkSpans(spans []span) error {
	for _, r := range spans {
		if err := region("ucmgo_retrieval."+r.name, r.p, r.n, r.size); err != nil {
			return err
		}
	}
	return nil
}

// candidates copies the cand table (batch × cand_width entries), nil when cand is NULL.
func candidates(a *retrievalArgs, nc uint64) []int32 {
	if a.Cand == 0 {
		return nil
	}
	c := make([]int32, nc)
	if nc > 0 {
		copy(c, unsafe.Slice((*int32)(at(a.Cand)), nc))
	}
	return c
}

// candElems returns the number of candidate ids a retrieval passes (batch × cand_width; 0
// without a candidate table), refusing a width or product out of range.
func candElems(a *retrievalArgs) (uint64, error) {
	if a.Cand == 0 {
		return 0, nil
	}
	if err := fieldElems("cand_width", a.CandWidth); err != nil {
		return 0, err
	}
	return product("cand (batch × cand_width)", a.Batch, a.CandWidth)
}

func dotRetrieval(a *retrievalArgs) (*retrievalJob, error) {
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
	nc, err := candElems(a)
	if err != nil {
		return nil, err
	}
	spans := []span{{"q", a.Q, nq, 4}, {"reprs", a.Reprs, nr, 4}, {"cand", a.Cand, nc, 4}, {"out_idx", a.OutIdx, nout, 4},
		{"out_scores", a.OutScores, nout, 4}}
	if a.OutCount != 0 {
		spans = append(spans, span{"out_count", a.OutCount, uint64(a.Batch), 8})
	}
	if err := checkSpans(spans); err != nil {
		return nil, err
	}
	d := &sparse.DotArgs{Dim: int(a.Dim), K: int(a.TopK), Width: int(a.CandWidth), Q: make([]float32, nq), Cand: candidates(a, nc)}
	if nq > 0 {
		copy(d.Q, unsafe.Slice((*float32)(at(a.Q)), nq))
	}
	if nr > 0 {
		d.Data = unsafe.Slice((*float32)(at(a.Reprs)), nr)
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
	return &retrievalJob{dot: d}, nil
}

func maxDotRetrieval(a *retrievalArgs) (*retrievalJob, error) {
	qn, err := product("q (q_heads × dim)", a.QHeads, a.Dim)
	if err != nil {
		return nil, err
	}
	nq, err := product("q (batch × q_heads × dim)", a.Batch, int64(qn))
	if err != nil {
		return nil, err
	}
	hm, err := product("a block (kv_heads × rows_per_block)", a.KVHeads, a.RowsPer)
	if err != nil {
		return nil, err
	}
	per, err := product("a block (kv_heads × rows_per_block × dim)", int64(hm), a.Dim)
	if err != nil {
		return nil, err
	}
	nr, err := product("reprs (n_reprs blocks)", a.NReprs, int64(per))
	if err != nil {
		return nil, err
	}
	nout, err := product("out_idx (batch × topk)", a.Batch, int64(a.TopK))
	if err != nil {
		return nil, err
	}
	nc, err := candElems(a)
	if err != nil {
		return nil, err
	}
	spans := []span{{"q", a.Q, nq, 4}, {"reprs", a.Reprs, nr, 4}, {"cand", a.Cand, nc, 4}, {"out_idx", a.OutIdx, nout, 4}}
	if a.RowTopK != 0 {
		spans = append(spans, span{"row_topk", a.RowTopK, uint64(a.Batch), 4})
	}
	if a.OutCount != 0 {
		spans = append(spans, span{"out_count", a.OutCount, uint64(a.Batch), 8})
	}
	if err := checkSpans(spans); err != nil {
		return nil, err
	}
	if a.Init < 0 || a.Local < 0 {
		return nil, fmt.Errorf("ucmgo_retrieval.init %d, local %d: want at least 0: %w", a.Init, a.Local, engine.ErrInvalidArgument)
	}
	b := &sparse.MaxDotBatch{Q: make([]float32, nq), QHeads: int(a.QHeads), KVHeads: int(a.KVHeads), M: int(a.RowsPer), Dim: int(a.Dim),
		Cand: candidates(a, nc), Width: int(a.CandWidth), K: make([]int32, a.Batch), Init: int(a.Init), Local: int(a.Local),
		OutWidth: int(a.TopK)}
	if nq > 0 {
		copy(b.Q, unsafe.Slice((*float32)(at(a.Q)), nq))
	}
	if nr > 0 {
		b.Reprs = unsafe.Slice((*float32)(at(a.Reprs)), nr)
	}
	for i := range b.K {
		b.K[i] = a.TopK
	}
	if a.RowTopK != 0 && a.Batch > 0 {
		copy(b.K, unsafe.Slice((*int32)(at(a.RowTopK)), a.Batch))
	}
	if nout > 0 {
		b.Out = unsafe.Slice((*int32)(at(a.OutIdx)), nout)
	}
	if a.OutCount != 0 && a.Batch > 0 {
		b.Count = unsafe.Slice((*int64)(at(a.OutCount)), a.Batch)
	}
	if err := b.Check(); err != nil {
		return nil, fmt.Errorf("ucmgo_retrieval: %w", err)
	}
	return &retrievalJob{maxdot: b}, nil
}

func softmaxRetrieval(a *retrievalArgs) (*retrievalJob, error) {
	w := a.Dim
	if a.Channels != 0 {
		if a.Kept < 1 {
			return nil, fmt.Errorf("ucmgo_retrieval.kept %d: want at least 1 with channels: %w", a.Kept, engine.ErrInvalidArgument)
		}
		w = a.Kept
	} else if a.Kept != 0 {
		return nil, fmt.Errorf("ucmgo_retrieval.kept %d: without channels: want 0: %w", a.Kept, engine.ErrInvalidArgument)
	}
	qn, err := product("q (q_heads × dim)", a.QHeads, a.Dim)
	if err != nil {
		return nil, err
	}
	nq, err := product("q (batch × q_heads × dim)", a.Batch, int64(qn))
	if err != nil {
		return nil, err
	}
	hm, err := product("a block (rows_per_block × kv_heads)", a.RowsPer, a.KVHeads)
	if err != nil {
		return nil, err
	}
	per, err := product("a block (rows_per_block × kv_heads × width)", int64(hm), w)
	if err != nil {
		return nil, err
	}
	nr, err := product("reprs (n_reprs blocks)", a.NReprs, int64(per))
	if err != nil {
		return nil, err
	}
	var nch uint64
	if a.Channels != 0 {
		if nch, err = product("channels (kv_heads × kept)", a.KVHeads, a.Kept); err != nil {
			return nil, err
		}
	}
	spans := []span{{"q", a.Q, nq, 2}, {"reprs", a.Reprs, nr, 2}, {"channels", a.Channels, nch, 8}, {"out_idx", a.OutIdx, uint64(a.TopK), 4}}
	if a.OutCount != 0 {
		spans = append(spans, span{"out_count", a.OutCount, 1, 8})
	}
	if err := checkSpans(spans); err != nil {
		return nil, err
	}
	s := &sparse.SoftmaxArgs{Q: make([]byte, 2*nq), Tokens: int(a.Batch), QHeads: int(a.QHeads), QDim: int(a.Dim), KVHeads: int(a.KVHeads),
		M: int(a.RowsPer), Dim: int(w), K: int(a.TopK), Idx: make([]int64, min(uint64(a.TopK), uint64(a.NReprs)))}
	if nq > 0 {
		copy(s.Q, unsafe.Slice((*byte)(at(a.Q)), 2*nq))
	}
	if nr > 0 {
		s.Reprs = unsafe.Slice((*byte)(at(a.Reprs)), 2*nr)
	}
	if a.Channels != 0 {
		s.Channels = make([]int64, nch)
		copy(s.Channels, unsafe.Slice((*int64)(at(a.Channels)), nch))
	}
	j := &retrievalJob{soft: s}
	if a.TopK > 0 {
		j.softIdx = unsafe.Slice((*int32)(at(a.OutIdx)), a.TopK)
	}
	if a.OutCount != 0 {
		j.softCount = unsafe.Slice((*int64)(at(a.OutCount)), 1)
	}
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("ucmgo_retrieval: %w", err)
	}
	return j, nil
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
	j, err := retrieval(p)
	if err != nil {
		return int64(fail(err))
	}
	id, err := j.submit(r)
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
	if err := taskHandle(task); err != nil {
		return nil, fmt.Errorf("retrieval: %w", err)
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
	j, err := retrieval(p)
	if err != nil {
		return int32(fail(err))
	}
	if err := j.run(r.Workers()); err != nil {
		return int32(fail(err))
	}
	return int32(statusOK)
}
