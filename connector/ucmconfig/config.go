package ucmconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
	"gopkg.in/yaml.v3"
)

// Config is a UCM YAML configuration, as UCM users write it, plus UCM-Go's own store keys:
//
//	ucm_connectors:
//	  - ucm_connector_name: UcmPosixStore
//	    ucm_connector_config:
//	      storage_backends: /mnt/ssd/ucm     # a path, "a:b" or a list; the first is the store
//	      io_direct: true                    # O_DIRECT on (false: off; absent: auto)
//	      block_size: 2097152                # bytes of a whole block; checked against the layout
//	      posix_io_engine: aio               # psync | aio (= io_uring)
//	      posix_data_trans_concurrency: 128  # I/O queue depth
//	      timeout_ms: 30000
//	      segment_size: 256MiB               # UCM-Go keys from here
//	      sync_policy: always                # always | interval | none
//	      sync_interval_ms: 100
//	      io_engine: auto                    # auto | uring | psync (wins over posix_io_engine)
//	      queue_depth: 64                    # wins over posix_data_trans_concurrency
//	      max_staging_bytes: 1GiB
//	      max_batch_bytes: 64MiB             # one layer-major batch record of a layer-wise dump
//	      stage_layer_wise: false            # true: layer-wise dumps assemble block records
//	      posix_capacity_gb: 1024                # UCM: capacity of the store (see Tiers below)
//	      posix_gc_trigger_threshold_ratio: 0.7  # UCM: reclamation starts above this fill ratio
//	      posix_gc_recycle_percent: 0.1          # UCM: and frees this share of the capacity
//	ucm_sparse_config: {...}                 # kept for the sparse package
//
// Tiers (engine.Options.Tiers, docs/tiers.md). UCM-Go's own key tiers lists them fastest first,
// each with the keys of tiers.Config (name, kind, paths, capacity, high_watermark, low_watermark,
// io_engine, direct_io, compression; capacity takes a size with a unit, like every size here):
//
//	tiers:
//	  - {name: dram, kind: memory, capacity: 64GiB}
//	  - {name: ssd, kind: disk, paths: [/mnt/nvme0/ucm, /mnt/nvme1/ucm], capacity: 3TiB}
//	  - {name: nfs, kind: disk, paths: [/mnt/nfs/ucm]}   # capacity 0: unlimited
//
// A list tiers.Validate rejects is an error naming the tier. Without tiers, UCM's posix_capacity_gb
// (GiB, 2^30 bytes, as UCM counts it) makes one disk tier named "disk" whose paths are
// storage_backends, with that capacity; its high watermark is posix_gc_trigger_threshold_ratio
// (UCM's default 0.7 when absent) and its low watermark that minus posix_gc_recycle_percent (UCM's
// default 0.1). posix_capacity_gb with tiers is an error (say the capacity in the list). Without
// either, the store is one unlimited disk tier in the store directory. UCM's
// cache_buffer_capacity_gb (GiB; the Cache|Posix pipeline) puts a memory tier named "cache" of that
// size in front (with tiers: an error, list it there). posix_gc_check_interval_sec is
// engine.Options.CompactInterval (online compaction; UCM's default 30). posix_gc_enable and the GC
// keys without a capacity are accepted and ignored: a tier with a capacity is always reclaimed,
// continuously.
//
// The store directory (index, lock) is the first of storage_backends, or, when it is empty and
// tiers are given, the first path of the first disk tier.
//
// Every key UCM's stores, pipeline, connectors and examples pass is accepted (UCMKeys lists
// them, with what UCM means and what UCM-Go does with each); those that select nothing here
// are named by Unused, for the opener to log once. Any other key is an error naming the key,
// its line and the closest known key (a typo must not silently select a default).
// Numbers are taken exactly: a fraction where a whole number belongs (queue_depth: 1.5), a
// value beyond what the key's field holds or what it is converted to (timeout_ms past the
// milliseconds of a time.Duration, posix_capacity_gb past the GiB whose bytes fit an int64),
// NaN or an infinity is an error naming the key, its line and the value as written.
// Environment overrides (ApplyEnv): UCM_STORAGE_PATH, UCM_BLOCK_SIZE, UCM_IO_DIRECT,
// UCM_LOG_LEVEL, UCM_COMPRESSION, ENABLE_SPARSE, UCM_SPARSE_TYPE.
type Config struct {
	Connectors   []ConnectorConfig    `yaml:"ucm_connectors"`
	SparseConfig map[string]yaml.Node `yaml:"ucm_sparse_config"`
	// MetricsConfigPath is UCM's metrics configuration file (metrics_configs.yaml): the
	// connector exports the ucm: histograms it lists with its buckets (connector.Metrics).
	MetricsConfigPath string `yaml:"metrics_config_path"`
	// Other holds the top-level UCM keys with no effect in the store (UCMKeys: enable_event_sync,
	// use_layerwise, hit_ratio, ...): accepted, type-checked, and named by Unused. Any other
	// key is an error naming it.
	Other map[string]yaml.Node `yaml:",inline"`
	// EnableSparse and SparseType are read from ENABLE_SPARSE and UCM_SPARSE_TYPE (ApplyEnv):
	// the sparse method UCM's connector would enable, for the sparse package.
	EnableSparse bool   `yaml:"-"`
	SparseType   string `yaml:"-"`
	// LogLevel is set by UCM_LOG_LEVEL (debug, info, warn, error); default info.
	LogLevel slog.Level `yaml:"-"`
}

