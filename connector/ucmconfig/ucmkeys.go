package ucmconfig

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/ucm-go/ucm/engine"

	"gopkg.in/yaml.v3"
)

// KeyEffect says what UCM-Go does with a configuration key UCM passes.
type KeyEffect int

const (
	// KeyHonoured keys select the UCM-Go behaviour their UCMKey.UCMGo note names.
	KeyHonoured KeyEffect = iota
	// KeyConditional keys are honoured in some store pipelines and have no effect in the
	// others (the note says which); Config.Unused names them where they have none.
	KeyConditional
	// KeyNoEffect keys are accepted, checked for their type, and named by Config.Unused so
	// that an opener can log them once: they mean something only to a UCM component UCM-Go
	// replaces by another mechanism, or to UCM's inference-engine connector.
	KeyNoEffect
)

// KeyScope says where a key sits in a UCM configuration.
type KeyScope int

const (
	// ScopeConnector keys sit in ucm_connectors[i].ucm_connector_config (the dict UCM's
	// connector hands its store).
	ScopeConnector KeyScope = iota
	// ScopeTop keys sit at the top level of the file (UCM's connector reads them).
	ScopeTop
)

// keyKind is the YAML type a key's value must have.
type keyKind int

const (
	kindAny    keyKind = iota // any value (checked by the typed field that decodes it)
	kindInt                   // an integer
	kindNumber                // an integer or a float
	kindBool                  // true or false
	kindString                // a scalar
	kindList                  // a sequence
)

// UCMKey is one configuration key UCM's stores, pipeline, connectors or example files pass.
type UCMKey struct {
	// Name is the key as UCM spells it.
	Name  string
	Scope KeyScope
	// Effect is what UCM-Go does with it.
	Effect KeyEffect
	// UCM says what UCM means by the key and which of its components reads it.
	UCM string
	// UCMGo says what UCM-Go does with it.
	UCMGo string
	kind  keyKind
}

