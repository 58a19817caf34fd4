package engine

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// diskTierOf is one disk tier of the given capacity in dir.
func diskTierOf(dir string, capacity int64) []tiers.Config {
	return []tiers.Config{{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}, Capacity: capacity}}
}

// TestOptionsRejected: every option that once passed Validate and broke the engine later (an
// overflowing capacity check, NaN ratios) is refused at Open, naming the field.
func TestOptionsRejected(t *testing.T) {
	_, fs := memFS()
	cases := []struct {
		name, field string
		edit        func(*Options)
	}{
		{"segment size 2^62 with a 64 MiB tier (2×size overflowed)", "segment size", func(o *Options) {
			o.SegmentSize = 1 << 62
			o.Tiers = diskTierOf("/store/ssd", 64<<20)
		}},
		{"the largest segment size with a 64 MiB tier", "capacity", func(o *Options) {
			o.SegmentSize = MaxSegmentSize
			o.Tiers = diskTierOf("/store/ssd", 64<<20)
		}},
		{"segment size 2^62 without tiers", "segment size", func(o *Options) { o.SegmentSize = 1 << 62 }},
		{"segment size above the maximum", "segment size", func(o *Options) { o.SegmentSize = MaxSegmentSize + format.Alignment }},
		{"segment size below the minimum", "segment size", func(o *Options) { o.SegmentSize = MinSegmentSize - format.Alignment }},
		{"segment size unaligned", "segment size", func(o *Options) { o.SegmentSize = MinSegmentSize + 1 }},
		{"compact live ratio NaN", "compact live ratio", func(o *Options) { o.CompactLiveRatio = math.NaN() }},
		{"compact live ratio 1", "compact live ratio", func(o *Options) { o.CompactLiveRatio = 1 }},
		{"compress min saving NaN", "compress min saving", func(o *Options) { o.CompressMinSaving = math.NaN() }},
		{"sync interval of centuries", "sync interval", func(o *Options) { o.SyncInterval = math.MaxInt64 }},
		{"owner timeout under 4 refreshes (4×refresh overflowed)", "owner timeout", func(o *Options) {
			o.SharedRefreshInterval = math.MaxInt64 / 2
			o.SharedOwnerTimeout = time.Hour
		}},
		{"tier too small for two default segments of its own size", "capacity", func(o *Options) {
			o.Layout = Layout{Shards: 1, TensorsPerShard: 1, ShardBytes: 1 << 20}
			o.SegmentSize = 0
			o.Tiers = diskTierOf("/store/ssd", 2<<20) // two 1 MiB segments, but a record is larger
		}},
		{"watermark NaN", "high_watermark", func(o *Options) {
			o.Tiers = diskTierOf("/store/ssd", 1<<30)
			o.Tiers[0].HighWatermark = math.NaN()
		}},
	}
	for _, c := range cases {
		o := testOptions(fs, mhaLayout)
		c.edit(&o)
		e, err := Open("/store", o)
		if err == nil {
			e.Close()
			t.Errorf("%s: opened", c.name)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming %q", c.name, err, c.field)
		}
	}
}

