package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tiers"
)

// sharedWorkload has --instances instances, each with its own store directory, share one tier
// of --capacity and dump --total bytes each, all at once; the shared directory's bytes are
// sampled meanwhile. It reports the on-volume bytes over time against the capacity and the
// bound the admission keeps (capacity + one segment per instance), how soon another instance
// finds a block after its dump's Wait returned, and lookups/s across the instances.
type sharedWorkload struct{}

func (sharedWorkload) name() string { return "shared-capacity" }

func (sharedWorkload) defaults() map[string]string {
	return map[string]string{"block-size": "256KiB", "shards": "4", "total": "64MiB", "capacity": "64MiB",
		"segment-size": "4MiB", "concurrency": "2"}
}

func (sharedWorkload) blocks(cfg benchConfig, l format.Layout) (int, error) {
	switch {
	case cfg.instances < 1:
		return 0, fmt.Errorf("--instances %d: want at least 1", cfg.instances)
	case cfg.capacity <= 0:
		return 0, errors.New("--capacity: the shared-capacity workload needs the shared tier's capacity")
	}
	return totalBlocks(cfg, l)
}

// visibilityWait bounds how long the next instance looks for a block after its dump: one
// reclaimed meanwhile (to hold the capacity) is never found, and is not counted.
const visibilityWait = 2 * time.Second

// sharedSampleEvery is how often the shared directory's bytes are summed.
const sharedSampleEvery = 10 * time.Millisecond

// sharedBench is what the shared-capacity workload measured.
type sharedBench struct {
	Instances     int   `json:"instances"`
	CapacityBytes int64 `json:"capacity_bytes"`
	SegmentBytes  int64 `json:"segment_bytes"`
	// BoundBytes is capacity + instances × one segment: what the volume may hold at most.
	BoundBytes int64 `json:"bound_bytes"`
	PeakBytes  int64 `json:"peak_volume_bytes"`
	// Samples are the volume's bytes (every file under the shared directory) over the run.
	Samples []volumeSample `json:"samples"`
	// Acked and Refused count the blocks whose dump succeeded and those refused for lack of
	// room (ErrNoSpace: the admission at work).
	Acked, Refused int64
	// Visibility: from a dump's Wait returning in one instance to the first hit of its first
	// block in the next instance.
	VisibilityP50Ms float64 `json:"visibility_p50_ms"`
	VisibilityP99Ms float64 `json:"visibility_p99_ms"`
	VisibilityN     int     `json:"visibility_samples"`
	// LookupsPerSec is every instance looking up every acknowledged block at once, batches of
	// 1,024; HitFraction the share found (blocks reclaimed to hold the capacity are misses).
	LookupsPerSec float64 `json:"lookups_per_s"`
	HitFraction   float64 `json:"hit_fraction"`
	// Verified counts hits loaded from an instance other than their writer and checked.
	Verified int `json:"verified"`
}

// volumeSample is the shared directory's bytes at a time since the dumps started.
type volumeSample struct {
	Seconds float64 `json:"s"`
	Bytes   int64   `json:"bytes"`
}

func (sharedWorkload) run(env *benchEnv, res *benchResult) error {
	cfg := env.cfg
	shared := filepath.Join(env.storeDir, "shared")
	opts := env.opts
	opts.Tiers = []tiers.Config{{Name: "shared", Kind: tiers.KindDisk, Paths: []string{shared}, Shared: true, Capacity: cfg.capacity}}
	opts.SharedRefreshInterval = 100 * time.Millisecond
	opts.SharedRetireGrace = 500 * time.Millisecond // grace counts against the capacity: short, so writers are not held long
	n := cfg.instances
	engines := make([]*engine.Engine, 0, n)
	defer func() {
		for _, e := range engines {
			_ = e.Close()
		}
	}()
	for k := range n {
		e, _, err := env.openDirWith(filepath.Join(env.storeDir, fmt.Sprintf("instance-%d", k)), opts)
		if err != nil {
			return err
		}
		engines = append(engines, e)
	}
	res.IOEngine, res.Direct = engines[0].IOEngine()
	sb := &sharedBench{Instances: n, CapacityBytes: cfg.capacity, SegmentBytes: engine.SegmentSizeFor(cfg.segmentSize, cfg.capacity)}
	sb.BoundBytes = sb.CapacityBytes + int64(n)*sb.SegmentBytes
	res.Shared = sb
	env.progressf("%d instances dumping %s each into one tier of %s", n, cliutil.HumanBytes(int64(env.blocks)*res.BlockBytes), cliutil.HumanBytes(cfg.capacity))

	start := time.Now()
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(sharedSampleEvery)
		defer tick.Stop()
		for {
			b := dirBytes(shared)
			sb.Samples = append(sb.Samples, volumeSample{time.Since(start).Seconds(), b})
			sb.PeakBytes = max(sb.PeakBytes, b)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	var (
		mu       sync.Mutex
		vis      []time.Duration
		visWG    sync.WaitGroup
		acked    = make([][]format.BlockID, n)
		firstErr error
		wg       sync.WaitGroup
	)
	for k, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := engines[(k+1)%n]
			buf := make([][]byte, cfg.batch)
			for i := range buf {
				buf[i] = devio.AlignedBuffer(int(res.BlockBytes))
			}
			for lo := 0; lo < env.blocks; lo += cfg.batch {
				hi := min(env.blocks, lo+cfg.batch)
				ids := make([]format.BlockID, hi-lo)
				for i := range ids {
					ids[i] = blockID(k*env.blocks + lo + i)
					env.payload.fill(buf[i], ids[i])
				}
				t := e.Dump(ids, buf[:len(ids)])
				_ = t.Wait() // each block's outcome is in BlockErrors
				done := time.Now()
				for i, err := range t.BlockErrors() {
					switch {
					case err == nil:
						mu.Lock()
						acked[k] = append(acked[k], ids[i])
						mu.Unlock()
						atomic.AddInt64(&sb.Acked, 1)
					case errors.Is(err, engine.ErrNoSpace):
						atomic.AddInt64(&sb.Refused, 1)
					default:
						mu.Lock()
						firstErr = cmp.Or(firstErr, fmt.Errorf("instance %d: dump of block %s: %w", k, ids[i], err))
						mu.Unlock()
						return
					}
				}
				if t.BlockErrors()[0] == nil && n > 1 {
					visWG.Add(1)
					go func(id format.BlockID) { // how soon the next instance finds it
						defer visWG.Done()
						for deadline := done.Add(visibilityWait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
							if next.Lookup([]format.BlockID{id})[0] {
								mu.Lock()
								vis = append(vis, time.Since(done))
								mu.Unlock()
								return
							}
						}
					}(ids[0])
				}
			}
		}()
	}
	wg.Wait()
	visWG.Wait()
	close(stop)
	<-sampled
	if firstErr != nil {
		return firstErr
	}
	slices.Sort(vis)
	sb.VisibilityN = len(vis)
	if len(vis) > 0 {
		sb.VisibilityP50Ms, sb.VisibilityP99Ms = percentileMs(vis, 0.5), percentileMs(vis, 0.99)
	}
	if sb.PeakBytes > sb.BoundBytes {
		return fmt.Errorf("the shared volume held %d bytes at its peak, above the bound %d (capacity %d + %d instances × %d-byte segments)",
			sb.PeakBytes, sb.BoundBytes, sb.CapacityBytes, n, sb.SegmentBytes)
	}
	if err := sb.lookupAndVerify(engines, acked, res.BlockBytes, env.payload); err != nil {
		return err
	}
	res.Verified = true
	return nil
}

