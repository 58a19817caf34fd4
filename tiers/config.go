package tiers

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Kind is the kind of a tier: where its blocks live.
type Kind string

const (
	// KindMemory is a host-DRAM tier: an LRU cache of whole blocks in front of the disk tiers.
	// It takes no paths and loses its content on restart.
	KindMemory Kind = "memory"
	// KindDisk is a tier of segment files in one or more directories: a local SSD or a mounted
	// shared file system (NFS, 3FS, GlusterFS, CephFS).
	KindDisk Kind = "disk"
)

// Defaults applied by Config.WithDefaults to fields left at their zero value.
const (
	// DefaultHighWatermark is the fill ratio above which reclamation starts.
	DefaultHighWatermark = 0.95
	// DefaultLowWatermark is the fill ratio at which reclamation stops.
	DefaultLowWatermark = 0.85
	// DefaultIOEngine is the I/O engine of a disk tier: io_uring when it works, else pread/pwrite.
	DefaultIOEngine = "auto"
	// DefaultDirectIO is the O_DIRECT mode of a disk tier: on when the file system accepts it.
	DefaultDirectIO = "auto"
	// DefaultCompression is the compression of a disk tier: raw KV barely compresses.
	DefaultCompression = "off"
)

// ErrInvalidConfig is wrapped by every error Validate returns.
var ErrInvalidConfig = errors.New("invalid tier configuration")

// ConfigError says which tier and which field of it Validate rejected, and why.
// Tier is -1 (and Name empty) when the fault is in the list as a whole.
// It wraps ErrInvalidConfig.
type ConfigError struct {
	Tier   int    // index in the list given to Validate, or -1
	Name   string // the tier's name as configured
	Field  string // the YAML name of the field at fault, with an index for paths ("paths[1]")
	Reason string
}

// Error names the tier (index and name), the field and the reason.
func (e *ConfigError) Error() string {
	if e.Tier < 0 {
		return fmt.Sprintf("tiers: %s: %s: %v", e.Field, e.Reason, ErrInvalidConfig)
	}
	return fmt.Sprintf("tiers: tier %d (%q): %s: %s: %v", e.Tier, e.Name, e.Field, e.Reason, ErrInvalidConfig)
}

// Unwrap returns ErrInvalidConfig, so errors.Is(err, ErrInvalidConfig) holds.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Config configures one tier. Tiers are listed fastest first: an optional memory tier, then
// one or more disk tiers. The YAML names are those of the field tags.
type Config struct {
	// Name identifies the tier in logs, metrics and errors; unique and non-empty.
	Name string `yaml:"name"`
	// Kind is KindMemory, KindMooncake or KindDisk.
	Kind Kind `yaml:"kind"`
	// Paths are the directories of a disk tier (at least one; blocks are spread across them by
	// PathFor). A memory tier has none. No directory may appear twice or inside another.
	Paths []string `yaml:"paths"`
	// Capacity is the tier's size in bytes: required and > 0 for memory, 0 = unlimited for disk.
	Capacity int64 `yaml:"capacity"`
	// HighWatermark (default 0.95): reclamation starts above HighWatermark×Capacity.
	HighWatermark float64 `yaml:"high_watermark"`
	// LowWatermark (default 0.85): reclamation stops at LowWatermark×Capacity.
	LowWatermark float64 `yaml:"low_watermark"`
	// IOEngine of a disk tier: "auto" (default), "uring" or "psync".
	IOEngine string `yaml:"io_engine"`
	// DirectIO of a disk tier: "auto" (default), "on" or "off".
	DirectIO string `yaml:"direct_io"`
	// Compression of a disk tier: "off" (default) or "lz4".
	Compression string `yaml:"compression"`
	// Shared marks a disk tier whose paths are shared by several engine instances (processes on
	// one host, or hosts mounting one distributed file system): each instance writes only its
	// own namespace under every path (<path>/instances/<instance id>/), publishes its sealed
	// segments in a manifest there, and reads the others' published segments
	// (docs/sharing.md). A memory tier cannot be shared.
	Shared bool `yaml:"shared"`
	// Mooncake configures a KindMooncake tier (YAML: a mapping under `mooncake:` with the keys
	// of MooncakeConfig); other kinds take none.
	Mooncake *MooncakeConfig `yaml:"mooncake" json:",omitempty"`
}

