package engine

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Sharing: several engine instances on one shared tier (docs/sharing.md), in
// engine/internal/share. Each instance writes only its own namespace and publishes its sealed
// segments in the namespace's manifest; each indexes the other instances' published segments
// in a second Pebble index of its own, the foreign index, refreshed by polling the manifests.
// Lookups and loads consult the instance's own index first, then the foreign one; neither
// touches the shared file system for a lookup. The engine opens the sharing with its
// environment (share_env.go) and keeps here what is the engine's: the instance id and its
// file.

// ForeignDir holds the foreign index in the store directory: a cache of the other instances'
// published segments, rebuilt from their manifests and footers when lost.
const ForeignDir = share.ForeignDir

// SummaryDir, in a namespace of a shared tier, holds the summaries of the namespace's
// published segments, one file per segment named after it (wal.SegmentFileName +
// format.SummaryExt). Only the namespace's owner writes or removes them.
const SummaryDir = share.SummaryDir

// HostIDEnv names an environment variable that, when set, replaces the kernel's boot id as
// this process's host identity in publication logs: processes with different values treat each
// other as on different hosts (only the refresh interval bounds their visibility), as tests
// and benchmarks of a shared file system mounted twice on one machine need.
const HostIDEnv = share.HostIDEnv

// SummaryError reports a segment summary that cannot be used: unreadable, too large, failing
// its checks, or naming another segment, generation, size, owner or schema than its manifest
// entry. It wraps format.ErrCorrupt for damage (errors.Is); the segment is then indexed from
// its footer and record headers.
type SummaryError = share.SummaryError

// isForeign reports whether segment number n is an alias of another instance's segment.
func isForeign(n uint64) bool { return share.IsForeign(n) }

// isOverlay reports whether segment number n is an alias of the publication logs' overlay.
func isOverlay(n uint64) bool { return share.IsOverlay(n) }

// InstanceFile in the store directory holds the instance id (32 hex digits), so that a store
// whose index is rebuilt keeps its namespace on shared tiers.
const InstanceFile = "INSTANCE"

// hasShared reports whether any configured tier is shared.
func hasShared(cfgs []tiers.Config) bool {
	for _, c := range cfgs {
		if c.Shared {
			return true
		}
	}
	return false
}

// loadInstance sets e.instance before the tiers open (a shared tier's namespace is named by
// it): the id the index recorded, else the one in InstanceFile (the index was lost), else a new
// one when a shared tier needs it now (otherwise recovery may still find it in the segments, as
// it did before shared tiers existed). It keeps InstanceFile in step with the index.
func (e *Engine) loadInstance() error {
	path := filepath.Join(e.dir, InstanceFile)
	v, ok, err := e.ix.Meta(metaInstance)
	if err != nil {
		return fmt.Errorf("open %s: %w", e.dir, err)
	}
	if ok && len(v) == len(e.instance) {
		copy(e.instance[:], v)
	} else if id, ferr := readInstanceFile(e, path); ferr == nil {
		e.instance = id
	} else if !errors.Is(ferr, os.ErrNotExist) {
		return ferr
	} else if hasShared(e.opts.tierConfigs(e.dir)) && !e.opts.ReadOnly {
		if e.instance, err = newInstanceID(); err != nil {
			return err
		}
	}
	return e.writeInstanceFile()
}

// writeInstanceFile records e.instance in InstanceFile (durably) unless it is there already.
func (e *Engine) writeInstanceFile() error {
	if e.opts.ReadOnly || e.instance == (format.InstanceID{}) {
		return nil
	}
	path := filepath.Join(e.dir, InstanceFile)
	if id, err := readInstanceFile(e, path); err == nil && id == e.instance {
		return nil
	}
	if err := wal.ReplaceFile(e.fs, path, path+".tmp", []byte(hex.EncodeToString(e.instance[:])+"\n")); err != nil {
		return fmt.Errorf("open %s: record instance id: %w", e.dir, err)
	}
	return nil
}

func readInstanceFile(e *Engine, path string) (format.InstanceID, error) {
	var id format.InstanceID
	f, err := e.fs.Open(path)
	if err != nil {
		if isNotExist(err) {
			return id, os.ErrNotExist
		}
		return id, fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, 2*len(id)+1)
	n, _ := f.ReadAt(buf, 0)
	parsed, ok := tiers.ParseNamespace(strings.TrimSpace(string(buf[:n])))
	if !ok {
		return id, fmt.Errorf("open %s: %w: not an instance id", path, ErrCorrupt)
	}
	return parsed, nil
}

func newInstanceID() (format.InstanceID, error) {
	var id format.InstanceID
	for id == (format.InstanceID{}) {
		if _, err := rand.Read(id[:]); err != nil {
			return id, err
		}
	}
	return id, nil
}

// openSharing opens the sharing of the engine's shared tiers, if it has any (e.share stays
// nil otherwise, and when a read-only open finds no readable foreign index).
func (e *Engine) openSharing() error {
	if !hasShared(e.opts.tierConfigs(e.dir)) {
		return nil
	}
	cfg := share.Config{FS: e.fs, Dir: e.dir, Logger: e.opts.Logger, ReadOnly: e.opts.ReadOnly, LookupOnly: e.opts.LookupOnly,
		RefreshInterval: e.opts.SharedRefreshInterval, OwnerTimeout: e.opts.SharedOwnerTimeout, SealAge: e.opts.SharedSealAge,
		RetireGrace: e.opts.SharedRetireGrace, Tiers: e.tiers, Stop: e.stop, BG: &e.bg, LockHeld: isLockHeld}
	s, err := share.Open(cfg, engineSharingEnv{e})
	e.share = s // also on an error once the foreign index is open: release closes it
	return err
}
