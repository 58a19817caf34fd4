package sparse

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"gopkg.in/yaml.v3"
)

// ErrInvalid is wrapped by every error about a bad configuration, shape or argument; it wraps
// engine.ErrInvalidArgument.
var ErrInvalid = fmt.Errorf("sparse: %w", engine.ErrInvalidArgument)

// ErrNotBuilt is returned for a method UCM names that this package does not build (none at
// present: every name of knownNames is registered; docs/sparse.md).
var ErrNotBuilt = errors.New("sparse: method not built yet")

// ConfigError is a bad sparse configuration: Key is the full key at fault
// ("ucm_sparse_config.ESA.sparse_ratio", "UCM_SPARSE_TYPE"). It wraps ErrInvalid.
type ConfigError struct {
	Key string
	Msg string
}

func (e *ConfigError) Error() string { return fmt.Sprintf("%s: %s: %v", e.Key, e.Msg, ErrInvalid) }

// Unwrap returns ErrInvalid.
func (e *ConfigError) Unwrap() error { return ErrInvalid }

func configErr(key, format string, args ...any) error {
	return &ConfigError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Method names, as UCM spells them in ucm_sparse_config and UCM_SPARSE_TYPE. Quest is
// UCM-Go's anchor method (per-channel key bounds), not a UCM method.
const (
	NameESA         = "ESA"
	NameGSA         = "GSA"
	NameGSAOnDevice = "GSAOnDevice"
	NameKVStar      = "KVStarMultiStep"
	NameBlend       = "Blend"
	NameReRoPE      = "ReRoPE"
	NameQuest       = "Quest"
)

// sparseTypeKey is the key some UCM examples put beside the methods in ucm_sparse_config to
// say which one is enabled.
const sparseTypeKey = "sparse_type"

// MethodConfig is one method's parsed configuration.
type MethodConfig interface {
	// Method is the registry name of the method configured.
	Method() string
	// Validate checks the values and returns a *ConfigError naming the key at fault.
	Validate() error
}

// Env is what a method needs from its host: the model's shape and where sidecars are loaded
// from (an *engine.Engine, or MapSidecars in tests and evaluations).
type Env struct {
	// Role is the side the method runs on; a worker needs Sidecars.
	Role Role
	// Shape is the model's.
	Shape Shape
	// Sidecars is where block representations are loaded from.
	Sidecars SidecarSource
	// SidecarElem is the element type of the stored float sidecars (ESA, Quest, KVStar): the
	// writer's SidecarSpec.Elem; 0 means Float16 (kernels.DefaultSidecarElem of fp16 keys).
	SidecarElem kernels.DType
	// ReprPoolBytes bounds the representation pool of the block-scoring methods (verified,
	// converted representations kept across decode steps, reprs.go): 0 means
	// DefaultReprPoolBytes, a negative value no pool (every step loads and verifies).
	ReprPoolBytes int64
	// Blocks, when set, is where the KV of attended blocks is loaded from (EngineBlocks): a
	// method with prefetch keys (GSA, ESA) then runs a Prefetcher and hands each decode call
	// its blocks' shards (Attention.KV). ShardBytes is one layer's shard of a block.
	Blocks     BlockLoader
	ShardBytes int
}

// A method's entry in the registry: how to parse its block and build it.
type factory struct {
	parse func(key string, node *yaml.Node) (MethodConfig, error)
	build func(cfg MethodConfig, env Env) (SparseMethod, error)
}

var registry = map[string]factory{}

// register adds a method; the built-in methods register themselves in init functions.
func register(name string, f factory) { registry[name] = f }

// knownNames lists every name the configuration accepts, built or not.
var knownNames = []string{NameESA, NameGSA, NameGSAOnDevice, NameKVStar, NameBlend, NameReRoPE, NameQuest}

// Names returns the names of the methods New can build, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// canonical maps a name, compared without regard to case, to the spelling of knownNames.
func canonical(name string) (string, bool) {
	for _, n := range knownNames {
		if strings.EqualFold(n, strings.TrimSpace(name)) {
			return n, true
		}
	}
	return "", false
}

// ParseMethodConfig parses one method's block (ucm_sparse_config.<name>); a nil node gives the
// method's defaults. Unknown keys, values of the wrong type or out of range are *ConfigError
// naming the key; an unknown name too, and a known one not built here is ErrNotBuilt.
func ParseMethodConfig(name string, node *yaml.Node) (MethodConfig, error) {
	n, ok := canonical(name)
	if !ok {
		return nil, configErr("ucm_sparse_config."+name, "unknown sparse method (known: %s)", strings.Join(knownNames, ", "))
	}
	f, ok := registry[n]
	if !ok {
		return nil, fmt.Errorf("ucm_sparse_config.%s: %w", n, ErrNotBuilt)
	}
	cfg, err := f.parse("ucm_sparse_config."+n, node)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Choose picks the enabled method from a ucm_sparse_config mapping and the environment's
// ENABLE_SPARSE (enable; nil when unset) and UCM_SPARSE_TYPE (typ; "" when unset), and parses
// its block:
//
//   - ENABLE_SPARSE=false disables sparse attention whatever the file says (nil, nil);
//   - UCM_SPARSE_TYPE names the method (its block, when the mapping has one, configures it;
//     otherwise the defaults);
//   - else the mapping's sparse_type key names it;
//   - else a mapping with exactly one method enables that one; an empty mapping enables none
//     (nil, nil) unless ENABLE_SPARSE=true, which then needs a name (error); several methods
//     without a name are an error naming them.
//
// Every method block present is parsed and validated, enabled or not, so a typo in any of
// them is reported.
func Choose(block map[string]yaml.Node, enable *bool, typ string) (MethodConfig, error) {
	if enable != nil && !*enable {
		return nil, nil
	}
	var names []string
	canon := map[string]string{} // canonical → key in block
	for k := range block {
		if k == sparseTypeKey {
			continue
		}
		n, ok := canonical(k)
		if !ok {
			return nil, configErr("ucm_sparse_config."+k, "unknown sparse method (known: %s)", strings.Join(knownNames, ", "))
		}
		if prev, dup := canon[n]; dup {
			return nil, configErr("ucm_sparse_config."+k, "method given twice (also as %s)", prev)
		}
		canon[n] = k
		names = append(names, n)
	}
	sort.Strings(names)
	configs := map[string]MethodConfig{}
	for _, n := range names {
		node := block[canon[n]]
		if _, built := registry[n]; !built {
			continue // reported only if chosen
		}
		c, err := ParseMethodConfig(n, &node)
		if err != nil {
			return nil, err
		}
		configs[n] = c
	}
	chosen, key := "", ""
	switch {
	case strings.TrimSpace(typ) != "":
		chosen, key = typ, "UCM_SPARSE_TYPE"
	case hasKey(block, sparseTypeKey):
		node := block[sparseTypeKey]
		if node.Kind != yaml.ScalarNode || node.Tag == "!!null" {
			return nil, configErr("ucm_sparse_config."+sparseTypeKey, "want a method name")
		}
		chosen, key = node.Value, "ucm_sparse_config."+sparseTypeKey
	case len(names) == 1:
		chosen, key = names[0], "ucm_sparse_config"
	case len(names) == 0 && enable != nil && *enable:
		return nil, configErr("ENABLE_SPARSE", "sparse attention enabled but no method named (set UCM_SPARSE_TYPE or ucm_sparse_config.<Name>)")
	case len(names) == 0:
		return nil, nil
	default:
		return nil, configErr("ucm_sparse_config", "%d methods (%s) and none chosen: set sparse_type or UCM_SPARSE_TYPE", len(names), strings.Join(names, ", "))
	}
	n, ok := canonical(chosen)
	if !ok {
		return nil, configErr(key, "unknown sparse method %q (known: %s)", chosen, strings.Join(knownNames, ", "))
	}
	if c, ok := configs[n]; ok {
		return c, nil
	}
	if _, built := registry[n]; !built {
		return nil, fmt.Errorf("%s: %s: %w", key, n, ErrNotBuilt)
	}
	var node *yaml.Node
	if k, ok := canon[n]; ok {
		nd := block[k]
		node = &nd
	}
	return ParseMethodConfig(n, node)
}

func hasKey(m map[string]yaml.Node, k string) bool {
	_, ok := m[k]
	return ok
}

// FromUCMConfig chooses the method a UCM configuration enables (Choose): block is its
// ucm_sparse_config mapping (connector/ucmconfig's Config.SparseConfig; nil when absent), with
// ENABLE_SPARSE and UCM_SPARSE_TYPE read through getenv (nil: os.Getenv). (nil, nil) means
// sparse attention is off.
func FromUCMConfig(block map[string]yaml.Node, getenv func(string) string) (MethodConfig, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var enable *bool
	if v := getenv("ENABLE_SPARSE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, configErr("ENABLE_SPARSE", "%q: want true or false", v)
		}
		enable = &b
	}
	return Choose(block, enable, getenv("UCM_SPARSE_TYPE"))
}

// New builds the method cfg configures for env. The shape is validated; a worker needs a
// sidecar source for the methods that select blocks. A method is safe for concurrent use by
// different requests and layers; the calls of one (request, layer) must not overlap (a
// layer's attention runs once per step).
func New(cfg MethodConfig, env Env) (SparseMethod, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: no method configuration", ErrInvalid)
	}
	f, ok := registry[cfg.Method()]
	if !ok {
		return nil, fmt.Errorf("%s: %w", cfg.Method(), ErrNotBuilt)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := env.Shape.Validate(); err != nil {
		return nil, err
	}
	return f.build(cfg, env)
}

// ---------------------------------------------------------------------------------------------
// Key parsing: a table of keys (with UCM's alternative spellings) per method.

// field is one key of a method block: its spellings and how to store a value.
type field struct {
	keys []string
	set  func(key string, v *yaml.Node) error
}

// parseFields walks a mapping node, giving each key's value to its field. Unknown keys, a key
// given twice (under any spelling) and non-mapping blocks are *ConfigError.
func parseFields(prefix string, node *yaml.Node, fields []field) error {
	if node == nil || node.Kind == 0 || node.Kind == yaml.ScalarNode && node.Tag == "!!null" {
		return nil
	}
	if node.Kind == yaml.AliasNode && node.Alias != nil {
		node = node.Alias
	}
	if node.Kind != yaml.MappingNode {
		return configErr(prefix, "want a mapping of keys")
	}
	seen := map[int]string{}
	for i := 0; i+1 < len(node.Content); i += 2 {
		k, v := node.Content[i], node.Content[i+1]
		key := prefix + "." + k.Value
		fi := slices.IndexFunc(fields, func(f field) bool { return slices.Contains(f.keys, k.Value) })
		if fi < 0 {
			var all []string
			for _, f := range fields {
				all = append(all, f.keys...)
			}
			return configErr(key, "unknown key (known: %s)", strings.Join(all, ", "))
		}
		if prev, ok := seen[fi]; ok {
			return configErr(key, "given twice (also as %s)", prev)
		}
		seen[fi] = k.Value
		if v.Kind == yaml.AliasNode && v.Alias != nil {
			v = v.Alias
		}
		if err := fields[fi].set(key, v); err != nil {
			return err
		}
	}
	return nil
}

func intField(dst *int, keys ...string) field {
	return field{keys: keys, set: func(key string, v *yaml.Node) error {
		var x int64
		if v.Kind != yaml.ScalarNode || v.Decode(&x) != nil || x < math.MinInt32 || x > math.MaxInt32 {
			return configErr(key, "%q: want an integer", short(v))
		}
		*dst = int(x)
		return nil
	}}
}

func uintField(dst *uint64, keys ...string) field {
	return field{keys: keys, set: func(key string, v *yaml.Node) error {
		var x uint64
		if v.Kind != yaml.ScalarNode || v.Decode(&x) != nil {
			return configErr(key, "%q: want a non-negative integer", short(v))
		}
		*dst = x
		return nil
	}}
}

func floatField(dst *float64, keys ...string) field {
	return field{keys: keys, set: func(key string, v *yaml.Node) error {
		var x float64
		if v.Kind != yaml.ScalarNode || v.Decode(&x) != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return configErr(key, "%q: want a number", short(v))
		}
		*dst = x
		return nil
	}}
}

