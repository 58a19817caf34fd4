package engine

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestMoveStore: a store directory is moved only when its SCHEMA file records the schema and
// layout asked for, never while it is open (ErrLocked), and keeps its blocks; IsStoreDir tells
// a store directory from one that merely holds stores.
func TestMoveStore(t *testing.T) {
	root := t.TempDir()
	legacy, dir := filepath.Join(root, "old"), filepath.Join(root, "ns", "new")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := Options{Layout: mhaLayout, Schema: testSchema}
	e := mustOpen(t, legacy, opts)
	blocks := ids(0, 4)
	dumpBlocks(t, e, blocks)
	if !IsStoreDir(legacy) || IsStoreDir(root) {
		t.Fatalf("IsStoreDir: store %v, its parent %v", IsStoreDir(legacy), IsStoreDir(root))
	}
	if err := MoveStore(legacy, dir, testSchema, mhaLayout, 0o755, log); !errors.Is(err, ErrLocked) {
		t.Fatalf("move of an open store: %v, want ErrLocked", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	other := Layout{Shards: 2, TensorsPerShard: 2, ShardBytes: 2 * 4096}
	if err := MoveStore(legacy, dir, testSchema, other, 0o755, log); err != nil {
		t.Fatal(err)
	}
	if !IsStoreDir(legacy) {
		t.Fatal("a store of another layout was moved")
	}
	if err := MoveStore(legacy, dir, testSchema, mhaLayout, 0o755, log); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(legacy); !errors.Is(err, os.ErrNotExist) || !IsStoreDir(dir) {
		t.Fatalf("not moved: old %v, new is a store %v", err, IsStoreDir(dir))
	}
	e = mustOpen(t, dir, opts)
	defer e.Close()
	checkBlocks(t, e, blocks)
	// Nothing at the old place: nothing to do.
	if err := MoveStore(legacy, dir, testSchema, mhaLayout, 0o755, log); err != nil {
		t.Fatal(err)
	}
}
