package engine

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// SyncPolicy says when dumped blocks are made durable; see wal.SyncPolicy and
// docs/durability.md.
type SyncPolicy = wal.SyncPolicy

// Sync policies.
const (
	SyncAlways   = wal.SyncAlways
	SyncInterval = wal.SyncInterval
	SyncNone     = wal.SyncNone
)

// Compression says whether dumped blocks are compressed (see docs/format.md §4a and the
// Compression section of docs/performance.md).
type Compression int

const (
	// CompressionOff stores every block raw (the default: raw KV barely compresses, and a local
	// SSD is faster than lz4).
	CompressionOff Compression = iota
	// CompressionLZ4 compresses each shard with lz4 (after a byte-plane split for 2-byte
	// dtypes) and keeps the compressed record only when it saves at least CompressMinSaving of
	// the raw payload: for slow (shared, network) file systems.
	CompressionLZ4
)

// String returns "off" or "lz4".
func (c Compression) String() string {
	switch c {
	case CompressionOff:
		return "off"
	case CompressionLZ4:
		return "lz4"
	}
	return fmt.Sprintf("Compression(%d)", int(c))
}

// ParseCompression parses "off" (or "none", "") or "lz4".
func ParseCompression(s string) (Compression, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "off", "none", "":
		return CompressionOff, nil
	case "lz4":
		return CompressionLZ4, nil
	}
	return 0, fmt.Errorf("compression %q: want off or lz4: %w", s, ErrInvalidArgument)
}

// MaxQueueDepth is the largest Options.QueueDepth Open takes.
const MaxQueueDepth = 4096

// MaxSyncInterval is the longest Options.SyncInterval Open takes.
const MaxSyncInterval = 24 * time.Hour

// Defaults of Options; docs/durability.md and docs/performance.md say why.
const (
	DefaultSegmentSize     = 256 << 20
	DefaultSyncPolicy      = SyncAlways
	DefaultSyncInterval    = 100 * time.Millisecond
	DefaultQueueDepth      = 64
	DefaultTaskTimeout     = 30 * time.Second
	DefaultMaxStagingBytes = 1 << 30
	// DefaultMaxBatchBytes bounds one layer-major batch record: a request's layer-wise dump
	// larger than this is written as several (docs/format.md, "Batch records").
	DefaultMaxBatchBytes   = 64 << 20
	DefaultCompactInterval = 30 * time.Second
	// DefaultCompression is off: measured on KV-shaped bf16, lz4 saves ~10 % at ~260 MB/s per
	// core, far below a local NVMe's 2.5 GB/s (docs/performance.md, Compression).
	DefaultCompression = CompressionOff
	// DefaultCompressMinSaving: a compressed record is kept only if it saves 1/8 of the raw
	// payload bytes on disk.
	DefaultCompressMinSaving = 0.125
	// DefaultSharedRefreshInterval is how often an instance reads the manifests of the other
	// instances on its shared tiers (one listing per path, one read per namespace) and
	// publishes its own: a segment another instance sealed is a hit here within about this.
	DefaultSharedRefreshInterval = 500 * time.Millisecond
	// DefaultSharedRetireGrace is how long a retired segment of a shared tier stays on disk
	// after it left its manifest, so that other instances' loads of it, started before their
	// next refresh, still find it (a TaskTimeout).
	DefaultSharedRetireGrace = 30 * time.Second
	// DefaultSharedSealAge is how long a shared tier's active segment may hold records before
	// it is sealed and published, when it does not fill first: other instances see only
	// sealed segments, so a slow writer's blocks reach them within about this plus a refresh.
	DefaultSharedSealAge = time.Second
	// DefaultSharedOwnerTimeout is how long an instance's manifest may stay unchanged before
	// the shared tier's reclaimer presumes its owner gone and reclaims its segments itself.
	DefaultSharedOwnerTimeout = 2 * time.Minute
	// MinSegmentSize and MaxSegmentSize bound the segment size Validate accepts.
	MinSegmentSize = 64 << 10
	MaxSegmentSize = 64 << 30
	// MinAutoSegmentSize is the smallest segment size chosen from a tier's capacity
	// (SegmentSizeFor).
	MinAutoSegmentSize = 1 << 20
	// AutoSegmentsPerTier is how many segments a capacity-limited tier is cut into by
	// default: eviction and compaction work a segment at a time, so a tier evicts about
	// 1/AutoSegmentsPerTier of itself at once (docs/tiers.md, segment size).
	AutoSegmentsPerTier = 64
)

