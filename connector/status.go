package connector

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/ucm-go/ucm/engine"
)

//go:generate go run ./internal/statuscodes/gen

// Status is one of UCM's store status codes (ucm/shared/infra/status), as the C ABI returns
// them. The codes are declared in status_codes.go, generated from the one table the C header
// and the Python package are generated from too (connector/internal/statuscodes).
type Status int32

// String returns the code's name as UCM spells it (EPARAM, ENOOBJ, ...), or Status(N) for a
// value that is not one of UCM's codes.
func (s Status) String() string {
	if name, ok := statusNames[s]; ok {
		return name
	}
	return fmt.Sprintf("Status(%d)", int32(s))
}

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
