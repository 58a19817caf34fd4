package tiers

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/memcopy"
)

// KindMooncake is a tier in a Mooncake Store pool (github.com/kvcache-ai/Mooncake): host memory
// pooled across machines by a master, shared by every engine instance that names the same
// master. It is a cache tier, like the memory tier: blocks are written through to it and read
// from it before the disk tiers; the pool evicts on its own, so any block may be gone at any
// time. It takes no paths and no capacity (each client contributes GlobalSegmentSize bytes of
// its memory to the pool). Only a binary built with the `mooncake` tag can open one
// (ErrMooncakeNotBuilt otherwise; docs/mooncake.md).
const KindMooncake Kind = "mooncake"

// ErrMooncakeNotBuilt is the error of opening a mooncake tier in a binary built without the
// `mooncake` build tag (Mooncake's client library is not linked in).
var ErrMooncakeNotBuilt = errors.New("this binary was built without Mooncake support (build with -tags mooncake after tools/mooncake/build.sh; docs/mooncake.md)")

// Defaults of MooncakeConfig, applied by MooncakeConfig.WithDefaults.
const (
	// DefaultMooncakeLocalHostname is the address this client's transfer engine listens on.
	DefaultMooncakeLocalHostname = "127.0.0.1"
	// DefaultMooncakeGlobalSegmentSize is the memory each client contributes to the pool
	// (UCM's default for its MooncakeStore backend, 3.125 GiB).
	DefaultMooncakeGlobalSegmentSize = 3355443200
	// DefaultMooncakeLocalBufferSize is Mooncake's own transfer buffer per client. The tier
	// moves bytes through its own registered staging memory, not this buffer, so the default is
	// smaller than UCM's 1 GiB.
	DefaultMooncakeLocalBufferSize = 16 << 20
	// DefaultMooncakeProtocol is the transfer engine's transport.
	DefaultMooncakeProtocol = "tcp"
	// DefaultMooncakeObject is how blocks map to pool objects: one object per block (see
	// docs/mooncake.md for the measurement against one object per shard).
	DefaultMooncakeObject = "block"
	// DefaultMooncakeKeyPrefix starts every object key the tier writes.
	DefaultMooncakeKeyPrefix = "ucm"
	// DefaultMooncakeReplicas is the number of replicas the master places per object.
	DefaultMooncakeReplicas = 1
	// DefaultMooncakeStagingBytes is the registered host memory the tier stages objects in
	// (half for loads, half for write-through puts).
	DefaultMooncakeStagingBytes = 64 << 20
	// DefaultMooncakeHealthIntervalMs is how often the tier checks the master while up, and
	// tries to rejoin while down.
	DefaultMooncakeHealthIntervalMs = 1000
	// DefaultMooncakeResetAfter is how many failed health checks in a row make the tier drop
	// its client and set up a new one.
	DefaultMooncakeResetAfter = 10
	// maxMooncakeStagingBytes bounds StagingBytes (registered, pinned memory).
	maxMooncakeStagingBytes = 64 << 30
)

