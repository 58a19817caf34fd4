package engine

import (
	"github.com/ucm-go/ucm/tiers"
)

// The disk tiers are tiers.Disk (tiers/disk.go: tiers.LocalDisk, tiers.SharedDisk). This file is
// their environment: the store file system's reserve and the kicks of the background workers,
// as share_space.go is the shared account's.

// diskEnv is the environment of the disk tiers (tiers.DiskEnv). Its methods take none of the
// engine's locks but the reserve's own.
type diskEnv struct{ e *Engine }

// AdmitStore checks the store file system's reserve for a new segment in dir (reserve.go).
func (v diskEnv) AdmitStore(dir string, reservation int64) error {
	return v.e.admitSpace(dir, reservation)
}

// KickReclaimer asks the reclaimer to look at the tiers now.
func (v diskEnv) KickReclaimer() { v.e.kickReclaimer() }

// KickSharer asks the sharer for a pass (a shared tier's lease holder grants room).
func (v diskEnv) KickSharer() { v.e.share.Kick() }

// Stop is closed when the engine stops.
func (v diskEnv) Stop() <-chan struct{} { return v.e.stop }

// accountOf returns shared tier t's admission account; nil for a local tier or a shared one
// without a capacity. Any tier with an Account method has one (*tiers.SharedDisk, and the fake
// tiers of the reclaimer's tests).
func accountOf(t tiers.Disk) *tiers.ShareAccount {
	if s, ok := t.(interface{ Account() *tiers.ShareAccount }); ok {
		return s.Account()
	}
	return nil
}
