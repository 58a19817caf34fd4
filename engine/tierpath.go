package engine

import (
	"fmt"
	"path/filepath"
	"syscall"
)

// Tier paths inside the store directory belong to the store: the configuration the store
// records (engine.tiers) names them relative to it ("." for the directory itself, "hdd" for
// <dir>/hdd), so that a copied or moved store works on its own directories and never on those
// of the store it was copied from. Paths outside the store are recorded absolute. Records
// written before this rule hold absolute paths for every path but the store directory: one
// that points inside this store's directory is read as the store's own and recorded relative
// at the next writable Open; one that points inside another store's directory (a copy of that
// store) is refused, naming both, rather than letting the copy evict, compact or delete the
// other store's segments.

// recordedPath returns how tier path p is recorded: relative to the store directory when p is
// the store directory or inside it, else absolute (p as given when it cannot be made so).
func (e *Engine) recordedPath(p string) string {
	if rel, ok := e.withinStore(p); ok {
		return rel
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// resolveRecordedPath turns a recorded tier path into the path to open: a relative one is
// joined to the store directory ("." is the store directory itself, as spelled at Open).
func (e *Engine) resolveRecordedPath(p string) string {
	switch {
	case p == storedStoreDir:
		return e.dir
	case filepath.IsAbs(p):
		return p
	default:
		return filepath.Join(e.dir, p)
	}
}

// withinStore reports whether p is the store directory or a path inside it, and if so p relative
// to it. The store directory is recognised by its spelling (after filepath.Abs) or, on a file
// system that has inode numbers, as the same directory reached by another spelling (a symbolic
// link).
func (e *Engine) withinStore(p string) (string, bool) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", false
	}
	for d := abs; ; d = filepath.Dir(d) {
		if e.isStoreItself(d) {
			rel, err := filepath.Rel(d, abs)
			return rel, err == nil
		}
		if d == filepath.Dir(d) {
			return "", false
		}
	}
}

// isStoreItself reports whether directory d is this engine's store directory.
func (e *Engine) isStoreItself(d string) bool {
	own, err := filepath.Abs(e.dir)
	if err != nil {
		return false
	}
	if filepath.Clean(d) == own {
		return true
	}
	a, errA := e.fs.Stat(d)
	b, errB := e.fs.Stat(own)
	if errA != nil || errB != nil {
		return false
	}
	sa, okA := a.Sys().(*syscall.Stat_t)
	sb, okB := b.Sys().(*syscall.Stat_t)
	return okA && okB && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// foreignStore returns the directory of the store that tier path p lies in when that store is
// not this one ("" otherwise): the nearest directory at or above p that holds a store (its lock
// file and index directory).
func (e *Engine) foreignStore(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return ""
	}
	for d := abs; ; d = filepath.Dir(d) {
		if e.isStoreItself(d) {
			return ""
		}
		if e.looksLikeStore(d) {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// looksLikeStore reports whether directory d holds a store: the lock file and the index
// directory (a tier path holds a lock file and segments, never an index).
func (e *Engine) looksLikeStore(d string) bool {
	lock, err := e.fs.Stat(filepath.Join(d, LockFile))
	if err != nil || lock.IsDir() {
		return false
	}
	ix, err := e.fs.Stat(filepath.Join(d, IndexDir))
	return err == nil && ix.IsDir()
}

// errForeignTierPath is the refusal of a tier path inside another store's directory.
func (e *Engine) errForeignTierPath(tier, p, other string, recorded bool) error {
	if recorded {
		return fmt.Errorf("open %s: the store records tier %q path %s, which is inside another store, %s: this store is a copy of that one made "+
			"when tier paths inside a store were recorded as absolute paths, and using the recorded path would change %s; "+
			"open %s once read-write with its tiers configured (engine.Options.Tiers, or the connector's configuration) naming its own directories, "+
			"which records them relative to it: %w",
			e.dir, tier, p, other, other, e.dir, ErrInvalidArgument)
	}
	return fmt.Errorf("open %s: tier %q path %s is inside another store, %s: a store's directory holds that store's data only; "+
		"give the tier a directory outside %s (or inside %s): %w", e.dir, tier, p, other, other, e.dir, ErrInvalidArgument)
}
