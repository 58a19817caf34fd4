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
	"github.com/ucm-go/ucm/kernels"
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
	offRetChan   = offRet + 3072 // SOFTMAX's channels: up to 2 × 16 int64
	offRetTopK   = offRet + 3584 // MAXDOT's row_topk: up to 4 int32
	offRetReprs  = fzSlots       // up to 20 rows of 16 floats
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
	method, methodOK := pick([]int64{rmDot, rmMaxDot, rmSoftmax}, []int64{0, 4, -1})
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
	// MAXDOT and SOFTMAX: the heads, rows per block, channels, lengths and windows (small and
	// valid, or one that must be refused); a field the method does not use is zeroed unless
	// a byte keeps it (then refused).
	var x retrievalArgs
	qn, rn, outN, countN := batch*dim, rows*dim, batch*topk, batch
	var rowK []int32
	if methodOK && method != rmDot {
		x.QHeads = int64(1 + in.byte()%2)
		x.KVHeads = []int64{1, x.QHeads}[in.byte()%2]
		x.RowsPer = int64(1 + in.byte()%2)
		if in.byte() >= 240 {
			x.KVHeads = 3
			must(true, "q_heads")
		}
		w := dim
		if method == rmMaxDot {
			x.Init, x.Local = int32(in.byte()%3), int32(in.byte()%3)
			if in.byte()%2 == 1 {
				x.RowTopK, _ = in.pointer(mem.addr(offRetTopK))
				must(x.RowTopK != 0 && x.RowTopK != mem.addr(offRetTopK) && batch > 0 && batchOK, "row_topk")
			}
			if in.byte() < 240 {
				outScores = 0
			} else {
				must(outScores != 0, "out_scores")
			}
		} else {
			if in.byte() < 240 {
				outScores, cand, width = 0, 0, 0
			} else {
				must(outScores != 0, "out_scores")
				must(cand != 0, "cand")
				must(width != 0, "cand_width")
			}
			if in.byte()%2 == 1 && dimOK {
				x.Channels, _ = in.pointer(mem.addr(offRetChan))
				x.Kept = []int64{0, 1, dim/2 + 1, dim}[in.byte()%4]
				must(x.Kept == 0 && x.Channels != 0, "kept") // no table and 0 kept: no pruning, valid
				must(x.Channels != mem.addr(offRetChan) && !(x.Channels == 0 && x.Kept == 0), "channels")
				w = x.Kept
			}
			outN, countN = topk, 1
		}
		qn, rn = batch*x.QHeads*dim, rows*x.KVHeads*x.RowsPer*w
		if method == rmSoftmax {
			qn, rn = (qn+1)/2, (rn+1)/2 // the extents in float32 units: only whether they are 0 matters
		}
	}
	if okAll {
		must(cand != 0 && !widthOK, "cand_width")
		must(!qOK && qn > 0, "q")
		must(!rOK && rn > 0, "reprs")
		must(cand != 0 && !cOK && widthOK && batch*width > 0, "cand")
		must(!iOK && outN > 0, "out_idx")
		must(outScores != 0 && !sOK && batch*topk > 0, "out_scores")
		must(method == rmDot && !sOK && batch*topk > 0, "out_scores")
		must(outCount != 0 && !nOK && countN > 0, "out_count")
	}
	// The arrays: small integers (exact dot products, many ties), candidates in -2 … 21.
	// DOT reads 4 × 16 query and 20 × 16 representation values; the others twice and four
	// times as many.
	nqv, nrv := 4*16, 20*16
	if method == rmMaxDot || method == rmSoftmax {
		nqv, nrv = 4*16*2, 20*16*4
	}
	for i := range nqv {
		v := float32(int(in.byte()%5) - 2)
		if method == rmSoftmax {
			binary.LittleEndian.PutUint16(mem.b[offRetQ+2*i:], kernels.Float32ToFloat16(v/4))
		} else {
			*(*float32)(unsafe.Pointer(&mem.b[offRetQ+4*i])) = v
		}
	}
	for i := range nrv {
		v := float32(int(in.byte()%3) - 1)
		if method == rmSoftmax {
			binary.LittleEndian.PutUint16(mem.b[offRetReprs+2*i:], kernels.Float32ToFloat16(v/2))
		} else {
			*(*float32)(unsafe.Pointer(&mem.b[offRetReprs+4*i])) = v
		}
	}
	for i := range 4 * 8 {
		c := int32(in.byte()%24) - 2
		binary.LittleEndian.PutUint32(mem.b[offRetCand+4*i:], uint32(c))
		if okAll && widthOK && cOK && cand != 0 && int64(i) < batch*width {
			must(c < -1 || int64(c) >= rows, "candidate")
		}
	}
	if x.Channels == mem.addr(offRetChan) && dimOK {
		for i := range 2 * 16 {
			c := int64(in.byte()%18) - 1 // -1 and dim … 16 must be refused
			binary.LittleEndian.PutUint64(mem.b[offRetChan+8*i:], uint64(c))
			if okAll && int64(i) < x.KVHeads*x.Kept {
				must(c < 0 || c >= dim, "channel")
			}
		}
	}
	if method == rmMaxDot && batchOK {
		rowK = make([]int32, batch)
		for i := range batch {
			rowK[i] = int32(topk)
			if x.RowTopK != 0 {
				rowK[i] = int32(in.byte()%12) - 1
				binary.LittleEndian.PutUint32(mem.b[offRetTopK+4*i:], uint32(rowK[i]))
			}
		}
		// Every row's topk is read whatever the candidates are (a candidate pointer the library
		// never reads, with a width of 0, is no reason to skip the check).
		if okAll && (x.RowTopK == mem.addr(offRetTopK) || x.RowTopK == 0) {
			for i, k := range rowK {
				must(k < 0, "topk")
				n := rows
				if cand != 0 && widthOK {
					n = 0
					for j := range width {
						if c := int32(binary.LittleEndian.Uint32(mem.b[offRetCand+4*(int64(i)*width+j):])); c >= 0 {
							n++
						}
					}
				}
				sel := int64(0)
				switch {
				case n == 0 || k <= 0:
				case int64(x.Init+x.Local) >= n || int64(k) >= n:
					sel = n
				default:
					sel = int64(x.Init+x.Local) + max(int64(k)-int64(x.Init+x.Local), 0)
				}
				must(okAll && sel > topk, "request")
			}
		}
	}
	fields := retrievalArgs{Size: uint64(size), Method: int32(method), TopK: int32(topk), Batch: batch, Dim: dim,
		Q: q, Reprs: reprs, NReprs: rows, Cand: cand, CandWidth: width, OutIdx: outIdx, OutScores: outScores, OutCount: outCount,
		QHeads: x.QHeads, KVHeads: x.KVHeads, RowsPer: x.RowsPer, Channels: x.Channels, Kept: x.Kept, RowTopK: x.RowTopK,
		Init: x.Init, Local: x.Local}
	*(*retrievalArgs)(unsafe.Pointer(&mem.b[offRet])) = fields
	p, pOK := in.pointer(mem.addr(offRet))
	must(!pOK, "ucmgo_retrieval")
	clear(mem.b[offRetIdx:offRetChan])
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

