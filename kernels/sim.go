package kernels

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ucm-go/ucm/internal/memcopy"
	"github.com/ucm-go/ucm/internal/par"
)

// SimOptions configures a simulated device. The zero value is a device with unlimited memory
// (bounded by the host) and an unlimited link.
type SimOptions struct {
	// Name names the device in messages and reports; default "sim0".
	Name string
	// MemoryBytes caps the bytes of live allocations; 0 means no cap beyond the host's memory.
	MemoryBytes int64
	// LinkBytesPerSec models the host link's bandwidth, per direction (host to device and
	// device to host are independent, as on PCIe). A host copy operation of n bytes occupies
	// its direction for LinkLatency + n/LinkBytesPerSec, operations of all streams queue for
	// the link, and the operation completes no sooner than its slot ends (the real memcpy runs
	// inside the slot). 0 means unlimited: operations take what the memcpy takes.
	// Device-to-device copies and launched functions never use the link.
	LinkBytesPerSec float64
	// LinkLatency is the modelled fixed cost of each host copy operation (a whole gather or
	// scatter is one operation). It applies even when LinkBytesPerSec is 0.
	LinkLatency time.Duration
	// CopyThreads is the most goroutines a copy operation of at least 4 MiB is split across;
	// default min(GOMAXPROCS, 4). 1 copies on the stream's goroutine only.
	CopyThreads int
}

// parallelMinBytes is the size from which a copy operation is split across CopyThreads.
const parallelMinBytes = 4 << 20

// parallelChunkBytes is about how much of a split operation one goroutine claims at a time.
const parallelChunkBytes = 1 << 20

// NewSimDevice returns a simulated device: its memory is host memory, its streams are
// goroutines that run real copies in order, and SimOptions can model the host link so the
// overlap of copies with compute can be measured.
func NewSimDevice(opts SimOptions) (*Device, error) {
	if opts.Name == "" {
		opts.Name = "sim0"
	}
	switch {
	case opts.MemoryBytes < 0:
		return nil, errorf(ErrInvalid, "sim device %q: MemoryBytes %d is negative", opts.Name, opts.MemoryBytes)
	case opts.LinkBytesPerSec < 0 || opts.LinkBytesPerSec != opts.LinkBytesPerSec:
		return nil, errorf(ErrInvalid, "sim device %q: LinkBytesPerSec %v is not a rate", opts.Name, opts.LinkBytesPerSec)
	case opts.LinkLatency < 0:
		return nil, errorf(ErrInvalid, "sim device %q: LinkLatency %v is negative", opts.Name, opts.LinkLatency)
	case opts.CopyThreads < 0 || opts.CopyThreads > 256:
		return nil, errorf(ErrInvalid, "sim device %q: CopyThreads %d outside [0, 256]", opts.Name, opts.CopyThreads)
	}
	if opts.CopyThreads == 0 {
		opts.CopyThreads = min(runtime.GOMAXPROCS(0), 4)
	}
	return &Device{opts: opts, closed: make(chan struct{}), streams: map[*Stream]struct{}{}}, nil
}

// simLink is one direction of the modelled host link: a FIFO of time slots.
type simLink struct {
	mu        sync.Mutex
	busyUntil time.Time
}

// reserve books n bytes on the link and returns when the transfer ends; the zero time when the
// link is not modelled.
func (d *Device) reserve(l *simLink, n int64) time.Time {
	if d.opts.LinkBytesPerSec == 0 && d.opts.LinkLatency == 0 {
		return time.Time{}
	}
	cost := d.opts.LinkLatency
	if d.opts.LinkBytesPerSec > 0 {
		cost += time.Duration(float64(n) / d.opts.LinkBytesPerSec * float64(time.Second))
	}
	now := time.Now()
	l.mu.Lock()
	start := l.busyUntil
	if start.Before(now) {
		start = now
	}
	l.busyUntil = start.Add(cost)
	end := l.busyUntil
	l.mu.Unlock()
	return end
}

// sleepUntil waits until t or until the device closes.
func (d *Device) sleepUntil(t time.Time) {
	if t.IsZero() {
		return
	}
	wait := time.Until(t)
	if wait <= 0 {
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-d.closed:
	}
}

// parallel runs fn over [0, n) (n pieces of an operation moving bytes in all), on this
// goroutine and, when the operation moves at least parallelMinBytes, up to CopyThreads-1
// helpers claiming chunks of about parallelChunkBytes as they get a CPU (par.Chunks: a
// helper that starts late finds the work done rather than delaying the operation).
func (d *Device) parallel(bytes int64, n int, fn func(lo, hi int)) {
	if d.opts.CopyThreads <= 1 || bytes < parallelMinBytes || n <= 1 {
		fn(0, n)
		return
	}
	grain := max(1, int(int64(n)*parallelChunkBytes/bytes))
	par.Chunks(n, grain, d.opts.CopyThreads, fn)
}

