package wal

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// SyncPolicy says when appended records are made durable with fdatasync.
type SyncPolicy int

const (
	// SyncAlways fdatasyncs every group of records before it is published: an acknowledged
	// record survives power loss.
	SyncAlways SyncPolicy = iota
	// SyncInterval publishes records once written and fdatasyncs periodically: a crash may lose
	// records acknowledged since the last sync, never exposes a torn one.
	SyncInterval
	// SyncNone never fdatasyncs records (segments are still synced when sealed and on Close):
	// for tests and tmpfs.
	SyncNone
)

// String returns "always", "interval" or "none".
func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "always"
	case SyncInterval:
		return "interval"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncPolicy(%d)", int(p))
}

// ParseSyncPolicy parses "always", "interval" or "none".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	for _, p := range []SyncPolicy{SyncAlways, SyncInterval, SyncNone} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("sync policy %q: want always, interval or none: %w", s, format.ErrInvalid)
}

// Record is one block handed to the Writer, in one of two forms:
//
//   - Payload nil: Buf is an aligned buffer of exactly the record's bytes (header and payload)
//     whose payload part (from format.RecordHeaderSize) the caller has filled;
//   - Payload set: Buf is an aligned buffer of format.RecordHeaderSize bytes and Payload the
//     aligned payload: two buffers written by one vectored write, so that a pooled payload
//     fills its buffer's size class instead of sharing the class above with a header.
//
// The payload is the raw one (Layout.PayloadBytes() bytes, shard i at
// Layout.ShardOffset(i) - format.RecordHeaderSize, zero padding), or for a compressed record
// (Compression != CompressionNone, StoredLens and StoredCRCs set) the stored shards packed
// (format.StoredPayloadBytes(...) bytes; see format/compress.go).
//
// The Writer fills the header part. Buffers must stay untouched until Append returns.
type Record struct {
	// ID is the block's id; for a sidecar (Kind != 0), the id of the block it describes.
	ID format.BlockID
	// Kind is 0 for a block record, else the sidecar kind of a sidecar record (which must be
	// stored CompressionPacked).
	Kind        format.SidecarKind
	Layout      format.Layout
	ShardCRCs   []uint32
	Compression format.Compression
	StoredLens  []uint32
	StoredCRCs  []uint32
	Buf         []byte
	Payload     []byte
	// PayloadBorrowed says Payload is memory its owner lent for the write (a dump's source
	// buffer), not a buffer of the caller's pool: bookkeeping for the caller, which returns
	// only its own buffers to its pool. The Writer does not look at it.
	PayloadBorrowed bool
	// Origin is set on a record that relocates a stored block (compaction, demotion,
	// promotion): where the block's entry pointed when it was read. Hooks.Publish moves the
	// entry only if it still points there; the Writer itself does not look at it.
	Origin *Origin

	// Set on the records Batch.CommitBatch publishes, one per block of a layer-major batch
	// record (format.RecordBatch): the batch's block count, this block's position in it and
	// the batch record's on-disk size. Offset is then the batch record's, HeaderCRC the batch
	// header's; Buf and Payload are nil.
	BatchBlocks int
	BatchPos    int
	BatchExtent int64

	// Set by the Writer before Publish.
	Segment   uint64
	Offset    int64
	Seq       uint64
	HeaderCRC uint32
}

// Type is the record type rec is written as: RecordBatch for a block of a batch,
// RecordSidecar when Kind is set, else RecordBlock.
func (r *Record) Type() format.RecordType {
	if r.BatchBlocks > 0 {
		return format.RecordBatch
	}
	if r.Kind != 0 {
		return format.RecordSidecar
	}
	return format.RecordBlock
}

// Origin is the place a relocated record was copied from.
type Origin struct {
	Segment uint64
	Offset  int64
}

// Hooks connect the Writer to the index. Publish is called one group at a time, in placement
// order, from the goroutine that completes appends; a record is published after the segment
// it is in was created. SegmentSealed is called once every record placed in the segment has
// been published, from a goroutine of its own: it may run beside Publish of later segments
// and beside other hooks. SegmentCreated and Synced are called from the committer goroutine:
// Synced once every earlier append has been published and every started seal has finished,
// SegmentCreated possibly while records of older segments are still being published or
// sealed (never for the same segment). No implementation may assume it runs alone.
type Hooks interface {
	// SegmentCreated registers a new segment durably as active. It is called once the segment
	// file exists (its directory entry is synced meanwhile), before any record is appended to
	// it; the segment's header is written with its first records (see CreateSegment).
	SegmentCreated(number, generation uint64) error
	// Publish makes a group of appended records visible. Under SyncAlways it is called after
	// the records are durable (durable true), otherwise after they are written. The records
	// stay in an active segment, which recovery scans, until SegmentSealed: an index need not
	// sync their entries here if SegmentSealed makes them durable.
	Publish(recs []*Record, durable bool) error
	// SegmentSealed records that a segment's footer is durable and its size final, and makes
	// every entry published for the segment durable with it: recovery no longer scans it.
	SegmentSealed(number uint64, size int64) error
	// Synced is called after a periodic or explicit Sync has made every written record durable;
	// the index should make every applied batch durable too.
	Synced() error
	// SegmentDropped gives back a segment that was created (SegmentCreated) and never received
	// a record (PrepareNext): the Writer will not touch it again, and the implementation
	// deletes it. Called from Close.
	SegmentDropped(number uint64) error
}

