//go:build cgo

package main

import (
	"encoding/binary"
	"math"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ucm-go/ucm/connector"
	"github.com/ucm-go/ucm/sparse"
)

// The retriever ABI under FuzzABI (its op 11): the struct and its arrays in the fuzz mapping.
const (
	offRet       = 16384 // the ucmgo_retrieval
	offRetQ      = offRet + 512
	offRetCand   = offRet + 1024
	offRetIdx    = offRet + 1536
	offRetScores = offRet + 2048
	offRetCount  = offRet + 2560
	offRetReprs  = fzSlots // up to 20 rows of 16 floats
)

var fuzzRetriever struct {
	once sync.Once
	h    int64
}

// fuzzRetrieve drives ucmgo_retrieve_submit / ucmgo_retrieve (through the functions their
// exports call) with a ucmgo_retrieval of arbitrary fields, or wait, check and release with an
// arbitrary task. It returns the status and, when an argument is impossible, why the call
// must be refused with EPARAM. A valid retrieval must succeed and give what sparse.DotTopK
// gives on the same inputs.
func fuzzRetrieve(t *testing.T, mem *cmem, in *fuzzInput) (st int64, refuse string) {
	fuzzRetriever.once.Do(func() {
		if fuzzRetriever.h = retrieverNew(2, 0, 0); fuzzRetriever.h <= 0 {
			t.Fatalf("retriever_new: %d: %s", fuzzRetriever.h, lastError())
		}
	})
	must := func(cond bool, why string) {
		if cond && refuse == "" {
			refuse = why
		}
	}
	rh := fuzzRetriever.h
	if in.byte() >= 245 {
		rh = int64(in.u64())
		must(rh != fuzzRetriever.h, "retriever handle")
	}
	sub := in.byte() % 3
	if sub == 2 { // wait, check or release of an arbitrary task
		task := int64(in.u64())
		must(task <= 0, "task handle")
		switch in.byte() % 3 {
		case 0:
			st = int64(retrieveWait(rh, task, false))
		case 1:
			st = int64(retrieveWait(rh, task, true))
		default:
			fin, ok := in.pointer(mem.addr(offOut))
			must(!ok, "finished pointer")
			st = int64(retrieveCheck(rh, task, fin))
		}
		return st, refuse
	}
	pick := func(small []int64, bad []int64) (int64, bool) {
		b := in.byte()
		if b < 235 {
			return small[int(b)%len(small)], true
		}
		return bad[int(b)%len(bad)], false
	}
	size, sizeOK := pick([]int64{int64(retrievalSize)}, []int64{0, 8, int64(retrievalSize) - 8, int64(retrievalSize) + 8, -1})
	method, methodOK := pick([]int64{rmDot}, []int64{0, 2, 3, -1})
	batch, batchOK := pick([]int64{0, 1, 2, 4}, []int64{-1, sparse.MaxRetrieveElems + 1, 1 << 40, math.MinInt64})
	dim, dimOK := pick([]int64{1, 3, 8, 16}, []int64{0, -3, sparse.MaxRetrieveElems + 1, 1 << 50})
	topk, topkOK := pick([]int64{0, 1, 3, 8}, []int64{-1, math.MinInt32})
	rows, rowsOK := pick([]int64{0, 1, 5, 20}, []int64{-1, sparse.MaxRetrieveElems + 1, 1 << 45})
	width, widthOK := pick([]int64{0, 1, 5, 8}, []int64{-1, sparse.MaxRetrieveElems + 1, 1 << 45})
	must(!sizeOK, "size")
	must(!methodOK, "method")
	must(!batchOK, "batch")
	must(!dimOK, "dim")
	must(!topkOK, "topk")
	must(!rowsOK, "n_reprs")
	okAll := batchOK && dimOK && topkOK && rowsOK
	q, qOK := in.pointer(mem.addr(offRetQ))
	reprs, rOK := in.pointer(mem.addr(offRetReprs))
	cand, cOK := in.pointer(mem.addr(offRetCand))
	outIdx, iOK := in.pointer(mem.addr(offRetIdx))
	outScores, sOK := in.pointer(mem.addr(offRetScores))
	outCount, nOK := in.pointer(mem.addr(offRetCount))
	if okAll {
		must(cand != 0 && !widthOK, "cand_width")
		must(!qOK && batch*dim > 0, "q")
		must(!rOK && rows*dim > 0, "reprs")
		must(cand != 0 && !cOK && widthOK && batch*width > 0, "cand")
		must(!iOK && batch*topk > 0, "out_idx")
		must(!sOK && batch*topk > 0, "out_scores")
		must(outCount != 0 && !nOK && batch > 0, "out_count")
	}
	// The arrays: small integers (exact dot products, many ties), candidates in -2 … 21.
	for i := range 4 * 16 {
		*(*float32)(unsafe.Pointer(&mem.b[offRetQ+4*i])) = float32(int(in.byte()%5) - 2)
	}
	for i := range 20 * 16 {
		*(*float32)(unsafe.Pointer(&mem.b[offRetReprs+4*i])) = float32(int(in.byte()%3) - 1)
	}
	for i := range 4 * 8 {
		c := int32(in.byte()%24) - 2
		binary.LittleEndian.PutUint32(mem.b[offRetCand+4*i:], uint32(c))
		if okAll && widthOK && cOK && cand != 0 && int64(i) < batch*width {
			must(c < -1 || int64(c) >= rows, "candidate")
		}
	}
	fields := retrievalArgs{Size: uint64(size), Method: int32(method), TopK: int32(topk), Batch: batch, Dim: dim,
		Q: q, Reprs: reprs, NReprs: rows, Cand: cand, CandWidth: width, OutIdx: outIdx, OutScores: outScores, OutCount: outCount}
	*(*retrievalArgs)(unsafe.Pointer(&mem.b[offRet])) = fields
	p, pOK := in.pointer(mem.addr(offRet))
	must(!pOK, "ucmgo_retrieval")
	clear(mem.b[offRetIdx:offRetReprs])
	if sub == 0 {
		st = retrieveSubmit(rh, p)
		if st > 0 {
			if ws := retrieveWait(rh, st, true); ws != 0 {
				t.Fatalf("release of a valid retrieval: %d: %s", ws, lastError())
			}
			st = 0
		}
	} else {
		st = int64(retrieveSync(rh, p))
	}
	if refuse == "" {
		if st != 0 {
			t.Fatalf("a valid retrieval failed: %d: %s", st, lastError())
		}
		checkFuzzRetrieval(t, mem, fields)
	}
	return st, refuse
}