// UCMKeys is the complete list of the keys UCM passes to a store, taken from UCM's parsers:
// the C++ stores' Setup (posix, cache, ds3fs, empty, fake), the pipeline's builders
// (ucm/store/pipeline/connector.py), the Python stores (pcstore V1, and nfsstore, pcstore and
// mooncake of the older interface), the vLLM and SGLang connectors (the keys they add in
// _create_store), UCM's example configurations (examples/, including the sparse and blend
// examples) and the store e2e scripts (ucm/store/test/e2e). Every one is accepted; keys of
// UCM-Go's own are fields of ConnectorParams and documented there. docs/connector.md renders
// this table.
var UCMKeys = []UCMKey{
	// The top level of UCM's file.
	{Name: "ucm_connectors", Scope: ScopeTop, Effect: KeyHonoured, kind: kindList,
		UCM: "the stores UCM's connector opens (name, module, config)", UCMGo: "the first entry is the store"},
	{Name: "ucm_sparse_config", Scope: ScopeTop, Effect: KeyHonoured,
		UCM: "the sparse-attention method and its parameters", UCMGo: "kept for the sparse package (Config.SparseConfig)"},
	{Name: "metrics_config_path", Scope: ScopeTop, Effect: KeyHonoured, kind: kindString,
		UCM: "metrics_configs.yaml: the ucm: histograms and their buckets", UCMGo: "the histograms the store exports (connector metrics)"},
	{Name: "enable_event_sync", Scope: ScopeTop, Effect: KeyNoEffect, kind: kindBool,
		UCM: "the vLLM connector waits on a device event before a dump", UCMGo: "none: the connector's business; host memory has no event"},
	{Name: "use_layerwise", Scope: ScopeTop, Effect: KeyNoEffect, kind: kindBool,
		UCM: "the vLLM connector loads and dumps layer by layer", UCMGo: "none: the store serves whole-block and layer-wise calls alike"},
	{Name: "hit_ratio", Scope: ScopeTop, Effect: KeyNoEffect, kind: kindNumber,
		UCM: "the vLLM connector caps the share of a prompt served from the store (testing)", UCMGo: "none: the connector's business"},
	{Name: "load_only_first_rank", Scope: ScopeTop, Effect: KeyNoEffect, kind: kindBool,
		UCM: "older connectors: only rank 0 loads MLA blocks", UCMGo: "none: the connector's business"},
	{Name: "enable_prefix_cache", Scope: ScopeTop, Effect: KeyNoEffect, kind: kindBool,
		UCM: "older connectors: turn prefix caching through the store on", UCMGo: "none: the connector's business"},

	// What every V1 store reads: paths and the transfer shape UCM's connector adds.
	{Name: "store_pipeline", Effect: KeyHonoured, kind: kindString,
		UCM: "UcmPipelineStore's stack: Posix, Cache|Posix, Ds3fs, Cache|Ds3fs, Empty, Cache|Empty", UCMGo: "the tiers: a disk tier, a memory tier in front, nothing (Empty), a host-memory cache on tmpfs (Cache|Empty)"},
	{Name: "storage_backends", Effect: KeyHonoured,
		UCM: "the directories of the posix/ds3fs store (a list, or \"a:b\")", UCMGo: "the shared disk tier; the first path also holds each process's instance store (ignored by Empty and Cache|Empty)"},
	{Name: "device_id", Effect: KeyHonoured, kind: kindInt,
		UCM: "the worker's device (-1 or absent: the scheduler, which only looks up)", UCMGo: "the instance name <host>-rank<device_id>; absent or -1 without sizes: the lookup-only scheduler store"},
	{Name: "tensor_size", Effect: KeyHonoured,
		UCM: "the bytes behind each address of a shard", UCMGo: "the layout (shard_size / tensor_size addresses per shard)"},
	{Name: "tensor_size_list", Effect: KeyHonoured, kind: kindList,
		UCM: "the bytes behind each address of a shard, one per tensor (vLLM connector, cache store)", UCMGo: "the layout; one address per tensor"},
	{Name: "shard_size", Effect: KeyHonoured,
		UCM: "the bytes of a shard (one layer, or the whole block)", UCMGo: "the layout's shard"},
	{Name: "block_size", Effect: KeyHonoured,
		UCM: "the bytes of a block", UCMGo: "the layout: block_size / shard_size shards"},
	{Name: "timeout_ms", Effect: KeyHonoured, kind: kindInt,
		UCM: "a task's timeout (posix, cache, ds3fs, pcstore)", UCMGo: "Options.TaskTimeout"},
	{Name: "io_direct", Effect: KeyHonoured, kind: kindBool,
		UCM: "O_DIRECT file I/O (posix, ds3fs, pcstore); pinned buffers (cache)", UCMGo: "Options.DirectIO on/off (absent: auto); off for Cache|Empty (tmpfs has no O_DIRECT)"},
	{Name: "use_direct", Effect: KeyHonoured, kind: kindBool,
		UCM: "io_direct's older name (nfsstore, pcstore; UCM's sparse and blend examples)", UCMGo: "as io_direct, when io_direct is absent"},
	{Name: "unique_id", Effect: KeyConditional, kind: kindString,
		UCM: "the deployment's id (vLLM's engine_id): names the cache store's shared-memory buffer", UCMGo: "Cache|Empty with share_buffer_enable: names the shared tmpfs cache; no effect otherwise (instances are named by device_id or instance)"},
	{Name: "share_buffer_enable", Effect: KeyConditional, kind: kindBool,
		UCM: "the cache store's buffer is shared by the processes of one unique_id (default true in the cache store; vLLM sets it for MLA)", UCMGo: "Cache|Empty: shared across processes (true or absent, with unique_id) or private; no effect otherwise (disk tiers are always shared)"},
	{Name: "cpu_affinity_cores", Effect: KeyNoEffect, kind: kindList,
		UCM: "cores the store's transfer threads are pinned to", UCMGo: "none: Go schedules its goroutines on every core"},
	{Name: "local_rank_size", Effect: KeyNoEffect, kind: kindInt,
		UCM: "the number of ranks that load one MLA block (pcstore's shared transfer buffer)", UCMGo: "none: every rank reads the shared tier directly"},

	// PosixStore (ucm/store/posix).
	{Name: "posix_io_engine", Effect: KeyHonoured, kind: kindString,
		UCM: "psync or aio", UCMGo: "Options.IOEngine: psync or io_uring (io_engine wins)"},
	{Name: "posix_data_trans_concurrency", Effect: KeyHonoured, kind: kindInt,
		UCM: "I/O requests in flight (default 128)", UCMGo: "Options.QueueDepth (queue_depth wins)"},
	{Name: "posix_lookup_concurrency", Effect: KeyNoEffect, kind: kindInt,
		UCM: "threads that stat block files on lookup (default 16)", UCMGo: "none: lookups are answered from the in-memory index, no I/O"},
	{Name: "posix_open_concurrency", Effect: KeyNoEffect, kind: kindInt,
		UCM: "threads that open block files (default 32)", UCMGo: "none: blocks live in large segment files opened once"},
	{Name: "posix_commit_concurrency", Effect: KeyNoEffect, kind: kindInt,
		UCM: "threads that rename finished block files into place (default 4)", UCMGo: "none: a block is published by one index batch, no rename"},
	{Name: "data_dir_shard_bytes", Effect: KeyNoEffect, kind: kindInt,
		UCM: "leading id bytes that name a block's subdirectory (default 3)", UCMGo: "none: no file per block, so no directory fan-out"},
	{Name: "posix_capacity_gb", Effect: KeyHonoured, kind: kindNumber,
		UCM: "the store's capacity in GiB (0: unlimited)", UCMGo: "the disk tier's capacity (shared: globally enforced)"},
	{Name: "posix_gc_trigger_threshold_ratio", Effect: KeyHonoured, kind: kindNumber,
		UCM: "GC starts above this fill ratio (default 0.7)", UCMGo: "the tier's high watermark"},
	{Name: "posix_gc_recycle_percent", Effect: KeyHonoured, kind: kindNumber,
		UCM: "GC frees this share of the capacity (default 0.1)", UCMGo: "the low watermark: high watermark minus this"},
	{Name: "posix_gc_check_interval_sec", Effect: KeyHonoured, kind: kindInt,
		UCM: "how often GC checks the fill (default 30)", UCMGo: "Options.CompactInterval (online compaction)"},
	{Name: "posix_gc_enable", Effect: KeyNoEffect, kind: kindBool,
		UCM: "this process runs GC (vLLM sets it on dp rank 0's scheduler only)", UCMGo: "none: a tier with a capacity is always reclaimed; on a shared tier by one elected instance"},
	{Name: "posix_gc_concurrency", Effect: KeyNoEffect, kind: kindInt,
		UCM: "GC threads (default 16)", UCMGo: "none: reclamation retires whole segments from the index, no file walk"},
	{Name: "posix_gc_max_recycle_count_per_shard", Effect: KeyNoEffect, kind: kindInt,
		UCM: "files GC deletes per directory per pass (default 50000)", UCMGo: "none: reclamation is by segment, least recently used first"},
	{Name: "posix_gc_shard_sample_ratio", Effect: KeyNoEffect, kind: kindNumber,
		UCM: "share of directories GC samples for old files (default 0.1)", UCMGo: "none: recency is tracked per segment, nothing is sampled"},

	// CacheStore (ucm/store/cache).
	{Name: "cache_buffer_capacity_gb", Effect: KeyHonoured, kind: kindNumber,
		UCM: "the host-memory cache's size in GiB (default 256; 32 unshared)", UCMGo: "the memory tier's capacity (Cache|Posix), the tmpfs cache's (Cache|Empty); default 256 GiB bounded by a quarter of the host's memory"},
	{Name: "cache_stream_number", Effect: KeyNoEffect, kind: kindInt,
		UCM: "device copy streams of the cache store (default 4)", UCMGo: "none: host memory, no device streams"},
	{Name: "waiting_queue_depth", Effect: KeyNoEffect, kind: kindInt,
		UCM: "tasks the cache store queues before its transfer threads (default 8192 x shards per block)", UCMGo: "none: tasks go straight to the engine's I/O queue (queue_depth)"},
	{Name: "running_queue_depth", Effect: KeyNoEffect, kind: kindInt,
		UCM: "shard transfers the cache store runs at once (default 524288)", UCMGo: "none: the I/O queue depth is queue_depth"},

	// Ds3fsStore (ucm/store/ds3fs) and the stream counts of other stores.
	{Name: "stream_number", Effect: KeyNoEffect, kind: kindInt,
		UCM: "transfer streams/threads (ds3fs: 32; pcstore, nfsstore; SGLang sets 8)", UCMGo: "none: one I/O queue of queue_depth requests"},
	{Name: "ior_entries", Effect: KeyNoEffect, kind: kindInt,
		UCM: "3FS USRBIO ring entries", UCMGo: "none: a 3FS mount is a disk tier read through the kernel client"},
	{Name: "ior_depth", Effect: KeyNoEffect, kind: kindInt,
		UCM: "3FS USRBIO ring depth", UCMGo: "none: a 3FS mount is a disk tier read through the kernel client"},
	{Name: "numa_id", Effect: KeyNoEffect, kind: kindInt,
		UCM: "the NUMA node of 3FS's buffers", UCMGo: "none"},

	// FakeStore and PcStore (V1).
	{Name: "buffer_number", Effect: KeyNoEffect, kind: kindInt,
		UCM: "transfer buffers (fake, pcstore, nfsstore)", UCMGo: "none: staging is bounded by max_staging_bytes"},
	{Name: "use_scatter_gather", Effect: KeyNoEffect, kind: kindBool,
		UCM: "pcstore: gather a shard's tensors in one transfer", UCMGo: "none: a shard's tensors always go as one vectored request"},
	{Name: "use_scatter_gatter", Effect: KeyNoEffect, kind: kindBool,
		UCM: "use_scatter_gather as UCM's older pcstore spells it", UCMGo: "none, as use_scatter_gather"},
	{Name: "shard_data_dir", Effect: KeyNoEffect, kind: kindBool,
		UCM: "pcstore: spread block files over subdirectories", UCMGo: "none: no file per block"},

	// The older (V0) interface's stores: nfsstore, pcstore.
	{Name: "kv_block_size", Effect: KeyNoEffect, kind: kindInt,
		UCM: "V0 stores: the bytes of a block", UCMGo: "none: the V1 key is block_size"},
	{Name: "role", Effect: KeyNoEffect, kind: kindString,
		UCM: "V0 stores: worker or scheduler", UCMGo: "none: the V1 form is device_id (absent: the scheduler)"},
	{Name: "device", Effect: KeyNoEffect, kind: kindInt,
		UCM: "V0 stores: the worker's device", UCMGo: "none: the V1 key is device_id"},
	{Name: "io_size", Effect: KeyNoEffect, kind: kindInt,
		UCM: "V0 stores: the bytes of one transfer", UCMGo: "none: the V1 keys are tensor_size and shard_size"},
	{Name: "storage_capacity", Effect: KeyNoEffect, kind: kindInt,
		UCM: "nfsstore: the capacity in bytes", UCMGo: "none: the V1 key is posix_capacity_gb"},
	{Name: "recycle_enable", Effect: KeyNoEffect,
		UCM: "nfsstore: GC on (1) or off", UCMGo: "none: a tier with a capacity is always reclaimed"},
	{Name: "recycle_threshold_ratio", Effect: KeyNoEffect, kind: kindNumber,
		UCM: "nfsstore: GC starts above this fill ratio", UCMGo: "none: the V1 key is posix_gc_trigger_threshold_ratio"},

	// MooncakeStore (ucm/store/mooncakestore).
	{Name: "local_hostname", Effect: KeyNoEffect, kind: kindString,
		UCM: "Mooncake: this host's name", UCMGo: "none: a Mooncake tier is configured in tiers (mooncake:)"},
	{Name: "metadata_server", Effect: KeyNoEffect, kind: kindString,
		UCM: "Mooncake: the metadata server", UCMGo: "none: see tiers (mooncake:)"},
	{Name: "master_server_address", Effect: KeyNoEffect, kind: kindString,
		UCM: "Mooncake: the master's address", UCMGo: "none: see tiers (mooncake:)"},
	{Name: "global_segment_size", Effect: KeyNoEffect,
		UCM: "Mooncake: memory this host contributes", UCMGo: "none: see tiers (mooncake:)"},
	{Name: "local_buffer_size", Effect: KeyNoEffect,
		UCM: "Mooncake: the local transfer buffer", UCMGo: "none: see tiers (mooncake:)"},
	{Name: "protocol", Effect: KeyNoEffect, kind: kindString,
		UCM: "Mooncake: tcp or rdma", UCMGo: "none: see tiers (mooncake:)"},
	{Name: "device_name", Effect: KeyNoEffect, kind: kindString,
		UCM: "Mooncake: the RDMA device", UCMGo: "none: see tiers (mooncake:)"},
}

