package connector

import (
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/ucm-go/ucm/engine"
	"golang.org/x/sys/unix"
)

// shmBase is the tmpfs every Linux host mounts; DefaultShmDir lies under it.
var shmBase = "/dev/shm"

// DefaultShmDir is where Cache|Empty stores live unless UCMGO_SHM_DIR names another directory:
// one directory per store (cache-<unique_id> when shared, private-<pid>-<random> when not),
// each with a lock file beside it (<name>.lock).
const DefaultShmDir = "/dev/shm/ucmgo"

// Prefixes of the directories the lock protocol manages (and only those are ever swept).
const (
	shmSharedPrefix  = "cache-"
	shmPrivatePrefix = "private-"
	shmEmptyPrefix   = "empty-"
	shmLockSuffix    = ".lock"
	// shmAcquireTries bounds the retries when the lock file is replaced under an opener (its
	// last user removing the directory at the same moment).
	shmAcquireTries = 100
)

// shmDir is a directory used by one or more stores (of this and other processes) and removed
// by the last of them to release it. Every user holds a shared flock on <dir>.lock while it
// uses the directory; a releaser drops its own, then takes the exclusive lock without waiting:
// it succeeds only when no other user holds one, and then removes the directory and the lock
// file (in that order) before letting go. An opener that got its shared lock on a lock file
// that was unlinked meanwhile (the inode behind the path changed) retries with the new one. A
// process killed holding a lock loses it with the process, so a crashed set's directory is
// stale: the next opener of any store under the same root removes it (sweepShm).
type shmDir struct {
	path string
	lock *os.File
}

// shmName is the directory name of a store: cache-<unique_id> (shared; a unique_id that is not
// a short portable file name is hashed), or a private name unique to this opening.
func shmName(prefix, uniqueID string) string {
	if prefix != shmSharedPrefix {
		var r [6]byte
		_, _ = rand.Read(r[:])
		return fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), hex.EncodeToString(r[:]))
	}
	if portableName.MatchString(uniqueID) {
		return prefix + uniqueID
	}
	sum := md5.Sum([]byte(uniqueID))
	return prefix + "md5-" + hex.EncodeToString(sum[:])
}

var portableName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`)

// acquireShmDir takes a user's share of <root>/<name> (creating both), after sweeping the stale
// directories of crashed users under root.
func acquireShmDir(root, name string) (*shmDir, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", root, err)
	}
	sweepShm(root, name)
	path := filepath.Join(root, name)
	lockPath := path + shmLockSuffix
	for range shmAcquireTries {
		f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("cache directory %s: lock: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("cache directory %s: lock: %w", path, err)
		}
		if !sameFile(f, lockPath) {
			_ = f.Close() // its last user removed it while we waited: take the new one
			continue
		}
		if err := os.MkdirAll(path, 0o755); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("cache directory %s: %w", path, err)
		}
		return &shmDir{path: path, lock: f}, nil
	}
	return nil, fmt.Errorf("cache directory %s: its lock file kept being replaced: %w", path, engine.ErrLocked)
}

// release gives up this user's share; the last user removes the directory. It reports whether
// this call removed it.
func (d *shmDir) release() (bool, error) {
	if d == nil || d.lock == nil {
		return false, nil
	}
	lockPath := d.path + shmLockSuffix
	_ = d.lock.Close() // drops the shared lock
	d.lock = nil
	return removeIfUnused(d.path, lockPath)
}

// removeIfUnused removes dir and its lock file when nobody holds the lock.
func removeIfUnused(dir, lockPath string) (bool, error) {
	f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil // removed by another user already
		}
		return false, fmt.Errorf("cache directory %s: lock: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, nil // in use
	}
	if !sameFile(f, lockPath) {
		return false, nil // a new generation: not ours to remove
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("cache directory %s: remove: %w", dir, err)
	}
	if err := os.Remove(lockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("cache directory %s: remove lock: %w", dir, err)
	}
	return true, nil
}

// sweepShm removes the directories under root whose users are all gone (crashed: a clean
// close removes its own), except name's. Only names the protocol makes are touched.
func sweepShm(root, except string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), shmLockSuffix)
		if !ok || name == except || !(strings.HasPrefix(name, shmSharedPrefix) ||
			strings.HasPrefix(name, shmPrivatePrefix) || strings.HasPrefix(name, shmEmptyPrefix)) {
			continue
		}
		_, _ = removeIfUnused(filepath.Join(root, name), filepath.Join(root, e.Name()))
	}
}

// sameFile reports whether the open file f is still the file at path.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// tmpfsBytes is the size of the file system holding dir (0 when unknown).
func tmpfsBytes(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Blocks) * int64(st.Bsize)
}
