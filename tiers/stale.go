package tiers

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// staleOpens is how many times ReadReplaced opens a file: the first open and the reopens after
// ESTALE.
const staleOpens = 8

// staleBackoff is the pause before the first reopen after ESTALE, doubled before each next
// one (1.27 s in all over staleOpens): a GlusterFS client can keep resolving the path to the
// replaced file for some time after another client's rename.
const staleBackoff = 10 * time.Millisecond

// ReadReplaced opens path and reads it with read, opening it again when the file system
// answers ESTALE to the open or to a read. The shared tier's small files (manifests, the lease,
// summaries) are replaced by rename; a distributed file system's client (NFS, GlusterFS) may
// still hold the handle of the file a rename replaced, on which it answers ESTALE, and a new
// open resolves the path again. After staleOpens opens the last error is returned, wrapping
// syscall.ESTALE. Other errors are returned at once, as the open or read gave them.
func ReadReplaced(fs vfs.FS, path string, read func(vfs.File) error) error {
	var err error
	for k := range staleOpens {
		if k > 0 {
			time.Sleep(staleBackoff << (k - 1))
		}
		var f vfs.File
		if f, err = fs.Open(path); err == nil {
			err = read(f)
			_ = f.Close()
		}
		if !errors.Is(err, syscall.ESTALE) {
			return err
		}
	}
	return fmt.Errorf("%s: stale after %d opens: %w", path, staleOpens, err)
}

// MkdirAllStale is fs.MkdirAll, tried again when the file system answers ESTALE: on a
// distributed file system (GlusterFS's distributed volumes, NFS) a directory another client
// just created or renamed beside it can leave this client's handle of the parent stale, and a
// new lookup resolves it. After staleOpens tries the last error is returned, wrapping
// syscall.ESTALE. Other errors are returned at once.
func MkdirAllStale(fs vfs.FS, dir string, perm os.FileMode) error {
	var err error
	for range staleOpens {
		if err = fs.MkdirAll(dir, perm); !errors.Is(err, syscall.ESTALE) {
			return err
		}
	}
	return fmt.Errorf("%s: stale after %d tries: %w", dir, staleOpens, err)
}