// Options configure a Writer.
type Options struct {
	FS  vfs.FS
	Dir string // the segment directory; it must exist
	// SegmentSize is the size at which the active segment is sealed and a new one started.
	// A record larger than a whole segment gets a segment of its own.
	SegmentSize  int64
	Sync         SyncPolicy
	SyncInterval time.Duration // SyncInterval only
	Direct       devio.DirectMode
	Backend      devio.Backend
	Instance     format.InstanceID
	Schema       format.Fingerprint
	Hooks        Hooks
	Logger       *slog.Logger
	// NextSegment is the number the next new segment gets; the caller derives it from the
	// segment table (one past the highest number ever registered). Ignored when Allocate is set.
	NextSegment uint64
	// Allocate, if set, hands out new segment numbers instead of NextSegment: several Writers
	// of one store (one per tier, one for relocations) share one number space. Each number it
	// returns must be new.
	Allocate func() uint64
	// DirFor, if set, places segment n in the directory it returns (placement across a tier's
	// paths) instead of Dir; the directory must exist.
	DirFor func(n uint64) string
	// Admit, if set, is asked before segment n is created in dir and may refuse (an error
	// wrapping the reason, e.g. no space under the tier's capacity); the records waiting for it
	// then fail with that error. It may block while space is reclaimed. It may hand back the
	// path of a recycled file in dir (RecyclePath), which the segment then reuses instead of a
	// new file; if that creation fails the file is removed.
	Admit func(n uint64, dir string) (reuse string, err error)
	// PrepareNext has the Writer create its next segment in the background whenever it starts
	// appending to a new one, so that rotation does not wait for a creation: under load its
	// flushes (header, directory, index) queue behind full device queues, 35–100 ms each time
	// here, longer than a 256 MiB segment takes to fill. The first segment is created when the
	// first records arrive (on an idle device: milliseconds), so opening a store has no side
	// effect (on a full tier, a reservation at Open would evict). A prepared segment left unused
	// at Close is handed back with Hooks.SegmentDropped. Off by default: a writer that seldom
	// appends (relocation) would keep an empty segment for nothing.
	PrepareNext bool
	// MaxGroupBytes bounds the record bytes written by one group commit.
	MaxGroupBytes int64
	// OnSegment is told about every segment the Writer opens, so readers can find it.
	OnSegment func(*Segment)
	// BatchRecords lets the Writer write layer-major batch records (ReserveBatch): every
	// segment it creates then carries format.FeatureBatchRecords, which builds that predate
	// batches refuse by name. Off, segments are byte-identical to those of such builds.
	BatchRecords bool
	// DataSyncs, if set, counts the fdatasyncs of the segments the Writer creates (group
	// commits, batch commits and seals): with the bytes appended, how much each flush covers.
	DataSyncs *atomic.Int64
	// OnFlight, if set, is told when each flight of records passed each step of the pipeline
	// (FlightTiming), from the publisher goroutine once the flight is settled; it must return
	// quickly. A diagnostic: unset, the Writer reads no clocks for it.
	OnFlight func(FlightTiming)
}

// FlightTiming is when one flight, a run of records placed contiguously in one segment and
// written by one Submit, passed each step from Append to publication (Options.OnFlight).
// Appended → Issued is the wait for placement (the committer, a segment, a free flight slot);
// Issued → Written the device (with devio's queue-depth tokens); Written → Published the
// publisher (earlier flights, the fdatasync, the index batch).
type FlightTiming struct {
	Records int
	Bytes   int64
	// Appended is the earliest Append among the flight's records.
	Appended time.Time
	// Issued: its writes were submitted; Written: they completed.
	Issued, Written time.Time
	// Synced: its segment's fdatasync covering it returned (zero unless SyncAlways or when
	// the flight shared the sync of an earlier flight of its batch, which then is its time).
	Synced time.Time
	// Published: its records were published (or failed) and their callers answered.
	Published time.Time
	// Batch is the number of flights settled together with this one (one sync, one index
	// batch per segment).
	Batch int
}

// ErrWriterClosed is returned by Append after Close.
var ErrWriterClosed = errors.New("wal: writer closed")

type request struct {
	recs []*Record
	sync bool // an explicit Sync request (recs empty)
	// sealAge > 0: a SealOlderThan request (recs empty).
	sealAge time.Duration
	// batch: a ReserveBatch request (recs empty).
	batch *Batch
	done  chan error
	// appended is when Append was called (only with Options.OnFlight).
	appended time.Time

	mu        sync.Mutex
	remaining int   // records not yet published or failed
	err       error // the first failure among them
}

// settle records the outcome of n of the request's records; the last one answers the caller
// with the first failure.
func (r *request) settle(n int, err error) {
	r.mu.Lock()
	if err != nil && r.err == nil {
		r.err = err
	}
	r.remaining -= n
	last, first := r.remaining == 0, r.err
	r.mu.Unlock()
	if last {
		r.done <- first
	}
}

