package connector

import (
	"crypto/md5"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/ucm-go/ucm/engine"
)

func noEnv(string) string { return "" }

func randomIDs(n int) []engine.BlockID {
	out := make([]engine.BlockID, n)
	for i := range out {
		for j := range out[i] {
			out[i][j] = byte(rand.Uint32())
		}
	}
	return out
}

// pattern is block id's shard sh, tensor-by-tensor: bytes no other block or shard has.
func pattern(id engine.BlockID, sh int, n int64) []byte {
	out := make([]byte, n)
	seed := md5.Sum(append(id[:], byte(sh), byte(sh>>8)))
	for i := range out {
		out[i] = seed[i%16] ^ byte(i/16)
	}
	return out
}

// workerJSON is a worker's store configuration as UCM's connector builds it (a dict, passed as
// JSON): two tensors of 16 KiB per shard (K and V of a layer), 4 layers.
func workerJSON(dir string, device int, extra string) string {
	return fmt.Sprintf(`{"storage_backends": [%q], "device_id": %d, "unique_id": "e0", "tensor_size_list": [16384, 16384],
 "shard_size": 32768, "block_size": 131072, "local_rank_size": 1, "posix_gc_enable": false%s}`, dir, device, extra)
}

func openStore(t *testing.T, text string) *Store {
	t.Helper()
	cfg, err := ParseStoreConfig(text, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestParseStoreConfig(t *testing.T) {
	dir := t.TempDir()
	cfg, err := ParseStoreConfig(workerJSON(dir, 2, ""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if cfg.Scheduler || cfg.Layout != (engine.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 32768}) || len(cfg.Tensors) != 2 ||
		cfg.Instance != host+"-rank2" || cfg.MetricsListen != "" {
		t.Fatalf("worker config %+v", cfg)
	}
	// UCM's older keys: tensor_size with shard_size.
	cfg, err = ParseStoreConfig(fmt.Sprintf(`{"storage_backends": %q, "device_id": 0, "tensor_size": 4096, "shard_size": 8192, "block_size": 8192}`, dir), noEnv)
	if err != nil || cfg.Layout.Shards != 1 || len(cfg.Tensors) != 2 {
		t.Fatalf("tensor_size config: %+v %v", cfg, err)
	}
	// UCM's scheduler form with tensor sizes (device_id -1), and no device at all: never rank
	// 0's name.
	for _, dev := range []string{`"device_id": -1, `, ""} {
		cfg, err = ParseStoreConfig(fmt.Sprintf(`{"storage_backends": %q, %s"tensor_size": 4096, "shard_size": 4096, "block_size": 8192}`, dir, dev), noEnv)
		if err != nil || cfg.Scheduler || cfg.Instance != host+"-nodevice" {
			t.Fatalf("device-less config (%s): %+v %v", dev, cfg, err)
		}
	}
	// The scheduler: block_size only.
	cfg, err = ParseStoreConfig(fmt.Sprintf(`{"storage_backends": %q, "block_size": 131072}`, dir), noEnv)
	if err != nil || !cfg.Scheduler || cfg.Instance != host+"-scheduler" {
		t.Fatalf("scheduler config: %+v %v", cfg, err)
	}
	// A whole UCM file, by path and through UCM_CONFIG_FILE, with the metrics variables.
	path := filepath.Join(dir, "ucm.yaml")
	yml := fmt.Sprintf("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n      storage_backends: %s\n      device_id: 1\n      shard_size: 4096\n      tensor_size: 4096\nenable_event_sync: true\n", dir)
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"UCM_CONFIG_FILE": path, "UCM_METRICS_ENABLE": "1", "UCM_METRICS_PORT": "9000"}
	for _, text := range []string{path, ""} {
		cfg, err = ParseStoreConfig(text, func(k string) string { return env[k] })
		if err != nil || cfg.Layout.ShardBytes != 4096 || cfg.MetricsListen != "127.0.0.1:9002" {
			t.Fatalf("config from %q: %+v %v", text, cfg, err)
		}
	}
	for _, bad := range []struct{ text, want string }{
		{`{"storage_backends": "/x", "device_id": 0}`, "device_id"},
		{`{"storage_backends": "/x", "device_id": 0, "tensor_size_list": [100, 100], "shard_size": 300}`, "shard_size"},
		{`{"storage_backends": "/x", "device_id": 0, "shard_size": 4096, "block_size": 6000}`, "block_size"},
		{`{"storage_backends": "/x", "shard_sise": 4096}`, "shard_sise"},
		{`{"device_id": 0, "shard_size": 4096}`, "storage_backends"},
		{`/no/such/file.yaml`, "/no/such/file.yaml"},
		{`[1, 2]`, "mapping"},
	} {
		_, err := ParseStoreConfig(bad.text, noEnv)
		if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), bad.want) || StatusOf(err) != StatusEParam {
			t.Fatalf("%s: %v (want an EPARAM naming %s)", bad.text, err, bad.want)
		}
	}
}