// ConnectorConfig is one entry of ucm_connectors.
type ConnectorConfig struct {
	Name string `yaml:"ucm_connector_name"`
	// ModulePath is UCM's ucm_connector_module_path (the Python module of the store class).
	ModulePath string          `yaml:"ucm_connector_module_path"`
	Config     ConnectorParams `yaml:"ucm_connector_config"`
}

// ConnectorParams are the keys of ucm_connector_config.
type ConnectorParams struct {
	StorageBackends Paths `yaml:"storage_backends"`
	IODirect        *bool `yaml:"io_direct"`
	BlockSize       Size  `yaml:"block_size"`
	// UCM PosixStore keys.
	PosixIOEngine             string `yaml:"posix_io_engine"`
	PosixDataTransConcurrency int    `yaml:"posix_data_trans_concurrency"`
	TimeoutMs                 int    `yaml:"timeout_ms"`
	// UCM's capacity and GC keys (see Config: they make the default disk tier).
	PosixCapacityGB              float64 `yaml:"posix_capacity_gb"`
	PosixGCTriggerThresholdRatio float64 `yaml:"posix_gc_trigger_threshold_ratio"`
	PosixGCRecyclePercent        float64 `yaml:"posix_gc_recycle_percent"`
	PosixGCCheckIntervalSec      int     `yaml:"posix_gc_check_interval_sec"`
	CacheBufferCapacityGB        float64 `yaml:"cache_buffer_capacity_gb"`
	// UseDirect is io_direct's older name (UCM's V0 stores and its sparse and blend examples):
	// it counts when io_direct is absent.
	UseDirect *bool `yaml:"use_direct"`
	// StorePipeline is UCM's store_pipeline: "Posix" or "Ds3fs" (a disk tier on the path),
	// "Cache|Posix" or "Cache|Ds3fs" (a memory tier in front: cache_buffer_capacity_gb, by
	// default a quarter of the host's memory, at most UCM's 256 GiB), "Empty" (a store that
	// keeps nothing: PipelineEmpty) or "Cache|Empty" (a host-memory cache alone, on tmpfs:
	// PipelineCacheEmpty). Absent: as Posix.
	StorePipeline string `yaml:"store_pipeline"`
	// Keys UCM's connector adds to the store's configuration (ucm_connector.py _create_store):
	// the transfer shape (tensor_size or tensor_size_list: bytes behind each address of a
	// shard; shard_size; block_size) and the worker's identity. The connector package turns
	// them into the store's engine.Layout; device_id < 0 or absent is the scheduler, which only looks
	// up. unique_id and share_buffer_enable name and share a Cache|Empty store (SharedCache).
	UniqueID          string  `yaml:"unique_id"`
	DeviceID          *int    `yaml:"device_id"`
	TensorSize        Size    `yaml:"tensor_size"`
	TensorSizeList    []int64 `yaml:"tensor_size_list"`
	ShardSize         Size    `yaml:"shard_size"`
	ShareBufferEnable *bool   `yaml:"share_buffer_enable"`
	// UCM-Go connector keys: what the KV bytes are (the store's Schema: model, kv_dtype,
	// tp_size, block_tokens, kv_layout; a store refuses bytes written under another one), the
	// process's instance name on shared backends, and the metrics endpoint (metrics_port: 0 off;
	// metrics_address: default 127.0.0.1; model_name: the model_name label, default model).
	Model          string `yaml:"model"`
	KVDType        string `yaml:"kv_dtype"`
	TPSize         int    `yaml:"tp_size"`
	BlockTokens    int    `yaml:"block_tokens"`
	KVLayout       string `yaml:"kv_layout"`
	Instance       string `yaml:"instance"`
	MetricsPort    int    `yaml:"metrics_port"`
	MetricsAddress string `yaml:"metrics_address"`
	ModelName      string `yaml:"model_name"`
	// UCM-Go store keys.
	SegmentSize     Size   `yaml:"segment_size"`
	SyncPolicy      string `yaml:"sync_policy"`
	SyncIntervalMs  int    `yaml:"sync_interval_ms"`
	IOEngine        string `yaml:"io_engine"`
	QueueDepth      int    `yaml:"queue_depth"`
	MaxStagingBytes Size   `yaml:"max_staging_bytes"`
	// StageLayerWise and MaxBatchBytes: engine.Options.StageLayerWise and MaxBatchBytes.
	StageLayerWise bool `yaml:"stage_layer_wise"`
	MaxBatchBytes  Size `yaml:"max_batch_bytes"`
	// Compression: "off" (default) or "lz4"; CompressMinSaving: engine.Options.CompressMinSaving.
	Compression       string  `yaml:"compression"`
	CompressMinSaving float64 `yaml:"compress_min_saving"`
	// FileMode and DirMode: engine.Options.FileMode and DirMode as octal strings ("0640", "0750").
	FileMode string `yaml:"file_mode"`
	DirMode  string `yaml:"dir_mode"`
	// Tiers is engine.Options.Tiers (see Config).
	Tiers TierList `yaml:"tiers"`
	// Other holds the UCM keys with no effect in UCM-Go (UCMKeys: posix_lookup_concurrency,
	// waiting_queue_depth, cpu_affinity_cores, ...): accepted, type-checked, and named by
	// Unused. Any other key is an error naming it (and the closest known key).
	Other map[string]yaml.Node `yaml:",inline"`
}

