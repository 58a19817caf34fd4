package format

import (
	"strconv"
	"testing"
)

func BenchmarkEncodeRecordHeader(b *testing.B) {
	h := sampleRecordHeader()
	h.Layout = Layout{Shards: 80, TensorsPerShard: 2, ShardBytes: 64 << 10}
	h.ShardCRCs = make([]uint32, 80)
	buf := make([]byte, RecordHeaderSize)
	b.SetBytes(RecordHeaderSize)
	for b.Loop() {
		if _, err := EncodeRecordHeader(buf, h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeRecordHeader(b *testing.B) {
	h := sampleRecordHeader()
	h.Layout = Layout{Shards: 80, TensorsPerShard: 2, ShardBytes: 64 << 10}
	h.ShardCRCs = make([]uint32, 80)
	buf := make([]byte, RecordHeaderSize)
	if _, err := EncodeRecordHeader(buf, h); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(RecordHeaderSize)
	for b.Loop() {
		if _, _, err := DecodeRecordHeader(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChecksum measures CRC32C over a 64 KiB shard (the per-shard checksum of every dump
// and load).
func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{4 << 10, 64 << 10, 2 << 20} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i * 31)
		}
		b.Run(sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				Checksum(buf)
			}
		})
	}
}

func sizeName(n int) string {
	return strconv.Itoa(n>>10) + "KiB"
}