func stringField(dst *string, keys ...string) field {
	return field{keys: keys, set: func(key string, v *yaml.Node) error {
		if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
			return configErr(key, "want a string")
		}
		*dst = v.Value
		return nil
	}}
}

// layersField takes a set of layers as a list of indices ([6, 7, 10]) or as UCM's list of
// one boolean per layer ([true, false, ...]: the indices of the true ones).
func layersField(dst *[]int, keys ...string) field {
	ints := intsField(dst, keys...)
	return field{keys: keys, set: func(key string, v *yaml.Node) error {
		var flags []bool
		if v.Kind == yaml.SequenceNode && len(v.Content) > 0 && v.Content[0].Tag == "!!bool" {
			if v.Decode(&flags) != nil || len(flags) > 1<<16 {
				return configErr(key, "want a list of layer indices, or of one boolean per layer")
			}
			*dst = (*dst)[:0]
			for l, f := range flags {
				if f {
					*dst = append(*dst, l)
				}
			}
			return nil
		}
		return ints.set(key, v)
	}}
}

func intsField(dst *[]int, keys ...string) field {
	return field{keys: keys, set: func(key string, v *yaml.Node) error {
		var x []int64
		if v.Kind != yaml.SequenceNode || v.Decode(&x) != nil || len(x) > 1<<16 {
			return configErr(key, "want a list of integers")
		}
		out := make([]int, len(x))
		for i, n := range x {
			if n < 0 || n > math.MaxInt32 {
				return configErr(key, "entry %d (%d): want an integer ≥ 0", i, n)
			}
			out[i] = int(n)
		}
		*dst = out
		return nil
	}}
}

