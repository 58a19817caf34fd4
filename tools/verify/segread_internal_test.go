package verify

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
)

// TestVerifyBatchBlock: a block of a batch record is checked shard by shard where its
// location puts them (stride N × ShardStride); a flipped byte in one shard, or a file that
// ends inside it, is corruption naming the shard.
func TestVerifyBatchBlock(t *testing.T) {
	fs := vfs.NewMem()
	const path = "/seg"
	l := format.Layout{Shards: 3, TensorsPerShard: 2, ShardBytes: 4096}
	const n, b = 4, 2
	loc := index.Location{Segment: 1, Offset: 8192, Layout: l, ShardCRCs: make([]uint32, l.Shards), BatchBlocks: n, BatchPos: b}
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	end := loc.Offset + format.AlignUp(128+16*n) + int64(l.Shards*n)*l.ShardStride()
	if _, err := f.WriteAt(make([]byte, end), 0); err != nil {
		t.Fatal(err)
	}
	shard := make([]byte, l.ShardBytes)
	for i := 0; i < l.Shards; i++ {
		for k := range shard {
			shard[k] = byte(i*7 + k)
		}
		loc.ShardCRCs[i] = format.Checksum(shard)
		at := loc.Offset + format.AlignUp(128+16*n) + int64(i*n+b)*l.ShardStride()
		if _, err := f.WriteAt(shard, at); err != nil {
			t.Fatal(err)
		}
	}
	if read, err := verifyBatchBlock(fs, path, loc); err != nil || read != int64(l.Shards)*l.ShardBytes {
		t.Fatalf("intact block: read %d, %v", read, err)
	}
	whole := make([]byte, end)
	if _, err := f.ReadAt(whole, 0); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	// The file cut inside shard 2.
	c, err := fs.Create("/cut", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(whole[:loc.ShardOffset(2)+100], 0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, err := verifyBatchBlock(fs, "/cut", loc); !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), "shard 2") {
		t.Fatalf("file cut inside shard 2: %v", err)
	}
	// A flipped byte in shard 1.
	whole[loc.ShardOffset(1)+5] ^= 0xff
	c, err = fs.Create("/flipped", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(whole, 0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, err := verifyBatchBlock(fs, "/flipped", loc); !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), "shard 1 checksum") {
		t.Fatalf("flipped byte in shard 1: %v", err)
	}
}