// parseMode parses an octal permission string ("0640"); "" is 0 (the default).
func parseMode(key, s string, dir bool) (os.FileMode, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(s), "0o"), 8, 32)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want octal permissions such as 0640: %w", key, s, engine.ErrInvalidArgument)
	}
	if err := engine.ValidateMode(os.FileMode(v), dir); err != nil {
		return 0, fmt.Errorf("%s %q: %w: %w", key, s, err, engine.ErrInvalidArgument)
	}
	return os.FileMode(v), nil
}

// UCM's defaults for its GC keys when posix_capacity_gb is set.
const (
	ucmGCTriggerRatio  = 0.7
	ucmGCRecyclePart   = 0.1
	ucmCapacityUnit    = 1 << 30 // posix_capacity_gb counts GiB
	ucmDefaultCacheGB  = 256     // CacheStore's cache_buffer_capacity_gb default
	defaultDiskTierKey = "disk"
	// defaultMemoryTierKey names the memory tier UCM's cache_buffer_capacity_gb makes.
	defaultMemoryTierKey = "cache"
)

// TierList is a tier list in YAML: a sequence of mappings with the keys of tiers.Config, whose
// capacity takes a size with a unit. Unknown keys are errors naming them.
type TierList []tiers.Config

// tierKeys are the YAML keys of tiers.Config.
var tierKeys = func() map[string]bool {
	keys := map[string]bool{}
	t := reflect.TypeOf(tiers.Config{})
	for i := 0; i < t.NumField(); i++ {
		if k, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); k != "" && k != "-" {
			keys[k] = true
		}
	}
	return keys
}()

