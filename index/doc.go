// Package index maps 16-byte block ids to the location of their records in segment files and
// holds the segment table with exact space accounting, all in one Pebble DB
// (github.com/cockroachdb/pebble/v2) opened on a vfs.FS.
//
// # Guarantees
//
//   - Every mutation goes through Apply (or DropSegmentEntries), which is serialized: a batch's
//     ops are evaluated in order against an in-batch view starting from the committed state, and
//     the block entries and the segment rows they affect are written in one atomic Pebble batch.
//   - Accounting is exact: for every segment row, LiveBytes is the sum of RecordBytes of the
//     entries pointing into it and LiveRecords their count, after every Apply and across
//     Close/Open and crashes (the rows are persisted in the same batch as the entries).
//     CheckAccounting verifies it by a full scan.
//   - The index never syncs segment files: the caller must make segment data durable before
//     applying a batch that points at it, since even a NoSync batch can become durable through
//     another goroutine's Sync.
//   - Nothing read from the DB is trusted: a value that fails to decode is an error wrapping
//     format.ErrCorrupt naming its block id or segment number, never a panic.
//   - Open reads the segment table only; exact and prefix lookups (Has, Contains, PrefixLen,
//     HasSidecar) are answered from an in-memory membership built in the background from a
//     snapshot taken at Open, and from the DB until it is built (WaitMembers waits for it). It
//     holds a 64-bit fingerprint of each block (the id's first 8 bytes) and a byte of its
//     sidecar kinds, 10–15 bytes a block. It never reports a stored block absent; it may report
//     present an absent id whose fingerprint a stored block shares (about n/2^64 for n blocks,
//     more for crafted MD5 prefixes), which a Get or a load then does not find. Apply reads the
//     DB for every entry the membership lists, so accounting stays exact.
//
// # Pebble configuration
//
// A new DB is created at pebble.FormatNewest and that version is recorded under the meta key
// "index.pebble_format" (decimal text); an existing DB is opened at its own version. Block
// cache 32 MiB, memtable 8 MiB, 256 open files, bloom filters (10 bits/key) on every level,
// Pebble's WAL always on. Pebble's log lines go to Options.Logger (debug level for its info
// lines) or nowhere.
//
// # Keys
//
// One byte of prefix per kind of key; part of the on-disk format.
//
//	'b' (0x62) + block id (16 bytes)                 → location value
//	'c' (0x63) + block id (16 bytes) + kind (2, BE)  → location value of the block's sidecar
//	's' (0x73) + segment number (8 bytes, uint64 BE) → segment meta value
//	'm' (0x6d) + name (bytes, no length prefix)      → meta value (the caller's raw bytes)
//
// Meta names beginning with "index." are reserved: "index.version" (decimal text, the version of
// this key/value format: 2 since sidecar keys exist; a version 1 index has no 'c' keys, is read
// as is and recorded as 2 at its first writable open; 3 once the index holds a location of a
// block of a batch record (value version 3), recorded by the first Apply that puts one, in the
// same commit, so that a build that predates batch records refuses the index naming the
// version; an index without batch blocks stays 2) and "index.pebble_format". Open reads versions
// 1, 2 and 3 and refuses any other, naming it.
//
// A sidecar entry ('c') exists only while its block's entry ('b') does: Apply deletes a block's
// sidecar entries in the commit that deletes the block, and ignores a sidecar put for a block
// without an entry (sidecar.go). Sidecar entries count in their segment's live bytes and
// records like block entries; sidecar locations are packed (compression 3, version 2 values).
//
// # Location value, version 1 (45 + 4×shards bytes, little-endian)
//
//	offset size field
//	     0    1 value version (= 1)
//	     1    8 segment number (uint64, > 0)
//	     9    8 record offset in the segment (int64, >= 0)
//	    17    8 sequence number (uint64)
//	    25    4 record header CRC32C (uint32)
//	    29    4 shards (uint32, [1, format.MaxShards])
//	    33    4 tensors per shard (uint32)
//	    37    8 shard bytes (uint64)
//	    45  4×n CRC32C of each shard's raw bytes (uint32 each, n = shards)
//
// The value's length must be exactly 45 + 4×shards and the layout must pass
// format.Layout.Validate.
//
// # Location value, version 2 (46 + 12×shards bytes): a compressed record
//
// Version 1's first 45 bytes (with value version = 2), then
//
//	45    1 compression (format.Compression, not 0)
//	46 12×n per shard: CRC32C of its raw bytes, stored length, CRC32C of its stored bytes
//	        (uint32 each; shards in [1, format.MaxCompressedShards])
//
// # Location value, version 3 (53 + 4×shards bytes): a block of a batch record
//
// A batch record (format record type 3) holds N blocks layer-major: shard i of block b at
// offset + H + (i·N + b)·S from the record's start, H the batch header's size
// (format.BatchHeaderSize(N)) and S the layout's shard stride. Version 1's first 45 bytes
// (with value version = 3; the offset is the batch record's, the sequence number the batch's
// first plus b, the header CRC the batch header's), then
//
//	45    4 batch blocks N (uint32, [1, format.MaxBatchBlocks])
//	49    4 the block's position b in the batch (uint32, [0, N))
//	53  4×n CRC32C of each of the block's shards' raw bytes (uint32 each, n = shards)
//
// Batch blocks are never compressed. Such an entry counts in its segment's live bytes for its
// share of the batch's extent (Location.RecordBytes): its shards plus an N-th of the header
// and commit block, block 0 taking the remainder, so the N shares sum to the extent.
//
// # Segment meta value, version 1 (42 bytes, little-endian)
//
//	offset size field
//	     0    1 value version (= 1)
//	     1    8 segment number (uint64, > 0, equal to the key's)
//	     9    8 generation (uint64)
//	    17    1 state (1 active, 2 sealed, 3 quarantined)
//	    18    8 size (int64, >= 0)
//	    26    8 live bytes (int64, >= 0)
//	    34    8 live records (int64, >= 0; zero exactly when live bytes is zero; blocks and
//	            sidecars)
//
// # Segment meta value, version 2 (50 bytes): a segment holding live sidecars
//
// Version 1's 42 bytes (with value version = 2), then
//
//	42    8 live sidecars (int64, in [1, live records]: how many of the live records are
//	        sidecars)
//
// A row with no live sidecar is written as version 1, so the two versions describe the same
// rows as before sidecars existed.
//
// Changing any of these layouts requires a new value version; decoders accept exactly the
// versions they know.
package index