// shardSpans returns per block the memory of one shard: two separate tensors (staged) or one
// span, alternating.
func shardSpans(cfg *StoreConfig, ids []engine.BlockID, sh int, fill bool) ([][][]byte, [][]byte) {
	spans := make([][][]byte, len(ids))
	whole := make([][]byte, len(ids))
	for i, id := range ids {
		b := make([]byte, cfg.Layout.ShardBytes)
		if fill {
			copy(b, pattern(id, sh, cfg.Layout.ShardBytes))
		}
		whole[i] = b
		if i%2 == 0 {
			spans[i] = [][]byte{b}
			continue
		}
		// Separate allocations, so the tensors are not one span.
		var ts [][]byte
		off := int64(0)
		for _, n := range cfg.Tensors {
			tb := make([]byte, n)
			copy(tb, b[off:off+n])
			ts = append(ts, tb)
			off += n
		}
		spans[i] = ts
	}
	return spans, whole
}

// dumpLayers dumps shards from..Shards-1 of ids, a task per layer, and waits for each.
func dumpLayers(t *testing.T, s *Store, ids []engine.BlockID, from int) {
	t.Helper()
	for sh := from; sh < s.Config().Layout.Shards; sh++ {
		spans, _ := shardSpans(s.Config(), ids, sh, true)
		task, err := s.Dump(ids, repeat(sh, len(ids)), spans)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(task, nil); err != nil {
			t.Fatalf("dump layer %d: %v", sh, err)
		}
	}
}

func joined(spans [][]byte) []byte {
	var out []byte
	for _, s := range spans {
		out = append(out, s...)
	}
	return out
}

