package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Task is an asynchronous Dump or Load of a batch of blocks. Its methods are safe for
// concurrent use.
//
// Unlike UCM, waiting does not consume the handle: Wait and Check may be called any number of
// times, from any goroutine, and always report the same outcome once the task is done.
type Task struct {
	ids      []BlockID
	errs     []error // per block, written before done is closed
	done     chan struct{}
	err      error // joined block errors, set before done is closed
	cancel   atomic.Bool
	aborted  chan struct{} // closed by abort, with cancel set
	aborting sync.Once
	deadline time.Time // zero: none
	finished sync.Once

	mu     sync.Mutex
	isDone bool     // under mu: finish has closed done
	onDone []func() // under mu: run by finish, in the goroutine that completes the task
}

func newTask(ids []BlockID, timeout time.Duration) *Task {
	t := &Task{ids: ids, errs: make([]error, len(ids)), done: make(chan struct{}), aborted: make(chan struct{})}
	if timeout > 0 {
		t.deadline = time.Now().Add(timeout)
	}
	return t
}

// failedTask returns a task that is already done with err for every block.
func failedTask(ids []BlockID, err error) *Task {
	t := newTask(ids, 0)
	for i := range t.errs {
		t.errs[i] = err
	}
	t.finish()
	return t
}

// finish publishes the per-block errors; it runs once, when the task's work has drained.
func (t *Task) finish() {
	t.finished.Do(func() {
		var errs []error
		for _, e := range t.errs {
			if e != nil {
				errs = append(errs, e)
			}
		}
		if len(errs) == 1 {
			t.err = errs[0]
		} else if len(errs) > 1 {
			t.err = fmt.Errorf("%d of %d blocks failed: %w", len(errs), len(t.ids), errors.Join(errs...))
		}
		close(t.done)
		t.mu.Lock()
		t.isDone = true
		fns := t.onDone
		t.onDone = nil
		t.mu.Unlock()
		for _, fn := range fns {
			fn()
		}
	})
}

// OnDone arranges for fn to run once the task is done, in the goroutine that completes it (or
// at once, in the caller's, when it is done already): a completion notice that costs no
// goroutine of its own. fn sees the task done (Wait returns at once) and must not block; a
// waiter on Done or Wait may return before fn has run.
func (t *Task) OnDone(fn func()) {
	t.mu.Lock()
	if !t.isDone {
		t.onDone = append(t.onDone, fn)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	fn()
}

// cancelled reports whether the task was cancelled by a timeout; work not yet issued is
// skipped with ErrTimeout.
func (t *Task) cancelled() bool { return t.cancel.Load() }

// abort cancels the task: work not yet issued is skipped, and a wait for staging memory ends.
func (t *Task) abort() {
	t.aborting.Do(func() {
		t.cancel.Store(true)
		close(t.aborted)
	})
}

// Wait blocks until the task is done and returns its error: nil when every block succeeded,
// else an error joining each failed block's error (errors.Is works through it; BlockErrors has
// them one by one). If the task is not done TaskTimeout after it was started, Wait cancels it:
// I/O not yet issued is skipped and fails with ErrTimeout, I/O in flight is drained, and Wait
// returns only when no I/O of the task is using the caller's buffers any more.
func (t *Task) Wait() error {
	if t.deadline.IsZero() {
		<-t.done
		return t.err
	}
	timer := time.NewTimer(time.Until(t.deadline))
	defer timer.Stop()
	select {
	case <-t.done:
	case <-timer.C:
		t.abort()
		<-t.done
	}
	return t.err
}

// WaitContext is Wait bounded by ctx instead of the engine's timeout: when ctx ends first the
// task is cancelled as on a timeout.
func (t *Task) WaitContext(ctx context.Context) error {
	select {
	case <-t.done:
	case <-ctx.Done():
		t.abort()
		<-t.done
	}
	return t.err
}

// Check reports without blocking whether the task is done and, if so, its error.
func (t *Task) Check() (done bool, err error) {
	select {
	case <-t.done:
		return true, t.err
	default:
		return false, nil
	}
}

// Done returns a channel closed when the task is done.
func (t *Task) Done() <-chan struct{} { return t.done }

// BlockErrors returns, once the task is done, one entry per block of the call (nil for
// success) in call order; nil while the task is running. A connector reports the failed
// blocks of a load to its scheduler so they are recomputed.
func (t *Task) BlockErrors() []error {
	select {
	case <-t.done:
		return t.errs
	default:
		return nil
	}
}

// Failed returns, once the task is done, the ids of the blocks that failed.
func (t *Task) Failed() []BlockID {
	var out []BlockID
	for i, e := range t.BlockErrors() {
		if e != nil {
			out = append(out, t.ids[i])
		}
	}
	return out
}
