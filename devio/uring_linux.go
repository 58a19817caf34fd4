//go:build linux && uring

package devio

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
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

	// adoptions holds the units waiting for tokens that another Submit may issue with its
	// own (adopt_linux.go); adopted counts the units issued that way.
	adoptions adoptionTable
	adopted   atomic.Int64
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
	// units[:fresh] are first issues, which may be offered to other Submits (adopt_linux.go);
	// units appended later are ops split back out of a merged request and retried alone.
	fresh := len(units)
	offered := make([]*offeredUnit, fresh)
	offerable := make([]bool, fresh)
	for k := range offerable {
		offerable[k] = true
	}
	self := &submitState{adopted: make(chan adoptedResult, fresh)}

	// Room for a completion of every op: a merged request split back into its ops can have
	// more requests in flight than there were units, and the library's completion goroutine
	// (shared by every Submit) must never block on this channel.
	ch := make(chan iouring.Result, len(ops))
	retries := make([]uint8, len(ops))
	reqs := make([]iouring.PrepRequest, 0, min(len(pending), u.depth))
	taken := make([]int, 0, cap(reqs))
	takenAdopting := make([]*adoptingRequest, 0, cap(reqs))
	inflight := 0
	proxied := 0 // units adopted by another Submit whose outcome has not arrived yet
	asked := 0   // tokens last asked for: a surplus granted since is returned by the next take
	w := u.tokens.join()
	defer u.tokens.leave(w)
	for len(pending) > 0 || inflight > 0 || proxied > 0 {
		// Issue as many pending units as we hold tokens for; the rest wait their turn.
		reqs, taken, takenAdopting = reqs[:0], taken[:0], takenAdopting[:0]
		if len(pending) > 0 || asked > 0 {
			got := u.tokens.take(w, len(pending))
			asked = len(pending)
			for got > 0 && len(pending) > 0 {
				k := pending[0]
				pending = pending[1:]
				if k < fresh && offered[k] != nil {
					o := offered[k]
					offered[k] = nil
					if !u.adoptions.withdraw(o) {
						proxied++ // issued by its adopter; its outcome comes through self.adopted
						continue
					}
				}
				req, ar := u.prepAdopting(self, ops, units[k], k, k < fresh)
				reqs = append(reqs, req)
				taken = append(taken, k)
				takenAdopting = append(takenAdopting, ar)
				got--
			}
			if got > 0 {
				u.tokens.release(got)
			}
			// What still waits for tokens may be issued meanwhile by a Submit whose request
			// it continues.
			for _, k := range pending {
				if k < fresh && offerable[k] {
					offerable[k] = false
					offered[k] = u.adoptions.offer(self, k, ops[units[k].lo:units[k].hi])
				}
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
				for j, k := range taken {
					for i := units[k].lo; i < units[k].hi; i++ {
						ops[i].Err = opError(&ops[i], fmt.Errorf("io_uring submit: %w", err))
					}
					if ar := takenAdopting[j]; ar != nil {
						ar.settleAdopted(0) // their owners retry them alone, and fail alike
					}
				}
			} else {
				inflight += len(reqs)
			}
		}
		// Wait for a completion of ours, for the outcome of a unit another Submit issued or,
		// with units still pending, for tokens granted to us.
		var (
			wake    <-chan struct{}
			results <-chan iouring.Result
		)
		if len(pending) > 0 {
			wake = w.wake
		}
		if inflight > 0 {
			results = ch
		}
		if wake == nil && results == nil && proxied == 0 {
			continue
		}
		var res iouring.Result
		select {
		case <-wake:
			continue
		case a := <-self.adopted:
			if i := slices.Index(pending, a.k); i >= 0 {
				pending = slices.Delete(pending, i, i+1) // adopted while it waited here
				offered[a.k] = nil
			} else {
				proxied--
			}
			u.adopted.Add(1)
			for _, i := range units[a.k].settle(ops, a.n, nil) {
				units = append(units, opUnit{lo: i, hi: i + 1})
				pending = append(pending, len(units)-1)
			}
			continue
		case res = <-results:
		}
		inflight--
		u.tokens.release(1)
		var (
			k  int
			ar *adoptingRequest
		)
		switch info := res.GetRequestInfo().(type) {
		case int:
			k = info
		case *adoptingRequest:
			k, ar = info.k, info
		}
		un := units[k]
		n, err := res.ReturnInt()
		if ar != nil {
			if err != nil || n < 0 {
				n = 0
			}
			ar.settleAdopted(n)
		}
		if ar != nil || un.hi-un.lo > 1 {
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

// prepAdopting builds the request for unit k, as prep does, and for a first issue (fresh) also
// adopts the offered units of other Submits that continue it: the request then covers them
// too, and its info is the returned adoptingRequest instead of k.
func (u *uringBackend) prepAdopting(self *submitState, ops []Op, un opUnit, k int, fresh bool) (iouring.PrepRequest, *adoptingRequest) {
	if !fresh || !vectoredIO {
		return u.prep(ops, un, k), nil
	}
	first, last := &ops[un.lo], &ops[un.hi-1]
	end := last.Off + int64(len(last.Buf))
	got := u.adoptions.adopt(self, first.File.fd, first.Write, end, int(end-first.Off), un.hi-un.lo)
	if len(got) == 0 {
		return u.prep(ops, un, k), nil
	}
	bufs := un.bufs(ops)
	for _, o := range got {
		for i := range o.ops {
			bufs = append(bufs, o.ops[i].Buf)
		}
	}
	ar := &adoptingRequest{k: k, own: int(end - first.Off), adopted: got}
	fd := int(first.File.fd)
	if first.Write {
		return iouring.Pwritev(fd, bufs, first.Off).WithInfo(ar), ar
	}
	return iouring.Preadv(fd, bufs, uint64(first.Off)).WithInfo(ar), ar
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
