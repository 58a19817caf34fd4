package devio_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"golang.org/x/sys/unix"
)

// diskDir returns a temporary directory, noting when it is not a real disk
// file system (tmpfs accepts misaligned O_DIRECT and hides bugs).
func diskDir(t testing.TB) string {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && uint64(st.Type) == 0x01021994 { // TMPFS_MAGIC
		t.Logf("note: %s is tmpfs; O_DIRECT alignment is not enforced by the kernel there", dir)
	}
	return dir
}

func TestParseDirectMode(t *testing.T) {
	for _, m := range []devio.DirectMode{devio.DirectAuto, devio.DirectOn, devio.DirectOff} {
		got, err := devio.ParseDirectMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseDirectMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := devio.ParseDirectMode("sometimes"); err == nil {
		t.Error("ParseDirectMode accepted garbage")
	}
	var zero devio.DirectMode
	if zero != devio.DirectAuto {
		t.Error("zero DirectMode is not DirectAuto")
	}
}

func TestOpenDisk(t *testing.T) {
	dir := diskDir(t)
	fs := vfs.Default
	path := filepath.Join(dir, "seg")

	f, err := devio.OpenFile(fs, path, true, devio.DirectOn)
	if err != nil {
		t.Fatalf("DirectOn on %s: %v", dir, err)
	}
	if !f.Direct() || f.Path() != path || f.VFS() == nil {
		t.Fatalf("Direct=%v Path=%q", f.Direct(), f.Path())
	}
	if err := f.SyncData(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		mode devio.DirectMode
		want bool
	}{{devio.DirectAuto, true}, {devio.DirectOn, true}, {devio.DirectOff, false}} {
		f, err := devio.OpenFile(fs, path, false, c.mode)
		if err != nil {
			t.Fatal(err)
		}
		if f.Direct() != c.want {
			t.Errorf("OpenFile %v: Direct=%v", c.mode, f.Direct())
		}
		f.Close()
		r, err := devio.OpenReadOnly(fs, path, c.mode)
		if err != nil {
			t.Fatal(err)
		}
		if r.Direct() != c.want {
			t.Errorf("OpenReadOnly %v: Direct=%v", c.mode, r.Direct())
		}
		r.Close()
	}

	if _, err := devio.OpenFile(fs, filepath.Join(dir, "missing"), false, devio.DirectAuto); err == nil {
		t.Error("OpenFile(create=false) of a missing file succeeded")
	}
	if _, err := devio.OpenReadOnly(fs, filepath.Join(dir, "missing"), devio.DirectAuto); err == nil {
		t.Error("OpenReadOnly of a missing file succeeded")
	}

	ok, err := devio.ProbeDirect(fs, dir)
	if err != nil || !ok {
		t.Errorf("ProbeDirect(%s) = %v, %v; want true", dir, ok, err)
	}
	if names, _ := fs.List(dir); len(names) != 1 {
		t.Errorf("probe left files behind: %v", names)
	}
	if _, err := devio.ProbeDirect(fs, filepath.Join(dir, "nope")); err == nil {
		t.Error("ProbeDirect in a missing dir succeeded")
	}
}

func TestOpenMemFS(t *testing.T) {
	fs := vfs.NewCrashableMem()
	_, err := devio.OpenFile(fs, "a", true, devio.DirectOn)
	if err == nil || !strings.Contains(err.Error(), "a") {
		t.Fatalf("DirectOn on MemFS: err %v, want an error naming the path", err)
	}
	f, err := devio.OpenFile(fs, "b", true, devio.DirectAuto)
	if err != nil {
		t.Fatal(err)
	}
	if f.Direct() {
		t.Error("Auto on MemFS is direct")
	}
	if f.VFS().Fd() != vfs.InvalidFd {
		t.Error("MemFS file has an fd")
	}
	f.Close()
	r, err := devio.OpenReadOnly(fs, "b", devio.DirectAuto)
	if err != nil || r.Direct() {
		t.Fatalf("OpenReadOnly on MemFS: %v direct=%v", err, r != nil && r.Direct())
	}
	r.Close()
	if _, err := devio.OpenReadOnly(fs, "b", devio.DirectOn); err == nil {
		t.Error("DirectOn OpenReadOnly on MemFS succeeded")
	}
	ok, err := devio.ProbeDirect(fs, "")
	if ok || err != nil {
		t.Errorf("ProbeDirect(MemFS) = %v, %v", ok, err)
	}
	if _, err := devio.OpenFile(fs, "c", true, devio.DirectMode(7)); err == nil {
		t.Error("invalid mode accepted")
	}
}
