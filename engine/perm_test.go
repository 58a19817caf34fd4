//go:build unix

package engine

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/tiers"
)

// TestCreatedModesIgnoreUmask: under umask 000 every file a store creates (segments, index,
// LOCK, schema files) is 0640 and every directory 0750, or the configured modes; directories
// that existed before keep theirs.
func TestCreatedModesIgnoreUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	for _, c := range []struct {
		name         string
		file, dir    os.FileMode
		wantF, wantD os.FileMode
	}{
		{"defaults", 0, 0, DefaultFileMode, DefaultDirMode},
		{"configured", 0o600, 0o700, 0o600, 0o700},
	} {
		t.Run(c.name, func(t *testing.T) {
			parent := t.TempDir()
			if err := os.Chmod(parent, 0o711); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(parent, "a", "store")
			o := testOptions(vfs.Default, mhaLayout)
			o.FileMode, o.DirMode = c.file, c.dir
			o.Tiers = []tiers.Config{{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{filepath.Join(parent, "ssd")}}}
			e := mustOpen(t, dir, o)
			dumpBlocks(t, e, []BlockID{blockID(1), blockID(2)})
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			files, dirs := 0, 0
			err := filepath.WalkDir(parent, func(p string, d fs.DirEntry, err error) error {
				if err != nil || p == parent {
					return err
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				want := c.wantF
				if d.IsDir() {
					want, dirs = c.wantD, dirs+1
				} else {
					files++
				}
				if got := info.Mode().Perm(); got != want {
					t.Errorf("%s: mode %#o, want %#o", strings.TrimPrefix(p, parent), got, want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if files < 5 || dirs < 4 {
				t.Errorf("walked %d files and %d directories: the store was not where expected", files, dirs)
			}
			if info, _ := os.Stat(parent); info.Mode().Perm() != 0o711 {
				t.Errorf("an existing directory's mode changed to %#o", info.Mode().Perm())
			}
		})
	}
	_, mfs := memFS()
	for _, bad := range []struct {
		file, dir os.FileMode
	}{{0o440, 0}, {0, 0o500}, {0o640 | os.ModeSetuid, 0}} {
		o := testOptions(mfs, mhaLayout)
		o.FileMode, o.DirMode = bad.file, bad.dir
		if _, err := Open("/bad", o); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "mode") {
			t.Errorf("modes %#o, %#o: %v, want ErrInvalidArgument naming the mode", bad.file, bad.dir, err)
		}
	}
}
