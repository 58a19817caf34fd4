package engine

import (
	"fmt"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// spans is one block's (or one shard's) caller memory as ordered pieces: the bytes of the
// block are the pieces' bytes concatenated. A connector whose K and V live in separate
// tensors hands a shard over as two pieces (LoadSpans, DumpSpans); Load, LoadShard, Dump and
// DumpShard hand one.
type spans [][]byte

// oneSpanEach views each buffer of bufs as a one-piece spans, without copying.
func oneSpanEach(bufs [][]byte) []spans {
	out := make([]spans, len(bufs))
	for i := range bufs {
		out[i] = bufs[i : i+1]
	}
	return out
}

// asSpans views each element of bufs as a spans.
func asSpans(bufs [][][]byte) []spans {
	out := make([]spans, len(bufs))
	for i := range bufs {
		out[i] = bufs[i]
	}
	return out
}

// size returns the total bytes of the pieces.
func (s spans) size() int64 {
	var n int64
	for _, p := range s {
		n += int64(len(p))
	}
	return n
}

// contiguous returns the single piece when s is one piece, else nil.
func (s spans) contiguous() []byte {
	if len(s) == 1 {
		return s[0]
	}
	return nil
}

// aligned reports whether every piece can take O_DIRECT transfers (4 KiB-aligned address and
// length).
func (s spans) aligned() bool {
	for _, p := range s {
		if !devio.IsAligned(p) {
			return false
		}
	}
	return true
}

// sub returns the pieces covering bytes [off, off+n) of s, cut to that range (sharing s's
// memory). The range must lie within s.
func (s spans) sub(off, n int64) spans {
	var out spans
	for _, p := range s {
		if n == 0 {
			break
		}
		if off >= int64(len(p)) {
			off -= int64(len(p))
			continue
		}
		take := min(int64(len(p))-off, n)
		out = append(out, p[off:off+take])
		off, n = 0, n-take
	}
	return out
}

// gather copies the pieces, in order, into dst (at least size() bytes) and returns the bytes
// copied.
func (s spans) gather(dst []byte) int {
	n := 0
	for _, p := range s {
		n += copy(dst[n:], p)
	}
	return n
}

// scatter copies src into the pieces, in order.
func (s spans) scatter(src []byte) {
	off := 0
	for _, p := range s {
		off += copy(p, src[off:])
	}
}

// checksum returns the CRC32C of the pieces' bytes concatenated (format.Checksum of them).
func (s spans) checksum() uint32 {
	var crc uint32
	for _, p := range s {
		crc = format.ChecksumUpdate(crc, p)
	}
	return crc
}

// opBufs returns the buffers of ops as spans.
func opBufs(ops []devio.Op) spans {
	out := make(spans, len(ops))
	for i := range ops {
		out[i] = ops[i].Buf
	}
	return out
}

// verifySpans checks shards first..first+n-1 of a payload read into pieces (shards packed
// back to back, no padding) against h's shard checksums, as wal.VerifyShards does for one
// buffer.
func verifySpans(h *format.RecordHeader, payload spans, first, n int) error {
	sb := h.Layout.ShardBytes
	for i := 0; i < n; i++ {
		s := first + i
		if got := payload.sub(int64(i)*sb, sb).checksum(); got != h.ShardCRCs[s] {
			return fmt.Errorf("%w: shard %d checksum: stored %#08x, computed %#08x", format.ErrCorrupt, s, h.ShardCRCs[s], got)
		}
	}
	return nil
}
