package cliutil

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/ucm-go/ucm/connector/ucmconfig"
)

// ParsedFlag is a flag whose text is parsed into *dst as the command line is read (and when a
// default is set with Flags().Set): a bad value fails the command before it runs, with cobra's
// message naming the flag and the value (exit status 2).
type ParsedFlag[T any] struct {
	dst   *T
	text  string
	kind  string
	parse func(string) (T, error)
}

// NewParsedFlag makes a ParsedFlag of the given kind (shown in help) holding def, parsed now.
// A default that does not parse is a programming error: it panics.
func NewParsedFlag[T any](dst *T, kind, def string, parse func(string) (T, error)) *ParsedFlag[T] {
	f := &ParsedFlag[T]{dst: dst, kind: kind, parse: parse}
	if err := f.Set(def); err != nil {
		panic(fmt.Sprintf("flag default %q: %v", def, err))
	}
	return f
}

// String is the flag's text as last set (the default until the command line sets it).
func (f *ParsedFlag[T]) String() string { return f.text }

// Type is the kind shown in help ("size", "duration", ...).
func (f *ParsedFlag[T]) Type() string { return f.kind }

// Set parses s into the destination; on an error the destination and the text are unchanged.
func (f *ParsedFlag[T]) Set(s string) error {
	v, err := f.parse(s)
	if err != nil {
		return err
	}
	*f.dst, f.text = v, s
	return nil
}

var _ pflag.Value = (*ParsedFlag[int])(nil)

// SizeFlag is a size flag (bytes, or K/KiB, M/MiB, G/GiB, T/TiB: ucmconfig.ParseSize) into *dst.
func SizeFlag(dst *int64, def string) *ParsedFlag[int64] {
	return NewParsedFlag(dst, "size", def, ucmconfig.ParseSize)
}

// ParseSizeOrAuto is ucmconfig.ParseSize, with "auto" for 0 (the engine's choice).
func ParseSizeOrAuto(s string) (int64, error) {
	if s == "auto" {
		return 0, nil
	}
	return ucmconfig.ParseSize(s)
}
