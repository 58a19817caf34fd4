package sparse

import (
	"errors"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"gopkg.in/yaml.v3"
)

func sparseBlock(t testing.TB, text string) map[string]yaml.Node {
	t.Helper()
	var top struct {
		Block map[string]yaml.Node `yaml:"ucm_sparse_config"`
	}
	if err := yaml.Unmarshal([]byte(text), &top); err != nil {
		t.Fatal(err)
	}
	return top.Block
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestChooseFromConfigFile(t *testing.T) {
	c := sparseBlock(t, `
ucm_connectors:
  - ucm_connector_name: UcmPosixStore
    ucm_connector_config: {storage_backends: /tmp/x}
ucm_sparse_config:
  ESA:
    init_window_sz: 1
    sparse_ratio: 0.3
    retrieval_stride: 16
`)
	cfg, err := FromUCMConfig(c, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	esa, ok := cfg.(*ESAConfig)
	if !ok {
		t.Fatalf("got %T, want *ESAConfig", cfg)
	}
	if esa.InitWindow != 1 || esa.SparseRatio != 0.3 || esa.RetrievalStride != 16 || esa.LocalWindow != 2 || esa.Pool != "mean" {
		t.Fatalf("ESA config %+v", esa)
	}
	// ENABLE_SPARSE=false turns it off.
	if cfg, err := FromUCMConfig(c, envOf(map[string]string{"ENABLE_SPARSE": "false"})); err != nil || cfg != nil {
		t.Fatalf("ENABLE_SPARSE=false: %v, %v", cfg, err)
	}
	// UCM_SPARSE_TYPE picks another method, with its defaults.
	cfg, err = FromUCMConfig(c, envOf(map[string]string{"UCM_SPARSE_TYPE": "kvstarmultistep"}))
	if err != nil {
		t.Fatal(err)
	}
	kv := cfg.(*KVStarConfig)
	if kv.RetrievalStride != 8 || kv.InitWindow != 2 || kv.LocalWindow != 4 || kv.PruneRatio != 0.5 || kv.Merge != 4 {
		t.Fatalf("KVStar defaults %+v", kv)
	}
	// Nothing configured: off.
	if cfg, err := FromUCMConfig(nil, envOf(nil)); err != nil || cfg != nil {
		t.Fatalf("no config: %v, %v", cfg, err)
	}
}

func TestChooseRules(t *testing.T) {
	yes := true
	two := sparseBlock(t, `
ucm_sparse_config:
  GSA: {topk_ratio: 0.2, init_window_size: 2, local_window_size: 4}
  GSAOnDevice: {hash_bits: 256, topk_tokens: 1024}
`)
	if _, err := Choose(two, nil, ""); !isConfigErr(err, "ucm_sparse_config") {
		t.Fatalf("two methods, none chosen: %v", err)
	}
	cfg, err := Choose(two, nil, "GSA")
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.(*GSAConfig)
	if g.SparseRatio != 0.2 || g.InitWindow != 2 || g.LocalWindow != 4 || g.MinBlocks != 4 {
		t.Fatalf("GSA aliases: %+v", g)
	}
	cfg, err = Choose(two, nil, "GSAOnDevice")
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.(*GSAOnDeviceConfig); d.HashBits != 256 || d.TopKTokens != 1024 || d.SinkTokens != 64 || d.RecentTokens != 512 {
		t.Fatalf("GSAOnDevice: %+v", d)
	}
	withType := sparseBlock(t, `
ucm_sparse_config:
  sparse_type: KVStarMultiStep
  KVStarMultiStep: {retrieval_stride: 16, sparse_ratio: 0.2, blk_repre_dim_prune_ratio: 0.7}
  ESA: {}
`)
	cfg, err = Choose(withType, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if kv := cfg.(*KVStarConfig); kv.RetrievalStride != 16 || kv.SparseRatio != 0.2 || kv.PruneRatio != 0.7 {
		t.Fatalf("KVStar: %+v", kv)
	}
	if _, err := Choose(nil, &yes, ""); !isConfigErr(err, "ENABLE_SPARSE") {
		t.Fatalf("enabled without a name: %v", err)
	}
	if c, err := Choose(nil, &yes, "rerope"); err != nil || c.Method() != NameReRoPE {
		t.Fatalf("ReRoPE: %v", err)
	}
	if _, err := Choose(nil, nil, "Nope"); !isConfigErr(err, "UCM_SPARSE_TYPE") {
		t.Fatalf("unknown type: %v", err)
	}
}

func isConfigErr(err error, key string) bool {
	var ce *ConfigError
	return errors.As(err, &ce) && ce.Key == key && errors.Is(err, ErrInvalid) && errors.Is(err, engine.ErrInvalidArgument)
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	cases := []struct{ text, key string }{
		{"ESA: {sparse_ratio: 1.5}", "ucm_sparse_config.ESA.sparse_ratio"},
		{"ESA: {sparse_ratio: abc}", "ucm_sparse_config.ESA.sparse_ratio"},
		{"ESA: {init_window_sz: -1}", "ucm_sparse_config.ESA.init_window_sz"},
		{"ESA: {local_window_sz: 0}", "ucm_sparse_config.ESA.local_window_sz"},
		{"ESA: {init_window_szz: 1}", "ucm_sparse_config.ESA.init_window_szz"},
		{"ESA: {pool: median}", "ucm_sparse_config.ESA.pool"},
		{"ESA: {init_window_sz: 1, init_window_size: 2}", "ucm_sparse_config.ESA.init_window_size"},
		{"ESA: [1, 2]", "ucm_sparse_config.ESA"},
		{"GSA: {min_blocks: -3}", "ucm_sparse_config.GSA.min_blocks"},
		{"GSA: {budget: 2}", "ucm_sparse_config.GSA.budget"},
		{"KVStarMultiStep: {retrieval_stride: 0}", "ucm_sparse_config.KVStarMultiStep.retrieval_stride"},
		{"KVStarMultiStep: {blk_repre_dim_prune_ratio: 0}", "ucm_sparse_config.KVStarMultiStep.blk_repre_dim_prune_ratio"},
		{"KVStarMultiStep: {blk_repre_inner_token_merge: 0}", "ucm_sparse_config.KVStarMultiStep.blk_repre_inner_token_merge"},
		{"GSAOnDevice: {hash_bits: 12}", "ucm_sparse_config.GSAOnDevice.hash_bits"},
		{"GSAOnDevice: {recent_token: 0}", "ucm_sparse_config.GSAOnDevice.recent_token"},
		{"GSAOnDevice: {rollback_layers: [1, -2]}", "ucm_sparse_config.GSAOnDevice.rollback_layers"},
		{"GSAOnDevice: {block_dist: max}", "ucm_sparse_config.GSAOnDevice.block_dist"},
		{"GSAOnDevice: {kv_lora_rank: 512}", "ucm_sparse_config.GSAOnDevice.qk_rope_head_dim"},
		{"GSAOnDevice: {qk_rope_head_dim: 64}", "ucm_sparse_config.GSAOnDevice.qk_rope_head_dim"},
		{"GSAOnDevice: {kv_lora_rank: -1}", "ucm_sparse_config.GSAOnDevice.kv_lora_rank"},
		{"GSAOnDevice: {kv_lora_rank: 512, qk_rope_head_dim: 64, hash_bits_kv_lora: 520}", "ucm_sparse_config.GSAOnDevice.hash_bits_kv_lora"},
		{"GSAOnDevice: {kv_lora_rank: 512, qk_rope_head_dim: 64, hash_bits_qk_rope: 60}", "ucm_sparse_config.GSAOnDevice.hash_bits_qk_rope"},
		{"GSAOnDevice: {kv_lora_rank: 512, qk_rope_head_dim: 64, hash_bits: 512}", "ucm_sparse_config.GSAOnDevice.hash_bits"},
		{"GSAOnDevice: {skip_hash_layers: [true, 3]}", "ucm_sparse_config.GSAOnDevice.skip_hash_layers"},
		{"GSAOnDevice: {skip_hash_layers: [1], vllm_hash_attention_skip_layers: [1]}", "ucm_sparse_config.GSAOnDevice.vllm_hash_attention_skip_layers"},
		{"GSAOnDevice: {reduction_head_num: 0}", "ucm_sparse_config.GSAOnDevice.reduction_head_num"},
		{"GSAOnDevice: {reduction_head_num: 2, vllm_hash_attention_reduction_head_num: 2}", "ucm_sparse_config.GSAOnDevice.vllm_hash_attention_reduction_head_num"},
		{"Quest: {sparse_ratio: .nan}", "ucm_sparse_config.Quest.sparse_ratio"},
		{"Foo: {}", "ucm_sparse_config.Foo"},
		{"sparse_type: [ESA]\nESA: {}", "ucm_sparse_config.sparse_type"},
	}
	for _, c := range cases {
		block := sparseBlock(t, "ucm_sparse_config:\n"+indent(c.text))
		_, err := Choose(block, nil, "")
		if !isConfigErr(err, c.key) {
			t.Errorf("%s: got %v, want a ConfigError for %s", c.text, err, c.key)
		}
	}
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}

func TestLayerID(t *testing.T) {
	for name, want := range map[string]int{"model.layers.0.self_attn": 0, "model.layers.15.self_attn.attn": 15, "layers.7": 7, "x.layers.a.layers.3.y": 3} {
		got, err := LayerID(name)
		if err != nil || got != want {
			t.Errorf("LayerID(%q) = %d, %v; want %d", name, got, err, want)
		}
	}
	for _, name := range []string{"", "model.layer.1", "model.layers..x", "model.layers.12345678.x", "layers.1x"} {
		if _, err := LayerID(name); !errors.Is(err, ErrInvalid) {
			t.Errorf("LayerID(%q): %v, want ErrInvalid", name, err)
		}
	}
}

func TestNewChecksShapeAndSource(t *testing.T) {
	cfg, err := ParseMethodConfig("Quest", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg, Env{Role: RoleWorker, Shape: Shape{Layers: 1, QHeads: 3, KVHeads: 2, HeadDim: 8, BlockSize: 16}, Sidecars: &MapSidecars{}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("query heads not a multiple: %v", err)
	}
	if _, err := New(cfg, Env{Role: RoleWorker, Shape: Shape{Layers: 1, QHeads: 2, KVHeads: 2, HeadDim: 8, BlockSize: 16}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("worker without sidecars: %v", err)
	}
	m, err := New(cfg, Env{Role: RoleScheduler, Shape: Shape{Layers: 1, QHeads: 2, KVHeads: 2, HeadDim: 8, BlockSize: 16}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != NameQuest || m.EstimateNumSlotsSparsed(&Request{}) != InvalidSlot {
		t.Fatalf("scheduler defaults: %s", m.Name())
	}
	if got := Names(); strings.Join(got, ",") != "Blend,ESA,GSA,GSAOnDevice,KVStarMultiStep,Quest,ReRoPE" {
		t.Fatalf("Names() = %v", got)
	}
}

// FuzzSparseConfig: any document parses to a valid configuration or fails with ErrInvalid or
// ErrNotBuilt, never a panic.
func FuzzSparseConfig(f *testing.F) {
	for _, s := range []string{
		"ESA: {init_window_sz: 1, sparse_ratio: 0.3, retrieval_stride: 16}",
		"GSA: {topk_ratio: 0.3, init_window_size: 2, local_window_size: 4}\nGSAOnDevice: {hash_bits: 256, topk_tokens: 1024}\nsparse_type: GSA",
		"KVStarMultiStep: {retrieval_stride: 8, blk_repre_dim_prune_ratio: 0.5, blk_repre_inner_token_merge: 4}",
		"Blend: {compute_meta: {model.layers.0.self_attn: {ratio: 0.1}}}",
		"Blend: {blend_chunk_size: 32, min_match_ratio: 0.9, position_correction: false, compute_meta: {1: 0.2, 3: {}}, hkvd_threshold: 0.05, rope_pairing: interleaved}",
		"ReRoPE: {rerope_window: 64, training_length: 1024, rope_theta: 500000.0}",
		"GSAOnDevice: {rollback_layers: [0, 3], block_dist: mean, budget: 0.2}",
		"Quest: &a {budget: 0.1}\nESA: *a",
		"GSA: {prefetch_workers: 2, max_pending_prefetch: 16, prefetch_ahead: 0, prefetch_cache_size: 64, eviction_policy: hybrid, block_score: access_count}",
		"ESA: {retrieval_lag: 1, prefetch_ahead: 1, eviction_policy: score}",
	} {
		f.Add(s, "")
		f.Add(s, "true")
	}
	f.Fuzz(func(t *testing.T, doc, enable string) {
		var block map[string]yaml.Node
		if yaml.Unmarshal([]byte(doc), &block) != nil {
			return
		}
		var en *bool
		switch enable {
		case "true", "false":
			b := enable == "true"
			en = &b
		}
		cfg, err := Choose(block, en, "")
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotBuilt) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		if cfg != nil {
			if err := cfg.Validate(); err != nil {
				t.Fatalf("accepted an invalid configuration: %v", err)
			}
		}
	})
}

func TestRequestStage(t *testing.T) {
	r := &Request{}
	if r.Stage() != PhasePrefill {
		t.Fatal("a request without output tokens is in prefill")
	}
	r.NumOutputTokens = 1
	if r.Stage() != PhaseDecode {
		t.Fatal("a request with output tokens is in decode")
	}
}
