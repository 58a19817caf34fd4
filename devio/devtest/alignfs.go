// Package devtest holds test seams for code built on devio.
package devtest

import (
	"fmt"
	"unsafe"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
)

// AlignCheckFS wraps fs so that, for every file whose path satisfies match
// (nil matches all), each ReadAt or WriteAt whose offset, length or buffer
// address is not a multiple of devio.DefaultAlignment fails with an error
// wrapping devio.ErrMisaligned without touching the file. It exists because
// MemFS and tmpfs accept misaligned I/O and would hide alignment bugs that
// O_DIRECT on a real disk turns into EINVAL.
//
// Every other method is passed through unchanged; in particular Fd() still
// returns vfs.InvalidFd for MemFS files, so devio routes their I/O through the
// checked ReadAt/WriteAt. Files with a real descriptor keep it too, and devio
// then issues pread/pwrite directly, bypassing the check (the kernel enforces
// alignment on such files when they are direct).
func AlignCheckFS(fs vfs.FS, match func(path string) bool) vfs.FS {
	if match == nil {
		match = func(string) bool { return true }
	}
	return &alignFS{FS: fs, match: match}
}

type alignFS struct {
	vfs.FS
	match func(string) bool
}

func (a *alignFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || f == nil || !a.match(name) {
		return f, err
	}
	return &alignFile{File: f, path: name}, nil
}

func (a *alignFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := a.FS.Create(name, category)
	return a.wrap(name, f, err)
}

func (a *alignFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := a.FS.Open(name, opts...)
	return a.wrap(name, f, err)
}

func (a *alignFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := a.FS.OpenReadWrite(name, category, opts...)
	return a.wrap(name, f, err)
}

func (a *alignFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := a.FS.ReuseForWrite(oldname, newname, category)
	return a.wrap(newname, f, err)
}

func (a *alignFS) Unwrap() vfs.FS { return a.FS }

type alignFile struct {
	vfs.File
	path string
}

func (f *alignFile) check(op string, p []byte, off int64) error {
	const al = devio.DefaultAlignment
	var addr uintptr
	if len(p) > 0 {
		addr = uintptr(unsafe.Pointer(&p[0]))
	}
	if off%al != 0 || len(p)%al != 0 || addr%al != 0 {
		return fmt.Errorf("devtest: %s %s at offset %d len %d addr %#x: %w",
			op, f.path, off, len(p), addr, devio.ErrMisaligned)
	}
	return nil
}

func (f *alignFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check("read", p, off); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *alignFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check("write", p, off); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}