// short is a value's text for an error message, bounded.
func short(v *yaml.Node) string {
	s := v.Value
	if v.Kind != yaml.ScalarNode {
		s = "(" + kindName(v.Kind) + ")"
	}
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.DocumentNode:
		return "document"
	}
	return "value"
}

// ---------------------------------------------------------------------------------------------
// Method configurations.

// WindowConfig is the block-window selection every block-scoring method shares (sources §3A):
// [init window | top-K of the rest | local window].
type WindowConfig struct {
	// InitWindow is the leading blocks always kept (init_window_sz, or init_window_size).
	InitWindow int
	// LocalWindow is the trailing blocks always kept, the current one included
	// (local_window_sz, or local_window_size); at least 1.
	LocalWindow int
	// SparseRatio is the fraction of the blocks between the windows kept (sparse_ratio, or
	// topk_ratio): compute_topk_len of sources §3A.
	SparseRatio float64
	// Budget, when > 0, replaces SparseRatio's rule: the fraction of all blocks kept, windows
	// included (UCM-Go key budget; what the evaluation sets).
	Budget float64
	// RetrievalStride is how many decode steps a selection is kept before the next one
	// (retrieval_stride; 1: every step).
	RetrievalStride int
	// HeadSelect is "layer" (the default, or empty: one selection for every head of a layer,
	// the sources' block-table rewrite) or "kv" (each KV head selects its own blocks by its own
	// score, at the same budget; UCM-Go key head_select: see Attention.HeadSelected).
	HeadSelect string
}

