package share

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/engine/internal/lifecycle"
	"github.com/ucm-go/ucm/engine/internal/seam"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Sharing: several engine instances on one shared tier (docs/sharing.md). Each instance writes
// only its own namespace and publishes its sealed segments in the namespace's manifest
// (Publish); each indexes the other instances' published segments in a second Pebble
// index of its own, the foreign index, refreshed by polling the manifests (refreshShared).
// Lookups and loads consult the instance's own index first, then the foreign one; neither
// touches the shared file system for a lookup.

// ForeignDir holds the foreign index in the store directory: a cache of the other instances'
// published segments, rebuilt from their manifests and footers when lost.
const ForeignDir = "foreign"

// foreignAlias marks the segment numbers of the foreign index: a foreign segment is known
// locally by an alias with this bit set (its owner's number may equal one of ours). The
// instance's own segment numbers never reach it.
const foreignAlias = 1 << 63

// IsForeign reports whether segment number n is an alias of another instance's segment (the
// engine's own numbers never have the marker bit).
func IsForeign(n uint64) bool { return n&foreignAlias != 0 }

// Foreign-index meta keys: the alias of every indexed foreign segment, the next alias, and the
// other copies of indexed blocks and sidecars (copyKey).
const (
	metaForeignSeg   = "share.seg."
	metaForeignNext  = "share.next_alias"
	metaForeignCopy  = "share.copy."
	foreignSegPrefix = 16 + 8 + 8 // instance, number, generation; the directory follows
)

// foreignSeg is a segment of another instance that the foreign index holds entries of.
type foreignSeg struct {
	inst       format.InstanceID
	number     uint64
	generation uint64
	dir        string // its segment directory
	tier       tiers.Disk
}

type foreignKey struct {
	inst   format.InstanceID
	number uint64
}

// Sharing is the engine's state for its shared tiers; nil when it has none. It reaches the
// rest of the engine only through env (share_env.go) and holds the values it was opened with
// in cfg. Lock order: the reclaimer's lock, then the segments' lock, then mu: mu is never held
// around a call into env that takes either (see Env).
type Sharing struct {
	cfg Config
	env Env

	fx   *index.Index // the foreign index
	kick lifecycle.Kick

	mu      sync.Mutex
	segs    map[uint64]foreignSeg // alias → segment
	aliases map[foreignKey]uint64
	next    uint64                     // next alias (without the marker bit)
	ignored map[format.InstanceID]bool // namespaces of another schema, logged once
	opened  int64                      // when this instance opened (Unix ns): visibility counts segments published since
	lastPub map[string][]byte          // namespace dir → body (entries, notes) of the manifest written
	firstAt map[uint64]int64           // own segment → when first published
	// pendingSidecars are other instances' sidecars met before their block was indexed (the
	// block moved by compaction to a segment published later), per alias: indexed once the
	// block is, forgotten with their segment.
	pendingSidecars map[uint64][]pendingSidecar

	// Access hints and the reclaimer's requests (reclaim.go).
	accessed   map[foreignKey]accessNote // other instances' segments this one read, and when
	ownAccess  map[uint64]int64          // own shared segments' last read
	retireReqs map[foreignKey]accessNote // as lease holder: segments asked to be retired

	leaseHeld                                   atomic.Bool
	sharedUsed, reclaimRounds, retiredOnRequest atomic.Int64

	// Liveness and the reclamation of gone instances' segments (reclaim.go).
	seen                                                map[string]manifestSeen // other namespaces' newest manifests, as observed
	lastSeq                                             map[string]uint64       // own namespace dir → sequence of the manifest written
	lastWrite                                           map[string]time.Time    // own namespace dir → when it was written
	unlinked                                            map[foreignKey]bool     // gone owners' reclaimed segments unlinked here
	reclaimedOfGone, unlinkedOfGone, reclaimedWhileGone atomic.Int64

	// grace holds retired own segments of shared tiers waiting for their grace period before
	// they are unlinked (finish runs the unlink).
	grace map[uint64]*graceEntry

	// Publication logs: this instance's (logs) and what the others' announced (ov).
	logs publogs
	ov   overlay

	refreshes, refreshErrors     atomic.Int64
	segmentsIndexed, dropped     atomic.Int64
	foreignHits                  atomic.Int64
	copiedToMemory, copiedToDisk atomic.Int64
	published, publishErrors     atomic.Int64
	visibleAt, visibleSamples    atomic.Int64

	// Segment summaries and the progress of indexing (summary.go). summarized: own
	// segments whose summary is written (or failed), by generation; listedByNS: how many
	// segments each other namespace's manifest listed when last read (s.mu).
	summarized                                               map[uint64]uint64
	listedByNS                                               map[string]int
	fromSummary, fromHeaders, summaryDamaged, indexedRecords atomic.Int64
	progressAt                                               time.Time
	progressRecs                                             int64
}

