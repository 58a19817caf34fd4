package share

import (
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// Publication logs (docs/sharing.md "Read your writes", format/publog.go). A block dumped into
// a shared tier is durable and in its owner's index when its dump completes, but the other
// instances learn of it from a manifest only once its segment is sealed and the manifest
// read: a second or more later. So each instance also appends, before its dump completes, the
// location of every record it indexes in a shared tier to a publication log in its namespace,
// and every instance tails the others' logs: on a lookup or load that misses, the logs written
// on this host (one page cache: what was appended is readable at once) and every refresh
// interval all of them. What a log announces is kept in memory (the overlay), never in the
// foreign index, and only until the segment is listed in a manifest and indexed from its
// footer like any other; a load through it is checked like any foreign load.

const (
	// overlayAlias marks, with foreignAlias, the aliases of segments known only from a
	// publication log. They are never written to the foreign index.
	overlayAlias = 1 << 62
	// publogRotateBytes: a log longer than this is continued in a new one at the next append.
	publogRotateBytes = 64 << 20
	// publogReadMax bounds one read of a log's tail (an entry is at most MaxPublogBody bytes).
	publogReadMax = 2 * format.MaxPublogBody
	// publogRelistEvery: the sharer's tick lists every directory whatever its time says once in
	// this many ticks.
	publogRelistEvery = 8
	// publogEntryRecords bounds the records of one entry.
	publogEntryRecords = 1024
	// RacyDirWindow: a directory listed less than this after its modification time may have
	// changed again within the same time stamp (file times tick coarsely; a network file
	// system's come from the server's clock), so an unchanged time says nothing until then.
	RacyDirWindow = 2 * time.Second
)

// dirUnchanged reports whether a directory whose modification time is now mod was listed
// entire after it last changed: listed at listedAt, when its time was seen.
func dirUnchanged(mod, seen, listedAt time.Time) bool {
	return mod.Equal(seen) && listedAt.Sub(mod) > RacyDirWindow
}

// IsOverlay reports whether segment number n is an alias the overlay of the publication logs
// gave (a foreign segment not yet in a manifest).
func IsOverlay(n uint64) bool { return n&(foreignAlias|overlayAlias) == foreignAlias|overlayAlias }

var (
	hostOnce sync.Once
	hostID   [16]byte
)

// HostIDEnv names an environment variable that, when set, replaces the kernel's boot id as
// this process's host identity in publication logs: processes with different values treat each
// other as on different hosts (only the refresh interval bounds their visibility), as tests
// and benchmarks of a shared file system mounted twice on one machine need.
const HostIDEnv = "UCMGO_HOST_ID"

// thisHost identifies the running kernel: its boot id, so that two processes compare equal
// exactly when they share a page cache (or HostIDEnv's value). Without either, a random id:
// never equal to another's.
func thisHost() [16]byte {
	hostOnce.Do(func() {
		if v := os.Getenv(HostIDEnv); v != "" {
			hostID = md5.Sum([]byte(v))
			return
		}
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err == nil {
			if n, err := hex.Decode(hostID[:], []byte(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))); err == nil && n == len(hostID) {
				return
			}
		}
		_, _ = rand.Read(hostID[:])
	})
	return hostID
}

// publogWriter is this instance's publication log in one of its namespaces. It names only
// segments not yet listed in the namespace's manifest, or listed less than publogCarry ago:
// when that changes (a segment listed longer, or retired), the log is continued in a new one
// that repeats what it said of the others (pending). So a reader starting at the newest log
// learns every block not yet listed, and those of segments listed so recently that it may not
// have read that manifest yet, and nothing of a segment retired; and a reader that keeps a
// segment only while the newest log it read still names it (or a manifest lists it) never
// keeps a retired one for more than a refresh.
type publogWriter struct {
	nsDir   string
	f       vfs.File
	seq     uint64
	size    int64
	dirty   bool                   // appended to since the last sync
	pending map[uint64]*pendingLog // own unlisted segments this log names
	retired []retiredLog           // earlier logs, deleted once readers had time to follow
	buf     []byte
}

