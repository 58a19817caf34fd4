package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/mooncakefake"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func mcCfg(object string) MooncakeConfig {
	return MooncakeConfig{MetadataServer: "http://127.0.0.1:1/metadata", MasterServerAddress: "127.0.0.1:2", Object: object,
		StagingBytes: 1 << 20, HealthIntervalMs: 3600_000, ResetAfter: 3}.WithDefaults()
}

var mcLayout = format.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 4096}

func mcBlock(seed int) (format.BlockID, []byte, []uint32) {
	r := rand.New(rand.NewSource(int64(seed)))
	var id format.BlockID
	r.Read(id[:])
	data := make([]byte, mcLayout.BlockBytes())
	r.Read(data)
	crcs := make([]uint32, mcLayout.Shards)
	for s := range crcs {
		crcs[s] = format.Checksum(data[int64(s)*mcLayout.ShardBytes : int64(s+1)*mcLayout.ShardBytes])
	}
	return id, data, crcs
}

func newMC(t *testing.T, object string, pool MooncakePool) *MooncakeTier {
	t.Helper()
	mc, err := NewMooncakeTier("pool", mcCfg(object), pool, mcLayout, format.Fingerprint{1, 2, 3}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mc.Close() })
	return mc
}

func getOne(mc *MooncakeTier, id format.BlockID, shard int) ([]byte, bool) {
	n := mcLayout.BlockBytes()
	if shard >= 0 {
		n = mcLayout.ShardBytes
	}
	dst := make([]byte, n)
	crcs := make([][]uint32, 1)
	hits, err := mc.Load([]format.BlockID{id}, shard, nil, func(int) []byte { return dst }, crcs)
	if err != nil {
		panic(err) // the tier logs its rejections: Load's error is nil
	}
	hit := hits[0]
	if hit && shard < 0 {
		for s, c := range crcs[0] {
			if c != format.Checksum(dst[int64(s)*mcLayout.ShardBytes:int64(s+1)*mcLayout.ShardBytes]) || len(crcs[0]) != mcLayout.Shards {
				panic("Load returned checksums that are not the block's")
			}
		}
	}
	return dst, hit
}

func TestMooncakeConfigValidate(t *testing.T) {
	good := Config{Name: "pool", Kind: KindMooncake, Mooncake: &MooncakeConfig{MetadataServer: "http://h:1/metadata", MasterServerAddress: "h:2"}}
	disk := Config{Name: "ssd", Kind: KindDisk, Paths: []string{"/tmp/x"}}
	mem := Config{Name: "dram", Kind: KindMemory, Capacity: 1 << 20}
	if err := Validate([]Config{mem, good, disk}); err != nil {
		t.Fatalf("memory | mooncake | disk: %v", err)
	}
	if c := good.WithDefaults().Mooncake; c.Object != "block" || c.Protocol != "tcp" || c.GlobalSegmentSize != 0 || c.Replicas != 1 {
		t.Fatalf("defaults: %+v", c)
	}
	if c := (Config{Name: "p", Kind: KindMooncake}).WithDefaults().Mooncake; c == nil || c.GlobalSegmentSize != DefaultMooncakeGlobalSegmentSize {
		t.Fatalf("absent mooncake mapping: %+v", c)
	}
	bad := func(mut func(c *Config)) Config {
		c := good
		m := *good.Mooncake
		c.Mooncake = &m
		mut(&c)
		return c
	}
	for _, tc := range []struct {
		list  []Config
		field string
	}{
		{[]Config{bad(func(c *Config) { c.Mooncake.MetadataServer = "" }), disk}, "mooncake.metadata_server"},
		{[]Config{bad(func(c *Config) { c.Mooncake.MasterServerAddress = "" }), disk}, "mooncake.master_server_address"},
		{[]Config{bad(func(c *Config) { c.Mooncake.MasterServerAddress = "nohostport" }), disk}, "mooncake.master_server_address"},
		{[]Config{bad(func(c *Config) { c.Mooncake.Protocol = "udp" }), disk}, "mooncake.protocol"},
		{[]Config{bad(func(c *Config) { c.Mooncake.Object = "page" }), disk}, "mooncake.object"},
		{[]Config{bad(func(c *Config) { c.Mooncake.KeyPrefix = "a/b" }), disk}, "mooncake.key_prefix"},
		{[]Config{bad(func(c *Config) { c.Mooncake.Replicas = 99 }), disk}, "mooncake.replica_num"},
		{[]Config{bad(func(c *Config) { c.Mooncake.GlobalSegmentSize = -1 }), disk}, "mooncake.global_segment_size"},
		{[]Config{bad(func(c *Config) { c.Mooncake.StagingBytes = -1 }), disk}, "mooncake.staging_bytes"},
		{[]Config{bad(func(c *Config) { c.Mooncake.HealthIntervalMs = -5 }), disk}, "mooncake.health_interval_ms"},
		{[]Config{bad(func(c *Config) { c.Mooncake.ResetAfter = -1 }), disk}, "mooncake.reset_after"},
		{[]Config{bad(func(c *Config) { c.Capacity = 5 }), disk}, "capacity"},
		{[]Config{bad(func(c *Config) { c.Paths = []string{"/x"} }), disk}, "kind"},
		{[]Config{disk, good}, "kind"},
		{[]Config{good, bad(func(c *Config) { c.Name = "pool2" }), disk}, "kind"},
		{[]Config{good, {Name: "ssd", Kind: KindDisk, Paths: []string{"/tmp/x"}, Mooncake: &MooncakeConfig{}}}, "mooncake"},
		{[]Config{good}, "tiers"},
	} {
		err := Validate(tc.list)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("want a ConfigError on %s, got %v", tc.field, err)
		}
	}
}