// flight is a run of records placed contiguously in one segment whose writes have been issued:
// the publisher waits for the writes, syncs (SyncAlways) and publishes flights in placement
// order, so a record is published only after a sync that began after its write completed, and
// never before the records placed ahead of it.
//
// A seal flight (seal set, no records) marks the end of a segment's records: when the
// publisher reaches it, every record of the segment is published, and the publisher starts
// the seal in the background. The committer goes on writing the next segment while the last
// writes of the old one complete, and the publisher goes on publishing it while the old one's
// footer is written and synced (a seal costs two flushes, each queued behind a full device
// queue under load: publication held up behind it starved the device).
type flight struct {
	seg     *Segment
	seal    bool
	recs    []*Record
	owners  []*request // owners[i] sent recs[i]
	written chan struct{}
	err     error         // the write's error, set before written is closed
	settled chan struct{} // closed once every record is published or failed
	// timing is filled in only with Options.OnFlight.
	timing FlightTiming
}

// maxFlights bounds the flights between placement and publication: enough to keep writes
// flowing while earlier ones are synced and published.
const maxFlights = 8

// Writer appends records to the active segment of one directory with group commit, pipelined:
// the committer places each group of concurrent Append calls at the end of the log and issues
// its writes without waiting for them; the publisher takes every group whose writes have
// completed, covers them with one fdatasync and publishes them with one index batch per
// segment, while the committer already writes the next groups. Writes to a segment whose write
// or sync failed stop there: the segment is left for recovery to seal and a new segment is
// started; the error reaches the callers of every record not published before it.
type Writer struct {
	opts   Options
	reqs   chan *request
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool

	// Owned by the committer goroutine.
	active *Segment
	next   uint64
	// prepared delivers the segment prepareNext is creating; nil when none is under way.
	prepared chan prepared
	dirty    []*Segment // segments written since their last fdatasync
	last     *flight    // the flight issued last, for drain

	flights chan *flight   // committer -> publisher, in placement order
	slots   chan struct{}  // one per flight not yet settled
	sealing sync.WaitGroup // seals started by the publisher and not finished
	// batchSeals counts the seals waiting for open batches (no longer counted in sealing).
	batchSeals sync.WaitGroup

	// pubMu serialises Hooks.Publish between the publisher and Batch.CommitBatch.
	pubMu sync.Mutex
	// batchMu guards open (the batches placed and neither committed nor abandoned) and
	// batchesClosed (Close has abandoned them: no new batch is placed).
	batchMu       sync.Mutex
	open          map[*Batch]struct{}
	batchesClosed bool
}

// NewWriter starts a Writer. No segment is created until the first record arrives.
func NewWriter(opts Options) (*Writer, error) {
	if opts.FS == nil || opts.Backend == nil || opts.Hooks == nil || (opts.Dir == "" && opts.DirFor == nil) {
		return nil, fmt.Errorf("wal: writer needs FS, Dir or DirFor, Backend and Hooks: %w", format.ErrInvalid)
	}
	if opts.SegmentSize < 2*format.Alignment {
		return nil, fmt.Errorf("wal: segment size %d too small: %w", opts.SegmentSize, format.ErrInvalid)
	}
	if opts.NextSegment == 0 {
		opts.NextSegment = 1
	}
	if opts.MaxGroupBytes <= 0 {
		opts.MaxGroupBytes = 64 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Writer{opts: opts, reqs: make(chan *request, 1024), stop: make(chan struct{}), next: opts.NextSegment,
		flights: make(chan *flight, maxFlights), slots: make(chan struct{}, maxFlights), open: make(map[*Batch]struct{})}
	w.wg.Add(2)
	go w.run()
	go w.publisher()
	if opts.Sync == SyncInterval && opts.SyncInterval > 0 {
		w.wg.Add(1)
		go w.ticker()
	}
	return w, nil
}

// Append writes recs and returns once they are published (durable first under SyncAlways).
// On error none of recs is published.
func (w *Writer) Append(recs []*Record) error {
	if len(recs) == 0 {
		return nil
	}
	r := &request{recs: recs, done: make(chan error, 1)}
	if w.opts.OnFlight != nil {
		r.appended = time.Now()
	}
	return w.send(r)
}

// Sync makes every record appended so far durable, then calls Hooks.Synced.
func (w *Writer) Sync() error { return w.send(&request{sync: true, done: make(chan error, 1)}) }

// SealOlderThan seals the active segment if its first record was placed at least age ago: it
// is rotated like a full segment (the next append starts a new one) and sealed in the
// background once its records are published. It returns once the decision is taken, not when
// the seal is done (Hooks.SegmentSealed reports that). Readers without an index, which see
// only sealed segments (a shared tier's other instances), see a slowly filling segment's
// records within about age.
func (w *Writer) SealOlderThan(age time.Duration) error {
	if age <= 0 {
		return fmt.Errorf("wal: seal age %v: %w", age, format.ErrInvalid)
	}
	return w.send(&request{sealAge: age, done: make(chan error, 1)})
}

func (w *Writer) send(r *request) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrWriterClosed
	}
	w.reqs <- r
	w.mu.Unlock()
	return <-r.done
}