// WithDefaults returns a copy of c with zero-valued watermarks set to their defaults and, for
// disk tiers only, empty IOEngine, DirectIO and Compression set to theirs; a mooncake tier gets
// a Mooncake configuration (a new one) with its defaults (MooncakeConfig.WithDefaults). It never
// changes a field that is already set, and leaves the Paths slice shared with c.
func (c Config) WithDefaults() Config {
	if c.HighWatermark == 0 {
		c.HighWatermark = DefaultHighWatermark
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = DefaultLowWatermark
	}
	if c.Kind == KindMooncake {
		m := MooncakeConfig{GlobalSegmentSize: DefaultMooncakeGlobalSegmentSize}
		if c.Mooncake != nil {
			m = *c.Mooncake
		}
		m = m.WithDefaults()
		c.Mooncake = &m
	}
	if c.Kind == KindDisk {
		if c.IOEngine == "" {
			c.IOEngine = DefaultIOEngine
		}
		if c.DirectIO == "" {
			c.DirectIO = DefaultDirectIO
		}
		if c.Compression == "" {
			c.Compression = DefaultCompression
		}
	}
	return c
}

var (
	ioEngines    = []string{"auto", "uring", "psync"}
	directIOs    = []string{"auto", "on", "off"}
	compressions = []string{"off", "lz4"}
)

