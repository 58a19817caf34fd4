package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/semaphore"
)

// Staging memory (Options.MaxStagingBytes) is one bounded budget shared by two users:
//
//   - the staging slots of partly dumped blocks (dump.go: the staging path, and V0's Create),
//     each holding a whole record until its last shard arrives, its Commit or its expiry;
//   - the bounce buffers of layer runs written as batch records (batchdump.go), each held only
//     while one chunk's run of one layer is gathered and written.
//
// The budget is a FIFO semaphore (golang.org/x/sync/semaphore): a request waits behind the
// earlier ones, so a large one is not starved by a stream of small ones. Layer runs wait for
// it (backpressure) in their task's goroutine, never in the call that submitted the dump,
// bounded by the task's deadline (TaskTimeout), its cancellation and Close. A run holds its
// bytes only while it writes, never while it waits for anything but the device, so runs
// waiting for each other cannot deadlock; and no run needs more than the whole budget (a
// chunk of a batch holds at most MaxStagingBytes of one layer: chunkBlocks). Staging slots
// take the budget without waiting: a slot is held until other calls (its block's other
// layers) arrive, so a dump that waited for a slot while holding others could wait for
// itself.
//
// e.mu.stagingBytes mirrors the semaphore's count for Stats.

// stagingSem returns the staging budget, sized once Open has settled MaxStagingBytes.
func (e *Engine) stagingSem() *semaphore.Weighted {
	e.stagingOnce.Do(func() { e.stagingBudget = semaphore.NewWeighted(e.opts.MaxStagingBytes) })
	return e.stagingBudget
}

// tryStagingLocked takes n bytes of staging memory if they are free and nobody waits for
// them; it reports whether it did.
func (e *Engine) tryStagingLocked(n int64) bool {
	if !e.stagingSem().TryAcquire(n) {
		return false
	}
	e.tookStagingLocked(n)
	return true
}

func (e *Engine) tookStagingLocked(n int64) {
	e.mu.stagingBytes += n
	e.mu.stagingPeak = max(e.mu.stagingPeak, e.mu.stagingBytes)
}

// releaseStagingLocked gives n bytes back to the budget, waking the waiters they satisfy.
func (e *Engine) releaseStagingLocked(n int64) {
	e.mu.stagingBytes -= n
	e.stagingSem().Release(n)
}

// waitStaging takes n bytes of staging memory for task t, waiting for earlier holders to
// release them. It gives up with ErrTimeout once t's deadline passes or t is cancelled
// (Wait timed out, WaitContext's context ended), and with ErrClosed once Close begins; what
// names the use, for the error. n must not exceed MaxStagingBytes.
func (e *Engine) waitStaging(t *Task, n int64, what string) error {
	sem := e.stagingSem()
	if n > e.opts.MaxStagingBytes {
		return fmt.Errorf("%s needs %d bytes of staging memory, more than max_staging_bytes (%d): %w", what, n, e.opts.MaxStagingBytes, ErrNoSpace)
	}
	e.mu.Lock()
	if sem.TryAcquire(n) {
		e.tookStagingLocked(n)
		e.mu.Unlock()
		return nil
	}
	e.mu.Unlock()
	e.stats.stagingWaits.Add(1)
	ctx, cancel := context.WithCancel(context.Background())
	if !t.deadline.IsZero() {
		ctx, cancel = context.WithDeadline(context.Background(), t.deadline)
	}
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-t.aborted:
		case <-e.life.Closed():
		case <-stop:
			return
		}
		cancel()
	}()
	start := time.Now()
	if err := sem.Acquire(ctx, n); err != nil {
		e.mu.Lock()
		used := e.mu.stagingBytes
		e.mu.Unlock()
		waited := time.Since(start).Round(time.Millisecond)
		kind := ErrTimeout
		if e.life.Closing() && !t.cancelled() && !errors.Is(err, context.DeadlineExceeded) {
			kind = ErrClosed
		}
		return fmt.Errorf("%s waited %v for %d bytes of staging memory (%d of max_staging_bytes %d in use) and gave up: %w",
			what, waited, n, used, e.opts.MaxStagingBytes, kind)
	}
	e.mu.Lock()
	e.tookStagingLocked(n)
	e.mu.Unlock()
	return nil
}