// retiredLog is an earlier log of this instance, continued in a newer one (or left by an
// earlier run) at a time: deleted at a manifest publication after the retention.
type retiredLog struct {
	path string
	at   time.Time
}

// PublogCarry is how long a log keeps naming a segment after a manifest listed it, and how long
// a continued log stays on disk: two refresh intervals (at least a second), in which every
// reader has read that manifest, or followed the old log to its continuation.
func (s *Sharing) PublogCarry() time.Duration {
	return max(2*s.cfg.RefreshInterval, time.Second)
}

// pendingLog is what a log said of one segment it still names.
type pendingLog struct {
	gen      uint64
	recs     []format.PublogRecord
	listedAt time.Time // when a manifest first listed it; zero while unlisted
}

// publogs is the writing side: one log per own namespace of a shared tier.
type publogs struct {
	mu           sync.Mutex
	w            map[string]*publogWriter // namespace dir → its log
	appendErrors int64
	warned       bool
}

// AppendPublog announces recs (just indexed; locs their locations) in the publication logs of
// the shared tiers holding them. A failure is logged and counted, never the dump's: the
// manifest publishes the block when its segment is sealed.
func (s *Sharing) AppendPublog(recs []*wal.Record, locs []index.Location) {
	if s == nil || s.cfg.ReadOnly {
		return
	}
	type group struct {
		nsDir string
		gen   uint64
		recs  []format.PublogRecord
	}
	var groups map[uint64]*group
	for k, r := range recs {
		g := groups[r.Segment]
		if g == nil {
			h, ok := s.env.Home(r.Segment)
			if !ok || !h.Tier.Shared() {
				continue
			}
			meta, ok := s.env.OwnSegment(r.Segment)
			if !ok {
				continue
			}
			if groups == nil {
				groups = map[uint64]*group{}
			}
			g = &group{nsDir: filepath.Dir(h.Dir), gen: meta.Generation}
			groups[r.Segment] = g
		}
		g.recs = append(g.recs, format.PublogRecord{ID: r.ID, Kind: r.Kind, Location: index.EncodeLocation(nil, locs[k])})
	}
	if len(groups) == 0 {
		return
	}
	p := &s.logs
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, g := range groups {
		if err := s.appendPublogLocked(g.nsDir, n, g.gen, g.recs); err != nil {
			p.appendErrors++
			if !p.warned {
				p.warned = true
				s.cfg.Logger.Warn("ucm: could not append to the publication log; other instances see new blocks when their segment is published", "dir", g.nsDir, "err", err)
			}
		}
	}
}

func (s *Sharing) appendPublogLocked(nsDir string, number, gen uint64, recs []format.PublogRecord) error {
	p := &s.logs
	w := p.w[nsDir]
	if w == nil || w.f == nil || w.size >= publogRotateBytes {
		nw, err := s.startPublog(nsDir, w)
		if err != nil {
			return err
		}
		w = nw
	}
	if err := w.write(number, gen, recs); err != nil {
		return err
	}
	pl := w.pending[number]
	if pl == nil || pl.gen != gen {
		pl = &pendingLog{gen: gen}
		w.pending[number] = pl
	}
	pl.recs = append(pl.recs, recs...)
	return nil
}

// write appends the entries announcing recs of segment (number, gen), in one write: a reader
// sees a prefix of it at worst, which it reads as incomplete.
func (w *publogWriter) write(number, gen uint64, recs []format.PublogRecord) error {
	buf := w.buf[:0]
	for len(recs) > 0 {
		k := min(len(recs), publogEntryRecords)
		var err error
		if buf, err = format.AppendPublogRecords(buf, number, gen, recs[:k]); err != nil {
			return err
		}
		recs = recs[k:]
	}
	w.buf = buf
	if _, err := w.f.WriteAt(buf, w.size); err != nil {
		// What was written of it is torn: readers stop there. Start a new log next time.
		_ = w.f.Close()
		w.f = nil
		return fmt.Errorf("publication log %s: %w", filepath.Join(w.nsDir, tiers.PublogName(w.seq)), err)
	}
	w.size += int64(len(buf))
	w.dirty = true
	return nil
}

