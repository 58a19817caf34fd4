package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ucm-go/ucm/devio"
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
//	ucm_sparse_config: {...}                 # kept for the sparse package
//
// Unknown keys are errors naming the key (a typo must not silently select a default). UCM keys
// that belong to later parts of the engine (stream_number, buffer_number, GC and cache keys) are
// accepted and recorded. Environment overrides (ApplyEnv): UCM_STORAGE_PATH, UCM_BLOCK_SIZE,
// UCM_IO_DIRECT, UCM_LOG_LEVEL.
type Config struct {
	Connectors        []ConnectorConfig    `yaml:"ucm_connectors"`
	SparseConfig      map[string]yaml.Node `yaml:"ucm_sparse_config"`
	LoadOnlyFirstRank bool                 `yaml:"load_only_first_rank"`
	EnablePrefixCache *bool                `yaml:"enable_prefix_cache"`
	// LogLevel is set by UCM_LOG_LEVEL (debug, info, warn, error); default info.
	LogLevel slog.Level `yaml:"-"`
}

// ConnectorConfig is one entry of ucm_connectors.
type ConnectorConfig struct {
	Name   string          `yaml:"ucm_connector_name"`
	Config ConnectorParams `yaml:"ucm_connector_config"`
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
	// UCM keys accepted for the tiers and staging parts (not used by the core engine yet).
	StreamNumber                 int     `yaml:"stream_number"`
	BufferNumber                 int     `yaml:"buffer_number"`
	PosixCapacityGB              float64 `yaml:"posix_capacity_gb"`
	PosixGCEnable                bool    `yaml:"posix_gc_enable"`
	PosixGCTriggerThresholdRatio float64 `yaml:"posix_gc_trigger_threshold_ratio"`
	PosixGCRecyclePercent        float64 `yaml:"posix_gc_recycle_percent"`
	PosixGCCheckIntervalSec      int     `yaml:"posix_gc_check_interval_sec"`
	CacheBufferCapacityGB        float64 `yaml:"cache_buffer_capacity_gb"`
	CacheStreamNumber            int     `yaml:"cache_stream_number"`
	// UCM-Go keys.
	SegmentSize     Size   `yaml:"segment_size"`
	SyncPolicy      string `yaml:"sync_policy"`
	SyncIntervalMs  int    `yaml:"sync_interval_ms"`
	IOEngine        string `yaml:"io_engine"`
	QueueDepth      int    `yaml:"queue_depth"`
	MaxStagingBytes Size   `yaml:"max_staging_bytes"`
	// Compression: "off" (default) or "lz4"; CompressMinSaving: Options.CompressMinSaving.
	Compression       string  `yaml:"compression"`
	CompressMinSaving float64 `yaml:"compress_min_saving"`
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
	return fmt.Errorf("line %d: storage_backends: want a path, \"a:b\" or a list: %w", n.Line, ErrInvalidArgument)
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
		return 0, fmt.Errorf("size %q: want digits with an optional unit (KiB, MiB, GiB, TiB): %w", s, ErrInvalidArgument)
	}
	n, err := strconv.ParseInt(str[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, ErrInvalidArgument)
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
		return 0, fmt.Errorf("size %q: unknown unit %q (use KiB, MiB, GiB or TiB): %w", s, str[i:], ErrInvalidArgument)
	}
	if n > (1<<63-1)>>shift {
		return 0, fmt.Errorf("size %q overflows: %w", s, ErrInvalidArgument)
	}
	return n << shift, nil
}

// ParseConfig decodes a YAML configuration strictly: unknown keys, wrong types and bad values
// are errors naming the key and line.
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config: %w: %s", ErrInvalidArgument, quoteLines(err.Error(), data))
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

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
			return fmt.Errorf("UCM_IO_DIRECT=%q: want true or false: %w", v, ErrInvalidArgument)
		}
		p.IODirect = &b
	}
	if v := getenv("UCM_COMPRESSION"); v != "" {
		if _, err := ParseCompression(v); err != nil {
			return fmt.Errorf("UCM_COMPRESSION: %w", err)
		}
		p.Compression = v
	}
	if v := getenv("UCM_LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			return fmt.Errorf("UCM_LOG_LEVEL=%q: want debug, info, warn or error: %w", v, ErrInvalidArgument)
		}
	}
	return c.validate()
}