// Validate checks a tier list after applying WithDefaults to each tier, and returns the first
// fault as a *ConfigError wrapping ErrInvalidConfig, or nil. It requires: non-empty, unique
// names; a known kind; at most one memory tier, and only as the first tier; at most one
// mooncake tier, before every disk tier, with no paths, capacity or disk settings and a valid
// mooncake configuration (metadata_server and master_server_address set; field names
// "mooncake.<key>"), and a mooncake configuration on no other tier; at least one disk
// tier; for disk tiers at least one non-empty path, for memory tiers no paths, io_engine,
// direct_io or compression; no directory listed twice or nested inside another listed
// directory (compared after filepath.Abs, which cleans; symbolic links are not resolved);
// capacity >= 0 (> 0 for memory); 0 < low_watermark < high_watermark <= 1; and io_engine,
// direct_io and compression from their documented sets. Validate does not touch the file system.
func Validate(tiers []Config) error {
	type seenPath struct {
		tier  int
		field string
		abs   string
	}
	var paths []seenPath
	names := make(map[string]int, len(tiers))
	disks, mooncakes := 0, 0
	for i, t := range tiers {
		t = t.WithDefaults()
		fail := func(field, format string, args ...any) error {
			return &ConfigError{Tier: i, Name: t.Name, Field: field, Reason: fmt.Sprintf(format, args...)}
		}
		if t.Name == "" {
			return fail("name", "empty")
		}
		if t.Mooncake != nil && t.Kind != KindMooncake {
			return fail("mooncake", "only a mooncake tier takes a mooncake configuration")
		}
		if j, dup := names[t.Name]; dup {
			return fail("name", "also the name of tier %d", j)
		}
		names[t.Name] = i
		switch t.Kind {
		case KindMemory:
			if i != 0 {
				return fail("kind", "a memory tier must be the first tier (at most one)")
			}
			if len(t.Paths) != 0 {
				return fail("paths", "a memory tier takes no paths")
			}
			if t.IOEngine != "" {
				return fail("io_engine", "a memory tier takes no io_engine")
			}
			if t.DirectIO != "" {
				return fail("direct_io", "a memory tier takes no direct_io")
			}
			if t.Compression != "" {
				return fail("compression", "a memory tier takes no compression")
			}
			if t.Shared {
				return fail("shared", "a memory tier cannot be shared (it is this process's memory)")
			}
			if t.Capacity <= 0 {
				return fail("capacity", "%d: a memory tier needs a capacity > 0", t.Capacity)
			}
		case KindMooncake:
			if mooncakes++; mooncakes > 1 {
				return fail("kind", "at most one mooncake tier")
			}
			if disks > 0 {
				return fail("kind", "a mooncake tier comes before the disk tiers (after the memory tier, if any)")
			}
			if len(t.Paths) != 0 || t.IOEngine != "" || t.DirectIO != "" || t.Compression != "" || t.Shared {
				return fail("kind", "a mooncake tier takes no paths, io_engine, direct_io, compression or shared")
			}
			if t.Capacity != 0 {
				return fail("capacity", "%d: a mooncake tier takes no capacity (the pool is sized by each client's mooncake.global_segment_size)", t.Capacity)
			}
			if field, reason := t.Mooncake.validate(); field != "" {
				return fail(field, "%s", reason)
			}
		case KindDisk:
			disks++
			if len(t.Paths) == 0 {
				return fail("paths", "a disk tier needs at least one directory")
			}
			for k, p := range t.Paths {
				field := fmt.Sprintf("paths[%d]", k)
				if strings.TrimSpace(p) == "" {
					return fail(field, "empty")
				}
				abs, err := filepath.Abs(p)
				if err != nil {
					return fail(field, "%q: %v", p, err)
				}
				for _, s := range paths {
					where := fmt.Sprintf("tier %d (%q) %s", s.tier, tiers[s.tier].Name, s.field)
					switch {
					case s.abs == abs:
						return fail(field, "%q is the same directory as %s", p, where)
					case nested(s.abs, abs):
						return fail(field, "%q is inside %s (%s)", p, where, s.abs)
					case nested(abs, s.abs):
						return fail(field, "%q contains %s (%s)", p, where, s.abs)
					}
				}
				paths = append(paths, seenPath{tier: i, field: field, abs: abs})
			}
			if t.Capacity < 0 {
				return fail("capacity", "%d: want >= 0 (0 = unlimited)", t.Capacity)
			}
			if !oneOf(t.IOEngine, ioEngines) {
				return fail("io_engine", "%q: want one of %s", t.IOEngine, strings.Join(ioEngines, ", "))
			}
			if !oneOf(t.DirectIO, directIOs) {
				return fail("direct_io", "%q: want one of %s", t.DirectIO, strings.Join(directIOs, ", "))
			}
			if !oneOf(t.Compression, compressions) {
				return fail("compression", "%q: want one of %s", t.Compression, strings.Join(compressions, ", "))
			}
		default:
			return fail("kind", "%q: want %q, %q or %q", t.Kind, KindMemory, KindMooncake, KindDisk)
		}
		// Written so that NaN fails every check.
		if !(t.HighWatermark > 0 && t.HighWatermark <= 1) {
			return fail("high_watermark", "%v: want 0 < high_watermark <= 1", t.HighWatermark)
		}
		if !(t.LowWatermark > 0) {
			return fail("low_watermark", "%v: want > 0", t.LowWatermark)
		}
		if !(t.LowWatermark < t.HighWatermark) {
			return fail("low_watermark", "%v: want below high_watermark %v", t.LowWatermark, t.HighWatermark)
		}
	}
	if disks == 0 {
		return &ConfigError{Tier: -1, Field: "tiers", Reason: "no disk tier (at least one is required)"}
	}
	return nil
}

// nested reports whether dir b lies strictly inside dir a; both are clean absolute paths.
func nested(a, b string) bool {
	if len(b) <= len(a) || !strings.HasPrefix(b, a) {
		return false
	}
	return strings.HasSuffix(a, string(filepath.Separator)) || b[len(a)] == filepath.Separator
}

func oneOf(s string, set []string) bool {
	for _, v := range set {
		if s == v {
			return true
		}
	}
	return false
}

// PathFor returns the directory among paths that holds the object numbered key (a segment
// number), or "" when paths is empty. The choice depends only on key and len(paths) (not on
// the path strings), is the same in every process and release, and spreads keys evenly,
// including runs of consecutive keys. It uses jump consistent hashing (Lamping & Veach) over a
// 64-bit mix of key, so appending a path to the list moves only about 1/(n+1) of the keys
// (all of them to the new path), while removing or reordering paths moves many.
func PathFor(paths []string, key uint64) string {
	if len(paths) == 0 {
		return ""
	}
	return paths[jumpHash(mix64(key), len(paths))]
}

// mix64 is the splitmix64 finalizer: consecutive inputs map to unrelated outputs.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// jumpHash is "A Fast, Minimal Memory, Consistent Hash Algorithm" (Lamping, Veach 2014).
func jumpHash(key uint64, n int) int {
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}