// copyChecked, with and without non-temporal stores, copies every byte of a block (odd
// alignments included) and names the first part whose bytes do not match its checksum.
func TestCopyChecked(t *testing.T) {
	const parts, part = 4, 300 << 10 // 1.2 MiB: past memcopy.MinOp
	src := make([]byte, parts*part+64)
	for i := range src {
		src[i] = byte(i*7 + i>>11)
	}
	for _, stream := range []bool{false, true} {
		for _, off := range []int{0, 1, 33} {
			s := src[off : off+parts*part]
			crcs := make([]uint32, parts)
			for i := range crcs {
				crcs[i] = format.Checksum(s[i*part : (i+1)*part])
			}
			dst := make([]byte, len(s)+off)[off:]
			if bad := copyChecked(dst, s, crcs, stream); bad != -1 || !bytes.Equal(dst, s) {
				t.Fatalf("stream %v, offset %d: bad part %d, copy intact %v", stream, off, bad, bytes.Equal(dst, s))
			}
			wrong := append([]uint32(nil), crcs...)
			wrong[2] ^= 1
			if bad := copyChecked(dst, s, wrong, stream); bad != 2 {
				t.Fatalf("stream %v, offset %d: part 2's checksum wrong, copyChecked named part %d", stream, off, bad)
			}
		}
	}
}

