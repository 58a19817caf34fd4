package tiers

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/errors/oserror"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// LeaseFile is the reclaimer lease of a shared path (format.Lease), at the path's root.
const LeaseFile = "RECLAIM.lease"

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
// between hosts), or when there is none or it is unreadable. Two instances taking over at the
// same moment may both believe they hold it until their next Hold (the later rename wins and
// the other sees it): reclamation tolerates that, since retiring a segment twice is harmless.
type Leaser struct {
	FS   vfs.FS
	Root string
	Self format.InstanceID
	// Duration is how long a written lease is valid; Skew how long past its expiry another
	// instance waits before taking it over.
	Duration, Skew time.Duration
}

// Hold renews the lease if this instance holds it, takes it over if it has lapsed, and reports
// whether this instance holds it now, with the lease as read or written.
func (l *Leaser) Hold(now time.Time) (bool, format.Lease, error) {
	cur, err := ReadLease(l.FS, l.Root)
	switch {
	case err == nil:
	case errors.Is(err, ErrNoLease):
		cur = format.Lease{}
	case errors.Is(err, format.ErrCorrupt):
		cur = format.Lease{} // unreadable: taken over like a lapsed one
	default:
		return false, cur, err
	}
	if cur.Holder != l.Self && cur.Holder != (format.InstanceID{}) && now.UnixNano() <= cur.Expiry+l.Skew.Nanoseconds() {
		return false, cur, nil // held by another instance
	}
	next := format.Lease{Holder: l.Self, Expiry: now.Add(l.Duration).UnixNano(), Term: cur.Term}
	if cur.Holder != l.Self {
		next.Term++
	}
	if err := writeLease(l.FS, l.Root, next); err != nil {
		return false, cur, err
	}
	if cur.Holder == l.Self {
		return true, next, nil
	}
	// A takeover: another contender may have renamed its lease over ours meanwhile.
	got, err := ReadLease(l.FS, l.Root)
	if err != nil {
		return false, next, err
	}
	return got.Holder == l.Self, got, nil
}
