package tiers

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/wal"
)

// SharedDisk is a disk tier on a file system several instances mount (docs/sharing.md): this
// instance writes only in its namespace of each path (NamespaceDir), its files are read by the
// others, so none is ever overwritten in place or kept for reuse (Unlink always deletes), and
// its capacity is global: Space has no bound of its own, admission goes through the tier's
// ShareAccount (when the tier has a capacity), which the lease holder grants room to.
type SharedDisk struct {
	*diskBase
	// acct is the admission account; nil without a capacity. Set once at Open, before the
	// writers start.
	acct *ShareAccount
	// sealing: a seal-age request to the dump (0) or relocation (1) writer is in flight.
	sealing [2]atomic.Bool
}

// OpenWriters starts the tier's writers (Disk.OpenWriters).
func (t *SharedDisk) OpenWriters(base wal.Options, dump bool) error {
	return t.openWriters(base, dump, t.Admit)
}

// Admit reserves a new segment's room (Disk.Admit); while a dump waits for room it kicks the
// reclaimer and, with an account, the sharer (the lease holder grants room). It never hands
// back a file to reuse.
func (t *SharedDisk) Admit(_ uint64, dir string, relocation bool) (string, error) {
	kick := t.env.KickReclaimer
	if t.acct != nil {
		kick = func() { t.env.KickReclaimer(); t.env.KickSharer() } // ask the lease holder for room
	}
	return "", t.admit(dir, relocation, kick, nil)
}

// Unlink deletes retired segment n's file and syncs dir: other instances read a shared tier's
// files, so it never keeps one (kept is always false).
func (t *SharedDisk) Unlink(n uint64, dir string, _ int64, _ bool) (bool, error) {
	return false, t.remove(n, dir)
}

// Released frees the segment's bytes.
func (t *SharedDisk) Released(_ string, _ uint64, size int64, _ bool) { t.space.Add(-size) }

// FoundRecycled takes none: a shared tier keeps no file for reuse.
func (t *SharedDisk) FoundRecycled(string, string) (int64, bool) { return 0, false }

// Account is the tier's admission account; nil without a capacity.
func (t *SharedDisk) Account() *ShareAccount { return t.acct }

// SetAccount sets the admission account, once at Open before the writers start.
func (t *SharedDisk) SetAccount(a *ShareAccount) { t.acct = a }

// SealAged asks each writer to seal its active segment once its first record is older than
// age, in the background (goroutines counted in bg), one request per writer at a time: a
// writer still waiting for room takes it only once admitted.
func (t *SharedDisk) SealAged(age time.Duration, bg *sync.WaitGroup) {
	for i, w := range []*wal.Writer{t.w, t.rw} {
		if w == nil || !t.sealing[i].CompareAndSwap(false, true) {
			continue
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			defer t.sealing[i].Store(false)
			if err := w.SealOlderThan(age); err != nil && !errors.Is(err, wal.ErrWriterClosed) {
				t.logger.Warn("ucm: could not seal an aging shared segment", "tier", t.cfg.Name, "err", err)
			}
		}()
	}
}
