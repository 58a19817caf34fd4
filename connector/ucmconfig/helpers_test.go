package ucmconfig

import (
	"bytes"
	"crypto/md5"
	"fmt"
	"testing"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/testwait"
)

var testSchema = engine.Schema{Model: "test-model", DType: "bfloat16", KVLayout: "mha", TPRank: 0, TPSize: 1, BlockTokens: 16}

// mhaLayout: 4 layers, K and V, 16 tokens × 2 heads × 64 dims × 2 bytes = 4 KiB per tensor.
var mhaLayout = engine.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 2 * 4096}

var waitFor = testwait.Until

func mustOpen(t testing.TB, dir string, opts engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.Open(dir, opts)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return e
}

// ids returns deterministic block ids for lo..hi-1.
func ids(lo, hi int) []engine.BlockID {
	out := make([]engine.BlockID, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, md5.Sum([]byte(fmt.Sprintf("block-%d", i))))
	}
	return out
}

// blockBytes is a block's content, a function of its id, so any reader can check it.
func blockBytes(l engine.Layout, id engine.BlockID) []byte {
	return bytes.Repeat(id[:], int(l.BlockBytes())/len(id))
}

func dumpBlocks(t testing.TB, e *engine.Engine, ids []engine.BlockID) {
	t.Helper()
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = blockBytes(e.Layout(), id)
	}
	if err := e.Dump(ids, src).Wait(); err != nil {
		t.Fatalf("dump: %v", err)
	}
}

func checkBlocks(t testing.TB, e *engine.Engine, ids []engine.BlockID) {
	t.Helper()
	dst := make([][]byte, len(ids))
	for i := range ids {
		dst[i] = devio.AlignedBuffer(int(e.Layout().BlockBytes()))
	}
	if err := e.Load(ids, dst).Wait(); err != nil {
		t.Fatalf("load: %v", err)
	}
	for i, id := range ids {
		if !bytes.Equal(dst[i], blockBytes(e.Layout(), id)) {
			t.Fatalf("block %s: loaded bytes differ", id)
		}
	}
}

func allHit(e *engine.Engine, ids []engine.BlockID) bool {
	for _, h := range e.Lookup(ids) {
		if !h {
			return false
		}
	}
	return true
}