// startPublog creates a new log in nsDir, continuing prev (if any) into it, and makes the
// earlier logs retired ones.
func (s *Sharing) startPublog(nsDir string, prev *publogWriter) (*publogWriter, error) {
	p := &s.logs
	seqs, err := tiers.PublogNames(s.cfg.FS, nsDir)
	if err != nil {
		return nil, err
	}
	seq := uint64(time.Now().UnixNano())
	if len(seqs) > 0 && seqs[len(seqs)-1] >= seq {
		seq = seqs[len(seqs)-1] + 1
	}
	path := filepath.Join(nsDir, tiers.PublogName(seq))
	f, err := s.cfg.FS.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, fmt.Errorf("publication log %s: %w", path, err)
	}
	hdr := format.EncodePublogHeader(format.PublogHeader{Instance: s.env.Instance(), Host: thisHost(), Sequence: seq, Schema: s.env.Fingerprint()})
	if _, err := f.WriteAt(hdr, 0); err != nil {
		_ = f.Close()
		_ = s.cfg.FS.Remove(path)
		return nil, fmt.Errorf("publication log %s: %w", path, err)
	}
	w := &publogWriter{nsDir: nsDir, f: f, seq: seq, size: int64(len(hdr)), dirty: true, pending: map[uint64]*pendingLog{}}
	if prev == nil {
		// Logs of an earlier run: what they name was recovered and is published at Open.
		for _, old := range seqs {
			w.retired = append(w.retired, retiredLog{filepath.Join(nsDir, tiers.PublogName(old)), time.Now()})
		}
	} else {
		// What the old log said of unlisted segments, again, before readers are sent here.
		for n, pl := range prev.pending {
			if err := w.write(n, pl.gen, pl.recs); err != nil {
				_ = s.cfg.FS.Remove(path)
				return nil, err
			}
		}
		w.pending = prev.pending
		w.retired = prev.retired
		if prev.f != nil {
			if _, err := prev.f.WriteAt(format.AppendPublogNext(nil, seq), prev.size); err == nil {
				_ = prev.f.Sync()
			}
			_ = prev.f.Close()
		}
		w.retired = append(w.retired, retiredLog{filepath.Join(nsDir, tiers.PublogName(prev.seq)), time.Now()})
	}
	if p.w == nil {
		p.w = map[string]*publogWriter{}
	}
	p.w[nsDir] = w
	return w, nil
}

// syncPublogs flushes the logs appended to since the last call (the sharer's tick), so that a
// network file system's client passes them on to other hosts within one interval.
func (s *Sharing) syncPublogs() {
	p := &s.logs
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.w {
		if w.f != nil && w.dirty {
			w.dirty = false
			_ = w.f.Sync()
		}
	}
}

// prunePublogs runs after a manifest of namespace nsDir was published with listed: the
// earlier logs continued longer than publogCarry ago are deleted (their readers were sent on),
// and when the current log names a segment listed longer than publogCarry ago, or one that is
// retired or no longer this instance's, the log is continued in a new one without it.
func (s *Sharing) prunePublogs(nsDir string, listed []format.ManifestEntry) {
	p := &s.logs
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.w[nsDir]
	if w == nil {
		return
	}
	keep := w.retired[:0]
	for _, r := range w.retired {
		if time.Since(r.at) < s.PublogCarry() {
			keep = append(keep, r)
			continue
		}
		if err := s.cfg.FS.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.cfg.Logger.Warn("ucm: could not delete a publication log", "path", r.path, "err", err)
		}
	}
	w.retired = keep
	in := make(map[uint64]bool, len(listed))
	for _, ent := range listed {
		in[ent.Number] = true
	}
	changed := false
	now := time.Now()
	for n, pl := range w.pending {
		meta, own := s.env.OwnSegment(n)
		switch {
		case !own || meta.State == index.SegmentDeleting:
		case !in[n]:
			continue
		case pl.listedAt.IsZero():
			pl.listedAt = now
			continue
		case now.Sub(pl.listedAt) < s.PublogCarry():
			continue
		}
		delete(w.pending, n)
		changed = true
	}
	if changed && w.f != nil {
		if _, err := s.startPublog(nsDir, w); err != nil {
			p.appendErrors++
			s.cfg.Logger.Warn("ucm: could not continue the publication log", "dir", nsDir, "err", err)
		}
	}
}