func (w *WindowConfig) fields() []field {
	return []field{
		intField(&w.InitWindow, "init_window_sz", "init_window_size"),
		intField(&w.LocalWindow, "local_window_sz", "local_window_size"),
		floatField(&w.SparseRatio, "sparse_ratio", "topk_ratio"),
		floatField(&w.Budget, "budget"),
		intField(&w.RetrievalStride, "retrieval_stride"),
		stringField(&w.HeadSelect, "head_select"),
	}
}

// checkHeadSelect validates head_select.
func checkHeadSelect(prefix, v string) error {
	if v != "" && v != "layer" && v != "kv" {
		return configErr(prefix+".head_select", "%q: want layer or kv", v)
	}
	return nil
}

// MaxWindowBlocks bounds the window sizes of a configuration.
const MaxWindowBlocks = 1 << 20

func (w *WindowConfig) validate(prefix string) error {
	if err := checkHeadSelect(prefix, w.HeadSelect); err != nil {
		return err
	}
	switch {
	case w.InitWindow < 0 || w.InitWindow > MaxWindowBlocks:
		return configErr(prefix+".init_window_sz", "%d: want a block count in [0, %d]", w.InitWindow, MaxWindowBlocks)
	case w.LocalWindow < 1 || w.LocalWindow > MaxWindowBlocks:
		return configErr(prefix+".local_window_sz", "%d: want a block count in [1, %d] (the current block is always attended)", w.LocalWindow, MaxWindowBlocks)
	case !(w.SparseRatio > 0 && w.SparseRatio <= 1):
		return configErr(prefix+".sparse_ratio", "%v: want a fraction in (0, 1]", w.SparseRatio)
	case !(w.Budget >= 0 && w.Budget <= 1):
		return configErr(prefix+".budget", "%v: want a fraction in (0, 1], or 0 for sparse_ratio's rule", w.Budget)
	case w.RetrievalStride < 1 || w.RetrievalStride > 1<<16:
		return configErr(prefix+".retrieval_stride", "%d: want a step count in [1, 65536]", w.RetrievalStride)
	}
	return nil
}

