package lifecycle

import (
	"sync"
	"sync/atomic"
)

// Runner admits tasks until Close begins and makes Close wait for the tasks it admitted. Its
// methods are safe for concurrent use.
//
// The ordering it keeps: every Enter that returned true happens before Close's wait, so Close
// never misses a task (a WaitGroup's Add racing its Wait is what closeMu rules out), and once
// Close has begun every Enter returns false.
type Runner struct {
	closeMu sync.RWMutex // orders Enter's wg.Add before Close's wg.Wait
	closing atomic.Bool
	closed  chan struct{} // closed when Close begins
	wg      sync.WaitGroup
}

// NewRunner returns a Runner that admits tasks.
func NewRunner() *Runner { return &Runner{closed: make(chan struct{})} }

// Enter registers a task; it returns false, registering nothing, once Close has begun. A task
// that entered calls Done when it ends.
func (r *Runner) Enter() bool {
	r.closeMu.RLock()
	defer r.closeMu.RUnlock()
	if r.closing.Load() {
		return false
	}
	r.wg.Add(1)
	return true
}

// Done ends a task that Enter registered.
func (r *Runner) Done() { r.wg.Done() }

// Closing reports whether Close has begun.
func (r *Runner) Closing() bool { return r.closing.Load() }

// Closed returns a channel closed when Close begins: a task waiting for a resource gives up on
// it.
func (r *Runner) Closed() <-chan struct{} { return r.closed }

// Close begins closing: from now on Enter refuses, Closed's channel is closed, and Close waits
// for every task entered before. It returns true for the call that began closing; any other
// returns false at once, without waiting.
func (r *Runner) Close() bool {
	r.closeMu.Lock()
	first := r.closing.CompareAndSwap(false, true)
	r.closeMu.Unlock()
	if !first {
		return false
	}
	close(r.closed)
	r.wg.Wait()
	return true
}
