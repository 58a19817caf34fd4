package devio

import "sync"

// psyncBackend is a bounded pool of goroutines issuing pread/pwrite (or
// ReadAt/WriteAt for files without a descriptor). A job is handed to a worker only with one
// of queueDepth tokens, granted to Submits in arrival order (tokenQueue), so concurrent
// Submits are served first come, first served instead of interleaved.
type psyncBackend struct {
	jobs   chan psyncJob
	tokens *tokenQueue
	mu     sync.RWMutex // held shared by Submit, exclusively by Close
	// closed is guarded by mu.
	closed  bool
	workers sync.WaitGroup
}

// psyncJob is one unit of a batch: a single op, or a merged run of adjacent ops.
type psyncJob struct {
	ops []Op
	wg  *sync.WaitGroup
}

func newPsync(queueDepth int) *psyncBackend {
	b := &psyncBackend{jobs: make(chan psyncJob), tokens: newTokenQueue(queueDepth)}
	b.workers.Add(queueDepth)
	for range queueDepth {
		go b.worker()
	}
	return b
}

func (b *psyncBackend) worker() {
	defer b.workers.Done()
	for j := range b.jobs {
		if len(j.ops) == 1 {
			_ = transfer(&j.ops[0])
		} else {
			runMerged(j.ops)
		}
		b.tokens.release(1)
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
	units := mergeRuns(ops, prepareOp)
	var wg sync.WaitGroup
	wg.Add(len(units))
	w := b.tokens.join()
	defer b.tokens.leave(w)
	for next := 0; next < len(units); {
		n := b.tokens.take(w, len(units)-next)
		if n == 0 {
			<-w.wake
			continue
		}
		for _, un := range units[next : next+n] {
			b.jobs <- psyncJob{ops: ops[un.lo:un.hi], wg: &wg}
		}
		next += n
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
