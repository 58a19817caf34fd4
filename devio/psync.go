package devio

import "sync"

// psyncBackend is a bounded pool of goroutines issuing pread/pwrite (or
// ReadAt/WriteAt for files without a descriptor).
type psyncBackend struct {
	jobs chan psyncJob
	mu   sync.RWMutex // held shared by Submit, exclusively by Close
	// closed is guarded by mu.
	closed  bool
	workers sync.WaitGroup
}

type psyncJob struct {
	op *Op
	wg *sync.WaitGroup
}

func newPsync(queueDepth int) *psyncBackend {
	b := &psyncBackend{jobs: make(chan psyncJob)}
	b.workers.Add(queueDepth)
	for range queueDepth {
		go b.worker()
	}
	return b
}

func (b *psyncBackend) worker() {
	defer b.workers.Done()
	for j := range b.jobs {
		_ = runOp(j.op)
		j.wg.Done()
	}
}

// Name implements Backend.
func (b *psyncBackend) Name() string { return "psync" }

// Submit implements Backend.
func (b *psyncBackend) Submit(ops []Op) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	var wg sync.WaitGroup
	wg.Add(len(ops))
	for i := range ops {
		b.jobs <- psyncJob{op: &ops[i], wg: &wg}
	}
	wg.Wait()
	return firstErr(ops)
}

// Close implements Backend.
func (b *psyncBackend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	close(b.jobs)
	b.workers.Wait()
	return nil
}