// Open opens the foreign index (rebuilt empty when unreadable: it is a cache of what
// the manifests and footers say) and loads its segment aliases. It returns nil and no error
// when a read-only open finds no readable foreign index; on a later error, the sharing with
// its foreign index open (for the caller to close).
func Open(cfg Config, env Env) (*Sharing, error) {
	s := &Sharing{cfg: cfg, env: env, opened: time.Now().UnixNano(), kick: lifecycle.NewKick(), segs: map[uint64]foreignSeg{}, aliases: map[foreignKey]uint64{}, pendingSidecars: map[uint64][]pendingSidecar{},
		ignored: map[format.InstanceID]bool{}, lastPub: map[string][]byte{}, firstAt: map[uint64]int64{}, grace: map[uint64]*graceEntry{},
		accessed: map[foreignKey]accessNote{}, ownAccess: map[uint64]int64{}, retireReqs: map[foreignKey]accessNote{},
		seen: map[string]manifestSeen{}, lastSeq: map[string]uint64{}, lastWrite: map[string]time.Time{}, unlinked: map[foreignKey]bool{},
		summarized: map[uint64]uint64{}, listedByNS: map[string]int{}}
	dir := filepath.Join(s.cfg.Dir, ForeignDir)
	fx, err := index.Open(dir, index.Options{FS: s.cfg.FS, Logger: s.cfg.Logger, ReadOnly: s.cfg.ReadOnly})
	if err != nil && s.cfg.ReadOnly {
		s.cfg.Logger.Warn("ucm: no readable foreign index; other instances' blocks are not visible to this read-only open", "dir", dir, "err", err)
		return nil, nil
	}
	if err != nil {
		s.cfg.Logger.Warn("ucm: foreign index unreadable; rebuilding it from the other instances' manifests", "dir", dir, "err", err)
		if err := s.cfg.FS.RemoveAll(dir); err != nil {
			return nil, fmt.Errorf("open %s: remove foreign index: %w", s.cfg.Dir, err)
		}
		if fx, err = index.Open(dir, index.Options{FS: s.cfg.FS, Logger: s.cfg.Logger}); err != nil {
			return nil, fmt.Errorf("open %s: %w", s.cfg.Dir, err)
		}
	}
	s.fx = fx
	if v, ok, err := fx.Meta(metaForeignNext); err == nil && ok && len(v) == 8 {
		s.next = binary.LittleEndian.Uint64(v)
	}
	var stale []string
	err = fx.MetaRange(metaForeignSeg, func(key string, val []byte) bool {
		alias, perr := parseAliasKey(key)
		_, hasRow := fx.Segment(alias)
		if perr != nil || len(val) <= foreignSegPrefix || !hasRow {
			// The segment's entries and row went in the batch that wrote this key: without the
			// row it is a leftover of a drop; the next refresh indexes the segment again.
			stale = append(stale, key)
			return true
		}
		var fs foreignSeg
		copy(fs.inst[:], val)
		fs.number = binary.LittleEndian.Uint64(val[16:])
		fs.generation = binary.LittleEndian.Uint64(val[24:])
		fs.dir = string(val[foreignSegPrefix:])
		for _, t := range s.cfg.Tiers {
			for _, root := range t.Config().Paths {
				if strings.HasPrefix(fs.dir, tiers.NamespaceDir(root, fs.inst)) && t.Shared() {
					fs.tier = t
				}
			}
		}
		if fs.tier == nil {
			stale = append(stale, key) // its shared path is no longer configured
			return true
		}
		s.segs[alias] = fs
		s.aliases[foreignKey{fs.inst, fs.number}] = alias
		s.next = max(s.next, alias&^foreignAlias+1)
		return true
	})
	if err != nil {
		return s, fmt.Errorf("open %s: foreign index: %w", s.cfg.Dir, err)
	}
	if s.cfg.ReadOnly {
		return s, nil
	}
	for _, key := range stale {
		alias, perr := parseAliasKey(key)
		b := fx.NewBatch()
		b.DeleteMeta(key)
		if perr == nil {
			if _, ok := fx.Segment(alias); ok {
				if _, err := fx.DropSegmentEntries(alias, 0, false); err != nil {
					return s, fmt.Errorf("open %s: foreign index: %w", s.cfg.Dir, err)
				}
				b.DeleteSegment(alias)
			}
		}
		if err := fx.Apply(b, false); err != nil {
			return s, fmt.Errorf("open %s: foreign index: %w", s.cfg.Dir, err)
		}
	}
	return s, nil
}

