package engine_test

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/ucm-go/ucm/engine"
)

// Example stores the KV blocks of a prompt, finds the shared prefix of a second prompt and
// loads it, as a connector does: whole-block dumps for the first prompt, a layer-wise dump
// (one DumpShard per layer) for the second prompt's new blocks, then a reopen that finds
// every acknowledged block again.
func Example() {
	dir, err := os.MkdirTemp("", "ucm-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	const blockTokens = 16
	opts := engine.Options{
		// 4 layers, K and V, 4 KiB per tensor: 32 KiB per block.
		Layout: engine.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 8 << 10},
		Schema: engine.Schema{Model: "example-model", DType: "bfloat16", KVLayout: "mha",
			TPRank: 0, TPSize: 1, BlockTokens: blockTokens},
	}
	e, err := engine.Open(dir, opts)
	if err != nil {
		log.Fatal(err)
	}
	l := e.Layout()

	// kv stands in for the KV an inference engine computed for a block: any bytes will do.
	kv := func(id engine.BlockID) []byte {
		return bytes.Repeat(id[:], int(l.BlockBytes())/len(id))
	}

	// A first prompt of 3 full blocks: store them whole.
	first := make([]uint32, 3*blockTokens)
	for i := range first {
		first[i] = uint32(i)
	}
	ids := blockIDs(first, blockTokens)
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = kv(id)
	}
	if err := e.Dump(ids, src).Wait(); err != nil {
		log.Fatal(err)
	}
	// Wait returned nil: the blocks are durable (SyncAlways, the default) and visible.
	fmt.Println("stored:", e.Lookup(ids))

	// A second prompt shares the first two blocks and continues with two of its own.
	second := append(append([]uint32(nil), first[:2*blockTokens]...), make([]uint32, 2*blockTokens)...)
	for i := 2 * blockTokens; i < len(second); i++ {
		second[i] = uint32(1000 + i)
	}
	ids2 := blockIDs(second, blockTokens)
	n := e.LookupPrefix(ids2)
	fmt.Println("prefix hit:", n, "of", len(ids2))

	// Load the hit: every shard is checked against its checksum.
	dst := make([][]byte, n)
	for i := range dst {
		dst[i] = make([]byte, l.BlockBytes())
	}
	if err := e.Load(ids2[:n], dst).Wait(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("loaded intact:", bytes.Equal(dst[0], kv(ids2[0])) && bytes.Equal(dst[1], kv(ids2[1])))

	// Dump the rest layer by layer, as a layer-wise connector does: every layer is submitted
	// before any is waited for; the blocks become visible once the last layer is durable.
	rest := ids2[n:]
	tasks := make([]*engine.Task, l.Shards)
	for layer := range l.Shards {
		shards := make([][]byte, len(rest))
		for i, id := range rest {
			shards[i] = kv(id)[int64(layer)*l.ShardBytes : int64(layer+1)*l.ShardBytes]
		}
		tasks[layer] = e.DumpShard(rest, layer, shards)
	}
	for _, t := range tasks {
		if err := t.Wait(); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("prefix hit after the dump:", e.LookupPrefix(ids2), "of", len(ids2))

	// A block never stored is a miss, reported per block, never garbage.
	other := blockIDs(make([]uint32, blockTokens), blockTokens)
	err = e.Load(other, [][]byte{make([]byte, l.BlockBytes())}).Wait()
	fmt.Println("miss:", errors.Is(err, engine.ErrNotFound))

	// Close makes everything durable and releases the store; the next Open finds it all.
	if err := e.Close(); err != nil {
		log.Fatal(err)
	}
	e, err = engine.Open(dir, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	fmt.Println("after reopen:", e.LookupPrefix(ids2), "of", len(ids2), "and", e.LookupPrefix(ids), "of", len(ids))

	// Output:
	// stored: [true true true]
	// prefix hit: 2 of 4
	// loaded intact: true
	// prefix hit after the dump: 4 of 4
	// miss: true
	// after reopen: 4 of 4 and 3 of 3
}

// blockIDs names each full block of tokens as a chain: id[i] = MD5(id[i-1] ‖ LE32 of each
// token of block i), from a zero seed, so equal prefixes give equal ids. A connector uses
// connector/ucmhash (UCM's schemes) instead; the engine treats ids as opaque.
func blockIDs(tokens []uint32, blockTokens int) []engine.BlockID {
	var ids []engine.BlockID
	var prev engine.BlockID
	for i := 0; i+blockTokens <= len(tokens); i += blockTokens {
		b := append([]byte(nil), prev[:]...)
		for _, t := range tokens[i : i+blockTokens] {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
		prev = md5.Sum(b)
		ids = append(ids, prev)
	}
	return ids
}
