package engine

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/tiers"
)

// copyTree copies the directory tree src to dst (regular files and directories), as cp -a.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(target, fi.Mode().Perm())
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = in.Close() }()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// nestedTiers is a store's tiers with two directories inside the store (ssd, hdd) and, when
// outside is not "", one outside it (cold).
func nestedTiers(dir, outside string) []tiers.Config {
	ts := []tiers.Config{diskTierCfg("ssd", 1<<20, filepath.Join(dir, "ssd")), diskTierCfg("hdd", 0, filepath.Join(dir, "hdd"))}
	if outside != "" {
		ts[1].Capacity = 1 << 20
		ts = append(ts, diskTierCfg("cold", 0, outside))
	}
	return ts
}

// recordedTierPaths returns the tier paths the store in e recorded, tier by tier.
func recordedTierPaths(t *testing.T, e *Engine) [][]string {
	t.Helper()
	v, ok, err := e.ix.Meta(metaTiers)
	if err != nil || !ok {
		t.Fatalf("no %s record: %v", metaTiers, err)
	}
	var ts []tiers.Config
	if err := json.Unmarshal(v, &ts); err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, c := range ts {
		out = append(out, c.Paths)
	}
	return out
}

// buildNested makes a closed store in dir with nestedTiers and n blocks spread over its tiers.
func buildNested(t *testing.T, dir, outside string, n int) []BlockID {
	t.Helper()
	e := mustOpen(t, dir, tierOptions(vfs.Default, nestedTiers(dir, outside)...))
	ids := make([]BlockID, n)
	for i := range ids {
		ids[i] = blockID(i)
	}
	dumpBlocks(t, e, ids)
	if _, err := e.Evict("ssd", 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Tier paths inside the store directory are recorded relative to it and paths outside it
// absolute; a copy opened by a tool (adopting the recorded tiers) works on its own directories.
func TestTierPathsInsideTheStoreRecordedRelative(t *testing.T) {
	root := t.TempDir()
	kc, cold := filepath.Join(root, "kc"), filepath.Join(root, "cold")
	ids := buildNested(t, kc, cold, 30)
	e := mustOpen(t, kc, Options{FS: vfs.Default, ReadOnly: true, AdoptStoredSchema: true})
	got := recordedTierPaths(t, e)
	_ = e.Close()
	if want := [][]string{{"ssd"}, {"hdd"}, {cold}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("recorded tier paths %q, want %q", got, want)
	}
	kc3 := filepath.Join(root, "kc3")
	copyTree(t, kc, kc3)
	c := mustOpen(t, kc3, Options{FS: vfs.Default, AdoptStoredSchema: true})
	if got, want := c.SegmentDirs(), []string{filepath.Join(kc3, "ssd", SegmentDir), filepath.Join(kc3, "hdd", SegmentDir), filepath.Join(cold, SegmentDir)}; !slices.Equal(got, want) {
		t.Fatalf("the copy's segment dirs %v, want %v", got, want)
	}
	checkBlocks(t, c, ids)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// A store whose record names its own directories absolutely (as every path but the store
// directory was once recorded) is read as it is and migrated to relative paths; a copy of it
// is refused, naming both stores, until it is opened with its own tiers configured; a tier
// configured inside another store is refused.
func TestAbsoluteTierRecordsMigratedAndCopiesRefused(t *testing.T) {
	root := t.TempDir()
	kc := filepath.Join(root, "kc")
	ids := buildNested(t, kc, "", 30)
	// Rewrite the record in the old form: absolute paths.
	e := mustOpen(t, kc, tierOptions(vfs.Default, nestedTiers(kc, "")...))
	old, err := json.Marshal(nestedTiers(kc, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ix.SetMeta(metaTiers, old, true); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil { // the record is written at Open, not at Close
		t.Fatal(err)
	}

	kc3 := filepath.Join(root, "kc3")
	copyTree(t, kc, kc3)
	for _, ro := range []bool{true, false} {
		_, err := Open(kc3, Options{FS: vfs.Default, ReadOnly: ro, AdoptStoredSchema: true})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), kc3+":") || !strings.Contains(err.Error(), "another store, "+kc+":") {
			t.Fatalf("open the copy of an absolute record (read-only %v): %v; want ErrInvalidArgument naming %s and %s", ro, err, kc3, kc)
		}
	}
	// The original reads its absolute record as its own and records it relative.
	o := mustOpen(t, kc, Options{FS: vfs.Default, AdoptStoredSchema: true})
	checkBlocks(t, o, ids)
	if got, want := recordedTierPaths(t, o), [][]string{{"ssd"}, {"hdd"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("the original's record after a writable open: %q, want %q", got, want)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	// The copy, opened with its own directories configured, records them and no longer
	// refers to the original.
	c := mustOpen(t, kc3, tierOptions(vfs.Default, nestedTiers(kc3, "")...))
	checkBlocks(t, c, ids)
	if _, err := c.Evict("hdd", 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = mustOpen(t, kc3, Options{FS: vfs.Default, ReadOnly: true, AdoptStoredSchema: true})
	_ = c.Close()
	o = mustOpen(t, kc, Options{FS: vfs.Default, ReadOnly: true, AdoptStoredSchema: true})
	checkBlocks(t, o, ids)
	_ = o.Close()

	// A tier configured inside another store's directory.
	ts := nestedTiers(filepath.Join(root, "other"), "")
	ts[1].Paths = []string{filepath.Join(kc, "extra")}
	if _, err := Open(filepath.Join(root, "other"), tierOptions(vfs.Default, ts...)); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), filepath.Join(kc, "extra")) || !strings.Contains(err.Error(), "another store, "+kc+":") {
		t.Fatalf("a tier inside another store: %v", err)
	}
}
