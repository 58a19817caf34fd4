//go:build linux && uring

package devio

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"syscall"

	"github.com/iceber/iouring-go"
)

// uringCompiled reports whether the io_uring backend is compiled in.
const uringCompiled = true

// maxRingEntries is the kernel's IORING_MAX_ENTRIES.
const maxRingEntries = 32768

// uringBackend issues reads and writes through one shared io_uring.
//
// In-flight operations across all Submits are bounded by queueDepth tokens, granted to
// Submits in arrival order (tokenQueue); queueDepth is also the ring's SQ size (the CQ is
// twice that), so the completion queue cannot overflow. Each Submit has its own result channel
// sized to its op count: the library's completion goroutine blocks sending to
// it, and each op has at most one request in flight at a time.
type uringBackend struct {
	ring   *iouring.IOURing
	depth  int
	tokens *tokenQueue

	mu sync.RWMutex // held shared by Submit, exclusively by Close
	// closed is guarded by mu.
	closed bool
	// broken, guarded by brokenMu, is set when a submission failed after its
	// SQEs may have reached the ring; every later Submit fails with it.
	brokenMu sync.Mutex
	broken   error
}

func newURing(queueDepth int) (Backend, error) {
	if queueDepth > maxRingEntries {
		queueDepth = maxRingEntries
	}
	ring, err := iouring.New(uint(queueDepth))
	if err != nil {
		return nil, fmt.Errorf("%w: io_uring setup: %w", ErrUnsupported, err)
	}
	if ring.Size() < queueDepth {
		queueDepth = ring.Size()
	}
	return &uringBackend{ring: ring, depth: queueDepth, tokens: newTokenQueue(queueDepth)}, nil
}

// Name implements Backend.
func (u *uringBackend) Name() string { return "uring" }

// Close implements Backend.
func (u *uringBackend) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil
	}
	u.closed = true
	return u.ring.Close()
}

func (u *uringBackend) brokenErr() error {
	u.brokenMu.Lock()
	defer u.brokenMu.Unlock()
	return u.broken
}

// Submit implements Backend.
func (u *uringBackend) Submit(ops []Op) error {
	u.mu.RLock()
	defer u.mu.RUnlock()
	if u.closed {
		return ErrClosed
	}
	if err := u.brokenErr(); err != nil {
		return err
	}

	// A unit is ops[lo:hi]: one op, or a run of ops adjacent in their file issued as one
	// vectored request (see mergeRuns).
	units := mergeRuns(ops, func(op *Op) bool {
		if !prepareOp(op) {
			return false
		}
		if !op.File.hasFd() {
			_ = runOp(op) // MemFS and friends: ReadAt/WriteAt inline.
			return false
		}
		return true
	})
	if len(units) == 0 {
		return firstErr(ops)
	}
	pending := make([]int, len(units))
	for k := range pending {
		pending[k] = k
	}

	// Room for a completion of every op: a merged request split back into its ops can have
	// more requests in flight than there were units, and the library's completion goroutine
	// (shared by every Submit) must never block on this channel.
	ch := make(chan iouring.Result, len(ops))
	retries := make([]uint8, len(ops))
	reqs := make([]iouring.PrepRequest, 0, min(len(pending), u.depth))
	taken := make([]int, 0, cap(reqs))
	inflight := 0
	w := u.tokens.join()
	defer u.tokens.leave(w)
	for len(pending) > 0 || inflight > 0 {
		// Issue as many pending units as we hold tokens for; the rest wait their turn.
		reqs, taken = reqs[:0], taken[:0]
		if len(pending) > 0 {
			for range u.tokens.take(w, len(pending)) {
				k := pending[0]
				pending = pending[1:]
				reqs = append(reqs, u.prep(ops, units[k], k))
				taken = append(taken, k)
			}
		}
		if len(reqs) > 0 {
			if _, err := u.ring.SubmitRequests(reqs, ch); err != nil {
				u.tokens.release(len(reqs))
				if !errors.Is(err, iouring.ErrIOURingClosed) && !errors.Is(err, iouring.ErrUnregisteredFile) {
					// The SQEs may have reached the ring without their
					// completions being tracked: the ring cannot be trusted.
					u.brokenMu.Lock()
					if u.broken == nil {
						u.broken = fmt.Errorf("devio: io_uring backend failed: %w", err)
					}
					u.brokenMu.Unlock()
				}
				for _, k := range taken {
					for i := units[k].lo; i < units[k].hi; i++ {
						ops[i].Err = opError(&ops[i], fmt.Errorf("io_uring submit: %w", err))
					}
				}
			} else {
				inflight += len(reqs)
			}
		}
		// Wait for a completion of ours or, with units still pending, for tokens granted to us.
		var res iouring.Result
		switch {
		case inflight == 0 && len(pending) > 0:
			<-w.wake
			continue
		case inflight == 0:
			continue
		case len(pending) > 0:
			select {
			case res = <-ch:
			case <-w.wake:
				continue
			}
		default:
			res = <-ch
		}
		inflight--
		u.tokens.release(1)
		k := res.GetRequestInfo().(int)
		un := units[k]
		n, err := res.ReturnInt()
		if un.hi-un.lo > 1 {
			// A merged request: done, or split back into its ops, each retried alone so
			// that every op gets its own outcome.
			for _, i := range un.settle(ops, n, err) {
				units = append(units, opUnit{lo: i, hi: i + 1})
				pending = append(pending, len(units)-1)
			}
			continue
		}
		i := un.lo
		op := &ops[i]
		switch {
		case err != nil:
			if (errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN)) && retries[i] < 100 {
				retries[i]++
				pending = append(pending, k)
				continue
			}
			op.Err = opError(op, err)
		case n == 0:
			if op.Write {
				op.Err = opError(op, io.ErrShortWrite)
			} else {
				op.Err = opError(op, io.ErrUnexpectedEOF)
			}
		default:
			op.N += n
			if op.N < len(op.Buf) {
				pending = append(pending, k)
			}
		}
	}
	// The ring's requests referenced the buffers and descriptors; every one of
	// them has completed now, but keep the files (whose finalizers would close
	// the descriptors) alive until here.
	for i := range ops {
		if ops[i].File != nil {
			runtime.KeepAlive(ops[i].File.file)
		}
	}
	runtime.KeepAlive(ops)
	return firstErr(ops)
}

// prep builds the request for unit k: the untransferred rest of a single op, or one vectored
// request for a merged run.
func (u *uringBackend) prep(ops []Op, un opUnit, k int) iouring.PrepRequest {
	op := &ops[un.lo]
	fd := int(op.File.fd)
	if un.hi-un.lo > 1 {
		if op.Write {
			return iouring.Pwritev(fd, un.bufs(ops), op.Off).WithInfo(k)
		}
		return iouring.Preadv(fd, un.bufs(ops), uint64(op.Off)).WithInfo(k)
	}
	b := op.Buf[op.N:]
	if len(b) > maxIOChunk {
		b = b[:maxIOChunk]
	}
	off := uint64(op.Off + int64(op.N))
	if op.Write {
		return iouring.Pwrite(fd, b, off).WithInfo(k)
	}
	return iouring.Pread(fd, b, off).WithInfo(k)
}
