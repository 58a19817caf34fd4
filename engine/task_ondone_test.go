package engine

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestTaskOnDone: callbacks registered while the task runs, concurrently with its completion,
// each run exactly once and see the task done; one registered on a done task runs at once.
func TestTaskOnDone(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	blocks := ids(0, 8)
	src := make([][]byte, len(blocks))
	for i, id := range blocks {
		src[i] = blockBytes(mhaLayout, id)
	}
	for round := 0; round < 20; round++ {
		task := e.Dump(blocks, src)
		var runs atomic.Int32
		var wg, cbs sync.WaitGroup
		cbs.Add(4)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				task.OnDone(func() {
					defer cbs.Done()
					select {
					case <-task.Done():
					default:
						t.Error("OnDone callback ran before the task was done")
					}
					runs.Add(1)
				})
			}()
		}
		if err := task.Wait(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		cbs.Wait() // the completing goroutine runs them after done is closed: Wait may return first
		if n := runs.Load(); n != 4 {
			t.Fatalf("round %d: %d callbacks ran, want 4", round, n)
		}
		ran := false
		task.OnDone(func() { ran = true })
		if !ran {
			t.Fatal("a callback registered on a done task did not run at once")
		}
	}
	// A task failed before it started is done at once.
	ran := false
	e.LoadShard(blocks, -1, nil).OnDone(func() { ran = true })
	if !ran {
		t.Fatal("callback on a failed task did not run")
	}
}