func aliasKey(alias uint64) string { return fmt.Sprintf("%s%016x", metaForeignSeg, alias) }

func parseAliasKey(key string) (uint64, error) {
	var alias uint64
	_, err := fmt.Sscanf(strings.TrimPrefix(key, metaForeignSeg), "%016x", &alias)
	if err != nil || !IsForeign(alias) {
		return 0, fmt.Errorf("foreign index key %q: %w", key, format.ErrCorrupt)
	}
	return alias, nil
}

// Run is the background goroutine of sharing: it publishes this instance's manifests when
// kicked (a segment sealed or retired) and refreshes the foreign index every interval.
func (s *Sharing) Run() {
	defer s.cfg.BG.Done()
	tick := time.NewTicker(s.cfg.RefreshInterval)
	defer tick.Stop()
	for {
		s.sealAgedShared()
		s.obeyReclaims()
		s.Publish()
		s.refreshShared()
		s.WriteSummaries()
		select {
		case <-s.cfg.Stop:
			return
		case <-tick.C:
		case <-s.kick:
		}
	}
}

// sealAgedShared seals the shared tiers' active segments whose first record is older than
// SharedSealAge (the seal then kicks publication). The requests go out in the background, one
// per writer at a time: a writer waiting for the lease holder to grant it room (tiers.ShareAccount)
// takes them only once admitted, and the sharer must go on publishing what it asks for.
func (s *Sharing) sealAgedShared() {
	if s.cfg.SealAge < 0 || s.cfg.ReadOnly {
		return
	}
	for _, t := range s.cfg.Tiers {
		if !t.Shared() {
			continue
		}
		if sd, ok := t.(*tiers.SharedDisk); ok {
			sd.SealAged(s.cfg.SealAge, s.cfg.BG)
		}
	}
}

// Kick asks the sharer to publish now.
func (s *Sharing) Kick() {
	if s == nil {
		return
	}
	s.kick.Kick()
}

// Publish writes the manifest of every namespace of this instance whose list of sealed
// segments changed since it last wrote it. A segment is listed once sealed (durable, footer
// written) and no longer once marked deleting; its file is unlinked a grace period later.
func (s *Sharing) Publish() {
	if s == nil || s.cfg.ReadOnly {
		return
	}
	type ns struct {
		dir  string
		list []format.ManifestEntry
	}
	byDir := map[string]*ns{}
	for _, t := range s.cfg.Tiers {
		if !t.Shared() {
			continue
		}
		for _, d := range t.Dirs() {
			byDir[d] = &ns{dir: filepath.Dir(d)}
		}
	}
	now := time.Now().UnixNano()
	type sealed struct {
		row index.SegmentMeta
		ns  *ns
	}
	var rows []sealed // found before s.mu is taken: Home takes the segments' lock, which is held around s.mu elsewhere
	for _, row := range s.env.OwnSegments() {
		if row.State != index.SegmentSealed {
			continue
		}
		h, ok := s.env.Home(row.Number)
		if n := byDir[h.Dir]; ok && n != nil {
			rows = append(rows, sealed{row, n})
		}
	}
	s.mu.Lock()
	for _, r := range rows {
		row, n := r.row, r.ns
		at, ok := s.firstAt[row.Number]
		if !ok {
			at = now
			s.firstAt[row.Number] = at
		}
		n.list = append(n.list, format.ManifestEntry{Number: row.Number, Generation: row.Generation, Size: row.Size,
			Sealed: at, Accessed: s.ownAccess[row.Number], Records: uint32(min(row.LiveRecords, 1<<32-1))})
	}
	notes := s.publishNotesLocked()
	s.mu.Unlock()
	for _, n := range byDir {
		// The encoded lists (the header carries the time) say whether the content changed
		// since the last manifest written.
		m := &format.Manifest{Instance: s.env.Instance(), Schema: s.env.Fingerprint(), Sequence: uint64(now), Written: now, Segments: n.list,
			Notes: slices.Concat(notes, s.spaceNotes(n.dir))}
		enc, err := format.EncodeManifest(m)
		if err != nil {
			s.publishErrors.Add(1)
			s.cfg.Logger.Error("ucm: could not encode the manifest", "dir", n.dir, "err", err)
			continue
		}
		// Entries and notes have the same size: the segment count tells where one list ends.
		body := binary.LittleEndian.AppendUint32(nil, uint32(len(n.list)))
		body = append(body, enc[format.ManifestHeaderSize:]...)
		s.mu.Lock()
		last, written := s.lastPub[n.dir]
		fresh := time.Since(s.lastWrite[n.dir]) < s.cfg.OwnerTimeout/4 // else a heartbeat
		s.mu.Unlock()
		if written && bytes.Equal(last, body) && fresh {
			continue
		}
		if err := tiers.WriteManifest(s.cfg.FS, n.dir, m); err != nil {
			s.publishErrors.Add(1)
			s.cfg.Logger.Error("ucm: could not publish the manifest; other instances keep the previous list", "dir", n.dir, "err", err)
			continue
		}
		s.published.Add(1)
		s.mu.Lock()
		s.lastPub[n.dir], s.lastSeq[n.dir], s.lastWrite[n.dir] = body, m.Sequence, time.Now()
		s.mu.Unlock()
		s.prunePublogs(n.dir, n.list)
		s.PruneSummaries(n.dir, n.list)
	}
}