// Keep is how a context of n blocks splits for this configuration: init and local blocks
// always kept (clipped to n), and k blocks chosen between them.
func (w *WindowConfig) Keep(n int) (init, local, k int) {
	init = min(w.InitWindow, n)
	local = min(w.LocalWindow, n-init)
	middle := n - init - local
	if w.Budget > 0 {
		k = BudgetBlocks(n, w.Budget) - init - local
	} else {
		k = TopKLen(n, w.InitWindow, w.LocalWindow, w.SparseRatio) - init - local
	}
	return init, local, max(0, min(k, middle))
}

// QuestConfig configures Quest (UCM-Go's anchor: per-channel key bounds, sidecar "quest").
type QuestConfig struct {
	WindowConfig
	// HeadScore is how query heads' scores make a block's: "sum" (default) or "softmax"
	// (UCM-Go key head_score; see checkHeadScore).
	HeadScore string
}

// Method returns NameQuest.
func (*QuestConfig) Method() string { return NameQuest }

// Validate checks the values.
func (c *QuestConfig) Validate() error {
	p := "ucm_sparse_config." + NameQuest
	if err := checkHeadScore(p, c.HeadScore); err != nil {
		return err
	}
	return c.validate(p)
}

// checkHeadScore validates head_score: "sum" adds the query heads' scores (sources §2's
// decision); "softmax" adds each head's softmax share over the candidate blocks of score/√D, an
// estimate of the block's share of attention that does not let heads with large logits
// dominate (UCM-Go).
func checkHeadScore(prefix, v string) error {
	if v != "sum" && v != "softmax" {
		return configErr(prefix+".head_score", "%q: want sum or softmax", v)
	}
	return nil
}

// ESAConfig configures ESA (mean- or max-pooled keys per block, sidecar "esa-mean"/"esa-max").
type ESAConfig struct {
	WindowConfig
	// Pool is "mean" (UCM's reference) or "max" (UCM-Go key pool).
	Pool string
	// HeadScore is "sum" (default: Σ_h q̄_h·r_h) or "softmax" (per query head; see
	// checkHeadScore).
	HeadScore string
	// RetrievalLag is 0 (a step attends the blocks retrieved with its own query) or 1 (the
	// blocks retrieved at the previous step, as ESA's asynchronous retrieval engine makes it;
	// UCM-Go key retrieval_lag). 1 needs retrieval_stride 1.
	RetrievalLag int
	// RetrievalWorkers is, with retrieval_lag 1, the retrievals that run in the background at
	// once (ESA's asynchronous engine: step N's retrieval runs while step N attends, and serves
	// step N+1; default 4, UCM's); 0 retrieves synchronously within the step, with the same
	// selections (UCM-Go key retrieval_workers).
	RetrievalWorkers int
	// ReprDType is how the representation pool keeps the representations: "fp16" (the default,
	// or empty: as stored) or "int8" (symmetric per-tensor quantization, one scale per block
	// and layer: sources §2's int8 storage; UCM-Go key repr_dtype).
	ReprDType string
	// PrefetchConfig is GSA's prefetch engine, also offered to ESA (UCM-Go): with
	// retrieval_lag 1 a step's selection is exactly the next step's, so it is all prefetched.
	PrefetchConfig
}

// Method returns NameESA.
func (*ESAConfig) Method() string { return NameESA }

// Validate checks the values.
func (c *ESAConfig) Validate() error {
	p := "ucm_sparse_config." + NameESA
	if c.Pool != "mean" && c.Pool != "max" {
		return configErr(p+".pool", "%q: want mean or max", c.Pool)
	}
	if err := checkHeadScore(p, c.HeadScore); err != nil {
		return err
	}
	if c.RetrievalWorkers < 0 || c.RetrievalWorkers > 256 {
		return configErr(p+".retrieval_workers", "%d: want a worker count in [0, 256]", c.RetrievalWorkers)
	}
	if c.RetrievalLag != 0 && (c.RetrievalLag != 1 || c.RetrievalStride != 1) {
		return configErr(p+".retrieval_lag", "%d: want 0, or 1 with retrieval_stride 1", c.RetrievalLag)
	}
	if c.RetrievalLag != 0 && c.HeadSelect == "kv" {
		return configErr(p+".retrieval_lag", "%d: not with head_select kv", c.RetrievalLag)
	}
	if c.ReprDType != "" && c.ReprDType != "fp16" && c.ReprDType != "int8" {
		return configErr(p+".repr_dtype", "%q: want fp16 or int8", c.ReprDType)
	}
	if err := c.validatePrefetch(p); err != nil {
		return err
	}
	return c.validate(p)
}