// TestStoreLayerwiseRoundTrip: layer-wise dumps (one call per layer, as UCM's connector issues
// them) then layer-wise and whole-shard-group loads return the bytes, through one span or one
// span per tensor; lookups see the blocks once every layer is in; a missing block fails its
// load alone, reported in the failure mask.
func TestStoreLayerwiseRoundTrip(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	cfg := s.Config()
	ids := randomIDs(24)
	dumpLayers(t, s, ids, 0)
	if hits, _ := s.Lookup(ids); !all(hits) {
		t.Fatalf("lookup after dump: %v", hits)
	}
	missing := randomIDs(1)[0]
	chain := append(append([]engine.BlockID(nil), ids[:5]...), missing, ids[6])
	if n, _ := s.LookupOnPrefix(chain); n != 4 {
		t.Fatalf("lookup_on_prefix = %d, want 4 (last index of the leading run)", n)
	}
	if n, _ := s.LookupOnPrefix([]engine.BlockID{missing}); n != -1 {
		t.Fatalf("lookup_on_prefix of a miss = %d, want -1", n)
	}
	for sh := 0; sh < cfg.Layout.Shards; sh++ {
		loadIDs := append(append([]engine.BlockID(nil), ids...), missing)
		spans, _ := shardSpans(cfg, loadIDs, sh, false)
		task, err := s.Load(loadIDs, repeat(sh, len(loadIDs)), spans)
		if err != nil {
			t.Fatal(err)
		}
		failed := make([]bool, len(loadIDs))
		err = s.Wait(task, failed)
		if !errors.Is(err, engine.ErrNotFound) || StatusOf(err) != StatusENoObj {
			t.Fatalf("load with a missing block: %v", err)
		}
		for i, id := range ids {
			if failed[i] {
				t.Fatalf("block %d reported failed", i)
			}
			if string(joined(spans[i])) != string(pattern(id, sh, cfg.Layout.ShardBytes)) {
				t.Fatalf("layer %d of block %d differs", sh, i)
			}
		}
		if !failed[len(ids)] {
			t.Fatal("the missing block is not reported failed")
		}
	}
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func all(b []bool) bool {
	for _, v := range b {
		if !v {
			return false
		}
	}
	return true
}

// TestStoreBadInput: every malformed call gets a typed error with UCM's status and names what
// was wrong, and loses nothing stored; handles are consumed by Wait; a closed store refuses.
func TestStoreBadInput(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	cfg := s.Config()
	ids := randomIDs(3)
	dumpLayers(t, s, ids, 1)
	spans, _ := shardSpans(cfg, ids, 0, true)
	task, err := s.Dump(ids, []int{0, 0, 0}, spans)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := s.Check(task); err != nil || (done && s.Wait(task, nil) != nil) {
		t.Fatalf("check: %v", err)
	} else if !done {
		if err := s.Wait(task, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Wait(task, nil); !errors.Is(err, ErrUnknownTask) || StatusOf(err) != StatusENoObj {
		t.Fatalf("second wait: %v", err)
	}
	if _, err := s.Check(12345); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("check of an unknown task: %v", err)
	}
	short := [][]byte{make([]byte, 100)}
	cases := []struct {
		name   string
		ids    []engine.BlockID
		shards []int
		bufs   [][][]byte
		status Status
		want   string
	}{
		{"duplicate", []engine.BlockID{ids[0], ids[0]}, []int{1, 1}, [][][]byte{spans[0], spans[0]}, StatusEDuplicate, "positions 0 and 1"},
		{"shard out of range", ids[:1], []int{4}, spans[:1], StatusEParam, "shard index 4"},
		{"negative shard", ids[:1], []int{-2}, spans[:1], StatusEParam, "shard index -2"},
		{"whole block of one shard's size", ids[:1], []int{engine.AllShards}, spans[:1], StatusEParam, "want the block's 131072"},
		{"whole block, wrong span count", ids[:1], []int{engine.AllShards}, [][][]byte{{short[0], short[0], short[0]}}, StatusEParam, "3 spans, want 1 (the block, 131072 bytes), 4 (one per shard of 32768 bytes) or 8"},
		{"whole and a shard of one block", []engine.BlockID{ids[0], ids[0]}, []int{1, engine.AllShards}, [][][]byte{spans[0], {make([]byte, 131072)}}, StatusEDuplicate, "positions 0 and 1, once as the whole block"},
		{"a shard of a block named whole", []engine.BlockID{ids[0], ids[0]}, []int{engine.AllShards, 2}, [][][]byte{{make([]byte, 131072)}, spans[0]}, StatusEDuplicate, "positions 0 and 1, once as the whole block"},
		{"wrong size", ids[:1], []int{1}, [][][]byte{{short[0], short[0]}}, StatusEParam, "tensor 0: 100 bytes, want 16384"},
		{"one span of the wrong size", ids[:1], []int{1}, [][][]byte{short}, StatusEParam, "one span of 100 bytes, want the whole shard's 32768"},
		{"wrong count", ids[:1], []int{1}, [][][]byte{{short[0], short[0], short[0]}}, StatusEParam, "3 addresses"},
		{"length mismatch", ids, []int{1}, spans, StatusEParam, "3 block ids, 1 shard indexes"},
		{"zero id", []engine.BlockID{{}}, []int{1}, spans[:1], StatusEParam, "zero block id"},
	}
	for _, c := range cases {
		for _, load := range []bool{false, true} {
			_, err := s.transfer(load, c.ids, c.shards, c.bufs)
			if StatusOf(err) != c.status || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s (load %v): %v (status %d), want %d naming %q", c.name, load, err, StatusOf(err), c.status, c.want)
			}
		}
	}
	if err := s.Wait(0, nil); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("wait of handle 0: %v", err)
	}
	// Nothing stored was lost: shard 0 of the three blocks still loads.
	out, _ := shardSpans(cfg, ids, 0, false)
	task, err = s.Load(ids, []int{0, 0, 0}, out)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(task, make([]bool, 2)); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("wrong failure mask: %v", err)
	}
	// That Wait did not consume the handle: it failed on its argument.
	if err := s.Wait(task, nil); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if string(joined(out[i])) != string(pattern(id, 0, cfg.Layout.ShardBytes)) {
			t.Fatalf("block %d changed", i)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ids); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("lookup after close: %v", err)
	}
	if _, err := s.Dump(ids, []int{0, 0, 0}, spans); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("dump after close: %v", err)
	}
}

