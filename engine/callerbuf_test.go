package engine

import (
	"bytes"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
)

// aliasEngine opens a store on disk for tests that make the caller's mistake on purpose:
// loads whose destinations share memory. It reads with io_uring where that works: the kernel
// writes the loaded bytes, which the race detector does not see (psync's worker goroutines
// writing one buffer would be reported as the race the test makes). Without io_uring the
// tests run with psync, except under the race detector, where they are skipped.
func aliasEngine(t *testing.T) *Engine {
	t.Helper()
	dir := t.TempDir()
	o := testOptions(vfs.Default, mhaLayout)
	o.IOEngine = devio.EngineURing
	e, err := Open(dir, o)
	if err != nil {
		if raceEnabled {
			t.Skipf("io_uring unavailable (%v): psync's goroutines writing one shared buffer would be reported by the race detector", err)
		}
		o.IOEngine = devio.EnginePsync
		e = mustOpen(t, dir, o)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// checkBufferChanged checks that a load's per-block errors are nil or ErrBufferChanged (never
// a miss or corruption) and returns how many failed.
func checkBufferChanged(t *testing.T, errs []error) int {
	t.Helper()
	n := 0
	for i, err := range errs {
		if err == nil {
			continue
		}
		n++
		if !errors.Is(err, ErrBufferChanged) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotFound) {
			t.Fatalf("block %d of a load into shared memory: %v, want ErrBufferChanged (and neither ErrCorrupt nor ErrNotFound)", i, err)
		}
	}
	return n
}

// checkKept checks that every block of blocks is still indexed and loads exactly, and that
// no load counted corruption.
func checkKept(t *testing.T, e *Engine, blocks []BlockID) {
	t.Helper()
	if hits := e.Lookup(blocks); slices.Contains(hits, false) {
		t.Fatalf("blocks intact on disk were dropped after loads into shared memory: lookup %v", hits)
	}
	checkBlocks(t, e, blocks)
	if st := e.Stats(); st.CorruptReads != 0 {
		t.Fatalf("%d corrupt reads counted for blocks intact on disk", st.CorruptReads)
	}
}

// TestOneBufferForManyBlocksKeepsThem: a load whose destinations are one buffer (every block
// read into the same memory, as two loads sharing a buffer do) fails the blocks whose bytes
// the others overwrote, with ErrBufferChanged, and drops none of them: they are intact on
// disk. Each is counted in Stats.CallerBufferChanged.
func TestOneBufferForManyBlocksKeepsThem(t *testing.T) {
	e := aliasEngine(t)
	blocks := ids(0, 8)
	dumpBlocks(t, e, blocks)
	buf := devio.AlignedBuffer(int(mhaLayout.BlockBytes()))
	dst := make([][]byte, len(blocks))
	for i := range dst {
		dst[i] = buf
	}
	task := e.Load(blocks, dst)
	_ = task.Wait()
	failed := checkBufferChanged(t, task.BlockErrors())
	if failed < len(blocks)-1 {
		t.Fatalf("%d of %d blocks loaded into one buffer failed, want at least %d", failed, len(blocks), len(blocks)-1)
	}
	if got := e.Stats().CallerBufferChanged; got != int64(failed) {
		t.Fatalf("Stats.CallerBufferChanged %d, want %d", got, failed)
	}
	checkKept(t, e, blocks)
}

// TestConcurrentLoadsIntoOneBufferKeepBlocks: two concurrent loads into the same buffers (the
// caller's bug) fail some blocks with ErrBufferChanged, never drop one, and every block still
// loads exactly afterwards. How many collide depends on timing; none may be lost.
func TestConcurrentLoadsIntoOneBufferKeepBlocks(t *testing.T) {
	e := aliasEngine(t)
	const n = 32
	blocks := ids(0, 2*n)
	dumpBlocks(t, e, blocks)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = devio.AlignedBuffer(int(mhaLayout.BlockBytes()))
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func(mine []BlockID) {
			defer wg.Done()
			for range 4 {
				task := e.Load(mine, bufs)
				_ = task.Wait()
				errs := task.BlockErrors()
				for i, err := range errs {
					if err != nil && !errors.Is(err, ErrBufferChanged) {
						t.Errorf("block %d: %v, want nil or ErrBufferChanged", i, err)
					}
				}
				mu.Lock()
				failed += countNonNil(errs)
				mu.Unlock()
			}
		}(blocks[g*n : (g+1)*n])
	}
	wg.Wait()
	t.Logf("%d block loads collided in the shared buffers", failed)
	if got := e.Stats().CallerBufferChanged; got != int64(failed) {
		t.Fatalf("Stats.CallerBufferChanged %d, want %d", got, failed)
	}
	checkKept(t, e, blocks)
}

