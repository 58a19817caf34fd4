package engine

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/tiers"
)

// Admission on a shared tier (docs/tiers.md, "Shared tiers"): each shared tier with a capacity
// keeps a tiers.ShareAccount, which holds the rules (monotone grants and credits, a request
// answered once, a new holder's wait, the credit of a gone instance). This file opens it and
// is its environment: the reservation, the namespace's metadata charge, the bytes under grace
// (the sharing's), the kicks and the clock.

// shareEnv is the environment of shared tier t's account (tiers.ShareEnv).
type shareEnv struct {
	e     *Engine
	t     tiers.Disk
	nsDir string // the namespace (first path) whose manifest carries the account's notes
}

func (v shareEnv) Reservation() int64                      { return v.e.reservation(v.t) }
func (v shareEnv) MetadataCharge() (charge int64, ok bool) { return metadataCharge(v.e.fs, v.nsDir) }
func (v shareEnv) GraceBytes() int64                       { return v.e.share.GraceBytes(v.t) }
func (v shareEnv) KickSharer()                             { v.e.share.Kick() }
func (v shareEnv) KickReclaimer()                          { v.e.kickReclaimer() }
func (v shareEnv) Now() time.Time                          { return time.Now() }

// openSharedAccount starts the account of shared tier t: admission bounded by the limit the
// account's notes in this instance's newest manifest give (none before its first grant). A
// lookup-only instance keeps one too: it writes nothing, but may hold the lease and grant.
func (e *Engine) openSharedAccount(t tiers.Disk) error {
	sd, ok := t.(*tiers.SharedDisk)
	if !ok || t.Config().Capacity <= 0 || e.opts.ReadOnly || len(t.Dirs()) == 0 {
		return nil
	}
	nsDir := filepath.Dir(t.Dirs()[0])
	m, err := tiers.ReadManifest(e.fs, nsDir, e.instance)
	switch {
	case errors.Is(err, tiers.ErrNoManifest):
		m = nil
	case err != nil:
		return fmt.Errorf("open tier %q: this instance's share of the capacity: %w", t.Name(), err)
	}
	cfg := tiers.ShareConfig{Self: e.instance, Capacity: t.Config().Capacity, Below: t.Pos() > 0,
		RefreshInterval: e.opts.SharedRefreshInterval}
	a, err := tiers.NewShareAccount(cfg, t.Space(), shareEnv{e: e, t: t, nsDir: nsDir}, m)
	if err != nil {
		return fmt.Errorf("open tier %q: %w", t.Name(), err)
	}
	sd.SetAccount(a)
	return nil
}

// metadataAhead is how far ahead of its size the namespace's other files are accounted: what a
// publication log may grow by until the next refresh.
const metadataAhead = 64 << 10

// metadataCharge is what the files of namespace nsDir other than segments take on the tier
// (the manifest, counted twice: a new one is written before the old is deleted; publication
// logs; the lock), plus metadataAhead: one listing.
func metadataCharge(fs vfs.FS, nsDir string) (int64, bool) {
	names, err := fs.List(nsDir)
	if err != nil {
		return 0, false
	}
	charge := int64(metadataAhead)
	for _, n := range names {
		if n == SegmentDir {
			continue
		}
		st, err := fs.Stat(filepath.Join(nsDir, n))
		if err != nil || st.IsDir() {
			continue
		}
		if strings.HasPrefix(n, tiers.ManifestPrefix) {
			charge += st.Size()
		}
		charge += st.Size()
	}
	return charge, true
}
