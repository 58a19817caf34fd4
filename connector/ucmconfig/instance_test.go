package ucmconfig

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ucm-go/ucm/engine"
)

// TestInstanceStoreSharesBackends: two processes' worth of engines opened from one UCM config with
// different instance names both open (no engine.ErrLocked), each in its own store directory, and
// see each other's sealed blocks through the shared storage backend.
func TestInstanceStoreSharesBackends(t *testing.T) {
	root := t.TempDir()
	cfg, err := ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n      storage_backends: " + root +
		"\n      segment_size: 256KiB\n      cache_buffer_capacity_gb: 0.01\n"))
	if err != nil {
		t.Fatal(err)
	}
	open := func(name string) *engine.Engine {
		dir, opts, err := cfg.InstanceStore(name, testSchema, mhaLayout)
		if err != nil {
			t.Fatal(err)
		}
		if dir != filepath.Join(root, StoresDir, LayoutNamespace(testSchema, mhaLayout), name) {
			t.Fatalf("store dir %s", dir)
		}
		if opts.Layout != mhaLayout || opts.Schema != testSchema {
			t.Fatalf("options layout %+v schema %+v", opts.Layout, opts.Schema)
		}
		opts.SharedRefreshInterval = 10 * time.Millisecond
		opts.Logger = nil
		return mustOpen(t, dir, opts)
	}
	r0, r1 := open("host-r0"), open("host-r1")
	defer r1.Close()
	mine := ids(0, 20)
	dumpBlocks(t, r0, mine)
	if err := r0.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "rank 0's blocks visible to rank 1", func() bool { return allHit(r1, mine) })
	checkBlocks(t, r1, mine)
	for _, bad := range []string{"", "a/b", "..", "."} {
		if _, _, err := cfg.InstanceStore(bad, testSchema, mhaLayout); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("instance name %q: %v", bad, err)
		}
		if _, err := cfg.InstanceStores(bad); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("InstanceStores(%q): %v", bad, err)
		}
	}
}

// TestInstanceStoreLayoutNamespaces: each schema and layout gets its own store directory for
// one instance name; stores left at the pre-namespace place are moved into their layout's
// namespace by that layout only (another layout's stays, one without a SCHEMA file stays);
// InstanceStores finds an instance's stores of every layout.
func TestInstanceStoreLayoutNamespaces(t *testing.T) {
	root := t.TempDir()
	cfg, err := ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n      storage_backends: " + root + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	other := engine.Layout{Shards: 2, TensorsPerShard: 2, ShardBytes: 2 * 4096}
	if LayoutNamespace(testSchema, mhaLayout) == LayoutNamespace(testSchema, other) {
		t.Fatal("two layouts share a namespace")
	}
	if _, err := cfg.InstanceStores("w"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("InstanceStores of nothing: %v", err)
	}
	stores := filepath.Join(root, StoresDir)
	// Legacy stores: "w" of layout mhaLayout, "v" of layout other, "u" without its SCHEMA file.
	legacy := func(name string, l engine.Layout) []engine.BlockID {
		_, opts, err := cfg.InstanceStore(name, testSchema, l)
		if err != nil {
			t.Fatal(err)
		}
		opts.Logger = nil
		e := mustOpen(t, filepath.Join(stores, name), opts)
		blocks := ids(0, 5)
		if l == mhaLayout {
			dumpBlocks(t, e, blocks)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		return blocks
	}
	wBlocks := legacy("w", mhaLayout)
	legacy("v", other)
	legacy("u", mhaLayout)
	if err := os.Remove(filepath.Join(stores, "u", engine.SchemaFile)); err != nil {
		t.Fatal(err)
	}

	dir, opts, err := cfg.InstanceStore("w", testSchema, mhaLayout)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(stores, LayoutNamespace(testSchema, mhaLayout), "w"); dir != want {
		t.Fatalf("store dir %s, want %s", dir, want)
	}
	if _, err := os.Stat(filepath.Join(stores, "w")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("legacy store w not moved: %v", err)
	}
	opts.Logger = nil
	e := mustOpen(t, dir, opts)
	checkBlocks(t, e, wBlocks)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// v is another layout's: left in place, the namespaced directory is new.
	vDir, _, err := cfg.InstanceStore("v", testSchema, mhaLayout)
	if err != nil {
		t.Fatal(err)
	}
	if !engine.IsStoreDir(filepath.Join(stores, "v")) {
		t.Fatal("another layout's legacy store moved")
	}
	if _, err := os.Stat(vDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("namespaced store of v: %v", err)
	}
	// u has no SCHEMA file: left in place.
	if _, _, err = cfg.InstanceStore("u", testSchema, mhaLayout); err != nil {
		t.Fatal(err)
	}
	if !engine.IsStoreDir(filepath.Join(stores, "u")) {
		t.Fatal("a legacy store without SCHEMA moved")
	}

	// w in both layouts: InstanceStores lists both.
	dirB, optsB, err := cfg.InstanceStore("w", testSchema, other)
	if err != nil {
		t.Fatal(err)
	}
	optsB.Logger = nil
	if err := mustOpen(t, dirB, optsB).Close(); err != nil {
		t.Fatal(err)
	}
	got, err := cfg.InstanceStores("w")
	if err != nil || len(got) != 2 || !slices.Contains(got, dir) || !slices.Contains(got, dirB) {
		t.Fatalf("InstanceStores(w) = %v, %v; want %s and %s", got, err, dir, dirB)
	}
	if got, err := cfg.InstanceStores("v"); err != nil || len(got) != 1 || got[0] != filepath.Join(stores, "v") {
		t.Fatalf("InstanceStores(v) = %v, %v", got, err)
	}
}
