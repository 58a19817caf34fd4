package tiers

// Placeholder: replaced by the full configuration (validation, placement) from the tierkit branch.

// Kind is what a tier stores its blocks in.
type Kind string

// Tier kinds.
const (
	KindMemory Kind = "memory"
	KindDisk   Kind = "disk"
)

// Config configures one tier.
type Config struct {
	Name          string   `yaml:"name"`
	Kind          Kind     `yaml:"kind"`
	Paths         []string `yaml:"paths"`
	Capacity      int64    `yaml:"capacity"`
	HighWatermark float64  `yaml:"high_watermark"`
	LowWatermark  float64  `yaml:"low_watermark"`
	IOEngine      string   `yaml:"io_engine"`
	DirectIO      string   `yaml:"direct_io"`
	Compression   string   `yaml:"compression"`
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.HighWatermark == 0 {
		c.HighWatermark = 0.95
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = 0.85
	}
	return c
}

// Validate checks a tier list.
func Validate(tiers []Config) error { return nil }

// PathFor places key on one of paths.
func PathFor(paths []string, key uint64) string { return paths[key%uint64(len(paths))] }
