package tiers

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// LeaseFile is the reclaimer lease of a shared path (format.Lease), at the path's root.
const LeaseFile = "RECLAIM.lease"

// LeaseLockFile is the file, beside the lease, whose lock an instance holds while it decides
// and writes the lease (Leaser.Hold): an empty file, never renamed or removed.
const LeaseLockFile = "RECLAIM.lock"

// ErrNoLease is returned by ReadLease when the path has no lease yet.
var ErrNoLease = errors.New("no reclaimer lease")

// ReadLease reads and checks the lease of shared path root.
func ReadLease(fs vfs.FS, root string) (format.Lease, error) {
	path := filepath.Join(root, LeaseFile)
	buf := make([]byte, format.LeaseSize+1) // one more: a longer file is refused, not cut
	var n int
	err := ReadReplaced(fs, path, func(f vfs.File) error {
		var err error
		n, err = f.ReadAt(buf, 0)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return err
	})
	if oserror.IsNotExist(err) {
		return format.Lease{}, fmt.Errorf("%s: %w: %w", path, ErrNoLease, os.ErrNotExist)
	}
	if err != nil {
		return format.Lease{}, fmt.Errorf("read lease %s: %w", path, err)
	}
	l, err := format.DecodeLease(buf[:n])
	if err != nil {
		return format.Lease{}, fmt.Errorf("read lease %s: %w", path, err)
	}
	return l, nil
}

// writeLease replaces the lease of root with l atomically (each instance writes its own
// temporary file, so two contenders never write into one).
func writeLease(fs vfs.FS, root string, l format.Lease) error {
	tmp := filepath.Join(root, LeaseFile+"."+hex.EncodeToString(l.Holder[:])+".tmp")
	if err := wal.ReplaceFile(fs, filepath.Join(root, LeaseFile), tmp, format.EncodeLease(l)); err != nil {
		return fmt.Errorf("write lease in %s: %w", root, err)
	}
	return nil
}

// Leaser takes and keeps the reclaimer lease of one shared path for one instance. Election
// goes through the file system alone: the holder renews the lease before it expires; any
// instance takes it over once it has been expired for Skew (a bound on the clock difference
// between hosts), or when there is none or it is unreadable.
//
// Only one instance writes the lease at a time: each decides and writes under the lock of
// LeaseLockFile, taken without waiting, and one that finds it taken leaves the lease to the
// instance that holds it. So two instances never rename onto the lease at once — which on a
// GlusterFS volume of several bricks can deadlock the two clients' renames for the volume's
// frame timeout (30 minutes by default), with every other call in the directory queued
// behind them — and a takeover is decided on the lease as read under the lock, not on a read
// from before another instance replaced it. (A GlusterFS client may still show a lease
// another instance just replaced: two holders for an interval, which reclamation tolerates,
// since retiring a segment twice is harmless.)
type Leaser struct {
	FS   vfs.FS
	Root string
	Self format.InstanceID
	// Duration is how long a written lease is valid; Skew how long past its expiry another
	// instance waits before taking it over.
	Duration, Skew time.Duration
	// LockHeld reports whether a failed lock of LeaseLockFile means another holder (nil: every
	// lock error does); any other lock error is Hold's.
	LockHeld func(error) bool
}

// Hold renews the lease if this instance holds it, takes it over if it has lapsed, and reports
// whether this instance holds it now, with the lease as read or written. While another
// instance holds the lease's lock, this one holds the lease only if the lease it read names
// it and has not expired; it renews at its next Hold. A lease being replaced under every
// read (ESTALE, ReadReplaced) is being written by another instance: not held, no error.
func (l *Leaser) Hold(now time.Time) (bool, format.Lease, error) {
	cur, err := l.read()
	if errors.Is(err, syscall.ESTALE) {
		// Replaced under every open (ReadReplaced): another instance is writing it.
		return false, format.Lease{}, nil
	}
	if err != nil || !l.mayWrite(cur, now) {
		return false, cur, err
	}
	lockPath := filepath.Join(l.Root, LeaseLockFile)
	lock, err := l.FS.Lock(lockPath)
	if err != nil {
		if l.LockHeld == nil || l.LockHeld(err) {
			return cur.Holder == l.Self && now.UnixNano() <= cur.Expiry, cur, nil
		}
		return false, cur, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	defer func() { _ = lock.Close() }()
	// Under the lock, on the lease as it stands now: another instance may have written it
	// between the read above and the lock.
	if cur, err = l.read(); err != nil {
		return false, cur, fmt.Errorf("under the lease's lock: %w", err)
	}
	if !l.mayWrite(cur, now) {
		return false, cur, nil
	}
	next := format.Lease{Holder: l.Self, Expiry: now.Add(l.Duration).UnixNano(), Term: cur.Term}
	if cur.Holder != l.Self {
		next.Term++
	}
	if err := writeLease(l.FS, l.Root, next); err != nil {
		return false, cur, err
	}
	return true, next, nil
}

// read reads the lease, a missing or unreadable one as the zero lease (taken over).
func (l *Leaser) read() (format.Lease, error) {
	cur, err := ReadLease(l.FS, l.Root)
	switch {
	case err == nil:
		return cur, nil
	case errors.Is(err, ErrNoLease), errors.Is(err, format.ErrCorrupt):
		return format.Lease{}, nil
	default:
		return cur, err
	}
}

// mayWrite reports whether this instance may write lease cur at now: it holds it, or nobody
// does, or it has been expired for Skew.
func (l *Leaser) mayWrite(cur format.Lease, now time.Time) bool {
	return cur.Holder == l.Self || cur.Holder == (format.InstanceID{}) || now.UnixNano() > cur.Expiry+l.Skew.Nanoseconds()
}
