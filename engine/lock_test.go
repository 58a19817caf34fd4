package engine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// lockChildEnv makes the test binary, re-executed, try the locks the parent holds: its value is
// the paths to try, one a line; each line of the child's output says what it got.
const lockChildEnv = "UCM_TEST_LOCK_SPELLINGS"

// spellings returns the ways to name directory s (relative to the working directory wd,
// where a symbolic link "link" points at it): relative, absolute, through the link, with
// "." and ".." and a trailing slash.
func spellings(wd string) []string {
	return []string{
		filepath.Join(wd, "s"), "./s", "s/", "s/../s", "link", "link/.", filepath.Join(wd, "link") + "/",
		filepath.Join(wd, "link", "..", "s"),
	}
}

// tryOpen opens the store at path; it reports whether it got ErrLocked, and closes an engine it
// should not have got.
func tryOpen(path string) (bool, error) {
	e, err := Open(path, testOptions(vfs.Default, mhaLayout))
	if err == nil {
		_ = e.Close()
	}
	return errors.Is(err, ErrLocked), err
}

// tryLock locks file path through the engine's file system; it reports whether the lock was
// refused as held.
func tryLock(path string) (bool, error) {
	l, err := storeFS(vfs.Default, DefaultFileMode, DefaultDirMode, false).Lock(path)
	if err != nil {
		return isLockHeld(err), err
	}
	return false, l.Close()
}

// TestLockEverySpelling: with a store open, opening it again by any other spelling of its path
// (absolute, through a symbolic link, "link/.", ...) gets ErrLocked, in this process and in
// another one (the test binary re-executed), and so does locking the index's own Pebble LOCK
// file. A refused second Open leaves the first engine's lock in place (a second engine once
// got in and its Close released the first one's lock, letting another process write the live
// store). After Close every spelling opens.
func TestLockEverySpelling(t *testing.T) {
	if paths := os.Getenv(lockChildEnv); paths != "" {
		for _, p := range strings.Split(paths, "\n") {
			var locked bool
			var err error
			if strings.HasSuffix(p, LockFile) {
				locked, err = tryLock(p)
			} else {
				locked, err = tryOpen(p)
			}
			fmt.Printf("child %q: locked=%v err=%v\n", p, locked, err)
		}
		return
	}
	wd := t.TempDir()
	t.Chdir(wd)
	if err := os.Symlink("s", filepath.Join(wd, "link")); err != nil {
		t.Fatal(err)
	}
	e := mustOpen(t, "s", testOptions(vfs.Default, mhaLayout))
	closed := false
	defer func() {
		if !closed {
			_ = e.Close()
		}
	}()
	dumpBlocks(t, e, ids(0, 4))
	names := spellings(wd)
	for _, p := range names {
		if locked, err := tryOpen(p); !locked {
			t.Errorf("second Open of the store as %q in the process holding it: %v, want ErrLocked", p, err)
		}
	}
	indexLocks := []string{filepath.Join(wd, "link", IndexDir, "LOCK"), filepath.Join("s", ".", IndexDir, "LOCK")}
	for _, p := range indexLocks {
		if locked, err := tryLock(p); !locked {
			t.Errorf("lock of the open index's Pebble LOCK as %q: %v, want held", p, err)
		}
	}
	// Another process, after every refused attempt here.
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockEverySpelling$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+strings.Join(append(append([]string{"s"}, names...), indexLocks...), "\n"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var got []string
	for _, p := range append(append([]string{"s"}, names...), indexLocks...) {
		if !strings.Contains(string(out), fmt.Sprintf("child %q: locked=true", p)) {
			got = append(got, p)
		}
	}
	if len(got) > 0 {
		t.Errorf("another process got %q while the store was open:\n%s", got, out)
	}
	checkBlocks(t, e, ids(0, 4))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, p := range names {
		e2, err := Open(p, testOptions(vfs.Default, mhaLayout))
		if err != nil {
			t.Fatalf("open as %q after Close: %v", p, err)
		}
		checkBlocks(t, e2, ids(0, 4))
		if err := e2.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTierPathLockEverySpelling: a tier path one store holds is refused to another store
// however the path is spelled (through a symbolic link, with "."), in this process and after
// the refused attempt; the first store keeps working.
func TestTierPathLockEverySpelling(t *testing.T) {
	wd := t.TempDir()
	hdd := filepath.Join(wd, "hdd")
	if err := os.Symlink(hdd, filepath.Join(wd, "hddlink")); err != nil {
		t.Fatal(err)
	}
	opts := func(p string) Options { return tierOptions(vfs.Default, diskTierCfg("ssd", 0, p)) }
	e := mustOpen(t, filepath.Join(wd, "a"), opts(hdd))
	defer e.Close()
	for i, p := range []string{filepath.Join(wd, "hddlink"), filepath.Join(wd, "hddlink", "."), hdd + "/./"} {
		other := filepath.Join(wd, fmt.Sprintf("b%d", i))
		e2, err := Open(other, opts(p))
		if err == nil {
			_ = e2.Close()
		}
		if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "in use by another store") {
			t.Errorf("a second store on the held tier path spelled %q: %v, want ErrLocked", p, err)
		}
	}
	if locked, err := tryLock(filepath.Join(wd, "hddlink", LockFile)); !locked {
		t.Errorf("lock of the held tier path's LOCK through the link: %v, want held", err)
	}
	dumpBlocks(t, e, ids(0, 4))
	checkBlocks(t, e, ids(0, 4))
}

// TestSharedLocksAndWriters: shared locks (a read-only open of a store it cannot write) go
// together, exclude an exclusive one and are excluded by it, in this process, whatever path
// names the file; a released lock can be taken again.
func TestSharedLocksAndWriters(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, LockFile)
	if err := os.WriteFile(name, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, filepath.Join(dir, "self")); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "self", LockFile)
	shared := func(p string) (io.Closer, error) {
		f, err := vfs.Default.Open(p)
		if err != nil {
			return nil, err
		}
		l, err := lockFile(f, p, false)
		if err != nil {
			_ = f.Close()
		}
		return l, err
	}
	r1, err := shared(name)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := shared(other)
	if err != nil {
		t.Fatalf("a second shared lock: %v", err)
	}
	if locked, err := tryLock(other); !locked {
		t.Fatalf("an exclusive lock beside shared ones: %v, want held", err)
	}
	_ = r1.Close()
	if locked, err := tryLock(name); !locked {
		t.Fatalf("an exclusive lock beside one shared one: %v, want held", err)
	}
	_ = r2.Close()
	w, err := storeFS(vfs.Default, DefaultFileMode, DefaultDirMode, false).Lock(other)
	if err != nil {
		t.Fatalf("exclusive lock once the shared ones are released: %v", err)
	}
	if _, err := shared(name); !isLockHeld(err) {
		t.Fatalf("a shared lock beside an exclusive one: %v, want held", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
