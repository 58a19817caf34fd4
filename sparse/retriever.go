package sparse

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/ucm-go/ucm/engine"
)

// Retriever errors.
var (
	// ErrNoTask: a task id the Retriever never returned, or one already released.
	ErrNoTask = fmt.Errorf("sparse: no such retrieval task: %w", engine.ErrNotFound)
	// ErrRetrieverClosed: a submission after Close.
	ErrRetrieverClosed = errors.New("sparse: retriever closed")
)

// MaxRetrieverWorkers bounds a Retriever's workers.
const MaxRetrieverWorkers = 1024

// Retriever runs retrievals as tasks on a pool of worker goroutines: Submit returns a task id
// at once, Check and Wait follow it, Release forgets it. Tasks start in submission order, each
// on one worker with helper goroutines (DotTopK's split) for the workers no other task needs:
// up to Workers()-1 when it is the only one, none while the other workers have tasks running
// or queued (splitting a task then only adds hand-offs). A task holds
// the caller's memory (its DotArgs slices) until it is done: the caller must keep it valid and
// unchanged until then, and may reuse it once Check says done or Wait returns. All methods
// are safe for concurrent use.
type Retriever struct {
	workers int
	mu      sync.Mutex
	cond    sync.Cond // signalled on a new job or on close
	queue   []*retrieveTask
	running int // tasks being run by a worker
	tasks   map[uint64]*retrieveTask
	next    uint64
	closed  bool
	wg      sync.WaitGroup
}

type retrieveTask struct {
	id   uint64
	run  func(workers int) error
	done chan struct{} // closed when err is set
	err  error
}

// NewRetriever starts a pool of workers goroutines (at least 1, at most MaxRetrieverWorkers).
// When cpus is not empty, worker i runs locked to an OS thread pinned to CPU cpus[i%len(cpus)]
// (a CPU the process may not use is an error: nothing is started); its helper goroutines are
// not pinned.
func NewRetriever(workers int, cpus []int) (*Retriever, error) {
	if workers < 1 || workers > MaxRetrieverWorkers {
		return nil, fmt.Errorf("retriever: %d workers: want 1 … %d: %w", workers, MaxRetrieverWorkers, ErrInvalid)
	}
	if len(cpus) > 0 {
		if err := checkCPUs(cpus); err != nil {
			return nil, err
		}
	}
	r := &Retriever{workers: workers, tasks: map[uint64]*retrieveTask{}}
	r.cond.L = &r.mu
	r.wg.Add(workers)
	for i := range workers {
		cpu := -1
		if len(cpus) > 0 {
			cpu = cpus[i%len(cpus)]
		}
		go r.work(cpu)
	}
	return r, nil
}

// Workers is the pool's size.
func (r *Retriever) Workers() int { return r.workers }

func (r *Retriever) work(cpu int) {
	defer r.wg.Done()
	if cpu >= 0 {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		pinThread(cpu)
	}
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && !r.closed {
			r.cond.Wait()
		}
		if len(r.queue) == 0 { // closed and drained
			r.mu.Unlock()
			return
		}
		t := r.queue[0]
		r.queue[0] = nil
		r.queue = r.queue[1:]
		r.running++
		share := max(1, r.workers-(r.running-1)-len(r.queue))
		r.mu.Unlock()
		t.err = t.run(share)
		t.run = nil
		close(t.done)
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
	}
}

// submit queues run as a task and returns its id (> 0).
func (r *Retriever) submit(run func(workers int) error) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, ErrRetrieverClosed
	}
	r.next++
	t := &retrieveTask{id: r.next, run: run, done: make(chan struct{})}
	r.tasks[t.id] = t
	r.queue = append(r.queue, t)
	r.cond.Signal()
	return t.id, nil
}

// SubmitDot checks a (DotArgs.Check: a bad argument is an error here, and no task) and queues
// DotTopK over it. It returns the task's id, > 0 and never reused by this Retriever.
func (r *Retriever) SubmitDot(a *DotArgs) (uint64, error) {
	if err := a.Check(); err != nil {
		return 0, err
	}
	return r.submit(func(workers int) error { return DotTopK(a, workers) })
}

// SubmitMaxDot checks b (MaxDotBatch.Check: a bad argument is an error here, and no task) and
// queues MaxDotBatchTopK over it; the task's id as SubmitDot's.
func (r *Retriever) SubmitMaxDot(b *MaxDotBatch) (uint64, error) {
	if err := b.Check(); err != nil {
		return 0, err
	}
	return r.submit(func(workers int) error { return MaxDotBatchTopK(b, workers) })
}

// SubmitSoftmax checks a (SoftmaxArgs.Check: a bad argument is an error here, and no task)
// and queues SoftmaxTopK over it; done, when not nil, receives the number of ids written,
// on the worker, before the task is done. The task's id as SubmitDot's.
func (r *Retriever) SubmitSoftmax(a *SoftmaxArgs, done func(n int)) (uint64, error) {
	if err := a.Check(); err != nil {
		return 0, err
	}
	return r.submit(func(workers int) error {
		n, err := SoftmaxTopK(a, workers)
		if err == nil && done != nil {
			done(n)
		}
		return err
	})
}

func (r *Retriever) task(id uint64) (*retrieveTask, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tasks[id]
	if !ok {
		return nil, fmt.Errorf("task %d: %w", id, ErrNoTask)
	}
	return t, nil
}

// Check reports whether task id is done and, when it is, its error; ErrNoTask for an id not
// submitted or already released.
func (r *Retriever) Check(id uint64) (done bool, err error) {
	t, err := r.task(id)
	if err != nil {
		return false, err
	}
	select {
	case <-t.done:
		return true, t.err
	default:
		return false, nil
	}
}

// Wait blocks until task id is done and returns its error; it does not release the task (a
// second Wait returns at once with the same error). ErrNoTask for an unknown id.
func (r *Retriever) Wait(id uint64) error {
	t, err := r.task(id)
	if err != nil {
		return err
	}
	<-t.done
	return t.err
}

// Release waits for task id to be done (the caller's memory is free after it), forgets it and
// returns its error; ErrNoTask for an unknown id, and for the same id afterwards.
func (r *Retriever) Release(id uint64) error {
	t, err := r.task(id)
	if err != nil {
		return err
	}
	<-t.done
	r.mu.Lock()
	_, mine := r.tasks[id]
	delete(r.tasks, id)
	r.mu.Unlock()
	if !mine { // a concurrent Release took it
		return fmt.Errorf("task %d: %w", id, ErrNoTask)
	}
	return t.err
}

// Close refuses new submissions, waits for every queued task to be done and stops the
// workers. Tasks submitted before stay checkable and releasable. A second Close does nothing.
func (r *Retriever) Close() {
	r.mu.Lock()
	r.closed = true
	r.cond.Broadcast()
	r.mu.Unlock()
	r.wg.Wait()
}
