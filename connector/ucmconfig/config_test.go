package ucmconfig

import (
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
)

const ucmYAML = `
ucm_connectors:
  - ucm_connector_name: UcmPosixStore
    ucm_connector_config:
      storage_backends: /mnt/a:/mnt/b
      io_direct: true
      block_size: 2MiB
      posix_io_engine: psync
      posix_data_trans_concurrency: 128
      timeout_ms: 5000
      stream_number: 8
      posix_capacity_gb: 100
      segment_size: 512MiB
      sync_policy: interval
      sync_interval_ms: 50
      compression: lz4
      compress_min_saving: 0.05
ucm_sparse_config:
  ESA:
    sparse_ratio: 0.3
load_only_first_rank: true
`

func TestParseConfigUCMKeys(t *testing.T) {
	c, err := ParseConfig([]byte(ucmYAML))
	if err != nil {
		t.Fatal(err)
	}
	dir, opts, err := c.StoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	if dir != "/mnt/a" || len(c.Connectors[0].Config.StorageBackends) != 2 {
		t.Fatalf("dir %q, backends %v", dir, c.Connectors[0].Config.StorageBackends)
	}
	if opts.DirectIO != devio.DirectOn || opts.IOEngine != devio.EnginePsync || opts.QueueDepth != 128 ||
		opts.TaskTimeout.Milliseconds() != 5000 || opts.SegmentSize != 512<<20 || opts.SyncPolicy != engine.SyncInterval ||
		opts.SyncInterval.Milliseconds() != 50 || opts.Compression != engine.CompressionLZ4 || opts.CompressMinSaving != 0.05 {
		t.Fatalf("options %+v", opts)
	}
	if _, ok := c.SparseConfig["ESA"]; !ok || c.Other["load_only_first_rank"].Value != "true" {
		t.Fatal("sparse config / load_only_first_rank lost")
	}
	if err := c.CheckBlockSize(engine.Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckBlockSize(mhaLayout); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("block size mismatch: %v", err)
	}
}

func TestConfigRejectsBadValuesNamingThem(t *testing.T) {
	cases := map[string]string{
		"storage_bakends: /x":           "storage_bakends",
		"sync_policy: sometimes":        "sync_policy",
		"posix_io_engine: kqueue":       "posix_io_engine",
		"io_engine: spdk":               "io_engine",
		"segment_size: 1.5GiB":          "1.5GiB",
		"block_size: 2MB":               "2MB",
		"timeout_ms: -1":                "timeout_ms",
		"queue_depth: lots":             "queue_depth",
		"io_direct: maybe":              "io_direct",
		"storage_backends: {a: b}":      "storage_backends",
		"max_staging_bytes: 9999999TiB": "overflows",
	}
	for line, want := range cases {
		doc := "ucm_connectors:\n  - ucm_connector_name: X\n    ucm_connector_config:\n      " + line + "\n"
		_, err := ParseConfig([]byte(doc))
		if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want engine.ErrInvalidArgument naming %q)", line, err, want)
		}
	}
	if _, err := ParseConfig([]byte("ucm_conectors: []\n")); err == nil || !strings.Contains(err.Error(), "ucm_conectors") {
		t.Errorf("unknown top-level key: %v", err)
	}
}

