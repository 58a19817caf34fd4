package index

import "github.com/ucm-go/ucm/format"

// Batch record geometry as /work/wt/BATCH.md specifies it, until package format's
// BatchHeaderSize, BatchCommitSize and MaxBatchBlocks land; then this file goes.

const maxBatchBlocks = 4096

func batchHeaderSize(n int) int64 { return format.AlignUp(128 + 16*int64(n)) }

func batchCommitSize(n, shards int) int64 { return format.AlignUp(64 + 4*int64(n)*int64(shards)) }
