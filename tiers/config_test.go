package tiers

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func mem(capacity int64) Config {
	return Config{Name: "dram", Kind: KindMemory, Capacity: capacity}
}

func disk(name string, paths ...string) Config {
	return Config{Name: name, Kind: KindDisk, Paths: paths}
}

func TestWithDefaults(t *testing.T) {
	d := disk("ssd", "/a").WithDefaults()
	if d.HighWatermark != 0.95 || d.LowWatermark != 0.85 || d.IOEngine != "auto" || d.DirectIO != "auto" || d.Compression != "off" {
		t.Errorf("disk defaults: %+v", d)
	}
	m := mem(1).WithDefaults()
	if m.HighWatermark != 0.95 || m.LowWatermark != 0.85 || m.IOEngine != "" || m.DirectIO != "" || m.Compression != "" {
		t.Errorf("memory defaults: %+v", m)
	}
	set := Config{Name: "x", Kind: KindDisk, HighWatermark: 0.5, LowWatermark: 0.25, IOEngine: "psync", DirectIO: "off", Compression: "lz4"}
	if got := set.WithDefaults(); got.HighWatermark != 0.5 || got.LowWatermark != 0.25 || got.IOEngine != "psync" || got.DirectIO != "off" || got.Compression != "lz4" {
		t.Errorf("WithDefaults changed set fields: %+v", got)
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, tc := range [][]Config{
		{disk("ssd", "/ssd")},
		{mem(1 << 30), disk("ssd", "/ssd0", "/ssd1"), disk("nfs", "relative/nfs")},
		{disk("a", "/data/a"), disk("b", "/data/ab")}, // a prefix of the string, not of the path
		{{Name: "ssd", Kind: KindDisk, Paths: []string{"/x"}, Capacity: 0, HighWatermark: 1, LowWatermark: 0.1,
			IOEngine: "uring", DirectIO: "on", Compression: "lz4"}},
	} {
		if err := Validate(tc); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", tc, err)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	with := func(c Config, f func(*Config)) Config { f(&c); return c }
	ssd := disk("ssd", "/ssd")
	cases := []struct {
		name  string
		tiers []Config
		tier  int    // expected ConfigError.Tier
		field string // expected ConfigError.Field
	}{
		{"no tiers", nil, -1, "tiers"},
		{"memory only", []Config{mem(1)}, -1, "tiers"},
		{"empty name", []Config{with(ssd, func(c *Config) { c.Name = "" })}, 0, "name"},
		{"duplicate name", []Config{ssd, disk("ssd", "/other")}, 1, "name"},
		{"empty kind", []Config{with(ssd, func(c *Config) { c.Kind = "" })}, 0, "kind"},
		{"unknown kind", []Config{with(ssd, func(c *Config) { c.Kind = "tape" })}, 0, "kind"},
		{"memory not first", []Config{ssd, mem(1)}, 1, "kind"},
		{"two memory tiers", []Config{mem(1), with(mem(1), func(c *Config) { c.Name = "dram2" }), ssd}, 1, "kind"},
		{"memory with paths", []Config{with(mem(1), func(c *Config) { c.Paths = []string{"/m"} }), ssd}, 0, "paths"},
		{"memory with io_engine", []Config{with(mem(1), func(c *Config) { c.IOEngine = "auto" }), ssd}, 0, "io_engine"},
		{"memory with direct_io", []Config{with(mem(1), func(c *Config) { c.DirectIO = "on" }), ssd}, 0, "direct_io"},
		{"memory with compression", []Config{with(mem(1), func(c *Config) { c.Compression = "off" }), ssd}, 0, "compression"},
		{"memory zero capacity", []Config{mem(0), ssd}, 0, "capacity"},
		{"memory negative capacity", []Config{mem(-1), ssd}, 0, "capacity"},
		{"disk without paths", []Config{disk("ssd")}, 0, "paths"},
		{"disk empty path", []Config{disk("ssd", "/a", "")}, 0, "paths[1]"},
		{"disk blank path", []Config{disk("ssd", " ")}, 0, "paths[0]"},
		{"path twice in a tier", []Config{disk("ssd", "/a", "/a/")}, 0, "paths[1]"},
		{"path twice across tiers", []Config{ssd, disk("nfs", "/x/../ssd")}, 1, "paths[0]"},
		{"relative path twice", []Config{disk("ssd", "data"), disk("nfs", "./data")}, 1, "paths[0]"},
		{"path inside another tier's", []Config{ssd, disk("nfs", "/ssd/nfs")}, 1, "paths[0]"},
		{"path containing another tier's", []Config{disk("ssd", "/mnt/ssd"), disk("nfs", "/mnt")}, 1, "paths[0]"},
		{"root contains everything", []Config{ssd, disk("nfs", "/")}, 1, "paths[0]"},
		{"disk negative capacity", []Config{with(ssd, func(c *Config) { c.Capacity = -1 })}, 0, "capacity"},
		{"high above 1", []Config{with(ssd, func(c *Config) { c.HighWatermark = 1.01 })}, 0, "high_watermark"},
		{"high negative", []Config{with(ssd, func(c *Config) { c.HighWatermark = -0.5; c.LowWatermark = -0.6 })}, 0, "high_watermark"},
		{"high NaN", []Config{with(ssd, func(c *Config) { c.HighWatermark = math.NaN() })}, 0, "high_watermark"},
		{"low negative", []Config{with(ssd, func(c *Config) { c.LowWatermark = -0.1 })}, 0, "low_watermark"},
		{"low NaN", []Config{with(ssd, func(c *Config) { c.LowWatermark = math.NaN() })}, 0, "low_watermark"},
		{"low equals high", []Config{with(ssd, func(c *Config) { c.HighWatermark = 0.9; c.LowWatermark = 0.9 })}, 0, "low_watermark"},
		{"low above default high", []Config{with(ssd, func(c *Config) { c.LowWatermark = 0.97 })}, 0, "low_watermark"},
		{"unknown io_engine", []Config{with(ssd, func(c *Config) { c.IOEngine = "aio" })}, 0, "io_engine"},
		{"unknown direct_io", []Config{with(ssd, func(c *Config) { c.DirectIO = "yes" })}, 0, "direct_io"},
		{"unknown compression", []Config{with(ssd, func(c *Config) { c.Compression = "zstd" })}, 0, "compression"},
		{"fault in a later tier", []Config{mem(1), ssd, with(disk("nfs", "/nfs"), func(c *Config) { c.Compression = "gzip" })}, 2, "compression"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.tiers)
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Validate = %T %v, want *ConfigError", err, err)
			}
			if ce.Tier != tc.tier || ce.Field != tc.field {
				t.Errorf("Validate blames tier %d field %q (%v), want tier %d field %q", ce.Tier, ce.Field, err, tc.tier, tc.field)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.field) {
				t.Errorf("message %q does not name field %q", msg, tc.field)
			}
			if tc.tier >= 0 && !strings.Contains(msg, fmt.Sprintf("tier %d (%q)", tc.tier, tc.tiers[tc.tier].Name)) {
				t.Errorf("message %q does not name tier %d %q", msg, tc.tier, tc.tiers[tc.tier].Name)
			}
		})
	}
}