// UnmarshalYAML decodes the list strictly.
func (l *TierList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode {
		return fmt.Errorf("line %d: tiers: want a list of tiers: %w", n.Line, engine.ErrInvalidArgument)
	}
	out := make(TierList, 0, len(n.Content))
	for i, item := range n.Content {
		if item.Kind != yaml.MappingNode {
			return fmt.Errorf("line %d: tiers[%d]: want a mapping (name, kind, paths, capacity, ...): %w", item.Line, i, engine.ErrInvalidArgument)
		}
		for k := 0; k+1 < len(item.Content); k += 2 {
			key, val := item.Content[k], item.Content[k+1]
			if !tierKeys[key.Value] {
				return fmt.Errorf("line %d: tiers[%d]: unknown key %q: %w", key.Line, i, key.Value, engine.ErrInvalidArgument)
			}
			if spec, ok := tierNumbers[key.Value]; ok {
				if err := spec.checkNode(key.Value, val); err != nil {
					return fmt.Errorf("tiers[%d]: %w: %w", i, err, engine.ErrInvalidArgument)
				}
			}
			if key.Value == "capacity" && val.Kind == yaml.ScalarNode {
				v, err := ParseSize(val.Value)
				if err != nil {
					return fmt.Errorf("line %d: tiers[%d].capacity: %w", val.Line, i, err)
				}
				val.Value, val.Tag = strconv.FormatInt(v, 10), "!!int"
			}
			if key.Value == "mooncake" {
				if err := normalizeMooncakeYAML(val, i); err != nil {
					return err
				}
				if err := checkMooncakeNumbers(val, i); err != nil {
					return err
				}
			}
		}
		var c tiers.Config
		if err := item.Decode(&c); err != nil {
			return fmt.Errorf("tiers[%d]: %w", i, err)
		}
		out = append(out, c)
	}
	*l = out
	return nil
}

// defaultDiskTier is the tier UCM's posix_capacity_gb describes (ok false without it).
func defaultDiskTier(p ConnectorParams) (tiers.Config, bool) {
	if p.PosixCapacityGB <= 0 {
		return tiers.Config{}, false
	}
	high := p.PosixGCTriggerThresholdRatio
	if high == 0 {
		high = ucmGCTriggerRatio
	}
	recycle := p.PosixGCRecyclePercent
	if recycle == 0 {
		recycle = ucmGCRecyclePart
	}
	return tiers.Config{Name: defaultDiskTierKey, Kind: tiers.KindDisk, Paths: append([]string(nil), p.StorageBackends...),
		Capacity: int64(math.Round(p.PosixCapacityGB * ucmCapacityUnit)), HighWatermark: high, LowWatermark: high - recycle}, true
}

// connectorTiers returns engine.Options.Tiers for a connector: its tiers, or the default disk tier,
// or nil (one unlimited tier in the store directory).
func connectorTiers(p ConnectorParams) []tiers.Config {
	if len(p.Tiers) > 0 {
		return p.Tiers
	}
	switch {
	case p.KeepsNothing():
		return nil
	case p.CacheOnly():
		if len(p.StorageBackends) == 0 {
			return nil // the opener names the tmpfs directory
		}
		return []tiers.Config{{Name: defaultMemoryTierKey, Kind: tiers.KindDisk, Paths: append([]string(nil), p.StorageBackends...),
			Capacity: cacheCapacity(p)}}
	}
	var out []tiers.Config
	if p.CacheBufferCapacityGB > 0 || strings.HasPrefix(p.StorePipeline, "Cache|") {
		// UCM's Cache|Posix pipeline: a memory tier in front.
		out = append(out, tiers.Config{Name: defaultMemoryTierKey, Kind: tiers.KindMemory, Capacity: cacheCapacity(p)})
	}
	if t, ok := defaultDiskTier(p); ok {
		out = append(out, t)
	} else if len(out) > 0 {
		out = append(out, tiers.Config{Name: defaultDiskTierKey, Kind: tiers.KindDisk, Paths: append([]string(nil), p.StorageBackends...)})
	}
	return out
}

// storePipelines are the values of UCM's store_pipeline the store serves ("Ds3fs" is a disk
// tier on a 3FS mount, as Posix is on any other).
var storePipelines = []string{"Posix", "Ds3fs", "Cache|Posix", "Cache|Ds3fs", PipelineEmpty, PipelineCacheEmpty}

// The store pipelines that keep no bytes on storage_backends.
const (
	// PipelineEmpty is UCM's Empty store: it keeps nothing. Dumps complete and store nothing,
	// lookups are false, loads fail per block as a miss does (the connector serves it).
	PipelineEmpty = "Empty"
	// PipelineCacheEmpty is UCM's host-memory cache alone: the opener puts the store on tmpfs
	// and names that directory as storage_backends; connectorTiers makes it one disk tier of
	// cache_buffer_capacity_gb, synced never (SharedCache says whether other processes share
	// it).
	PipelineCacheEmpty = "Cache|Empty"
)

// KeepsNothing reports whether the connector is UCM's Empty store.
func (p ConnectorParams) KeepsNothing() bool { return p.StorePipeline == PipelineEmpty }

// CacheOnly reports whether the connector is UCM's Cache|Empty: a host-memory cache alone.
func (p ConnectorParams) CacheOnly() bool { return p.StorePipeline == PipelineCacheEmpty }

