package engine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/tiers"
)

// splitter cuts n bytes into pieces, each in its own allocation (K and V of a shard live in
// separate tensors in a connector).
type splitter struct {
	name string
	cut  func(n int) []int // piece lengths, adding up to n
	// aligned: pieces are 4 KiB-aligned allocations (the O_DIRECT path); else each piece
	// starts one byte into its allocation.
	aligned bool
}

var splitters = []splitter{
	{"halves-aligned", func(n int) []int { return []int{n / 2, n - n/2} }, true},
	{"pages-aligned", func(n int) []int {
		var out []int
		for ; n > 0; n -= 4096 {
			out = append(out, min(n, 4096))
		}
		return out
	}, true},
	{"odd-unaligned", func(n int) []int { return []int{1000, n/2 - 1000, 3, n - n/2 - 3} }, false},
}

// piecesOf allocates pieces of b's length as sp cuts it, filled with b's bytes.
func piecesOf(sp splitter, b []byte) [][]byte {
	var out [][]byte
	off := 0
	for _, n := range sp.cut(len(b)) {
		var p []byte
		if sp.aligned {
			p = devio.AlignedBuffer(n)
		} else {
			p = make([]byte, n+1)[1:]
		}
		copy(p, b[off:off+n])
		out = append(out, p)
		off += n
	}
	return out
}

func joined(pieces [][]byte) []byte { return bytes.Join(pieces, nil) }

// TestSpansRoundTrip: blocks dumped from pieces (whole and layer-wise) load back into pieces
// byte for byte, whole and shard by shard, from disk (every backend, with and without
// O_DIRECT), from the memory tier and from compressed records, for aligned pieces (read
// straight into them) and unaligned ones (through a staging buffer); a flipped payload bit
// read into pieces is a miss, never bytes.
func TestSpansRoundTrip(t *testing.T) {
	l := Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 16 << 10}
	type setup struct {
		name string
		dir  string
		opts Options
		flip func(t *testing.T, e *Engine, id BlockID)
	}
	var setups []setup
	for _, eng := range ioEngines(t) {
		for _, direct := range []devio.DirectMode{devio.DirectOn, devio.DirectOff} {
			o := testOptions(vfs.Default, l)
			o.IOEngine, o.DirectIO = eng, direct
			setups = append(setups, setup{name: eng.String() + "/direct-" + direct.String(), opts: o, flip: flipOnDisk})
		}
	}
	_, fs := memFS()
	mem := tierOptions(fs, tiers.Config{Name: "dram", Kind: tiers.KindMemory, Capacity: 64 * l.BlockBytes()}, diskTierCfg("ssd", 0, "/ssd"))
	mem.Layout = l
	setups = append(setups, setup{name: "memory-tier", dir: "/store", opts: mem})
	_, cfs := memFS()
	comp := compressOptions(cfs, l)
	setups = append(setups, setup{name: "compressed", dir: "/cstore", opts: comp})

	for _, su := range setups {
		for _, sp := range splitters {
			t.Run(su.name+"/"+sp.name, func(t *testing.T) {
				dir := su.dir
				if dir == "" {
					dir = t.TempDir()
				}
				e := mustOpen(t, dir, su.opts)
				blocks := compressibleIDs(12)
				want := make([][]byte, len(blocks))
				for i, id := range blocks {
					want[i] = kvBlock(l, id, false)
				}
				// Whole blocks from pieces for the first half, layer-wise for the rest.
				src := make([][][]byte, 6)
				for i := range src {
					src[i] = piecesOf(sp, want[i])
				}
				if err := e.DumpSpans(blocks[:6], AllShards, src).Wait(); err != nil {
					t.Fatal(err)
				}
				for sh := 0; sh < l.Shards; sh++ {
					part := make([][][]byte, 6)
					for k := range part {
						part[k] = piecesOf(sp, want[6+k][int64(sh)*l.ShardBytes:int64(sh+1)*l.ShardBytes])
					}
					if err := e.DumpSpans(blocks[6:], sh, part).Wait(); err != nil {
						t.Fatal(err)
					}
				}
				if su.opts.Tiers == nil {
					// Reopen: served from disk, not from anything the dump left in memory.
					if err := e.Close(); err != nil {
						t.Fatal(err)
					}
					e = mustOpen(t, dir, su.opts)
				}
				defer e.Close()
				for round := 0; round < 2; round++ { // the second round hits what the first backfilled
					dst := make([][][]byte, len(blocks))
					for i := range dst {
						dst[i] = piecesOf(sp, make([]byte, l.BlockBytes()))
					}
					if err := e.LoadSpans(blocks, AllShards, dst).Wait(); err != nil {
						t.Fatal(err)
					}
					for i, id := range blocks {
						if !bytes.Equal(joined(dst[i]), want[i]) {
							t.Fatalf("round %d: block %s loaded into pieces differs", round, id)
						}
					}
					for _, sh := range []int{0, l.Shards - 1} {
						dst := make([][][]byte, len(blocks))
						for i := range dst {
							dst[i] = piecesOf(sp, make([]byte, l.ShardBytes))
						}
						if err := e.LoadSpans(blocks, sh, dst).Wait(); err != nil {
							t.Fatal(err)
						}
						for i, id := range blocks {
							if !bytes.Equal(joined(dst[i]), want[i][int64(sh)*l.ShardBytes:int64(sh+1)*l.ShardBytes]) {
								t.Fatalf("round %d: shard %d of %s loaded into pieces differs", round, sh, id)
							}
						}
					}
				}
				if su.flip == nil {
					return
				}
				su.flip(t, e, blocks[3])
				for _, shard := range []int{2, AllShards} {
					dst := [][][]byte{piecesOf(sp, make([]byte, l.ShardBytes))}
					if shard == AllShards {
						dst = [][][]byte{piecesOf(sp, make([]byte, l.BlockBytes()))}
					}
					err := e.LoadSpans(blocks[3:4], shard, dst).Wait()
					if shard == 2 && !errors.Is(err, ErrCorrupt) {
						t.Fatalf("flipped bit in shard 2, loaded into pieces: %v, want ErrCorrupt", err)
					}
					if shard == AllShards && !errors.Is(err, ErrNotFound) {
						t.Fatalf("block dropped after its corrupt shard: %v, want ErrNotFound", err)
					}
				}
			})
		}
	}
}

