package tiers

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
)

// staleFS answers ESTALE, as a second mount of a distributed file system does for a file
// replaced by rename, to the first opens or reads of files whose name contains match.
type staleFS struct {
	vfs.FS
	match  string
	mu     sync.Mutex
	opens  int // opens left to refuse
	reads  int // reads left to refuse, on files opened after the refused opens
	lists  int // directory listings left to refuse
	mkdirs int // directory creations left to refuse
}

func (fs *staleFS) MkdirAll(dir string, perm os.FileMode) error {
	if fs.take(&fs.mkdirs) {
		return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ESTALE}
	}
	return fs.FS.MkdirAll(dir, perm)
}

func (fs *staleFS) List(dir string) ([]string, error) {
	if fs.take(&fs.lists) {
		return nil, &os.PathError{Op: "readdir", Path: dir, Err: syscall.ESTALE}
	}
	return fs.FS.List(dir)
}

func (fs *staleFS) take(n *int) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if *n > 0 {
		*n--
		return true
	}
	return false
}

func (fs *staleFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	if strings.Contains(filepath.Base(name), fs.match) && fs.take(&fs.opens) {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.ESTALE}
	}
	f, err := fs.FS.Open(name, opts...)
	if err != nil || !strings.Contains(filepath.Base(name), fs.match) {
		return f, err
	}
	return &staleFile{File: f, fs: fs}, nil
}

type staleFile struct {
	vfs.File
	fs *staleFS
}

func (f *staleFile) ReadAt(p []byte, off int64) (int, error) {
	if f.fs.take(&f.fs.reads) {
		return 0, &os.PathError{Op: "read", Err: syscall.ESTALE}
	}
	return f.File.ReadAt(p, off)
}

// A manifest and a lease that the file system answers ESTALE for, at open or at read, are read
// by opening them again; one that stays stale fails with an error wrapping ESTALE, naming it.
func TestSharedFilesReopenedWhenStale(t *testing.T) {
	mem := vfs.NewMem()
	root := "/shared"
	inst := format.InstanceID{7}
	nsDir := NamespaceDir(root, inst)
	if err := mem.MkdirAll(nsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &format.Manifest{Instance: inst, Sequence: 1, Segments: []format.ManifestEntry{{Number: 4, Generation: 7, Size: 3 * format.Alignment, Records: 1}}}
	if err := WriteManifest(mem, nsDir, m); err != nil {
		t.Fatal(err)
	}
	l := &Leaser{FS: mem, Root: root, Self: inst, Duration: 10 * time.Second, Skew: time.Second}
	if held, _, err := l.Hold(time.Unix(1_000_000, 0)); err != nil || !held {
		t.Fatalf("Hold: %v %v", held, err)
	}
	for _, c := range []struct {
		name                string
		opens, reads, lists int
		ok                  bool
	}{
		{"open stale once", 1, 0, 0, true},
		{"read stale twice", 0, 2, 0, true},
		{"open and read stale", 1, 1, 0, true},
		{"directory listing stale once", 0, 0, 1, true},
		{"stale for good", staleOpens, 0, 0, false},
	} {
		for _, file := range []string{"MANIFEST", LeaseFile} {
			fs := &staleFS{FS: mem, match: file, opens: c.opens, reads: c.reads, lists: c.lists}
			var err error
			if file == LeaseFile {
				_, err = ReadLease(fs, root)
			} else {
				var got *format.Manifest
				if got, err = ReadManifest(fs, nsDir, inst); err == nil && len(got.Segments) != 1 {
					t.Fatalf("%s: manifest %+v", c.name, got)
				}
			}
			switch {
			case c.ok && err != nil:
				t.Errorf("%s, %s: %v", c.name, file, err)
			case !c.ok && (!errors.Is(err, syscall.ESTALE) || !strings.Contains(err.Error(), file)):
				t.Errorf("%s, %s: %v, want an error wrapping ESTALE naming the file", c.name, file, err)
			}
		}
	}
}

// A directory creation answered ESTALE (a distributed volume's client whose handle of the
// parent went stale while other instances created siblings) is tried again; one that stays
// stale fails naming the directory, wrapping ESTALE.
func TestMkdirAllStale(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "instances", "a", "segments")
	fs := &staleFS{FS: vfs.Default, mkdirs: staleOpens - 1}
	if err := MkdirAllStale(fs, dir, 0o755); err != nil {
		t.Fatalf("after %d stale answers: %v", staleOpens-1, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	fs = &staleFS{FS: vfs.Default, mkdirs: staleOpens}
	err := MkdirAllStale(fs, dir+"2", 0o755)
	if !errors.Is(err, syscall.ESTALE) || !strings.Contains(err.Error(), dir+"2") {
		t.Fatalf("always stale: %v, want ESTALE naming the directory", err)
	}
	fs = &staleFS{FS: vfs.Default}
	if err := MkdirAllStale(fs, "/proc/no/such", 0o755); err == nil || errors.Is(err, syscall.ESTALE) {
		t.Fatalf("another error: %v, want it as it is", err)
	}
}