func TestMooncakeHeaderRoundTripAndRejects(t *testing.T) {
	id, data, crcs := mcBlock(1)
	o := mcObject{id: id, fp: format.Fingerprint{9}, kind: mcKindBlock, payload: int64(len(data)), parts: len(crcs)}
	obj := make([]byte, o.size())
	h := encodeHeader(obj, o, crcs)
	copy(obj[h:], data)
	got, err := decodeHeader(obj, o.size(), o)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(crcs) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	other := o
	other.id[0] ^= 1
	otherFP := o
	otherFP.fp[0] ^= 1
	otherKind := o
	otherKind.kind = mcKindShard
	otherParts := o
	otherParts.parts++
	for name, want := range map[string]mcObject{"id": other, "fingerprint": otherFP, "kind": otherKind, "parts": otherParts} {
		if _, err := decodeHeader(obj, o.size(), want); !errors.Is(err, ErrMooncakeObject) || !errors.Is(err, format.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := decodeHeader(obj, o.size()-1, o); !errors.Is(err, ErrMooncakeObject) {
		t.Errorf("short object: %v", err)
	}
	for i := 0; i < h; i++ { // every header byte is covered
		bad := bytes.Clone(obj)
		bad[i] ^= 0x40
		if _, err := decodeHeader(bad, o.size(), o); err == nil {
			if i >= mcFixedBytes+4*len(crcs)+4 { // padding
				continue
			}
			t.Fatalf("header byte %d flipped: accepted", i)
		}
	}
}

func FuzzDecodeMooncakeHeader(f *testing.F) {
	id, data, crcs := mcBlock(2)
	o := mcObject{id: id, kind: mcKindBlock, payload: int64(len(data)), parts: len(crcs)}
	obj := make([]byte, o.size())
	encodeHeader(obj, o, crcs)
	f.Add(obj[:mcHeaderBytes(len(crcs))], int64(len(obj)), 4)
	f.Add([]byte("UCMMCOB1"), int64(8), 1)
	f.Fuzz(func(t *testing.T, b []byte, got int64, parts int) {
		want := mcObject{id: id, kind: mcKindBlock, payload: int64(len(b)) - int64(mcHeaderBytes(max(parts, 1))), parts: parts}
		crcs, err := decodeHeader(b, got, want)
		if err == nil && len(crcs) != parts {
			t.Fatalf("%d checksums for %d parts", len(crcs), parts)
		}
	})
}

func TestMooncakePutGet(t *testing.T) {
	for _, object := range []string{"block", "shard"} {
		t.Run(object, func(t *testing.T) {
			st := mooncakefake.NewStore()
			mc := newMC(t, object, mooncakefake.New(st))
			id, data, crcs := mcBlock(3)
			mc.Put(id, data, crcs)
			mc.Flush()
			if s := mc.Stats(); s.Puts != 1 || s.PutsDropped != 0 {
				t.Fatalf("stats after put: %+v", s)
			}
			wantKeys := 1
			if object == "shard" {
				wantKeys = mcLayout.Shards
			}
			if n := len(st.Keys()); n != wantKeys {
				t.Fatalf("%d objects stored, want %d", n, wantKeys)
			}
			got, ok := getOne(mc, id, -1)
			if !ok || !bytes.Equal(got, data) {
				t.Fatal("whole block not loaded intact")
			}
			for s := 0; s < mcLayout.Shards; s++ {
				got, ok := getOne(mc, id, s)
				if !ok || !bytes.Equal(got, data[int64(s)*mcLayout.ShardBytes:int64(s+1)*mcLayout.ShardBytes]) {
					t.Fatalf("shard %d not loaded intact", s)
				}
			}
			if !mc.Lookup([]format.BlockID{id}, nil)[0] {
				t.Fatal("Lookup: false for a stored block")
			}
			other, _, _ := mcBlock(4)
			if _, ok := getOne(mc, other, -1); ok {
				t.Fatal("absent block loaded")
			}
			if mc.Lookup([]format.BlockID{other}, nil)[0] {
				t.Fatal("Lookup: true for an absent block")
			}
			// A second client of the same pool (another engine) reads it.
			mc2 := newMC(t, object, mooncakefake.New(st))
			if got, ok := getOne(mc2, id, -1); !ok || !bytes.Equal(got, data) {
				t.Fatal("second client: block not loaded intact")
			}
			// The same block put again (another client dumped it too) is not an error.
			mc2.Put(id, data, crcs)
			mc2.Flush()
			if s := mc2.Stats(); s.Puts != 1 || s.Errors != 0 {
				t.Fatalf("re-put: %+v", s)
			}
		})
	}
}

// Objects that are not the block asked for are misses, never bytes: a stale object of another
// block under the key, another schema's, a damaged payload or header, a truncated or longer
// object.
func TestMooncakeRejectsWrongObjects(t *testing.T) {
	for _, object := range []string{"block", "shard"} {
		t.Run(object, func(t *testing.T) {
			st := mooncakefake.NewStore()
			mc := newMC(t, object, mooncakefake.New(st))
			id, data, crcs := mcBlock(5)
			id2, data2, crcs2 := mcBlock(6)
			mc.Put(id, data, crcs)
			mc.Put(id2, data2, crcs2)
			mc.Flush()
			key, key2 := mc.key(id, -1), mc.key(id2, -1)
			if object == "shard" {
				key, key2 = mc.key(id, 1), mc.key(id2, 1)
			}
			good, _ := st.Object(key)
			other, _ := st.Object(key2)
			foreign := newMCFP(t, object, mooncakefake.New(mooncakefake.NewStore()), format.Fingerprint{7})
			fobj := make([]byte, len(good))
			fo := foreign.object(id, -1)
			if object == "shard" {
				fo = foreign.object(id, 1)
			}
			h := encodeHeader(fobj, fo, fromShard(crcs, object))
			copy(fobj[h:], good[h:])
			flip := func(i int) []byte { b := bytes.Clone(good); b[i] ^= 1; return b }
			cases := map[string][]byte{
				"stale (another block's object)": other,
				"another schema":                 fobj,
				"payload byte flipped":           flip(len(good) - 1),
				"header byte flipped":            flip(20),
				"truncated":                      good[:len(good)-1],
				"longer":                         append(bytes.Clone(good), 0),
				"empty":                          {},
			}
			rejected := mc.Stats().Rejected
			for name, obj := range cases {
				st.Set(key, obj)
				dst := bytes.Repeat([]byte{0xAA}, int(mcLayout.BlockBytes()))
				if hits, _ := mc.Load([]format.BlockID{id}, -1, nil, func(int) []byte { return dst }, nil); hits[0] {
					t.Errorf("%s: loaded", name)
				}
				if name != "empty" {
					if s := mc.Stats(); s.Rejected <= rejected {
						t.Errorf("%s: not counted as rejected", name)
					} else {
						rejected = s.Rejected
					}
				}
			}
			st.Set(key, good)
			if got, ok := getOne(mc, id, -1); !ok || !bytes.Equal(got, data) {
				t.Fatal("intact object not loaded")
			}
			if s := mc.Stats(); s.Up != true || s.Errors != 0 {
				t.Fatalf("rejections took the tier down or counted as errors: %+v", s)
			}
		})
	}
}

func fromShard(crcs []uint32, object string) []uint32 {
	if object == "shard" {
		return crcs[1:2]
	}
	return crcs
}

func newMCFP(t *testing.T, object string, pool MooncakePool, fp format.Fingerprint) *MooncakeTier {
	mc, err := NewMooncakeTier("pool", mcCfg(object), pool, mcLayout, fp, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mc.Close() })
	return mc
}

// The schema fingerprint is in the key: another schema's tier neither sees nor loads the block.
func TestMooncakeSchemaIsolation(t *testing.T) {
	st := mooncakefake.NewStore()
	a := newMCFP(t, "block", mooncakefake.New(st), format.Fingerprint{1})
	b := newMCFP(t, "block", mooncakefake.New(st), format.Fingerprint{2})
	id, data, crcs := mcBlock(7)
	a.Put(id, data, crcs)
	a.Flush()
	if b.Lookup([]format.BlockID{id}, nil)[0] {
		t.Fatal("another schema's tier sees the block")
	}
	if _, ok := getOne(b, id, -1); ok {
		t.Fatal("another schema's tier loads the block")
	}
}

// Transport failures: a failed batch or per-key transport codes are misses and counted; while
// the client is unhealthy the tier goes down and is skipped; it rejoins when healthy again, and
// after ResetAfter failed checks the client is set up anew.
func TestMooncakeDownAndRejoin(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := mooncakefake.New(st)
	mc := newMC(t, "block", pool)
	id, data, crcs := mcBlock(8)
	mc.Put(id, data, crcs)
	mc.Flush()

	// A transport code on a get, client still healthy: a miss and an error, tier stays up.
	st.GetCode = mooncakefake.CodeTransferFail
	if _, ok := getOne(mc, id, -1); ok {
		t.Fatal("transfer failure loaded")
	}
	if s := mc.Stats(); !s.Up || s.Errors != 1 || s.Downs != 0 {
		t.Fatalf("after a transfer failure: %+v", s)
	}
	st.GetCode = 0

	// The master goes away: the batch fails, the client is unhealthy: down.
	st.SetDown(true)
	if _, ok := getOne(mc, id, -1); ok {
		t.Fatal("loaded with the master down")
	}
	if s := mc.Stats(); s.Up || s.Downs != 1 {
		t.Fatalf("after the master went down: %+v", s)
	}
	// Skipped: no call reaches the pool.
	gets := st.Gets
	if _, ok := getOne(mc, id, -1); ok {
		t.Fatal("loaded while down")
	}
	if mc.Lookup([]format.BlockID{id}, nil)[0] {
		t.Fatal("Lookup while down")
	}
	mc.Put(id, data, crcs)
	mc.Flush()
	if s := mc.Stats(); st.Gets != gets || s.Skipped != 3 || s.PutsDropped != 1 {
		t.Fatalf("while down: gets %d→%d, %+v", gets, st.Gets, s)
	}
	for i := 0; i < 3; i++ {
		mc.checkHealth()
	}
	if pool.ResetCount() != 1 || mc.Stats().Resets != 1 {
		t.Fatalf("no reset after 3 failed checks: %d", pool.ResetCount())
	}
	st.SetDown(false)
	mc.checkHealth()
	if s := mc.Stats(); !s.Up || s.Rejoins != 1 {
		t.Fatalf("after the master came back: %+v", s)
	}
	if got, ok := getOne(mc, id, -1); !ok || !bytes.Equal(got, data) {
		t.Fatal("not loaded after rejoining")
	}
	// A health check alone takes a tier down.
	pool.SetUnhealthy(true)
	mc.checkHealth()
	if mc.Up() {
		t.Fatal("up with an unhealthy client")
	}
	pool.SetUnhealthy(false)
	mc.checkHealth()
	if !mc.Up() {
		t.Fatal("did not rejoin")
	}
}

// checkTransitions fails unless s shows a state its counted transitions lead to, for a tier
// that started up: up after as many rejoins as downs, down after one more down.
func checkTransitions(t *testing.T, when string, s MooncakeStats) {
	t.Helper()
	if s.Up != (s.Downs == s.Rejoins) || s.Downs < s.Rejoins || s.Downs > s.Rejoins+1 {
		t.Errorf("%s: Up %v after %d downs and %d rejoins: %+v", when, s.Up, s.Downs, s.Rejoins, s)
	}
}

// The moment a new state is visible, a stats snapshot shows the transition that led to it,
// whichever way the tier went down (a health check or a failed operation).
func TestMooncakeStatsShowEachTransition(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := mooncakefake.New(st)
	mc := newMC(t, "block", pool)
	published := 0
	mc.statePublished = func() {
		published++
		checkTransitions(t, fmt.Sprintf("transition %d published", published), mc.Stats())
	}
	id, data, crcs := mcBlock(12)
	mc.Put(id, data, crcs)
	mc.Flush()

	pool.SetUnhealthy(true)
	mc.checkHealth() // down
	pool.SetUnhealthy(false)
	mc.checkHealth() // rejoin
	st.SetDown(true)
	if _, ok := getOne(mc, id, -1); ok { // fails, the client is unhealthy: down
		t.Fatal("loaded with the master down")
	}
	st.SetDown(false)
	mc.checkHealth() // rejoin
	if published != 4 {
		t.Fatalf("%d transitions published, want 4", published)
	}
	if s := mc.Stats(); !s.Up || s.Downs != 2 || s.Rejoins != 2 {
		t.Fatalf("after two downs and rejoins: %+v", s)
	}
}

// gatedPool holds the next Get in the pool, as a call to a master that stopped answering hangs,
// until it is released.
type gatedPool struct {
	*mooncakefake.Pool
	entered, release chan struct{}
}

func (g *gatedPool) Get(keys []string, bufs [][]byte) ([]int64, error) {
	if g.entered != nil {
		close(g.entered)
		g.entered = nil
		<-g.release
	}
	return g.Pool.Get(keys, bufs)
}

// A health check that found the client healthy does not bring the tier back when, before it
// acted on it, an operation found the client unhealthy (the master went in between): the tier
// stays down and skipped, no rejoin is counted, and the next check that finds the master back
// brings it up.
func TestMooncakeNoRejoinOnStaleHealthCheck(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := &gatedPool{Pool: mooncakefake.New(st), entered: make(chan struct{}), release: make(chan struct{})}
	entered := pool.entered
	mc := newMC(t, "block", pool)
	id, data, crcs := mcBlock(13)
	mc.Put(id, data, crcs)
	mc.Flush()

	// A load enters the pool and hangs there; meanwhile the client turns unhealthy and the
	// health loop takes the tier down.
	loaded := make(chan bool)
	go func() {
		_, ok := getOne(mc, id, -1)
		loaded <- ok
	}()
	<-entered
	pool.SetUnhealthy(true)
	mc.checkHealth()
	if s := mc.Stats(); s.Up || s.Downs != 1 {
		t.Fatalf("after an unhealthy check: %+v", s)
	}

	// The next check finds the client healthy; before it acts, the master goes away and the
	// hung load fails on it.
	pool.SetUnhealthy(false)
	observed := 0
	mc.healthObserved = func(healthy bool) {
		if observed++; observed == 1 && healthy {
			st.SetDown(true)
			close(pool.release)
			if <-loaded {
				t.Error("loaded from a pool whose master is down")
			}
		}
	}
	mc.checkHealth()
	if observed != 1 {
		t.Fatalf("health observed %d times", observed)
	}
	if s := mc.Stats(); s.Up || s.Rejoins != 0 || s.Downs != 1 {
		t.Fatalf("the stale check brought the tier back: %+v", s)
	}
	gets := st.Gets
	if _, ok := getOne(mc, id, -1); ok || st.Gets != gets {
		t.Fatalf("a load after the stale check reached the pool (gets %d→%d)", gets, st.Gets)
	}

	mc.checkHealth() // the master is still down
	if s := mc.Stats(); s.Up || s.Rejoins != 0 || s.Downs != 1 {
		t.Fatalf("master still down: %+v", s)
	}
	st.SetDown(false)
	mc.checkHealth()
	if s := mc.Stats(); !s.Up || s.Rejoins != 1 || s.Downs != 1 {
		t.Fatalf("master back: %+v", s)
	}
	if got, ok := getOne(mc, id, -1); !ok || !bytes.Equal(got, data) {
		t.Fatal("not loaded after the rejoin")
	}
}

// A full pool refuses puts: dropped and counted, not errors; the other failures are errors.
func TestMooncakePutFailures(t *testing.T) {
	st := mooncakefake.NewStore()
	mc := newMC(t, "block", mooncakefake.New(st))
	st.Capacity = 1
	id, data, crcs := mcBlock(9)
	mc.Put(id, data, crcs)
	mc.Flush()
	if s := mc.Stats(); s.Puts != 0 || s.PutsDropped != 1 || s.Errors != 0 {
		t.Fatalf("full pool: %+v", s)
	}
	st.Capacity = 0
	st.PutCode = mooncakefake.CodeTransferFail
	mc.Put(id, data, crcs)
	mc.Flush()
	if s := mc.Stats(); s.Puts != 0 || s.PutsDropped != 2 || s.Errors != 1 || !s.Up {
		t.Fatalf("failed put: %+v", s)
	}
	st.PutCode = 0
	// Wrong sizes are not written at all.
	mc.Put(id, data[1:], crcs)
	mc.Put(id, data, crcs[1:])
	mc.Flush()
	if s := mc.Stats(); s.Puts != 0 || s.PutsDropped != 2 {
		t.Fatalf("malformed puts: %+v", s)
	}
}

// Puts never block: with every put slot taken, write-throughs are dropped and counted.
func TestMooncakePutNeverBlocks(t *testing.T) {
	st := mooncakefake.NewStore()
	st.SetDown(false)
	mc := newMC(t, "block", mooncakefake.New(st))
	// Take every put slot, as puts stuck in a slow pool would.
	var held [][]byte
	for s := mc.putSlots.tryTake(); s != nil; s = mc.putSlots.tryTake() {
		held = append(held, s)
	}
	id, data, crcs := mcBlock(10)
	mc.Put(id, data, crcs)
	if s := mc.Stats(); s.PutsDropped != 1 {
		t.Fatalf("put with no free slot: %+v", s)
	}
	mc.putSlots.put(held...)
}

func TestMooncakeConcurrent(t *testing.T) {
	for _, object := range []string{"block", "shard"} {
		t.Run(object, func(t *testing.T) {
			st := mooncakefake.NewStore()
			mc := newMC(t, object, mooncakefake.New(st))
			var wg sync.WaitGroup
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; i < 50; i++ {
						id, data, crcs := mcBlock(1000 + (w*50+i)%40)
						if i%2 == 0 {
							mc.Put(id, data, crcs)
							continue
						}
						if got, ok := getOne(mc, id, i%mcLayout.Shards); ok && !bytes.Equal(got, data[int64(i%mcLayout.Shards)*mcLayout.ShardBytes:int64(i%mcLayout.Shards+1)*mcLayout.ShardBytes]) {
							t.Error("wrong bytes")
						}
					}
				}(w)
			}
			wg.Wait()
			mc.Flush()
			if s := mc.Stats(); s.Rejected != 0 || s.Errors != 0 {
				t.Fatalf("%+v", s)
			}
		})
	}
}

