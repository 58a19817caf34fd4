package engine

import (
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/wal"
)

// codecFor returns the record compression code the engine writes for a store of dtype:
// none when compression is off; lz4 after a byte-plane split for 2-byte dtypes (the exponent
// bits of fp16/bf16 live in the high byte and repeat, the mantissa bits in the low byte do
// not); plain lz4 otherwise.
func codecFor(c Compression, dtype string) format.Compression {
	if c != CompressionLZ4 {
		return format.CompressionNone
	}
	if dtypeBytes(dtype) == 2 {
		return format.CompressionLZ4Planes
	}
	return format.CompressionLZ4
}

// dtypeBytes returns the element size of a KV dtype name, or 0 when it is not known.
func dtypeBytes(dtype string) int {
	d := strings.ToLower(strings.TrimSpace(dtype))
	d = strings.TrimPrefix(d, "torch.")
	switch d {
	case "bfloat16", "bf16", "float16", "fp16", "half", "f16":
		return 2
	case "float32", "fp32", "float", "f32":
		return 4
	}
	if strings.HasPrefix(d, "fp8") || strings.HasPrefix(d, "float8") || d == "int8" || d == "uint8" {
		return 1
	}
	return 0
}

// storedDType extracts the dtype from a canonical schema text (Schema.Canonical), "" if absent.
func storedDType(canonical string) string {
	for _, line := range strings.Split(canonical, "\n") {
		if v, ok := strings.CutPrefix(line, "dtype="); ok {
			if s, err := strconv.Unquote(v); err == nil {
				return s
			}
		}
	}
	return ""
}

// compressRecord replaces the raw payload of rec with its form under code when that saves at
// least CompressMinSaving of the raw payload; otherwise rec is left as it is (stored raw).
// rec.ShardCRCs (raw checksums) must already be set. Dumps run it on the dumping task's
// goroutine, so blocks compress in parallel; relocations into a compressing tier on theirs.
func (e *Engine) compressRecord(rec *wal.Record, code format.Compression) {
	stored := e.packRecord(rec, code)
	if rec.Origin == nil { // a dump, not a relocation: Stats count what dumps store
		e.stats.storedPayloadBytes.Add(stored)
	}
}

// packRecord does the work of compressRecord and returns the payload bytes rec now stores.
func (e *Engine) packRecord(rec *wal.Record, code format.Compression) int64 {
	l := rec.Layout
	if code == format.CompressionNone || rec.Compression != format.CompressionNone || l.Shards > format.MaxCompressedShards {
		return int64(len(rec.Buf)+len(rec.Payload)) - format.RecordHeaderSize
	}
	if code == format.CompressionLZ4Planes && l.ShardBytes%2 != 0 {
		code = format.CompressionLZ4
	}
	// The raw payload is at stride ShardStride: the engine's records keep it apart from the
	// header (pooled, or the caller's buffer when ShardStride == ShardBytes; see newRecord).
	buf := e.pool.Get(int(format.AlignUp(l.BlockBytes())))
	lens, crcs := make([]uint32, l.Shards), make([]uint32, l.Shards)
	c := format.GetCompressor()
	sum, ok := c.PackShards(code, l, rec.Payload, l.ShardStride(), buf, lens, crcs, e.opts.CompressMinSaving)
	format.PutCompressor(c)
	raw, stored := l.PayloadBytes(), format.AlignUp(sum)
	if !ok || float64(raw-stored) < e.opts.CompressMinSaving*float64(raw) {
		e.pool.Put(buf)
		e.stats.compressSkipped.Add(1)
		return raw
	}
	clear(buf[sum:stored])
	e.releasePayload(rec)
	rec.Payload, rec.PayloadBorrowed = buf[:stored], false
	rec.Compression, rec.StoredLens, rec.StoredCRCs = code, lens, crcs
	e.stats.compressedBlocks.Add(1)
	return stored
}