// refreshShared brings the foreign index up to date with the other instances' manifests: one
// directory listing per shared path and one manifest read per namespace. A segment newly
// listed is indexed from its summary (or its footer and record headers); a segment no longer
// listed (or whose namespace is gone) loses its entries. A namespace whose manifest cannot be read keeps what was indexed
// of it (a transient failure must not turn hits into misses); one of another schema is ignored.
func (s *Sharing) refreshShared() {
	if s == nil || s.fx == nil || s.cfg.ReadOnly {
		return
	}
	s.refreshes.Add(1)
	s.syncPublogs()
	for _, t := range s.cfg.Tiers {
		if !t.Shared() {
			continue
		}
		var manifests []nsManifest // the other instances'
		for _, root := range t.Config().Paths {
			ms, err := s.refreshRoot(t, root)
			if err != nil {
				s.refreshErrors.Add(1)
				s.cfg.Logger.Warn("ucm: refreshing a shared path failed; its known segments stay indexed", "path", root, "err", err)
			}
			manifests = append(manifests, ms...)
		}
		for _, m := range manifests {
			s.obeyNotes(t, m.Manifest, format.NoteRetire, &s.retiredOnRequest)
		}
		s.reclaimSharedTier(t, manifests)
	}
}

// nsManifest is another instance's newest manifest and the namespace it was read from.
type nsManifest struct {
	*format.Manifest
	dir string
}

