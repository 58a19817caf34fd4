package cli

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/ucm-go/ucm/connector/ucmconfig"
)

// parsedFlag is a flag whose text is parsed into *dst as the command line is read (and when a
// default is set with Flags().Set): a bad value fails the command before it runs, with cobra's
// message naming the flag and the value (exit status 2).
type parsedFlag[T any] struct {
	dst   *T
	text  string
	kind  string
	parse func(string) (T, error)
}

// newParsedFlag makes a parsedFlag of the given kind (shown in help) holding def, parsed now.
// A default that does not parse is a programming error: it panics.
func newParsedFlag[T any](dst *T, kind, def string, parse func(string) (T, error)) *parsedFlag[T] {
	f := &parsedFlag[T]{dst: dst, kind: kind, parse: parse}
	if err := f.Set(def); err != nil {
		panic(fmt.Sprintf("flag default %q: %v", def, err))
	}
	return f
}

func (f *parsedFlag[T]) String() string { return f.text }
func (f *parsedFlag[T]) Type() string   { return f.kind }

func (f *parsedFlag[T]) Set(s string) error {
	v, err := f.parse(s)
	if err != nil {
		return err
	}
	*f.dst, f.text = v, s
	return nil
}

var _ pflag.Value = (*parsedFlag[int])(nil)

// sizeFlag is a size flag (bytes, or K/KiB, M/MiB, G/GiB, T/TiB: ucmconfig.ParseSize) into *dst.
func sizeFlag(dst *int64, def string) *parsedFlag[int64] {
	return newParsedFlag(dst, "size", def, ucmconfig.ParseSize)
}

// parseSizeOrAuto is ucmconfig.ParseSize, with "auto" for 0 (the engine's choice).
func parseSizeOrAuto(s string) (int64, error) {
	if s == "auto" {
		return 0, nil
	}
	return ucmconfig.ParseSize(s)
}
