package connector

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/engine"
)

// layoutJSON is a worker's configuration named "w" with tensors of kv bytes (K and V) per
// layer and 4 layers: two values of kv are two layouts (another model, another TP size).
func layoutJSON(dir string, kv int) string {
	return fmt.Sprintf(`{"storage_backends": [%q], "device_id": 0, "instance": "w", "tensor_size_list": [%d, %d],
 "shard_size": %d, "block_size": %d, "posix_gc_enable": false}`, dir, kv, kv, 2*kv, 8*kv)
}

// loadAll loads every shard of ids and reports, per block, whether the load failed; the bytes
// of the blocks that loaded are checked against pattern.
func loadAll(t *testing.T, s *Store, ids []engine.BlockID) []bool {
	t.Helper()
	cfg := s.Config()
	failed := make([]bool, len(ids))
	for sh := 0; sh < cfg.Layout.Shards; sh++ {
		out, _ := shardSpans(cfg, ids, sh, false)
		task, err := s.Load(ids, repeat(sh, len(ids)), out)
		if err != nil {
			t.Fatal(err)
		}
		mask := make([]bool, len(ids))
		_ = s.Wait(task, mask) // failures are in the mask
		for i, id := range ids {
			if mask[i] {
				failed[i] = true
				continue
			}
			if string(joined(out[i])) != string(pattern(id, sh, cfg.Layout.ShardBytes)) {
				t.Fatalf("%s: layer %d of block %d differs", cfg.Instance, sh, i)
			}
		}
	}
	return failed
}

func none(b []bool) bool {
	for _, v := range b {
		if v {
			return false
		}
	}
	return true
}

// TestStoreLayoutChange: a worker reopened on the same storage_backends with another block
// and tensor size (a new model, a new TP size) opens under the same instance name in a new
// layout namespace; the old layout's blocks are misses there, also after its shared-tier
// refreshes have listed the old namespace, and never load; its own blocks round-trip; reopened
// with the old layout, the old blocks load byte-exact and the new layout's are misses.
func TestStoreLayoutChange(t *testing.T) {
	dir := t.TempDir()
	open := func(kv int) *Store {
		cfg, err := ParseStoreConfig(layoutJSON(dir, kv), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(cfg)
		if err != nil {
			t.Fatalf("open with %d-byte tensors: %v", kv, err)
		}
		if s.Config().Instance != "w" {
			t.Fatalf("instance %q, want w", s.Config().Instance)
		}
		return s
	}
	aIDs, bIDs := randomIDs(6), randomIDs(5)

	a := open(16384)
	dumpLayers(t, a, aIDs, 0)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	b := open(8192)
	start := b.eng.Stats().Sharing.Refreshes
	deadline := time.Now().Add(30 * time.Second)
	for b.eng.Stats().Sharing.Refreshes < start+2 { // a full refresh after Open has listed a's namespace
		if time.Now().After(deadline) {
			t.Fatal("no shared-tier refresh")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if hits, _ := b.Lookup(aIDs); !none(hits) {
		t.Fatalf("layout B finds layout A's blocks: %v", hits)
	}
	if n, _ := b.LookupOnPrefix(aIDs); n != -1 {
		t.Fatalf("layout B prefix over layout A's blocks: %d", n)
	}
	if st := b.eng.Stats().Sharing; st.ForeignSegments != 0 {
		t.Fatalf("layout B indexed %d segments of layout A", st.ForeignSegments)
	}
	if failed := loadAll(t, b, aIDs); !all(failed) {
		t.Fatalf("layout B loaded layout A's blocks: failed %v", failed)
	}
	dumpLayers(t, b, bIDs, 0)
	if hits, _ := b.Lookup(bIDs); !all(hits) {
		t.Fatalf("layout B's own blocks: %v", hits)
	}
	if failed := loadAll(t, b, bIDs); !none(failed) {
		t.Fatalf("layout B's own blocks failed: %v", failed)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	a = open(16384)
	defer a.Close()
	if hits, _ := a.Lookup(aIDs); !all(hits) {
		t.Fatalf("layout A's blocks after layout B ran: %v", hits)
	}
	if failed := loadAll(t, a, aIDs); !none(failed) {
		t.Fatalf("layout A's blocks failed after layout B ran: %v", failed)
	}
	if hits, _ := a.Lookup(bIDs); !none(hits) {
		t.Fatalf("layout A finds layout B's blocks: %v", hits)
	}
	want := filepath.Join(dir, ucmconfig.StoresDir, ucmconfig.LayoutNamespace(a.Config().Schema, a.Config().Layout), "w")
	if a.eng.Dir() != want {
		t.Fatalf("store dir %s, want %s", a.eng.Dir(), want)
	}
}

// TestStoreLegacyInstanceStore: a store a worker left at the place instance stores had before
// layout namespaces (<backend>/stores/<instance>) is moved into its layout's namespace when
// that layout opens it, and its blocks load; while another engine holds it, the worker takes
// the next instance name instead of moving it from under the holder.
func TestStoreLegacyInstanceStore(t *testing.T) {
	dir := t.TempDir()
	cfg, err := ParseStoreConfig(layoutJSON(dir, 16384), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join(dir, ucmconfig.StoresDir, "w")
	_, opts, err := cfg.Config.InstanceStore("w", cfg.Schema, cfg.Layout)
	if err != nil {
		t.Fatal(err)
	}
	old, err := engine.Open(legacy, opts) // as the connector placed it before namespaces
	if err != nil {
		t.Fatal(err)
	}
	ids := randomIDs(4)
	for sh := 0; sh < cfg.Layout.Shards; sh++ {
		spans, _ := shardSpans(cfg, ids, sh, true)
		if err := old.DumpSpans(ids, sh, spans).Wait(); err != nil {
			t.Fatal(err)
		}
	}

	held, err := Open(cfg) // old holds the legacy store: not moved, the next name
	if err != nil {
		t.Fatal(err)
	}
	if held.Config().Instance != "w-2" {
		t.Fatalf("instance %q while the legacy store is held, want w-2", held.Config().Instance)
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	cfg, _ = ParseStoreConfig(layoutJSON(dir, 16384), noEnv)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Config().Instance != "w" {
		t.Fatalf("instance %q, want w", s.Config().Instance)
	}
	if _, err := os.Stat(legacy); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("legacy store still at %s: %v", legacy, err)
	}
	if hits, _ := s.Lookup(ids); !all(hits) {
		t.Fatalf("legacy store's blocks after the move: %v", hits)
	}
	if failed := loadAll(t, s, ids); !none(failed) {
		t.Fatalf("legacy store's blocks failed after the move: %v", failed)
	}
}
