package engine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/wal"
)

// IsStoreDir reports whether dir is a store directory: it has the lock file (LockFile) and
// the index (IndexDir). A directory that merely holds stores (a layout namespace) is not one.
func IsStoreDir(dir string) bool {
	lock, err := os.Stat(filepath.Join(dir, LockFile))
	if err != nil || !lock.Mode().IsRegular() {
		return false
	}
	ix, err := os.Stat(filepath.Join(dir, IndexDir))
	return err == nil && ix.IsDir()
}

// MoveStore moves the store directory legacy to dir when its SchemaFile records s and l and
// dir does not exist yet, so that a store found at an older place keeps its blocks. It holds
// the store's lock while it renames (a process running the store keeps it: ErrLocked), creates
// dir's parents with mode, and syncs both parent directories. It does nothing (nil) when
// legacy is not a store directory (IsStoreDir), records another schema or layout, or dir
// exists; a store without a readable SCHEMA file is left too, logged on log with how to move
// it.
func MoveStore(legacy, dir string, s Schema, l Layout, mode os.FileMode, log *slog.Logger) error {
	if !IsStoreDir(legacy) {
		return nil
	}
	text, err := readSchemaText(filepath.Join(legacy, SchemaFile))
	if err != nil {
		log.Warn("ucm: a store at the place instance stores had before layout namespaces has no readable SCHEMA file; it is left there: "+
			"open it once with its configuration by its path (engine.Open, ucm-tool) to record its schema, or move it to "+
			filepath.Join(filepath.Dir(legacy), "<namespace>", filepath.Base(legacy))+" by hand",
			"path", legacy, "err", err)
		return nil
	}
	if text != s.Canonical(l) {
		return nil // another layout's: moved when that layout opens it
	}
	if _, err := os.Stat(dir); err == nil {
		log.Warn("ucm: a store of this layout is at both the pre-namespace place and its namespace; using the namespace's, the other is left as it is",
			"namespace_store", dir, "left", legacy)
		return nil
	}
	lock, err := storeFS(vfs.Default, DefaultFileMode, mode, false).Lock(filepath.Join(legacy, LockFile))
	if err != nil {
		if isLockHeld(err) {
			return fmt.Errorf("move %s to %s: the store is in use by another process or engine: %w", legacy, dir, ErrLocked)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil // moved by another process meanwhile
		}
		return fmt.Errorf("move %s to %s: lock: %w", legacy, dir, err)
	}
	defer func() { _ = lock.Close() }()
	if !IsStoreDir(legacy) {
		return nil // moved by another process between the check and the lock
	}
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), mode); err != nil {
		return fmt.Errorf("move %s to %s: %w", legacy, dir, err)
	}
	if err := os.Rename(legacy, dir); err != nil {
		return fmt.Errorf("move %s to %s: %w", legacy, dir, err)
	}
	for _, d := range []string{filepath.Dir(dir), filepath.Dir(legacy)} {
		if err := wal.SyncDir(vfs.Default, d); err != nil {
			return fmt.Errorf("move %s to %s: %w", legacy, dir, err)
		}
	}
	log.Info("ucm: moved an instance store into its layout namespace", "from", legacy, "to", dir)
	return nil
}

// readSchemaText returns a SCHEMA file's text when it is a canonical schema (bounded read).
func readSchemaText(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxSchemaFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxSchemaFileBytes {
		return "", fmt.Errorf("%s: longer than %d bytes: %w", path, maxSchemaFileBytes, ErrCorrupt)
	}
	if _, _, err := parseCanonical(string(b)); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return string(b), nil
}
