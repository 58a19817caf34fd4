package sparse

import (
	"errors"
	"math/rand/v2"
	"slices"
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
