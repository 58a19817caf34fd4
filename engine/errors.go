package engine

import (
	"errors"
	"fmt"

	"github.com/ucm-go/ucm/engine/internal/base"
	"github.com/ucm-go/ucm/format"
)

// Sentinel errors. Every error the engine returns wraps at most one of them and names the block,
// path or field at fault; test with errors.Is.
var (
	// ErrNotFound: the block is not in the store (a miss).
	ErrNotFound = errors.New("ucm: block not found")
	// ErrInvalidArgument: the caller passed something unusable (zero id, wrong buffer size,
	// shard out of range, bad option). Nothing stored is affected.
	ErrInvalidArgument = format.ErrInvalid
	// ErrNoSpace: the file system is full or a configured bound (staging memory) is reached.
	ErrNoSpace = errors.New("ucm: no space")
	// ErrCorrupt: bytes on disk failed a check. For a load this is a miss: the block is
	// dropped from the index and never returned.
	ErrCorrupt = format.ErrCorrupt
	// ErrClosed: the engine is closed or closing (the value of engine/internal/base, which
	// the engine's internal parts return).
	ErrClosed = base.ErrClosed
	// ErrTimeout: a task did not finish within its timeout; it was cancelled.
	ErrTimeout = errors.New("ucm: timeout")
	// ErrSchemaMismatch: the store was written under another schema (model, dtype, layout,
	// TP, block size, hash scheme) and refuses to serve its bytes.
	ErrSchemaMismatch = errors.New("ucm: schema mismatch")
	// ErrLocked: another process (or engine) holds the store directory.
	ErrLocked = errors.New("ucm: store locked")
	// ErrBlockFailed: a layer-wise dump of the block failed on another shard, so the block is
	// discarded; it is never published with holes.
	ErrBlockFailed = errors.New("ucm: block failed")
	// ErrBufferChanged: a loaded block's bytes failed their checksum in the caller's
	// destination memory but verify when the engine reads them again into its own: the caller
	// changed the buffer during the load (two loads into one buffer, a LoadSpans piece listed
	// twice). The block stays stored; this load of it failed, and the buffer's contents are
	// unspecified.
	ErrBufferChanged = errors.New("ucm: destination buffer changed during the load")
	// ErrIO: the file system failed an operation (EIO, a failed fsync). The segment concerned
	// is sealed; the engine stays usable.
	ErrIO = errors.New("ucm: i/o error")
)

// errLookupOnly fails what a lookup-only instance (Options.LookupOnly) does not do.
var errLookupOnly = fmt.Errorf("lookup-only instance: it serves lookups, not data: %w", ErrInvalidArgument)

// blockErr wraps kind with the block id and a detail.
func blockErr(kind error, id BlockID, format string, args ...any) error {
	return fmt.Errorf("block %s: %s: %w", id, fmt.Sprintf(format, args...), kind)
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
