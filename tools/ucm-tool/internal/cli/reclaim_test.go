package cli

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// tieredStore is a cleanly closed store with two disk tiers of two paths each (none of them
// the store directory): 120 blocks, most demoted from the 2 MiB first tier to the second, then
// three of every four deleted from the index, so that most segments are mostly dead.
type tieredStore struct {
	dir, root string
	live      int
}

func buildTieredStore(t *testing.T) tieredStore {
	t.Helper()
	root := t.TempDir()
	s := tieredStore{dir: filepath.Join(root, "store"), root: root}
	p := func(name string) string { return filepath.Join(root, name) }
	e, err := engine.Open(s.dir, engine.Options{Layout: testLayout, Schema: testSchema, SegmentSize: testSegmentSize,
		Logger: slog.New(slog.DiscardHandler),
		Tiers: []tiers.Config{
			{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{p("ssd1"), p("ssd2")}, Capacity: 3 << 20},
			{Name: "nfs", Kind: tiers.KindDisk, Paths: []string{p("nfs1"), p("nfs2")}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 120; i += 10 {
		dump(t, e, i, i+10)
	}
	b := e.Index().NewBatch()
	for i := 0; i < 120; i++ {
		if i%4 != 0 {
			b.Delete(testID(i))
		} else {
			s.live++
		}
	}
	if err := e.Index().Apply(b, true); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return s
}

func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	return v
}

// verify, inspect and stats find segments on every path of every tier.
func TestToolsOnTieredStore(t *testing.T) {
	s := buildTieredStore(t)
	out, _, code := run(t, "verify", s.dir)
	if code != cliutil.ExitOK || !strings.Contains(out, "store is clean") || !strings.Contains(out, filepath.Join(s.root, "nfs2")) {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
	out, _, code = run(t, "inspect", s.dir)
	if code != cliutil.ExitOK || !strings.Contains(out, " ssd ") || !strings.Contains(out, " nfs ") {
		t.Fatalf("inspect: exit %d\n%s", code, out)
	}
	out, _, code = run(t, "stats", "--json", s.dir)
	st := decode[statsReport](t, out)
	if code != cliutil.ExitOK || len(st.Tiers) != 2 || st.Tiers[0].Name != "ssd" || st.Tiers[1].Name != "nfs" {
		t.Fatalf("stats: exit %d %+v", code, st.Tiers)
	}
	var blocks, files int64
	for _, tr := range st.Tiers {
		blocks += tr.Blocks
		files += tr.FileBytes
		if tr.Blocks == 0 || tr.Used != tr.FileBytes || tr.DeadBytes != tr.FileBytes-tr.LiveBytes || len(tr.Paths) != 2 {
			t.Errorf("tier %+v", tr)
		}
	}
	if blocks != int64(s.live) || blocks != st.Blocks || files != st.FileBytes {
		t.Fatalf("tiers hold %d blocks in %d bytes; store %d blocks in %d bytes, want %d blocks", blocks, files, st.Blocks, st.FileBytes, s.live)
	}
	out, _, code = run(t, "stats", s.dir)
	if code != cliutil.ExitOK || !strings.Contains(out, "unlimited") || !strings.Contains(out, "segments") {
		t.Fatalf("stats: exit %d\n%s", code, out)
	}
}

// compact and gc reclaim dead space in every tier without losing a block; evict demotes the
// first tier's blocks to the second; the store verifies clean after each.
func TestCompactGCEvict(t *testing.T) {
	s := buildTieredStore(t)
	out, _, code := run(t, "compact", "--json", "--live-ratio", "0.3", s.dir)
	r := decode[reclaimReport](t, out)
	if code != cliutil.ExitOK || r.Command != "compact" || r.SegmentsCompacted == 0 || r.BytesReclaimed <= 0 || r.RecordsMoved == 0 || len(r.Tiers) != 2 || r.Error != "" {
		t.Fatalf("compact: exit %d %+v", code, r)
	}
	var after int64
	for _, c := range r.Tiers {
		after += c.BlocksAfter
		if c.UsedAfter > c.UsedBefore {
			t.Errorf("tier %s grew: %+v", c.Name, c)
		}
	}
	if after != int64(s.live) {
		t.Fatalf("compact lost blocks: %d of %d", after, s.live)
	}
	out, _, code = run(t, "gc", s.dir)
	if code != cliutil.ExitOK || !strings.Contains(out, "gc "+s.dir+": live ratio <= 0.5") || !strings.Contains(out, "used before") {
		t.Fatalf("gc: exit %d\n%s", code, out)
	}
	if out, _, code = run(t, "verify", s.dir); code != cliutil.ExitOK {
		t.Fatalf("verify after gc: exit %d\n%s", code, out)
	}

	out, _, code = run(t, "evict", "--json", "--to", "0", s.dir)
	r = decode[reclaimReport](t, out)
	if code != cliutil.ExitOK || r.Tier != "ssd" || r.BlocksDemoted == 0 || r.BlocksEvicted != r.BlocksDemoted || r.Tiers[0].UsedAfter != 0 || r.Tiers[0].BlocksAfter != 0 {
		t.Fatalf("evict: exit %d %+v", code, r)
	}
	if r.Tiers[1].BlocksAfter != int64(s.live) {
		t.Fatalf("evict to the next tier lost blocks: %+v", r.Tiers)
	}
	out, _, code = run(t, "evict", "--tier", "nfs", "--to", "600KiB", s.dir)
	if code != cliutil.ExitOK || !strings.Contains(out, "deleted)") {
		t.Fatalf("evict from the last tier: exit %d\n%s", code, out)
	}
	out, _, code = run(t, "stats", "--json", s.dir)
	if st := decode[statsReport](t, out); code != cliutil.ExitOK || st.Tiers[1].Used > 600<<10 || st.Blocks >= int64(s.live) {
		t.Fatalf("after evicting the last tier to 600 KiB: %+v", st.Tiers)
	}
	if out, _, code = run(t, "verify", s.dir); code != cliutil.ExitOK {
		t.Fatalf("verify after evict: exit %d\n%s", code, out)
	}
}

// Bad input names the flag and exits 2 without touching the store.
func TestReclaimBadInput(t *testing.T) {
	s := buildTieredStore(t)
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"evict", s.dir}, "--to"},
		{[]string{"evict", "--to", "-5", s.dir}, "--to"},
		{[]string{"evict", "--to", "lots", s.dir}, "--to"},
		{[]string{"evict", "--to", "1MB", s.dir}, "--to"},
		{[]string{"evict", "--to", "1MiB", "--tier", "hdd", s.dir}, "--tier"},
		{[]string{"compact", "--live-ratio", "1.5", s.dir}, "--live-ratio"},
		{[]string{"compact", "--live-ratio", "0", s.dir}, "--live-ratio"},
		{[]string{"gc", filepath.Join(s.root, "nope")}, "nope"},
	} {
		_, stderr, code := run(t, c.args...)
		if code != cliutil.ExitUsage || !strings.Contains(stderr, c.flag) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming %s", c.args, code, stderr, c.flag)
		}
	}
	if out, _, code := run(t, "verify", s.dir); code != cliutil.ExitOK {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
}

// evict --to 0 on the last tier reaches 0 bytes in one run and moves no record: every block
// there is deleted, so compacting sparse segments first would copy records only to delete them
// (and leave the segment they were copied into behind).
func TestEvictLastTierToZeroInOneRun(t *testing.T) {
	s := buildTieredStore(t)
	out, _, code := run(t, "evict", "--json", "--tier", "nfs", "--to", "0", s.dir)
	r := decode[reclaimReport](t, out)
	if code != cliutil.ExitOK || r.Error != "" || r.Tiers[1].UsedAfter != 0 || r.Tiers[1].BlocksAfter != 0 {
		t.Fatalf("evict the last tier to 0: exit %d %+v", code, r)
	}
	if r.RecordsMoved != 0 || r.SegmentsCompacted != 0 || r.BlocksDemoted != 0 || int64(r.BlocksEvicted) != r.Tiers[1].BlocksBefore {
		t.Fatalf("evict the last tier to 0 moved records it deleted: %+v", r)
	}
	if r.Tiers[0].BlocksAfter != r.Tiers[0].BlocksBefore || r.Tiers[0].UsedAfter != r.Tiers[0].UsedBefore {
		t.Fatalf("evicting the last tier changed the first: %+v", r.Tiers)
	}
	for _, p := range []string{"nfs1", "nfs2"} {
		if n, _ := os.ReadDir(filepath.Join(s.root, p, engine.SegmentDir)); segFiles(n) != 0 {
			t.Fatalf("%s still holds %d segment files", p, segFiles(n))
		}
	}
	if out, _, code := run(t, "verify", s.dir); code != cliutil.ExitOK {
		t.Fatalf("verify after evict: exit %d\n%s", code, out)
	}
}

// segFiles counts the segment files among a directory's entries.
func segFiles(entries []os.DirEntry) int {
	n := 0
	for _, e := range entries {
		if _, ok := wal.ParseSegmentFileName(e.Name()); ok {
			n++
		}
	}
	return n
}

// The same on a store without tiers (one unlimited disk tier, the store directory) whose
// segments are mostly dead: one run leaves no segment file and no block.
func TestEvictOnlyTierToZeroInOneRun(t *testing.T) {
	dir := buildStore(t, 100)
	e := openTestEngine(t, dir)
	b := e.Index().NewBatch()
	for i := 0; i < 100; i++ {
		if i%4 != 0 {
			b.Delete(testID(i))
		}
	}
	if err := e.Index().Apply(b, true); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	out, _, code := run(t, "evict", "--json", "--to", "0", dir)
	r := decode[reclaimReport](t, out)
	if code != cliutil.ExitOK || r.Error != "" || r.RecordsMoved != 0 || r.BlocksEvicted != 25 || r.Tiers[0].UsedAfter != 0 || r.Tiers[0].BlocksAfter != 0 {
		t.Fatalf("evict the only tier to 0: exit %d %+v", code, r)
	}
	if n, _ := os.ReadDir(filepath.Join(dir, engine.SegmentDir)); segFiles(n) != 0 {
		t.Fatalf("%d segment files left", segFiles(n))
	}
}