// refreshRoot refreshes the foreign index from the namespaces under one path of shared tier t
// and returns the manifests it read, of every schema (only this store's are indexed; the
// reclaimer counts them all), after noting each one's sequence for the liveness of its owner.
func (s *Sharing) refreshRoot(t tiers.Disk, root string) ([]nsManifest, error) {
	insts, err := tiers.ListNamespaces(s.cfg.FS, root)
	if err != nil {
		return nil, err
	}
	var read []nsManifest
	listed := map[foreignKey]bool{}
	unreadable := map[format.InstanceID]bool{}
	present := map[string]bool{}
	defer s.forgetListedCounts(root, present)
	for _, inst := range insts {
		if inst == s.env.Instance() {
			continue
		}
		nsDir := tiers.NamespaceDir(root, inst)
		present[nsDir] = true
		logSeq, logRead := s.logsRead(inst)
		m, err := tiers.ReadManifest(s.cfg.FS, nsDir, inst)
		if errors.Is(err, tiers.ErrNoManifest) {
			s.mu.Lock()
			delete(s.listedByNS, nsDir)
			s.mu.Unlock()
			continue // nothing published yet (or no longer anything: its segments are dropped)
		}
		if err != nil {
			unreadable[inst] = true
			s.refreshErrors.Add(1)
			s.cfg.Logger.Warn("ucm: manifest unreadable; keeping what was indexed of that instance", "dir", nsDir, "err", err)
			continue
		}
		s.env.AtSeam(seam.ManifestRead, format.BlockID{})
		ns := nsManifest{m, nsDir}
		s.observe(ns)
		s.overlayReclaimed(inst, m)
		defer s.forgetUnannounced(inst, m, logSeq, logRead)
		read = append(read, ns)
		if m.Schema != s.env.Fingerprint() && !s.cfg.LookupOnly {
			if len(m.Segments) == 0 {
				continue // a lookup-only instance (UCM's scheduler) publishes nothing: no news
			}
			s.mu.Lock()
			if !s.ignored[inst] {
				s.ignored[inst] = true
				s.cfg.Logger.Warn("ucm: shared namespace written under another schema; ignored", "dir", nsDir)
			}
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		s.listedByNS[nsDir] = len(m.Segments) // progress: indexed of listed (Stats, noteIndexed)
		s.mu.Unlock()
		segDir := filepath.Join(nsDir, tiers.SegmentDir)
		for _, ent := range m.Segments {
			k := foreignKey{inst, ent.Number}
			listed[k] = true
			s.mu.Lock()
			alias, known := s.aliases[k]
			gen := s.segs[alias].generation
			s.mu.Unlock()
			if known && gen == ent.Generation {
				s.forgetOverlay(k) // learned from its log after it was indexed
				continue
			}
			if known {
				s.dropForeign(alias) // the number was reused with another file: not ours to keep
			}
			if err := s.indexForeign(t, segDir, inst, ent); err != nil {
				s.refreshErrors.Add(1)
				s.cfg.Logger.Warn("ucm: could not index another instance's segment; skipped", "dir", segDir, "segment", ent.Number, "err", err)
				continue
			}
			s.forgetOverlay(k) // the foreign index holds it now
			// A segment published before this instance opened says nothing of visibility.
			if ent.Sealed >= s.opened {
				s.visibleAt.Add(time.Now().UnixNano() - ent.Sealed)
				s.visibleSamples.Add(1)
			}
		}
	}
	// Drop what is no longer listed under this root.
	s.mu.Lock()
	var gone []uint64
	for alias, fs := range s.segs {
		if fs.tier == t && strings.HasPrefix(fs.dir, filepath.Join(root, tiers.InstancesDir)+string(filepath.Separator)) &&
			!listed[foreignKey{fs.inst, fs.number}] && !unreadable[fs.inst] {
			gone = append(gone, alias)
		}
	}
	s.mu.Unlock()
	s.dropForeign(gone...)
	return read, nil
}

// indexForeign indexes published segment ent of instance inst, in segDir of shared tier t,
// from its summary, or else its footer and record headers (foreignRecords). Blocks and
// sidecars the foreign index already holds keep their entry; this segment's copy of them is
// remembered (copyKey) for when that entry's segment is dropped.
func (s *Sharing) indexForeign(t tiers.Disk, segDir string, inst format.InstanceID, ent format.ManifestEntry) error {
	recs, err := s.foreignRecords(t, segDir, inst, ent)
	if err != nil {
		return err
	}
	s.mu.Lock()
	alias := foreignAlias | s.next
	s.next++
	s.mu.Unlock()
	b := s.fx.NewBatch()
	b.SetSegment(index.SegmentMeta{Number: alias, Generation: ent.Generation, State: index.SegmentSealed, Size: ent.Size})
	seen := map[format.BlockID]bool{}
	var pending []pendingSidecar
	for i := range recs {
		r := &recs[i]
		loc := ScannedLocation(alias, r)
		if r.Header.Kind != 0 {
			// A sidecar: indexed beside its block, which this segment or an earlier one gave
			// the foreign index; one whose block is not indexed yet waits for it. One the
			// foreign index holds in another segment is remembered as a copy.
			if s.fx.HasSidecar(r.Header.ID, r.Header.Kind) {
				b.SetMeta(copyKey(r.Header.ID, r.Header.Kind, alias), index.EncodeLocation(nil, loc))
				continue
			}
			if seen[r.Header.ID] || s.fx.Contains(r.Header.ID) {
				b.PutSidecar(r.Header.ID, r.Header.Kind, loc)
			} else {
				pending = append(pending, pendingSidecar{r.Header.ID, r.Header.Kind, loc})
			}
			continue
		}
		if (r.Header.Layout != s.env.Layout() && !s.cfg.LookupOnly) || seen[r.Header.ID] {
			continue
		}
		seen[r.Header.ID] = true
		if s.fx.Contains(r.Header.ID) {
			b.SetMeta(copyKey(r.Header.ID, 0, alias), index.EncodeLocation(nil, loc))
			continue
		}
		b.Put(r.Header.ID, loc)
	}
	val := make([]byte, foreignSegPrefix, foreignSegPrefix+len(segDir))
	copy(val, inst[:])
	binary.LittleEndian.PutUint64(val[16:], ent.Number)
	binary.LittleEndian.PutUint64(val[24:], ent.Generation)
	val = append(val, segDir...)
	b.SetMeta(aliasKey(alias), val)
	var next [8]byte
	binary.LittleEndian.PutUint64(next[:], alias&^foreignAlias+1)
	b.SetMeta(metaForeignNext, next[:])
	// The alias stands for the segment before any entry names it: a load that finds an entry
	// must find its segment, or it takes the block for gone and drops it.
	k := foreignKey{inst, ent.Number}
	s.mu.Lock()
	s.segs[alias] = foreignSeg{inst: inst, number: ent.Number, generation: ent.Generation, dir: segDir, tier: t}
	s.aliases[k] = alias
	s.mu.Unlock()
	if err := s.fx.Apply(b, false); err != nil {
		s.mu.Lock()
		delete(s.segs, alias)
		delete(s.aliases, k)
		s.mu.Unlock()
		return err
	}
	s.env.AtSeam(seam.ForeignIndexed, format.BlockID{})
	if len(pending) > 0 {
		s.mu.Lock()
		s.pendingSidecars[alias] = pending
		s.mu.Unlock()
	}
	s.segmentsIndexed.Add(1)
	s.noteIndexed(len(recs))
	s.indexPendingSidecars()
	return nil
}

// pendingSidecar is another instance's sidecar whose block the foreign index does not hold yet.
type pendingSidecar struct {
	id   format.BlockID
	kind format.SidecarKind
	loc  index.Location
}

// indexPendingSidecars indexes the pending foreign sidecars whose block is now indexed.
func (s *Sharing) indexPendingSidecars() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pendingSidecars) == 0 {
		return
	}
	b := s.fx.NewBatch()
	for alias, list := range s.pendingSidecars {
		keep := list[:0]
		for _, p := range list {
			if s.fx.Contains(p.id) {
				b.PutSidecar(p.id, p.kind, p.loc)
			} else {
				keep = append(keep, p)
			}
		}
		if len(keep) == 0 {
			delete(s.pendingSidecars, alias)
		} else {
			s.pendingSidecars[alias] = keep
		}
	}
	if b.Len() > 0 {
		if err := s.fx.Apply(b, false); err != nil {
			s.cfg.Logger.Warn("ucm: could not index other instances' sidecars", "err", err)
		}
	}
}

