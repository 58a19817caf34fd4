package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
)

// readOnlyView bind-mounts dir read-only at a new path and returns it (unmounted at cleanup);
// the test is skipped where mounting is impossible (not root, no mount namespace).
func readOnlyView(t *testing.T, dir string) string {
	t.Helper()
	view := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(view, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, view, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount %s (needs root): %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(view, unix.MNT_DETACH) })
	if err := unix.Mount("", view, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot remount %s read-only: %v", view, err)
	}
	if err := os.WriteFile(filepath.Join(view, "probe"), nil, 0o600); err == nil {
		t.Fatalf("the read-only view %s is writable", view)
	}
	return view
}

// TestReadOnlyCommandsOnReadOnlyStore: the commands that never write (inspect, stats, verify
// --no-recover) work on a store on a read-only file system; before, they failed creating LOCK.
func TestReadOnlyCommandsOnReadOnlyStore(t *testing.T) {
	dir := buildStore(t, 40)
	view := readOnlyView(t, dir)
	for _, args := range [][]string{
		{"inspect", view},
		{"stats", view},
		{"verify", "--no-recover", view},
	} {
		out, errOut, code := run(t, args...)
		if code != cliutil.ExitOK || strings.Contains(errOut, "read-only file system") {
			t.Errorf("%s on a read-only store: exit %d\n%s%s", args[0], code, out, errOut)
		}
	}
	out, _, _ := run(t, "verify", "--no-recover", view)
	clitest.MustContain(t, out, "blocks verified: 40", "problems: 0")
	// A command that must write says why it cannot.
	if _, errOut, code := run(t, "compact", view); code == cliutil.ExitOK || !strings.Contains(errOut, "read-only") {
		t.Errorf("compact on a read-only store: exit %d, %s", code, errOut)
	}
}