// GSAConfig configures GSA: the 000 variant's scoring (−Σ_h ‖q̄_h − r_h‖ against the
// mean-pooled keys) with its windows and dynamic K, 002's min_blocks, 002's query-free
// access-count score (block_score), and the prefetch engine with 000's eviction policies
// (PrefetchConfig, used when the host gives Env.Blocks).
type GSAConfig struct {
	WindowConfig
	PrefetchConfig
	// MinBlocks is 002's floor on the blocks kept (min_blocks).
	MinBlocks int
	// BlockScore is "distance" (000's −Σ_h ‖q̄_h − r_h‖, default) or "access_count" (002's
	// 0.5·access_count + linspace(0.1, 1, B), which reads no sidecar; UCM-Go key block_score).
	BlockScore string
}

// Method returns NameGSA.
func (*GSAConfig) Method() string { return NameGSA }

// Validate checks the values.
func (c *GSAConfig) Validate() error {
	p := "ucm_sparse_config." + NameGSA
	if c.MinBlocks < 0 || c.MinBlocks > MaxWindowBlocks {
		return configErr(p+".min_blocks", "%d: want a block count in [0, %d]", c.MinBlocks, MaxWindowBlocks)
	}
	if c.BlockScore != "distance" && c.BlockScore != "access_count" {
		return configErr(p+".block_score", "%q: want distance or access_count", c.BlockScore)
	}
	if c.BlockScore == "access_count" && c.HeadSelect == "kv" {
		return configErr(p+".head_select", "kv: not with block_score access_count (a query-free score has no heads)")
	}
	if err := c.validatePrefetch(p); err != nil {
		return err
	}
	return c.validate(p)
}

// Keep is GSA's split of n blocks: WindowConfig.Keep, with at least MinBlocks kept in all.
func (c *GSAConfig) Keep(n int) (init, local, k int) {
	init, local, k = c.WindowConfig.Keep(n)
	if extra := min(c.MinBlocks, n) - (init + local + k); extra > 0 {
		k += extra
	}
	return init, local, min(k, n-init-local)
}

// KVStarConfig configures KVStar MultiStep (channel-pruned, token-merged keys, sidecar
// "kvstar").
type KVStarConfig struct {
	WindowConfig
	// PruneRatio is blk_repre_dim_prune_ratio (fraction of channels kept) and Merge
	// blk_repre_inner_token_merge: they must match the stored sidecars' (checked at selection).
	PruneRatio float64
	Merge      int
	// HeadScore is "sum" (default: Σ_h max_m q̄_h·row_{m,h}, sources §5) or "softmax" (UCM-Go key
	// head_score: per query head, each block's share of Σ over every candidate's rows of
	// exp(q_h·row/√D), summed over heads; see checkHeadScore).
	HeadScore string
}

// Method returns NameKVStar.
func (*KVStarConfig) Method() string { return NameKVStar }

// Validate checks the values.
func (c *KVStarConfig) Validate() error {
	p := "ucm_sparse_config." + NameKVStar
	if c.HeadScore != "" {
		if err := checkHeadScore(p, c.HeadScore); err != nil {
			return err
		}
	}
	switch {
	case !(c.PruneRatio > 0 && c.PruneRatio <= 1):
		return configErr(p+".blk_repre_dim_prune_ratio", "%v: want a fraction in (0, 1]", c.PruneRatio)
	case c.Merge < 1 || c.Merge > 1<<15:
		return configErr(p+".blk_repre_inner_token_merge", "%d: want a token count in [1, 32768]", c.Merge)
	}
	return c.validate(p)
}