// flipOnDisk flips one payload bit of shard 2 of id in its segment file.
func flipOnDisk(t *testing.T, e *Engine, id BlockID) {
	t.Helper()
	loc := location(t, e, id)
	path := filepath.Join(e.segDir, segName(loc.Segment))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := loc.Offset + e.Layout().ShardOffset(2) + 5000
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 4
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestSpansBadInput: pieces that do not add up to the block or shard, and shard indexes out
// of range, fail with ErrInvalidArgument naming the block, and lose nothing stored.
func TestSpansBadInput(t *testing.T) {
	_, fs := memFS()
	e := mustOpen(t, "/store", testOptions(fs, mhaLayout))
	defer e.Close()
	l := mhaLayout
	good := ids(0, 2)
	dumpBlocks(t, e, good)
	short := [][]byte{make([]byte, l.ShardBytes/2), make([]byte, l.ShardBytes/2-1)}
	err := e.DumpSpans(ids(5, 6), 1, [][][]byte{short}).Wait()
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), blockID(5).String()) {
		t.Fatalf("short pieces dumped: %v", err)
	}
	err = e.LoadSpans(good[:1], 1, [][][]byte{short}).Wait()
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), good[0].String()) {
		t.Fatalf("short pieces loaded: %v", err)
	}
	err = e.LoadSpans(good[:1], AllShards, [][][]byte{nil}).Wait()
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no pieces: %v", err)
	}
	for _, sh := range []int{-2, l.Shards} {
		if err := e.LoadSpans(good[:1], sh, [][][]byte{{make([]byte, l.ShardBytes)}}).Wait(); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("shard %d: %v", sh, err)
		}
		if err := e.DumpSpans(good[:1], sh, [][][]byte{{make([]byte, l.ShardBytes)}}).Wait(); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("dump shard %d: %v", sh, err)
		}
	}
	if err := e.LoadSpans(good, AllShards, [][][]byte{{make([]byte, l.BlockBytes())}}).Wait(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("2 ids, 1 destination: %v", err)
	}
	checkBlocks(t, e, good)
	if e.Lookup(ids(5, 6))[0] {
		t.Fatal("a block dumped from short pieces is visible")
	}
}