// dropForeign forgets foreign segments: their entries, rows, aliases and remembered copies; an
// open file is closed once its readers are done. First every entry of theirs that a segment
// still indexed holds a copy of moves to that copy (promoteCopies). The sidecars of theirs the
// memory tier cached go too: it serves sidecars without asking the index. (Blocks copied there
// stay: docs/sharing.md.) Only the sharer calls it, as it alone indexes segments: a copy it
// promotes is in a segment that stays indexed until its own next drop.
func (s *Sharing) dropForeign(aliases ...uint64) {
	drop := map[uint64]bool{}
	s.mu.Lock()
	for _, alias := range aliases {
		if _, ok := s.segs[alias]; ok {
			drop[alias] = true
		}
	}
	s.mu.Unlock()
	if len(drop) == 0 {
		return
	}
	s.promoteCopies(drop)
	for _, alias := range aliases {
		s.dropForeignSegment(alias)
	}
	s.env.UncacheUnindexedSidecars(nil)
}

// copyKey is the foreign-index meta key remembering that foreign segment alias holds a copy of
// block id (kind 0) or of its sidecar of kind, which another segment's entry stands for; the
// value is the copy's location. A key lives as long as its segment is indexed: written in the
// batch that indexes it, deleted when it is dropped (or found stale at a later drop). Keys sort by
// block, then kind (the block first), then alias.
func copyKey(id format.BlockID, kind format.SidecarKind, alias uint64) string {
	return fmt.Sprintf("%s%s%02x%016x", metaForeignCopy, id, kind, alias)
}

// parseCopyKey is copyKey's inverse.
func parseCopyKey(key string) (id format.BlockID, kind format.SidecarKind, alias uint64, err error) {
	rest := strings.TrimPrefix(key, metaForeignCopy)
	if len(rest) != 2*len(id)+2+16 {
		return id, 0, 0, fmt.Errorf("foreign index key %q: %w", key, format.ErrCorrupt)
	}
	id, err = format.ParseBlockID(rest[:2*len(id)])
	k, kerr := strconv.ParseUint(rest[2*len(id):2*len(id)+2], 16, 8)
	alias, aerr := strconv.ParseUint(rest[2*len(id)+2:], 16, 64)
	if err != nil || kerr != nil || aerr != nil || !IsForeign(alias) || (k != 0 && !format.ValidSidecarKind(format.SidecarKind(k))) {
		return id, 0, 0, fmt.Errorf("foreign index key %q: %w", key, format.ErrCorrupt)
	}
	return id, format.SidecarKind(k), alias, nil
}