// GSAOnDeviceConfig configures GSA On-Device (per-token key hash codes, sidecar "hash";
// sources §4). Windows are in tokens.
type GSAOnDeviceConfig struct {
	// TopKTokens is the tokens kept in all, windows included (hash_topk_tokens, or
	// topk_tokens); a context of at most this many is attended densely.
	TopKTokens int
	// SinkTokens and RecentTokens are the leading and trailing windows (sink_token,
	// recent_token), in whole blocks (integer division by the block size).
	SinkTokens, RecentTokens int
	// HashBits and HashSeed are the codes' encoder (hash_bits; hash_seed, UCM-Go): they must
	// match the stored sidecars'. HashBits 0 takes the head dim.
	HashBits int
	HashSeed uint64
	// RollbackLayers attend densely (rollback_layers).
	RollbackLayers []int
	// SkipHashLayers reuse, at a decode step, the selection the nearest earlier layer of the
	// same step computed, instead of hashing their own query (skip_hash_layers, or UCM's
	// vllm_hash_attention_skip_layers; a list of layer indices, or UCM's one boolean per
	// layer). A skip layer with no earlier selection at that step selects for itself.
	SkipHashLayers []int
	// HeadSelect is as WindowConfig's (UCM-Go key head_select).
	HeadSelect string
	// Budget, when > 0, replaces TopKTokens: the fraction of all blocks kept, windows included
	// (UCM-Go key budget).
	Budget float64
	// BlockDist is how token distances make a block's: "min" (default) or "mean" (UCM-Go key
	// block_dist; sources §4 [DECISION]).
	BlockDist string
	// KVLoraRank and QKRopeHeadDim, both > 0, make the model MLA (DeepSeek-V2: kv_lora_rank,
	// qk_rope_head_dim): one latent KV head of kv_lora_rank + qk_rope_head_dim elements (the
	// shape's head dim), whose two parts are hashed by two encoders, and query heads of the same
	// width (q_nope absorbed into the latent space, then q_pe). Both 0 (default): GQA.
	KVLoraRank, QKRopeHeadDim int
	// HashBitsKVLora and HashBitsQKRope are MLA's two encoders' bits (hash_bits_kv_lora,
	// hash_bits_qk_rope); 0 takes the part's width rounded down to a multiple of 8 (UCM's
	// default is the width). With MLA, hash_bits when given must be their sum.
	HashBitsKVLora, HashBitsQKRope int
	// ReductionHeads is MLA's query-head reduction r (reduction_head_num, or UCM's
	// vllm_hash_attention_reduction_head_num; default 1): the H query heads are averaged in r
	// strided groups, head j of H/r the mean of heads j + i·H/r, before hashing. A token's
	// distance is the sum over the H/r hashed heads of their Hamming distance to its latent
	// code. GQA reduces over groups instead and ignores it.
	ReductionHeads int
}

// MLA reports whether the configuration is for an MLA model (kv_lora_rank set).
func (c *GSAOnDeviceConfig) MLA() bool { return c.KVLoraRank > 0 }

// Method returns NameGSAOnDevice.
func (*GSAOnDeviceConfig) Method() string { return NameGSAOnDevice }

// Validate checks the values.
func (c *GSAOnDeviceConfig) Validate() error {
	p := "ucm_sparse_config." + NameGSAOnDevice
	const maxTokens = 1 << 30
	switch {
	case c.TopKTokens < 1 || c.TopKTokens > maxTokens:
		return configErr(p+".hash_topk_tokens", "%d: want a token count in [1, 2^30]", c.TopKTokens)
	case c.SinkTokens < 0 || c.SinkTokens > maxTokens:
		return configErr(p+".sink_token", "%d: want a token count in [0, 2^30]", c.SinkTokens)
	case c.RecentTokens < 1 || c.RecentTokens > maxTokens:
		return configErr(p+".recent_token", "%d: want a token count in [1, 2^30]", c.RecentTokens)
	case c.HashBits < 0 || c.HashBits%8 != 0 || c.HashBits > 1<<16:
		return configErr(p+".hash_bits", "%d: want a multiple of 8 (0: the head dim)", c.HashBits)
	case !(c.Budget >= 0 && c.Budget <= 1):
		return configErr(p+".budget", "%v: want a fraction in (0, 1], or 0 for hash_topk_tokens", c.Budget)
	case c.BlockDist != "min" && c.BlockDist != "mean":
		return configErr(p+".block_dist", "%q: want min or mean", c.BlockDist)
	case c.KVLoraRank < 0 || c.KVLoraRank > kernels.MaxDim:
		return configErr(p+".kv_lora_rank", "%d: want a width in [0, %d]", c.KVLoraRank, kernels.MaxDim)
	case c.QKRopeHeadDim < 0 || c.QKRopeHeadDim > kernels.MaxDim:
		return configErr(p+".qk_rope_head_dim", "%d: want a width in [0, %d]", c.QKRopeHeadDim, kernels.MaxDim)
	case (c.KVLoraRank > 0) != (c.QKRopeHeadDim > 0):
		return configErr(p+".qk_rope_head_dim", "%d with kv_lora_rank %d: MLA needs both, GQA neither", c.QKRopeHeadDim, c.KVLoraRank)
	case c.HashBitsKVLora < 0 || c.HashBitsKVLora%8 != 0 || c.HashBitsKVLora > c.KVLoraRank:
		return configErr(p+".hash_bits_kv_lora", "%d: want a multiple of 8 up to kv_lora_rank %d (0: the rank)", c.HashBitsKVLora, c.KVLoraRank)
	case c.HashBitsQKRope < 0 || c.HashBitsQKRope%8 != 0 || c.HashBitsQKRope > c.QKRopeHeadDim:
		return configErr(p+".hash_bits_qk_rope", "%d: want a multiple of 8 up to qk_rope_head_dim %d (0: the dim)", c.HashBitsQKRope, c.QKRopeHeadDim)
	case c.ReductionHeads < 1 || c.ReductionHeads > kernels.MaxHeads:
		return configErr(p+".reduction_head_num", "%d: want a head count in [1, %d]", c.ReductionHeads, kernels.MaxHeads)
	case c.MLA() && c.HashBits != 0 && c.HashBits != c.mlaBits(0)+c.mlaBits(1):
		return configErr(p+".hash_bits", "%d: with MLA it is hash_bits_kv_lora + hash_bits_qk_rope = %d", c.HashBits, c.mlaBits(0)+c.mlaBits(1))
	}
	return checkHeadSelect(p, c.HeadSelect)
}

