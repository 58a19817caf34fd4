package devio

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// DirectMode selects whether files are opened with O_DIRECT.
type DirectMode int

const (
	// DirectAuto (the zero value) uses O_DIRECT when the file has a kernel
	// file descriptor and the file system accepts it, and silently falls back
	// to buffered I/O otherwise.
	DirectAuto DirectMode = iota
	// DirectOn requires O_DIRECT: opening fails, naming the path, when it
	// cannot be enabled (including files without a file descriptor).
	DirectOn
	// DirectOff never uses O_DIRECT.
	DirectOff
)

// String returns "auto", "on" or "off" (or "DirectMode(n)" for invalid values);
// ParseDirectMode accepts the same strings.
func (m DirectMode) String() string {
	switch m {
	case DirectAuto:
		return "auto"
	case DirectOn:
		return "on"
	case DirectOff:
		return "off"
	}
	return fmt.Sprintf("DirectMode(%d)", int(m))
}

// ParseDirectMode parses "auto", "on" or "off" (case-insensitive, surrounding
// space ignored; the empty string means "auto"). Other strings return an
// error.
func ParseDirectMode(s string) (DirectMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return DirectAuto, nil
	case "on":
		return DirectOn, nil
	case "off":
		return DirectOff, nil
	}
	return DirectAuto, fmt.Errorf("devio: invalid direct mode %q (want auto, on or off)", s)
}

// File is a file opened through a vfs.FS for block I/O by a Backend. Its
// methods are safe for concurrent use to the extent the underlying vfs.File's
// are; Close must not race with I/O on the file.
type File struct {
	file   vfs.File
	path   string
	fd     uintptr // vfs.InvalidFd when the file has no kernel descriptor
	direct bool
}

// Direct reports whether O_DIRECT is in effect: if true, every operation on
// the file must use DefaultAlignment-aligned buffers, lengths and offsets.
func (f *File) Direct() bool { return f.direct }

// Path returns the path the file was opened with.
func (f *File) Path() string { return f.path }

// VFS returns the underlying vfs.File (for Stat and the like). Close the File
// with File.Close, not through the returned value.
func (f *File) VFS() vfs.File { return f.file }

// hasFd reports whether I/O can go straight to a kernel file descriptor.
func (f *File) hasFd() bool { return f.fd != vfs.InvalidFd }

// SyncData persists all data written to the file (fdatasync for OS files).
// Completed writes are only durable after SyncData returns nil.
func (f *File) SyncData() error {
	if err := f.file.SyncData(); err != nil {
		return fmt.Errorf("devio: fdatasync %s: %w", f.path, err)
	}
	return nil
}

// Close closes the underlying file. No operation on f may be in progress.
func (f *File) Close() error {
	if err := f.file.Close(); err != nil {
		return fmt.Errorf("devio: close %s: %w", f.path, err)
	}
	return nil
}

// OpenFile opens path for reading and writing through fs. With create true
// the file is created with fs.Create, which replaces (truncates) any existing
// file: use it for new files only; with create false the file must already
// exist. The direct mode is applied as documented on DirectMode: O_DIRECT is
// set with fcntl(F_SETFL) on files with a kernel file descriptor; files
// without one (MemFS) are never direct, which is an error under DirectOn.
// On error no file is left open (a file created before a DirectOn failure is
// left on disk, empty).
func OpenFile(fs vfs.FS, path string, create bool, mode DirectMode) (*File, error) {
	var (
		vf  vfs.File
		err error
	)
	if create {
		vf, err = fs.Create(path, vfs.WriteCategoryUnspecified)
	} else {
		if _, err = fs.Stat(path); err == nil {
			vf, err = fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
		}
	}
	if err != nil {
		if vf != nil {
			_ = vf.Close()
		}
		return nil, fmt.Errorf("devio: open %s: %w", path, err)
	}
	return newFile(vf, path, mode)
}

// OpenReadOnly opens an existing file read-only through fs, applying the
// direct mode as OpenFile does. Writes to the returned File fail.
func OpenReadOnly(fs vfs.FS, path string, mode DirectMode) (*File, error) {
	vf, err := fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("devio: open %s: %w", path, err)
	}
	return newFile(vf, path, mode)
}

// errNoFd reports that O_DIRECT was requested on a file without a descriptor.
var errNoFd = errors.New("file has no kernel file descriptor")

func newFile(vf vfs.File, path string, mode DirectMode) (*File, error) {
	f := &File{file: vf, path: path, fd: vf.Fd()}
	switch mode {
	case DirectOff:
		return f, nil
	case DirectAuto, DirectOn:
	default:
		_ = vf.Close()
		return nil, fmt.Errorf("devio: open %s: invalid direct mode %d", path, int(mode))
	}
	var err error
	if !f.hasFd() {
		err = errNoFd
	} else {
		err = setDirect(f.fd)
	}
	if err == nil {
		f.direct = true
		return f, nil
	}
	if mode == DirectOn {
		_ = vf.Close()
		return nil, fmt.Errorf("devio: cannot enable O_DIRECT on %s: %w", path, err)
	}
	return f, nil
}

// ProbeDirect reports whether the file system holding dir supports O_DIRECT:
// it creates a temporary file in dir, enables O_DIRECT on it, writes one
// aligned 4 KiB block and removes the file. It returns (false, nil) when
// O_DIRECT is unsupported (including file systems without file descriptors,
// such as MemFS) and an error when the probe itself could not run (e.g. dir
// is not writable).
func ProbeDirect(fs vfs.FS, dir string) (bool, error) {
	name := fs.PathJoin(dir, fmt.Sprintf(".devio-probe-%d-%016x", os.Getpid(), rand.Uint64()))
	vf, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return false, fmt.Errorf("devio: probe O_DIRECT in %s: %w", dir, err)
	}
	defer func() { _ = fs.Remove(name) }()
	f, err := newFile(vf, name, DirectAuto)
	if err != nil {
		return false, err
	}
	defer func() { _ = f.Close() }()
	if !f.direct {
		return false, nil
	}
	op := Op{File: f, Buf: AlignedBuffer(DefaultAlignment)}
	op.Write = true
	if err := runOp(&op); err != nil {
		return false, nil
	}
	return true, nil
}

// Allocate reserves the file's blocks up to size bytes and makes its size at least size
// (fallocate mode 0: the new range reads as zeros). O_DIRECT writes inside the file's size
// need not extend it, which on ext4 and XFS lets them run concurrently instead of one at a
// time under the inode lock. It reports false (and does nothing) for files without a kernel
// descriptor or on file systems without fallocate; the size change is durable after the next
// SyncData.
func (f *File) Allocate(size int64) bool {
	if !f.hasFd() {
		return false
	}
	return allocate(f.fd, size) == nil
}

// Truncate sets the file's size (ftruncate), for trimming the unused tail of an allocated
// file. Files without a kernel descriptor cannot be truncated this way (an error).
func (f *File) Truncate(size int64) error {
	if !f.hasFd() {
		return fmt.Errorf("devio: truncate %s: %w", f.path, errNoFd)
	}
	if err := truncate(f.fd, size); err != nil {
		return fmt.Errorf("devio: truncate %s to %d: %w", f.path, size, err)
	}
	return nil
}