// TestStoreWorkersShareBackends: tensor-parallel workers and the scheduler configured with one
// storage_backends directory each open their own instance (none gets ErrLocked); with MLA one
// rank dumps and every rank loads the same blocks; the scheduler's lookups see them; two
// processes given the same instance name get numbered ones.
func TestStoreWorkersShareBackends(t *testing.T) {
	dir := t.TempDir()
	w0 := openStore(t, workerJSON(dir, 0, ""))
	w1 := openStore(t, workerJSON(dir, 1, ""))
	twin := openStore(t, workerJSON(dir, 1, ""))
	sched := openStore(t, fmt.Sprintf(`{"storage_backends": [%q], "block_size": 131072}`, dir))
	if twin.Config().Instance != w1.Config().Instance+"-2" {
		t.Fatalf("instances %q and %q", w1.Config().Instance, twin.Config().Instance)
	}
	cfg := w0.Config()
	ids := randomIDs(10)
	spans, _ := shardSpans(cfg, ids, 0, true)
	dumpLayers(t, w0, ids, 0)
	deadline := time.Now().Add(20 * time.Second)
	for {
		h1, _ := w1.Lookup(ids)
		n, _ := sched.LookupOnPrefix(ids)
		if all(h1) && n == len(ids)-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 1 hits %v, scheduler prefix %d", h1, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for sh := 0; sh < cfg.Layout.Shards; sh++ {
		out, _ := shardSpans(cfg, ids, sh, false)
		task, err := w1.Load(ids, repeat(sh, len(ids)), out)
		if err != nil {
			t.Fatal(err)
		}
		if err := w1.Wait(task, nil); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if string(joined(out[i])) != string(pattern(id, sh, cfg.Layout.ShardBytes)) {
				t.Fatalf("rank 1: layer %d of block %d differs", sh, i)
			}
		}
	}
	if _, err := sched.Load(ids, repeat(0, len(ids)), spans); StatusOf(err) != StatusEParam {
		t.Fatalf("scheduler load: %v", err)
	}
}