// SharedCache reports whether a Cache|Empty store is shared by the processes of its unique_id,
// as UCM's cache store's buffer is: share_buffer_enable true or absent (the cache store's
// default), and a unique_id to name it.
func (p ConnectorParams) SharedCache() bool {
	return p.CacheOnly() && (p.ShareBufferEnable == nil || *p.ShareBufferEnable) && p.UniqueID != ""
}

// cacheCapacity is the memory tier's capacity for UCM's Cache pipeline: cache_buffer_capacity_gb,
// or, absent, UCM's 256 GiB default bounded by a quarter of the host's memory (a lazily filled
// cache that may outgrow the host would end in the OOM killer; UCM's preallocated /dev/shm
// buffer fails at start instead).
func cacheCapacity(p ConnectorParams) int64 {
	if p.CacheBufferCapacityGB > 0 {
		return int64(math.Round(p.CacheBufferCapacityGB * ucmCapacityUnit))
	}
	capacity := int64(ucmDefaultCacheGB * ucmCapacityUnit)
	if mem := devio.PhysicalMemory(); mem > 0 && mem/4 < capacity {
		capacity = mem / 4
	}
	return capacity
}

// Unused names the keys given that select nothing in UCM-Go (UCMKeys with no effect, and those
// the connector's store_pipeline ignores), so that an opener can log them once. Connector keys
// are named ucm_connectors[i].<key>.
func (c *Config) Unused() []string {
	out := sortedKeys(c.Other)
	for i, conn := range c.Connectors {
		p := conn.Config
		pre := fmt.Sprintf("ucm_connectors[%d].", i)
		add := func(given bool, key string) {
			if given {
				out = append(out, pre+key)
			}
		}
		add(conn.ModulePath != "", "ucm_connector_module_path")
		for _, k := range sortedKeys(p.Other) {
			add(true, k)
		}
		shared := p.SharedCache()
		add(p.UniqueID != "" && !shared, "unique_id")
		add(p.ShareBufferEnable != nil && !p.CacheOnly(), "share_buffer_enable")
		if p.KeepsNothing() || p.CacheOnly() {
			// Nothing is stored on storage_backends, and tmpfs has no O_DIRECT.
			add(len(p.StorageBackends) > 0, "storage_backends")
			add(p.IODirect != nil, "io_direct")
			add(p.UseDirect != nil, "use_direct")
			add(p.PosixCapacityGB != 0, "posix_capacity_gb")
			add(p.PosixGCTriggerThresholdRatio != 0, "posix_gc_trigger_threshold_ratio")
			add(p.PosixGCRecyclePercent != 0, "posix_gc_recycle_percent")
		} else {
			add(p.UseDirect != nil && p.IODirect != nil, "use_direct")
		}
		add(p.KeepsNothing() && p.CacheBufferCapacityGB != 0, "cache_buffer_capacity_gb")
	}
	return out
}

func sortedKeys(m map[string]yaml.Node) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Paths is a list of directories given as a YAML list or as one colon-separated string.
type Paths []string

// UnmarshalYAML accepts "a:b", "a" or [a, b].
func (p *Paths) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*p = splitPaths(n.Value)
		return nil
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		*p = list
		return nil
	}
	return fmt.Errorf("line %d: storage_backends: want a path, \"a:b\" or a list: %w", n.Line, engine.ErrInvalidArgument)
}

func splitPaths(s string) Paths {
	var out Paths
	for _, part := range strings.Split(s, ":") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// Size is a byte count written as an integer or with a binary unit (KiB, MiB, GiB, TiB; K, M,
// G, T mean the same).
type Size int64

// UnmarshalYAML parses an integer or a size with a unit.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*s = Size(v)
	return nil
}

