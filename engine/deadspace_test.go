package engine

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ucm-go/ucm/index"
)

// failingDumps runs rounds of the calls a connector makes when dumps fail and are retried:
// a layer-wise dump whose last layer never comes (its batch expires after TaskTimeout), one
// whose second layer has a buffer of the wrong size (the batch fails, its other layers are
// refused) followed by the same dump again, every layer, with good buffers, a V0 Create whose blocks
// are dumped and then discarded by Commit(false), and a plain whole-block dump. Without retry,
// the bad dump is not retried and there is no whole-block dump: nothing is stored. It returns
// the blocks that must be stored and those that must not be; n numbers the blocks.
func failingDumps(t *testing.T, e *Engine, n *int, rounds int, retry bool) (live, gone []BlockID) {
	t.Helper()
	l := e.Layout()
	expired := e.Stats().StagingExpired
	next := func(k int) []BlockID {
		ids := make([]BlockID, k)
		for i := range ids {
			ids[i] = blockID(*n)
			*n++
		}
		return ids
	}
	for r := 0; r < rounds; r++ {
		expiring := next(8)
		src := layerSources(l, expiring, true)
		for sh := 0; sh < l.Shards-1; sh++ {
			if err := e.DumpShard(expiring, sh, src[sh]).Wait(); err != nil {
				t.Fatalf("round %d: layer %d of a dump that will expire: %v", r, sh, err)
			}
		}
		gone = append(gone, expiring...)

		retried := next(8)
		src = layerSources(l, retried, true)
		bad := append([][]byte(nil), src[1]...)
		bad[3] = bad[3][:l.ShardBytes-512]
		errs := dumpLayers(e, retried, [][][]byte{src[0], bad, src[2], src[3]}, []int{0, 1, 2, 3})
		if errs[0] != nil || !errors.Is(errs[1], ErrInvalidArgument) || !errors.Is(errs[2], ErrBlockFailed) {
			t.Fatalf("round %d: dump with a bad layer buffer: %v", r, errs)
		}
		if !retry {
			gone = append(gone, retried...)
			continue
		}
		for sh, err := range dumpLayers(e, retried, src, []int{0, 1, 2, 3}) {
			if err != nil {
				t.Fatalf("round %d: retried dump, layer %d: %v", r, sh, err)
			}
		}
		live = append(live, retried...)

		discarded := next(2)
		if err := errors.Join(e.Create(discarded)...); err != nil {
			t.Fatal(err)
		}
		src = layerSources(l, discarded, true)
		for sh := 0; sh < l.Shards; sh++ {
			if err := e.DumpShard(discarded, sh, src[sh]).Wait(); err != nil {
				t.Fatalf("round %d: V0 layer %d: %v", r, sh, err)
			}
		}
		if err := e.Commit(discarded, false); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, discarded...)

		whole := next(2)
		dumpBlocks(t, e, whole)
		live = append(live, whole...)
	}
	waitFor(t, "the expiry of the dumps missing a layer", func() bool { return e.Stats().StagingExpired >= expired+int64(8*rounds) })
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	return live, gone
}

// deadSegments returns the disk tier's segments that reclamation owes: sealed with a live
// ratio at most ratio (0: only those with nothing live), or retired and not yet deleted.
func deadSegments(e *Engine, ratio float64) []index.SegmentMeta {
	var out []index.SegmentMeta
	for _, row := range e.ix.Segments() {
		switch row.State {
		case index.SegmentDeleting:
			out = append(out, row)
		case index.SegmentSealed:
			if row.LiveRecords == 0 || float64(row.LiveBytes) <= ratio*float64(row.Size) {
				out = append(out, row)
			}
		}
	}
	return out
}

