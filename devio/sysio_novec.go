//go:build !(darwin || linux || openbsd)

package devio

import "errors"

const vectoredIO = false

var errNoVectoredIO = errors.New("vectored I/O unsupported")

func preadv(fd uintptr, bufs [][]byte, off int64) (int, error)  { return 0, errNoVectoredIO }
func pwritev(fd uintptr, bufs [][]byte, off int64) (int, error) { return 0, errNoVectoredIO }
