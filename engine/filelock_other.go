//go:build !unix

package engine

import "errors"

// osFileLocks: without Unix locks, permFS.Lock leaves locking to the file system's own Lock.
const osFileLocks = false

func fdFileID(uintptr) (fileID, error) { return fileID{}, errors.ErrUnsupported }

func lockFD(uintptr, bool) error { return errors.ErrUnsupported }