// TestSegmentSizeFromCapacity: without SegmentSize each disk tier's segments are 1/64 of its
// capacity (1 MiB to 256 MiB), so a small tier evicts in small steps; the size is reported; an
// explicit SegmentSize applies to every tier.
func TestSegmentSizeFromCapacity(t *testing.T) {
	for _, c := range []struct{ capacity, want int64 }{
		{0, DefaultSegmentSize},
		{1 << 30, 16 << 20},
		{1<<30 + 1<<29, 16 << 20},
		{64 << 20, 1 << 20},
		{8 << 20, 1 << 20},
		{100 << 30, 256 << 20},
		{math.MaxInt64, 256 << 20},
	} {
		if got := SegmentSizeFor(0, c.capacity); got != c.want {
			t.Errorf("SegmentSizeFor(0, %d) = %d, want %d", c.capacity, got, c.want)
		}
		if got := SegmentSizeFor(4<<20, c.capacity); got != 4<<20 {
			t.Errorf("SegmentSizeFor(4 MiB, %d) = %d, want the configured size", c.capacity, got)
		}
	}
	_, fs := memFS()
	o := testOptions(fs, mhaLayout)
	o.SegmentSize = 0
	o.Tiers = []tiers.Config{
		{Name: "fast", Kind: tiers.KindDisk, Paths: []string{"/store/fast"}, Capacity: 1 << 30},
		{Name: "big", Kind: tiers.KindDisk, Paths: []string{"/store/big"}},
	}
	e := mustOpen(t, "/store", o)
	ids := []BlockID{blockID(1), blockID(2)}
	dumpBlocks(t, e, ids)
	checkBlocks(t, e, ids)
	st := e.TierStats()
	if st[0].SegmentSize != 16<<20 || st[1].SegmentSize != DefaultSegmentSize {
		t.Errorf("segment sizes %d, %d; want %d (1 GiB tier), %d (unlimited)", st[0].SegmentSize, st[1].SegmentSize, 16<<20, DefaultSegmentSize)
	}
	for _, s := range st {
		if s.Used < 0 || (s.Capacity > 0 && s.Used > s.Capacity) {
			t.Errorf("tier %s: used %d of capacity %d", s.Name, s.Used, s.Capacity)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// Without tiers: the one unlimited tier, default-size segments, used never negative.
	o = testOptions(fs, mhaLayout)
	o.SegmentSize = 0
	e = mustOpen(t, "/store2", o)
	defer e.Close()
	dumpBlocks(t, e, ids)
	if st := e.TierStats(); st[0].SegmentSize != DefaultSegmentSize || st[0].Used <= 0 {
		t.Errorf("default tier: segment size %d, used %d", st[0].SegmentSize, st[0].Used)
	}
}

// FuzzOptionsValidate: Validate never panics, and options it accepts are usable: segment sizes
// in range, every capacity-limited disk tier holds two of its segments (checked without
// overflow), ratios in range, durations non-negative.
func FuzzOptionsValidate(f *testing.F) {
	f.Add(int64(1<<62), int64(64<<20), 0.5, 0.125, int64(0), int64(0), int64(0), 0.9, 0.8, int64(8192), uint8(4))
	f.Add(int64(0), int64(1<<30), math.NaN(), 0.125, int64(100), int64(1e9), int64(0), 0.9, 0.8, int64(1<<20), uint8(32))
	f.Add(int64(1<<20), int64(0), 0.5, 1.0, int64(-1), int64(math.MaxInt64), int64(math.MaxInt64), 1.0, 0.5, int64(4096), uint8(1))
	f.Fuzz(func(t *testing.T, seg, capacity int64, ratio, saving float64, syncEvery, refresh, owner int64, high, low float64, shardBytes int64, shards uint8) {
		o := Options{
			Layout:                Layout{Shards: int(shards), TensorsPerShard: 1, ShardBytes: shardBytes},
			Schema:                testSchema,
			SegmentSize:           seg,
			CompactLiveRatio:      ratio,
			CompressMinSaving:     saving,
			SyncInterval:          time.Duration(syncEvery),
			SharedRefreshInterval: time.Duration(refresh),
			SharedOwnerTimeout:    time.Duration(owner),
		}
		if capacity != 0 {
			o.Tiers = diskTierOf("/store/ssd", capacity)
			o.Tiers[0].HighWatermark, o.Tiers[0].LowWatermark = high, low
		}
		o = o.withDefaults()
		if err := o.Validate(); err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("Validate: %v, not ErrInvalidArgument", err)
			}
			return
		}
		if o.SegmentSize != 0 && (o.SegmentSize < MinSegmentSize || o.SegmentSize > MaxSegmentSize) {
			t.Fatalf("accepted segment size %d", o.SegmentSize)
		}
		if !(o.CompactLiveRatio > 0 && o.CompactLiveRatio < 1) || !(o.CompressMinSaving > 0 && o.CompressMinSaving <= 1) {
			t.Fatalf("accepted ratios %v, %v", o.CompactLiveRatio, o.CompressMinSaving)
		}
		if o.SyncInterval < 0 || o.SharedOwnerTimeout < o.SharedRefreshInterval {
			t.Fatalf("accepted sync interval %v, owner timeout %v, refresh %v", o.SyncInterval, o.SharedOwnerTimeout, o.SharedRefreshInterval)
		}
		rec := o.Layout.RecordBytes()
		if rec <= 0 || rec > format.MaxPayloadBytes+format.RecordHeaderSize {
			t.Fatalf("accepted layout %+v: record %d bytes", o.Layout, rec)
		}
		for _, tc := range o.Tiers {
			if tc.Capacity <= 0 {
				continue
			}
			size := max(SegmentSizeFor(o.SegmentSize, tc.Capacity), format.SegmentHeaderSize+rec+format.FooterSize(1))
			if size <= 0 || size > tc.Capacity/2 {
				t.Fatalf("accepted tier capacity %d with segments of %d", tc.Capacity, size)
			}
		}
	})
}