// Close syncs what was written, seals the active segment and stops the committer. Appends
// racing with Close either complete or fail with ErrWriterClosed.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.stop)
	w.mu.Unlock()
	// An open batch would hold its segment's seal, which the committer's last drain waits for.
	w.abandonOpenBatches()
	w.wg.Wait()
	w.batchSeals.Wait()
	// Drain requests queued before closed was set.
	for {
		select {
		case r := <-w.reqs:
			r.done <- ErrWriterClosed
		default:
			err := w.finish()
			return err
		}
	}
}

// finish runs after the committer stopped: sync and seal the active segment.
func (w *Writer) finish() error {
	err := w.syncDirty()
	if err == nil && w.active != nil {
		err = w.seal(w.active)
	}
	if err == nil && len(w.dirty) == 0 {
		err = w.opts.Hooks.Synced()
	}
	return errors.Join(err, w.dropPrepared())
}

func (w *Writer) ticker() {
	defer w.wg.Done()
	t := time.NewTicker(w.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			r := &request{sync: true, done: make(chan error, 1)}
			select {
			case w.reqs <- r:
			case <-w.stop:
				return
			}
			// Close may stop the committer before it answers; its drain then answers r.
			select {
			case err := <-r.done:
				if err != nil {
					w.opts.Logger.Warn("wal: periodic sync failed", "err", err)
				}
			case <-w.stop:
				return
			}
		}
	}
}

func (w *Writer) run() {
	defer w.wg.Done()
	defer close(w.flights) // after the deferred drain below: the publisher is idle by then
	defer w.drain()
	var group []*request
	for {
		group = group[:0]
		select {
		case <-w.stop:
			return
		case r := <-w.reqs:
			group = append(group, r)
		}
		// Gather whatever else is queued, up to the group byte limit.
		bytes := reqBytes(group[0])
	gather:
		for bytes < w.opts.MaxGroupBytes {
			select {
			case r := <-w.reqs:
				group = append(group, r)
				bytes += reqBytes(r)
			default:
				break gather
			}
		}
		w.commit(group)
	}
}

func reqBytes(r *request) int64 {
	var n int64
	for _, rec := range r.recs {
		n += rec.Size()
	}
	return n
}

// Size is the record's on-disk size: header plus payload as written; for a block of a batch,
// its share of the batch record (format.BatchBlockBytes: the shares of a batch sum to its
// extent).
func (r *Record) Size() int64 {
	if r.BatchBlocks > 0 {
		return format.BatchBlockBytes(r.BatchBlocks, r.BatchPos, r.Layout)
	}
	return int64(len(r.Buf)) + int64(len(r.Payload))
}

// End is the offset just past the record in its segment (past the whole batch record for a
// block of a batch).
func (r *Record) End() int64 {
	if r.BatchBlocks > 0 {
		return r.Offset + r.BatchExtent
	}
	return r.Offset + r.Size()
}

// commit places one group. Records are placed in order; when the active segment fills, the
// records placed so far are drained (written and published), the segment sealed and a new one
// started. Appends are answered by the publisher; Sync requests here, once everything before
// them is published.
func (w *Writer) commit(group []*request) {
	var (
		recs     []*Record
		owners   []*request // owners[i] sent recs[i]
		syncReqs []*request
		sealReqs []*request
	)
	for _, r := range group {
		if r.batch != nil {
			r.done <- w.placeBatch(r.batch)
			continue
		}
		if r.sync {
			syncReqs = append(syncReqs, r)
		}
		if r.sealAge > 0 {
			sealReqs = append(sealReqs, r)
		}
		r.remaining = len(r.recs)
		for _, rec := range r.recs {
			recs = append(recs, rec)
			owners = append(owners, r)
		}
	}
	fail := func(lo, hi int, err error) {
		for i := lo; i < hi; i++ {
			owners[i].settle(1, err)
		}
	}
	start := 0
	for start < len(recs) {
		if err := w.ensureActive(); err != nil {
			fail(start, len(recs), err)
			break
		}
		// Place as many records as fit in the active segment.
		seg := w.active
		end, off := start, seg.end
		for end < len(recs) {
			size := recs[end].Size()
			n := len(seg.entries) + end - start
			fits := off+size+format.FooterSize(n+1) <= w.opts.SegmentSize
			if !fits && n > 0 {
				break // a record bigger than a whole segment still gets an empty one
			}
			off += size
			end++
		}
		if end == start {
			// The active segment is full: the publisher seals it once its records are
			// published; go round again with a new one.
			w.rotate(seg)
			continue
		}
		if err := w.issue(seg, recs[start:end], owners[start:end]); err != nil {
			fail(start, end, err)
		}
		start = end
	}
	for _, r := range sealReqs {
		if seg := w.active; seg != nil && len(seg.entries) > 0 && seg.failure() == nil && time.Since(seg.firstPlaced) >= r.sealAge {
			w.rotate(seg)
		}
		r.done <- nil
	}
	if len(syncReqs) > 0 {
		w.drain()
		err := w.syncDirty()
		if err == nil {
			err = w.opts.Hooks.Synced()
		}
		for _, r := range syncReqs {
			r.done <- err
		}
	}
}