// MooncakeConfig configures a KindMooncake tier. The first seven keys are those of UCM's
// MooncakeStore backend and of Mooncake's own client configuration (MOONCAKE_CONFIG_PATH), with
// the same meanings.
type MooncakeConfig struct {
	// LocalHostname is this client's address for the transfer engine (default 127.0.0.1). Set
	// MC_TCP_BIND_ADDRESS to the same address so that the TCP transport binds it.
	LocalHostname string `yaml:"local_hostname" json:"local_hostname"`
	// MetadataServer is the transfer engine's metadata service, e.g.
	// "http://127.0.0.1:8080/metadata" (the master's embedded HTTP metadata server). Required.
	MetadataServer string `yaml:"metadata_server" json:"metadata_server"`
	// MasterServerAddress is the master's RPC address, host:port. Required.
	MasterServerAddress string `yaml:"master_server_address" json:"master_server_address"`
	// GlobalSegmentSize is the memory, in bytes, this client contributes to the pool (default
	// 3.125 GiB; 0 contributes none: the client only uses the others' memory).
	GlobalSegmentSize int64 `yaml:"global_segment_size" json:"global_segment_size"`
	// LocalBufferSize is Mooncake's per-client transfer buffer in bytes (default 16 MiB).
	LocalBufferSize int64 `yaml:"local_buffer_size" json:"local_buffer_size"`
	// Protocol is "tcp" (default) or "rdma".
	Protocol string `yaml:"protocol" json:"protocol"`
	// DeviceName is the RDMA device ("" for TCP or automatic discovery).
	DeviceName string `yaml:"device_name" json:"device_name"`

	// Object is "block" (default: one object per block, all shards) or "shard" (one object per
	// shard, so a single-shard load moves one shard).
	Object string `yaml:"object" json:"object"`
	// KeyPrefix starts every object key (default "ucm"): keys are
	// <prefix>/<schema fingerprint>/<block id>[/<shard>]. Instances that should share blocks use
	// the same prefix; the fingerprint keeps other models' blocks apart.
	KeyPrefix string `yaml:"key_prefix" json:"key_prefix"`
	// Replicas is the number of replicas per object (default 1).
	Replicas int `yaml:"replica_num" json:"replica_num"`
	// StagingBytes is the registered memory the tier stages objects in (default 64 MiB); it
	// must hold at least two staged blocks for loads and two for puts.
	StagingBytes int64 `yaml:"staging_bytes" json:"staging_bytes"`
	// HealthIntervalMs is the health-check period in milliseconds (default 1000).
	HealthIntervalMs int `yaml:"health_interval_ms" json:"health_interval_ms"`
	// ResetAfter is the number of failed health checks in a row after which the client is
	// dropped and set up again (default 10).
	ResetAfter int `yaml:"reset_after" json:"reset_after"`
}

// WithDefaults returns c with every zero field but GlobalSegmentSize set to its default
// (GlobalSegmentSize 0 is meaningful; -1 is not accepted, so the default is applied only when
// the whole configuration was absent: see Config.WithDefaults).
func (c MooncakeConfig) WithDefaults() MooncakeConfig {
	if c.LocalHostname == "" {
		c.LocalHostname = DefaultMooncakeLocalHostname
	}
	if c.LocalBufferSize == 0 {
		c.LocalBufferSize = DefaultMooncakeLocalBufferSize
	}
	if c.Protocol == "" {
		c.Protocol = DefaultMooncakeProtocol
	}
	if c.Object == "" {
		c.Object = DefaultMooncakeObject
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultMooncakeKeyPrefix
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultMooncakeReplicas
	}
	if c.StagingBytes == 0 {
		c.StagingBytes = DefaultMooncakeStagingBytes
	}
	if c.HealthIntervalMs == 0 {
		c.HealthIntervalMs = DefaultMooncakeHealthIntervalMs
	}
	if c.ResetAfter == 0 {
		c.ResetAfter = DefaultMooncakeResetAfter
	}
	return c
}

// validate checks c (defaults applied) and returns the YAML field at fault and why.
func (c MooncakeConfig) validate() (field, reason string) {
	switch {
	case strings.TrimSpace(c.MetadataServer) == "":
		return "mooncake.metadata_server", "required (e.g. http://127.0.0.1:8080/metadata)"
	case strings.TrimSpace(c.MasterServerAddress) == "":
		return "mooncake.master_server_address", "required (host:port of mooncake_master)"
	case !strings.Contains(c.MasterServerAddress, ":"):
		return "mooncake.master_server_address", fmt.Sprintf("%q: want host:port", c.MasterServerAddress)
	case c.GlobalSegmentSize < 0:
		return "mooncake.global_segment_size", fmt.Sprintf("%d: want >= 0", c.GlobalSegmentSize)
	case c.LocalBufferSize < 0:
		return "mooncake.local_buffer_size", fmt.Sprintf("%d: want > 0", c.LocalBufferSize)
	case c.Protocol != "tcp" && c.Protocol != "rdma":
		return "mooncake.protocol", fmt.Sprintf("%q: want tcp or rdma", c.Protocol)
	case c.Object != "block" && c.Object != "shard":
		return "mooncake.object", fmt.Sprintf("%q: want block or shard", c.Object)
	case strings.ContainsAny(c.KeyPrefix, "/ \t\n\x00"):
		return "mooncake.key_prefix", fmt.Sprintf("%q: no '/', blanks or NUL", c.KeyPrefix)
	case c.Replicas < 1 || c.Replicas > 16:
		return "mooncake.replica_num", fmt.Sprintf("%d: want 1..16", c.Replicas)
	case c.StagingBytes < 0 || c.StagingBytes > maxMooncakeStagingBytes:
		return "mooncake.staging_bytes", fmt.Sprintf("%d: want 0 < staging_bytes <= 64 GiB", c.StagingBytes)
	case c.HealthIntervalMs < 1 || c.HealthIntervalMs > 3600_000:
		return "mooncake.health_interval_ms", fmt.Sprintf("%d: want 1..3600000", c.HealthIntervalMs)
	case c.ResetAfter < 1:
		return "mooncake.reset_after", fmt.Sprintf("%d: want >= 1", c.ResetAfter)
	}
	return "", ""
}

