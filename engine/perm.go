package engine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Default permissions of what a store creates (Options.FileMode, Options.DirMode): the owner
// reads and writes, its group reads, others nothing.
const (
	DefaultFileMode os.FileMode = 0o640
	DefaultDirMode  os.FileMode = 0o750
)

// permFS is the file system every store file goes through: files and directories it creates
// get exactly the configured modes, whatever the process's umask (a umask of 000 would
// otherwise leave segments, the index and LOCK world-writable). Existing files keep theirs.
// File systems without file descriptors (in-memory ones in tests) have no modes to set.
//
// A read-only engine's permFS also locks stores it cannot write: where the LOCK file cannot be
// opened for writing (a read-only file system, or a file the user may only read), it takes a
// shared read lock through a read-only descriptor instead, which a writer's lock excludes; a
// read-only store without a LOCK file (nobody ever wrote it from here) is opened unlocked.
type permFS struct {
	vfs.FS
	file, dir os.FileMode
	readOnly  bool
}

// storeFS wraps fs for an engine: what it creates gets the modes file and dir; readOnly is
// Options.ReadOnly.
func storeFS(fs vfs.FS, file, dir os.FileMode, readOnly bool) vfs.FS {
	return permFS{FS: fs, file: file, dir: dir, readOnly: readOnly}
}

// Create creates name with the file mode.
func (p permFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.Create(name, category)
	if err != nil {
		return nil, err
	}
	if err := fchmod(f, p.file); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("chmod %s: %w", name, err)
	}
	return f, nil
}

// OpenReadWrite opens name, creating it with the file mode if it does not exist.
func (p permFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	_, statErr := p.FS.Stat(name)
	f, err := p.FS.OpenReadWrite(name, category, opts...)
	if err != nil || statErr == nil {
		return f, err
	}
	if err := fchmod(f, p.file); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("chmod %s: %w", name, err)
	}
	return f, nil
}

// MkdirAll creates dir and its missing parents with the directory mode (perm is ignored).
func (p permFS) MkdirAll(dir string, _ os.FileMode) error {
	var missing []string
	for d := dir; ; d = p.PathDir(d) {
		if _, err := p.FS.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
		if p.PathDir(d) == d {
			break
		}
	}
	if err := p.FS.MkdirAll(dir, p.dir); err != nil {
		return err
	}
	for _, d := range missing {
		if err := p.chmodDir(d, p.dir); err != nil {
			return err
		}
	}
	return nil
}

// Lock locks name, creating it with the file mode first if it does not exist, through lockFile
// (filelock.go): the lock is the file's, whatever path names it, and one per open file
// description, in this process as in others. A read-only engine that cannot open the file for
// writing takes a shared lock through a read-only descriptor instead, which a writer's
// excludes (none when the file does not exist: nothing to exclude). A file system without
// descriptors (in memory) locks with its own Lock.
func (p permFS) Lock(name string) (io.Closer, error) {
	exclusive := true
	f, err := p.OpenReadWrite(name, vfs.WriteCategoryUnspecified)
	if err != nil && p.readOnly && cannotWrite(err) {
		exclusive = false
		f, err = p.FS.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			return io.NopCloser(nil), nil
		}
	}
	if err != nil {
		return nil, err
	}
	if !osFileLocks || f.Fd() == vfs.InvalidFd {
		_ = f.Close()
		if !exclusive {
			return io.NopCloser(nil), nil
		}
		return p.FS.Lock(name)
	}
	l, err := lockFile(f, name, exclusive)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return l, nil
}

// cannotWrite reports whether err says a file cannot be opened for writing here.
func cannotWrite(err error) bool {
	var pathErr *fs.PathError
	return errors.Is(err, syscall.EROFS) || (errors.As(err, &pathErr) && errors.Is(err, os.ErrPermission))
}

func (p permFS) chmodDir(name string, mode os.FileMode) error {
	f, err := p.FS.OpenDir(name)
	if err != nil {
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	defer func() { _ = f.Close() }()
	if err := fchmod(f, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	return nil
}

// ValidateMode reports why mode cannot be a store's file (dir false) or directory mode, or nil:
// only permission bits, and the owner must be able to read and write (and enter directories).
func ValidateMode(mode os.FileMode, dir bool) error {
	need := os.FileMode(0o600)
	if dir {
		need = 0o700
	}
	switch {
	case mode&^os.ModePerm != 0:
		return fmt.Errorf("%#o has bits beyond the permissions", uint32(mode))
	case mode&need != need:
		return fmt.Errorf("%#o: the owner needs %#o", uint32(mode), uint32(need))
	}
	return nil
}
