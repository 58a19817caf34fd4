package sparse

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestRetrieverMatchesDotTopK: tasks submitted from several goroutines at once give what a
// synchronous DotTopK gives on the same arguments; Check, Wait and Release behave as documented
// (a second Release and any call after it are ErrNoTask).
func TestRetrieverMatchesDotTopK(t *testing.T) {
	r, err := NewRetriever(2, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 15 {
				a := randDotArgs(rng)
				want := *a
				want.Idx, want.Scores, want.Count = slices.Clone(a.Idx), slices.Clone(a.Scores), slices.Clone(a.Count)
				if err := DotTopK(&want, 1); err != nil {
					errs <- err
					return
				}
				id, err := r.SubmitDot(a)
				if err != nil {
					errs <- err
					return
				}
				if err := r.Wait(id); err != nil {
					errs <- err
					return
				}
				if done, err := r.Check(id); !done || err != nil {
					errs <- errors.New("check after wait: not done")
					return
				}
				if !slices.Equal(a.Idx, want.Idx) || !slices.Equal(a.Scores, want.Scores) || !slices.Equal(a.Count, want.Count) {
					errs <- errors.New("task result differs from DotTopK")
					return
				}
				if err := r.Release(id); err != nil {
					errs <- err
					return
				}
				if err := r.Release(id); !errors.Is(err, ErrNoTask) {
					errs <- errors.New("second release: " + errString(err))
					return
				}
				if _, err := r.Check(id); !errors.Is(err, ErrNoTask) {
					errs <- errors.New("check after release: " + errString(err))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestRetrieverTaskStates: a task is not done while it runs (Check false, no error), is done
// after; Close waits for queued tasks, which stay releasable; submissions after Close fail;
// a bad argument fails at submit with no task.
func TestRetrieverTaskStates(t *testing.T) {
	r, err := NewRetriever(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	first, _ := r.submit(func(int) error { <-gate; return nil })
	boom := errors.New("boom")
	second, _ := r.submit(func(int) error { return boom })
	if done, err := r.Check(first); done || err != nil {
		t.Fatalf("running task: done %v err %v", done, err)
	}
	if done, err := r.Check(second); done || err != nil {
		t.Fatalf("queued task: done %v err %v", done, err)
	}
	if _, err := r.SubmitDot(&DotArgs{Dim: 0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad args: %v", err)
	}
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	close(gate)
	<-closed
	if done, err := r.Check(second); !done || !errors.Is(err, boom) {
		t.Fatalf("after close: done %v err %v", done, err)
	}
	if err := r.Wait(second); !errors.Is(err, boom) {
		t.Fatalf("wait: %v", err)
	}
	if err := r.Release(first); err != nil {
		t.Fatal(err)
	}
	if _, err := r.submit(func(int) error { return nil }); !errors.Is(err, ErrRetrieverClosed) {
		t.Fatalf("submit after close: %v", err)
	}
	if err := r.Wait(12345); !errors.Is(err, ErrNoTask) {
		t.Fatalf("unknown id: %v", err)
	}
	r.Close()
}

// TestNewRetrieverRefuses: worker counts out of range and CPUs the process cannot use.
func TestNewRetrieverRefuses(t *testing.T) {
	for _, c := range []struct {
		w    int
		cpus []int
	}{{0, nil}, {MaxRetrieverWorkers + 1, nil}, {1, []int{-1}}, {1, []int{4096}}, {2, []int{0, 1023}}} {
		if _, err := NewRetriever(c.w, c.cpus); !errors.Is(err, ErrInvalid) {
			t.Fatalf("workers %d cpus %v: %v", c.w, c.cpus, err)
		}
	}
}

// TestMaxDotBatch: each request of a batch gets maxDotRef over its own blocks (a run of
// consecutive blocks, a scattered list with -1 padding, or every block), with its own topk,
// through a Retriever task; the rest of each out row is left as it was; a row too short for
// its selection, a block past the array and a negative topk are refused naming the request.
func TestMaxDotBatch(t *testing.T) {
	r, err := NewRetriever(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rng := rand.New(rand.NewPCG(21, 22))
	for it := range 60 {
		kv, g := 1+rng.IntN(3), []int{1, 2, 4}[rng.IntN(3)]
		b := &MaxDotBatch{QHeads: kv * g, KVHeads: kv, M: 1 + rng.IntN(2), Dim: []int{4, 16}[rng.IntN(2)], Init: 1, Local: 2}
		blocks, batch := 1+rng.IntN(30), 1+rng.IntN(4)
		per := kv * b.M * b.Dim
		b.Reprs = make([]float32, blocks*per)
		for i := range b.Reprs {
			b.Reprs[i] = float32(rng.IntN(3) - 1)
		}
		b.Q = make([]float32, batch*b.QHeads*b.Dim)
		for i := range b.Q {
			b.Q[i] = float32(rng.IntN(5) - 2)
		}
		all := rng.IntN(3) == 0
		if !all {
			b.Width = blocks
			b.Cand = slices.Repeat([]int32{-1}, batch*blocks)
		}
		var want [][]int32
		for i := range batch {
			a := &MaxDotArgs{Q: b.Q[i*b.QHeads*b.Dim : (i+1)*b.QHeads*b.Dim], QHeads: b.QHeads, KVHeads: kv, M: b.M, Dim: b.Dim, Init: 1, Local: 2}
			var ids []int
			switch {
			case all:
				ids = rng.Perm(blocks)[:0]
				for j := range blocks {
					ids = append(ids, j)
				}
			case i%2 == 0: // a run
				lo := rng.IntN(blocks)
				for j := lo; j < lo+rng.IntN(blocks-lo+1); j++ {
					ids = append(ids, j)
				}
			default: // scattered, padded
				ids = rng.Perm(blocks)[:rng.IntN(blocks+1)]
			}
			for j, c := range ids {
				if !all {
					b.Cand[i*b.Width+j] = int32(c)
				}
				a.Reprs = append(a.Reprs, b.Reprs[c*per:(c+1)*per]...)
			}
			a.K = rng.IntN(len(ids) + 2)
			b.K = append(b.K, int32(a.K))
			want = append(want, maxDotRef(a))
		}
		b.OutWidth = blocks + 3
		b.Out = slices.Repeat([]int32{77}, batch*b.OutWidth)
		b.Count = make([]int64, batch)
		id, err := r.SubmitMaxDot(b)
		if err != nil {
			t.Fatalf("case %d: %v", it, err)
		}
		if err := r.Release(id); err != nil {
			t.Fatalf("case %d: %v", it, err)
		}
		for i := range batch {
			row := b.Out[i*b.OutWidth : (i+1)*b.OutWidth]
			if n := int(b.Count[i]); !slices.Equal(row[:n], want[i]) || slices.ContainsFunc(row[n:], func(v int32) bool { return v != 77 }) {
				t.Fatalf("case %d request %d: %v (count %d), want %v then 77s", it, i, row, n, want[i])
			}
		}
	}
	base := func() *MaxDotBatch {
		return &MaxDotBatch{QHeads: 2, KVHeads: 1, M: 1, Dim: 2, Q: make([]float32, 8), Reprs: make([]float32, 20),
			Cand: []int32{0, 1, 2, 3, 4, 5, 6, -1, -1, -1, -1, -1, -1, -1}, Width: 7, K: []int32{5, 1}, Init: 1, Local: 2,
			Out: make([]int32, 16), OutWidth: 8}
	}
	if _, err := r.SubmitMaxDot(base()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		bad  func(*MaxDotBatch)
		want string
	}{
		{func(b *MaxDotBatch) { b.OutWidth, b.Out = 4, make([]int32, 8) }, "request 0 selects 5 entries"},
		{func(b *MaxDotBatch) { b.Cand[9] = 10 }, "block 10 (request 1, column 2)"},
		{func(b *MaxDotBatch) { b.K[1] = -1 }, "topk -1 of request 1"},
		{func(b *MaxDotBatch) { b.K = b.K[:1] }, "1 topk lengths for 2 requests"},
	} {
		b := base()
		c.bad(b)
		if _, err := r.SubmitMaxDot(b); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("want %q: %v", c.want, err)
		}
	}
}

// TestSubmitSoftmax: a Retriever task gives SoftmaxTopK's ids and reports their count.
func TestSubmitSoftmax(t *testing.T) {
	r, err := NewRetriever(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rng := rand.New(rand.NewPCG(23, 24))
	q, reprs := make([]byte, 2*2*4*8), make([]byte, 2*20*3*2*8)
	for i := range q {
		q[i] = byte(rng.IntN(256)) & 0x3b // finite fp16 values
	}
	for i := range reprs {
		reprs[i] = byte(rng.IntN(256)) & 0x3b
	}
	mk := func() *SoftmaxArgs {
		return &SoftmaxArgs{Q: q, Reprs: reprs, Tokens: 2, QHeads: 4, QDim: 8, KVHeads: 2, M: 3, Dim: 8, K: 7, Idx: make([]int64, 7)}
	}
	want := mk()
	if _, err := SoftmaxTopK(want, 1); err != nil {
		t.Fatal(err)
	}
	a, n := mk(), 0
	id, err := r.SubmitSoftmax(a, func(got int) { n = got })
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(id); err != nil || n != 7 || !slices.Equal(a.Idx, want.Idx) {
		t.Fatalf("task: %v, %d ids %v; want 7 %v", err, n, a.Idx, want.Idx)
	}
	bad := mk()
	bad.QDim = 9
	if _, err := r.SubmitSoftmax(bad, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad q: %v", err)
	}
}