// copyBytes copies src into dst (equal lengths, host and device memory, so never
// overlapping), split across goroutines when large; copies of memcopy.MinOp bytes or more write
// around the caches (memcopy.Stream), as the transfers do.
func (d *Device) copyBytes(dst, src []byte) {
	const chunk = 1 << 20
	n := (len(src) + chunk - 1) / chunk
	stream := len(src) >= memcopy.MinOp
	d.parallel(int64(len(src)), n, func(lo, hi int) {
		a, b := lo*chunk, min(hi*chunk, len(src))
		if stream {
			memcopy.Stream(dst[a:b], src[a:b])
			memcopy.Fence()
			return
		}
		copy(dst[a:b], src[a:b])
	})
}

func addrOf(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// direction of a copy over the host link.
type direction uint8

const (
	linkNone direction = iota
	linkH2D
	linkD2H
)

// streamOp is one unit of work in a stream.
type streamOp struct {
	name   string
	dir    direction
	bytes  int64
	run    func() error // the work; nil for markers
	record *streamMark  // completed when the stream reaches the op
	wait   *streamMark  // the stream blocks until it completes
	sync   bool         // record clears the stream's error (Synchronize)
	notify func(error)  // always called once, with the stream's error state at this point
	pins   []*Staging   // host staging buffers kept mapped until the op is done
}

// streamMark is one recorded point of a stream: done is closed when the stream passes it.
type streamMark struct {
	done chan struct{}
	err  error // the stream's error when it passed, set before done is closed
}

func newStreamMark() *streamMark { return &streamMark{done: make(chan struct{})} }

func (m *streamMark) complete(err error) {
	m.err = err
	close(m.done)
}

// Stream is an ordered queue of device work, like a CUDA stream: operations enqueued on one
// stream run one after another in enqueue order, on the stream's own goroutine; different
// streams run concurrently. Enqueueing never blocks.
//
// Errors are sticky until synchronised: when an operation fails, the operations after it on
// the stream are skipped (their results are unspecified), events recorded after it report the
// error, and the next Synchronize (or Close) returns the first error and clears it. Bounds
// and argument errors are reported by the enqueueing call itself and enqueue nothing.
type Stream struct {
	dev    *Device
	exited chan struct{}

	mu       sync.Mutex
	cond     *sync.Cond
	q        []streamOp
	busy     bool // an op is running
	err      error
	closing  bool // Close called: no new ops
	released bool // the goroutine has exited
}

// NewStream starts a stream on the device.
func (d *Device) NewStream() (*Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isDown {
		return nil, d.errClosed()
	}
	s := &Stream{dev: d, exited: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	d.streams[s] = struct{}{}
	go s.loop()
	return s, nil
}

func (s *Stream) enqueue(o streamOp) error {
	s.mu.Lock()
	if s.closing || s.released {
		s.mu.Unlock()
		unpin(o.pins)
		return errorf(ErrNoDevice, "stream closed")
	}
	select {
	case <-s.dev.closed:
		s.mu.Unlock()
		unpin(o.pins)
		return s.dev.errClosed()
	default:
	}
	s.q = append(s.q, o)
	s.cond.Signal()
	s.mu.Unlock()
	return nil
}

func (s *Stream) loop() {
	defer close(s.exited)
	for {
		s.mu.Lock()
		// While busy, Synchronize is running queued copies on its own goroutine (syncInline).
		for !s.down() && (s.busy || len(s.q) == 0 && !s.closing) {
			s.cond.Wait()
		}
		if s.down() || (len(s.q) == 0 && s.closing) {
			q := s.q
			s.q = nil
			s.released = true
			s.mu.Unlock()
			s.abandon(q)
			s.dev.mu.Lock()
			delete(s.dev.streams, s)
			s.dev.mu.Unlock()
			return
		}
		o := s.q[0]
		s.q[0] = streamOp{}
		s.q = s.q[1:]
		if len(s.q) == 0 {
			s.q = s.q[:0:0] // drop the consumed backing array
		}
		s.busy = true
		err := s.err
		s.mu.Unlock()

		err = s.exec(o, err)

		s.mu.Lock()
		s.busy = false
		if o.sync {
			s.err = nil
		} else if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
		// Completed after the state update, so that a Synchronize returning sees the stream
		// idle in Query.
		if o.record != nil {
			o.record.complete(err)
		}
		if o.notify != nil {
			o.notify(err)
		}
	}
}

// isClosed reports whether Close was called on the stream or its goroutine has exited.
func (s *Stream) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing || s.released
}

func (s *Stream) down() bool {
	select {
	case <-s.dev.closed:
		return true
	default:
		return false
	}
}

// exec runs one op's wait and work given the stream's error state and returns the new error
// state; the loop then completes its record and notify.
func (s *Stream) exec(o streamOp, err error) error {
	defer unpin(o.pins)
	if o.wait != nil {
		select {
		case <-o.wait.done:
			if err == nil && o.wait.err != nil {
				err = fmt.Errorf("waited event: %w", o.wait.err)
			}
		case <-s.dev.closed:
			err = s.dev.errClosed()
		}
	}
	if o.run != nil && err == nil {
		var end time.Time
		switch o.dir {
		case linkH2D:
			end = s.dev.reserve(&s.dev.h2d, o.bytes)
		case linkD2H:
			end = s.dev.reserve(&s.dev.d2h, o.bytes)
		}
		err = runOp(o)
		s.dev.sleepUntil(end)
	}
	return err
}

// runOp runs an op's work, turning a panic of a launched function into its error.
func runOp(o streamOp) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s panicked: %v", o.name, r)
		}
	}()
	if err := o.run(); err != nil {
		return fmt.Errorf("%s: %w", o.name, err)
	}
	return nil
}

