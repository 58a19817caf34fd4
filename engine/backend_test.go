package engine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
)

// ioEngines lists the I/O backends this build can run: psync always, io_uring when compiled
// in (the Makefile builds with -tags uring) and permitted by the kernel.
func ioEngines(t *testing.T) []devio.IOEngine {
	out := []devio.IOEngine{devio.EnginePsync}
	b, err := devio.NewBackend(devio.EngineURing, 8, nil)
	if err == nil {
		b.Close()
		out = append(out, devio.EngineURing)
	} else {
		t.Logf("io_uring backend not tested: %v", err)
	}
	return out
}

// TestBackendsSameSuite runs the same dump/load/recovery suite on the real disk with every I/O
// backend, with and without O_DIRECT (t.TempDir is on ext4 here: O_DIRECT alignment is really
// enforced), and on the in-memory file system.
func TestBackendsSameSuite(t *testing.T) {
	for _, eng := range ioEngines(t) {
		for _, direct := range []devio.DirectMode{devio.DirectOn, devio.DirectOff} {
			t.Run(eng.String()+"/direct-"+direct.String(), func(t *testing.T) {
				opts := testOptions(vfs.Default, Layout{Shards: 8, TensorsPerShard: 2, ShardBytes: 16 << 10})
				opts.IOEngine, opts.DirectIO = eng, direct
				runCoreSuite(t, t.TempDir(), opts, func(path string, off int64) {
					f, err := os.OpenFile(path, os.O_RDWR, 0)
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					b := []byte{0}
					f.ReadAt(b, off)
					b[0] ^= 1
					if _, err := f.WriteAt(b, off); err != nil {
						t.Fatal(err)
					}
				})
			})
		}
	}
	t.Run("memfs", func(t *testing.T) {
		mem, fs := memFS()
		opts := testOptions(fs, Layout{Shards: 8, TensorsPerShard: 2, ShardBytes: 16 << 10})
		runCoreSuite(t, "/store", opts, func(path string, off int64) {
			patchFile(t, mem, path, off, func(b []byte) { b[0] ^= 1 })
		})
	})
}

func runCoreSuite(t *testing.T, dir string, opts Options, flip func(path string, off int64)) {
	l := opts.Layout
	e := mustOpen(t, dir, opts)
	name, direct := e.IOEngine()
	if want := opts.IOEngine.String(); opts.IOEngine != devio.EngineAuto && name != want {
		t.Fatalf("io engine %s, asked for %s", name, want)
	}
	if opts.DirectIO == devio.DirectOn && !direct {
		t.Fatal("O_DIRECT asked for but not in effect")
	}
	// Whole blocks, aligned and unaligned caller buffers.
	blocks := ids(0, 24)
	src := make([][]byte, len(blocks))
	for i, id := range blocks {
		if i%3 == 0 {
			src[i] = append(make([]byte, 1), blockBytes(l, id)...)[1:]
		} else {
			src[i] = devio.AlignedBuffer(int(l.BlockBytes()))
			copy(src[i], blockBytes(l, id))
		}
	}
	if err := e.Dump(blocks[:16], src[:16]).Wait(); err != nil {
		t.Fatal(err)
	}
	// Layer-wise for the rest.
	for sh := 0; sh < l.Shards; sh++ {
		part := make([][]byte, 8)
		for i := range part {
			part[i] = src[16+i][int64(sh)*l.ShardBytes : int64(sh+1)*l.ShardBytes]
		}
		if err := e.DumpShard(blocks[16:], sh, part).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.LookupPrefix(blocks); n != len(blocks) {
		t.Fatalf("prefix %d of %d", n, len(blocks))
	}
	checkBlocks(t, e, blocks)
	e.Close()

	// Reopen: everything is served from disk, shard by shard too.
	e = mustOpen(t, dir, opts)
	checkBlocks(t, e, blocks)
	for _, sh := range []int{0, l.Shards - 1} {
		dst := make([][]byte, len(blocks))
		for i := range dst {
			dst[i] = devio.AlignedBuffer(int(l.ShardBytes))
		}
		if err := e.LoadShard(blocks, sh, dst).Wait(); err != nil {
			t.Fatal(err)
		}
		for i, id := range blocks {
			if !bytes.Equal(dst[i], blockBytes(l, id)[int64(sh)*l.ShardBytes:int64(sh+1)*l.ShardBytes]) {
				t.Fatalf("shard %d of %s differs", sh, id)
			}
		}
	}
	if err := e.ix.CheckAccounting(); err != nil {
		t.Fatal(err)
	}
	// One flipped payload bit is detected and the block dropped.
	loc := location(t, e, blocks[5])
	flip(filepath.Join(e.segDir, segName(loc.Segment)), loc.Offset+l.ShardOffset(2)+7)
	dst := devio.AlignedBuffer(int(l.BlockBytes()))
	if err := e.Load(blocks[5:6], [][]byte{dst}).Wait(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("flipped bit: %v", err)
	}
	if e.Lookup(blocks[5:6])[0] {
		t.Fatal("corrupt block still indexed")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}