// ClosePublogs closes this instance's logs (Close). They stay: readers use them until the
// segments they name are listed, and the next Open deletes them.
func (s *Sharing) ClosePublogs() {
	p := &s.logs
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.w {
		if w.f != nil {
			_ = w.f.Sync()
			_ = w.f.Close()
			w.f = nil
		}
	}
}

// publogTail is this instance's reading position in another instance's publication log.
type publogTail struct {
	inst     format.InstanceID
	nsDir    string
	tier     tiers.Disk
	f        vfs.File // nil until a log is found
	seq      uint64
	off      int64
	sameHost bool
	ignored  bool      // another schema's log
	stuck    bool      // stopped at a damaged entry: read the next log when one appears
	stale    bool      // its log's handle went stale (dropStaleLog): open the newest log again
	nsMod    time.Time // the namespace directory's modification time when last listed
	nsListed time.Time // when that listing started
}

// overlaySeg is a segment known only from a publication log.
type overlaySeg struct {
	seg foreignSeg
	ids []format.BlockID
	seq uint64 // the log that last named it
}

// overlay holds what the publication logs announced of segments the foreign index does not
// hold yet.
type overlay struct {
	mu      sync.Mutex // held while tailing
	tails   map[string]*publogTail
	rootMod map[string]time.Time
	listed  map[string]time.Time // when each root's instances directory was last listed
	next    uint64
	ticks   int          // the sharer's tails so far
	records atomic.Int64 // blocks learned from the logs
	// forgets counts segments forgotten (forgetOverlay), each counted before its entries
	// leave. A segment's entries reach the foreign index before the overlay forgets it, so a
	// reader that finds a block in neither, the foreign index read first, and sees forgets
	// unchanged since before that read, did not pass between the two (foreignLookup).
	forgets atomic.Uint64

	emu    sync.RWMutex // guards what follows; taken last, never held across another lock
	blocks map[format.BlockID]index.Location
	segs   map[uint64]*overlaySeg
	byKey  map[foreignKey]uint64
	// current is, per instance, the newest log read to its end: what it names is all its
	// owner still announces.
	current map[format.InstanceID]uint64
	// reclaimed are segments (→ generation) a reclaimer took from an owner presumed gone
	// (NoteReclaimed): that owner's last log may still name them, and it cannot continue it.
	reclaimed map[foreignKey]uint64
}

// overlayReclaimed forgets, and from now on ignores in logs, the segments m's NoteReclaimed
// notes say a reclaimer took from m's owner inst.
func (s *Sharing) overlayReclaimed(inst format.InstanceID, m *format.Manifest) {
	ov := &s.ov
	var keys []foreignKey
	ov.emu.Lock()
	for _, nt := range m.Notes {
		if nt.Kind != format.NoteReclaimed || nt.Owner != inst {
			continue
		}
		k := foreignKey{inst, nt.Number}
		if ov.reclaimed == nil {
			ov.reclaimed = map[foreignKey]uint64{}
		}
		ov.reclaimed[k] = nt.Generation
		if alias, ok := ov.byKey[k]; ok && ov.segs[alias].seg.generation == nt.Generation {
			keys = append(keys, k)
		}
	}
	ov.emu.Unlock()
	for _, k := range keys {
		s.forgetOverlay(k)
	}
}

// OverlayGet returns the location a publication log gave block id.
func (s *Sharing) OverlayGet(id format.BlockID) (index.Location, bool) {
	ov := &s.ov
	ov.emu.RLock()
	defer ov.emu.RUnlock()
	loc, ok := ov.blocks[id]
	return loc, ok
}