// lookupAndVerify has every instance look up every acknowledged block at once, then loads up to
// 64 hits of each writer's from the next instance and checks their bytes.
func (sb *sharedBench) lookupAndVerify(engines []*engine.Engine, acked [][]format.BlockID, blockBytes int64, p *payloadPool) error {
	var all []format.BlockID
	for _, ids := range acked {
		all = append(all, ids...)
	}
	if len(all) == 0 {
		return errors.New("no block was acknowledged")
	}
	var hits atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := 0; lo < len(all); lo += 1024 {
				for _, h := range e.Lookup(all[lo:min(len(all), lo+1024)]) {
					if h {
						hits.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	looked := len(all) * len(engines)
	sb.LookupsPerSec = float64(looked) / time.Since(start).Seconds()
	sb.HitFraction = float64(hits.Load()) / float64(looked)
	for k, ids := range acked {
		reader := engines[(k+1)%len(engines)]
		hit := reader.Lookup(ids)
		var sample []format.BlockID
		for i, h := range hit {
			if h && len(sample) < 64 {
				sample = append(sample, ids[i])
			}
		}
		if len(sample) == 0 {
			continue
		}
		dst := make([][]byte, len(sample))
		for i := range dst {
			dst[i] = devio.AlignedBuffer(int(blockBytes))
		}
		t := reader.Load(sample, dst)
		_ = t.Wait() // each block's outcome is in BlockErrors
		for i, err := range t.BlockErrors() {
			switch {
			case errors.Is(err, engine.ErrNotFound):
				continue // reclaimed since the lookup
			case err != nil:
				return fmt.Errorf("instance %d loading block %s of instance %d: %w", (k+1)%len(engines), sample[i], k, err)
			}
			if err := p.check(dst[i], sample[i]); err != nil {
				return fmt.Errorf("instance %d loaded block %s of instance %d: %w", (k+1)%len(engines), sample[i], k, err)
			}
			sb.Verified++
		}
	}
	return nil
}

// dirBytes sums the sizes of the files under dir (a file deleted during the walk counts 0).
func dirBytes(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			total += info.Size()
		}
		return nil
	})
	return total
}

// printShared prints what the shared-capacity workload measured: the bytes on the volume at
// up to 12 points of the run, then the peak against the bound.
func printShared(row func(k, format string, args ...any), s *sharedBench) {
	row("instances", "%d sharing one tier of %s (segments of %s)", s.Instances, cliutil.HumanBytes(s.CapacityBytes), cliutil.HumanBytes(s.SegmentBytes))
	row("blocks", "%d acknowledged, %d refused for lack of room (ErrNoSpace)", s.Acked, s.Refused)
	step := max(1, len(s.Samples)/12)
	for i := 0; i < len(s.Samples); i += step {
		v := s.Samples[i]
		row(fmt.Sprintf("  at %.2f s", v.Seconds), "%s on the volume (%.2f × capacity)", cliutil.HumanBytes(v.Bytes), float64(v.Bytes)/float64(s.CapacityBytes))
	}
	row("peak", "%s on the volume (%.2f × capacity); bound %s = capacity + %d × one segment", cliutil.HumanBytes(s.PeakBytes),
		float64(s.PeakBytes)/float64(s.CapacityBytes), cliutil.HumanBytes(s.BoundBytes), s.Instances)
	if s.VisibilityN > 0 {
		row("visibility", "p50 %.1f ms, p99 %.1f ms from a dump's Wait to the next instance's first hit (%d dumps)", s.VisibilityP50Ms, s.VisibilityP99Ms, s.VisibilityN)
	}
	row("lookups", "%.1f M ids/s across the %d instances (%.0f%% hits: the rest were reclaimed to hold the capacity)", s.LookupsPerSec/1e6, s.Instances, 100*s.HitFraction)
	row("verified", "%d hits loaded from another instance than their writer, byte-exact", s.Verified)
}
