package share

import (
	"time"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Home is where one of the engine's own segments lives: its directory and its tier.
type Home struct {
	Dir  string
	Tier tiers.Disk
}

// ForeignSegment is a segment of another instance that the foreign index (or the overlay of
// the publication logs) holds entries of, under its alias.
type ForeignSegment struct {
	Instance format.InstanceID
	Number   uint64
	Dir      string     // its segment directory
	Tier     tiers.Disk // the shared tier it was found in
}

// ScannedLocation is the index location of record r of segment n, as a scan read it.
func ScannedLocation(n uint64, r *wal.ScannedRecord) index.Location {
	return index.Location{Segment: n, Offset: r.Offset, Layout: r.Header.Layout, Seq: r.Header.Seq,
		HeaderCRC: r.HeaderCRC, ShardCRCs: r.Header.ShardCRCs,
		Compression: r.Header.Compression, StoredLens: r.Header.StoredLens, StoredCRCs: r.Header.StoredCRCs,
		BatchBlocks: r.BatchBlocks, BatchPos: r.BatchPos}
}

// accountOf returns the capacity account of shared tier t, or nil (none, or not shared).
func accountOf(t tiers.Disk) *tiers.ShareAccount {
	if sd, ok := t.(*tiers.SharedDisk); ok {
		return sd.Account()
	}
	return nil
}

// ForeignIndex returns the foreign index: the other instances' published blocks and sidecars
// (nil on a nil Sharing). Its own methods are safe for concurrent use; the Sharing alone
// writes it.
func (s *Sharing) ForeignIndex() *index.Index {
	if s == nil {
		return nil
	}
	return s.fx
}

// ForeignSegment returns the foreign segment that alias stands for, if it stands for one.
func (s *Sharing) ForeignSegment(alias uint64) (ForeignSegment, bool) {
	fs, ok := s.foreignSegment(alias)
	return ForeignSegment{Instance: fs.inst, Number: fs.number, Dir: fs.dir, Tier: fs.tier}, ok
}

// HasAlias reports whether segment number of instance inst has an alias (is indexed).
func (s *Sharing) HasAlias(inst format.InstanceID, number uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.aliases[foreignKey{inst, number}]
	return ok
}

// OverlaySize returns how many blocks the overlay of the publication logs holds.
func (s *Sharing) OverlaySize() int {
	s.ov.emu.RLock()
	defer s.ov.emu.RUnlock()
	return len(s.ov.blocks)
}

// NoteForeignHit counts a load served from another instance's segment.
func (s *Sharing) NoteForeignHit() { s.foreignHits.Add(1) }

// NoteCopiedToMemory counts a foreign block cached in the memory tier after a load.
func (s *Sharing) NoteCopiedToMemory() { s.copiedToMemory.Add(1) }

// NoteCopiedToDisk counts n foreign blocks copied into the engine's own first disk tier.
func (s *Sharing) NoteCopiedToDisk(n int64) { s.copiedToDisk.Add(n) }

// Refreshes returns how many refreshes of the foreign index have begun.
func (s *Sharing) Refreshes() int64 { return s.refreshes.Load() }

// Stats has the fields of the engine's SharingStats, in the same order and with the same
// meaning (documented there): the engine converts one into the other.
type Stats struct {
	ForeignSegments                                          int
	ForeignBlocks                                            int64
	ForeignHits                                              int64
	Refreshes, RefreshErrors                                 int64
	SegmentsIndexed, SegmentsDropped                         int64
	ManifestsPublished, PublishErrors                        int64
	VisibilityLatency                                        time.Duration
	VisibilitySamples                                        int64
	LeaseHeld                                                bool
	SharedUsed, ReclaimRounds, RetiredOnRequest              int64
	ReclaimedOfGone, UnlinkedOfGone, ReclaimedWhileGone      int64
	CopiedToMemory, CopiedToDisk                             int64
	LogRecords, LogAppendErrors                              int64
	SegmentsListed                                           int
	IndexedFromSummary, IndexedFromHeaders, SummariesDamaged int64
	IndexedRecords                                           int64
	SharedShare, SharedHeld, SharedAsked                     int64
}

// Stats returns the sharing's counters, its indexing progress and the admission figures of
// its shared tiers.
func (s *Sharing) Stats() Stats {
	st := Stats{ForeignHits: s.foreignHits.Load(), Refreshes: s.refreshes.Load(), RefreshErrors: s.refreshErrors.Load(),
		SegmentsIndexed: s.segmentsIndexed.Load(), SegmentsDropped: s.dropped.Load(),
		ManifestsPublished: s.published.Load(), PublishErrors: s.publishErrors.Load(), VisibilitySamples: s.visibleSamples.Load(),
		LeaseHeld: s.leaseHeld.Load(), SharedUsed: s.sharedUsed.Load(), ReclaimRounds: s.reclaimRounds.Load(), RetiredOnRequest: s.retiredOnRequest.Load(),
		ReclaimedOfGone: s.reclaimedOfGone.Load(), UnlinkedOfGone: s.unlinkedOfGone.Load(), ReclaimedWhileGone: s.reclaimedWhileGone.Load(),
		CopiedToMemory: s.copiedToMemory.Load(), CopiedToDisk: s.copiedToDisk.Load(),
		IndexedFromSummary: s.fromSummary.Load(), IndexedFromHeaders: s.fromHeaders.Load(), SummariesDamaged: s.summaryDamaged.Load(),
		IndexedRecords: s.indexedRecords.Load()}
	s.mu.Lock()
	for _, n := range s.listedByNS {
		st.SegmentsListed += n
	}
	s.mu.Unlock()
	st.LogRecords = s.ov.records.Load()
	st.SharedShare, st.SharedHeld, st.SharedAsked = s.accountStats()
	s.logs.mu.Lock()
	st.LogAppendErrors = s.logs.appendErrors
	s.logs.mu.Unlock()
	if n := st.VisibilitySamples; n > 0 {
		st.VisibilityLatency = time.Duration(s.visibleAt.Load() / n)
	}
	if s.fx != nil {
		st.ForeignBlocks, _, _ = s.fx.Totals()
		st.ForeignSegments = len(s.fx.Segments())
	}
	return st
}