// TestStoreMetricsEndpoint: the endpoint serves UCM's ucm: histograms with the model_name label
// and the engine's own families, parsed as Prometheus text; it is bound to loopback.
func TestStoreMetricsEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port - 1 // the worker of device 0 serves metrics_port + 1
	ln.Close()
	s := openStore(t, workerJSON(t.TempDir(), 0, fmt.Sprintf(`, "metrics_port": %d, "model_name": "qwen-test"`, port)))
	addr, err := s.MetricsAddr()
	if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("metrics address %q, %v", addr, err)
	}
	cfg := s.Config()
	ids := randomIDs(4)
	for _, load := range []bool{false, true} {
		for sh := 0; sh < cfg.Layout.Shards; sh++ {
			sp, _ := shardSpans(cfg, ids, sh, !load)
			task, err := s.transfer(load, ids, repeat(sh, len(ids)), sp)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Wait(task, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := s.LookupOnPrefix(ids); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint64{"ucm:load_blocks_num": 4, "ucm:save_blocks_num": 4, "ucm:load_duration": 4,
		"ucm:save_speed": 4, "ucm:interval_lookup_hit_rates": 1, "ucm:load_requests_num": 4} {
		f, ok := fams[name]
		if !ok {
			t.Fatalf("%s not exported", name)
		}
		var count uint64
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model_name" && l.GetValue() == "qwen-test" {
					count += m.GetHistogram().GetSampleCount()
				}
			}
		}
		if count < want {
			t.Fatalf("%s{model_name=qwen-test} has %d samples, want >= %d", name, count, want)
		}
	}
	if _, ok := fams["ucm_load_latency_seconds"]; !ok {
		t.Fatal("the engine's own families are not exported")
	}
	// Every series the Grafana dashboard in docs/ charts is exported.
	dash, err := os.ReadFile("../docs/grafana-ucmgo.json")
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`(ucm[:_][a-z_:]+?)(_bucket|_sum|_count)?\{`).FindAllStringSubmatch(string(dash), -1)
	if len(names) < 20 {
		t.Fatalf("only %d series found in the dashboard", len(names))
	}
	for _, m := range names {
		if _, ok := fams[m[1]]; !ok {
			t.Errorf("the dashboard charts %s, which the endpoint does not export", m[1])
		}
	}
}

// TestStoreWholeBlockForm: UCM's whole-block form (PcStore's: no shard list, one tensor per
// layer covering the block in order) dumps and loads whole blocks of a layer-wise layout, with
// the row as one span per tensor of every shard, one per shard, or one of the block; a layer
// dumped whole loads back layer by layer and the other way round.
func TestStoreWholeBlockForm(t *testing.T) {
	s := openStore(t, workerJSON(t.TempDir(), 0, ""))
	cfg := s.Config()
	l := cfg.Layout
	ids := randomIDs(3)
	rows := func(fill bool) [][][]byte {
		out := make([][][]byte, len(ids))
		for i, id := range ids {
			var row [][]byte
			for sh := range l.Shards {
				shard := make([]byte, l.ShardBytes)
				if fill {
					copy(shard, pattern(id, sh, l.ShardBytes))
				}
				switch i {
				case 0: // one span per tensor of every shard
					row = append(row, shard[:cfg.Tensors[0]], shard[cfg.Tensors[0]:])
				case 1: // one span per shard
					row = append(row, shard)
				default: // the whole block as one span
					if len(row) == 0 {
						row = [][]byte{nil}
					}
					row[0] = append(row[0], shard...)
				}
			}
			out[i] = row
		}
		return out
	}
	task, err := s.Dump(ids, nil, rows(true))
	if err != nil || task == 0 {
		t.Fatalf("whole-block dump: task %d, %v", task, err)
	}
	if err := s.Wait(task, nil); err != nil {
		t.Fatal(err)
	}
	if hits, _ := s.Lookup(ids); !all(hits) {
		t.Fatalf("lookup after a whole-block dump: %v", hits)
	}
	// Each layer, loaded alone, is what the whole-block dump wrote for it.
	for sh := range l.Shards {
		out, _ := shardSpans(cfg, ids, sh, false)
		task, err := s.Load(ids, repeat(sh, len(ids)), out)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(task, nil); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if string(joined(out[i])) != string(pattern(id, sh, l.ShardBytes)) {
				t.Fatalf("block %d shard %d differs after a whole-block dump", i, sh)
			}
		}
	}
	// Whole-block loads, with the shard list empty and with -1 per block.
	for _, shards := range [][]int{nil, repeat(engine.AllShards, len(ids))} {
		dst := rows(false)
		task, err := s.Load(ids, shards, dst)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(task, nil); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			got := joined(dst[i])
			for sh := range l.Shards {
				if string(got[int64(sh)*l.ShardBytes:int64(sh+1)*l.ShardBytes]) != string(pattern(id, sh, l.ShardBytes)) {
					t.Fatalf("block %d shard %d differs after a whole-block load (shards %v)", i, sh, shards)
				}
			}
		}
	}
}

