// Package base holds what the engine and its internal parts share below both of them: the
// sentinel errors those parts return to the engine's callers. The engine re-exports each under
// its own name (engine.ErrClosed is base.ErrClosed: the same value, so errors.Is holds across
// the two names).
package base

import "errors"

// ErrClosed reports that the engine is closed or closing; an operation that meets it did
// nothing further.
var ErrClosed = errors.New("ucm: engine closed")
