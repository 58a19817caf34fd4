package devio

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
)

// ErrMisaligned is wrapped by the error of an operation on a direct file whose
// buffer address, length or offset is not a multiple of DefaultAlignment;
// such operations are rejected before reaching the kernel.
var ErrMisaligned = errors.New("misaligned direct I/O")

// ErrUnsupported is wrapped by NewBackend's error when the requested engine is
// not compiled in or cannot be used on this system.
var ErrUnsupported = errors.New("io engine unsupported")

// ErrClosed is returned by Submit on a closed Backend.
var ErrClosed = errors.New("devio: backend closed")

// DefaultQueueDepth is the queue depth NewBackend uses when given a
// non-positive one.
const DefaultQueueDepth = 64

// maxIOChunk bounds the bytes of a single syscall/SQE; longer operations are
// continued as short transfers.
const maxIOChunk = 1 << 30

// IOEngine selects a Backend implementation.
type IOEngine int

const (
	// EngineAuto (the zero value) selects io_uring when it is compiled in and
	// usable, and the pread/pwrite pool otherwise.
	EngineAuto IOEngine = iota
	// EngineURing selects io_uring; NewBackend fails with ErrUnsupported when
	// it is unavailable.
	EngineURing
	// EnginePsync selects the portable pread/pwrite worker pool.
	EnginePsync
)

// String returns "auto", "uring" or "psync" (or "IOEngine(n)" for invalid
// values); ParseIOEngine accepts the same strings.
func (e IOEngine) String() string {
	switch e {
	case EngineAuto:
		return "auto"
	case EngineURing:
		return "uring"
	case EnginePsync:
		return "psync"
	}
	return fmt.Sprintf("IOEngine(%d)", int(e))
}

// ParseIOEngine parses "auto", "uring" (alias "io_uring") or "psync"
// (case-insensitive, surrounding space ignored; "" means "auto").
func ParseIOEngine(s string) (IOEngine, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return EngineAuto, nil
	case "uring", "io_uring", "iouring":
		return EngineURing, nil
	case "psync":
		return EnginePsync, nil
	}
	return EngineAuto, fmt.Errorf("devio: invalid io engine %q (want auto, uring or psync)", s)
}

// Op is one read (Write false) or write (Write true) of all of Buf at offset
// Off in File. Submit sets N and Err.
type Op struct {
	File  *File
	Buf   []byte
	Off   int64
	Write bool
	// N is set by Submit to the number of bytes transferred; it equals
	// len(Buf) exactly when Err is nil.
	N int
	// Err is set by Submit to nil or to the operation's error, which names the
	// file path and offset and wraps the cause (ErrMisaligned,
	// io.ErrUnexpectedEOF, io.ErrShortWrite, a syscall.Errno, ...).
	Err error
}

// Backend runs batches of Ops.
//
// Submit returns when every op of the batch has completed (successfully or
// not); the kernel holds no reference to any Buf after it returns. Short
// transfers are continued until all of Buf is transferred: a read reaching
// end of file first fails with io.ErrUnexpectedEOF (N holds the bytes read),
// a write making no progress fails with io.ErrShortWrite. Every op's outcome is
// in its N and Err; Submit returns the error of the first failed op in slice
// order, or nil. Ops on files without a file descriptor use the file's
// ReadAt/WriteAt. Ops on direct files must have aligned Buf address, length and
// Off, else they fail with an error wrapping ErrMisaligned without being
// issued. Ops within a batch may run concurrently and in any order: a batch
// must not contain overlapping writes (or a read overlapping a write) that
// depend on ordering. Ops adjacent in the batch that continue each other in one
// file are issued as one vectored request (merge.go); the io_uring backend also
// issues a request waiting for its turn in the queue together with the request of
// another Submit that it continues in the file (adopt_linux.go). Each op's N and
// Err are still its own.
//
// A Backend is safe for concurrent use by many goroutines. Close waits for
// running Submits, releases the backend's resources and makes later Submits
// fail with ErrClosed; it is idempotent.
type Backend interface {
	Submit(ops []Op) error
	// Name returns "uring" or "psync".
	Name() string
	Close() error
}

