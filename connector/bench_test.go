package connector

import (
	"fmt"
	"testing"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
)

// BenchmarkStoreLoadShard is the Go side of one UCM layer-wise load call (4 blocks × one 64 KiB
// shard into one span each), submit and wait: what the C ABI adds to is measured by
// connector/python/bench.py against ucm-tool bench.
func BenchmarkStoreLoadShard(b *testing.B) {
	dir := b.TempDir()
	cfg, err := ParseStoreConfig(fmt.Sprintf(`{"storage_backends": %q, "device_id": 0, "tensor_size_list": [32768, 32768], "shard_size": 65536, "block_size": 2097152, "sync_policy": "none"}`, dir), noEnv)
	if err != nil {
		b.Fatal(err)
	}
	s, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ids := randomIDs(4)
	bufs := make([][][]byte, len(ids))
	for i := range bufs {
		bufs[i] = [][]byte{devio.AlignedBuffer(65536)}
	}
	for sh := 0; sh < 32; sh++ {
		t, err := s.Dump(ids, repeat(sh, 4), bufs)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Wait(t, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(4 * 65536)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t, err := s.Load(ids, []int{0, 0, 0, 0}, bufs)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Wait(t, nil); err != nil {
			b.Fatal(err)
		}
	}
}

var _ = engine.AllShards