// issue places recs at the end of seg, starts their writes and hands them to the publisher.
// It returns an error, with nothing written, only for records it refuses.
func (w *Writer) issue(seg *Segment, recs []*Record, owners []*request) error {
	off := seg.end
	ordinal := seg.ordinal
	for _, rec := range recs {
		ordinal++
		rec.Segment, rec.Offset, rec.Seq = seg.Number, off, SequenceFor(seg.Number, ordinal)
		h := format.RecordHeader{Type: rec.Type(), Kind: rec.Kind, ID: rec.ID, Segment: seg.Number, Generation: seg.Generation,
			Seq: rec.Seq, Layout: rec.Layout, ShardCRCs: rec.ShardCRCs, Compression: rec.Compression, StoredLens: rec.StoredLens, StoredCRCs: rec.StoredCRCs}
		crc, err := format.EncodeRecordHeader(rec.Buf[:format.RecordHeaderSize], &h)
		if err != nil {
			return fmt.Errorf("wal: record %s: %w", rec.ID, err)
		}
		if rec.Size() != h.RecordBytes() || (rec.Payload != nil && len(rec.Buf) != format.RecordHeaderSize) {
			return fmt.Errorf("wal: record %s: buffers of %d+%d bytes, layout needs %d: %w", rec.ID, len(rec.Buf), len(rec.Payload), h.RecordBytes(), format.ErrInvalid)
		}
		rec.HeaderCRC = crc
		off += rec.Size()
	}
	// The records are placed: account for them now, so that the next run goes after them. If
	// their write or sync fails the segment is abandoned, never sealed with these entries.
	if len(seg.entries) == 0 {
		seg.firstPlaced = time.Now()
	}
	for _, rec := range recs {
		seg.entries = append(seg.entries, format.FooterEntry{ID: rec.ID, Offset: rec.Offset, Length: rec.Size(),
			Seq: rec.Seq, HeaderCRC: rec.HeaderCRC, Type: rec.Type(), Kind: rec.Kind})
	}
	seg.end, seg.ordinal = off, ordinal
	if w.opts.Sync != SyncAlways {
		w.markDirty(seg)
	}
	w.launch(seg, recs, owners, planWrites(seg, recs))
	return nil
}

// launch starts the writes ops of a flight of recs (none for a batch header) placed in seg and
// hands the flight to the publisher.
func (w *Writer) launch(seg *Segment, recs []*Record, owners []*request, ops []devio.Op) *flight {
	f := &flight{seg: seg, recs: recs, owners: owners, written: make(chan struct{}), settled: make(chan struct{})}
	w.slots <- struct{}{}
	timed := w.opts.OnFlight != nil
	if timed {
		f.timing = FlightTiming{Records: len(recs), Issued: time.Now()}
		if len(recs) == 0 {
			f.timing.Appended = f.timing.Issued // a batch header: placed as it is issued
		}
		for i, rec := range recs {
			f.timing.Bytes += rec.Size()
			if a := owners[i].appended; f.timing.Appended.IsZero() || a.Before(f.timing.Appended) {
				f.timing.Appended = a
			}
		}
	}
	go func() {
		f.err = w.opts.Backend.Submit(ops)
		clear(ops) // drop buffer references
		if timed {
			f.timing.Written = time.Now()
		}
		close(f.written)
	}()
	w.last = f
	w.flights <- f // never blocks: slots bounds the flights
	return f
}

// drain waits until every issued flight is settled; the publisher is then idle, so hooks may
// be called. A failure it left on the active segment abandons the segment.
func (w *Writer) drain() {
	if w.last != nil {
		<-w.last.settled
		w.last = nil
	}
	// Every seal flight before the last one has started its seal: wait for the seals too, so
	// that a Sync or Close covers the records of the segments they seal.
	w.sealing.Wait()
	if w.active != nil {
		if err := w.active.failure(); err != nil {
			w.abandon(w.active, err)
		}
	}
}

// publisher settles flights in placement order: it waits for a flight's writes, takes every
// following flight whose writes have completed too, syncs their segments once (SyncAlways) and
// publishes them, one index batch per run of flights in the same segment.
func (w *Writer) publisher() {
	defer w.wg.Done()
	var (
		next  *flight
		batch []*flight
	)
	for {
		f := next
		next = nil
		if f == nil {
			var ok bool
			if f, ok = <-w.flights; !ok {
				return
			}
		}
		if f.seal {
			w.sealFlight(f)
			continue
		}
		<-f.written
		batch = append(batch[:0], f)
	gather:
		for {
			select {
			case g, ok := <-w.flights:
				if !ok {
					break gather // the loop above sees the close next
				}
				if g.seal {
					next = g // after this batch is published
					break gather
				}
				select {
				case <-g.written:
					batch = append(batch, g)
				default:
					next = g
					break gather
				}
			default:
				break gather
			}
		}
		w.settle(batch)
		clear(batch)
	}
}