// checkFuzzRetrieval compares the outputs in mem with sparse.DotTopK over copies of the inputs.
func checkFuzzRetrieval(t *testing.T, mem *cmem, f retrievalArgs) {
	floats := func(off, n int) []float32 {
		return slices.Clone(unsafe.Slice((*float32)(unsafe.Pointer(&mem.b[off])), n))
	}
	b, d, k := int(f.Batch), int(f.Dim), int(f.TopK)
	want := &sparse.DotArgs{Q: floats(offRetQ, b*d), Data: floats(offRetReprs, int(f.NReprs)*d), Dim: d, K: k,
		Idx: make([]int32, b*k), Scores: make([]float32, b*k), Count: make([]int64, b)}
	if f.Cand != 0 {
		want.Width = int(f.CandWidth)
		want.Cand = slices.Clone(unsafe.Slice((*int32)(unsafe.Pointer(&mem.b[offRetCand])), b*want.Width))
	}
	if err := sparse.DotTopK(want, 1); err != nil {
		t.Fatalf("reference: %v", err)
	}
	idx := unsafe.Slice((*int32)(unsafe.Pointer(&mem.b[offRetIdx])), b*k)
	scores := unsafe.Slice((*float32)(unsafe.Pointer(&mem.b[offRetScores])), b*k)
	if !slices.Equal(idx, want.Idx) || !slices.Equal(scores, want.Scores) {
		t.Fatalf("retrieval %+v: %v %v, want %v %v", f, idx, scores, want.Idx, want.Scores)
	}
	if f.OutCount != 0 {
		if count := unsafe.Slice((*int64)(unsafe.Pointer(&mem.b[offRetCount])), b); !slices.Equal(count, want.Count) {
			t.Fatalf("counts %v, want %v", count, want.Count)
		}
	}
}

// retrieveSeeds are FuzzABI inputs of op 11: a retrieval task, a synchronous one, and one
// with a candidate past the rows, a candidate table at 2^63, an unknown task.
func retrieveSeeds() [][]byte {
	data := func(candidate byte) []byte {
		var b []byte
		for i := range 64 + 320 {
			b = append(b, byte(i*7%11))
		}
		for i := range 32 {
			b = append(b, byte(2+i%20)) // candidates 0 … 19
		}
		b[64+320+5] = candidate
		return b
	}
	// store handle byte, op 11, retriever handle byte, sub-op, size, method, batch, dim, topk,
	// rows, width, the six array pointers, the arrays, the struct pointer.
	head := func(sub, candPtr byte) []byte {
		return []byte{0, 11, 0, sub, 0, 0, 2, 3, 3, 3, 3, 0, 0, candPtr, 0, 0, 0}
	}
	seeds := [][]byte{
		append(append(head(0, 0), data(7)...), 0),
		append(append(head(1, 0), data(7)...), 0),
		append(append(head(0, 0), data(23)...), 0), // candidate 21 of 20 rows
		append(append(head(0, 236), data(7)...), 0),
		{0, 11, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 0}, // wait on an unknown task
	}
	return seeds
}

// TestRetrieveSeeds: the seeds reach what they are for: two valid retrievals (checked against
// sparse.DotTopK), a candidate past the rows and an impossible candidate table refused with
// EPARAM, an unknown task.
func TestRetrieveSeeds(t *testing.T) {
	m, err := syscall.Mmap(-1, 0, fzSlots+fzMax*fzBlock, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	want := []struct {
		st     int64
		refuse string
	}{{0, ""}, {0, ""}, {int64(connector.StatusEParam), "candidate"}, {int64(connector.StatusEParam), "cand"},
		{int64(connector.StatusENoObj), ""}}
	for i, s := range retrieveSeeds() {
		st, refuse := fuzzRetrieve(t, &cmem{m}, &fuzzInput{s[2:]})
		if st != want[i].st || refuse != want[i].refuse {
			t.Fatalf("seed %d: status %d (%s), refuse %q; want %d, %q", i, st, lastError(), refuse, want[i].st, want[i].refuse)
		}
	}
}
