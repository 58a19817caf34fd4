//go:build !linux

package devio

import "errors"

var errNoAllocate = errors.New("fallocate unsupported")

func allocate(fd uintptr, size int64) error { return errNoAllocate }
func truncate(fd uintptr, size int64) error { return errNoAllocate }