// settle syncs and publishes a batch of flights whose writes have completed, answers their
// records' callers and releases the flights.
func (w *Writer) settle(batch []*flight) {
	for _, f := range batch {
		if f.err != nil {
			w.markFailed(f.seg, fmt.Errorf("wal: write segment %d: %w", f.seg.Number, f.err))
		}
	}
	durable := w.opts.Sync == SyncAlways
	timed := w.opts.OnFlight != nil
	if durable {
		for i, f := range batch {
			if (i > 0 && batch[i-1].seg == f.seg) || f.seg.failure() != nil {
				if timed && i > 0 {
					f.timing.Synced = batch[i-1].timing.Synced
				}
				continue
			}
			if !publishes(batch[i:], f.seg) {
				// Batch headers only: nothing to publish, so no sync is owed. A record placed
				// after a header is published only after a later sync, which covers the header
				// (its write completed first); a batch's commit syncs its header with it.
				continue
			}
			if err := f.seg.syncData(); err != nil {
				w.markFailed(f.seg, fmt.Errorf("wal: sync segment %d: %w", f.seg.Number, err))
			}
			if timed {
				f.timing.Synced = time.Now()
			}
		}
	}
	var (
		recs   []*Record
		owners []*request
	)
	for i, f := range batch {
		recs, owners = append(recs, f.recs...), append(owners, f.owners...)
		if i+1 < len(batch) && batch[i+1].seg == f.seg {
			continue // one index batch for the run
		}
		err := f.seg.failure()
		if err == nil && len(recs) > 0 {
			w.pubMu.Lock()
			perr := w.opts.Hooks.Publish(recs, durable)
			w.pubMu.Unlock()
			if perr != nil {
				err = fmt.Errorf("wal: publish to index: %w", perr)
			}
		}
		for _, r := range owners {
			r.settle(1, err)
		}
		recs, owners = recs[:0], owners[:0]
	}
	var published time.Time
	if timed {
		published = time.Now()
	}
	for _, f := range batch {
		<-w.slots
		if timed {
			f.timing.Published, f.timing.Batch = published, len(batch)
			w.opts.OnFlight(f.timing)
		}
		close(f.settled)
	}
}

// publishes reports whether the leading run of flights in seg holds a record to publish.
func publishes(flights []*flight, seg *Segment) bool {
	for _, f := range flights {
		if f.seg != seg {
			break
		}
		if len(f.recs) > 0 {
			return true
		}
	}
	return false
}

// planWrites turns records placed contiguously from their Offset into write operations on
// the records' own buffers, in placement order: a record's header and payload, and consecutive
// records, are adjacent, so the backend issues them as large vectored writes (devio merges
// adjacent ops) without copying a byte.
func planWrites(seg *Segment, recs []*Record) []devio.Op {
	ops := make([]devio.Op, 0, 2*len(recs)+1)
	ops = append(ops, headerOp(seg)...) // the first records of the segment write its header
	for _, rec := range recs {
		ops = append(ops, devio.Op{File: seg.file, Buf: rec.Buf, Off: rec.Offset, Write: true})
		if rec.Payload != nil {
			ops = append(ops, devio.Op{File: seg.file, Buf: rec.Payload, Off: rec.Offset + int64(len(rec.Buf)), Write: true})
		}
	}
	return ops
}

func (w *Writer) markDirty(seg *Segment) {
	for _, s := range w.dirty {
		if s == seg {
			return
		}
	}
	w.dirty = append(w.dirty, seg)
}

// syncDirty fdatasyncs every segment written since its last sync.
func (w *Writer) syncDirty() error {
	for len(w.dirty) > 0 {
		seg := w.dirty[0]
		if err := seg.syncData(); err != nil {
			w.abandon(seg, err)
			return fmt.Errorf("wal: sync segment %d: %w", seg.Number, err)
		}
		w.dirty = w.dirty[1:]
	}
	w.dirty = nil
	return nil
}

// abandon stops appending to seg after a failed write or sync. A failed fsync is never retried
// as if it had succeeded: the segment stays registered as active, so the next Open scans it,
// truncates whatever did not make it and seals it. Readers may keep reading what was published.
func (w *Writer) abandon(seg *Segment, cause error) {
	w.markFailed(seg, cause)
	w.detach(seg)
}

// markFailed records the first write or sync failure of seg, which stops appends to it.
func (w *Writer) markFailed(seg *Segment, cause error) {
	if seg.fail(cause) {
		w.opts.Logger.Error("wal: segment abandoned after I/O failure; recovery will seal it", "segment", seg.Number, "path", seg.path, "err", cause)
	}
}

// ensureActive opens a new active segment when there is none (or the active one failed).
func (w *Writer) ensureActive() error {
	if w.active != nil {
		err := w.active.failure()
		if err == nil {
			return nil
		}
		w.abandon(w.active, err)
		w.drain() // settle what the failed segment still has in flight before starting anew
	}
	seg := w.takePrepared()
	if seg == nil {
		var err error
		if seg, err = w.createSegment(); err != nil {
			return err
		}
	}
	w.active = seg
	w.prepareNext()
	return nil
}

// prepared is the outcome of a background segment creation.
type prepared struct {
	seg *Segment
	err error
}

// prepareNext starts creating the segment that follows the active one, with PrepareNext.
func (w *Writer) prepareNext() {
	if !w.opts.PrepareNext {
		return
	}
	c := make(chan prepared, 1)
	w.prepared = c
	go func() {
		seg, err := w.createSegment()
		c <- prepared{seg, err}
	}()
}

// takePrepared returns the segment prepareNext created, waiting for it if needed; nil if none
// was started or its creation failed (the caller creates one itself: a refusal by Admit may be
// stale by now, and a real failure repeats with its error).
func (w *Writer) takePrepared() *Segment {
	if w.prepared == nil {
		return nil
	}
	p := <-w.prepared
	w.prepared = nil
	if p.err != nil {
		w.opts.Logger.Warn("wal: preparing the next segment failed; creating it now", "err", p.err)
		return nil
	}
	return p.seg
}

