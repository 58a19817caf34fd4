package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// stagingLayout is a layer-wise layout of many thin layers (an MLA model's shape, scaled down):
// 16 layers of one 4 KiB tensor.
var stagingLayout = Layout{Shards: 16, TensorsPerShard: 1, ShardBytes: 4096}

// submitLayers submits every layer of blocks before waiting for any, as a layer-wise connector
// does (one call per layer from one thread), and returns each layer task.
func submitLayers(e *Engine, blocks []BlockID, src [][][]byte) []*Task {
	tasks := make([]*Task, len(src))
	for sh := range src {
		tasks[sh] = e.DumpShard(blocks, sh, src[sh])
	}
	return tasks
}

// A layer-wise dump from unaligned memory whose layers together need far more staging memory
// than MaxStagingBytes, and whose one layer alone needs more than all of it, waits for staging
// memory instead of failing: every layer is submitted before any wait, each layer's run is
// written chunk by chunk within the budget, and every block is stored byte-exact.
func TestLayerBatchStagingBackpressure(t *testing.T) {
	_, fs := memFS()
	l := stagingLayout
	opts := testOptions(fs, l)
	opts.SegmentSize = 16 << 20                // the budget, not the segment, bounds the chunks
	opts.MaxStagingBytes = 2 * l.RecordBytes() // 34 layer runs of a block; one layer needs 64
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	blocks := ids(0, 64)
	src := layerSources(l, blocks, false)
	if need := int64(len(blocks)) * l.ShardStride(); need <= opts.MaxStagingBytes {
		t.Fatalf("one layer's run needs %d bytes, within the budget of %d: the test proves nothing", need, opts.MaxStagingBytes)
	}
	for sh, task := range submitLayers(e, blocks, src) {
		if err := task.Wait(); err != nil {
			t.Fatalf("layer %d: %v", sh, err)
		}
	}
	checkBlocks(t, e, blocks)
	checkShards(t, e, blocks)
	st := e.Stats()
	per := int(opts.MaxStagingBytes / l.ShardStride())
	if want := int64((len(blocks) + per - 1) / per); st.BatchRecords != want || st.DumpedBlocks != int64(len(blocks)) {
		t.Fatalf("%d batch records and %d blocks dumped, want %d records of at most %d blocks and %d blocks",
			st.BatchRecords, st.DumpedBlocks, want, per, len(blocks))
	}
	if st.StagingPeakBytes > opts.MaxStagingBytes || st.StagingPeakBytes == 0 || st.StagingBytes != 0 {
		t.Fatalf("staging peak %d bytes (now %d) with a budget of %d", st.StagingPeakBytes, st.StagingBytes, opts.MaxStagingBytes)
	}
	t.Logf("%d layer runs waited for staging memory", st.StagingWaits)
}

// fillStaging takes all but less than one block's layer run of staging memory with blocks
// created for a V0 dump (held until their Commit) and returns them.
func fillStaging(t *testing.T, e *Engine) []BlockID {
	t.Helper()
	l := e.Layout()
	held := ids(1000, 1000+int(e.opts.MaxStagingBytes/l.RecordBytes()))
	if err := errors.Join(e.Create(held)...); err != nil {
		t.Fatal(err)
	}
	if free := e.opts.MaxStagingBytes - e.Stats().StagingBytes; free >= l.ShardStride() {
		t.Fatalf("%d bytes of staging memory still free", free)
	}
	return held
}

// waitForStagingWaiters waits until n layer runs are waiting for staging memory.
func waitForStagingWaiters(t *testing.T, e *Engine, n int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); e.Stats().StagingWaits < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d layer runs wait for staging memory", e.Stats().StagingWaits, n)
		}
	}
}