// abandon fails the ops left when the device or stream goes away.
func (s *Stream) abandon(q []streamOp) {
	err := errorf(ErrNoDevice, "stream closed")
	if s.down() {
		err = s.dev.errClosed()
	}
	for _, o := range q {
		unpin(o.pins)
		if o.record != nil {
			o.record.complete(err)
		}
		if o.notify != nil {
			o.notify(err)
		}
	}
}

// CopyH2D enqueues a copy of src (host) into dst (device). len(src) must equal dst.Len(). src
// must not be modified until the copy has run (synchronise with the stream or an event).
func (s *Stream) CopyH2D(dst Span, src []byte) error {
	d, err := dst.resolve(s.dev)
	if err != nil {
		return fmt.Errorf("copy h2d: %w", err)
	}
	if int64(len(src)) != dst.n {
		return errorf(ErrInvalid, "copy h2d: %d host bytes into %v", len(src), dst)
	}
	return s.enqueue(streamOp{name: "copy h2d", dir: linkH2D, bytes: dst.n, pins: pinHost(src),
		run: func() error { s.dev.copyBytes(d, src); return nil }})
}

// CopyD2H enqueues a copy of src (device) into dst (host). len(dst) must equal src.Len(). dst
// must not be read or released until the copy has run.
func (s *Stream) CopyD2H(dst []byte, src Span) error {
	sb, err := src.resolve(s.dev)
	if err != nil {
		return fmt.Errorf("copy d2h: %w", err)
	}
	if int64(len(dst)) != src.n {
		return errorf(ErrInvalid, "copy d2h: %v into %d host bytes", src, len(dst))
	}
	return s.enqueue(streamOp{name: "copy d2h", dir: linkD2H, bytes: src.n, pins: pinHost(dst),
		run: func() error { s.dev.copyBytes(dst, sb); return nil }})
}

// CopyD2D enqueues a copy between device spans of equal length (they may overlap: the copy
// behaves like memmove).
func (s *Stream) CopyD2D(dst, src Span) error {
	db, err := dst.resolve(s.dev)
	if err != nil {
		return fmt.Errorf("copy d2d: %w", err)
	}
	sb, err := src.resolve(s.dev)
	if err != nil {
		return fmt.Errorf("copy d2d: %w", err)
	}
	if dst.n != src.n {
		return errorf(ErrInvalid, "copy d2d: %v into %v", src, dst)
	}
	return s.enqueue(streamOp{name: "copy d2d", bytes: src.n, run: func() error { copy(db, sb); return nil }})
}

// Launch enqueues fn to run on the stream in order, like a kernel launch or
// cudaLaunchHostFunc: it starts after every earlier operation of the stream has finished, and
// later operations start after it returns. An error (or panic) from fn is the stream's error,
// named by name.
func (s *Stream) Launch(name string, fn func() error) error {
	if fn == nil {
		return errorf(ErrInvalid, "launch %q: nil function", name)
	}
	return s.enqueue(streamOp{name: name, run: fn})
}

// Record captures the current end of the stream in e: e completes when the stream has run
// everything enqueued before Record. Recording again moves e to the new point.
func (s *Stream) Record(e *Event) error {
	if e == nil || e.dev != s.dev {
		return errorf(ErrInvalid, "record: event of another device")
	}
	m := newStreamMark()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := s.enqueue(streamOp{name: "record", record: m}); err != nil {
		return err
	}
	e.cur = m
	return nil
}