// promoteCopies prepares the drop of the foreign segments in drop: every block or sidecar whose
// entry points into one of them, or has no entry any more (a load found its copy broken), and
// that a segment staying indexed holds a copy of, gets that copy as its entry (the most
// recently indexed copy when several are). Its owner moved it there (compaction, demotion) or
// another owner stored the same block (content-addressed: the same bytes); either way the
// location was checked against the copy's footer when its segment was indexed, and a load
// checks its bytes as any other. The dropped segments' own copies are forgotten, with any key
// left stale. One batch; a crash before it leaves the segments indexed, to be dropped (and
// this redone) at the next refresh.
func (s *Sharing) promoteCopies(drop map[uint64]bool) {
	type copied struct {
		id   format.BlockID
		kind format.SidecarKind
	}
	type copyLoc struct {
		alias uint64
		val   []byte // the encoded location
	}
	s.mu.Lock()
	indexed := make(map[uint64]bool, len(s.segs))
	for alias := range s.segs {
		indexed[alias] = !drop[alias]
	}
	s.mu.Unlock()
	b := s.fx.NewBatch()
	var order []copied
	best := map[copied]copyLoc{}
	err := s.fx.MetaRange(metaForeignCopy, func(key string, val []byte) bool {
		id, kind, alias, err := parseCopyKey(key)
		if err != nil || !indexed[alias] {
			b.DeleteMeta(key) // a dropped segment's copy (or a leftover)
			return true
		}
		k := copied{id, kind}
		if _, ok := best[k]; !ok {
			order = append(order, k)
		}
		best[k] = copyLoc{alias, bytes.Clone(val)} // keys sort by alias: the newest wins
		return true
	})
	if err != nil {
		s.cfg.Logger.Error("ucm: could not read the copies of foreign blocks; their entries go with their segment", "err", err)
		return
	}
	for _, k := range order { // blocks before their sidecars
		var cur index.Location
		var ok bool
		var err error
		if k.kind == 0 {
			cur, ok, err = s.fx.Get(k.id)
		} else {
			cur, ok, err = s.fx.GetSidecar(k.id, k.kind)
		}
		if err != nil || (ok && !drop[cur.Segment]) {
			continue
		}
		c := best[k]
		loc, err := index.DecodeLocation(c.val)
		if err == nil && (loc.Segment != c.alias || (k.kind != 0 && loc.IsBatch())) {
			err = fmt.Errorf("%w: location in segment %#x, batch %d, for a copy in segment %#x", format.ErrCorrupt, loc.Segment, loc.BatchBlocks, c.alias)
		}
		if err != nil {
			s.cfg.Logger.Warn("ucm: a remembered copy of a foreign block is invalid; forgotten", "block", k.id, "kind", k.kind, "err", err)
			b.DeleteMeta(copyKey(k.id, k.kind, c.alias))
			continue
		}
		if k.kind == 0 {
			b.Put(k.id, loc)
		} else {
			b.PutSidecar(k.id, k.kind, loc) // only beside its block
		}
	}
	if b.Len() == 0 {
		return
	}
	if err := s.fx.Apply(b, false); err != nil {
		s.cfg.Logger.Error("ucm: could not move foreign entries to their other copies; they go with their segment", "err", err)
	}
}

