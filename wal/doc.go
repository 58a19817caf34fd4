// Package wal is the segment log: it appends records (package format) to the active segment
// of a directory with group commit and a sync policy, rotates and seals segments, writes
// layer-major batch records, and scans and recovers segments after a crash. It does not know
// the index: it reports every segment it creates, every group of records it publishes and
// every seal through Hooks, and the caller (package engine) applies them to package index.
//
// # Segments
//
// A segment is one file named by its number (SegmentFileName: 16 zero-padded decimal digits
// and ".seg"). Numbers are never reused; each file also gets a random generation that its
// header, every record header and its footer repeat, so bytes left by another file or an
// earlier use of the same file are recognised as stale. Only the active segment is appended
// to; a sealed segment is never written again:
//
//	active:  | header | record | record | ... | record |   (the last one may be torn by a crash)
//	sealed:  | header | record | record | ... | record | footer: entries ... trailer |
//
// Rotation seals the active segment once the next record, footer included, would exceed
// Options.SegmentSize; a record larger than a segment gets a segment of its own. The byte
// layouts are package format's (docs/format.md).
//
// # Guarantees
//
//   - Order of the write path (Writer.Append): records are placed at the end of the active
//     segment, written with one submission to the I/O backend, and under SyncAlways covered
//     by one fdatasync per group; only then is Hooks.Publish called with them, in placement
//     order, and only after Publish returns does Append return. On error none of the
//     records passed to Append is published.
//   - Sync policy: SyncAlways publishes a record only once it is durable (an acknowledged
//     record survives power loss); SyncInterval publishes records once written and
//     fdatasyncs every Options.SyncInterval (a crash may lose what was acknowledged since the
//     last sync, never exposes a torn record); SyncNone syncs only when a segment is sealed
//     and on Sync and Close (tests, tmpfs). Writer.Sync makes everything appended so far
//     durable under every policy.
//   - A failed write or fdatasync is never retried as if it had succeeded: the segment is
//     abandoned for appends (left active, for recovery to scan, cut and seal), every record
//     not yet published fails with the error, and the next group starts a new segment. The
//     shared fdatasync of a segment remembers its first failure: a later sync of the same
//     segment that returns success does not turn earlier failed writes into durable ones.
//   - A segment's header reaches the disk with its first records, in the same vectored
//     write, and is durable before any of them is published. A file whose header was never
//     written (ErrNoHeader) therefore never held a published record, and recovery deletes it.
//   - Sealing writes the footer after the last record, fdatasyncs, then calls
//     Hooks.SegmentSealed with the final size. It starts once every record placed in the
//     segment has been published, and runs beside the writing of the next segment.
//   - A batch record (Writer.ReserveBatch, Batch) becomes visible only through CommitBatch,
//     which writes the commit block, holding every shard's CRC, after every run, syncs
//     (unless SyncNone) and publishes its blocks together. A batch abandoned, or never
//     committed before a crash, is dead bytes that a scan passes over (ScanResult.Skipped).
//     A segment with an open batch is not sealed.
//   - Recovery (RecoverSegment) scans an active segment from the start, checking every
//     record's header CRC and fields, segment number and generation, and every shard's CRC;
//     a zeroed block or the end of the file is a clean end, the first invalid record ends the
//     valid tail. The file is truncated there (ScanResult.ValidEnd), footed, synced: it is
//     sealed and never appended to again. In a sealed segment an invalid record is
//     corruption, reported as a *CorruptionError naming the file, offset and block, never
//     skipped silently.
//   - Readers of a segment (ReadSealedRecords, the engine's loads) Acquire it for the length
//     of their I/O and Release it after: a retired segment is closed and unlinked only once
//     its last reader has released it.
//
// # Concurrency
//
// A Writer is safe for concurrent use: concurrent Append calls form one group, sharing one
// submission and one fdatasync. One committer goroutine places and writes groups; a
// publisher goroutine completes them and calls Hooks.Publish one group at a time, in
// placement order; seals run on goroutines of their own. Hooks implementations must
// therefore not assume they run alone (see Hooks for which hook runs where). Batch.WriteRun
// may be called for different runs concurrently. Appends that race with Close complete or fail
// with ErrWriterClosed. ScanSegment and ReadSealedRecords never modify the file;
// RecoverSegment rewrites its tail and is for segments no Writer appends to (at Open).
//
// # Example
//
//	w, err := wal.NewWriter(wal.Options{
//		FS: vfs.Default, Dir: dir, SegmentSize: 256 << 20, Sync: wal.SyncAlways,
//		Backend: backend, Schema: fingerprint, Hooks: idx, NextSegment: next,
//	})
//	...
//	rec := &wal.Record{ID: id, Layout: l, ShardCRCs: crcs, Buf: hdr, Payload: payload}
//	if err := w.Append([]*wal.Record{rec}); err != nil {
//		// nothing of this call was published
//	}
//	// rec.Segment, rec.Offset, rec.Seq now say where the record is; idx.Publish saw it.
//	err = w.Close() // syncs, seals the active segment
//
// and at the next Open, for each segment the index still calls active:
//
//	res, err := wal.RecoverSegment(vfs.Default, wal.SegmentPath(dir, n), n, devio.DirectAuto,
//		backend, false)
//	// index only records that end at or before res.ValidEnd
//
// docs/durability.md states the contract the engine builds on these steps.
package wal