// WaitEvent makes the stream's later operations wait until e's most recent Record (at the time
// of the call) has completed; an event never recorded is complete. When e carries an error
// (its stream had failed), the error becomes this stream's too.
func (s *Stream) WaitEvent(e *Event) error {
	if e == nil || e.dev != s.dev {
		return errorf(ErrInvalid, "wait event: event of another device")
	}
	e.mu.Lock()
	m := e.cur
	e.mu.Unlock()
	if m == nil {
		return nil
	}
	return s.enqueue(streamOp{name: "wait event", wait: m})
}

// notify enqueues fn, called exactly once, on the stream's goroutine when the stream reaches
// this point, with the stream's error state (or ErrNoDevice when the stream or device closes
// first). Internal: the transfer kernels and pipelines use it to learn when a copy is done.
func (s *Stream) notify(fn func(error)) error {
	return s.enqueue(streamOp{name: "notify", notify: fn})
}

// Synchronize waits until every operation enqueued before the call has run, and returns the
// stream's first error since the previous Synchronize (clearing it).
func (s *Stream) Synchronize() error {
	if done, err := s.syncInline(); done {
		return err
	}
	m := newStreamMark()
	if err := s.enqueue(streamOp{name: "synchronize", record: m, sync: true}); err != nil {
		return err
	}
	<-m.done
	return m.err
}

// syncInline is Synchronize's fast path: when the stream is idle and every operation queued on
// it is a plain copy (a gather, scatter or CopyD2H/H2D with no event to wait for and no
// callback), it runs them in order on the calling goroutine, which would only wait for them
// otherwise, and then returns the stream's error state, clearing it, with done true. The
// stream's goroutine, woken for those copies, finds the stream busy and waits. It returns done
// false, having run none or some of the copies, as soon as the next operation is anything else
// or the stream is running one itself (Synchronize then waits for the stream as usual): on a
// machine where the stream's goroutine runs on another thread, handing each copy over and its
// completion back costs two thread wake-ups, which at a few MiB per copy were a tenth of it.
func (s *Stream) syncInline() (done bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.busy || s.closing || s.released || s.down() {
			return false, nil
		}
		if len(s.q) == 0 {
			err, s.err = s.err, nil
			return true, err
		}
		o := s.q[0]
		if o.run == nil || o.dir == linkNone || o.wait != nil || o.notify != nil || o.record != nil {
			return false, nil
		}
		s.q[0] = streamOp{}
		s.q = s.q[1:]
		if len(s.q) == 0 {
			s.q = s.q[:0:0]
		}
		s.busy = true
		prev := s.err
		s.mu.Unlock()
		err := s.exec(o, prev)
		s.mu.Lock()
		s.busy = false
		if s.err == nil {
			s.err = err
		}
		if len(s.q) > 0 || s.closing {
			s.cond.Broadcast() // the stream's goroutine waited while this one ran
		}
	}
}

// Query reports whether the stream has run everything enqueued so far, without blocking, and
// its current error state (not cleared).
func (s *Stream) Query() (done bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return true, errorf(ErrNoDevice, "stream closed")
	}
	return len(s.q) == 0 && !s.busy, s.err
}

// Close waits for the work already enqueued, stops the stream's goroutine and returns the
// stream's first unsynchronised error. Later operations on the stream fail with ErrNoDevice.
// Closing twice returns nil.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closing || s.released {
		s.mu.Unlock()
		<-s.exited
		return nil
	}
	s.closing = true
	s.cond.Broadcast()
	s.mu.Unlock()
	<-s.exited
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// Event marks a point in a stream (Stream.Record) that host code can wait for (Synchronize,
// Query) and other streams can wait for (Stream.WaitEvent). An event never recorded is
// complete. Events are safe for concurrent use.
type Event struct {
	dev *Device
	mu  sync.Mutex
	cur *streamMark
}

// NewEvent returns an unrecorded event of the device.
func (d *Device) NewEvent() (*Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isDown {
		return nil, d.errClosed()
	}
	return &Event{dev: d}, nil
}

// Synchronize waits until the event's most recent Record has completed and returns the
// stream's error at that point (nil when every operation before it succeeded), or ErrNoDevice
// when the device closes first.
func (e *Event) Synchronize() error {
	e.mu.Lock()
	m := e.cur
	e.mu.Unlock()
	if m == nil {
		return nil
	}
	<-m.done
	return m.err
}

// Query reports without blocking whether the event's most recent Record has completed, and if
// so the error Synchronize would return.
func (e *Event) Query() (done bool, err error) {
	e.mu.Lock()
	m := e.cur
	e.mu.Unlock()
	if m == nil {
		return true, nil
	}
	select {
	case <-m.done:
		return true, m.err
	default:
		return false, nil
	}
}