// Object format. Every object the tier writes is a header, then the payload: a whole block's
// shards (object "block") or one shard (object "shard"). Little-endian:
//
//	0   magic "UCMMCOB1"
//	8   version u16 (1), kind u8 (1 block, 2 shard), reserved u8, parts u32
//	16  block id [16]
//	32  schema fingerprint [32]
//	64  shard index u32 (0 for a block object), reserved u32
//	72  payload length u64
//	80  parts × CRC32C u32 (format.Checksum of each equal part of the payload)
//	..  header CRC32C u32 over every byte before it
//
// then zero padding to a multiple of 64 bytes, then the payload.
const (
	mcMagic      = "UCMMCOB1"
	mcVersion    = 1
	mcKindBlock  = 1
	mcKindShard  = 2
	mcFixedBytes = 80
	// MaxMooncakeParts bounds the parts (shards) an object header may list.
	MaxMooncakeParts = 1 << 16
)

// ErrMooncakeObject is wrapped by the errors of decoding an object whose header is not the one
// the tier expects: another block's, another schema's, another layout's, damaged or truncated.
var ErrMooncakeObject = fmt.Errorf("mooncake object rejected: %w", format.ErrCorrupt)

// mcHeaderBytes is the header size for an object of n parts.
func mcHeaderBytes(n int) int { return (mcFixedBytes + 4*n + 4 + 63) &^ 63 }

// MooncakeObjectBytes returns the size of one object the tier stores for layout l: a block
// object (header and every shard) when shard is false, else one shard's object (header and
// the shard).
func MooncakeObjectBytes(l format.Layout, shard bool) int {
	if shard {
		return mcHeaderBytes(1) + int(l.ShardBytes)
	}
	return mcHeaderBytes(l.Shards) + int(l.BlockBytes())
}

// mcObject describes an object the tier expects: which block, shard and payload.
type mcObject struct {
	id      format.BlockID
	fp      format.Fingerprint
	kind    uint8
	shard   uint32
	payload int64
	parts   int
}

func (o mcObject) size() int64 { return int64(mcHeaderBytes(o.parts)) + o.payload }

// encodeHeader writes o's header with crcs into dst (at least mcHeaderBytes(len(crcs)) bytes)
// and returns the header length.
func encodeHeader(dst []byte, o mcObject, crcs []uint32) int {
	n := mcHeaderBytes(len(crcs))
	h := dst[:n]
	clear(h)
	copy(h, mcMagic)
	binary.LittleEndian.PutUint16(h[8:], mcVersion)
	h[10] = o.kind
	binary.LittleEndian.PutUint32(h[12:], uint32(len(crcs)))
	copy(h[16:32], o.id[:])
	copy(h[32:64], o.fp[:])
	binary.LittleEndian.PutUint32(h[64:], o.shard)
	binary.LittleEndian.PutUint64(h[72:], uint64(o.payload))
	p := mcFixedBytes
	for _, c := range crcs {
		binary.LittleEndian.PutUint32(h[p:], c)
		p += 4
	}
	binary.LittleEndian.PutUint32(h[p:], format.Checksum(h[:p]))
	return n
}