func TestMooncakeStagingTooSmall(t *testing.T) {
	cfg := mcCfg("block")
	cfg.StagingBytes = 3 * int64(mcHeaderBytes(mcLayout.Shards)+int(mcLayout.BlockBytes()))
	_, err := NewMooncakeTier("pool", cfg, mooncakefake.New(mooncakefake.NewStore()), mcLayout, format.Fingerprint{}, quiet)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "mooncake.staging_bytes" {
		t.Fatalf("got %v", err)
	}
}

func TestMooncakeCloseClosesPool(t *testing.T) {
	pool := mooncakefake.New(mooncakefake.NewStore())
	mc, err := NewMooncakeTier("pool", mcCfg("block"), pool, mcLayout, format.Fingerprint{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	id, data, crcs := mcBlock(11)
	mc.Put(id, data, crcs)
	if err := mc.Close(); err != nil || !pool.Closed() {
		t.Fatalf("close: %v, pool closed %v", err, pool.Closed())
	}
	mc.Flush() // returns: queued puts were written or dropped
	if _, ok := getOne(mc, id, -1); ok {
		t.Fatal("loaded after close")
	}
}

func TestMooncakeBuiltMatchesOpen(t *testing.T) {
	if MooncakeBuilt {
		t.Skip("built with Mooncake: the real client is tested by make test-mooncake")
	}
	if _, err := OpenMooncakePool(mcCfg("block")); !errors.Is(err, ErrMooncakeNotBuilt) {
		t.Fatalf("got %v", err)
	}
}

// heldPutPool holds every Put in the pool until it is released: each call sends the channel
// that releases it on entered.
type heldPutPool struct {
	*mooncakefake.Pool
	entered chan chan struct{}
}

func (h *heldPutPool) Put(keys []string, bufs [][]byte) ([]int, error) {
	release := make(chan struct{})
	h.entered <- release
	<-release
	return h.Pool.Put(keys, bufs)
}

// enteredPut waits for the next Put to enter the pool and returns its release, or fails the
// test (after releasing everything given) when none does.
func enteredPut(t *testing.T, pool *heldPutPool, why string, held ...chan struct{}) chan struct{} {
	t.Helper()
	select {
	case r := <-pool.entered:
		return r
	case <-time.After(30 * time.Second):
		for _, r := range held {
			close(r)
		}
		t.Fatal(why)
		return nil
	}
}

// Write-throughs are put by more than one batch at a time: while a batch is in the pool (a
// master round trip, transfers), the next queued block is put beside it rather than after it.
func TestMooncakePutsOverlap(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := &heldPutPool{Pool: mooncakefake.New(st), entered: make(chan chan struct{}, 4)}
	mc := newMC(t, "block", pool)
	idA, dataA, crcsA := mcBlock(20)
	mc.Put(idA, dataA, crcsA)
	relA := enteredPut(t, pool, "the first write-through did not reach the pool")
	idB, dataB, crcsB := mcBlock(21)
	mc.Put(idB, dataB, crcsB)
	relB := enteredPut(t, pool, "a second write-through batch did not start while the first was in the pool", relA)
	close(relA)
	close(relB)
	mc.Flush()
	if s := mc.Stats(); s.Puts != 2 || s.PutsDropped != 0 {
		t.Fatalf("%+v", s)
	}
	for _, b := range []struct {
		id   format.BlockID
		data []byte
	}{{idA, dataA}, {idB, dataB}} {
		if got, ok := getOne(mc, b.id, -1); !ok || !bytes.Equal(got, b.data) {
			t.Fatalf("block %v not loaded intact after the overlapping puts", b.id)
		}
	}
}

// Flush waits for the write-throughs queued before it, not for those queued while it waits:
// under a steady stream of dumps from other callers it still returns.
func TestMooncakeFlushWaitsOnlyForEarlierPuts(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := &heldPutPool{Pool: mooncakefake.New(st), entered: make(chan chan struct{}, 4)}
	mc := newMC(t, "block", pool)
	idA, dataA, crcsA := mcBlock(30)
	mc.Put(idA, dataA, crcsA)
	relA := enteredPut(t, pool, "the first write-through did not reach the pool")
	flushed, started := make(chan struct{}), make(chan struct{})
	mc.flushStarted = func() { close(started) }
	go func() { mc.Flush(); close(flushed) }()
	<-started
	mc.flushStarted = nil
	// Queued after the Flush began (it cannot return before A is released), and held.
	idB, dataB, crcsB := mcBlock(31)
	mc.Put(idB, dataB, crcsB)
	relB := enteredPut(t, pool, "the second write-through did not reach the pool", relA)
	select {
	case <-flushed:
		close(relA)
		close(relB)
		t.Fatal("Flush returned before the write-through queued before it was done")
	default:
	}
	close(relA)
	select {
	case <-flushed:
	case <-time.After(30 * time.Second):
		close(relB)
		t.Fatal("Flush waited for a write-through queued after it began")
	}
	if s := mc.Stats(); s.Puts != 1 {
		close(relB)
		t.Fatalf("after Flush: %+v, want the first block put", s)
	}
	close(relB)
	mc.Flush()
	if s := mc.Stats(); s.Puts != 2 || s.PutsDropped != 0 {
		t.Fatalf("%+v", s)
	}
}

// heldGetPool holds every Get in the pool until it is released: each call sends the channel
// that releases it on entered.
type heldGetPool struct {
	*mooncakefake.Pool
	entered chan chan struct{}
}

func (h *heldGetPool) Get(keys []string, bufs [][]byte) ([]int64, error) {
	release := make(chan struct{})
	h.entered <- release
	<-release
	return h.Pool.Get(keys, bufs)
}

// A load of several blocks has two gets in flight at once (the first half is checked while
// the second still moves), and every block arrives intact and checked.
func TestMooncakeLoadOverlapsGets(t *testing.T) {
	for _, object := range []string{"block", "shard"} {
		t.Run(object, func(t *testing.T) {
			st := mooncakefake.NewStore()
			fill := newMC(t, object, mooncakefake.New(st))
			const n = 4
			ids, datas := make([]format.BlockID, n), make([][]byte, n)
			for i := range ids {
				var crcs []uint32
				ids[i], datas[i], crcs = mcBlock(40 + i)
				fill.Put(ids[i], datas[i], crcs)
			}
			fill.Flush()
			pool := &heldGetPool{Pool: mooncakefake.New(st), entered: make(chan chan struct{}, 4)}
			mc := newMC(t, object, pool)
			dst := make([][]byte, n)
			for i := range dst {
				dst[i] = make([]byte, mcLayout.BlockBytes())
			}
			type result struct {
				hits []bool
				err  error
			}
			res := make(chan result, 1)
			go func() {
				hits, err := mc.Load(ids, -1, nil, func(i int) []byte { return dst[i] }, nil)
				res <- result{hits, err}
			}()
			var held []chan struct{}
			for len(held) < 2 {
				select {
				case r := <-pool.entered:
					held = append(held, r)
				case <-time.After(30 * time.Second):
					for _, r := range held {
						close(r)
					}
					<-res
					t.Fatalf("%d get(s) in flight for a load of %d blocks, want 2 at once", len(held), n)
				}
			}
			for _, r := range held {
				close(r)
			}
			r := <-res
			if r.err != nil {
				t.Fatal(r.err)
			}
			for i := range ids {
				if !r.hits[i] || !bytes.Equal(dst[i], datas[i]) {
					t.Fatalf("block %d: hit %v, intact %v", i, r.hits[i], bytes.Equal(dst[i], datas[i]))
				}
			}
			if s := mc.Stats(); s.Hits != n || s.Misses != 0 || s.Rejected != 0 {
				t.Fatalf("%+v", s)
			}
		})
	}
}

// recordingPool records the keys of each Put.
type recordingPool struct {
	*heldPutPool
	mu   sync.Mutex
	puts [][]string
}

func (r *recordingPool) Put(keys []string, bufs [][]byte) ([]int, error) {
	r.mu.Lock()
	r.puts = append(r.puts, append([]string(nil), keys...))
	r.mu.Unlock()
	return r.heldPutPool.Put(keys, bufs)
}

// PutBatch queues its blocks as one group, put in one batch call, and each arrives intact.
func TestMooncakePutBatchOneCall(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := &recordingPool{heldPutPool: &heldPutPool{Pool: mooncakefake.New(st), entered: make(chan chan struct{}, 8)}}
	mc := newMC(t, "block", pool)
	// Both writers busy with a block each, held in the pool.
	var held []chan struct{}
	for i := 0; i < mcPutWorkers; i++ {
		id, data, crcs := mcBlock(50 + i)
		mc.Put(id, data, crcs)
		held = append(held, enteredPut(t, pool.heldPutPool, "a write-through did not reach the pool", held...))
	}
	const n = 4
	ids, datas, crcss := make([]format.BlockID, n), make([][]byte, n), make([][]uint32, n)
	for i := range ids {
		ids[i], datas[i], crcss[i] = mcBlock(60 + i)
	}
	mc.PutBatch(ids, datas, crcss)
	if q := len(mc.putq); q != 1 {
		t.Errorf("%d queue entries for one PutBatch of %d blocks, want 1", q, n)
	}
	for _, r := range held {
		close(r)
	}
	close(enteredPut(t, pool.heldPutPool, "the batch did not reach the pool"))
	mc.Flush()
	pool.mu.Lock()
	last := pool.puts[len(pool.puts)-1]
	pool.mu.Unlock()
	if len(last) != n {
		t.Fatalf("the batch was put with %d keys, want %d", len(last), n)
	}
	for i := range ids {
		if got, ok := getOne(mc, ids[i], -1); !ok || !bytes.Equal(got, datas[i]) {
			t.Fatalf("block %d not loaded intact", i)
		}
	}
	if s := mc.Stats(); s.Puts != n+mcPutWorkers || s.PutsDropped != 0 {
		t.Fatalf("%+v", s)
	}
}

// Two dumps' groups queued while the writers are busy go to two writers, side by side, not
// into one call.
func TestMooncakeGroupsGoToTwoWriters(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := &recordingPool{heldPutPool: &heldPutPool{Pool: mooncakefake.New(st), entered: make(chan chan struct{}, 8)}}
	mc := newMC(t, "block", pool)
	var held []chan struct{}
	for i := 0; i < mcPutWorkers; i++ {
		id, data, crcs := mcBlock(70 + i)
		mc.Put(id, data, crcs)
		held = append(held, enteredPut(t, pool.heldPutPool, "a write-through did not reach the pool", held...))
	}
	for g := 0; g < 2; g++ {
		ids, datas, crcss := make([]format.BlockID, mcMaxPutBatch), make([][]byte, mcMaxPutBatch), make([][]uint32, mcMaxPutBatch)
		for i := range ids {
			ids[i], datas[i], crcss[i] = mcBlock(100 + g*mcMaxPutBatch + i)
		}
		mc.PutBatch(ids, datas, crcss)
	}
	for _, r := range held {
		close(r)
	}
	a := enteredPut(t, pool.heldPutPool, "the first group did not reach the pool")
	b := enteredPut(t, pool.heldPutPool, "the second group was not put beside the first", a)
	close(a)
	close(b)
	mc.Flush()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	for _, keys := range pool.puts[mcPutWorkers:] {
		if len(keys) != mcMaxPutBatch {
			t.Fatalf("puts of %d keys after the held ones, want %d each", len(keys), mcMaxPutBatch)
		}
	}
	if s := mc.Stats(); s.Puts != 2*mcMaxPutBatch+mcPutWorkers || s.PutsDropped != 0 {
		t.Fatalf("%+v", s)
	}
}

// BenchmarkCopyChecked measures a block load's checked copy out of staging, 2 MiB blocks of 32
// parts, with ordinary stores (cached) and non-temporal ones (stream), interleaved in every
// iteration and timed one by one: the staging slot was just written (by the transport, here a
// copy), in cache; the destination rotates through 256 MiB, as a connector's buffers would.
// Each variant's GB/s is from its median time.
//
//	go test -tags uring,isal -ldflags=-checklinkname=0 -run '^$' -bench CopyChecked -benchtime 600x ./tiers/
func BenchmarkCopyChecked(b *testing.B) {
	const blk, parts, area = 2 << 20, 32, 256 << 20
	staging, dsts := make([]byte, area), make([]byte, area)
	for i := range staging {
		staging[i], dsts[i] = byte(i), byte(i>>9)
	}
	crcs := make([]uint32, parts)
	slots := area / blk
	var took [2][]time.Duration
	b.SetBytes(2 * blk)
	for i := 0; i < b.N; i++ {
		for k := 0; k < 2; k++ {
			w := (i + k) % 2
			src := staging[((2*i+k)%slots)*blk:][:blk]
			copy(src, dsts[((7*i+k)%slots)*blk:][:blk]) // the transport's write into the slot
			for p := range crcs {
				crcs[p] = format.Checksum(src[p*blk/parts : (p+1)*blk/parts])
			}
			dst := dsts[((5*i+k+1)%slots)*blk:][:blk]
			t0 := time.Now()
			if bad := copyChecked(dst, src, crcs, w == 1); bad >= 0 {
				b.Fatalf("part %d", bad)
			}
			took[w] = append(took[w], time.Since(t0))
		}
	}
	for w, name := range []string{"cached-GB/s", "stream-GB/s"} {
		slices.Sort(took[w])
		b.ReportMetric(float64(blk)/took[w][len(took[w])/2].Seconds()/1e9, name)
	}
}

// freePutSlots counts the put slots free for a copy or a loan.
func freePutSlots(mc *MooncakeTier) int {
	mc.putSlots.mu.Lock()
	defer mc.putSlots.mu.Unlock()
	return len(mc.putSlots.free)
}

// A block dumped into a lent payload is put from there (no copy into a put slot) and loads
// back intact; the slot is free again only once both its borrower and its put let go of it,
// in either order.
func TestMooncakeLendPayload(t *testing.T) {
	st := mooncakefake.NewStore()
	pool := &heldPutPool{Pool: mooncakefake.New(st), entered: make(chan chan struct{}, 4)}
	mc := newMC(t, "block", pool)
	free := freePutSlots(mc)

	// Put done first, then the payload returned.
	idA, dataA, crcsA := mcBlock(30)
	p := mc.LendPayload()
	if int64(len(p)) != mcLayout.BlockBytes() || uintptr(unsafe.Pointer(&p[0]))%format.Alignment != 0 {
		t.Fatalf("lent %d bytes at %p: want %d, 4 KiB-aligned", len(p), &p[0], mcLayout.BlockBytes())
	}
	copy(p, dataA)
	mc.PutBatch([]format.BlockID{idA}, [][]byte{p}, [][]uint32{crcsA})
	close(enteredPut(t, pool, "the lent block's put did not reach the pool"))
	mc.Flush()
	if n := freePutSlots(mc); n != free-1 {
		t.Fatalf("after the put, before the return: %d free put slots, want %d (the borrower holds one)", n, free-1)
	}
	if !mc.ReturnPayload(p) {
		t.Fatal("ReturnPayload did not know its own payload")
	}
	if n := freePutSlots(mc); n != free {
		t.Fatalf("after the put and the return: %d free put slots, want %d", n, free)
	}
	if mc.ReturnPayload(p) {
		t.Fatal("a payload returned twice was taken twice")
	}

	// Payload returned while its put is still in the pool: the slot waits for the put.
	idB, dataB, crcsB := mcBlock(31)
	p = mc.LendPayload()
	copy(p, dataB)
	mc.PutBatch([]format.BlockID{idB}, [][]byte{p}, [][]uint32{crcsB})
	release := enteredPut(t, pool, "the second lent block's put did not reach the pool")
	if !mc.ReturnPayload(p) {
		t.Fatal("ReturnPayload did not know its own payload")
	}
	if n := freePutSlots(mc); n != free-1 {
		close(release)
		t.Fatalf("returned while its put is in the pool: %d free put slots, want %d", n, free-1)
	}
	close(release)
	mc.Flush()
	if n := freePutSlots(mc); n != free {
		t.Fatalf("after the put: %d free put slots, want %d", n, free)
	}

	// A block from the caller's own memory is copied, as before.
	idC, dataC, crcsC := mcBlock(32)
	mc.PutBatch([]format.BlockID{idC}, [][]byte{dataC}, [][]uint32{crcsC})
	close(enteredPut(t, pool, "the copied block's put did not reach the pool"))
	mc.Flush()
	if s := mc.Stats(); s.Puts != 3 || s.PutsLent != 2 || s.PutsDropped != 0 {
		t.Fatalf("%+v", s)
	}
	for _, b := range []struct {
		id   format.BlockID
		data []byte
	}{{idA, dataA}, {idB, dataB}, {idC, dataC}} {
		if got, ok := getOne(mc, b.id, -1); !ok || !bytes.Equal(got, b.data) {
			t.Fatalf("block %v not loaded intact", b.id)
		}
	}
	if mc.ReturnPayload(dataC) {
		t.Fatal("ReturnPayload took the caller's own memory")
	}
}

// The tier lends nothing it could not put from where it is (shard objects: a block's shards
// are apart, each behind its header) nor while it is down, and a lent payload whose put is
// dropped (the tier went down meanwhile) is still the borrower's to return.
func TestMooncakeLendPayloadRefused(t *testing.T) {
	if p := newMC(t, "shard", mooncakefake.New(mooncakefake.NewStore())).LendPayload(); p != nil {
		t.Fatal("shard objects lent a payload")
	}
	mc := newMC(t, "block", mooncakefake.New(mooncakefake.NewStore()))
	free := freePutSlots(mc)
	p := mc.LendPayload()
	mc.down(errors.New("test: master gone"))
	if q := mc.LendPayload(); q != nil {
		t.Fatal("lent a payload while down")
	}
	id, data, crcs := mcBlock(33)
	copy(p, data)
	mc.PutBatch([]format.BlockID{id}, [][]byte{p}, [][]uint32{crcs})
	mc.Flush()
	if s := mc.Stats(); s.Puts != 0 || s.PutsDropped != 1 {
		t.Fatalf("%+v", s)
	}
	if !mc.ReturnPayload(p) || freePutSlots(mc) != free {
		t.Fatalf("the dropped lent payload was not returned: %d free put slots, want %d", freePutSlots(mc), free)
	}
}
