package share

import (
	"path/filepath"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// Admission on a shared tier (docs/tiers.md, "Shared tiers"): each shared tier with a capacity
// keeps a tiers.ShareAccount, which holds the rules (monotone grants and credits, a request
// answered once, a new holder's wait, the credit of a gone instance). This file opens it and
// is its environment: the reservation, the namespace's metadata charge, the bytes under grace,
// the kicks and the clock.

// manifestsOf returns the manifests of ms, for the account.
func manifestsOf(ms []nsManifest) []*format.Manifest {
	out := make([]*format.Manifest, len(ms))
	for i := range ms {
		out[i] = ms[i].Manifest
	}
	return out
}

// GraceBytes sums this instance's retired segments of tier t waiting for their grace.
func (s *Sharing) GraceBytes(t tiers.Disk) int64 {
	s.mu.Lock()
	ns := make([]uint64, 0, len(s.grace))
	for n := range s.grace {
		ns = append(ns, n)
	}
	s.mu.Unlock()
	var sum int64
	for _, n := range ns {
		if row, ok := s.env.OwnSegment(n); ok && s.env.TierOf(n) == t {
			sum += row.Size
		}
	}
	return sum
}

// spaceNotes returns the account notes the manifest of namespace dir carries: this instance's
// credit and space, and the grants it issued as lease holder.
func (s *Sharing) spaceNotes(dir string) []format.ManifestNote {
	var notes []format.ManifestNote
	for _, t := range s.cfg.Tiers {
		if accountOf(t) != nil && filepath.Dir(t.Dirs()[0]) == dir {
			notes = append(notes, accountOf(t).Notes()...)
		}
	}
	return notes
}

// accountStats sums this instance's shares, held bytes and requests over its shared tiers.
func (s *Sharing) accountStats() (share, held, asked int64) {
	for _, t := range s.cfg.Tiers {
		if accountOf(t) == nil {
			continue
		}
		s, h, a := accountOf(t).Stats()
		share, held, asked = share+s, held+h, asked+a
	}
	return share, held, asked
}