// dropForeignSegment forgets one foreign segment for dropForeign.
func (s *Sharing) dropForeignSegment(alias uint64) {
	s.mu.Lock()
	fs, ok := s.segs[alias]
	delete(s.segs, alias)
	delete(s.pendingSidecars, alias)
	if ok {
		delete(s.aliases, foreignKey{fs.inst, fs.number})
		delete(s.accessed, foreignKey{fs.inst, fs.number})
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	if _, err := s.fx.DropSegmentEntries(alias, 0, false); err != nil {
		s.cfg.Logger.Error("ucm: could not drop a foreign segment's entries", "segment", fs.number, "err", err)
	}
	b := s.fx.NewBatch()
	b.DeleteSegment(alias)
	b.DeleteMeta(aliasKey(alias))
	if err := s.fx.Apply(b, false); err != nil {
		s.cfg.Logger.Error("ucm: could not drop a foreign segment", "segment", fs.number, "err", err)
	}
	seg := s.env.ForgetOpen(alias)
	if seg != nil {
		seg.Retire(func() {})
	}
	s.dropped.Add(1)
}

// foreignSegment returns the foreign segment an alias stands for.
func (s *Sharing) foreignSegment(alias uint64) (foreignSeg, bool) {
	if s == nil {
		return foreignSeg{}, false
	}
	if IsOverlay(alias) {
		return s.overlaySegment(alias)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs, ok := s.segs[alias]
	return fs, ok
}

// OpenForeign opens foreign segment alias for reading (the engine holds its segments' lock).
func (s *Sharing) OpenForeign(alias uint64) (*wal.Segment, error) {
	fs, ok := s.foreignSegment(alias)
	if !ok {
		return nil, fmt.Errorf("foreign segment alias %#x: %w", alias, wal.ErrSegmentGone)
	}
	return wal.OpenSegmentForRead(s.cfg.FS, fs.dir, fs.number, fs.generation, fs.tier.Direct(), fs.tier.Backend())
}

// Get returns the foreign index's entry of id, or else the one a publication log gave.
func (s *Sharing) Get(id format.BlockID) (index.Location, bool) {
	if s == nil || s.fx == nil {
		return index.Location{}, false
	}
	var loc index.Location
	found, err := s.Lookup(func() (bool, error) {
		var ok bool
		var err error
		if loc, ok, err = s.fx.Get(id); ok || err != nil {
			return ok, err
		}
		s.env.AtSeam(seam.ForeignMissed, id)
		loc, ok = s.OverlayGet(id)
		return ok, nil
	})
	if err != nil {
		s.cfg.Logger.Warn("ucm: foreign index read failed; a miss", "block", id, "err", err)
	}
	return loc, found
}

// Lookup runs find (the foreign index read first, then the overlay) until it finds
// everything it looks for, fails, or no overlay segment was forgotten meanwhile: a segment's
// entries move from the overlay to the foreign index when its manifest is read, and a reader
// passing between the two reads would miss them in both.
func (s *Sharing) Lookup(find func() (bool, error)) (bool, error) {
	ov := &s.ov
	for {
		g := ov.forgets.Load()
		found, err := find()
		if found || err != nil || ov.forgets.Load() == g {
			return found, err
		}
	}
}

// GetTailing is Get for a load: on a miss it first reads what the instances on
// this host appended to their publication logs.
func (s *Sharing) GetTailing(id format.BlockID) (index.Location, bool) {
	loc, ok := s.Get(id)
	if !ok && s != nil && s.fx != nil {
		s.TailPublogs(true)
		loc, ok = s.OverlayGet(id)
	}
	return loc, ok
}

// Contains reports whether the foreign index holds id.
func (s *Sharing) Contains(id format.BlockID) bool {
	if s == nil || s.fx == nil {
		return false
	}
	found, _ := s.Lookup(func() (bool, error) {
		if s.fx.Contains(id) {
			return true, nil
		}
		_, ok := s.OverlayGet(id)
		return ok, nil
	})
	return found
}

// RetireShared delays the unlink of a retired segment of a shared tier that was published:
// readers on other instances may still use it until they see the new manifest. The manifest
// without it is published at once; finish (the unlink) runs after the grace period, or at
// Close.
func (s *Sharing) RetireShared(n uint64, finish func()) {
	s.Kick()
	g := &graceEntry{finish: finish}
	s.mu.Lock()
	delete(s.firstAt, n)
	delete(s.ownAccess, n)
	s.grace[n] = g
	g.timer = time.AfterFunc(s.cfg.RetireGrace, func() {
		s.mu.Lock()
		pending := s.grace[n] == g
		if pending {
			delete(s.grace, n)
		}
		s.mu.Unlock()
		if pending {
			finish()
		}
	})
	s.mu.Unlock()
}

// graceEntry is a retired segment waiting for its grace period.
type graceEntry struct {
	timer  *time.Timer
	finish func()
}

// FinishGrace finishes the pending retirements (their grace is cut short: the instance
// stops); release closes the foreign index.
func (s *Sharing) FinishGrace() {
	if s == nil {
		return
	}
	s.closeOverlay()
	s.mu.Lock()
	var pending []*graceEntry
	for n, g := range s.grace {
		if g.timer.Stop() {
			pending = append(pending, g)
		}
		delete(s.grace, n)
	}
	s.mu.Unlock()
	for _, g := range pending {
		g.finish()
	}
}
