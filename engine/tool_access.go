package engine

import "github.com/ucm-go/ucm/index"

// Index returns the store's index (segment table and block entries) for offline tools such as
// ucm-tool that inspect a store, normally one opened with Options.ReadOnly. Callers must not
// modify it or use it after Close.
func (e *Engine) Index() *index.Index { return e.ix }

// ReadOnly reports whether the engine writes nothing to the store: it was opened with
// Options.ReadOnly, or Open switched to read-only because the store's file system had no room
// for the index to open for writing (Failed says why). A read-only engine ran no recovery:
// segments a crash left active are served as they are (up to their last valid record) and
// recovered by the next read-write Open with room.
func (e *Engine) ReadOnly() bool { return e.opts.ReadOnly }