// checkFuzzRetrieval compares the outputs in mem with sparse.DotTopK (MaxDotBatchTopK,
// SoftmaxTopK) over copies of the inputs.
func checkFuzzRetrieval(t *testing.T, mem *cmem, f retrievalArgs) {
	floats := func(off, n int) []float32 {
		return slices.Clone(unsafe.Slice((*float32)(unsafe.Pointer(&mem.b[off])), n))
	}
	switch f.Method {
	case rmMaxDot:
		checkFuzzMaxDot(t, mem, f, floats)
		return
	case rmSoftmax:
		checkFuzzSoftmax(t, mem, f)
		return
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

func checkFuzzMaxDot(t *testing.T, mem *cmem, f retrievalArgs, floats func(off, n int) []float32) {
	b, d, k := int(f.Batch), int(f.Dim), int(f.TopK)
	per := int(f.KVHeads * f.RowsPer * f.Dim)
	want := &sparse.MaxDotBatch{Q: floats(offRetQ, b*int(f.QHeads)*d), Reprs: floats(offRetReprs, int(f.NReprs)*per),
		QHeads: int(f.QHeads), KVHeads: int(f.KVHeads), M: int(f.RowsPer), Dim: d, Init: int(f.Init), Local: int(f.Local),
		K: make([]int32, b), Out: make([]int32, b*k), OutWidth: k, Count: make([]int64, b)}
	for i := range want.K {
		want.K[i] = f.TopK
		if f.RowTopK != 0 {
			want.K[i] = int32(binary.LittleEndian.Uint32(mem.b[offRetTopK+4*i:]))
		}
	}
	if f.Cand != 0 {
		want.Width = int(f.CandWidth)
		want.Cand = slices.Clone(unsafe.Slice((*int32)(unsafe.Pointer(&mem.b[offRetCand])), b*want.Width))
	}
	if err := sparse.MaxDotBatchTopK(want, 1); err != nil {
		t.Fatalf("maxdot reference: %v", err)
	}
	out := unsafe.Slice((*int32)(unsafe.Pointer(&mem.b[offRetIdx])), b*k)
	if !slices.Equal(out, want.Out) {
		t.Fatalf("maxdot retrieval %+v: %v, want %v", f, out, want.Out)
	}
	if f.OutCount != 0 && !slices.Equal(unsafe.Slice((*int64)(unsafe.Pointer(&mem.b[offRetCount])), b), want.Count) {
		t.Fatalf("maxdot counts differ")
	}
}

func checkFuzzSoftmax(t *testing.T, mem *cmem, f retrievalArgs) {
	w := f.Dim
	if f.Channels != 0 {
		w = f.Kept
	}
	want := &sparse.SoftmaxArgs{Q: slices.Clone(mem.b[offRetQ : offRetQ+2*f.Batch*f.QHeads*f.Dim]),
		Reprs: slices.Clone(mem.b[offRetReprs : offRetReprs+2*f.NReprs*f.RowsPer*f.KVHeads*w]), Tokens: int(f.Batch),
		QHeads: int(f.QHeads), QDim: int(f.Dim), KVHeads: int(f.KVHeads), M: int(f.RowsPer), Dim: int(w), K: int(f.TopK),
		Idx: make([]int64, min(f.TopK, int32(f.NReprs)))}
	if f.Channels != 0 {
		want.Channels = slices.Clone(unsafe.Slice((*int64)(unsafe.Pointer(&mem.b[offRetChan])), f.KVHeads*f.Kept))
	}
	n, err := sparse.SoftmaxTopK(want, 1)
	if err != nil {
		t.Fatalf("softmax reference: %v", err)
	}
	out := unsafe.Slice((*int32)(unsafe.Pointer(&mem.b[offRetIdx])), f.TopK)
	for i := range out {
		if (i < n && int64(out[i]) != want.Idx[i]) || (i >= n && out[i] != -1) {
			t.Fatalf("softmax retrieval %+v: %v, want %v then -1", f, out, want.Idx[:n])
		}
	}
	if f.OutCount != 0 && *(*int64)(unsafe.Pointer(&mem.b[offRetCount])) != int64(n) {
		t.Fatalf("softmax count differs")
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
	// MAXDOT and SOFTMAX: 2 requests (tokens) of 2 query heads of 16 over 20 blocks, topk 8
	// (or 3), cand width 8; then the method's bytes and its arrays.
	other := func(method, topk byte, extra []byte, cand, tail []byte) []byte {
		b := []byte{0, 11, 0, 0, 0, method, 2, 3, topk, 3, 3, 0, 0, 0, 0, 0, 0}
		b = append(b, extra...)
		for i := range 128 + 1280 {
			b = append(b, byte(i*7%11))
		}
		b = append(b, cand...)
		return append(append(b, tail...), 0)
	}
	cand := make([]byte, 32)
	for i := range cand {
		cand[i] = byte(2 + i%20)
	}
	chans := make([]byte, 32)
	for i := range chans {
		chans[i] = byte(1 + (i*5)%16) // channels 0 … 15
	}
	bad := slices.Clone(chans)
	bad[3] = 17                                 // channel 16 of 16
	maxdot := []byte{1, 1, 1, 0, 1, 2, 1, 0, 0} // heads 2/2, M 2, windows 1/2, row_topk, no out_scores
	softmax := []byte{1, 0, 1, 0, 0, 1, 0, 2}   // heads 2/1, M 2, no cand, channels (kept 9)
	seeds := [][]byte{
		append(append(head(0, 0), data(7)...), 0),
		append(append(head(1, 0), data(7)...), 0),
		append(append(head(0, 0), data(23)...), 0), // candidate 21 of 20 rows
		append(append(head(0, 236), data(7)...), 0),
		{0, 11, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 0}, // wait on an unknown task
		other(1, 3, maxdot, cand, []byte{6, 4}),  // row lengths 5 and 3
		other(1, 2, maxdot, cand, []byte{6, 4}),  // a selection of 5 in rows of 3
		other(2, 3, softmax, cand, chans),
		other(2, 3, softmax, cand, bad),
	}
	return seeds
}

// TestRetrieveSeeds: the seeds reach what they are for: two valid retrievals (checked against
// sparse.DotTopK), a candidate past the rows and an impossible candidate table refused with
// EPARAM, an unknown task; a MAXDOT and a SOFTMAX retrieval (checked against MaxDotBatchTopK
// and SoftmaxTopK), a MAXDOT selection longer than its row and a channel past the query's
// refused.
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
		{int64(connector.StatusENoObj), ""}, {0, ""}, {int64(connector.StatusEParam), "request"}, {0, ""},
		{int64(connector.StatusEParam), "channel"}}
	for i, s := range retrieveSeeds() {
		st, refuse := fuzzRetrieve(t, &cmem{m}, &fuzzInput{s[2:]})
		if st != want[i].st || refuse != want[i].refuse {
			t.Fatalf("seed %d: status %d (%s), refuse %q; want %d, %q", i, st, lastError(), refuse, want[i].st, want[i].refuse)
		}
	}
}
