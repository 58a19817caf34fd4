package model

import (
	"errors"
	"fmt"
)

// Sentinel errors, for errors.Is.
var (
	// ErrCorrupt: a weights file or manifest that cannot be what train.py writes (bad magic,
	// version, field out of range, tensor table inconsistent, data out of bounds, non-finite
	// weight). The error is a *FormatError naming the field or tensor.
	ErrCorrupt = errors.New("model: corrupt weights")
	// ErrChecksum: the weights file's sha256 differs from the one in its manifest.
	ErrChecksum = errors.New("model: weights checksum mismatch")
	// ErrInvalid: a bad argument (token out of the vocabulary, positions not contiguous, cache
	// shape not matching the model, block id out of range).
	ErrInvalid = errors.New("model: invalid argument")
	// ErrNoBlocks: the KV cache has no free block left, or a sequence's block table is too
	// short for the positions asked.
	ErrNoBlocks = errors.New("model: out of KV cache blocks")
)

// FormatError is a problem in a weights file: the field or tensor at fault and what is wrong.
// It wraps ErrCorrupt.
type FormatError struct {
	// Field names the header field ("version", "d_model", ...) or the tensor ("layers.0.wq"),
	// with the part of its table entry at fault when that helps ("layers.0.wq: shape").
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error returns "model: corrupt weights: FIELD: MSG".
func (e *FormatError) Error() string { return fmt.Sprintf("%v: %s: %s", ErrCorrupt, e.Field, e.Msg) }

// Unwrap returns ErrCorrupt.
func (e *FormatError) Unwrap() error { return ErrCorrupt }

func corrupt(field, format string, args ...any) error {
	return &FormatError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func errorsJoin(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
