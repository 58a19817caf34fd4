package cli

import (
	"math"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tiers"
)

// benchDefaults sets bench flags the user did not set from the configuration: the directory,
// block and shard sizes, I/O engine, O_DIRECT, sync policy, segment size, queue depth,
// compression and the capacities of UCM's posix_capacity_gb and cache_buffer_capacity_gb.
// Flags the workload gives its own default (workload) keep it.
func benchDefaults(c *cliutil.Config, fl *pflag.FlagSet, workload map[string]string) error {
	cfg, err := c.Load()
	if err != nil || cfg == nil {
		return err
	}
	dir, opts, err := cfg.StoreOptions()
	if err != nil {
		return cliutil.UsageErr("--config %s: %v", c.Path, err)
	}
	p := cfg.Connectors[0].Config
	set := map[string]string{"dir": dir}
	if p.BlockSize > 0 {
		set["block-size"] = strconv.FormatInt(int64(p.BlockSize), 10)
		if p.ShardSize > 0 && int64(p.BlockSize)%int64(p.ShardSize) == 0 {
			set["shards"] = strconv.FormatInt(int64(p.BlockSize)/int64(p.ShardSize), 10)
		}
	}
	set["io-engine"] = opts.IOEngine.String()
	set["direct"] = opts.DirectIO.String()
	if p.SyncPolicy != "" {
		set["sync"] = p.SyncPolicy
	}
	if opts.SegmentSize > 0 {
		set["segment-size"] = strconv.FormatInt(opts.SegmentSize, 10)
	}
	if opts.QueueDepth > 0 {
		set["queue-depth"] = strconv.Itoa(opts.QueueDepth)
	}
	if p.Compression != "" {
		set["compression"] = p.Compression
	}
	if p.PosixCapacityGB > 0 {
		set["capacity"] = strconv.FormatInt(int64(math.Round(p.PosixCapacityGB*(1<<30))), 10)
	}
	for _, t := range opts.Tiers {
		if t.Kind == tiers.KindMemory {
			set["memory"] = strconv.FormatInt(t.Capacity, 10)
		}
	}
	for name, val := range set {
		if _, own := workload[name]; own || fl.Changed(name) {
			continue
		}
		if err := fl.Set(name, val); err != nil {
			return cliutil.UsageErr("--config %s: %s=%s: %v", c.Path, name, val, err)
		}
	}
	return nil
}
