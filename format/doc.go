// Package format defines every byte UCM-Go writes to a segment file, and the small files of a
// shared tier, as pure encode and decode functions: no I/O, no file names, no policy. Package
// wal writes and scans segments with it, index keeps its locations, and any other reader (an
// instance on a shared file system, ucm-tool, a fuzz target) decodes the same bytes with the
// same checks. docs/format.md is the full specification; this comment states the guarantees
// and the shapes.
//
// # Guarantees
//
//   - Decoding never panics and never trusts a length: every count and size read from the
//     bytes is checked against its limit (MaxShards, MaxShardBytes, MaxPayloadBytes,
//     MaxBatchBlocks, MaxBatchExtent, ...) before it sizes an allocation or a read. The fuzz
//     targets (fuzz_test.go) hold every decoder to this.
//   - Every failure of bytes read from disk is an error wrapping ErrCorrupt that names the
//     field at fault; every invalid value a caller passes to an encoder is an error wrapping
//     ErrInvalid. Test with errors.Is.
//   - A decoder checks, in a fixed order (docs/format.md §6): length, magic, checksum, version,
//     then every field's range, so a torn or stale block is refused by its magic or CRC before
//     any field of it is used.
//   - Every structure is covered by a CRC32C (Castagnoli, Checksum): the segment header, each
//     record header (which holds the CRC32C of each shard's raw bytes), each batch header and
//     commit block, the footer entries and the footer trailer. A block's payload is checked
//     shard by shard (VerifyPayload, UnpackShard), so one shard can be read and verified
//     without the others. Padding is not covered, except in batch headers and commit blocks,
//     whose decoders require it to be zero.
//   - A decoder does not know which segment it read from: DecodeRecordHeader and
//     DecodeTrailer return the segment number and generation, and the caller must compare
//     them with the segment header's (a record with another generation is a stale left-over
//     of an earlier file, not part of this segment).
//   - Encoders write every byte of their destination (zero padding included), so the same
//     value always encodes to the same bytes. The golden files in testdata pin those bytes;
//     any change to them, to Alignment or to a limit is a format change that needs a Version
//     bump (docs/format.md §11). Decoders accept exactly Version and report any other.
//   - New optional structure is added behind a segment feature flag (FeatureSidecars,
//     FeatureBatchRecords): a decoder refuses a segment header with a bit it does not know,
//     so an older build refuses a newer segment by name instead of misreading it.
//
// # Concurrency
//
// Every function is safe for concurrent use: it reads its arguments and writes only its
// destination. A Compressor holds lz4 state and scratch memory and belongs to one goroutine
// at a time (GetCompressor, PutCompressor).
//
// # Conventions
//
// Integers are little-endian. Alignment is 4096: the segment header, every record header,
// every shard slot and the footer start at a multiple of it and are padded to one, so every
// segment I/O is aligned and O_DIRECT works. The all-zero BlockID is never a valid block.
//
// # Segment file
//
//	[0, 4096)            segment header (SegmentHeader)
//	[4096, DataEnd)      records back to back, each a 4096-byte header and its payload
//	[DataEnd, size)      footer: entries, zero padding, 64-byte trailer (sealed segments only)
//
// Segment header (first 4096 bytes):
//
//	offset size field
//	     0    8 magic "UCMGOSEG"
//	     8    4 format version (uint32, = Version)
//	    12    4 feature flags (uint32; every set bit must be known to the reader)
//	    16    8 segment number (uint64, > 0)
//	    24    8 generation (uint64, random per segment file; records and trailer repeat it)
//	    32   16 instance id of the writer
//	    48    4 alignment (uint32, = Alignment)
//	    52    4 zero
//	    56    8 created, Unix nanoseconds (int64)
//	    64   32 schema fingerprint (SHA-256 of the store's canonical schema)
//	    96 3996 zero
//	  4092    4 CRC32C of bytes [0, 4092)
//
// # Record (type 1, a block)
//
//	offset size field
//	     0    4 magic "UCMR"
//	     4    2 format version (uint16, = Version)
//	     6    1 record type (1 block, 2 sidecar, 3 batch: see below)
//	     7    1 compression (0 none, 1 lz4, 2 lz4 after a byte-plane split, 3 packed)
//	     8   16 block id
//	    24    8 segment number (must equal the segment header's)
//	    32    8 segment generation (must equal the segment header's)
//	    40    8 sequence number (store-wide, increasing in write order)
//	    48    4 shards n (uint32, [1, MaxShards])
//	    52    4 tensors per shard (uint32)
//	    56    8 shard bytes (uint64, raw bytes of one shard)
//	    64    8 payload bytes on disk (uint64)
//	    72    2 sidecar kind (uint16; 0 for a block)
//	    74   54 zero
//	   128  4×n CRC32C of each shard's raw bytes (compressed and packed: 12×n, see below)
//	     …      zero
//	  4092    4 CRC32C of bytes [0, 4092)
//
// The payload follows the header, shard-major, each shard in an aligned slot of
// Layout.ShardStride bytes (its raw bytes, then zeros):
//
//	| header (4096) | shard 0 | zeros | shard 1 | zeros | ... | shard n-1 | zeros |
//	shard i at 4096 + i×ShardStride from the record's start (Layout.ShardOffset)
//
// A compressed record (codes 1 and 2) keeps, per shard, the raw CRC, the stored length and
// the stored bytes' CRC (12 bytes at 128 + 12×i) and packs the stored shards back to back; a
// stored length equal to ShardBytes means that shard is stored raw. A sidecar record (type 2,
// a small representation of a block for sparse attention) is packed the same way (code 3,
// parts back to back, never compressed). StoredOffset and StoredLen locate a shard in either.
//
// # Batch record (type 3)
//
// N blocks of one layout stored layer-major, so that a layer-wise dump writes, and a
// layer-wise load reads, one contiguous run per layer (L = shards, S = ShardStride):
//
//	| header H | run 0: shard 0 of blocks 0..N-1 | ... | run L-1 | commit block C |
//	H = BatchHeaderSize(N) = align4k(128 + 16·N)     (ids of the N blocks, CRC at 124)
//	C = BatchCommitSize(N, L) = align4k(64 + 4·N·L)  (every shard's CRC, CRC at 60)
//	shard i of block b at H + (i·N + b)·S            (BatchHeader.ShardOffset)
//
// The commit block is written after every run; a batch whose commit block is missing, torn
// or does not match its header never existed (its extent is dead bytes).
//
// # Footer (sealed segments)
//
//	DataEnd: n entries of 48 bytes, zero padding, then the 64-byte trailer ending the file
//
//	entry:   0 16 block id | 16 8 offset | 24 8 bytes on disk | 32 8 sequence number |
//	        40 4 record header CRC | 44 1 record type | 45 1 zero | 46 2 sidecar kind
//	trailer: 0 8 "UCMGOFTR" | 8 4 version | 12 4 n | 16 8 DataEnd | 24 8 segment number |
//	        32 8 generation | 40 4 CRC32C of the entries | 44 16 zero | 60 4 CRC32C of [0, 60)
//
// The footer lists every record of the segment, so another instance, or an index rebuild,
// reads a sealed segment without the index (DecodeTrailer, DecodeFooterEntries).
//
// # Shared tiers
//
// Manifest (a namespace's published segments), Lease (the reclaimer lease), the publication
// log (PublogHeader, PublogEntry) and the segment summary (Summary: every record's index entry
// of one sealed segment, so a new instance indexes it in one read) are the small files
// instances sharing a tier read from each other; each is checked by CRC32C before any field is
// used, and a summary is checked against its segment's footer too (docs/format.md §10a,
// docs/sharing.md).
//
// # Example
//
// Writing and reading back a record header:
//
//	l := format.Layout{Shards: 2, TensorsPerShard: 2, ShardBytes: 8192}
//	h := format.RecordHeader{Type: format.RecordBlock, ID: id, Segment: 7, Generation: gen,
//		Seq: seq, Layout: l, ShardCRCs: []uint32{format.Checksum(s0), format.Checksum(s1)}}
//	buf := make([]byte, format.RecordHeaderSize)
//	headerCRC, err := format.EncodeRecordHeader(buf, &h)
//	...
//	got, crc, err := format.DecodeRecordHeader(buf) // errors.Is(err, format.ErrCorrupt) on bad bytes
//	if err == nil && (got.Segment != 7 || got.Generation != gen) {
//		// a stale record: not part of this segment
//	}
//	err = format.VerifyPayload(&got, payload, block, nil) // every shard against its CRC
package format