// ParseSize parses a byte count: plain digits, or digits followed by K/KiB, M/MiB, G/GiB or
// T/TiB (binary units, case-insensitive). It rejects fractions, signs, overflow and decimal
// units (MB) that would be ambiguous.
func ParseSize(s string) (int64, error) {
	str := strings.TrimSpace(s)
	i := 0
	for i < len(str) && str[i] >= '0' && str[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q: want digits with an optional unit (KiB, MiB, GiB, TiB): %w", s, engine.ErrInvalidArgument)
	}
	if i < len(str) && (str[i] == '.' || str[i] == ',') {
		return 0, fmt.Errorf("size %q: not a whole number (write 1536MiB, not 1.5GiB): %w", s, engine.ErrInvalidArgument)
	}
	n, err := strconv.ParseInt(str[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q overflows: %w", s, engine.ErrInvalidArgument)
	}
	var shift uint
	switch strings.ToLower(strings.TrimSpace(str[i:])) {
	case "", "b":
	case "k", "kib":
		shift = 10
	case "m", "mib":
		shift = 20
	case "g", "gib":
		shift = 30
	case "t", "tib":
		shift = 40
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q (use KiB, MiB, GiB or TiB): %w", s, str[i:], engine.ErrInvalidArgument)
	}
	if n > (1<<63-1)>>shift {
		return 0, fmt.Errorf("size %q overflows: %w", s, engine.ErrInvalidArgument)
	}
	return n << shift, nil
}

// ParseConfig decodes a YAML configuration strictly: unknown keys, wrong types and bad values
// are errors naming the key and line.
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) == nil { // a syntax error is the decoder's to report
		if err := checkConnectorNumbers(&doc, data); err != nil {
			return nil, err
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config: %w: %s", engine.ErrInvalidArgument, quoteLines(err.Error(), data))
	}
	if err := checkExtraKeys(ScopeTop, "", c.Other, topFields, data); err != nil {
		return nil, err
	}
	for i, conn := range c.Connectors {
		where := fmt.Sprintf("ucm_connectors[%d].ucm_connector_config: ", i)
		if err := checkExtraKeys(ScopeConnector, where, conn.Config.Other, connectorFields, data); err != nil {
			return nil, err
		}
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// The YAML keys of the top level and of ucm_connector_config (for suggestions).
var (
	topFields       = yamlFields(Config{})
	connectorFields = yamlFields(ConnectorParams{})
)

var yamlLine = regexp.MustCompile(`line (\d+):`)

// quoteLines appends the source text of every line a YAML error message refers to, so the
// message names the key even where the decoder only gives a line number.
func quoteLines(msg string, data []byte) string {
	lines := strings.Split(string(data), "\n")
	return yamlLine.ReplaceAllStringFunc(msg, func(m string) string {
		n, err := strconv.Atoi(yamlLine.FindStringSubmatch(m)[1])
		if err != nil || n < 1 || n > len(lines) {
			return m
		}
		return fmt.Sprintf("line %d (%q):", n, strings.TrimSpace(lines[n-1]))
	})
}

// LoadConfig reads and parses a YAML configuration file, then applies the environment
// overrides from os.Getenv.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := c.ApplyEnv(os.Getenv); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// ApplyEnv applies UCM's environment overrides to the first connector (creating one if the
// file had none): UCM_STORAGE_PATH (paths, colon-separated), UCM_BLOCK_SIZE (a size),
// UCM_IO_DIRECT (true/false/1/0), UCM_LOG_LEVEL (debug, info, warn, error), UCM_COMPRESSION
// (off, lz4).
func (c *Config) ApplyEnv(getenv func(string) string) error {
	if len(c.Connectors) == 0 {
		c.Connectors = []ConnectorConfig{{Name: "UcmPosixStore"}}
	}
	p := &c.Connectors[0].Config
	if v := getenv("UCM_STORAGE_PATH"); v != "" {
		p.StorageBackends = splitPaths(v)
	}
	if v := getenv("UCM_BLOCK_SIZE"); v != "" {
		n, err := ParseSize(v)
		if err != nil {
			return fmt.Errorf("UCM_BLOCK_SIZE: %w", err)
		}
		p.BlockSize = Size(n)
	}
	if v := getenv("UCM_IO_DIRECT"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("UCM_IO_DIRECT=%q: want true or false: %w", v, engine.ErrInvalidArgument)
		}
		p.IODirect = &b
	}
	if v := getenv("UCM_COMPRESSION"); v != "" {
		if _, err := engine.ParseCompression(v); err != nil {
			return fmt.Errorf("UCM_COMPRESSION: %w", err)
		}
		p.Compression = v
	}
	if v := getenv("ENABLE_SPARSE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("ENABLE_SPARSE=%q: want true or false: %w", v, engine.ErrInvalidArgument)
		}
		c.EnableSparse = b
	}
	if v := getenv("UCM_SPARSE_TYPE"); v != "" {
		c.SparseType = v
		c.EnableSparse = true
	}
	if v := getenv("UCM_LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			return fmt.Errorf("UCM_LOG_LEVEL=%q: want debug, info, warn or error: %w", v, engine.ErrInvalidArgument)
		}
	}
	return c.validate()
}