// NewBackend builds the Backend for engine. queueDepth bounds the number of
// operations in flight across all concurrent Submits (DefaultQueueDepth when
// <= 0). EngineURing fails with an error wrapping ErrUnsupported when io_uring
// is not compiled in (build tag "uring") or cannot be set up (ENOSYS, EPERM,
// ...). EngineAuto tries io_uring and on failure logs one line through logger
// (nil: slog.Default()) and returns the psync backend.
func NewBackend(engine IOEngine, queueDepth int, logger *slog.Logger) (Backend, error) {
	if queueDepth <= 0 {
		queueDepth = DefaultQueueDepth
	}
	switch engine {
	case EnginePsync:
		return newPsync(queueDepth), nil
	case EngineURing:
		return newURing(queueDepth)
	case EngineAuto:
		b, err := newURing(queueDepth)
		if err == nil {
			return b, nil
		}
		if logger == nil {
			logger = slog.Default()
		}
		if uringCompiled {
			logger.Warn("devio: io_uring unavailable, using psync backend", "err", err)
		} else {
			logger.Debug("devio: io_uring not compiled in, using psync backend")
		}
		return newPsync(queueDepth), nil
	}
	return nil, fmt.Errorf("devio: invalid io engine %d", int(engine))
}

// prepareOp resets op's outputs and validates it. It returns false (with
// op.Err set) when the op must not be issued, and also false with op.Err nil
// for an empty op, which trivially succeeds.
func prepareOp(op *Op) bool {
	op.N, op.Err = 0, nil
	if op.File == nil {
		op.Err = errors.New("devio: op with nil File")
		return false
	}
	if op.File.direct && (op.Off%DefaultAlignment != 0 || !IsAligned(op.Buf)) {
		op.Err = opError(op, fmt.Errorf("%w (buffer %p len %d, offset %d; alignment %d)",
			ErrMisaligned, addrOf(op.Buf), len(op.Buf), op.Off, DefaultAlignment))
		return false
	}
	if op.Off < 0 {
		op.Err = opError(op, errors.New("negative offset"))
		return false
	}
	return len(op.Buf) > 0
}

func addrOf(b []byte) any {
	if cap(b) == 0 {
		return nil
	}
	return &b[:1][0]
}

// opError wraps err with op's direction, path and offset.
func opError(op *Op, err error) error {
	dir := "read"
	if op.Write {
		dir = "write"
	}
	return fmt.Errorf("devio: %s %s at offset %d (len %d): %w", dir, op.File.path, op.Off, len(op.Buf), err)
}

// runOp executes op synchronously in the calling goroutine (pread/pwrite on
// the descriptor, or ReadAt/WriteAt for files without one), continuing short
// transfers. It sets op.N and op.Err and returns op.Err.
func runOp(op *Op) error {
	if !prepareOp(op) {
		return op.Err
	}
	return transfer(op)
}

// transfer runs the untransferred rest of a prepared op (from op.N) synchronously, as runOp.
func transfer(op *Op) error {
	f := op.File
	useFd := f.hasFd() && rawFdIO
	retries := 0
	for op.N < len(op.Buf) {
		b := op.Buf[op.N:]
		if len(b) > maxIOChunk {
			b = b[:maxIOChunk]
		}
		off := op.Off + int64(op.N)
		var (
			n   int
			err error
		)
		switch {
		case useFd && op.Write:
			n, err = pwrite(f.fd, b, off)
		case useFd:
			n, err = pread(f.fd, b, off)
		case op.Write:
			n, err = f.file.WriteAt(b, off)
		default:
			n, err = f.file.ReadAt(b, off)
		}
		if n < 0 {
			n = 0
		}
		op.N += n
		if err != nil && useFd && isRetryable(err) && retries < 100 {
			retries++
			continue
		}
		if err == io.EOF && !op.Write {
			if op.N == len(op.Buf) {
				break
			}
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			op.Err = opError(op, err)
			break
		}
		if n == 0 {
			if op.Write {
				op.Err = opError(op, io.ErrShortWrite)
			} else {
				op.Err = opError(op, io.ErrUnexpectedEOF)
			}
			break
		}
	}
	runtime.KeepAlive(f.file)
	return op.Err
}

// firstErr returns the first op error in slice order.
func firstErr(ops []Op) error {
	for i := range ops {
		if ops[i].Err != nil {
			return ops[i].Err
		}
	}
	return nil
}