func TestConfigEnvOverrides(t *testing.T) {
	c, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"UCM_STORAGE_PATH": "/data/ucm:/data2", "UCM_BLOCK_SIZE": "1MiB", "UCM_IO_DIRECT": "0", "UCM_LOG_LEVEL": "debug", "UCM_COMPRESSION": "lz4"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	dir, opts, err := c.StoreOptions()
	if err != nil || dir != "/data/ucm" || opts.DirectIO != devio.DirectOff || c.LogLevel != slog.LevelDebug || opts.Compression != engine.CompressionLZ4 ||
		c.Connectors[0].Config.BlockSize != 1<<20 {
		t.Fatalf("env overrides: dir %q opts %+v level %v err %v", dir, opts, c.LogLevel, err)
	}
	for k, v := range map[string]string{"UCM_BLOCK_SIZE": "big", "UCM_IO_DIRECT": "perhaps", "UCM_LOG_LEVEL": "chatty", "UCM_COMPRESSION": "zstd"} {
		c, _ := ParseConfig(nil)
		if err := c.ApplyEnv(func(key string) string {
			if key == k {
				return v
			}
			return ""
		}); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
	empty, _ := ParseConfig(nil)
	if _, _, err := empty.StoreOptions(); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("no connectors: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "4k": 4096, "4KiB": 4096, "2MiB": 2 << 20, "3G": 3 << 30, "1TiB": 1 << 40, " 7 ": 7, "12b": 12} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5M", "2MB", "MiB", "9223372036854775807K", "0x10"} {
		if _, err := ParseSize(bad); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(ucmYAML))
	f.Add([]byte("ucm_connectors: [{ucm_connector_name: a, ucm_connector_config: {storage_backends: [x, y]}}]"))
	f.Add([]byte("segment_size: 1GiB"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			if !errors.Is(err, engine.ErrInvalidArgument) {
				t.Fatalf("error does not wrap ErrInvalidArgument: %v", err)
			}
			return
		}
		if len(c.Connectors) > 0 {
			if _, opts, err := c.StoreOptions(); err == nil && (opts.QueueDepth < 0 || opts.SegmentSize < 0) {
				t.Fatalf("negative option accepted: %+v", opts)
			}
		}
	})
}

func connectorDoc(body string) []byte {
	return []byte("ucm_connectors:\n  - ucm_connector_name: UcmPosixStore\n    ucm_connector_config:\n" + body)
}