// SegmentSizeFor is the segment size of a disk tier of the given capacity (0: unlimited) when
// Options.SegmentSize is set (> 0) to configured, or left to the default (0): capacity /
// AutoSegmentsPerTier rounded down to a power of two, within [MinAutoSegmentSize,
// DefaultSegmentSize]; DefaultSegmentSize for an unlimited tier.
func SegmentSizeFor(configured, capacity int64) int64 {
	if configured > 0 {
		return configured
	}
	if capacity <= 0 {
		return DefaultSegmentSize
	}
	size := int64(MinAutoSegmentSize)
	for size < DefaultSegmentSize && size*2 <= capacity/AutoSegmentsPerTier {
		size *= 2
	}
	return size
}

// Options configure an Engine. The zero value of every field but Layout and Schema means its
// documented default; Open validates the result and names the field at fault.
type Options struct {
	// Layout of every block in the store. Required.
	Layout Layout
	// Schema of the KV bytes. Required; recorded at creation and checked at every Open.
	Schema Schema
	// FS is the file system the store lives on (default vfs.Default). Tests pass a
	// crash-simulating or fault-injecting one.
	FS vfs.FS
	// SegmentSize is the size at which a segment is sealed and a new one started, in every disk
	// tier. Default (0): chosen per tier from its capacity (SegmentSizeFor: 1/64 of it, from
	// 1 MiB to 256 MiB; 256 MiB when unlimited), so that small tiers evict in small steps.
	// Otherwise in [MinSegmentSize, MaxSegmentSize] (64 KiB to 64 GiB), a multiple of 4 KiB.
	SegmentSize int64
	// SyncPolicy (default SyncAlways) and SyncInterval (default 100 ms, SyncInterval only).
	SyncPolicy   SyncPolicy
	SyncInterval time.Duration
	// IOEngine picks the I/O backend (default auto: io_uring when compiled in and permitted,
	// else pread/pwrite).
	IOEngine devio.IOEngine
	// DirectIO says whether segments use O_DIRECT (default auto: when the file system accepts
	// it, probed at Open).
	DirectIO devio.DirectMode
	// QueueDepth bounds in-flight I/O operations (default 64).
	QueueDepth int
	// TaskTimeout bounds Task.Wait and the life of a partly dumped block (default 30 s).
	TaskTimeout time.Duration
	// MaxStagingBytes bounds staging memory (default 1 GiB; docs/durability.md, "Staging
	// memory"): the bounce buffers of layer runs written as batch records from unaligned
	// memory, which wait for it (up to the task's deadline, then ErrTimeout), and the slots of
	// partly dumped blocks assembled whole (layer-wise on the staging path, or V0-created),
	// which fail with ErrNoSpace beyond it.
	MaxStagingBytes int64
	// StageLayerWise makes layer-wise dumps (DumpShard) assemble whole blocks in staging memory
	// and write one block record each, as before batch records existed, instead of writing a
	// request's blocks layer-major as batch records (engine/batchdump.go). Segments then do not
	// carry format.FeatureBatchRecords and stay readable by builds that predate it.
	StageLayerWise bool
	// MaxBatchBytes bounds the on-disk size of one batch record (default 64 MiB, and at most
	// what an empty segment of the first disk tier holds): a layer-wise dump of a larger block
	// list is written as several batch records.
	MaxBatchBytes int64
	// Tiers lists the store's tiers, fastest first: at most one memory tier (first), then one or
	// more disk tiers, each with its paths, capacity, watermarks and I/O settings (see
	// tiers.Config and docs/tiers.md). Empty means one disk tier in the store directory with
	// unlimited capacity and the I/O settings above. A disk tier's io_engine and direct_io
	// "auto" (or unset) take IOEngine and DirectIO from these Options.
	Tiers []tiers.Config
	// CompactLiveRatio is the live-bytes ratio at or below which reclamation compacts a sealed
	// segment instead of waiting for it to empty (default 0.5, in (0, 1)).
	CompactLiveRatio float64
	// Compression of dumped blocks (default off) in a store without Tiers; with Tiers, each disk
	// tier's compression says it (and setting this too is an error). Loads read compressed and
	// raw records alike whatever this says.
	Compression Compression
	// CompressMinSaving is the fraction of a record's raw on-disk payload that compression must
	// save for the compressed form to be kept (default 0.125); otherwise the record is stored
	// raw. In (0, 1].
	CompressMinSaving float64
	// CompactInterval is how often the engine compacts every tier's sealed segments at or
	// below CompactLiveRatio, whatever the watermarks, so dead space (failed or abandoned dumps,
	// blocks relocated, evicted or dropped) is reclaimed also in unlimited tiers; the first
	// such pass runs about a second after Open, so that processes shorter than the interval
	// reclaim too. Sealed segments with nothing live are retired within a second, whatever the
	// interval (docs/tiers.md, "When dead space comes back"). Default 30 s; negative: none of
	// this, dead space comes back only under capacity pressure and by Compact.
	CompactInterval time.Duration
	// RecycleSegments is how many retired segment files each segment directory keeps for reuse
	// by new segments instead of deleting them (default 4, at most MaxRecycleSegments; negative: none). Reusing a file
	// skips the file system's block allocation and, on ext4 and XFS, the journal commit an
	// fdatasync pays for writes into new blocks (docs/tiers.md). Kept files count in their
	// tier's used bytes until reused or deleted, which happens as soon as a segment needs their
	// room. Only file systems with kernel file descriptors recycle.
	RecycleSegments int
	// SharedRefreshInterval is how often the other instances' manifests on shared tiers are
	// read and this instance's published (default 500 ms; docs/sharing.md). Only with a
	// shared tier.
	SharedRefreshInterval time.Duration
	// SharedRetireGrace is how long a retired segment of a shared tier stays on disk after it
	// left the manifest (default 30 s).
	SharedRetireGrace time.Duration
	// SharedSealAge: a shared tier's active segment is sealed (and published) once its first
	// record is this old, full or not (default 1 s; negative: only when full).
	SharedSealAge time.Duration
	// SharedOwnerTimeout: an instance whose manifest the reclaimer has seen unchanged for this
	// long (by the reclaimer's own clock) is presumed gone, and the reclaimer retires its
	// least recently used segments itself when the tier is over capacity (docs/sharing.md).
	// Every running instance rewrites its manifest at least every quarter of it, so a live
	// one is never presumed gone. Default 2 min; at least 4 refresh intervals. Give every
	// instance on a shared path the same value.
	SharedOwnerTimeout time.Duration
	// FileMode and DirMode are the permissions of the files (segments, index, LOCK,
	// manifests) and directories the store creates, set exactly whatever the process's umask
	// (default 0640 and 0750: DefaultFileMode, DefaultDirMode). Only permission bits; the
	// owner must keep read and write (and, for directories, search) permission.
	FileMode, DirMode os.FileMode
	// IndexReserve is the size of the ballast file (ReserveFile) the store keeps beside its
	// index, at most 1/16 of the file system (default 32 MiB; negative: none): released when
	// the file system fills so that the index can always open, and what new segments must
	// leave free (reserve.go, docs/durability.md).
	IndexReserve int64
	// ReadOnly opens the store for inspection: no recovery writes, no dumps.
	ReadOnly bool
	// LookupOnly opens an instance that answers Lookup and LookupPrefix only, as UCM's
	// scheduler uses its store: it needs a shared tier, indexes every instance published there
	// whatever their schema and layout (its own Layout and Schema describe only its empty
	// store), and refuses Dump, Load, Prefetch and Create with ErrInvalidArgument. A hit says a
	// block is stored; the worker that loads it checks it against its own schema.
	LookupOnly bool
	// AdoptStoredSchema opens an existing store with the schema and layout it recorded,
	// ignoring Schema and Layout: for tools that operate on any store (verify, stats, bench on
	// an existing directory). Opening a store that does not exist fails with ErrNotFound.
	AdoptStoredSchema bool
	// Logger receives the engine's logs (default: discard).
	Logger *slog.Logger
	// OnFlight and OnLoad, if set, receive the timing of every flight of dumped records
	// (wal.FlightTiming, from the dump writer; relocations are not reported) and of every batch of reads
	// of a load task (LoadTiming), to find where time goes (ucm-lab bench --timings). They are
	// called on the engine's I/O paths and must return quickly. Diagnostics: unset, no clock is
	// read for them.
	OnFlight func(wal.FlightTiming)
	OnLoad   func(LoadTiming)
}

