package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
)

// benchJSON runs a bench with --json and returns the decoded object.
func benchJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out, _, code := run(t, append(append([]string{"bench"}, args...), "--json")...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("bench --json does not parse: %v\n%s", err, out)
	}
	if m["verified"] != true {
		t.Errorf("not verified: %v", m)
	}
	return m
}

func mustHaveKeys(t *testing.T, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %v", k, m)
		}
	}
}

func mustLackKeys(t *testing.T, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; ok {
			t.Errorf("JSON has %q, which does not apply to %v", k, m["workload"])
		}
	}
}

// fakeFio puts a fio on PATH that prints canned JSON output (and records its job files), with
// no hugetlb pages free (whatever this machine has) unless the test says otherwise. It reports
// writes at 1000 MB/s and reads at 2000; with FAKE_FIO_DRIFT set, every job after the first two
// of its kind reports three times as much (a disk that sped up after the first measurement).
func fakeFio(t *testing.T) (jobsLog string) {
	t.Helper()
	withHugetlbFree(t, 0)
	bin := t.TempDir()
	jobsLog = filepath.Join(bin, "jobs.log")
	script := `#!/bin/sh
for a in "$@"; do case "$a" in --*) ;; *) cat "$a" >> ` + jobsLog + `
  if [ -n "$FAKE_FIO_FAIL_HUGE" ] && grep -q mmaphuge "$a"; then echo "fio: hugetlb mmap: Cannot allocate memory" >&2; exit 1; fi ;; esac; done
w=1000000000; r=2000000000
if [ -n "$FAKE_FIO_DRIFT" ]; then
  [ "$(( $(grep -c 'rw=write' ` + jobsLog + `) - $(grep -c 'fdatasync=' ` + jobsLog + `) ))" -gt 2 ] && w=3000000000
  [ "$(grep -c 'rw=read' ` + jobsLog + `)" -gt 2 ] && r=6000000000
fi
grep -q fdatasync= "$a" && w=$((w / 2)) # the durable limit: half the plain write here
echo "fio: a warning before the JSON"
cat <<JSON
{"fio version": "fio-3.33", "jobs": [{"jobname": "ucm-bench", "error": 0,
  "read": {"bw_bytes": $r}, "write": {"bw_bytes": $w}}]}
JSON
`
	if err := os.WriteFile(filepath.Join(bin, "fio"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return jobsLog
}

func TestBenchLayerwise(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--workload", "layerwise", "--dir", dir, "--total", "4MiB", "--block-size", "256KiB", "--shards", "32",
		"--segment-size", "1MiB", "--batch", "3"}
	out, _, code := run(t, append([]string{"bench"}, args...)...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "layerwise", "32 x 8KiB", "blocks      16", "dump", "load", "verified", "s/GiB")
	m := benchJSON(t, append(args, "--direct", "off", "--io-engine", "psync")...)
	mustHaveKeys(t, m, "workload", "dump_MBps", "load_MBps", "open_s", "shard_bytes", "dump_cpu_s", "load_cpu_s")
	mustLackKeys(t, m, "hit_rate", "p99_lookup_batch_ms", "fio_write_MBps")
	if m["workload"] != "layerwise" || m["shard_bytes"] != float64(8<<10) || m["blocks"] != 16.0 || m["host_layout"] != "layer" {
		t.Errorf("JSON %v", m)
	}
	verifyStore(t, filepath.Join(dir, "bench-layerwise-256KiB-32"))
	// Both orders by default, connector first. Their dumps write batch records straight from
	// the bench's aligned buffers: no staging memory.
	orders, _ := m["layerwise"].([]any)
	if len(orders) != 2 || orders[0].(map[string]any)["order"] != "connector" || orders[1].(map[string]any)["order"] != "random" {
		t.Fatalf("layerwise orders %v, want connector then random", m["layerwise"])
	}
	for _, o := range orders {
		o := o.(map[string]any)
		peak, _ := o["staging_peak_bytes"].(float64)
		if o["dump_MBps"].(float64) <= 0 || o["load_MBps"].(float64) <= 0 || peak != 0 {
			t.Errorf("%v order: %v (max staging %v)", o["order"], o, m["max_staging_bytes"])
		}
	}
	if c := orders[0].(map[string]any); c["requests"] == nil || c["mean_request_blocks"] == nil {
		t.Errorf("connector order without its requests: %v", c)
	}
}

// Both host layouts move every byte to its place: the bench's stamp checks and its final
// byte comparison fail the run (and "verified" is false) if a shard went to another block's
// or another layer's place, with requests of varying length in both orders.
func TestBenchLayerwiseHostLayouts(t *testing.T) {
	for _, layout := range []string{"layer", "block"} {
		m := benchJSON(t, "--workload", "layerwise", "--dir", t.TempDir(), "--total", "6MiB", "--block-size", "96KiB", "--shards", "6",
			"--segment-size", "1MiB", "--request-max-blocks", "7", "--concurrency", "3", "--host-layout", layout, "--direct", "off", "--io-engine", "psync")
		if m["verified"] != true || m["host_layout"] != layout {
			t.Errorf("--host-layout %s: %v", layout, m)
		}
	}
}

// --order connector --timings: every layer task of every request is one load batch (requests
// are at most 64 blocks, the engine's batch), and with --stage-layer-wise the dump's flights (of
// block records) carry every block.
func TestBenchLayerwiseConnectorTimings(t *testing.T) {
	const shards = 8
	m := benchJSON(t, "--workload", "layerwise", "--dir", t.TempDir(), "--total", "8MiB", "--block-size", "64KiB", "--shards", "8",
		"--segment-size", "1MiB", "--order", "connector", "--timings", "--stage-layer-wise", "--request-max-blocks", "16", "--direct", "off", "--io-engine", "psync")
	orders := m["layerwise"].([]any)
	if len(orders) != 1 {
		t.Fatalf("orders %v, want the connector order alone", orders)
	}
	o := orders[0].(map[string]any)
	if peak, _ := o["staging_peak_bytes"].(float64); peak <= 0 || peak > m["max_staging_bytes"].(float64) {
		t.Errorf("--stage-layer-wise: staging peak %v, want within (0, %v]", peak, m["max_staging_bytes"])
	}
	reqs := o["requests"].(float64)
	if mx := o["max_request_blocks"].(float64); mx > 16 || reqs < 128/16 {
		t.Fatalf("%v requests of at most %v blocks for 128 blocks, --request-max-blocks 16", reqs, mx)
	}
	lt := o["load_timings"].(map[string]any)
	if lt["batches"].(float64) != reqs*shards || lt["KiB_per_read"].(float64) != 8 {
		t.Errorf("load timings %v: want %v batches (requests × shards) of 8 KiB reads", lt, reqs*shards)
	}
	dt := o["dump_timings"].(map[string]any)
	if f, rpf := dt["flights"].(float64), dt["records_per_flight"].(float64); f < 1 || f*rpf < 127.5 || f*rpf > 128.5 {
		t.Errorf("dump timings %v: want flights carrying the 128 blocks", dt)
	}
	if o["layers_in_flight"].(float64) != shards {
		t.Errorf("layers in flight %v, want every layer (%d) by default", o["layers_in_flight"], shards)
	}
	one := benchJSON(t, "--workload", "layerwise", "--dir", t.TempDir(), "--total", "2MiB", "--block-size", "64KiB", "--shards", "8",
		"--order", "connector", "--layers-in-flight", "1", "--direct", "off", "--io-engine", "psync")
	if o := one["layerwise"].([]any)[0].(map[string]any); o["layers_in_flight"].(float64) != 1 || one["verified"] != true {
		t.Errorf("--layers-in-flight 1: %v", one)
	}
	if _, _, code := run(t, "bench", "--workload", "layerwise", "--dir", t.TempDir(), "--layers-in-flight", "-1"); code != cliutil.ExitUsage {
		t.Errorf("--layers-in-flight -1: exit %d, want %d", code, cliutil.ExitUsage)
	}
	if _, _, code := run(t, "bench", "--workload", "layerwise", "--dir", t.TempDir(), "--host-layout", "diagonal"); code != cliutil.ExitUsage {
		t.Errorf("--host-layout diagonal: exit %d, want %d", code, cliutil.ExitUsage)
	}
	if _, _, code := run(t, "bench", "--workload", "layerwise", "--dir", t.TempDir(), "--order", "sideways"); code != cliutil.ExitUsage {
		t.Errorf("--order sideways: exit %d, want %d", code, cliutil.ExitUsage)
	}
}

func TestBenchLookup(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--workload", "lookup", "--dir", dir, "--blocks", "2000", "--batches", "50", "--segment-size", "1MiB"}
	out, _, code := run(t, append([]string{"bench"}, args...)...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "lookup", "prefix lookup", "p99", "bytes/block", "4KiB", "verified")
	m := benchJSON(t, args...)
	mustHaveKeys(t, m, "workload", "p50_lookup_batch_ms", "p99_lookup_batch_ms", "p99_prefix_batch_ms", "open_s",
		"index_s", "rss_bytes_per_block", "heap_bytes_per_block")
	mustLackKeys(t, m, "hit_rate", "load_MBps", "fio_read_MBps", "map_lookups_per_s", "lookup_map_ratio")
	if m["blocks"] != 2000.0 || m["block_bytes"] != 4096.0 || m["shards"] != 1.0 || m["sync"] != "none" ||
		m["lookup_batch"] != 1024.0 || m["lookup_batches"] != 50.0 {
		t.Errorf("JSON %v", m)
	}
	if h := m["lookup_hit_fraction"].(float64); h < 0.4 || h > 0.6 {
		t.Errorf("lookup hit fraction %v, want about 1/2", h)
	}
	// --map-baseline: a Go map answers the same batches; the ratio is the engine's rate over it.
	mb := benchJSON(t, append(args, "--map-baseline")...)
	mustHaveKeys(t, mb, "lookups_per_s", "map_lookups_per_s", "lookup_map_ratio")
	if got, want := mb["lookup_map_ratio"].(float64), mb["lookups_per_s"].(float64)/mb["map_lookups_per_s"].(float64); got <= 0 || got/want < 0.999 || got/want > 1.001 {
		t.Errorf("lookup_map_ratio %v, want lookups_per_s / map_lookups_per_s = %v", got, want)
	}
}

func TestBenchOpen(t *testing.T) {
	dir := t.TempDir()
	// Small segments: the crash copy has sealed (hard-linked) segments and an active one.
	args := []string{"--workload", "open", "--dir", dir, "--blocks", "2000", "--segment-size", "1MiB", "--batch", "100"}
	out, _, code := run(t, append([]string{"bench"}, args...)...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "open after crash", "clean store", "segment(s), cut", "verified")
	m := benchJSON(t, args...)
	mustHaveKeys(t, m, "workload", "open_s", "open_crash_s", "crash_recovery", "rss_bytes_per_block", "index_s")
	mustLackKeys(t, m, "hit_rate", "load_MBps", "p99_lookup_batch_ms")
	cr := m["crash_recovery"].(map[string]any)
	// The copy is taken while the engine runs: the active segment and any whose seal was
	// still in flight are recovered.
	if cr["segments_recovered"].(float64) < 1 || cr["blocks_after"].(float64) > 2000 || cr["blocks_after"].(float64) < 1 {
		t.Errorf("crash recovery %v", cr)
	}
	// Only the crash copy is removed; the clean store stays, and is clean.
	if _, err := os.Stat(filepath.Join(dir, "bench-open-4KiB-1-crash")); !os.IsNotExist(err) {
		t.Errorf("crash copy left behind: %v", err)
	}
	if r := verifyStore(t, filepath.Join(dir, "bench-open-4KiB-1")); r.Recovery != nil {
		t.Errorf("the open store needed a recovery after the bench: %+v", r.Recovery)
	}
}

// TestBenchOpenCapacity: with --capacity the disk tier is configured in the store directory,
// and the crash copy is opened with its tier in the copy's directory, not the original's (a
// store's directory holds that store's data only: the engine refuses the other).
func TestBenchOpenCapacity(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--workload", "open", "--dir", dir, "--blocks", "500", "--segment-size", "1MiB", "--batch", "100", "--capacity", "1GiB"}
	out, errOut, code := run(t, append([]string{"bench"}, args...)...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	clitest.MustContain(t, out, "open after crash", "verified")
}

func TestBenchTrace(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join("testdata", "mooncake_trace_50.jsonl")
	reqs, distinct, err := readTrace(trace)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 50 {
		t.Fatalf("%d requests in the excerpt", len(reqs))
	}
	// The expected hit rate, replaying one request at a time.
	seen := map[int64]bool{}
	var hits, blocks, hitTok, tok int64
	for _, r := range reqs {
		n := 0
		for n < len(r.HashIDs) && seen[r.HashIDs[n]] {
			n++
		}
		hits += int64(n)
		blocks += int64(len(r.HashIDs))
		hitTok += min(int64(n)*512, r.InputLength)
		tok += r.InputLength
		for _, h := range r.HashIDs {
			seen[h] = true
		}
	}
	args := []string{"--workload", "trace", "--trace", trace, "--dir", dir, "--block-size", "16KiB", "--shards", "2",
		"--segment-size", "1MiB", "--concurrency", "1"}
	out, _, code := run(t, append([]string{"bench"}, args...)...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "hit rate", "token hit rate", "requests/s", "verified")
	m := benchJSON(t, args...)
	mustHaveKeys(t, m, "workload", "hit_rate", "token_hit_rate", "bytes_loaded", "bytes_dumped", "throughput_MBps",
		"requests", "prompt_blocks", "buffers")
	if b := m["buffers"].(string); !strings.HasPrefix(b, "huge") {
		t.Errorf("trace buffers %q, want the default huge-page host memory", b)
	}
	mustLackKeys(t, m, "p99_lookup_batch_ms", "open_crash_s")
	if hits == 0 {
		t.Fatal("the excerpt has no prefix reuse")
	}
	if m["hit_rate"] != float64(hits)/float64(blocks) || m["token_hit_rate"] != float64(hitTok)/float64(tok) ||
		m["prompt_blocks"] != float64(blocks) || m["blocks"] != float64(distinct) || m["requests"] != 50.0 ||
		m["bytes_loaded"] != float64(hits*16<<10) || m["bytes_dumped"] != float64(int64(distinct)*16<<10) {
		t.Errorf("JSON %v; want hit rate %d/%d, %d distinct blocks", m, hits, blocks, distinct)
	}
	// Concurrent replay works too (its hit rate may differ slightly).
	m = benchJSON(t, append(args, "--concurrency", "4", "--batch", "8")...)
	if hr := m["hit_rate"].(float64); hr <= 0 || hr > float64(hits)/float64(blocks)+1e-9 {
		t.Errorf("concurrent hit rate %v", hr)
	}
}

func TestBenchTraceUsage(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	_ = os.WriteFile(bad, []byte("{\"hash_ids\": [1, 2]}\nnot json\n"), 0o644)
	for _, args := range [][]string{
		{"bench", "--workload", "trace", "--dir", dir},
		{"bench", "--workload", "trace", "--dir", dir, "--trace", filepath.Join(dir, "missing.jsonl")},
		{"bench", "--workload", "trace", "--dir", dir, "--trace", bad},
		{"bench", "--workload", "trace", "--dir", dir, "--trace", filepath.Join("testdata", "mooncake_trace_50.jsonl"), "--capacity", "-1"},
		{"bench", "--workload", "trace", "--dir", dir, "--trace", filepath.Join("testdata", "mooncake_trace_50.jsonl"), "--capacity", "1MiB"},
		{"bench", "--workload", "trace", "--dir", dir, "--trace", filepath.Join("testdata", "mooncake_trace_50.jsonl"), "--memory", "lots"},
		{"bench", "--workload", "seq", "--dir", dir, "--capacity", "1GiB"},
		{"bench", "--workload", "lookup", "--dir", dir, "--blocks", "0"},
		{"bench", "--workload", "seq", "--dir", dir, "--fio-iodepth", "0"},
	} {
		if _, _, code := run(t, args...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

// withHugetlbFree makes the bench see n bytes of free hugetlb pages for the rest of the test.
func withHugetlbFree(t *testing.T, n int64) {
	old := hugetlbFree
	hugetlbFree = func() int64 { return n }
	t.Cleanup(func() { hugetlbFree = old })
}

func TestBenchFio(t *testing.T) {
	jobs := fakeFio(t)
	dir := t.TempDir()
	m := benchJSON(t, "--dir", dir, "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB",
		"--fio", "--fio-iodepth", "8")
	mustHaveKeys(t, m, "workload", "dump_MBps", "load_MBps", "fio_write_MBps", "fio_read_MBps", "dump_ratio", "load_ratio", "fio",
		"dump_cpu_s", "load_cpu_s", "sync_bytes", "fio_durable_write_MBps", "dump_durable_ratio")
	if m["fio_write_MBps"] != 1000.0 || m["fio_read_MBps"] != 2000.0 || m["fio_durable_write_MBps"] != 500.0 ||
		m["dump_ratio"] != m["dump_MBps"].(float64)/1000 || m["load_ratio"] != m["load_MBps"].(float64)/2000 ||
		m["dump_durable_ratio"] != m["dump_MBps"].(float64)/500 {
		t.Errorf("JSON %v", m)
	}
	// The tasks' buffers: 16 tasks of 4 blocks of 256 KiB.
	if m["host_buffer_bytes"] != float64(16*4*256<<10) {
		t.Errorf("host_buffer_bytes %v, want %d", m["host_buffer_bytes"], 16*4*256<<10)
	}
	// Before the run: write and read at depths 8 and 64; after it, the durable write at both
	// depths too (before the first round no flush interval is known yet).
	runs := m["fio"].([]any)
	if len(runs) != 10 {
		t.Errorf("%d fio runs, want 4 before the run and 6 after", len(runs))
	}
	// The durable job syncs every write at least, and as often as the dump did.
	syncBytes := m["sync_bytes"].(float64)
	every := 0.0
	for _, r := range runs {
		if e, ok := r.(map[string]any)["fdatasync_every"].(float64); ok {
			every = e
		}
	}
	if want := max(1, math.Round(syncBytes/(256<<10))); syncBytes <= 0 || every != want {
		t.Errorf("durable fio fdatasync every %v writes, want %v (%v bytes per engine sync)", every, want, syncBytes)
	}
	b, err := os.ReadFile(jobs)
	if err != nil {
		t.Fatal(err)
	}
	clitest.MustContain(t, string(b), "rw=write", "rw=read", "bs=262144", "size=4194304", "iodepth=8", "iodepth=64", "filename="+dir,
		"iomem=malloc", "fdatasync=")
	if strings.Contains(string(b), "mmaphuge") || !strings.Contains(m["fio_note"].(string), "vm.nr_hugepages") {
		t.Errorf("without hugetlb pages fio must run from malloc buffers and say how to reserve huge pages: %v", m["fio_note"])
	}
	// Layer-wise: random reads of one shard.
	_ = os.Remove(jobs)
	out, _, code := run(t, "bench", "--workload", "layerwise", "--dir", dir, "--total", "4MiB", "--block-size", "256KiB",
		"--shards", "4", "--segment-size", "1MiB", "--fio")
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "x fio write (1000.0 MB/s)", "x fio read (2000.0 MB/s)", "randread bs=64KiB iodepth=16",
		"x fio durable write (an fdatasync every", "fdatasync=",
		"x fio 2 MiB read (2000.0 MB/s)", "x fio randread (2000.0 MB/s)")
	b, _ = os.ReadFile(jobs)
	// 2 MiB sequential writes and reads (the disk's sequential speed) and random shard reads.
	clitest.MustContain(t, string(b), "rw=randread\nbs=65536", "rw=read\nbs=2097152", "rw=write\nbs=2097152")
	// No job or data file is left in --dir.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "bench-fio") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// With hugetlb pages reserved, fio also runs from huge pages and the best run is the
// denominator.
func TestBenchFioHugePages(t *testing.T) {
	jobs := fakeFio(t)
	withHugetlbFree(t, 1<<30)
	m := benchJSON(t, "--dir", t.TempDir(), "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB",
		"--fio", "--fio-iodepth", "8", "--fio-bracket=false")
	runs := m["fio"].([]any)
	mems := map[string]int{}
	for _, r := range runs {
		mems[r.(map[string]any)["mem"].(string)]++
	}
	if len(runs) != 12 || mems["malloc"] != 6 || mems["mmaphuge"] != 6 {
		t.Errorf("fio runs %v, want write, durable write and read at depths 8 and 64 from malloc and from huge pages", runs)
	}
	if _, ok := m["fio_note"]; ok {
		t.Errorf("fio_note %v with huge pages available", m["fio_note"])
	}
	b, _ := os.ReadFile(jobs)
	clitest.MustContain(t, string(b), "iomem=mmaphuge", "iomem=malloc")
	// Too few free huge pages for 64 buffers of a block: malloc only.
	withHugetlbFree(t, 64*256<<10)
	m = benchJSON(t, "--dir", t.TempDir(), "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB", "--fio",
		"--fio-bracket=false")
	if runs := m["fio"].([]any); len(runs) != 6 {
		t.Errorf("%d fio runs with too few huge pages, want 6 from malloc", len(runs))
	}
}

// A fio job from huge pages that fails is dropped with a note; the bench still reports the
// malloc runs' ratios, and the reads read a file laid out again from malloc buffers.
func TestBenchFioHugePagesFail(t *testing.T) {
	jobs := fakeFio(t)
	withHugetlbFree(t, 1<<30)
	t.Setenv("FAKE_FIO_FAIL_HUGE", "1")
	m := benchJSON(t, "--dir", t.TempDir(), "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB",
		"--fio", "--fio-iodepth", "8", "--fio-bracket=false")
	if note, _ := m["fio_note"].(string); !strings.Contains(note, "could not run from huge pages") || !strings.Contains(note, "Cannot allocate memory") {
		t.Errorf("fio_note %q", note)
	}
	if m["fio_write_MBps"] != 1000.0 || m["fio_read_MBps"] != 2000.0 || m["dump_ratio"] == nil || m["load_ratio"] == nil {
		t.Errorf("JSON %v", m)
	}
	var writes, reads int
	for _, r := range m["fio"].([]any) {
		run := r.(map[string]any)
		if run["mem"] != "malloc" {
			t.Errorf("a failed huge-page run is listed: %v", run)
		}
		if run["rw"] == "write" {
			writes++
		} else {
			reads++
		}
	}
	if writes != 5 || reads != 2 {
		t.Errorf("%d writes and %d reads, want 2 + 2 durable + 1 relayout writes and 2 reads, from malloc", writes, reads)
	}
	b, _ := os.ReadFile(jobs)
	clitest.MustContain(t, string(b), "iomem=mmaphuge")
}

// fio runs before the first round and after every round; each round's ratios are against the
// mean of the measurements around it, and a disk that changed speed between them moves the
// denominator halfway, not all the way.
func TestBenchFioBracket(t *testing.T) {
	fakeFio(t)
	t.Setenv("FAKE_FIO_DRIFT", "1")
	m := benchJSON(t, "--dir", t.TempDir(), "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB",
		"--fio", "--fio-iodepth", "8", "--rounds", "2")
	rounds := m["rounds"].([]any)
	if len(rounds) != 2 {
		t.Fatalf("%d rounds", len(rounds))
	}
	for i, want := range []struct{ write, read float64 }{{2000, 4000}, {3000, 6000}} {
		r := rounds[i].(map[string]any)
		before, after := r["fio_before"].(map[string]any), r["fio_after"].(map[string]any)
		if r["fio_write_MBps"] != want.write || r["fio_read_MBps"] != want.read {
			t.Errorf("round %d: fio write %v, read %v; want the means %v, %v of before %v and after %v", i+1,
				r["fio_write_MBps"], r["fio_read_MBps"], want.write, want.read, before, after)
		}
		if r["dump_ratio"] != r["dump_MBps"].(float64)/want.write || r["load_ratio"] != r["load_MBps"].(float64)/want.read {
			t.Errorf("round %d: ratios %v, %v not against the means", i+1, r["dump_ratio"], r["load_ratio"])
		}
	}
	// Without bracketing the first round is compared with what fio did after it only.
	fakeFio(t)
	m = benchJSON(t, "--dir", t.TempDir(), "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB",
		"--fio", "--fio-iodepth", "8", "--fio-bracket=false")
	mustLackKeys(t, m, "fio_before", "fio_after")
	if m["fio_write_MBps"] != 1000.0 {
		t.Errorf("unbracketed fio write %v, want the one measurement, 1000", m["fio_write_MBps"])
	}
	fakeFio(t) // a fresh job log: the drift starts after the first measurement again
	out, _, code := run(t, "bench", "--dir", t.TempDir(), "--total", "4MiB", "--block-size", "256KiB", "--shards", "4",
		"--segment-size", "1MiB", "--fio", "--fio-iodepth", "8")
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "ratios against the (means of write 1000.0/3000.0, read 2000.0/6000.0 before/after)",
		"x fio write (2000.0 MB/s)")
}

// fio's best read rates count only the runs whose buffers span the engine's (or, when none
// does, the runs with the largest buffers): a job cycling through less memory than the
// engine's tasks is flattered by the host's caches. The write rates stay the best of all.
func TestFioAtFootprint(t *testing.T) {
	const mib = 1 << 20
	f := &fioFigures{WriteMBps: 3000, DurableWriteMBps: 2900, ReadMBps: 3100, RandReadMBps: 900, runs: []fioRun{
		{RW: "write", BlockSize: 2 * mib, IODepth: 8, MBps: 3000},
		{RW: "write", BlockSize: 2 * mib, IODepth: 64, MBps: 2600},
		{RW: "write", BlockSize: 2 * mib, IODepth: 8, FdatasyncEvery: 16, MBps: 2900},
		{RW: "write", BlockSize: 2 * mib, IODepth: 64, FdatasyncEvery: 16, MBps: 2500},
		{RW: "read", BlockSize: 2 * mib, IODepth: 8, MBps: 3100},
		{RW: "read", BlockSize: 2 * mib, IODepth: 64, MBps: 2300},
		{RW: "read", BlockSize: 2 * mib, IODepth: 64, Mem: "mmaphuge", MBps: 2400},
		{RW: "randread", BlockSize: 64 << 10, IODepth: 8, MBps: 900},
		{RW: "randread", BlockSize: 64 << 10, IODepth: 64, MBps: 700},
	}}
	for _, c := range []struct {
		footprint    int64
		read, random float64
	}{
		{0, 3100, 900},         // not known: every run
		{16 * mib, 3100, 700},  // depth 8 of 2 MiB spans 16 MiB; 64 KiB reads would need depth 256: the largest
		{17 * mib, 2400, 700},  // more than depth 8 spans
		{128 * mib, 2400, 700}, // depth 64 spans it exactly
		{1 << 30, 2400, 700},   // more than any run: the runs with the largest buffers
	} {
		g := f.atFootprint(c.footprint)
		if g.ReadMBps != c.read || g.RandReadMBps != c.random || g.WriteMBps != 3000 || g.DurableWriteMBps != 2900 {
			t.Errorf("footprint %d: write %v durable %v read %v randread %v; want 3000 2900 %v %v", c.footprint,
				g.WriteMBps, g.DurableWriteMBps, g.ReadMBps, g.RandReadMBps, c.read, c.random)
		}
	}
	if f.ReadMBps != 3100 || f.RandReadMBps != 900 {
		t.Errorf("atFootprint changed its receiver: %+v", f)
	}
	// A run without random reads keeps none.
	g := (&fioFigures{ReadMBps: 2400, runs: []fioRun{{RW: "read", BlockSize: 2 * mib, IODepth: 64, MBps: 2400}}}).atFootprint(128 * mib)
	if g.RandReadMBps != 0 || g.ReadMBps != 2400 {
		t.Errorf("%+v", g)
	}
}

func TestReadHugetlbFree(t *testing.T) {
	if n := readHugetlbFree(); n < 0 {
		t.Errorf("readHugetlbFree = %d", n)
	}
	meminfo := "MemTotal:       24576000 kB\nHugePages_Total:     300\nHugePages_Free:      296\n" +
		"HugePages_Rsvd:        0\nHugepagesize:       2048 kB\nHugetlb:          614400 kB\n"
	if n := parseHugetlbFree([]byte(meminfo)); n != 296*2<<20 {
		t.Errorf("parseHugetlbFree = %d, want %d", n, 296*2<<20)
	}
	for _, bad := range []string{"", "HugePages_Free: 10\n", "Hugepagesize: 2048 kB\n", "HugePages_Free: x\nHugepagesize: 2048 kB\n"} {
		if n := parseHugetlbFree([]byte(bad)); n != 0 {
			t.Errorf("parseHugetlbFree(%q) = %d, want 0", bad, n)
		}
	}
}

func TestBenchFioMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	dir := t.TempDir()
	args := []string{"bench", "--dir", dir, "--total", "1MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB", "--fio"}
	out, errOut, code := run(t, args...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d, want 0 without fio", code)
	}
	clitest.MustContain(t, out+errOut, "apt-get install fio")
	m := benchJSON(t, args[1:]...)
	mustLackKeys(t, m, "dump_ratio", "load_ratio")
	mustHaveKeys(t, m, "fio_note")
}

func TestParseFioBandwidth(t *testing.T) {
	out := []byte(`note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs": [{"error": 0, "read": {"bw_bytes": 3e9}, "write": {"bw_bytes": 0}}]}`)
	if mb, err := parseFioBandwidth(out, "randread"); err != nil || mb != 3000 {
		t.Errorf("randread: %v %v", mb, err)
	}
	if _, err := parseFioBandwidth(out, "write"); err == nil {
		t.Error("a zero write bandwidth was accepted")
	}
	if _, err := parseFioBandwidth([]byte("fio: failed"), "read"); err == nil {
		t.Error("no JSON accepted")
	}
}

func TestPayloadCheckRange(t *testing.T) {
	p := newPayloadPool(64 << 10)
	b := make([]byte, 64<<10)
	id := blockID(9)
	p.fill(b, id)
	for _, off := range []int64{0, 8, 16, 4096, 60 << 10} {
		if err := p.checkRange(b[off:off+4096], id, off); err != nil {
			t.Errorf("offset %d: %v", off, err)
		}
	}
	b[5] ^= 1
	if err := p.checkRange(b[:4096], id, 0); err == nil || !strings.Contains(err.Error(), "byte 5 ") {
		t.Errorf("flipped stamp byte: %v", err)
	}
	b[5] ^= 1
	b[5000] ^= 1
	if err := p.checkRange(b[4096:8192], id, 4096); err == nil || !strings.Contains(err.Error(), "byte 5000") {
		t.Errorf("flipped byte: %v", err)
	}
}

// The timed loads check every page's stamp: a page of another block or of another place in
// the block fails, wherever the checked range starts; the body is left to the engine's
// checksums and to verifyAll.
func TestPayloadCheckStamps(t *testing.T) {
	p := newPayloadPool(64 << 10)
	b := make([]byte, 64<<10)
	id := blockID(9)
	p.fill(b, id)
	for _, off := range []int64{0, 8, 16, 4096, 60 << 10} {
		if err := p.checkStamps(b[off:off+4096], id, off); err != nil {
			t.Errorf("offset %d: %v", off, err)
		}
	}
	if err := p.checkStamps(b, blockID(10), 0); err == nil || !strings.Contains(err.Error(), "page 0") {
		t.Errorf("another block's bytes: %v", err)
	}
	moved := slices.Clone(b)
	copy(moved[8192:12288], b[4096:8192]) // page 1 where page 2 belongs
	if err := p.checkStamps(moved[8:], id, 8); err == nil || !strings.Contains(err.Error(), "page 2") {
		t.Errorf("misplaced page, checked from byte 8: %v", err)
	}
	b[5000] ^= 1 // body, not stamp
	if err := p.checkStamps(b, id, 0); err != nil {
		t.Errorf("a body byte is not a stamp: %v", err)
	}
	if err := p.checkStamps(b[:8], id, 64<<10); err == nil {
		t.Error("a range past the block was accepted")
	}
}

// verifyAll compares every byte: a block stored with a wrong body byte (its checksums match
// what was stored, and its stamps are right) is reported.
func TestVerifyAllComparesEveryByte(t *testing.T) {
	l := format.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 16 << 10}
	dir := t.TempDir()
	env := &benchEnv{cfg: benchConfig{concurrency: 2, batch: 2, buffers: "heap"}, blocks: 5,
		payload: newPayloadPool(l.BlockBytes()), storeDir: dir,
		opts: engine.Options{Layout: l, Schema: benchSchema, SegmentSize: 1 << 20}, stderr: io.Discard}
	e, _, err := env.open()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close() }()
	for i := range env.blocks {
		b := make([]byte, l.BlockBytes())
		env.payload.fill(b, blockID(i))
		if i == 3 {
			b[40000] ^= 0x80
		}
		if err := e.Dump([]format.BlockID{blockID(i)}, [][]byte{b}).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	var mismatch atomic.Pointer[error]
	if err := verifyAll(env, e, &mismatch); err != nil {
		t.Fatal(err)
	}
	if p := mismatch.Load(); p == nil || !strings.Contains((*p).Error(), blockID(3).String()) || !strings.Contains((*p).Error(), "byte 40000") {
		t.Fatalf("mismatch %v, want block 3 byte 40000", p)
	}
}

// With --capacity the trace store's disk tier stays within its capacity plus one segment,
// evicts, and hits no more than the unlimited store; --memory adds a memory tier.
func TestBenchTraceCapacity(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join("testdata", "mooncake_trace_50.jsonl")
	base := []string{"--workload", "trace", "--trace", trace, "--dir", dir, "--block-size", "16KiB", "--shards", "2",
		"--segment-size", "1MiB", "--concurrency", "2", "--sync", "none"}
	unlimited := benchJSON(t, base...)
	mustLackKeys(t, unlimited, "capacity_bytes", "evicted_blocks", "capacity_exceeded_by_bytes")
	const capacity = 6 << 20 // about a quarter of the 1342 distinct blocks
	capped := benchJSON(t, append(base, "--capacity", "6MiB")...)
	mustHaveKeys(t, capped, "hit_rate", "capacity_bytes", "evicted_blocks", "segments_retired", "peak_used_bytes", "capacity_exceeded_by_bytes")
	if capped["capacity_bytes"] != float64(capacity) || capped["evicted_blocks"].(float64) == 0 || capped["segments_retired"].(float64) == 0 {
		t.Fatalf("capped run: %v", capped)
	}
	if over := capped["capacity_exceeded_by_bytes"].(float64); over > 1<<20 || capped["peak_used_bytes"].(float64) > capacity+1<<20 {
		t.Fatalf("capacity exceeded by %v bytes, more than one segment", over)
	}
	if capped["hit_rate"].(float64) > unlimited["hit_rate"].(float64) {
		t.Fatalf("capped hit rate %v above the unlimited %v", capped["hit_rate"], unlimited["hit_rate"])
	}
	mem := benchJSON(t, append(base, "--capacity", "6MiB", "--memory", "2MiB")...)
	mustHaveKeys(t, mem, "memory_bytes", "memory_hits", "capacity_exceeded_by_bytes")
	out, _, code := run(t, append([]string{"bench"}, append(base, "--capacity", "6MiB", "--memory", "2MiB")...)...)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "capacity", "exceeded by", "eviction", "memory tier", "verified")
}

// TestBenchRounds: --rounds repeats the workload and fio, keeps each round's figures and
// reports medians, each ratio taken within its round.
func TestBenchRounds(t *testing.T) {
	jobs := fakeFio(t)
	dir := t.TempDir()
	m := benchJSON(t, "--dir", dir, "--total", "2MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB",
		"--fio", "--fio-iodepth", "64", "--rounds", "3")
	rounds, ok := m["rounds"].([]any)
	if !ok || len(rounds) != 3 {
		t.Fatalf("rounds %v, want 3", m["rounds"])
	}
	var dumps, ratios []float64
	for i, r := range rounds {
		rr := r.(map[string]any)
		d, ratio := rr["dump_MBps"].(float64), rr["dump_ratio"].(float64)
		if rr["fio_write_MBps"] != 1000.0 || ratio != d/1000 {
			t.Errorf("round %d: %v", i, rr)
		}
		dumps, ratios = append(dumps, d), append(ratios, ratio)
	}
	if m["dump_MBps"] != median(dumps) || m["dump_ratio"] != median(ratios) || m["fio_write_MBps"] != 1000.0 {
		t.Errorf("medians: dump %v ratio %v, rounds %v", m["dump_MBps"], m["dump_ratio"], rounds)
	}
	if _, ok := m["fio"]; ok {
		t.Errorf("a rounds run keeps fio runs per round only: %v", m["fio"])
	}
	b, err := os.ReadFile(jobs)
	if err != nil {
		t.Fatal(err)
	}
	if n, durable := strings.Count(string(b), "rw=write"), strings.Count(string(b), "fdatasync="); n != 7 || durable != 3 {
		t.Errorf("%d fio write jobs (%d durable), want a plain one before the first round and a plain and a durable one after each", n, durable)
	}
	out, _, code := run(t, "bench", "--dir", dir, "--total", "1MiB", "--block-size", "256KiB", "--shards", "4",
		"--segment-size", "1MiB", "--rounds", "2")
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "rounds", "round 1", "round 2", "verified")
	for _, args := range [][]string{{"--rounds", "0"}, {"--workload", "lookup", "--blocks", "10", "--rounds", "2"}} {
		_, errOut, code := run(t, append([]string{"bench", "--dir", dir}, args...)...)
		if code != cliutil.ExitUsage || !strings.Contains(errOut, "--rounds") {
			t.Errorf("%v: exit %d, %q", args, code, errOut)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// --trace gives the connector order the trace's request lengths, in file order, starting over.
func TestBenchLayerwiseTraceLengths(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	body := `{"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 1, "input_length": 2560, "output_length": 1, "hash_ids": [4, 5, 6, 7, 8]}
`
	if err := os.WriteFile(trace, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	// 16 blocks: requests of 3, 5, 3, 5 blocks.
	m := benchJSON(t, "--workload", "layerwise", "--dir", dir, "--total", "1MiB", "--block-size", "64KiB", "--shards", "4",
		"--segment-size", "1MiB", "--order", "connector", "--trace", trace, "--direct", "off", "--io-engine", "psync")
	o := m["layerwise"].([]any)[0].(map[string]any)
	if o["requests"] != 4.0 || o["max_request_blocks"] != 5.0 || o["mean_request_blocks"] != 4.0 {
		t.Fatalf("connector order from the trace: %v; want 4 requests of 3 and 5 blocks", o)
	}
}

// --recycled: the timed dump writes into the segment files an untimed fill left behind (every
// new segment but the one prepared before the eviction reuses a file), the fill's blocks do
// not count as the dump's, every byte still verifies, and fio overwrites a file it wrote first
// (one more, untimed, write job per measurement) instead of writing a new one.
func TestBenchRecycled(t *testing.T) {
	jobs := fakeFio(t)
	dir := t.TempDir()
	for _, workload := range []string{"seq", "layerwise"} {
		_ = os.Remove(jobs)
		m := benchJSON(t, "--workload", workload, "--order", "connector", "--dir", dir, "--total", "4MiB", "--block-size", "256KiB",
			"--shards", "4", "--segment-size", "1MiB", "--recycled", "--fio", "--fio-iodepth", "8")
		if m["recycled"] != true {
			t.Errorf("%s: recycled = %v", workload, m["recycled"])
		}
		// 4 MiB into 1 MiB segments takes at least 4 segments beyond the fill's last (active)
		// one; the first of them was prepared before the eviction and is a new file.
		if n, _ := m["segments_recycled"].(float64); n < 3 {
			t.Errorf("%s: %v segments of the timed dump reused a file, want all but the one prepared before the eviction (3 or more)", workload, m["segments_recycled"])
		}
		if runs := m["fio"].([]any); len(runs) != 10 && workload == "seq" {
			t.Errorf("%s: %d timed fio runs, want 10 (4 before the round, 6 with the durable writes after)", workload, len(runs))
		}
		b, err := os.ReadFile(jobs)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "rw=write"); n != 8 {
			t.Errorf("%s: %d fio write jobs, want 2 measurements × (1 untimed layout + depths 8 and 64) + the durable writes after the round", workload, n)
		}
	}
	m := benchJSON(t, "--dir", dir, "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB")
	mustLackKeys(t, m, "recycled", "segments_recycled")
}

// The shared-capacity workload: instances sharing one tier each dump twice its capacity; the
// volume's peak stays within the bound, other instances' blocks load byte-exact, and a run
// without a capacity is refused. The capacity is six segments: with four, the two active
// segments and the two asked for ahead of need may leave no sealed segment to load when the
// dumps end.
func TestBenchSharedCapacity(t *testing.T) {
	dir := t.TempDir()
	m := benchJSON(t, "--workload", "shared-capacity", "--dir", dir, "--instances", "2", "--total", "12MiB", "--capacity", "6MiB",
		"--segment-size", "1MiB", "--sync", "none")
	s, ok := m["shared"].(map[string]any)
	if !ok {
		t.Fatalf("JSON lacks the shared figures: %v", m)
	}
	mustHaveKeys(t, s, "peak_volume_bytes", "bound_bytes", "samples", "visibility_p50_ms", "lookups_per_s", "verified")
	if s["bound_bytes"] != float64(6<<20+2<<20) || s["peak_volume_bytes"].(float64) > s["bound_bytes"].(float64) ||
		s["peak_volume_bytes"].(float64) < float64(2<<20) || s["verified"].(float64) < 1 || len(s["samples"].([]any)) < 2 {
		t.Errorf("shared figures %v", s)
	}
	if _, errOut, code := run(t, "bench", "--workload", "shared-capacity", "--dir", dir, "--capacity", "0"); code != cliutil.ExitUsage || !strings.Contains(errOut, "--capacity") {
		t.Errorf("a shared-capacity run without a capacity: exit %d, %s", code, errOut)
	}
}

// A value a flag cannot parse fails the command before it runs, naming the flag and the value.
// --buffer-span makes the seq tasks cycle through more memory than one batch each: the
// buffers span it (rounded up to whole groups of batches), every block still verified.
func TestBenchBufferSpan(t *testing.T) {
	args := []string{"--dir", t.TempDir(), "--total", "4MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB",
		"--concurrency", "2", "--batch", "2"}
	m := benchJSON(t, args...)
	if m["host_buffer_bytes"] != float64(2*2*256<<10) {
		t.Errorf("host_buffer_bytes %v without --buffer-span, want one batch per task, %d", m["host_buffer_bytes"], 2*2*256<<10)
	}
	// 3 MiB over 2 tasks of 2 × 256 KiB: 3 groups per task (3 MiB), not 2.5.
	m = benchJSON(t, append(args, "--buffer-span", "2560KiB")...)
	if m["host_buffer_bytes"] != float64(3<<20) {
		t.Errorf("host_buffer_bytes %v with --buffer-span 2560KiB, want 3 MiB", m["host_buffer_bytes"])
	}
	for _, bad := range [][]string{{"--buffer-span", "1MiB", "--workload", "layerwise"}, {"--buffer-span", "1MiB", "--workload", "trace"}} {
		if _, _, code := run(t, append([]string{"bench", "--dir", t.TempDir()}, bad...)...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want 2", bad, code)
		}
	}
}

func TestBenchFlagValues(t *testing.T) {
	for _, args := range [][]string{{"--total", "3XB"}, {"--segment-size", "big"}, {"--sync", "sometimes"}, {"--io-engine", "carrier-pigeon"},
		{"--direct", "maybe"}, {"--compression", "zip"}, {"--capacity", "-1x"}, {"--max-staging", "lots"}, {"--buffer-span", "wide"}} {
		_, errOut, code := run(t, append([]string{"bench", "--dir", t.TempDir()}, args...)...)
		if code != cliutil.ExitUsage || !strings.Contains(errOut, args[0]) || !strings.Contains(errOut, args[1]) {
			t.Errorf("bench %v: exit %d, %q", args, code, errOut)
		}
	}
}

// runTasks calls onStart once, with the tasks' buffers allocated and filled and before any
// task runs, so that the phase meters started there (CPU, device counters) measure the tasks
// and not the buffers' first touch.
func TestRunTasksStartsMetersAfterBuffers(t *testing.T) {
	l := format.Layout{Shards: 2, TensorsPerShard: 1, ShardBytes: 16 << 10}
	env := &benchEnv{cfg: benchConfig{concurrency: 2, batch: 2, buffers: "heap", bufferSpan: 256 << 10}, blocks: 9,
		payload: newPayloadPool(l.BlockBytes()), stderr: io.Discard}
	var starts, tasksBeforeStart, tasks atomic.Int32
	_, err := runTasks(env, 0, l.BlockBytes(), func() {
		starts.Add(1)
		tasksBeforeStart.Store(tasks.Load())
		if env.bufferBytes < 256<<10 {
			t.Errorf("onStart ran with %d bytes of buffers allocated, want the whole span, %d", env.bufferBytes, 256<<10)
		}
	}, func(ids []format.BlockID, bufs [][]byte) error {
		tasks.Add(1)
		for _, b := range bufs {
			if !bytes.Equal(b, env.payload.body) {
				return fmt.Errorf("block %s: a task's buffer does not hold the payload body", ids[0])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if starts.Load() != 1 || tasksBeforeStart.Load() != 0 || tasks.Load() != 5 {
		t.Fatalf("onStart called %d times, after %d tasks; %d tasks in all, want 1, 0, 5", starts.Load(), tasksBeforeStart.Load(), tasks.Load())
	}
}