// UCM's posix_capacity_gb makes one disk tier over storage_backends with that capacity; the GC
// trigger ratio is its high watermark, minus the recycle share its low one.
func TestConfigPosixCapacity(t *testing.T) {
	c, err := ParseConfig([]byte(ucmYAML))
	if err != nil {
		t.Fatal(err)
	}
	_, opts, err := c.StoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	want := tiers.Config{Name: "disk", Kind: tiers.KindDisk, Paths: []string{"/mnt/a", "/mnt/b"}, Capacity: 100 << 30,
		HighWatermark: 0.7, LowWatermark: 0.7 - 0.1}
	if len(opts.Tiers) != 1 || !reflect.DeepEqual(opts.Tiers[0], want) {
		t.Fatalf("tiers %+v, want %+v", opts.Tiers, want)
	}
	c, err = ParseConfig(connectorDoc("      storage_backends: /mnt/a\n      posix_capacity_gb: 1.5\n      posix_gc_trigger_threshold_ratio: 0.9\n      posix_gc_recycle_percent: 0.2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, opts, _ = c.StoreOptions(); len(opts.Tiers) != 1 || opts.Tiers[0].Capacity != 3<<29 || opts.Tiers[0].HighWatermark != 0.9 || opts.Tiers[0].LowWatermark != 0.9-0.2 {
		t.Fatalf("tiers %+v", opts.Tiers)
	}
	// Without a capacity: no tier list (one unlimited tier in the store directory), GC keys ignored.
	c, err = ParseConfig(connectorDoc("      storage_backends: /mnt/a\n      posix_gc_trigger_threshold_ratio: 0.9\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, opts, _ = c.StoreOptions(); opts.Tiers != nil {
		t.Fatalf("tiers without a capacity: %+v", opts.Tiers)
	}
	// UCM's Cache|Posix: a memory tier in front of the (unlimited) disk tier; the GC check
	// interval is the online compaction interval.
	c, err = ParseConfig(connectorDoc("      storage_backends: /mnt/a\n      cache_buffer_capacity_gb: 2\n      posix_gc_check_interval_sec: 45\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, opts, err = c.StoreOptions()
	if err != nil || len(opts.Tiers) != 2 || opts.Tiers[0].Kind != tiers.KindMemory || opts.Tiers[0].Capacity != 2<<30 ||
		opts.Tiers[1].Kind != tiers.KindDisk || opts.Tiers[1].Capacity != 0 || opts.CompactInterval != 45*time.Second {
		t.Fatalf("cache tier: %v %+v %v", err, opts.Tiers, opts.CompactInterval)
	}
	for _, doc := range []string{
		"      storage_backends: /mnt/a\n      cache_buffer_capacity_gb: -1\n",
		"      storage_backends: /mnt/a\n      posix_gc_check_interval_sec: -5\n",
		"      storage_backends: /mnt/a\n      cache_buffer_capacity_gb: 1\n      tiers: [{name: ssd, kind: disk, paths: [/x]}]\n",
	} {
		if _, err := ParseConfig(connectorDoc(doc)); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%q: %v, want engine.ErrInvalidArgument", doc, err)
		}
	}
}

// The tiers key is engine.Options.Tiers, with sizes in units; the store directory is the first
// backend, or the first disk path when there is none.
func TestConfigTiers(t *testing.T) {
	c, err := ParseConfig(connectorDoc(`      tiers:
        - {name: dram, kind: memory, capacity: 64MiB}
        - name: ssd
          kind: disk
          paths: [/mnt/nvme0/ucm, /mnt/nvme1/ucm]
          capacity: 3TiB
          high_watermark: 0.9
          low_watermark: 0.8
          io_engine: psync
          direct_io: "off"
          compression: lz4
        - {name: nfs, kind: disk, paths: [/mnt/nfs/ucm]}
`))
	if err != nil {
		t.Fatal(err)
	}
	dir, opts, err := c.StoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	want := []tiers.Config{
		{Name: "dram", Kind: tiers.KindMemory, Capacity: 64 << 20},
		{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{"/mnt/nvme0/ucm", "/mnt/nvme1/ucm"}, Capacity: 3 << 40, HighWatermark: 0.9,
			LowWatermark: 0.8, IOEngine: "psync", DirectIO: "off", Compression: "lz4"},
		{Name: "nfs", Kind: tiers.KindDisk, Paths: []string{"/mnt/nfs/ucm"}},
	}
	if dir != "/mnt/nvme0/ucm" || !reflect.DeepEqual(opts.Tiers, want) {
		t.Fatalf("dir %q tiers %+v", dir, opts.Tiers)
	}
	c, err = ParseConfig(connectorDoc("      storage_backends: /var/ucm\n      tiers: [{name: ssd, kind: disk, paths: [/ssd], capacity: 1048576}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if dir, opts, _ = c.StoreOptions(); dir != "/var/ucm" || len(opts.Tiers) != 1 || opts.Tiers[0].Capacity != 1<<20 {
		t.Fatalf("dir %q tiers %+v", dir, opts.Tiers)
	}
}

// Bad tier keys fail at parse, naming the key or the tier.
func TestConfigTierErrors(t *testing.T) {
	cases := map[string]string{
		// tiers.Validate rejects: the message names the tier.
		"tiers: [{name: ssd, kind: disk}]":                                                          `"ssd"`,
		"tiers: [{name: ssd, kind: disk, paths: [/a]}, {name: ssd, kind: disk, paths: [/b]}]":       `tier 1 ("ssd")`,
		"tiers: [{name: nfs, kind: disk, paths: [/a]}, {name: dram, kind: memory, capacity: 1GiB}]": `"dram"`,
		"tiers: [{name: ssd, kind: disk, paths: [/a], high_watermark: 0.5, low_watermark: 0.6}]":    `"ssd"`,
		"tiers: [{name: ssd, kind: tape, paths: [/a]}]":                                             `"ssd"`,
		"tiers: [{name: ssd, kind: disk, paths: [/a], io_engine: spdk}]":                            `"ssd"`,
		// Decoding.
		"tiers: [{name: ssd, kind: disk, paths: [/a], capacity: -1}]":  "tiers[0].capacity",
		"tiers: [{name: ssd, kind: disk, paths: [/a], capacity: 2TB}]": "tiers[0].capacity",
		"tiers: [{name: ssd, kind: disk, path: [/a]}]":                 `unknown key "path"`,
		"tiers: {name: ssd}": "tiers",
		"tiers: [ssd]":       "tiers[0]",
		// UCM keys.
		"storage_backends: /a\n      posix_capacity_gb: -5":                                                                                  "posix_capacity_gb",
		"storage_backends: /a\n      posix_capacity_gb: 5\n      posix_gc_trigger_threshold_ratio: 1.5":                                      "posix_gc_trigger_threshold_ratio",
		"storage_backends: /a\n      posix_capacity_gb: 5\n      posix_gc_recycle_percent: 1":                                                "posix_gc_recycle_percent",
		"storage_backends: /a\n      posix_capacity_gb: 5\n      posix_gc_trigger_threshold_ratio: 0.1\n      posix_gc_recycle_percent: 0.2": "posix_gc_trigger_threshold_ratio",
		"storage_backends: /a\n      posix_capacity_gb: 5\n      tiers: [{name: ssd, kind: disk, paths: [/b]}]":                              "posix_capacity_gb and tiers",
	}
	for line, want := range cases {
		_, err := ParseConfig(connectorDoc("      " + line + "\n"))
		if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want engine.ErrInvalidArgument naming %q)", line, err, want)
		}
	}
}

// ucmExampleYAML is UCM's examples/ucm_config_example.yaml with its commented keys enabled, plus
// the keys UCM's connector adds to a worker's store configuration.
const ucmExampleYAML = `
ucm_connectors:
  - ucm_connector_name: "UcmPipelineStore"
    ucm_connector_config:
      store_pipeline: "Cache|Posix"
      storage_backends: "/mnt/test"
      io_direct: false
      posix_capacity_gb: 1024
      unique_id: "engine-0"
      device_id: 1
      tensor_size_list: [65536, 65536]
      shard_size: 131072
      block_size: 4194304
      local_rank_size: 1
      share_buffer_enable: false
enable_event_sync: true
metrics_config_path: "/workspace/metrics_configs.yaml"
ucm_sparse_config:
  GSAOnDevice: {}
use_layerwise: true
hit_ratio: 0.9
load_only_first_rank: false
`

// TestConfigUCMExample: UCM's own example file loads; store_pipeline "Cache|Posix" puts a memory
// tier (UCM's default capacity bounded by the host's memory) before the disk tier; the keys
// with no meaning in the store are named by Unused; a pipeline UCM-Go cannot serve is an error
// naming it; ENABLE_SPARSE and UCM_SPARSE_TYPE are read.
func TestConfigUCMExample(t *testing.T) {
	c, err := ParseConfig([]byte(ucmExampleYAML))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Connectors[0].Config
	if p.StorePipeline != "Cache|Posix" || *p.DeviceID != 1 || p.ShardSize != 131072 || len(p.TensorSizeList) != 2 || c.MetricsConfigPath == "" {
		t.Fatalf("parsed %+v", p)
	}
	_, opts, err := c.StoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Tiers) != 2 || opts.Tiers[0].Kind != tiers.KindMemory || opts.Tiers[1].Capacity != 1024<<30 {
		t.Fatalf("tiers %+v", opts.Tiers)
	}
	if mem := devio.PhysicalMemory(); mem > 0 && opts.Tiers[0].Capacity != min(mem/4, 256<<30) {
		t.Fatalf("default cache capacity %d with %d bytes of memory", opts.Tiers[0].Capacity, mem)
	}
	unused := strings.Join(c.Unused(), " ")
	for _, k := range []string{"enable_event_sync", "use_layerwise", "hit_ratio", "local_rank_size", "share_buffer_enable"} {
		if !strings.Contains(unused, k) {
			t.Fatalf("Unused %q lacks %s", unused, k)
		}
	}
	for _, bad := range []string{`store_pipeline: "Cache|Mooncake"`, `tensor_size_list: [0]`, `metrics_port: 70000`} {
		_, err := ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_config:\n      storage_backends: /x\n      " + bad + "\n"))
		key, _, _ := strings.Cut(bad, ":")
		if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), key) {
			t.Fatalf("%s: %v", bad, err)
		}
	}
	env := map[string]string{"UCM_SPARSE_TYPE": "ESA"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil || !c.EnableSparse || c.SparseType != "ESA" {
		t.Fatalf("sparse env: %v %v %q", err, c.EnableSparse, c.SparseType)
	}
	env = map[string]string{"ENABLE_SPARSE": "maybe"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), "ENABLE_SPARSE") {
		t.Fatalf("bad ENABLE_SPARSE: %v", err)
	}
}
