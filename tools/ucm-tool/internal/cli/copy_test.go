package cli

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tiers"
)

// buildNestedTierStore makes a cleanly closed store in root/kc whose two disk tiers are
// directories inside it (kc/ssd, kc/hdd), with n blocks, most of them demoted to hdd.
func buildNestedTierStore(t *testing.T, root string, n int) string {
	t.Helper()
	dir := filepath.Join(root, "kc")
	e, err := engine.Open(dir, engine.Options{Layout: testLayout, Schema: testSchema, SegmentSize: testSegmentSize,
		Logger: slog.New(slog.DiscardHandler),
		Tiers: []tiers.Config{
			{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{filepath.Join(dir, "ssd")}, Capacity: 3 << 20},
			{Name: "hdd", Kind: tiers.KindDisk, Paths: []string{filepath.Join(dir, "hdd")}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 10 {
		dump(t, e, i, min(n, i+10))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// storeBlocks returns the blocks each disk tier of the store in dir holds, by name.
func storeBlocks(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out, _, code := run(t, "stats", "--json", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("stats %s: exit %d", dir, code)
	}
	m := map[string]int64{}
	for _, tr := range decode[statsReport](t, out).Tiers {
		m[tr.Name] = tr.Blocks
	}
	return m
}

// Tier paths inside the store directory are the store's own: evict and compact on a copy of
// the store work on the copy's directories and leave the original as it was.
func TestOperationsOnACopyLeaveTheOriginal(t *testing.T) {
	root := t.TempDir()
	kc := buildNestedTierStore(t, root, 120)
	before := storeBlocks(t, kc)
	if before["hdd"] == 0 || before["ssd"] == 0 {
		t.Fatalf("the store should hold blocks in both tiers: %v", before)
	}
	kc3 := filepath.Join(root, "kc3")
	copyDir(t, kc, kc3)

	out, _, code := run(t, "evict", "--json", "--to", "0", "--tier", "hdd", kc3)
	if r := decode[reclaimReport](t, out); code != cliutil.ExitOK || r.Tiers[1].BlocksAfter != 0 {
		t.Fatalf("evict on the copy: exit %d %+v", code, r)
	}
	if got := storeBlocks(t, kc3); got["hdd"] != 0 || got["ssd"] != before["ssd"] {
		t.Fatalf("copy after evicting hdd: %v, want hdd 0 and ssd %d", got, before["ssd"])
	}
	if out, _, code := run(t, "compact", "--live-ratio", "0.99", kc3); code != cliutil.ExitOK {
		t.Fatalf("compact on the copy: exit %d\n%s", code, out)
	}
	if got := storeBlocks(t, kc); got["hdd"] != before["hdd"] || got["ssd"] != before["ssd"] {
		t.Fatalf("the original changed: %v, want %v", got, before)
	}
	out, _, code = run(t, "verify", kc)
	if code != cliutil.ExitOK || !strings.Contains(out, "store is clean") {
		t.Fatalf("verify of the original: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, filepath.Join(kc, "hdd")) || strings.Contains(out, kc3) {
		t.Fatalf("verify of the original should read its own hdd only:\n%s", out)
	}
}
