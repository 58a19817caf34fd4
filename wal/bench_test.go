package wal

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/format"
)

// BenchmarkAppend measures the appender alone (no index: the hooks only count) on the real
// disk: records of 64 KiB and 2 MiB, 8 per Append, with and without an fdatasync per group,
// through the default I/O backend with O_DIRECT when the file system takes it.
func BenchmarkAppend(b *testing.B) {
	for _, shard := range []int64{64 << 10, 2 << 20} {
		for _, sync := range []SyncPolicy{SyncNone, SyncAlways} {
			b.Run(fmt.Sprintf("%dKiB/%s", shard>>10, sync), func(b *testing.B) {
				dir := b.TempDir()
				be, err := devio.NewBackend(devio.EngineAuto, 64, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				direct := devio.DirectOff
				if ok, _ := devio.ProbeDirect(vfs.Default, dir); ok {
					direct = devio.DirectOn
				}
				w, err := NewWriter(Options{FS: vfs.Default, Dir: dir, SegmentSize: 256 << 20, Sync: sync, Backend: be,
					Hooks: &recHooks{sealed: map[uint64]int64{}}, Direct: direct})
				if err != nil {
					b.Fatal(err)
				}
				defer w.Close()
				l := format.Layout{Shards: 1, TensorsPerShard: 2, ShardBytes: shard}
				const batch = 8
				recs := make([]*Record, batch)
				for i := range recs {
					recs[i] = &Record{Layout: l, ShardCRCs: make([]uint32, 1), Buf: devio.AlignedBuffer(int(l.RecordBytes()))}
					recs[i].ShardCRCs[0] = format.Checksum(recs[i].Buf[format.RecordHeaderSize:])
				}
				b.SetBytes(batch * shard)
				n := 0
				for b.Loop() {
					for _, r := range recs {
						n++
						r.ID[0], r.ID[1], r.ID[2] = byte(n), byte(n>>8), byte(n>>16)
					}
					if err := w.Append(recs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
