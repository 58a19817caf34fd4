package tiers

import (
	"fmt"
	"log/slog"

	"github.com/ucm-go/ucm/format"
)

// Tier is what every tier kind shares: a name, a kind and resources to release. A store's tiers
// form one chain, fastest first: the caches (Cache: the memory tier, the Mooncake tier), then
// the disk tiers (Disk: LocalDisk, SharedDisk). Name and Kind are constant; Close is called
// once, when the engine closes.
type Tier interface {
	// Name returns the tier's configured name (for logs and statistics).
	Name() string
	// Kind returns the tier's kind (KindMemory, KindMooncake, KindDisk).
	Kind() Kind
	// Close releases the tier's resources.
	Close() error
}

// CacheOptions is what a cache tier is opened with (OpenCache).
type CacheOptions struct {
	// Layout and Fingerprint are the store's block layout and schema fingerprint, final once
	// the schema is checked: the Mooncake tier writes the fingerprint into every object's key
	// and header.
	Layout      format.Layout
	Fingerprint format.Fingerprint
	Logger      *slog.Logger
	// OpenPool sets up a Mooncake pool's client (nil: OpenMooncakePool).
	OpenPool func(MooncakeConfig) (MooncakePool, error)
}

// OpenCache opens cache tier c: the memory tier (KindMemory, MemCache) or the Mooncake tier
// (KindMooncake, MooncakeTier; a master that does not answer does not fail it: the tier starts
// down, logged, and joins when the master answers). A configuration the kind refuses fails
// with an error wrapping ErrInvalidConfig; a disk kind is not a cache (OpenDisk).
func OpenCache(c Config, o CacheOptions) (Cache, error) {
	switch c.Kind {
	case KindMemory:
		return NewMemCache(c.Name, c.Capacity), nil
	case KindMooncake:
		if c.Mooncake == nil {
			return nil, fmt.Errorf("tier %q: no mooncake settings: %w", c.Name, ErrInvalidConfig)
		}
		open := o.OpenPool
		if open == nil {
			open = OpenMooncakePool
		}
		pool, err := open(*c.Mooncake)
		if err != nil {
			return nil, fmt.Errorf("tier %q: %w", c.Name, err)
		}
		mc, err := NewMooncakeTier(c.Name, *c.Mooncake, pool, o.Layout, o.Fingerprint, o.Logger)
		if err != nil {
			_ = pool.Close()
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if !mc.Up() {
			log := o.Logger
			if log == nil {
				log = slog.Default()
			}
			log.Error("ucm: mooncake tier down at open: skipped until its master answers", "tier", c.Name,
				"master", c.Mooncake.MasterServerAddress)
		}
		return mc, nil
	default:
		return nil, fmt.Errorf("tier %q: kind %s is not a cache tier: %w", c.Name, c.Kind, ErrInvalidConfig)
	}
}