func (c *Config) validate() error {
	for i, conn := range c.Connectors {
		p := conn.Config
		where := fmt.Sprintf("config: ucm_connectors[%d] (%s)", i, conn.Name)
		switch {
		case p.BlockSize < 0 || p.SegmentSize < 0 || p.MaxStagingBytes < 0:
			return fmt.Errorf("%s: sizes must not be negative: %w", where, ErrInvalidArgument)
		case p.TimeoutMs < 0 || p.SyncIntervalMs < 0 || p.QueueDepth < 0 || p.PosixDataTransConcurrency < 0:
			return fmt.Errorf("%s: timeout_ms, sync_interval_ms, queue_depth and posix_data_trans_concurrency must not be negative: %w", where, ErrInvalidArgument)
		}
		if p.SyncPolicy != "" {
			if _, err := wal.ParseSyncPolicy(p.SyncPolicy); err != nil {
				return fmt.Errorf("%s: sync_policy: %w", where, err)
			}
		}
		if _, err := ParseCompression(p.Compression); err != nil {
			return fmt.Errorf("%s: compression: %w", where, err)
		}
		if p.CompressMinSaving < 0 || p.CompressMinSaving > 1 {
			return fmt.Errorf("%s: compress_min_saving %v out of range (0, 1]: %w", where, p.CompressMinSaving, ErrInvalidArgument)
		}
		if _, err := connectorIOEngine(p); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

func connectorIOEngine(p ConnectorParams) (devio.IOEngine, error) {
	if p.IOEngine != "" {
		e, err := devio.ParseIOEngine(p.IOEngine)
		if err != nil {
			return 0, fmt.Errorf("io_engine: %w: %w", ErrInvalidArgument, err)
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
	return 0, fmt.Errorf("posix_io_engine %q: want psync or aio: %w", p.PosixIOEngine, ErrInvalidArgument)
}

// StoreOptions turns the first connector into the store directory and Options for Open. The
// caller fills Layout and Schema (they come from the model the connector serves); if the
// config names a block_size it must equal Layout.BlockBytes(), which Open-time code checks
// with CheckBlockSize.
func (c *Config) StoreOptions() (dir string, opts Options, err error) {
	if len(c.Connectors) == 0 {
		return "", opts, fmt.Errorf("config: no ucm_connectors and no UCM_STORAGE_PATH: %w", ErrInvalidArgument)
	}
	p := c.Connectors[0].Config
	if len(p.StorageBackends) == 0 {
		return "", opts, fmt.Errorf("config: ucm_connectors[0].ucm_connector_config.storage_backends is empty: %w", ErrInvalidArgument)
	}
	opts.IOEngine, _ = connectorIOEngine(p) // validated at parse
	switch {
	case p.IODirect == nil:
		opts.DirectIO = devio.DirectAuto
	case *p.IODirect:
		opts.DirectIO = devio.DirectOn
	default:
		opts.DirectIO = devio.DirectOff
	}
	opts.SegmentSize = int64(p.SegmentSize)
	if p.SyncPolicy != "" {
		opts.SyncPolicy, _ = wal.ParseSyncPolicy(p.SyncPolicy)
	}
	opts.SyncInterval = time.Duration(p.SyncIntervalMs) * time.Millisecond
	opts.QueueDepth = p.QueueDepth
	if opts.QueueDepth == 0 {
		opts.QueueDepth = p.PosixDataTransConcurrency
	}
	opts.TaskTimeout = time.Duration(p.TimeoutMs) * time.Millisecond
	opts.MaxStagingBytes = int64(p.MaxStagingBytes)
	opts.Compression, _ = ParseCompression(p.Compression) // validated at parse
	opts.CompressMinSaving = p.CompressMinSaving
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel}))
	return p.StorageBackends[0], opts, nil
}

// CheckBlockSize reports whether the configured block_size (if any) matches the layout.
func (c *Config) CheckBlockSize(l Layout) error {
	if len(c.Connectors) == 0 || c.Connectors[0].Config.BlockSize == 0 {
		return nil
	}
	if got := int64(c.Connectors[0].Config.BlockSize); got != l.BlockBytes() {
		return fmt.Errorf("config: block_size %d but the layout's blocks are %d bytes: %w", got, l.BlockBytes(), ErrInvalidArgument)
	}
	return nil
}