// OverlayHas sets hits[i] for the ids of misses the overlay holds and reports whether every
// one is now a hit.
func (s *Sharing) OverlayHas(ids []format.BlockID, hits []bool) bool {
	ov := &s.ov
	ov.emu.RLock()
	defer ov.emu.RUnlock()
	all := true
	for i, h := range hits {
		if !h {
			_, hits[i] = ov.blocks[ids[i]]
			all = all && hits[i]
		}
	}
	return all
}

// overlaySegment returns the segment an overlay alias stands for.
func (s *Sharing) overlaySegment(alias uint64) (foreignSeg, bool) {
	ov := &s.ov
	ov.emu.RLock()
	defer ov.emu.RUnlock()
	if o := ov.segs[alias]; o != nil {
		return o.seg, true
	}
	return foreignSeg{}, false
}

// forgetOverlay drops the overlay's segment k (indexed from a manifest now, gone, or replaced)
// with its entries, and closes its open file once its readers are done.
func (s *Sharing) forgetOverlay(k foreignKey) {
	ov := &s.ov
	ov.emu.Lock()
	alias, ok := ov.byKey[k]
	if ok {
		ov.forgets.Add(1)
		o := ov.segs[alias]
		for _, id := range o.ids {
			if loc, ok := ov.blocks[id]; ok && loc.Segment == alias {
				delete(ov.blocks, id)
			}
		}
		delete(ov.segs, alias)
		delete(ov.byKey, k)
	}
	ov.emu.Unlock()
	if !ok {
		return
	}
	seg := s.env.ForgetOpen(alias)
	if seg != nil {
		seg.Retire(func() {})
	}
}

// DropOverlayBlock forgets id's overlay entry at loc (a load found it unusable); the whole
// segment when it is gone.
func (s *Sharing) DropOverlayBlock(id format.BlockID, loc index.Location, gone bool) {
	ov := &s.ov
	ov.emu.Lock()
	if cur, ok := ov.blocks[id]; ok && cur.Segment == loc.Segment && cur.Offset == loc.Offset {
		delete(ov.blocks, id)
	}
	o := ov.segs[loc.Segment]
	ov.emu.Unlock()
	if gone && o != nil {
		s.forgetOverlay(foreignKey{o.seg.inst, o.seg.number})
	}
}

// TailPublogs reads what the other instances appended to their publication logs. onMiss (a
// lookup or load missed): only logs written on this host; otherwise (the sharer's tick) every
// log. A namespace or root directory is listed again only when its modification time changed,
// but at every publogRelistEvery-th tick, when every one is (a network file system's client may
// show a directory's time late; a reader in a log follows its continuations without a listing,
// so listings only find new instances and restarted writers).
func (s *Sharing) TailPublogs(onMiss bool) {
	if s == nil || s.cfg.ReadOnly {
		return
	}
	ov := &s.ov
	ov.mu.Lock()
	defer ov.mu.Unlock()
	trustTimes := onMiss || ov.ticks%publogRelistEvery != 0
	if !onMiss {
		ov.ticks++
	}
	for _, t := range s.cfg.Tiers {
		if !t.Shared() {
			continue
		}
		for _, root := range t.Config().Paths {
			s.discoverPublogs(t, root, trustTimes)
		}
	}
	for _, tl := range ov.tails {
		if onMiss && tl.f != nil && !tl.sameHost {
			continue
		}
		s.findPublog(tl, trustTimes)
		if tl.f != nil && !tl.ignored {
			s.readPublog(tl)
		}
	}
}

// RunTailer reads every other instance's log each refresh interval, in a goroutine of its
// own: on a network file system a pass takes tens of milliseconds that the sharer's manifests
// and heartbeats must not wait for.
func (s *Sharing) RunTailer() {
	defer s.cfg.BG.Done()
	tick := time.NewTicker(s.cfg.RefreshInterval)
	defer tick.Stop()
	for {
		s.TailPublogs(false)
		select {
		case <-s.cfg.Stop:
			return
		case <-tick.C:
		}
	}
}

