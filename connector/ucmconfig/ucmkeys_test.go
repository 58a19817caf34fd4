package ucmconfig

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// ucmKeySample is a valid value of a key for the table-driven tests.
func ucmKeySample(k UCMKey) string {
	special := map[string]string{
		"ucm_connectors":    "[{ucm_connector_name: UcmPipelineStore, ucm_connector_config: {storage_backends: /a}}]",
		"ucm_sparse_config": "{ESA: {sparse_ratio: 0.3}}", "store_pipeline": "Cache|Posix", "storage_backends": "/a:/b",
		"tensor_size": "4096", "tensor_size_list": "[4096, 4096]", "shard_size": "8192", "block_size": "16384",
		"posix_io_engine": "aio", "posix_capacity_gb": "2", "posix_gc_trigger_threshold_ratio": "0.8",
		"posix_gc_recycle_percent": "0.2", "role": "worker", "protocol": "tcp",
	}
	if v, ok := special[k.Name]; ok {
		return v
	}
	switch k.kind {
	case kindInt:
		return "3"
	case kindNumber:
		return "0.5"
	case kindBool:
		return "true"
	case kindList:
		return "[1, 2]"
	}
	return "x"
}

// ucmKeyDoc is a configuration giving one key (with storage_backends, which every pipeline
// but Empty needs).
func ucmKeyDoc(k UCMKey, value string) string {
	if k.Scope == ScopeTop {
		doc := fmt.Sprintf("%s: %s\n", k.Name, value)
		if k.Name != "ucm_connectors" {
			doc += "ucm_connectors:\n  - ucm_connector_config:\n      storage_backends: /a\n"
		}
		return doc
	}
	doc := "ucm_connectors:\n  - ucm_connector_name: UcmPipelineStore\n    ucm_connector_config:\n"
	if k.Name != "storage_backends" {
		doc += "      storage_backends: /a\n"
	}
	return doc + fmt.Sprintf("      %s: %s\n", k.Name, value)
}

// Every key UCM passes is accepted; those with no effect are named by Unused (with their
// connector's prefix), those honoured are not.
func TestUCMKeysAccepted(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range UCMKeys {
		id := fmt.Sprint(k.Scope, k.Name)
		if seen[id] {
			t.Fatalf("%s listed twice", k.Name)
		}
		seen[id] = true
		if k.UCM == "" || k.UCMGo == "" {
			t.Errorf("%s: a note is missing", k.Name)
		}
		doc := ucmKeyDoc(k, ucmKeySample(k))
		c, err := ParseConfig([]byte(doc))
		if err != nil {
			t.Errorf("%s refused: %v\n%s", k.Name, err, doc)
			continue
		}
		if _, _, err := c.StoreOptions(); err != nil {
			t.Errorf("%s: StoreOptions: %v", k.Name, err)
		}
		want := k.Name
		if k.Scope == ScopeConnector {
			want = "ucm_connectors[0]." + k.Name
		}
		named := slices.Contains(c.Unused(), want)
		if named != (k.Effect != KeyHonoured) {
			t.Errorf("%s (effect %d): named by Unused %v: %v", k.Name, k.Effect, named, c.Unused())
		}
	}
}

// A key the table says does something decodes into a field; a key with no effect does not (so
// it is collected for Unused and type-checked by the table).
func TestUCMKeysFields(t *testing.T) {
	for _, k := range UCMKeys {
		fields := connectorFields
		if k.Scope == ScopeTop {
			fields = topFields
		}
		if has := slices.Contains(fields, k.Name); has != (k.Effect != KeyNoEffect) {
			t.Errorf("%s (effect %d): a field of its mapping: %v", k.Name, k.Effect, has)
		}
	}
}

// A typo, or a UCM key with a value of the wrong type, is refused naming the key (and the
// closest known key).
func TestUCMKeysTypos(t *testing.T) {
	cases := map[string][]string{
		"      posix_lookup_concurency: 16\n":    {`"posix_lookup_concurency"`, `did you mean "posix_lookup_concurrency"`, "line 5"},
		"      use_directt: false\n":             {`"use_directt"`, `did you mean "use_direct"`},
		"      wating_queue_depth: 8\n":          {`"wating_queue_depth"`, `did you mean "waiting_queue_depth"`},
		"      segmnt_size: 1MiB\n":              {`"segmnt_size"`, `did you mean "segment_size"`},
		"      zzzzzzzzz: 1\n":                   {`unknown key "zzzzzzzzz"`},
		"      posix_lookup_concurrency: many\n": {"posix_lookup_concurrency", "want an integer"},
		"      cpu_affinity_cores: 3\n":          {"cpu_affinity_cores", "want a list"},
		"      use_direct: maybe\n":              {"use_direct"},
	}
	for line, wants := range cases {
		_, err := ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_name: UcmPipelineStore\n    ucm_connector_config:\n      storage_backends: /a\n" + line))
		for _, want := range wants {
			if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: %v (want engine.ErrInvalidArgument naming %s)", line, err, want)
			}
		}
	}
	_, err := ParseConfig([]byte("enable_event_synk: true\nucm_connectors: []\n"))
	if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), `did you mean "enable_event_sync"`) {
		t.Errorf("top-level typo: %v", err)
	}
}

