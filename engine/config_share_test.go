package engine

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestInstanceStoreSharesBackends: two processes' worth of engines opened from one UCM config
// with different instance names both open (no ErrLocked), each in its own store directory, and
// see each other's sealed blocks through the shared storage backend.
func TestInstanceStoreSharesBackends(t *testing.T) {
	root := t.TempDir()
	cfg, err := ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n      storage_backends: " + root +
		"\n      segment_size: 256KiB\n      cache_buffer_capacity_gb: 0.01\n"))
	if err != nil {
		t.Fatal(err)
	}
	open := func(name string) *Engine {
		dir, opts, err := cfg.InstanceStore(name)
		if err != nil {
			t.Fatal(err)
		}
		if dir != filepath.Join(root, StoresDir, name) {
			t.Fatalf("store dir %s", dir)
		}
		opts.Layout, opts.Schema, opts.SharedRefreshInterval = mhaLayout, testSchema, 10*time.Millisecond
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
		if _, _, err := cfg.InstanceStore(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("instance name %q: %v", bad, err)
		}
	}
}
