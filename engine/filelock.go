package engine

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Every lock the engine takes on a file of the operating system (the store directory's LOCK,
// the index's and the foreign index's Pebble LOCK files, each tier path's or shared
// namespace's LOCK) goes through permFS.Lock and lockFile. A lock belongs to the file, not to
// the path naming it: inside the process a table keyed by the file's device and inode refuses
// a second lock however the path is spelled (relative, absolute, through a symbolic link,
// "link/."), and across processes the lock is an open file description lock (Linux's
// F_OFD_SETLK; flock elsewhere, or where the kernel lacks OFD locks), which two descriptors of
// one process also contend for and which closing another descriptor of the file never
// releases (a classic fcntl lock is the process's: a second Open in the same process would
// get it again, and closing either engine would drop it for both).

// fileID names a file whatever path leads to it.
type fileID struct{ dev, ino uint64 }

// errLockHeld: this process already holds a lock on the file (perhaps through another path).
var errLockHeld = errors.New("lock held by this process")

// processLocks is what this process holds through lockFile: per file, -1 for an exclusive lock,
// else the number of shared ones.
var processLocks struct {
	sync.Mutex
	held map[fileID]int
}

// fileLock is a lock taken by lockFile; Close releases it (once).
type fileLock struct {
	f      vfs.File
	id     fileID
	closed bool
}

// Close closes the locked descriptor, which releases the lock, and forgets it in this process.
func (l *fileLock) Close() error {
	processLocks.Lock()
	defer processLocks.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	err := l.f.Close()
	if n := processLocks.held[l.id]; n > 1 {
		processLocks.held[l.id] = n - 1
	} else {
		delete(processLocks.held, l.id)
	}
	return err
}

// lockFile locks f, an open file of the operating system that name names: exclusively, or
// shared (a read-only open of a store it cannot write). A lock held by this process or another
// fails with an error isLockHeld recognises; f is the caller's to close on error, and the
// returned lock's once locked.
func lockFile(f vfs.File, name string, exclusive bool) (io.Closer, error) {
	fd := f.Fd()
	id, err := fdFileID(fd)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	processLocks.Lock()
	defer processLocks.Unlock()
	if n := processLocks.held[id]; n < 0 || (n > 0 && exclusive) {
		return nil, fmt.Errorf("lock %s: %w", name, errLockHeld)
	}
	if err := lockFD(fd, exclusive); err != nil {
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	if processLocks.held == nil {
		processLocks.held = map[fileID]int{}
	}
	if exclusive {
		processLocks.held[id] = -1
	} else {
		processLocks.held[id]++
	}
	return &fileLock{f: f, id: id}, nil
}