func (c *Config) validate() error {
	for i, conn := range c.Connectors {
		p := conn.Config
		where := fmt.Sprintf("config: ucm_connectors[%d] (%s)", i, conn.Name)
		if err := checkParamNumbers(p); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if p.SyncPolicy != "" {
			if _, err := wal.ParseSyncPolicy(p.SyncPolicy); err != nil {
				return fmt.Errorf("%s: sync_policy: %w", where, err)
			}
		}
		if _, err := engine.ParseCompression(p.Compression); err != nil {
			return fmt.Errorf("%s: compression: %w", where, err)
		}
		if _, err := connectorIOEngine(p); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if p.StorePipeline != "" && !slices.Contains(storePipelines, p.StorePipeline) {
			return fmt.Errorf("%s: store_pipeline %q: want one of %s: %w", where, p.StorePipeline, strings.Join(storePipelines, ", "), engine.ErrInvalidArgument)
		}
		if err := validateTiers(p); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if _, err := parseMode("file_mode", p.FileMode, false); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if _, err := parseMode("dir_mode", p.DirMode, true); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// validateTiers checks the tier keys of a connector.
func validateTiers(p ConnectorParams) error {
	switch {
	case p.PosixCapacityGB < 0 || math.IsNaN(p.PosixCapacityGB) || math.IsInf(p.PosixCapacityGB, 0):
		return fmt.Errorf("posix_capacity_gb %v: want > 0 (absent or 0: unlimited): %w", p.PosixCapacityGB, engine.ErrInvalidArgument)
	case p.CacheBufferCapacityGB < 0 || math.IsNaN(p.CacheBufferCapacityGB) || math.IsInf(p.CacheBufferCapacityGB, 0):
		return fmt.Errorf("cache_buffer_capacity_gb %v: want > 0 (absent or 0: no memory tier): %w", p.CacheBufferCapacityGB, engine.ErrInvalidArgument)
	case len(p.Tiers) > 0 && (strings.HasPrefix(p.StorePipeline, "Cache|") || p.KeepsNothing()):
		return fmt.Errorf("store_pipeline %q and tiers both given: put the memory tier in the tier list: %w", p.StorePipeline, engine.ErrInvalidArgument)
	case len(p.Tiers) > 0 && p.CacheBufferCapacityGB > 0:
		return fmt.Errorf("cache_buffer_capacity_gb and tiers both given: put the memory tier in the tier list: %w", engine.ErrInvalidArgument)
	case p.PosixGCCheckIntervalSec < 0:
		return fmt.Errorf("posix_gc_check_interval_sec %d: want >= 0: %w", p.PosixGCCheckIntervalSec, engine.ErrInvalidArgument)
	case len(p.Tiers) > 0 && p.PosixCapacityGB > 0:
		return fmt.Errorf("posix_capacity_gb and tiers both given: set the capacity in the tier list: %w", engine.ErrInvalidArgument)
	case p.PosixCapacityGB > 0 && !(p.PosixGCTriggerThresholdRatio >= 0 && p.PosixGCTriggerThresholdRatio <= 1):
		return fmt.Errorf("posix_gc_trigger_threshold_ratio %v: want 0 < ratio <= 1: %w", p.PosixGCTriggerThresholdRatio, engine.ErrInvalidArgument)
	case p.PosixCapacityGB > 0 && !(p.PosixGCRecyclePercent >= 0 && p.PosixGCRecyclePercent < 1):
		return fmt.Errorf("posix_gc_recycle_percent %v: want 0 < share < 1: %w", p.PosixGCRecyclePercent, engine.ErrInvalidArgument)
	}
	ts := connectorTiers(p)
	if len(ts) == 0 {
		return nil
	}
	if len(p.Tiers) == 0 && len(p.StorageBackends) == 0 {
		return nil // UCM_STORAGE_PATH may still come (ApplyEnv); StoreOptions checks
	}
	if err := tiers.Validate(ts); err != nil {
		if len(p.Tiers) == 0 {
			var ce *tiers.ConfigError
			if errors.As(err, &ce) && strings.Contains(ce.Field, "watermark") {
				return fmt.Errorf("posix_gc_trigger_threshold_ratio %v with posix_gc_recycle_percent %v: %w: %w",
					p.PosixGCTriggerThresholdRatio, p.PosixGCRecyclePercent, engine.ErrInvalidArgument, err)
			}
			return fmt.Errorf("posix_capacity_gb: %w: %w", engine.ErrInvalidArgument, err)
		}
		return fmt.Errorf("%w: %w", err, engine.ErrInvalidArgument)
	}
	return nil
}

func connectorIOEngine(p ConnectorParams) (devio.IOEngine, error) {
	if p.IOEngine != "" {
		e, err := devio.ParseIOEngine(p.IOEngine)
		if err != nil {
			return 0, fmt.Errorf("io_engine: %w: %w", engine.ErrInvalidArgument, err)
		}
		return e, nil
	}
	switch strings.ToLower(p.PosixIOEngine) {
	case "":
		return devio.EngineAuto, nil
	case "psync":
		return devio.EnginePsync, nil
	case "aio", "uring", "io_uring":
		return devio.EngineURing, nil
	}
	return 0, fmt.Errorf("posix_io_engine %q: want psync or aio: %w", p.PosixIOEngine, engine.ErrInvalidArgument)
}

// StoreOptions turns the first connector into the store directory and engine.Options for
// engine.Open. The caller fills opts.Layout and opts.Schema (they come from the model the
// connector serves); if the config names a block_size it must equal Layout.BlockBytes(),
// which the opener checks with CheckBlockSize.
func (c *Config) StoreOptions() (dir string, opts engine.Options, err error) {
	if len(c.Connectors) == 0 {
		return "", opts, fmt.Errorf("config: no ucm_connectors and no UCM_STORAGE_PATH: %w", engine.ErrInvalidArgument)
	}
	p := c.Connectors[0].Config
	dir = ""
	if len(p.StorageBackends) > 0 {
		dir = p.StorageBackends[0]
	} else {
		for _, t := range p.Tiers {
			if t.Kind == tiers.KindDisk && len(t.Paths) > 0 {
				dir = t.Paths[0]
				break
			}
		}
	}
	if dir == "" {
		return "", opts, fmt.Errorf("config: ucm_connectors[0].ucm_connector_config.storage_backends is empty: %w", engine.ErrInvalidArgument)
	}
	opts.Tiers = connectorTiers(p)
	opts.CompactInterval = time.Duration(p.PosixGCCheckIntervalSec) * time.Second
	opts.IOEngine, _ = connectorIOEngine(p) // validated at parse
	direct := p.IODirect
	if direct == nil {
		direct = p.UseDirect
	}
	switch {
	case p.CacheOnly():
		opts.DirectIO = devio.DirectOff // tmpfs
	case direct == nil:
		opts.DirectIO = devio.DirectAuto
	case *direct:
		opts.DirectIO = devio.DirectOn
	default:
		opts.DirectIO = devio.DirectOff
	}
	opts.SegmentSize = int64(p.SegmentSize)
	if p.SyncPolicy != "" {
		opts.SyncPolicy, _ = wal.ParseSyncPolicy(p.SyncPolicy)
	} else if p.CacheOnly() {
		opts.SyncPolicy = wal.SyncNone // a memory cache: nothing survives a reboot anyway
	}
	opts.SyncInterval = time.Duration(p.SyncIntervalMs) * time.Millisecond
	opts.QueueDepth = p.QueueDepth
	if opts.QueueDepth == 0 {
		opts.QueueDepth = p.PosixDataTransConcurrency
	}
	opts.TaskTimeout = time.Duration(p.TimeoutMs) * time.Millisecond
	opts.MaxStagingBytes = int64(p.MaxStagingBytes)
	opts.StageLayerWise = p.StageLayerWise
	opts.MaxBatchBytes = int64(p.MaxBatchBytes)
	opts.Compression, _ = engine.ParseCompression(p.Compression) // validated at parse
	opts.CompressMinSaving = p.CompressMinSaving
	opts.FileMode, _ = parseMode("file_mode", p.FileMode, false) // validated at parse
	opts.DirMode, _ = parseMode("dir_mode", p.DirMode, true)
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel}))
	return dir, opts, nil
}

// CheckBlockSize reports whether the configured block_size (if any) matches the layout.
func (c *Config) CheckBlockSize(l engine.Layout) error {
	if len(c.Connectors) == 0 || c.Connectors[0].Config.BlockSize == 0 {
		return nil
	}
	if got := int64(c.Connectors[0].Config.BlockSize); got != l.BlockBytes() {
		return fmt.Errorf("config: block_size %d but the layout's blocks are %d bytes: %w", got, l.BlockBytes(), engine.ErrInvalidArgument)
	}
	return nil
}
