// Package seam names the points where the engine calls its test seam: a function tests set to
// force an interleaving (a load with reclamation or with the sharer) at one statement. The
// engine and its internal parts name the same points; the engine holds the hook and calls it
// (an internal part through its environment). Outside tests no hook is set and a point costs
// one atomic load.
package seam

// Point names a statement where the seam is called.
type Point int

const (
	// SidecarLookedUp: LoadSidecars has read a sidecar's index entry and not yet pinned its
	// segment.
	SidecarLookedUp Point = iota + 1
	// SidecarRead: a sidecar's bytes were read from disk (LoadSidecars) or appended
	// (DumpSidecars) and are not yet in the memory tier.
	SidecarRead
	// ForeignIndexed: the sharer has applied the entries of another instance's segment to the
	// foreign index (the id is zero).
	ForeignIndexed
	// ManifestRead: the sharer has read another instance's manifest and not yet indexed what
	// it lists (the id is zero).
	ManifestRead
	// ForeignMissed: a load found no entry of the block in the foreign index and has not yet
	// read the overlay.
	ForeignMissed
	// SegmentPinned: a load or a copy pinned the segment of the block's entry and has not read
	// it yet.
	SegmentPinned
)
