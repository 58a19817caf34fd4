package format

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ucm-go/ucm/internal/kvgen"
)

// sampleCompressedHeader is the golden compressed record header: 3 shards of 5000 bytes, shard
// 0 lz4 (900 bytes), shard 1 stored raw (5000), shard 2 lz4 (1200).
func sampleCompressedHeader() *RecordHeader {
	h := sampleRecordHeader()
	h.Compression = CompressionLZ4Planes
	h.StoredLens = []uint32{900, 5000, 1200}
	h.StoredCRCs = []uint32{0x01020304, 0xa0b0c0d0, 0x55aa55aa}
	return h
}

func TestCompressedRecordHeaderGoldenAndRoundTrip(t *testing.T) {
	h := sampleCompressedHeader()
	buf := make([]byte, RecordHeaderSize)
	crc, err := EncodeRecordHeader(buf, h)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "record_header_lz4.golden", buf)
	got, crc2, err := DecodeRecordHeader(buf)
	if err != nil {
		t.Fatal(err)
	}
	if crc2 != crc || got.Compression != h.Compression || !slices.Equal(got.StoredLens, h.StoredLens) ||
		!slices.Equal(got.StoredCRCs, h.StoredCRCs) || !slices.Equal(got.ShardCRCs, h.ShardCRCs) || got.Layout != h.Layout {
		t.Fatalf("round trip: got %+v", got)
	}
	if got.PayloadBytes() != 8192 || got.RecordBytes() != 4096+8192 {
		t.Fatalf("payload %d record %d, want 8192 and 12288", got.PayloadBytes(), got.RecordBytes())
	}
	if off := StoredOffset(got.Layout, got.Compression, got.StoredLens, 2); off != 5900 {
		t.Fatalf("stored offset of shard 2: %d", off)
	}
}

// encodeRaw writes a compressed header without the encoder's checks, with a valid CRC, so the
// decoder's own checks are exercised.
func encodeRaw(t *testing.T, h *RecordHeader, mutate func(b []byte)) []byte {
	t.Helper()
	buf := make([]byte, RecordHeaderSize)
	if _, err := EncodeRecordHeader(buf, h); err != nil {
		t.Fatal(err)
	}
	mutate(buf)
	binary.LittleEndian.PutUint32(buf[headerCRCOffset:], Checksum(buf[:headerCRCOffset]))
	return buf
}