// logsRead returns the sequence of the newest log of instance inst read to its end, if any.
func (s *Sharing) logsRead(inst format.InstanceID) (seq uint64, ok bool) {
	ov := &s.ov
	ov.emu.RLock()
	defer ov.emu.RUnlock()
	seq, ok = ov.current[inst]
	return seq, ok
}

// forgetUnannounced drops the overlay's segments of instance inst that neither m (its newest
// manifest, just read) lists nor inst's log of sequence seq, the newest read to its end before
// m was read (logsRead), still names: retired (the log names a segment until it is listed, and
// a while after; the overlay forgets a listed one when the foreign index takes it). A log read
// after m may be a continuation begun at a newer manifest that lists a segment m does not: the
// segment is forgotten only by what was read before m.
func (s *Sharing) forgetUnannounced(inst format.InstanceID, m *format.Manifest, seq uint64, ok bool) {
	ov := &s.ov
	listed := make(map[uint64]bool, len(m.Segments))
	for _, ent := range m.Segments {
		listed[ent.Number] = true
	}
	var keys []foreignKey
	ov.emu.RLock()
	for k, alias := range ov.byKey {
		if ok && k.inst == inst && ov.segs[alias].seq < seq && !listed[k.number] {
			keys = append(keys, k)
		}
	}
	ov.emu.RUnlock()
	for _, k := range keys {
		s.forgetOverlay(k)
	}
}

// discoverPublogs keeps a tail for every other namespace under root (ov.mu held).
func (s *Sharing) discoverPublogs(t tiers.Disk, root string, trustTimes bool) {
	ov := &s.ov
	dir := filepath.Join(root, tiers.InstancesDir)
	now := time.Now()
	st, err := s.cfg.FS.Stat(dir)
	if err != nil {
		return
	}
	if trustTimes && dirUnchanged(st.ModTime(), ov.rootMod[root], ov.listed[root]) {
		return
	}
	insts, err := tiers.ListNamespaces(s.cfg.FS, root)
	if err != nil {
		return
	}
	if ov.rootMod == nil {
		ov.rootMod, ov.listed = map[string]time.Time{}, map[string]time.Time{}
		ov.tails = map[string]*publogTail{}
	}
	ov.rootMod[root], ov.listed[root] = st.ModTime(), now
	present := map[string]bool{}
	for _, inst := range insts {
		if inst == s.env.Instance() {
			continue
		}
		nsDir := tiers.NamespaceDir(root, inst)
		present[nsDir] = true
		if ov.tails[nsDir] == nil {
			ov.tails[nsDir] = &publogTail{inst: inst, nsDir: nsDir, tier: t}
		}
	}
	prefix := dir + string(filepath.Separator)
	for nsDir, tl := range ov.tails {
		if strings.HasPrefix(nsDir, prefix) && !present[nsDir] {
			// The namespace is gone: so is every segment its log named.
			if tl.f != nil {
				_ = tl.f.Close()
			}
			delete(ov.tails, nsDir)
			s.forgetOverlayOf(tl.inst)
		}
	}
}

// forgetOverlayOf drops the overlay's segments of instance inst, whose namespace is gone, and
// what it knew of its reclaimed segments.
func (s *Sharing) forgetOverlayOf(inst format.InstanceID) {
	ov := &s.ov
	var keys []foreignKey
	ov.emu.Lock()
	for k := range ov.byKey {
		if k.inst == inst {
			keys = append(keys, k)
		}
	}
	for k := range ov.reclaimed {
		if k.inst == inst {
			delete(ov.reclaimed, k)
		}
	}
	delete(ov.current, inst)
	ov.emu.Unlock()
	for _, k := range keys {
		s.forgetOverlay(k)
	}
}