// LoadTiming is when one batch of a load task's blocks (at most QueueDepth of them) passed
// each step (Options.OnLoad): Start → Submitted is planning (index, segment, tiers);
// Submitted → Read the reads (devio's queue-depth tokens and the device); Read → Done the
// checks (checksums) and copies.
type LoadTiming struct {
	Blocks int   // blocks in the batch
	Reads  int   // read operations submitted (before devio merges adjacent ones)
	Bytes  int64 // bytes those reads asked for
	// Queued is when the task was created (Load, LoadShard, LoadSpans was called); zero for
	// the engine's own loads (promotion).
	Queued                       time.Time
	Start, Submitted, Read, Done time.Time
}

// withDefaults returns o with zero fields replaced by defaults.
func (o Options) withDefaults() Options {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.QueueDepth == 0 {
		o.QueueDepth = DefaultQueueDepth
	}
	if o.TaskTimeout == 0 {
		o.TaskTimeout = DefaultTaskTimeout
	}
	if o.MaxStagingBytes == 0 {
		o.MaxStagingBytes = DefaultMaxStagingBytes
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if o.CompressMinSaving == 0 {
		o.CompressMinSaving = DefaultCompressMinSaving
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CompactInterval == 0 {
		o.CompactInterval = DefaultCompactInterval
	}
	if o.CompactLiveRatio == 0 {
		o.CompactLiveRatio = DefaultCompactLiveRatio
	}
	if o.SharedRefreshInterval == 0 {
		o.SharedRefreshInterval = DefaultSharedRefreshInterval
	}
	if o.SharedRetireGrace == 0 {
		o.SharedRetireGrace = DefaultSharedRetireGrace
	}
	if o.SharedSealAge == 0 {
		o.SharedSealAge = DefaultSharedSealAge
	}
	if o.SharedOwnerTimeout == 0 {
		o.SharedOwnerTimeout = DefaultSharedOwnerTimeout
	}
	if o.FileMode == 0 {
		o.FileMode = DefaultFileMode
	}
	if o.DirMode == 0 {
		o.DirMode = DefaultDirMode
	}
	if o.IndexReserve == 0 {
		o.IndexReserve = DefaultIndexReserve
	}
	if o.RecycleSegments == 0 {
		o.RecycleSegments = DefaultRecycleSegments
	}
	return o
}

// Validate reports the first invalid field of o (after defaults), wrapping ErrInvalidArgument.
func (o Options) Validate() error {
	if err := o.Layout.Validate(); err != nil && !o.AdoptStoredSchema {
		return fmt.Errorf("options: %w", err)
	}
	if err := o.Schema.Validate(); err != nil && !o.AdoptStoredSchema {
		return fmt.Errorf("options: %w", err)
	}
	switch {
	case o.SegmentSize != 0 && (o.SegmentSize < MinSegmentSize || o.SegmentSize > MaxSegmentSize):
		return fmt.Errorf("options: segment size %d out of range [%d, %d]: %w", o.SegmentSize, MinSegmentSize, MaxSegmentSize, ErrInvalidArgument)
	case o.SegmentSize%format.Alignment != 0:
		return fmt.Errorf("options: segment size %d not a multiple of %d: %w", o.SegmentSize, format.Alignment, ErrInvalidArgument)
	case o.SyncPolicy < SyncAlways || o.SyncPolicy > SyncNone:
		return fmt.Errorf("options: sync policy %d: %w", int(o.SyncPolicy), ErrInvalidArgument)
	case o.SyncInterval < 0 || o.SyncInterval > MaxSyncInterval:
		return fmt.Errorf("options: sync interval %v out of range [0, %v]: %w", o.SyncInterval, MaxSyncInterval, ErrInvalidArgument)
	case o.IOEngine < devio.EngineAuto || o.IOEngine > devio.EnginePsync:
		return fmt.Errorf("options: io engine %d: %w", int(o.IOEngine), ErrInvalidArgument)
	case o.DirectIO < devio.DirectAuto || o.DirectIO > devio.DirectOff:
		return fmt.Errorf("options: direct io %d: %w", int(o.DirectIO), ErrInvalidArgument)
	case o.QueueDepth < 1 || o.QueueDepth > MaxQueueDepth:
		return fmt.Errorf("options: queue depth %d out of range [1, %d]: %w", o.QueueDepth, MaxQueueDepth, ErrInvalidArgument)
	case o.IndexReserve > 1<<30:
		return fmt.Errorf("options: index reserve %d above 1 GiB: %w", o.IndexReserve, ErrInvalidArgument)
	case o.RecycleSegments > MaxRecycleSegments:
		return fmt.Errorf("options: recycle segments %d above %d: %w", o.RecycleSegments, MaxRecycleSegments, ErrInvalidArgument)
	case o.Compression < CompressionOff || o.Compression > CompressionLZ4:
		return fmt.Errorf("options: compression %d: %w", int(o.Compression), ErrInvalidArgument)
	case !(o.CompressMinSaving > 0 && o.CompressMinSaving <= 1): // NaN fails too
		return fmt.Errorf("options: compress min saving %v out of range (0, 1]: %w", o.CompressMinSaving, ErrInvalidArgument)
	case o.TaskTimeout < 0:
		return fmt.Errorf("options: task timeout %v: %w", o.TaskTimeout, ErrInvalidArgument)
	case o.SharedRefreshInterval < time.Millisecond || o.SharedRetireGrace < 0:
		return fmt.Errorf("options: shared refresh interval %v (>= 1ms) or retire grace %v (>= 0): %w", o.SharedRefreshInterval, o.SharedRetireGrace, ErrInvalidArgument)
	case o.SharedOwnerTimeout/4 < o.SharedRefreshInterval: // not 4*interval: it could overflow
		return fmt.Errorf("options: shared owner timeout %v below 4 refresh intervals (%v): %w", o.SharedOwnerTimeout, 4*o.SharedRefreshInterval, ErrInvalidArgument)
	case !(o.CompactLiveRatio > 0 && o.CompactLiveRatio < 1): // NaN fails too
		return fmt.Errorf("options: compact live ratio %v out of (0, 1): %w", o.CompactLiveRatio, ErrInvalidArgument)
	case o.MaxBatchBytes < 0:
		return fmt.Errorf("options: max batch bytes %d: %w", o.MaxBatchBytes, ErrInvalidArgument)
	case o.MaxStagingBytes < o.Layout.RecordBytes() && !o.AdoptStoredSchema:
		return fmt.Errorf("options: max staging bytes %d below one record (%d): %w", o.MaxStagingBytes, o.Layout.RecordBytes(), ErrInvalidArgument)
	}
	if err := ValidateMode(o.FileMode, false); err != nil {
		return fmt.Errorf("options: file mode %w: %w", err, ErrInvalidArgument)
	}
	if err := ValidateMode(o.DirMode, true); err != nil {
		return fmt.Errorf("options: dir mode %w: %w", err, ErrInvalidArgument)
	}
	if o.LookupOnly && !hasShared(o.Tiers) {
		return fmt.Errorf("options: lookup-only without a shared tier would never see a block: %w", ErrInvalidArgument)
	}
	if len(o.Tiers) > 0 {
		if err := tiers.Validate(o.Tiers); err != nil {
			return fmt.Errorf("options: %w: %w", ErrInvalidArgument, err)
		}
		if o.Compression != CompressionOff {
			return fmt.Errorf("options: compression %s with tiers: set it per disk tier (tiers[].compression): %w", o.Compression, ErrInvalidArgument)
		}
		// A disk tier holds at least the active segment of dumps and the one of relocations.
		// (Both terms are bounded: by MaxSegmentSize and format.MaxPayloadBytes; capacity/2
		// rather than 2*segment keeps the comparison free of overflow whatever the capacity.)
		for i, t := range o.Tiers {
			if t.Kind != tiers.KindDisk || t.Capacity <= 0 || o.AdoptStoredSchema {
				continue
			}
			seg := max(SegmentSizeFor(o.SegmentSize, t.Capacity), format.SegmentHeaderSize+o.Layout.RecordBytes()+format.FooterSize(1))
			if t.Capacity/2 < seg {
				return fmt.Errorf("options: tier %d (%q): capacity %d below two segments of %d bytes: %w", i, t.Name, t.Capacity, seg, ErrInvalidArgument)
			}
		}
	}
	return nil
}