// ucmKey returns the table entry of a key in a scope.
func ucmKey(scope KeyScope, name string) (UCMKey, bool) {
	for _, k := range UCMKeys {
		if k.Scope == scope && k.Name == name {
			return k, true
		}
	}
	return UCMKey{}, false
}

// checkKind reports whether a value has the type the key takes (the error names the key and
// the line; the caller wraps engine.ErrInvalidArgument).
func (k UCMKey) checkKind(n yaml.Node) error {
	var ok bool
	switch k.kind {
	case kindAny:
		return nil
	case kindInt:
		return anyWhole.checkNode(k.Name, &n) // a fraction or an overflow too
	case kindNumber:
		return anyReal.checkNode(k.Name, &n) // NaN and infinities too
	case kindBool:
		var v bool
		ok = n.Kind == yaml.ScalarNode && n.Decode(&v) == nil
	case kindString:
		ok = n.Kind == yaml.ScalarNode
	case kindList:
		ok = n.Kind == yaml.SequenceNode
	}
	if !ok {
		want := map[keyKind]string{kindInt: "an integer", kindNumber: "a number", kindBool: "true or false",
			kindString: "a string", kindList: "a list"}[k.kind]
		return fmt.Errorf("line %d: %s %q: want %s", n.Line, k.Name, n.Value, want)
	}
	return nil
}

