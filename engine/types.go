package engine

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/ucm-go/ucm/format"
)

// BlockID is the 16-byte content address of a KV block; the engine treats it as opaque
// (connector/ucmhash computes it from the tokens, as UCM does).
type BlockID = format.BlockID

// Layout is how a block's bytes are organised: Shards × TensorsPerShard tensors; see
// format.Layout. A whole block is Shards × ShardBytes bytes, shard-major.
type Layout = format.Layout

// Schema describes the configuration that produced the KV bytes. Its fingerprint, together
// with the Layout, is recorded in the store and in every segment header; a store opened with a
// different one refuses to serve the old bytes (ErrSchemaMismatch), because KV computed under
// another model, dtype, layout, TP topology or block size is garbage that checksums cannot see.
type Schema struct {
	Model       string // model name and revision, e.g. "Qwen/Qwen2.5-14B@a1b2c3"
	DType       string // KV cache dtype, e.g. "bfloat16", "fp8_e4m3"
	KVLayout    string // e.g. "mha", "mla", "rerope", or the connector's own description
	TPRank      int
	TPSize      int
	BlockTokens int        // tokens per block
	HashScheme  HashScheme // how block ids were computed
	// Extra covers anything else that changes the bytes (RoPE scaling, LoRA adapter, ...).
	Extra string
}

// Validate reports a missing or out-of-range field.
func (s Schema) Validate() error {
	switch {
	case s.Model == "":
		return fmt.Errorf("schema: model is empty: %w", ErrInvalidArgument)
	case s.DType == "":
		return fmt.Errorf("schema: dtype is empty: %w", ErrInvalidArgument)
	case s.TPSize < 1 || s.TPRank < 0 || s.TPRank >= s.TPSize:
		return fmt.Errorf("schema: tp rank %d / size %d: %w", s.TPRank, s.TPSize, ErrInvalidArgument)
	case s.BlockTokens < 1:
		return fmt.Errorf("schema: block tokens %d: %w", s.BlockTokens, ErrInvalidArgument)
	}
	return nil
}

// Canonical returns the schema and layout as the text that is fingerprinted and stored: one
// "key=value" line per field, in a fixed order.
func (s Schema) Canonical(l Layout) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ucm-schema/1\nmodel=%q\ndtype=%q\nkv_layout=%q\ntp_rank=%d\ntp_size=%d\nblock_tokens=%d\nhash_scheme=%s\nextra=%q\n",
		s.Model, s.DType, s.KVLayout, s.TPRank, s.TPSize, s.BlockTokens, s.HashScheme, s.Extra)
	fmt.Fprintf(&b, "shards=%d\ntensors_per_shard=%d\nshard_bytes=%d\n", l.Shards, l.TensorsPerShard, l.ShardBytes)
	return b.String()
}

// Fingerprint is the SHA-256 of Canonical(l).
func (s Schema) Fingerprint(l Layout) format.Fingerprint {
	return sha256.Sum256([]byte(s.Canonical(l)))
}