// findPublog moves tl to the newest log of its namespace when there is one newer than the one
// it reads (the writer restarted, or tl has none yet), after reading what the current one still
// holds, and reads it. trustTimes: only when the namespace directory changed since it was last
// listed.
func (s *Sharing) findPublog(tl *publogTail, trustTimes bool) {
	now := time.Now()
	st, err := s.cfg.FS.Stat(tl.nsDir)
	if err != nil || (trustTimes && !tl.stuck && !tl.stale && dirUnchanged(st.ModTime(), tl.nsMod, tl.nsListed)) {
		return
	}
	seqs, err := tiers.PublogNames(s.cfg.FS, tl.nsDir)
	if err != nil || len(seqs) == 0 {
		return
	}
	tl.nsMod, tl.nsListed = st.ModTime(), now
	newest := seqs[len(seqs)-1]
	if tl.f != nil && newest <= tl.seq {
		return
	}
	if tl.f != nil && !tl.ignored && !tl.stuck {
		s.readPublog(tl) // what the current log still holds, first: it may continue into the newest
		if tl.seq >= newest {
			return
		}
	}
	// The newest log names every segment not listed long enough for this instance to have
	// read its manifest: the older ones are not needed (and may name retired segments).
	if s.openPublog(tl, newest); tl.seq == newest && !tl.ignored {
		s.readPublog(tl)
	}
}

// openPublog makes tl read log seq of its namespace from its start.
func (s *Sharing) openPublog(tl *publogTail, seq uint64) {
	path := filepath.Join(tl.nsDir, tiers.PublogName(seq))
	f, err := s.cfg.FS.Open(path)
	if err != nil {
		return
	}
	hdr := make([]byte, format.PublogHeaderSize)
	n, _ := f.ReadAt(hdr, 0) // short: not written yet
	if n < len(hdr) {
		_ = f.Close()
		return // not written yet: the next tail tries again
	}
	h, err := format.DecodePublogHeader(hdr)
	if err == nil && h.Instance != tl.inst {
		err = fmt.Errorf("%w: written by instance %x", format.ErrCorrupt, h.Instance)
	}
	if err != nil {
		_ = f.Close()
		s.cfg.Logger.Warn("ucm: publication log unreadable; its blocks are seen when their segment is published", "path", path, "err", err)
		return
	}
	if tl.f != nil {
		_ = tl.f.Close()
	}
	tl.f, tl.seq, tl.off, tl.stuck, tl.stale = f, seq, format.PublogHeaderSize, false, false
	tl.sameHost = h.Host == thisHost()
	tl.ignored = h.Schema != s.env.Fingerprint() && !s.cfg.LookupOnly
}

// readPublog reads tl's log from its position to its end and adds what it announces to the
// overlay, following continuations.
func (s *Sharing) readPublog(tl *publogTail) {
	for tl.f != nil && !tl.stuck {
		st, err := tl.f.Stat()
		if err != nil || st.Size() <= tl.off {
			s.dropStaleLog(tl, err)
			return
		}
		buf := make([]byte, min(st.Size()-tl.off, publogReadMax))
		n, err := tl.f.ReadAt(buf, tl.off)
		if n == 0 {
			s.dropStaleLog(tl, err)
		}
		buf = buf[:n]
		used := 0
		var next uint64
		for used < len(buf) {
			ent, size, err := format.DecodePublogEntry(buf[used:])
			if errors.Is(err, format.ErrShortPublogEntry) {
				break
			}
			if err != nil {
				tl.stuck = true
				s.cfg.Logger.Warn("ucm: publication log damaged; what follows is seen when its segment is published",
					"path", filepath.Join(tl.nsDir, tiers.PublogName(tl.seq)), "offset", tl.off+int64(used), "err", err)
				break
			}
			used += size
			if ent.Type == format.PublogNext {
				next = ent.Next
				break
			}
			s.applyPublogEntry(tl, &ent)
		}
		tl.off += int64(used)
		if next == 0 && tl.off >= st.Size() {
			s.caughtUp(tl)
		}
		if next != 0 {
			s.openPublog(tl, next)
			if tl.seq != next {
				return
			}
			continue
		}
		if used == 0 {
			return
		}
	}
}