func countNonNil(errs []error) int {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// TestLoadSpansPieceTwiceKeepsBlock: LoadSpans with one piece listed twice (both halves of the
// block, or of a shard, read into the same memory) fails with ErrBufferChanged and keeps the
// block, for a whole block and for one shard.
func TestLoadSpansPieceTwiceKeepsBlock(t *testing.T) {
	e := aliasEngine(t)
	blocks := ids(0, 2)
	dumpBlocks(t, e, blocks)
	half := devio.AlignedBuffer(int(mhaLayout.BlockBytes() / 2))
	task := e.LoadSpans(blocks[:1], AllShards, [][][]byte{{half, half}})
	if err := task.Wait(); checkBufferChanged(t, task.BlockErrors()) != 1 {
		t.Fatalf("whole block into one piece twice: %v, want ErrBufferChanged", err)
	}
	shardHalf := devio.AlignedBuffer(int(mhaLayout.ShardBytes / 2))
	task = e.LoadSpans(blocks[1:], 2, [][][]byte{{shardHalf, shardHalf}})
	if err := task.Wait(); checkBufferChanged(t, task.BlockErrors()) != 1 {
		t.Fatalf("shard 2 into one piece twice: %v, want ErrBufferChanged", err)
	}
	if got := e.Stats().CallerBufferChanged; got != 2 {
		t.Fatalf("Stats.CallerBufferChanged %d, want 2", got)
	}
	checkKept(t, e, blocks)
}

// TestCorruptOnDiskStillDroppedFromCallerMemory: a block whose bytes on disk are corrupt still
// fails with ErrCorrupt and is dropped when the check that found it ran in the caller's memory
// (read straight into the caller's buffer, into LoadSpans pieces, one shard): the engine's own
// read finds the corruption too. Nothing is counted as a caller's buffer change.
func TestCorruptOnDiskStillDroppedFromCallerMemory(t *testing.T) {
	e := mustOpen(t, t.TempDir(), testOptions(vfs.Default, mhaLayout))
	defer e.Close()
	blocks := ids(0, 4)
	dumpBlocks(t, e, blocks)
	for _, id := range blocks[:3] {
		flipOnDisk(t, e, id)
	}
	l := mhaLayout
	whole := devio.AlignedBuffer(int(l.BlockBytes()))
	pieces := [][]byte{devio.AlignedBuffer(int(l.BlockBytes() / 2)), devio.AlignedBuffer(int(l.BlockBytes() / 2))}
	shard := devio.AlignedBuffer(int(l.ShardBytes))
	loads := []*Task{
		e.Load(blocks[:1], [][]byte{whole}),
		e.LoadSpans(blocks[1:2], AllShards, [][][]byte{pieces}),
		e.LoadShard(blocks[2:3], 2, [][]byte{shard}),
	}
	for k, task := range loads {
		if err := task.Wait(); !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrBufferChanged) {
			t.Fatalf("load %d of a block corrupt on disk: %v, want ErrCorrupt", k, err)
		}
	}
	if hits := e.Lookup(blocks); !slices.Equal(hits, []bool{false, false, false, true}) {
		t.Fatalf("lookup after loads of corrupt blocks: %v, want the three corrupt ones dropped", hits)
	}
	if st := e.Stats(); st.CorruptReads != 3 || st.CallerBufferChanged != 0 {
		t.Fatalf("CorruptReads %d, CallerBufferChanged %d; want 3 and 0", st.CorruptReads, st.CallerBufferChanged)
	}
	got, err := loadOne(e, blocks[3])
	if err != nil || !bytes.Equal(got, blockBytes(l, blocks[3])) {
		t.Fatalf("intact block: %v", err)
	}
}