// dropPrepared hands a prepared segment that never became active (Close) to
// Hooks.SegmentDropped, which deletes it.
func (w *Writer) dropPrepared() error {
	seg := w.takePrepared()
	if seg == nil {
		return nil
	}
	if err := w.opts.Hooks.SegmentDropped(seg.Number); err != nil {
		return fmt.Errorf("wal: drop unused segment %d: %w", seg.Number, err)
	}
	return nil
}

// createSegment allocates a number, has it admitted and creates the segment: laid out, its
// directory entry durable and registered (its header goes out with its first records). It runs on the committer, or in the background for prepareNext; never both at
// once (the committer waits for a preparation before creating a segment itself).
func (w *Writer) createSegment() (*Segment, error) {
	// A number is used once, whether or not its creation succeeds: a failed attempt may leave
	// a file behind, which the next Open removes or adopts.
	n := w.next
	if w.opts.Allocate != nil {
		n = w.opts.Allocate()
	} else {
		w.next++
	}
	dir := w.opts.Dir
	if w.opts.DirFor != nil {
		dir = w.opts.DirFor(n)
	}
	var reuse string
	if w.opts.Admit != nil {
		var err error
		if reuse, err = w.opts.Admit(n, dir); err != nil {
			return nil, fmt.Errorf("wal: segment %d not admitted: %w", n, err)
		}
	}
	seg, err := CreateSegment(w.opts.FS, dir, n, w.opts.Direct, &format.SegmentHeader{
		Number: n, Generation: randomGeneration(), Instance: w.opts.Instance,
		CreatedNano: time.Now().UnixNano(), Schema: w.opts.Schema, Features: w.features(),
	}, reuse)
	if err != nil {
		if reuse != "" {
			_ = w.opts.FS.Remove(reuse) // best effort: the next Open removes or reuses it
		}
		return nil, err
	}
	// Lay out the whole segment now (it reads as zeros, which a scan takes for the clean end
	// of the log): appends then write inside the file instead of extending it, which O_DIRECT
	// writes on ext4 and XFS do one at a time. Best effort: without it appends extend the file.
	seg.allocated = seg.file.Allocate(w.opts.SegmentSize)
	seg.dataSyncs = w.opts.DataSyncs
	// The directory entry and the registration are made durable side by side: each waits for
	// a flush, queued behind a full device under load. Either may survive a crash without the
	// other: recovery forgets a registered segment without a file, and deletes a segment file
	// whose header was never written, registered or not.
	dirSynced := make(chan error, 1)
	go func() { dirSynced <- SyncDir(w.opts.FS, dir) }()
	regErr := w.opts.Hooks.SegmentCreated(seg.Number, seg.Generation)
	if err := errors.Join(<-dirSynced, regErr); err != nil {
		seg.Release()
		_ = w.opts.FS.Remove(seg.path) // best effort: recovery deletes a file left behind
		return nil, fmt.Errorf("wal: create segment %d: %w", seg.Number, err)
	}
	if w.opts.OnSegment != nil {
		w.opts.OnSegment(seg)
	}
	return seg, nil
}

// features is the feature flags of the segments the Writer creates.
func (w *Writer) features() uint32 {
	if w.opts.BatchRecords {
		return format.FeatureSidecars | format.FeatureBatchRecords
	}
	return format.FeatureSidecars
}

// rotate ends the committer's use of the full active segment seg: the segment leaves the
// active and dirty lists (its seal syncs it) and a seal flight is queued behind its records,
// so the publisher seals it once they are published while the committer writes the next
// segment.
func (w *Writer) rotate(seg *Segment) {
	w.detach(seg)
	f := &flight{seg: seg, seal: true, written: closedChan, settled: make(chan struct{})}
	w.slots <- struct{}{}
	w.last = f
	w.flights <- f
}

// closedChan is the written channel of flights without writes.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// sealFlight starts sealing the segment of a seal flight, from the publisher: every record
// placed in it has been published. The seal runs beside the publication of later segments;
// drain waits for it. A failure leaves the segment registered as active for recovery to seal;
// every record in it was published, so no caller is owed the error, which is logged.
func (w *Writer) sealFlight(f *flight) {
	w.sealing.Add(1)
	go func() {
		seg := f.seg
		if hasOpenBatches(seg) {
			// Batches still open in seg hold its seal, possibly for as long as their layers take
			// to arrive: make its published records durable now, so that a Sync or Close that
			// waits for the seals started before it need not wait for the batches.
			w.batchSeals.Add(1)
			defer w.batchSeals.Done()
			if w.opts.Sync != SyncAlways {
				if err := seg.syncData(); err != nil {
					w.markFailed(seg, fmt.Errorf("wal: sync segment %d: %w", seg.Number, err))
				}
			}
			w.sealing.Done()
		} else {
			defer w.sealing.Done()
		}
		if err := w.sealSegment(seg); err != nil {
			w.opts.Logger.Error("wal: segment not sealed; recovery will seal it", "segment", seg.Number, "path", seg.path, "err", err)
		}
	}()
	<-w.slots
	close(f.settled)
}