// TestStatusOfOSErrors: errors of the operating system map to EOSERROR (UCM's code for a file
// system that failed), behind every typed mapping.
func TestStatusOfOSErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Status
	}{
		{fmt.Errorf("open: %w", &os.PathError{Op: "mkdir", Path: "/x", Err: syscall.EACCES}), StatusEOSError},
		{fmt.Errorf("read: %w", syscall.EIO), StatusEOSError},
		{fmt.Errorf("rename: %w", &os.LinkError{Op: "rename", Old: "a", New: "b", Err: syscall.EXDEV}), StatusEOSError},
		{os.NewSyscallError("fsync", syscall.EIO), StatusEOSError},
		{fmt.Errorf("x: %w", fs.ErrPermission), StatusEOSError},
		{fmt.Errorf("config file: %w: %w", &os.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, engine.ErrInvalidArgument), StatusEParam},
		{fmt.Errorf("%w: %w", engine.ErrNoSpace, syscall.ENOSPC), StatusENoSpace},
		{errors.New("something else"), StatusError},
	} {
		if got := StatusOf(c.err); got != c.want {
			t.Errorf("StatusOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	// A store whose storage_backends lies under a regular file cannot be made: EOSERROR.
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseStoreConfig(workerJSON(filepath.Join(file, "ucm"), 0, ""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg)
	if err == nil {
		s.Close()
		t.Fatal("opened a store under a regular file")
	}
	if StatusOf(err) != StatusEOSError || !strings.Contains(err.Error(), file) {
		t.Fatalf("open under a file: %v (status %d), want EOSERROR naming %s", err, StatusOf(err), file)
	}
}

// TestStoreNonBMPPath: a storage_backends path with characters outside the Basic Multilingual
// Plane (an emoji), given in JSON with the surrogate-pair escapes Python's json.dumps writes,
// or raw, opens a store in the directory of that name, which dumps and loads.
func TestStoreNonBMPPath(t *testing.T) {
	base := t.TempDir()
	name := "kv-\U0001F600-é-\u6f22"
	escaped := `kv-\ud83d\ude00-\u00e9-\u6f22`
	for _, text := range []string{
		fmt.Sprintf(`{"storage_backends": [%q], "device_id": 0, "tensor_size_list": [16384, 16384], "shard_size": 32768, "block_size": 131072}`, filepath.Join(base, "raw", name)),
		`{"storage_backends": ["` + filepath.Join(base, "escaped") + "/" + escaped + `"], "device_id": 0, "tensor_size_list": [16384, 16384], "shard_size": 32768, "block_size": 131072}`,
	} {
		s := openStore(t, text)
		dir := s.Config().Params.StorageBackends[0]
		if filepath.Base(dir) != name {
			t.Fatalf("storage_backends %q, want a directory named %q", dir, name)
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Fatalf("directory %q: %v", dir, err)
		}
		ids := randomIDs(2)
		dumpLayers(t, s, ids, 0)
		out, _ := shardSpans(s.Config(), ids, 1, false)
		task, err := s.Load(ids, []int{1, 1}, out)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(task, nil); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if string(joined(out[i])) != string(pattern(id, 1, s.Config().Layout.ShardBytes)) {
				t.Fatalf("block %d differs", i)
			}
		}
		s.Close()
	}
}
