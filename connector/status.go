package connector

import (
	"errors"
	"io/fs"
	"os"
	"syscall"

	"github.com/ucm-go/ucm/engine"
)

// Status is one of UCM's store status codes (ucm/shared/status), as the C ABI returns them.
type Status int32

// UCM's status codes.
const (
	StatusOK           Status = 0
	StatusError        Status = -1
	StatusEParam       Status = -50000 // bad argument: sizes, addresses, shard index, handle
	StatusEOOM         Status = -50001 // out of memory (staging)
	StatusEOSError     Status = -50002 // the file system failed an operation
	StatusEDuplicate   Status = -50003 // the same block twice in one call, or created twice
	StatusERetry       Status = -50004 // try again (store directory locked by another process)
	StatusENoObj       Status = -50005 // no such block or task
	StatusESerialize   Status = -50006
	StatusEDeserialize Status = -50007 // stored bytes failed a check (the block is dropped)
	StatusEUnsupported Status = -50008 // schema mismatch, or an operation this role does not do
	StatusENoSpace     Status = -50009 // no space on the tier or in staging memory
	StatusETimeout     Status = -50010 // the task outlived timeout_ms and was cancelled
)

// Connector errors beside the engine's (engine.ErrNotFound and the others, which keep their
// meaning here).
var (
	// ErrUnknownTask: a task handle that was never returned, or was already consumed by Wait.
	ErrUnknownTask = errors.New("ucmgo: unknown task")
	// ErrDuplicate: one call names the same block (and shard) twice.
	ErrDuplicate = errors.New("ucmgo: duplicate block id")
)

// statusOf maps the sentinel an error wraps to its status; the first match wins, so the more
// specific sentinels come first.
var statusOf = []struct {
	err    error
	status Status
}{
	{ErrUnknownTask, StatusENoObj},
	{ErrDuplicate, StatusEDuplicate},
	{engine.ErrExists, StatusEDuplicate},
	{engine.ErrTimeout, StatusETimeout},
	{engine.ErrNoSpace, StatusENoSpace},
	{engine.ErrLocked, StatusERetry},
	{engine.ErrSchemaMismatch, StatusEUnsupported},
	{engine.ErrCorrupt, StatusEDeserialize},
	{engine.ErrNotFound, StatusENoObj},
	{engine.ErrIO, StatusEOSError},
	{engine.ErrInvalidArgument, StatusEParam},
}

// StatusOf returns the status code for err: StatusOK for nil, the code of the sentinel it wraps;
// else StatusEOSError when it comes from the operating system (an *fs.PathError, *os.LinkError,
// *os.SyscallError or syscall.Errno in its chain, or fs.ErrPermission: a directory without
// permission, EIO, a path through a file); else StatusError.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	for _, s := range statusOf {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	if fromOS(err) {
		return StatusEOSError
	}
	return StatusError
}

// fromOS reports whether err's chain holds an error of the operating system.
func fromOS(err error) bool {
	var (
		path  *fs.PathError
		link  *os.LinkError
		call  *os.SyscallError
		errno syscall.Errno
	)
	return errors.As(err, &path) || errors.As(err, &link) || errors.As(err, &call) || errors.As(err, &errno) ||
		errors.Is(err, fs.ErrPermission)
}