func TestConfigYAML(t *testing.T) {
	const doc = `
- name: dram
  kind: memory
  capacity: 1073741824
- name: ssd
  kind: disk
  paths: [/mnt/nvme0/ucm, /mnt/nvme1/ucm]
  capacity: 0
  high_watermark: 0.9
  low_watermark: 0.8
  io_engine: psync
  direct_io: "off"
  compression: lz4
`
	var cfg []Config
	if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	want := []Config{mem(1 << 30), {Name: "ssd", Kind: KindDisk, Paths: []string{"/mnt/nvme0/ucm", "/mnt/nvme1/ucm"},
		HighWatermark: 0.9, LowWatermark: 0.8, IOEngine: "psync", DirectIO: "off", Compression: "lz4"}}
	if fmt.Sprint(cfg) != fmt.Sprint(want) {
		t.Errorf("parsed %+v\nwant   %+v", cfg, want)
	}
	if err := Validate(cfg); err != nil {
		t.Error(err)
	}
}

func TestPathForDeterministicAndEven(t *testing.T) {
	if got := PathFor(nil, 7); got != "" {
		t.Errorf("PathFor(nil) = %q", got)
	}
	if got := PathFor([]string{"/only"}, 7); got != "/only" {
		t.Errorf("PathFor(one) = %q", got)
	}
	for _, n := range []int{2, 3, 4, 7} {
		paths := make([]string, n)
		for i := range paths {
			paths[i] = fmt.Sprintf("/p%d", i)
		}
		// Consecutive segment numbers, as an engine allocates them, from two starting points.
		for _, start := range []uint64{0, 1 << 40} {
			const keys = 12000
			count := map[string]int{}
			for k := start; k < start+keys; k++ {
				p := PathFor(paths, k)
				if p != PathFor(paths, k) {
					t.Fatalf("PathFor not deterministic for key %d", k)
				}
				count[p]++
			}
			want := keys / n
			for _, p := range paths {
				if c := count[p]; c < want*9/10 || c > want*11/10 {
					t.Errorf("n=%d start=%d: %s got %d of %d keys, want %d±10%%", n, start, p, c, keys, want)
				}
			}
			if len(count) != n {
				t.Errorf("n=%d: keys went to %d distinct paths: %v", n, len(count), count)
			}
		}
		// Short runs spread too: 64 consecutive segments never all land on one directory.
		for base := uint64(0); base < 6400; base += 64 {
			seen := map[string]bool{}
			for k := base; k < base+64; k++ {
				seen[PathFor(paths, k)] = true
			}
			if len(seen) < 2 {
				t.Errorf("n=%d: 64 consecutive keys from %d all on %v", n, base, seen)
			}
		}
	}
}

// Pin the placement: changing it would misplace every existing segment of a deployment that
// derives locations from PathFor.
func TestPathForStable(t *testing.T) {
	paths := []string{"a", "b", "c"}
	var got strings.Builder
	for k := uint64(0); k < 16; k++ {
		got.WriteString(PathFor(paths, k))
	}
	const want = "aacabaccabcaccca"
	if got.String() != want {
		t.Errorf("placement of keys 0..15 over 3 paths = %s, want %s", got.String(), want)
	}
}

func TestPathForAppendMovesFewKeys(t *testing.T) {
	three := []string{"a", "b", "c"}
	four := append(append([]string{}, three...), "d")
	moved := 0
	const keys = 20000
	for k := uint64(0); k < keys; k++ {
		before, after := PathFor(three, k), PathFor(four, k)
		if before != after {
			moved++
			if after != "d" {
				t.Fatalf("key %d moved from %s to %s, not to the new path", k, before, after)
			}
		}
	}
	if moved < keys/4*9/10 || moved > keys/4*11/10 {
		t.Errorf("appending a 4th path moved %d of %d keys, want about a quarter", moved, keys)
	}
}