// Dead space left by failed, expired, abandoned and discarded dumps comes back without any
// operator action and without the tier filling up, with an online compaction interval far
// longer than the test: a sealed segment with nothing live is deleted within a reclaimer tick
// (a shared tier's after its grace), and a process that opens the store compacts the
// segments at or below CompactLiveRatio on its first tick, so that a series of short runs,
// each shorter than the interval, does not accumulate dead space. Every stored block stays
// byte-exact; none of the failed ones appears.
func TestDeadSpaceFromFailedDumpsComesBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts func(t *testing.T) (string, Options)
	}{
		{"private", func(t *testing.T) (string, Options) {
			_, fs := memFS()
			return "/store", testOptions(fs, mhaLayout)
		}},
		{"shared", func(t *testing.T) (string, Options) {
			return filepath.Join(t.TempDir(), "store"), sharedOptions(filepath.Join(t.TempDir(), "shared"), 10*time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, o := tc.opts(t)
			o.CompactInterval = time.Hour // the periodic pass never comes during the test
			o.TaskTimeout = 2 * time.Second
			e := mustOpen(t, dir, o)
			defer func() { e.Close() }()
			// The reclaimer may delete segments as soon as they are sealed: the dead space the
			// workload leaves is sampled while it runs.
			var peak atomic.Int64
			stop, sampled := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					peak.Store(max(peak.Load(), e.TierStats()[0].DeadBytes))
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()
			n := 0
			retired := e.Stats().SegmentsRetired
			_, gone := failingDumps(t, e, &n, 6, false) // a run of failures: nothing stored
			live, gone2 := failingDumps(t, e, &n, 6, true)
			gone = append(gone, gone2...)
			close(stop)
			<-sampled
			before := e.TierStats()[0]
			// The sampler may miss a dead segment the reclaimer deleted between two samples (a
			// busy machine): then the segments retired meanwhile show the dead space.
			retired = e.Stats().SegmentsRetired - retired
			t.Logf("the failing dumps: %d dead bytes at most, %d live; %d segments retired meanwhile", peak.Load(), before.LiveBytes, retired)
			if peak.Load() <= before.LiveBytes && retired == 0 {
				t.Fatalf("the failing workload left at most %d dead bytes for %d live and no segment was retired: not the scenario", peak.Load(), before.LiveBytes)
			}

			// In the same run: segments with nothing live are deleted.
			waitFor(t, "the deletion of the sealed segments with nothing live", func() bool { return len(deadSegments(e, 0)) == 0 })
			mid := e.TierStats()[0]
			t.Logf("same run, no action: %d file bytes, %d live, %d dead, %d segments", mid.FileBytes, mid.LiveBytes, mid.DeadBytes, mid.Segments)
			if mid.DeadBytes >= peak.Load() {
				t.Fatalf("dead bytes %d at most, %d after", peak.Load(), mid.DeadBytes)
			}

			// The next run (a process that lived shorter than the compaction interval):
			// compacted on its first tick.
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = mustOpen(t, dir, o)
			ratio := e.opts.CompactLiveRatio
			waitFor(t, "the compaction of the sparse segments after Open", func() bool { return len(deadSegments(e, ratio)) == 0 })
			after := e.TierStats()[0]
			t.Logf("next run, no action: %d file bytes, %d live, %d dead, %d segments", after.FileBytes, after.LiveBytes, after.DeadBytes, after.Segments)
			// The documented bound: every sealed segment is more than CompactLiveRatio live,
			// and the active segments are at most one segment size each.
			var bound int64
			for _, row := range e.ix.Segments() {
				if row.State == index.SegmentSealed {
					bound += row.Size - row.LiveBytes
				} else {
					bound += e.tiers[0].SegmentSize()
				}
				if row.State == index.SegmentSealed && float64(row.LiveBytes) <= ratio*float64(row.Size) {
					t.Fatalf("segment %d: %d of %d bytes live after compaction", row.Number, row.LiveBytes, row.Size)
				}
			}
			if after.DeadBytes > bound || after.DeadBytes > mid.DeadBytes {
				t.Fatalf("dead bytes %d → %d (bound %d)", mid.DeadBytes, after.DeadBytes, bound)
			}
			if after.LiveBytes != before.LiveBytes || after.Blocks != int64(len(live)) {
				t.Fatalf("live bytes %d → %d, %d blocks (want %d)", before.LiveBytes, after.LiveBytes, after.Blocks, len(live))
			}
			checkBlocks(t, e, live)
			checkShards(t, e, live)
			for i, hit := range e.Lookup(gone) {
				if hit {
					t.Fatalf("block %s of a failed or discarded dump is stored", gone[i])
				}
			}
			if err := e.ix.CheckAccounting(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
