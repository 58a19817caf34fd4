package cli

import (
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/tiers"
)

// toolConfig holds the persistent --config and --instance flags: the YAML configuration the
// engine runs with (UCM's file or UCM-Go's keys; default $UCM_CONFIG_FILE) tells every command
// where the store is, and bench what to build.
type toolConfig struct {
	path     string
	instance string
}

func (c *toolConfig) register(root *cobra.Command) {
	fl := root.PersistentFlags()
	fl.StringVar(&c.path, "config", os.Getenv("UCM_CONFIG_FILE"),
		"the engine's YAML configuration (UCM's file, or UCM-Go keys; default $UCM_CONFIG_FILE): the store directory when DIR is omitted, and bench's defaults")
	fl.StringVar(&c.instance, "instance", "",
		"with --config: the instance store of a process sharing storage_backends (<storage_backends[0]>/stores/<layout namespace>/NAME, as the connector names them)")
}

// load parses the configuration (nil without --config).
func (c *toolConfig) load() (*ucmconfig.Config, error) {
	if c.path == "" {
		if c.instance != "" {
			return nil, usageErr("--instance needs --config")
		}
		return nil, nil
	}
	cfg, err := ucmconfig.LoadConfig(c.path)
	if err != nil {
		return nil, usageErr("--config: %v", err)
	}
	return cfg, nil
}

// storeDir returns the store a command works on: its DIR argument, else the configuration's
// store directory (with --instance, that process's instance store).
func (c *toolConfig) storeDir(args []string) (string, error) {
	cfg, err := c.load()
	if err != nil {
		return "", err
	}
	if len(args) == 1 {
		return args[0], nil
	}
	if cfg == nil {
		return "", usageErr("no store: give DIR, or --config FILE (or set UCM_CONFIG_FILE)")
	}
	if c.instance == "" {
		dir, _, err := cfg.StoreOptions()
		if err != nil {
			return "", usageErr("--config %s: %v", c.path, err)
		}
		return dir, nil
	}
	// The instance's stores, one per layout it ran with; the command adopts the stored schema.
	dirs, err := cfg.InstanceStores(c.instance)
	if err != nil {
		return "", usageErr("--config %s: %v", c.path, err)
	}
	switch len(dirs) {
	case 1:
		return dirs[0], nil
	default:
		return "", usageErr("--config %s --instance %s: the instance has a store per layout; give one as DIR: %s",
			c.path, c.instance, strings.Join(dirs, " "))
	}
}

// benchDefaults sets bench flags the user did not set from the configuration: the directory,
// block and shard sizes, I/O engine, O_DIRECT, sync policy, segment size, queue depth,
// compression and the capacities of UCM's posix_capacity_gb and cache_buffer_capacity_gb.
// Flags the workload gives its own default (workload) keep it.
func (c *toolConfig) benchDefaults(fl *pflag.FlagSet, workload map[string]string) error {
	cfg, err := c.load()
	if err != nil || cfg == nil {
		return err
	}
	dir, opts, err := cfg.StoreOptions()
	if err != nil {
		return usageErr("--config %s: %v", c.path, err)
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
			return usageErr("--config %s: %s=%s: %v", c.path, name, val, err)
		}
	}
	return nil
}