// dropStaleLog closes tl's log when err says its handle went stale (ESTALE: the file was
// deleted through another host, or a distributed file system's client lost it): the next tail
// that lists the namespace opens its newest log again, from the start (entries already applied
// are known, and applied once).
func (s *Sharing) dropStaleLog(tl *publogTail, err error) {
	if !errors.Is(err, syscall.ESTALE) {
		return
	}
	_ = tl.f.Close()
	tl.f, tl.stale = nil, true
}

// caughtUp notes that tl read its log to its end: every segment the log names is known.
func (s *Sharing) caughtUp(tl *publogTail) {
	ov := &s.ov
	ov.emu.Lock()
	defer ov.emu.Unlock()
	if ov.current == nil {
		ov.current = map[format.InstanceID]uint64{}
	}
	ov.current[tl.inst] = tl.seq
}

// applyPublogEntry adds the blocks of one entry to the overlay, unless the foreign index holds
// their segment already.
func (s *Sharing) applyPublogEntry(tl *publogTail, ent *format.PublogEntry) {
	k := foreignKey{tl.inst, ent.Segment}
	s.mu.Lock()
	alias, indexed := s.aliases[k]
	indexed = indexed && s.segs[alias].generation == ent.Generation
	s.mu.Unlock()
	if indexed {
		return
	}
	ov := &s.ov
	ov.emu.Lock()
	defer ov.emu.Unlock()
	if gen, ok := ov.reclaimed[k]; ok && gen == ent.Generation {
		return // taken by a reclaimer from its gone owner
	}
	if ov.blocks == nil {
		ov.blocks, ov.segs, ov.byKey = map[format.BlockID]index.Location{}, map[uint64]*overlaySeg{}, map[foreignKey]uint64{}
	}
	alias, ok := ov.byKey[k]
	o := ov.segs[alias]
	if ok && o.seg.generation != ent.Generation {
		// The number was reused for another file: what was learned of the old one is stale.
		for _, id := range o.ids {
			if loc, ok := ov.blocks[id]; ok && loc.Segment == alias {
				delete(ov.blocks, id)
			}
		}
		delete(ov.segs, alias)
		ok = false
	}
	if !ok {
		ov.next++
		alias = foreignAlias | overlayAlias | ov.next
		o = &overlaySeg{seg: foreignSeg{inst: tl.inst, number: ent.Segment, generation: ent.Generation, dir: filepath.Join(tl.nsDir, tiers.SegmentDir), tier: tl.tier}}
		ov.segs[alias] = o
		ov.byKey[k] = alias
	}
	o.seq = tl.seq
	for _, r := range ent.Records {
		if r.Kind != 0 {
			continue // sidecars are seen with their segment's manifest
		}
		loc, err := index.DecodeLocation(r.Location)
		if err != nil || (loc.Layout != s.env.Layout() && !s.cfg.LookupOnly) {
			continue
		}
		loc.Segment = alias
		if _, known := ov.blocks[r.ID]; !known {
			ov.blocks[r.ID] = loc
			o.ids = append(o.ids, r.ID)
			ov.records.Add(1)
		}
	}
}

// closeOverlay closes the logs being tailed (Close).
func (s *Sharing) closeOverlay() {
	ov := &s.ov
	ov.mu.Lock()
	defer ov.mu.Unlock()
	for _, tl := range ov.tails {
		if tl.f != nil {
			_ = tl.f.Close()
			tl.f = nil
		}
	}
}

// PublishedPrefix extends the leading run ids[:n] of stored blocks over the blocks the
// publication logs announced, and over own and foreign ones after them, reading this host's
// logs once at the first miss.
func (s *Sharing) PublishedPrefix(ids []format.BlockID, n int) int {
	tailed := false
	for n < len(ids) {
		id := ids[n]
		if _, ok := s.OverlayGet(id); ok || s.env.Indexed(id) || s.fx.Contains(id) {
			n++
			continue
		}
		if tailed {
			break
		}
		s.TailPublogs(true)
		tailed = true
	}
	return n
}
