// Package faultfs wraps a vfs.FS to inject the faults errorfs cannot express: short reads and
// writes (fewer bytes transferred than asked, with or without an error) and delays. It is a
// test seam for the fault-injection suite in package fuzz.
//
// Only file data operations are intercepted (ReadAt, WriteAt, Sync, SyncData); everything
// else, including Fd (vfs.InvalidFd for MemFS files, so devio issues ReadAt/WriteAt through
// the wrapper), is passed through.
package faultfs

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Kind is the kind of an intercepted operation.
type Kind int

// Operation kinds.
const (
	ReadAt Kind = iota
	WriteAt
	Sync
	SyncData
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case ReadAt:
		return "ReadAt"
	case WriteAt:
		return "WriteAt"
	case Sync:
		return "Sync"
	case SyncData:
		return "SyncData"
	}
	return "Kind(?)"
}

// Op describes one intercepted operation.
type Op struct {
	Kind Kind
	Path string
	Off  int64
	Len  int
}

// Action says what to do with an operation. The zero Action passes it through.
type Action struct {
	// Delay is slept before the operation runs.
	Delay time.Duration
	// Short, for ReadAt and WriteAt, transfers only the first Short bytes (0 ≤ Short < Len;
	// ignored otherwise). With Err nil a short read mimics pread returning fewer bytes than asked
	// (legal mid-file for the syscall), a short write mimics a short pwrite.
	Short int
	// ShortSet says Short is meaningful (so that Short 0 can be expressed).
	ShortSet bool
	// Err is returned by the operation (after the partial transfer, if Short is set; without
	// running it otherwise).
	Err error
}

// Rule decides the action for each operation; it is called concurrently.
type Rule func(Op) Action

// Wrap returns fs with rule applied to every file data operation.
func Wrap(fs vfs.FS, rule Rule) vfs.FS { return &faultFS{FS: fs, rule: rule} }

type faultFS struct {
	vfs.FS
	rule Rule
}

func (f *faultFS) wrap(name string, file vfs.File, err error) (vfs.File, error) {
	if err != nil || file == nil {
		return file, err
	}
	return &faultFile{File: file, path: name, rule: f.rule}, nil
}

func (f *faultFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, category)
	return f.wrap(name, file, err)
}

func (f *faultFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.Open(name, opts...)
	return f.wrap(name, file, err)
}

func (f *faultFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.OpenReadWrite(name, category, opts...)
	return f.wrap(name, file, err)
}

func (f *faultFS) OpenDir(name string) (vfs.File, error) {
	file, err := f.FS.OpenDir(name)
	return f.wrap(name, file, err)
}

func (f *faultFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(oldname, newname, category)
	return f.wrap(newname, file, err)
}

type faultFile struct {
	vfs.File
	path string
	rule Rule
}

func (f *faultFile) act(kind Kind, off int64, n int) Action {
	a := f.rule(Op{Kind: kind, Path: f.path, Off: off, Len: n})
	if a.Delay > 0 {
		time.Sleep(a.Delay)
	}
	return a
}

func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	a := f.act(ReadAt, off, len(p))
	if a.ShortSet && a.Short < len(p) {
		n, err := f.File.ReadAt(p[:a.Short], off)
		if err != nil {
			return n, err
		}
		return n, a.Err
	}
	if a.Err != nil {
		return 0, a.Err
	}
	return f.File.ReadAt(p, off)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	a := f.act(WriteAt, off, len(p))
	if a.ShortSet && a.Short < len(p) {
		n, err := f.File.WriteAt(p[:a.Short], off)
		if err != nil {
			return n, err
		}
		return n, a.Err
	}
	if a.Err != nil {
		return 0, a.Err
	}
	return f.File.WriteAt(p, off)
}

func (f *faultFile) Sync() error {
	if a := f.act(Sync, 0, 0); a.Err != nil {
		return a.Err
	}
	return f.File.Sync()
}

func (f *faultFile) SyncData() error {
	if a := f.act(SyncData, 0, 0); a.Err != nil {
		return a.Err
	}
	return f.File.SyncData()
}
