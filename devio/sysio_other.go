//go:build !unix

package devio

import "errors"

var errNoRawIO = errors.New("raw descriptor I/O unsupported")

func pread(fd uintptr, b []byte, off int64) (int, error)  { return 0, errNoRawIO }
func pwrite(fd uintptr, b []byte, off int64) (int, error) { return 0, errNoRawIO }

const rawFdIO = false

func isRetryable(err error) bool { return false }