// Layer runs that find staging memory full wait for it in their tasks (the calls that
// submitted them returned at once) and run once it is released: every block is stored.
func TestLayerBatchStagingWaitsForRelease(t *testing.T) {
	_, fs := memFS()
	l := stagingLayout
	opts := testOptions(fs, l)
	opts.MaxStagingBytes = 3 * l.RecordBytes()
	opts.TaskTimeout = time.Minute
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	held := fillStaging(t, e)
	blocks := ids(0, 8)
	tasks := submitLayers(e, blocks, layerSources(l, blocks, false))
	waitForStagingWaiters(t, e, int64(l.Shards))
	for sh, task := range tasks {
		if done, err := task.Check(); done {
			t.Fatalf("layer %d done while staging memory is full: %v", sh, err)
		}
	}
	if err := e.Commit(held, false); err != nil {
		t.Fatal(err)
	}
	for sh, task := range tasks {
		if err := task.Wait(); err != nil {
			t.Fatalf("layer %d: %v", sh, err)
		}
	}
	checkBlocks(t, e, blocks)
	checkShards(t, e, blocks)
}

// A layer run that gives up waiting for staging memory (its task cancelled: Wait's timeout,
// WaitContext's context) fails with ErrTimeout naming what it waited for, and every task of
// its batch reports that cause, not only "batch abandoned"; nothing of the batch is
// published, and the blocks can be dumped again.
func TestLayerBatchStagingCancelled(t *testing.T) {
	_, fs := memFS()
	l := stagingLayout
	opts := testOptions(fs, l)
	opts.MaxStagingBytes = 3 * l.RecordBytes()
	opts.TaskTimeout = time.Minute
	e := mustOpen(t, "/store", opts)
	defer e.Close()
	held := fillStaging(t, e)
	blocks := ids(0, 8)
	src := layerSources(l, blocks, false)
	tasks := submitLayers(e, blocks, src)
	waitForStagingWaiters(t, e, int64(l.Shards))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tasks[5].WaitContext(ctx); !errors.Is(err, ErrTimeout) {
		t.Fatalf("cancelled layer: %v, want ErrTimeout", err)
	}
	if err := e.Commit(held, false); err != nil { // the other layers' runs now get memory
		t.Fatal(err)
	}
	for sh, task := range tasks {
		err := task.Wait()
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrBlockFailed) || !strings.Contains(err.Error(), "layer 5: run of blocks [0, 8) of 8 waited") ||
			!strings.Contains(err.Error(), "bytes of staging memory") {
			t.Fatalf("layer %d: %v, want layer 5's ErrTimeout naming staging memory", sh, err)
		}
		for i, berr := range task.BlockErrors() {
			if !errors.Is(berr, ErrTimeout) || !strings.Contains(berr.Error(), blocks[i].String()) {
				t.Fatalf("layer %d block %d: %v", sh, i, berr)
			}
		}
	}
	for _, hit := range e.Lookup(blocks) {
		if hit {
			t.Fatal("a block of a failed batch was published")
		}
	}
	for sh, task := range submitLayers(e, blocks, src) {
		if err := task.Wait(); err != nil {
			t.Fatalf("layer %d, dumped again: %v", sh, err)
		}
	}
	checkBlocks(t, e, blocks)
	if st := e.Stats(); st.StagingBytes != 0 {
		t.Fatalf("%d bytes of staging memory still held", st.StagingBytes)
	}
}

// Close ends the waits for staging memory at once, with ErrClosed.
func TestLayerBatchStagingClose(t *testing.T) {
	_, fs := memFS()
	l := stagingLayout
	opts := testOptions(fs, l)
	opts.MaxStagingBytes = 3 * l.RecordBytes()
	opts.TaskTimeout = time.Hour
	e := mustOpen(t, "/store", opts)
	fillStaging(t, e)
	blocks := ids(0, 8)
	tasks := submitLayers(e, blocks, layerSources(l, blocks, false))
	waitForStagingWaiters(t, e, int64(l.Shards))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for sh, task := range tasks {
		if err := task.Wait(); !errors.Is(err, ErrClosed) {
			t.Fatalf("layer %d: %v, want ErrClosed", sh, err)
		}
	}
}