// use_direct is io_direct when io_direct is absent.
func TestUCMKeysUseDirect(t *testing.T) {
	for doc, want := range map[string]devio.DirectMode{
		"use_direct: false":                        devio.DirectOff,
		"use_direct: true":                         devio.DirectOn,
		"use_direct: true\n      io_direct: false": devio.DirectOff,
		"io_direct: true\n      use_direct: false": devio.DirectOn,
	} {
		c, err := ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_config:\n      storage_backends: /a\n      " + doc + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		_, opts, err := c.StoreOptions()
		if err != nil || opts.DirectIO != want {
			t.Errorf("%q: direct %v, want %v (%v)", doc, opts.DirectIO, want, err)
		}
		both := strings.Contains(doc, "io_direct")
		if slices.Contains(c.Unused(), "ucm_connectors[0].use_direct") != both {
			t.Errorf("%q: Unused %v", doc, c.Unused())
		}
	}
}

// The Empty and Cache|Empty pipelines: no tier for Empty; for Cache|Empty one disk tier of
// cache_buffer_capacity_gb on the directory the opener names, synced never, without O_DIRECT;
// shared with share_buffer_enable (or absent) and a unique_id; keys they ignore are named.
func TestConfigEmptyPipelines(t *testing.T) {
	c, err := ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_config:\n      store_pipeline: Empty\n      share_buffer_enable: true\n      storage_backends: /a\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Connectors[0].Config
	if !p.KeepsNothing() || p.CacheOnly() || connectorTiers(p) != nil {
		t.Fatalf("Empty: %+v", p)
	}
	if u := c.Unused(); !slices.Contains(u, "ucm_connectors[0].storage_backends") || !slices.Contains(u, "ucm_connectors[0].share_buffer_enable") {
		t.Fatalf("Empty: Unused %v", u)
	}
	doc := "ucm_connectors:\n  - ucm_connector_config:\n      store_pipeline: Cache|Empty\n      unique_id: abc\n      cache_buffer_capacity_gb: 2\n      io_direct: true\n"
	c, err = ParseConfig([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p = c.Connectors[0].Config
	if !p.CacheOnly() || !p.SharedCache() || connectorTiers(p) != nil {
		t.Fatalf("Cache|Empty: %+v shared %v", p, p.SharedCache())
	}
	if u := c.Unused(); slices.Contains(u, "ucm_connectors[0].unique_id") || !slices.Contains(u, "ucm_connectors[0].io_direct") {
		t.Fatalf("Cache|Empty: Unused %v", u)
	}
	c.Connectors[0].Config.StorageBackends = Paths{"/dev/shm/x"}
	_, opts, err := c.StoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	want := []tiers.Config{{Name: "cache", Kind: tiers.KindDisk, Paths: []string{"/dev/shm/x"}, Capacity: 2 << 30}}
	if !slices.EqualFunc(opts.Tiers, want, func(a, b tiers.Config) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) ||
		opts.SyncPolicy != wal.SyncNone || opts.DirectIO != devio.DirectOff {
		t.Fatalf("Cache|Empty options: tiers %+v sync %v direct %v", opts.Tiers, opts.SyncPolicy, opts.DirectIO)
	}
	for _, extra := range []string{"      share_buffer_enable: false\n", ""} {
		d := "ucm_connectors:\n  - ucm_connector_config:\n      store_pipeline: Cache|Empty\n" + extra
		if extra == "" {
			d += "      share_buffer_enable: true\n" // no unique_id: nothing names the shared cache
		} else {
			d += "      unique_id: abc\n"
		}
		c, err := ParseConfig([]byte(d))
		if err != nil || c.Connectors[0].Config.SharedCache() {
			t.Fatalf("%q: shared %v (%v)", d, err == nil && c.Connectors[0].Config.SharedCache(), err)
		}
	}
	_, err = ParseConfig([]byte("ucm_connectors:\n  - ucm_connector_config:\n      store_pipeline: Empty\n      tiers: [{name: ssd, kind: disk, paths: [/a]}]\n"))
	if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), "tiers") {
		t.Fatalf("Empty with tiers: %v", err)
	}
}

// renderUCMKeys is the table docs/connector.md shows.
func renderUCMKeys() string {
	var b strings.Builder
	b.WriteString("| key | where | UCM means | UCM-Go |\n|---|---|---|---|\n")
	effect := map[KeyEffect]string{KeyHonoured: "**honoured**: ", KeyConditional: "**depends**: ", KeyNoEffect: "no effect (logged once): "}
	for _, k := range UCMKeys {
		where := "store"
		if k.Scope == ScopeTop {
			where = "top level"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s%s |\n", k.Name, where, strings.ReplaceAll(k.UCM, "|", `\|`), effect[k.Effect], strings.ReplaceAll(k.UCMGo, "|", `\|`))
	}
	return b.String()
}

// docs/connector.md shows the table as it is (UCM_UPDATE_DOCS=1 prints it to paste).
func TestUCMKeysDocumented(t *testing.T) {
	table := renderUCMKeys()
	if os.Getenv("UCM_UPDATE_DOCS") != "" {
		fmt.Print(table)
	}
	doc, err := os.ReadFile("../../docs/connector.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), table) {
		t.Fatal("docs/connector.md lacks the current table of UCM's keys (run with UCM_UPDATE_DOCS=1 and paste it)")
	}
}
