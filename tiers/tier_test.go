package tiers

import (
	"errors"
	"testing"

	"github.com/ucm-go/ucm/internal/mooncakefake"
)

// OpenCache builds each cache kind from its configuration, and refuses what is not a cache.
func TestOpenCacheByKind(t *testing.T) {
	mem, err := OpenCache(Config{Name: "dram", Kind: KindMemory, Capacity: 1 << 20}, CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := mem.(*MemCache); !ok || m.Name() != "dram" || m.Kind() != KindMemory || m.Usage().Capacity != 1<<20 {
		t.Fatalf("memory tier: %T %+v", mem, mem.Usage())
	}
	cfg := mcCfg("block")
	var opened int
	o := CacheOptions{Layout: mcLayout, Logger: quiet, OpenPool: func(MooncakeConfig) (MooncakePool, error) {
		opened++
		return mooncakefake.New(mooncakefake.NewStore()), nil
	}}
	mc, err := OpenCache(Config{Name: "pool", Kind: KindMooncake, Mooncake: &cfg}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mc.Close() })
	if _, ok := mc.(*MooncakeTier); !ok || opened != 1 || mc.Kind() != KindMooncake || mc.Inclusive() {
		t.Fatalf("mooncake tier: %T, pool opened %d times", mc, opened)
	}
	small := cfg
	small.StagingBytes = 1
	if _, err := OpenCache(Config{Name: "pool", Kind: KindMooncake, Mooncake: &small}, o); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("mooncake tier with too little staging memory: %v", err)
	}
	if _, err := OpenCache(Config{Name: "ssd", Kind: KindDisk, Paths: []string{"/ssd"}}, o); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a disk tier opened as a cache: %v", err)
	}
}
