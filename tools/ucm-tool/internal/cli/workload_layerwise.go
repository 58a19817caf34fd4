package cli

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
)

// layerwiseWorkload dumps and loads one shard per task, as a layer-wise connector does: the
// blocks are split into groups of `batch`; each group is dumped shard by shard (all of its
// shard tasks issued, then waited for), `concurrency` groups at a time. After a timed reopen,
// every (group, shard) pair is loaded with one LoadShard task, in a random order across
// groups and shards, `concurrency` tasks in flight, checking every page's stamp; finally
// (untimed) every block is loaded whole and compared byte for byte.
type layerwiseWorkload struct{}

func (layerwiseWorkload) name() string { return "layerwise" }

func (layerwiseWorkload) defaults() map[string]string { return nil }

func (layerwiseWorkload) blocks(cfg benchConfig, l format.Layout) (int, error) {
	return totalBlocks(cfg, l)
}

func (layerwiseWorkload) run(env *benchEnv, res *benchResult) error {
	cfg := env.cfg
	e, _, err := env.open()
	if err != nil {
		return err
	}
	res.IOEngine, res.Direct = e.IOEngine()
	l := e.Layout()
	groups := (env.blocks + cfg.batch - 1) / cfg.batch
	group := func(g int) []format.BlockID {
		ids := make([]format.BlockID, 0, cfg.batch)
		for i := g * cfg.batch; i < min(env.blocks, (g+1)*cfg.batch); i++ {
			ids = append(ids, blockID(i))
		}
		return ids
	}

	// Phase 1: dump, shard by shard.
	blockBufs, release, err := env.workerBuffers(cfg.batch, l.BlockBytes())
	if err != nil {
		_ = e.Close()
		return err
	}
	defer release()
	dumpTime, err := parallel(groups, cfg.concurrency, func(w, g int) error {
		ids := group(g)
		for j, id := range ids {
			env.payload.fill(blockBufs[w][j], id)
		}
		tasks := make([]*engine.Task, l.Shards)
		for s := range l.Shards {
			src := make([][]byte, len(ids))
			for j := range ids {
				src[j] = blockBufs[w][j][int64(s)*l.ShardBytes : int64(s+1)*l.ShardBytes]
			}
			tasks[s] = e.DumpShard(ids, s, src)
		}
		var first error
		for _, t := range tasks {
			if err := t.Wait(); err != nil && first == nil {
				first = err
			}
		}
		return first
	})
	// Phase 2: reopen (timed), load (group, shard) pairs in random order.
	e, err = env.reopenAfterDump(e, err, res, dumpTime)
	if err != nil {
		return err
	}
	defer func() { _ = e.Close() }()
	if !res.Direct {
		res.CachesDropped = dropCaches()
	}
	units := make([]int32, groups*l.Shards) // g*shards + s
	for i := range units {
		units[i] = int32(i)
	}
	rand.New(rand.NewPCG(cfg.seed, 0x6c61796572)).Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
	shardBufs, releaseShards, err := env.workerBuffers(cfg.batch, l.ShardBytes)
	if err != nil {
		return err
	}
	defer releaseShards()
	var mismatch atomic.Pointer[error]
	loadTime, err := parallel(len(units), cfg.concurrency, func(w, u int) error {
		g, s := int(units[u])/l.Shards, int(units[u])%l.Shards
		ids := group(g)
		dst := shardBufs[w][:len(ids)]
		if err := e.LoadShard(ids, s, dst).Wait(); err != nil {
			return err
		}
		for j, id := range ids {
			if err := env.payload.checkStamps(dst[j], id, int64(s)*l.ShardBytes); err != nil {
				err = fmt.Errorf("shard %d: %w", s, err)
				mismatch.CompareAndSwap(nil, &err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	res.LoadMBps = mbps(res.TotalBytes, loadTime)
	res.loadTime = loadTime
	if err := verifyAll(env, e, &mismatch); err != nil {
		return err
	}
	if p := mismatch.Load(); p != nil {
		res.mismatch = (*p).Error()
		return nil
	}
	res.Verified = true
	return nil
}