func TestDecodeCompressedHeaderRejects(t *testing.T) {
	le := binary.LittleEndian
	h := sampleCompressedHeader()
	entry := func(i, field int) int { return recOffShardCRCs + compressedEntrySize*i + 4*field }
	cases := map[string]func(b []byte){
		"unknown code":    func(b []byte) { b[recOffCompress] = 3 },
		"len zero":        func(b []byte) { le.PutUint32(b[entry(0, 1):], 0) },
		"len over shard":  func(b []byte) { le.PutUint32(b[entry(1, 1):], 5001) },
		"len huge":        func(b []byte) { le.PutUint32(b[entry(2, 1):], 1<<31) },
		"payload differs": func(b []byte) { le.PutUint64(b[recOffPayload:], 12288) },
		"raw payload":     func(b []byte) { le.PutUint64(b[recOffPayload:], uint64(h.Layout.PayloadBytes())) },
		"too many shards": func(b []byte) {
			le.PutUint32(b[recOffShards:], MaxCompressedShards+1)
			le.PutUint64(b[recOffShardBytes:], 4096)
		},
		"odd planes": func(b []byte) { le.PutUint64(b[recOffShardBytes:], 5001) },
	}
	for name, mut := range cases {
		if _, _, err := DecodeRecordHeader(encodeRaw(t, h, mut)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	// The encoder refuses what the decoder would.
	for name, bad := range map[string]func(h *RecordHeader){
		"too many shards": func(h *RecordHeader) {
			h.Layout.Shards = MaxCompressedShards + 1
			h.ShardCRCs = make([]uint32, h.Layout.Shards)
		},
		"len over shard": func(h *RecordHeader) { h.StoredLens[0] = 5001 },
		"missing lens":   func(h *RecordHeader) { h.StoredLens = nil },
		"lens when raw":  func(h *RecordHeader) { h.Compression = CompressionNone },
		"unknown code":   func(h *RecordHeader) { h.Compression = 9 },
	} {
		h := sampleCompressedHeader()
		bad(h)
		if _, err := EncodeRecordHeader(make([]byte, RecordHeaderSize), h); !errors.Is(err, ErrInvalid) {
			t.Errorf("encode %s: %v, want ErrInvalid", name, err)
		}
	}
	if MaxCompressedShards != 330 || recOffShardCRCs+compressedEntrySize*MaxCompressedShards > headerCRCOffset {
		t.Fatalf("MaxCompressedShards = %d does not fit the header", MaxCompressedShards)
	}
}

// packBlock packs block (shard-major, l) with code and returns the header and payload.
func packBlock(t testing.TB, code Compression, l Layout, block []byte) (*RecordHeader, []byte) {
	h := &RecordHeader{Type: RecordBlock, ID: testID(3), Segment: 1, Layout: l, Compression: code,
		ShardCRCs: make([]uint32, l.Shards), StoredLens: make([]uint32, l.Shards), StoredCRCs: make([]uint32, l.Shards)}
	for i := range h.ShardCRCs {
		h.ShardCRCs[i] = Checksum(block[int64(i)*l.ShardBytes : int64(i+1)*l.ShardBytes])
	}
	payload := make([]byte, AlignUp(l.BlockBytes()))
	c := GetCompressor()
	defer PutCompressor(c)
	sum, _ := c.PackShards(code, l, block, l.ShardBytes, payload, h.StoredLens, h.StoredCRCs, 0)
	if AlignUp(sum) != h.PayloadBytes() {
		t.Fatalf("packed %d bytes, header says %d", sum, h.PayloadBytes())
	}
	return h, payload[:h.PayloadBytes()]
}

// TestPackUnpackRoundTrip: both codes, KV-shaped shards (compressed), random shards (stored
// raw), and a mix, decode to the same bytes whole and shard by shard.
func TestPackUnpackRoundTrip(t *testing.T) {
	l := Layout{Shards: 5, TensorsPerShard: 2, ShardBytes: 64 << 10}
	block := make([]byte, l.BlockBytes())
	kvgen.Fill(block, kvgen.BF16, 1)
	clear(block[0 : l.ShardBytes/2])                                          // shard 0 half zero: compresses well
	rand.NewChaCha8([32]byte{1}).Read(block[2*l.ShardBytes : 3*l.ShardBytes]) // shard 2 random: stored raw
	for _, code := range []Compression{CompressionLZ4, CompressionLZ4Planes} {
		h, payload := packBlock(t, code, l, block)
		if h.StoredLens[2] != uint32(l.ShardBytes) || h.StoredLens[0] >= uint32(l.ShardBytes) {
			t.Fatalf("%v: stored lengths %v", code, h.StoredLens)
		}
		if code == CompressionLZ4Planes && h.StoredLens[1] >= uint32(l.ShardBytes) {
			t.Fatalf("byte planes did not compress a KV shard: %v", h.StoredLens)
		}
		out := make([]byte, l.BlockBytes())
		if err := VerifyPayload(h, payload, out, make([]byte, l.ShardBytes)); err != nil {
			t.Fatalf("%v: %v", code, err)
		}
		if !bytes.Equal(out, block) {
			t.Fatalf("%v: decoded block differs", code)
		}
		if err := VerifyPayload(h, payload, nil, make([]byte, 2*l.ShardBytes)); err != nil {
			t.Fatalf("%v: verify only: %v", code, err)
		}
		for i := 0; i < l.Shards; i++ {
			off, n := StoredOffset(l, code, h.StoredLens, i), StoredLen(l, code, h.StoredLens, i)
			dst := make([]byte, l.ShardBytes)
			if err := UnpackShard(code, i, payload[off:off+n], h.StoredCRCs[i], h.ShardCRCs[i], dst, make([]byte, l.ShardBytes)); err != nil {
				t.Fatalf("%v shard %d: %v", code, i, err)
			}
			if !bytes.Equal(dst, block[int64(i)*l.ShardBytes:int64(i+1)*l.ShardBytes]) {
				t.Fatalf("%v shard %d differs", code, i)
			}
		}
		// A flipped stored byte fails the stored CRC; a stored CRC "fixed up" to match still
		// fails the lz4 decode or the raw CRC; truncated input never panics.
		bad := bytes.Clone(payload)
		bad[100] ^= 1
		if err := VerifyPayload(h, bad, out, make([]byte, l.ShardBytes)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v flipped: %v", code, err)
		}
		stored0 := bad[:h.StoredLens[0]]
		if err := UnpackShard(code, 0, stored0, Checksum(stored0), h.ShardCRCs[0], make([]byte, l.ShardBytes), make([]byte, l.ShardBytes)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v flipped with matching stored crc: %v", code, err)
		}
		for _, cut := range []int{0, 1, int(h.StoredLens[0]) / 2, int(h.StoredLens[0]) - 1} {
			s := payload[:cut]
			if err := UnpackShard(code, 0, s, Checksum(s), h.ShardCRCs[0], make([]byte, l.ShardBytes), make([]byte, l.ShardBytes)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%v truncated to %d: %v", code, cut, err)
			}
		}
		if err := VerifyPayload(h, payload[:len(payload)-1], out, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%v short payload: %v", code, err)
		}
	}
}

// FuzzDecodeCompressedRecordHeader decodes arbitrary bytes laid over a valid compressed header
// (CRC recomputed, so the field checks are reached): decoding never panics, every failure is
// ErrCorrupt, and whatever decodes has bounded stored lengths and re-encodes identically;
// decoding the stored shards it describes from arbitrary payload bytes never panics either.
func FuzzDecodeCompressedRecordHeader(f *testing.F) {
	h := sampleCompressedHeader()
	good := make([]byte, RecordHeaderSize)
	if _, err := EncodeRecordHeader(good, h); err != nil {
		f.Fatal(err)
	}
	f.Add(uint16(recOffShardCRCs+4), []byte{0xff, 0xff, 0, 0}, []byte{0x10, 0x00, 0x00})
	f.Add(uint16(recOffCompress), []byte{1}, []byte{0xf0})
	f.Add(uint16(recOffShards), []byte{0x4b, 0x01}, []byte{})
	f.Add(uint16(recOffPayload), []byte{0, 0x10}, []byte{0x1f, 1, 2})
	f.Fuzz(func(t *testing.T, at uint16, patch, payload []byte) {
		buf := bytes.Clone(good)
		copy(buf[int(at)%headerCRCOffset:headerCRCOffset], patch)
		binary.LittleEndian.PutUint32(buf[headerCRCOffset:], Checksum(buf[:headerCRCOffset]))
		got, _, err := DecodeRecordHeader(buf)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if got.Compression == CompressionNone {
			return
		}
		var sum int64
		for _, n := range got.StoredLens {
			if n < 1 || int64(n) > got.Layout.ShardBytes {
				t.Fatalf("stored length %d escaped the bounds", n)
			}
			sum += int64(n)
		}
		// Reserved bytes are not checked by the decoder, so compare fields, not bytes.
		re := make([]byte, RecordHeaderSize)
		if got.Segment == 0 {
			got.Segment = 1 // the decoder leaves the segment check to the caller; the encoder refuses 0
		}
		if _, err := EncodeRecordHeader(re, &got); err != nil {
			t.Fatalf("re-encoding a decoded header: %v", err)
		}
		if again, _, err := DecodeRecordHeader(re); err != nil || !slices.Equal(again.StoredLens, got.StoredLens) ||
			!slices.Equal(again.StoredCRCs, got.StoredCRCs) || again.Layout != got.Layout {
			t.Fatalf("re-encoded header decodes differently: %v", err)
		}
		if got.Layout.ShardBytes > 1<<16 {
			return // keep the decode below cheap
		}
		p := make([]byte, got.PayloadBytes())
		copy(p, payload)
		_ = VerifyPayload(&got, p, make([]byte, got.Layout.BlockBytes()), make([]byte, got.Layout.ShardBytes))
		off := StoredOffset(got.Layout, got.Compression, got.StoredLens, 0)
		_ = UnpackShard(got.Compression, 0, p[off:off+int64(got.StoredLens[0])], Checksum(p[:got.StoredLens[0]]), 0, make([]byte, got.Layout.ShardBytes), make([]byte, got.Layout.ShardBytes))
	})
}

func benchShard(b *testing.B, dt kvgen.DType) []byte {
	src := make([]byte, 64<<10)
	kvgen.Fill(src, dt, 7)
	return src
}

// BenchmarkCompressShard / BenchmarkDecompressShard: one KV-shaped 64 KiB shard, both codes,
// bf16 and fp16; the reported ratio is raw/stored.
func BenchmarkCompressShard(b *testing.B) {
	for _, dt := range []struct {
		name string
		dt   kvgen.DType
	}{{"bf16", kvgen.BF16}, {"fp16", kvgen.FP16}} {
		for _, code := range []Compression{CompressionLZ4, CompressionLZ4Planes} {
			b.Run(dt.name+"/"+code.String(), func(b *testing.B) {
				src := benchShard(b, dt.dt)
				dst := make([]byte, len(src))
				c := GetCompressor()
				b.SetBytes(int64(len(src)))
				var n int
				for b.Loop() {
					n = c.CompressShard(code, dst, src)
				}
				b.ReportMetric(float64(len(src))/float64(n), "ratio")
			})
		}
	}
}

func BenchmarkDecompressShard(b *testing.B) {
	for _, dt := range []struct {
		name string
		dt   kvgen.DType
	}{{"bf16", kvgen.BF16}, {"fp16", kvgen.FP16}} {
		for _, code := range []Compression{CompressionLZ4, CompressionLZ4Planes} {
			b.Run(dt.name+"/"+code.String(), func(b *testing.B) {
				src := benchShard(b, dt.dt)
				stored := make([]byte, len(src))
				c := GetCompressor()
				n := c.CompressShard(code, stored, src)
				stored = stored[:n]
				dst, scratch := make([]byte, len(src)), make([]byte, len(src))
				scrc, rcrc := Checksum(stored), Checksum(src)
				b.SetBytes(int64(len(src)))
				for b.Loop() {
					if err := UnpackShard(code, 0, stored, scrc, rcrc, dst, scratch); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(src))/float64(n), "ratio")
			})
		}
	}
}

// PackShards gives up after the first eighth of the shards when they do not compress, and
// goes on when they do.
func TestPackShardsGivesUpEarly(t *testing.T) {
	l := Layout{Shards: 16, TensorsPerShard: 2, ShardBytes: 16 << 10}
	random := make([]byte, l.BlockBytes())
	rand.NewChaCha8([32]byte{2}).Read(random)
	zeros := make([]byte, l.BlockBytes())
	c := GetCompressor()
	defer PutCompressor(c)
	lens, crcs := make([]uint32, l.Shards), make([]uint32, l.Shards)
	dst := make([]byte, l.BlockBytes())
	if sum, ok := c.PackShards(CompressionLZ4, l, random, l.ShardBytes, dst, lens, crcs, 0.125); ok || sum != 2*l.ShardBytes {
		t.Fatalf("random block: ok %v after %d bytes, want a stop after 2 shards", ok, sum)
	}
	if sum, ok := c.PackShards(CompressionLZ4, l, zeros, l.ShardBytes, dst, lens, crcs, 0.125); !ok || sum >= l.BlockBytes()/8 {
		t.Fatalf("zero block: ok %v, %d bytes", ok, sum)
	}
	if _, ok := c.PackShards(CompressionLZ4, l, random, l.ShardBytes, dst, lens, crcs, 0); !ok {
		t.Fatalf("minSaving 0 must pack every shard")
	}
}
