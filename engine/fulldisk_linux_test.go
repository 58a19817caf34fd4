package engine

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// smallFS makes and mounts an ext4 file system of size bytes in a loop device and returns its
// mount point (unmounted and removed at cleanup); the test is skipped where that is impossible
// (not root, no loop devices, no mkfs.ext4).
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a loop file system needs root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed (e2fsprogs)")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("mount -o loop: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// fillFS writes a file named name in dir until the file system is full and returns its path.
func fillFS(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	small := make([]byte, 512)
	for {
		if _, err := f.Write(small); err != nil {
			break
		}
	}
	_ = f.Sync()
	return path
}

// openWithin opens dir, failing the test when Open does not return within d.
func openWithin(t *testing.T, dir string, o Options, d time.Duration) (*Engine, error) {
	t.Helper()
	type result struct {
		e   *Engine
		err error
	}
	ch := make(chan result, 1)
	go func() {
		e, err := Open(dir, o)
		ch <- result{e, err}
	}()
	select {
	case r := <-ch:
		return r.e, r.err
	case <-time.After(d):
		t.Fatalf("Open of a store on a full file system did not return within %v", d)
		return nil, nil
	}
}

// TestOpenOnFullDisk: a store whose index entries are still in Pebble's WAL, reopened on a
// full file system, used to hang in Pebble's replay (ENOSPC retried without end). Open returns
// promptly (the index's reserve is released for the replay); the store serves its blocks;
// filled again while open, dumps fail with ErrNoSpace before the index is starved, and the
// store reopens promptly with every acknowledged block; with space back, dumps work again.
func TestOpenOnFullDisk(t *testing.T) {
	mnt := smallFS(t, 40<<20)
	dir := filepath.Join(mnt, "store")
	o := testOptions(vfs.Default, mhaLayout)
	e := mustOpen(t, dir, o)
	stored := ids(0, 60)
	dumpBlocks(t, e, stored)
	if _, err := os.Stat(filepath.Join(dir, ReserveFile)); err != nil {
		t.Fatalf("no index reserve: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	fillers := []string{fillFS(t, mnt, "filler1")}
	e, err := openWithin(t, dir, o, 20*time.Second)
	if err != nil {
		t.Fatalf("open on a full disk: %v", err)
	}
	checkBlocks(t, e, stored)
	// Filled again by someone else while the engine runs.
	fillers = append(fillers, fillFS(t, mnt, "filler2"))
	bb := int(mhaLayout.BlockBytes())
	var acked []BlockID
	var derr error
	for i := 1000; i < 1400 && derr == nil; i++ {
		b := make([]byte, bb)
		payload(blockID(i), 0, b)
		if derr = e.Dump([]BlockID{blockID(i)}, [][]byte{b}).Wait(); derr == nil {
			acked = append(acked, blockID(i))
		}
	}
	if !errors.Is(derr, ErrNoSpace) {
		t.Fatalf("dumps on a full disk: %v, want ErrNoSpace", derr)
	}
	checkBlocks(t, e, stored)
	// Close may report that the index could not record the last entries (the file system
	// filled between two looks at it): then as ErrNoSpace.
	if err := e.Close(); err != nil && !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
	e, err = openWithin(t, dir, o, 20*time.Second)
	if err != nil {
		t.Fatalf("reopen on a full disk: %v", err)
	}
	checkBlocks(t, e, stored)
	checkBlocks(t, e, acked)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range fillers {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	e = mustOpen(t, dir, o)
	defer e.Close()
	checkBlocks(t, e, stored)
	dumpBlocks(t, e, ids(2000, 2010))
	if err := e.Failed(); err != nil {
		t.Fatalf("with space back: %v", err)
	}
}

// TestOpenOnFullDiskWithoutReserve: with no reserve to release (IndexReserve < 0), a store on
// a full file system opens read-only instead of hanging: loads are served, dumps refused with
// ErrNoSpace naming the store.
func TestOpenOnFullDiskWithoutReserve(t *testing.T) {
	mnt := smallFS(t, 40<<20)
	dir := filepath.Join(mnt, "store")
	o := testOptions(vfs.Default, mhaLayout)
	o.IndexReserve = -1
	e := mustOpen(t, dir, o)
	stored := ids(0, 60)
	dumpBlocks(t, e, stored)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	fillFS(t, mnt, "filler")
	e, err := openWithin(t, dir, o, 20*time.Second)
	if err != nil {
		t.Fatalf("open on a full disk: %v", err)
	}
	defer e.Close()
	checkBlocks(t, e, stored)
	err = e.Dump([]BlockID{blockID(1000)}, [][]byte{make([]byte, mhaLayout.BlockBytes())}).Wait()
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("dump on a full disk: %v, want ErrNoSpace naming %s", err, dir)
	}
}