// seal seals seg from the committer (Close): it waits for everything in flight, then seals.
// On failure the segment is abandoned (left active for recovery).
func (w *Writer) seal(seg *Segment) error {
	w.drain() // every record of seg written and published before its footer
	w.detach(seg)
	return w.sealSegment(seg)
}

// sealSegment trims seg's preallocated tail, writes its footer, syncs it and reports it sealed.
// Every record placed in seg must be published; it waits for seg's open batches to be
// committed or abandoned, and lists only the committed ones. On failure seg is marked failed.
func (w *Writer) sealSegment(seg *Segment) error {
	seg.entries = committedEntries(seg)
	if err := seg.failure(); err != nil {
		return err
	}
	if seg.allocated || seg.reused {
		// Trim the allocated tail (and a recycled file's old bytes): a sealed segment ends
		// with its footer.
		if err := seg.file.Truncate(seg.end + format.FooterSize(len(seg.entries))); err != nil {
			err = fmt.Errorf("wal: seal segment %d: %w", seg.Number, err)
			w.markFailed(seg, err)
			return err
		}
	}
	if err := sealAt(seg, seg.end, seg.entries, w.opts.Backend); err != nil {
		w.markFailed(seg, err)
		return err
	}
	size := seg.end + format.FooterSize(len(seg.entries))
	seg.entries = nil
	if err := w.opts.Hooks.SegmentSealed(seg.Number, size); err != nil {
		return fmt.Errorf("wal: record seal of segment %d: %w", seg.Number, err)
	}
	return nil
}

// detach ends the committer's use of seg: no longer the active segment, no longer awaiting a
// sync (whoever seals or recovers it syncs it).
func (w *Writer) detach(seg *Segment) {
	if w.active == seg {
		w.active = nil
	}
	for i, s := range w.dirty {
		if s == seg {
			w.dirty = append(w.dirty[:i], w.dirty[i+1:]...)
			return
		}
	}
}

// sealAt writes the footer for entries at dataEnd (and the segment header, if no record wrote
// it) and fdatasyncs the segment.
func sealAt(seg *Segment, dataEnd int64, entries []format.FooterEntry, backend devio.Backend) error {
	foot, err := format.EncodeFooter(seg.Number, seg.Generation, dataEnd, entries)
	if err != nil {
		return fmt.Errorf("wal: footer of segment %d: %w", seg.Number, err)
	}
	buf := devio.AlignedBuffer(len(foot))
	copy(buf, foot)
	ops := append(headerOp(seg), devio.Op{File: seg.file, Buf: buf, Off: dataEnd, Write: true})
	if err := backend.Submit(ops); err != nil {
		return fmt.Errorf("wal: write footer of segment %d: %w", seg.Number, err)
	}
	if err := seg.syncData(); err != nil {
		return fmt.Errorf("wal: sync footer of segment %d: %w", seg.Number, err)
	}
	return nil
}

// CreateSegment creates segment file number n in dir, open for appending. Its header h is
// written with the first records appended (one vectored write with them, made durable by the
// sync that makes them durable) or by the seal of a segment that got none: creating a segment
// costs no write and no flush here, where under load each queues behind a full device. Until
// then the file reads as zeros, which recovery takes for a segment never written (ErrNoHeader)
// and deletes: nothing in it was ever acknowledged. The caller makes the directory entry
// durable (SyncDir) before the segment's first records are acknowledged.
//
// With reuse set (a RecyclePath in dir), the recycled file is renamed to the segment's name and
// overwritten instead: until the new header is written it still holds a retired segment's
// header, which recovery reports as ErrStaleHeader and deletes the same way.
func CreateSegment(fs vfs.FS, dir string, n uint64, direct devio.DirectMode, h *format.SegmentHeader, reuse string) (*Segment, error) {
	path := SegmentPath(dir, n)
	if _, err := fs.Stat(path); err == nil {
		return nil, fmt.Errorf("wal: segment %s already exists: %w", path, format.ErrInvalid)
	}
	hdr := devio.AlignedBuffer(format.SegmentHeaderSize)
	if err := format.EncodeSegmentHeader(hdr, h); err != nil {
		return nil, err
	}
	if reuse != "" {
		if err := fs.Rename(reuse, path); err != nil {
			return nil, fmt.Errorf("wal: create segment %d from %s: %w", n, reuse, err)
		}
	}
	// A reused file keeps its blocks (and the retired segment's bytes, which the new header's
	// generation disowns); a new one starts empty.
	f, err := devio.OpenFile(fs, path, reuse == "", direct)
	if err != nil {
		return nil, fmt.Errorf("wal: create segment: %w", err)
	}
	seg := newSegment(n, h.Generation, path, f)
	seg.end = format.SegmentHeaderSize
	seg.header = hdr
	seg.reused = reuse != ""
	return seg, nil
}

// headerOp returns the write of seg's header if no record has written it yet, and marks it
// written; nil otherwise. Owned by whoever appends to seg.
func headerOp(seg *Segment) []devio.Op {
	if seg.header == nil {
		return nil
	}
	op := devio.Op{File: seg.file, Buf: seg.header, Off: 0, Write: true}
	seg.header = nil
	return []devio.Op{op}
}

func randomGeneration() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1 // never zero
}
