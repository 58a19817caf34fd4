//go:build !(linux && uring)

package devio

import "fmt"

// uringCompiled reports whether the io_uring backend is compiled in.
const uringCompiled = false

func newURing(queueDepth int) (Backend, error) {
	return nil, fmt.Errorf("%w: io_uring backend not compiled in (build with -tags uring -ldflags=-checklinkname=0 on linux)", ErrUnsupported)
}
