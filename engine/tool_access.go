package engine

import "github.com/ucm-go/ucm/index"

// Index returns the store's index (segment table and block entries) for offline tools such as
// ucm-tool that inspect a store, normally one opened with Options.ReadOnly. Callers must not
// modify it or use it after Close.
func (e *Engine) Index() *index.Index { return e.ix }
