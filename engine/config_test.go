package engine

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/devio"
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
		opts.TaskTimeout.Milliseconds() != 5000 || opts.SegmentSize != 512<<20 || opts.SyncPolicy != SyncInterval ||
		opts.SyncInterval.Milliseconds() != 50 || opts.Compression != CompressionLZ4 || opts.CompressMinSaving != 0.05 {
		t.Fatalf("options %+v", opts)
	}
	if _, ok := c.SparseConfig["ESA"]; !ok || !c.LoadOnlyFirstRank {
		t.Fatal("sparse config / load_only_first_rank lost")
	}
	if err := c.CheckBlockSize(Layout{Shards: 32, TensorsPerShard: 2, ShardBytes: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckBlockSize(mhaLayout); !errors.Is(err, ErrInvalidArgument) {
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
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (want ErrInvalidArgument naming %q)", line, err, want)
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
	if err != nil || dir != "/data/ucm" || opts.DirectIO != devio.DirectOff || c.LogLevel != slog.LevelDebug || opts.Compression != CompressionLZ4 ||
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
		}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
	empty, _ := ParseConfig(nil)
	if _, _, err := empty.StoreOptions(); !errors.Is(err, ErrInvalidArgument) {
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
		if _, err := ParseSize(bad); !errors.Is(err, ErrInvalidArgument) {
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
			if !errors.Is(err, ErrInvalidArgument) {
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