// checkExtraKeys checks the keys that decoded into no field of a mapping (extra): each must be
// a UCM key of the scope that has no effect, with a value of its type; anything else is an
// unknown key, named with its line and the closest known key. fields are the mapping's own
// keys (its struct tags).
func checkExtraKeys(scope KeyScope, where string, extra map[string]yaml.Node, fields []string, data []byte) error {
	names := make([]string, 0, len(extra))
	for name := range extra {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		n := extra[name]
		k, ok := ucmKey(scope, name)
		if !ok {
			msg := fmt.Sprintf("config: %sline %d: unknown key %q", where, n.Line, name)
			if s := closestKey(name, scope, fields); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			return fmt.Errorf("%s: %w", quoteLines(msg, data), engine.ErrInvalidArgument)
		}
		if err := k.checkKind(n); err != nil {
			return fmt.Errorf("config: %s%s: %w", where, quoteLines(err.Error(), data), engine.ErrInvalidArgument)
		}
	}
	return nil
}

// closestKey is the known key nearest to name by edit distance, or "" when none is near (more
// than a third of the name differs).
func closestKey(name string, scope KeyScope, fields []string) string {
	best, bestD := "", len(name)/3+1
	try := func(k string) {
		if d := editDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	for _, f := range fields {
		try(f)
	}
	for _, k := range UCMKeys {
		if k.Scope == scope {
			try(k.Name)
		}
	}
	return best
}

// editDistance is the Levenshtein distance of two keys (ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// yamlFields are the YAML keys of a struct type's fields (inline maps excluded).
func yamlFields(v any) []string {
	var out []string
	t := reflect.TypeOf(v)
	for i := 0; i < t.NumField(); i++ {
		k, opts, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if k != "" && k != "-" && !strings.Contains(opts, "inline") {
			out = append(out, k)
		}
	}
	return out
}