// decodeHeader checks that obj (an object as read from the pool, got bytes long) is the object
// want describes and returns the part checksums its header lists. It never panics and never
// allocates more than want.parts checksums; any difference is an error wrapping
// ErrMooncakeObject.
func decodeHeader(obj []byte, got int64, want mcObject) ([]uint32, error) {
	if want.parts <= 0 || want.parts > MaxMooncakeParts {
		return nil, fmt.Errorf("%w: %d parts expected", ErrMooncakeObject, want.parts)
	}
	n := mcHeaderBytes(want.parts)
	if want.payload < 0 || got < int64(n) || got != want.size() || int64(len(obj)) < got {
		return nil, fmt.Errorf("%w: object is %d bytes, want %d", ErrMooncakeObject, got, want.size())
	}
	h := obj[:n]
	if string(h[:8]) != mcMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrMooncakeObject, h[:8])
	}
	if v := binary.LittleEndian.Uint16(h[8:]); v != mcVersion {
		return nil, fmt.Errorf("%w: version %d", ErrMooncakeObject, v)
	}
	if parts := binary.LittleEndian.Uint32(h[12:]); parts != uint32(want.parts) {
		return nil, fmt.Errorf("%w: %d parts, want %d", ErrMooncakeObject, parts, want.parts)
	}
	end := mcFixedBytes + 4*want.parts
	if stored, sum := binary.LittleEndian.Uint32(h[end:]), format.Checksum(h[:end]); stored != sum {
		return nil, fmt.Errorf("%w: header checksum %08x, computed %08x", ErrMooncakeObject, stored, sum)
	}
	if h[10] != want.kind {
		return nil, fmt.Errorf("%w: kind %d, want %d", ErrMooncakeObject, h[10], want.kind)
	}
	if !bytesEqual(h[16:32], want.id[:]) {
		return nil, fmt.Errorf("%w: holds block %s", ErrMooncakeObject, hex.EncodeToString(h[16:32]))
	}
	if !bytesEqual(h[32:64], want.fp[:]) {
		return nil, fmt.Errorf("%w: written under another schema (fingerprint %s)", ErrMooncakeObject, hex.EncodeToString(h[32:40]))
	}
	if s := binary.LittleEndian.Uint32(h[64:]); s != want.shard {
		return nil, fmt.Errorf("%w: shard %d, want %d", ErrMooncakeObject, s, want.shard)
	}
	if p := binary.LittleEndian.Uint64(h[72:]); p != uint64(want.payload) {
		return nil, fmt.Errorf("%w: payload %d bytes, want %d", ErrMooncakeObject, p, want.payload)
	}
	crcs := make([]uint32, want.parts)
	for i := range crcs {
		crcs[i] = binary.LittleEndian.Uint32(h[mcFixedBytes+4*i:])
	}
	return crcs, nil
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// copyChecked copies src into dst (equal lengths), checking each of the len(crcs) equal parts
// of src against its checksum, chunk by chunk so the checksum reads bytes the copy just
// touched, in cache. It returns the index of the first part that fails, or -1. With stream
// (what the caller copies in all is memcopy.MinOp or more: a whole block) the copy writes
// around the caches, as one memmove of that size would, and the checksum reads the chunk of
// src the copy just read (dst's bytes are then not in cache); the bytes are fenced before it
// returns.
func copyChecked(dst, src []byte, crcs []uint32, stream bool) int {
	if stream {
		defer memcopy.Fence()
	}
	part := len(src) / len(crcs)
	for i, want := range crcs {
		lo, hi := i*part, (i+1)*part
		var crc uint32
		for off := lo; off < hi; off += checkChunk {
			end := min(off+checkChunk, hi)
			if stream {
				memcopy.Stream(dst[off:end], src[off:end])
				crc = format.ChecksumUpdate(crc, src[off:end])
				continue
			}
			copy(dst[off:end], src[off:end])
			crc = format.ChecksumUpdate(crc, dst[off:end])
		}
		if crc != want {
			return i
		}
	}
	return -1
}