// mlaBits is MLA encoder i's bits (0: the latent part, 1: the RoPE part) with defaults applied.
func (c *GSAOnDeviceConfig) mlaBits(i int) int {
	if i == 0 {
		return cmp.Or(c.HashBitsKVLora, c.KVLoraRank&^7)
	}
	return cmp.Or(c.HashBitsQKRope, c.QKRopeHeadDim&^7)
}

// HashSpec is the hash sidecar the configuration reads for a model of shape s: one encoder of
// hash_bits over each KV head (GQA), or MLA's two encoders over the single latent head. It
// returns a *ConfigError naming the key when the configuration does not fit the shape.
func (c *GSAOnDeviceConfig) HashSpec(s Shape) (kernels.SidecarSpec, error) {
	p := "ucm_sparse_config." + NameGSAOnDevice
	spec := kernels.SidecarSpec{Kind: kernels.SidecarHash, Layers: s.Layers, Heads: s.KVHeads, Dim: s.HeadDim,
		BlockSize: s.BlockSize, HashBits: c.HashBits, Seed: c.HashSeed}
	if !c.MLA() {
		if spec.HashBits == 0 {
			spec.HashBits = s.HeadDim &^ 7
		}
		return spec, nil
	}
	switch {
	case s.KVHeads != 1:
		return spec, configErr(p+".kv_lora_rank", "%d: MLA has one latent KV head, the model has %d", c.KVLoraRank, s.KVHeads)
	case c.KVLoraRank+c.QKRopeHeadDim != s.HeadDim:
		return spec, configErr(p+".kv_lora_rank", "%d + qk_rope_head_dim %d: not the model's head dim %d", c.KVLoraRank, c.QKRopeHeadDim, s.HeadDim)
	case s.QHeads%c.ReductionHeads != 0:
		return spec, configErr(p+".reduction_head_num", "%d: does not divide the %d query heads", c.ReductionHeads, s.QHeads)
	}
	spec.HashBits, spec.RopeDim, spec.RopeBits = c.mlaBits(0), c.QKRopeHeadDim, c.mlaBits(1)
	return spec, nil
}

// Keep is GSA On-Device's split of a context of n blocks and seqLen tokens (blocks of bs
// tokens): sink_token/bs and max(1, recent_token/bs) window blocks, and the rest of
// hash_topk_tokens/bs (or of the budget) chosen; the whole context when seqLen ≤
// hash_topk_tokens (without a budget).
func (c *GSAOnDeviceConfig) Keep(n, seqLen, bs int) (init, local, k int) {
	init = min(c.SinkTokens/bs, n)
	local = min(max(1, c.RecentTokens/bs), n-init)
	middle := n - init - local
	var total int
	switch {
	case c.Budget > 0:
		total = BudgetBlocks(n, c.Budget)
	case seqLen <= c.TopKTokens:
		return init, local, middle
	default:
		total = c.TopKTokens / bs
	}
	return init, local, max(0, min(total-init-local, middle))
}
