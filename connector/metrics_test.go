package connector

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/ucm-go/ucm/engine"
)

// freePorts returns a port P such that P .. P+n-1 are free on loopback now. It looks below the
// kernel's ephemeral range (32768 and up by default), where outgoing connections take their
// local ports: a run of them leaves thousands of even ports in TIME_WAIT for a minute (the
// Mooncake transport connects per transfer), and a listener cannot bind those, so the port after
// an odd one from bind(":0") is often taken.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	const lo, hi = 20000, 32000
	for try := 0; try < 200; try++ {
		base := lo + rand.IntN(hi-lo-n)
		ok := true
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// scrape parses what addr's /metrics serves.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", addr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return fams
}

func gather(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	fs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fs {
		out[f.GetName()] = f
	}
	return out
}

// total sums a family's histogram sample counts (or counter and gauge values) over the series
// carrying every label in want.
func total(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		match := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match != len(want) {
			continue
		}
		switch {
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// labelValues returns the values a family's series carry for label.
func labelValues(fams map[string]*dto.MetricFamily, name, label string) map[string]bool {
	out := map[string]bool{}
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] = true
			}
		}
	}
	return out
}

// loadLayers loads every layer of ids, a task per layer.
func loadLayers(t *testing.T, s *Store, ids []engine.BlockID) {
	t.Helper()
	for sh := 0; sh < s.Config().Layout.Shards; sh++ {
		spans, _ := shardSpans(s.Config(), ids, sh, false)
		task, err := s.Load(ids, repeat(sh, len(ids)), spans)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(task, nil); err != nil {
			t.Fatalf("load layer %d: %v", sh, err)
		}
	}
}

// TestMetricsTwoStoresOwnEndpoints: UCM's e2e form of a worker (device_id 1) and a "scheduler"
// (device_id -1, with the same tensor sizes) in one process: both open, the device-less store
// serves on metrics_port itself (not on rank 0's metrics_port + 1), and each endpoint serves its
// own store's numbers only, labelled with its store and worker_id.
func TestMetricsTwoStoresOwnEndpoints(t *testing.T) {
	dir := t.TempDir()
	port := freePorts(t, 3)
	extra := fmt.Sprintf(`, "metrics_port": %d, "model_name": "m"`, port)
	worker := openStore(t, workerJSON(dir, 1, extra))
	sched := openStore(t, workerJSON(dir, -1, extra))
	wAddr, err := worker.MetricsAddr()
	if err != nil || wAddr != fmt.Sprintf("127.0.0.1:%d", port+2) {
		t.Fatalf("worker of device 1 serves on %q (%v), want metrics_port + 2", wAddr, err)
	}
	sAddr, err := sched.MetricsAddr()
	if err != nil || sAddr != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("store without a device serves on %q (%v), want metrics_port %d (rank 0 owns %d)", sAddr, err, port, port+1)
	}
	ids := randomIDs(6)
	dumpLayers(t, worker, ids, 0)
	loadLayers(t, worker, ids)
	for range 3 {
		if _, err := sched.Lookup(ids); err != nil {
			t.Fatal(err)
		}
	}
	layers := float64(worker.Config().Layout.Shards)
	w, s := scrape(t, wAddr), scrape(t, sAddr)
	wl := map[string]string{"store": worker.Config().Instance, "worker_id": "1", "model_name": "m"}
	sl := map[string]string{"store": sched.Config().Instance, "worker_id": "e0", "model_name": "m"}
	for _, c := range []struct {
		fams        map[string]*dto.MetricFamily
		who         string
		name        string
		labels      map[string]string
		want, want2 float64 // want with the store's labels, want2 over every series
	}{
		{w, "worker", "ucm:save_requests_num", wl, layers, layers},
		{w, "worker", "ucm:load_blocks_num", wl, layers, layers},
		{w, "worker", "ucm:interval_lookup_hit_rates", wl, 0, 0},
		{w, "worker", "ucm_dumped_blocks_total", map[string]string{"store": worker.Config().Instance, "worker_id": "1"}, 6, 6},
		{s, "scheduler", "ucm:interval_lookup_hit_rates", sl, 3, 3},
		{s, "scheduler", "ucm:save_requests_num", sl, 0, 0},
		{s, "scheduler", "ucm:load_blocks_num", sl, 0, 0},
		{s, "scheduler", "ucm_lookups_total", map[string]string{"store": sched.Config().Instance, "worker_id": "e0"}, 18, 18},
		{s, "scheduler", "ucm_dumped_blocks_total", nil, 0, 0},
	} {
		if got := total(c.fams, c.name, c.labels); got != c.want {
			t.Errorf("%s endpoint: %s%v = %v, want %v", c.who, c.name, c.labels, got, c.want)
		}
		if got := total(c.fams, c.name, nil); got != c.want2 {
			t.Errorf("%s endpoint: %s over every series = %v, want %v (another store's numbers served here)", c.who, c.name, got, c.want2)
		}
	}
	if got := labelValues(w, "ucm_blocks", "store"); len(got) != 1 || !got[worker.Config().Instance] {
		t.Errorf("worker endpoint serves the engine families of %v", got)
	}
	// A store's own gatherer has its numbers only.
	if got := total(gather(t, sched.Gatherer()), "ucm:save_requests_num", nil); got != 0 {
		t.Errorf("scheduler's gatherer has %v saves", got)
	}
}

// TestMetricsTwoStoresSharedEndpoint: UCM's dumper and loader stores of one configuration
// (same device, same unique_id) in one process, and two stores of one device on different
// storage_backends (same instance name): all open, the shared endpoint serves each store's
// series apart (store label), and nothing is counted twice.
func TestMetricsTwoStoresSharedEndpoint(t *testing.T) {
	port := freePorts(t, 2)
	extra := fmt.Sprintf(`, "metrics_port": %d`, port)
	dir := t.TempDir()
	dumper := openStore(t, workerJSON(dir, 0, extra))
	loader := openStore(t, workerJSON(dir, 0, extra))
	other := openStore(t, workerJSON(t.TempDir(), 0, extra)) // same instance name, other backend
	addr, _ := dumper.MetricsAddr()
	for _, s := range []*Store{loader, other} {
		if a, _ := s.MetricsAddr(); a != addr {
			t.Fatalf("stores of one device serve on %q and %q", addr, a)
		}
	}
	ids := randomIDs(4)
	dumpLayers(t, dumper, ids, 0)
	dumpLayers(t, other, ids, 0)
	waitVisible(t, loader, ids)
	loadLayers(t, loader, ids)
	fams := scrape(t, addr)
	stores := labelValues(fams, "ucm:save_requests_num", "store")
	if len(stores) != 3 {
		t.Fatalf("the endpoint's ucm: series carry store labels %v, want 3 stores", stores)
	}
	layers := float64(dumper.Config().Layout.Shards)
	dl := storeLabel(t, fams, dumper)
	ll := storeLabel(t, fams, loader)
	ol := storeLabel(t, fams, other)
	if dl == ll || dl == ol || ll == ol {
		t.Fatalf("store labels %q %q %q are not distinct", dl, ll, ol)
	}
	for _, c := range []struct {
		name  string
		store string
		want  float64
	}{
		{"ucm:save_requests_num", dl, layers}, {"ucm:load_requests_num", dl, 0},
		{"ucm:save_requests_num", ll, 0}, {"ucm:load_requests_num", ll, layers},
		{"ucm:save_requests_num", ol, layers}, {"ucm:load_requests_num", ol, 0},
		{"ucm:save_requests_num", "", 2 * layers}, {"ucm:load_requests_num", "", layers},
		{"ucm_dumped_blocks_total", "", 8},
	} {
		labels := map[string]string{"worker_id": "0"}
		if c.store != "" {
			labels["store"] = c.store
		}
		if got := total(fams, c.name, labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, labels, got, c.want)
		}
	}
	// The process-wide gatherer counts each store once too.
	if got := total(gather(t, Gatherer()), "ucm:save_requests_num", map[string]string{"store": dl}); got != layers {
		t.Errorf("Gatherer: dumper saves %v, want %v", got, layers)
	}
	// Closing one store leaves the endpoint serving the others.
	loader.Close()
	fams = scrape(t, addr)
	if got := labelValues(fams, "ucm:save_requests_num", "store"); len(got) != 2 || got[ll] {
		t.Errorf("after the loader closed the endpoint serves stores %v", got)
	}
}

// storeLabel returns the store label the endpoint gives s's engine families: the one whose
// ucm_dumped_blocks_total equals s's own count, checked against its gatherer.
func storeLabel(t *testing.T, fams map[string]*dto.MetricFamily, s *Store) string {
	t.Helper()
	own := labelValues(gather(t, s.Gatherer()), "ucm_blocks", "store")
	if len(own) != 1 {
		t.Fatalf("store %s's gatherer has store labels %v", s.Config().Instance, own)
	}
	for l := range own {
		if !labelValues(fams, "ucm_blocks", "store")[l] {
			t.Fatalf("store label %q not served by the endpoint", l)
		}
		return l
	}
	return ""
}

// waitVisible waits until s looks up every id (another instance's dumps).
func waitVisible(t *testing.T, s *Store, ids []engine.BlockID) {
	t.Helper()
	for range 2000 {
		if h, _ := s.Lookup(ids); all(h) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("blocks never became visible")
}

// TestMetricsWorkerID: every series of a store carries worker_id with UCM's meaning: the
// device's rank for a worker, the engine id (unique_id) for a store without a device, and
// "scheduler" when there is neither.
func TestMetricsWorkerID(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		text, want string
	}{
		{workerJSON(dir, 3, ""), "3"},
		{workerJSON(dir, -1, ""), "e0"},
		{fmt.Sprintf(`{"storage_backends": [%q], "unique_id": "engine-7", "block_size": 131072}`, dir), "engine-7"},
		{fmt.Sprintf(`{"storage_backends": [%q], "block_size": 131072}`, dir), "scheduler"},
	} {
		s := openStore(t, c.text)
		if _, err := s.Lookup(randomIDs(2)); err != nil {
			t.Fatal(err)
		}
		fams := gather(t, s.Gatherer())
		for _, name := range []string{"ucm:interval_lookup_hit_rates", "ucm_lookups_total", "ucm_blocks", "ucm_load_latency_seconds"} {
			if got := labelValues(fams, name, "worker_id"); len(got) != 1 || !got[c.want] {
				t.Errorf("%s: %s has worker_id %v, want %q", c.text, name, got, c.want)
			}
		}
	}
}

// TestMetricsPortRule: a store without a device serves on metrics_port (with or without a
// transfer shape), a worker on metrics_port + 1 + device_id; a port held by another process
// refuses the store with ErrMetricsAddrInUse naming the address and how it was derived, and
// leaves nothing open.
func TestMetricsPortRule(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		text string
		port int
	}{
		{workerJSON(dir, -1, `, "metrics_port": 9000`), 9000},
		{workerJSON(dir, 0, `, "metrics_port": 9000`), 9001},
		{workerJSON(dir, 5, `, "metrics_port": 9000`), 9006},
		{fmt.Sprintf(`{"storage_backends": [%q], "tensor_size": 4096, "shard_size": 4096, "metrics_port": 9000}`, dir), 9000},
		{fmt.Sprintf(`{"storage_backends": [%q], "block_size": 4096, "metrics_port": 9000}`, dir), 9000},
	} {
		cfg, err := ParseStoreConfig(c.text, noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("127.0.0.1:%d", c.port); cfg.MetricsListen != want {
			t.Errorf("%s: listens on %q, want %q", c.text, cfg.MetricsListen, want)
		}
	}
	port := freePorts(t, 2)
	held, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+1))
	if err != nil {
		t.Fatal(err)
	}
	text := workerJSON(dir, 0, fmt.Sprintf(`, "metrics_port": %d`, port))
	cfg, err := ParseStoreConfig(text, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(cfg)
	held.Close()
	if !errors.Is(err, ErrMetricsAddrInUse) || !errors.Is(err, syscall.EADDRINUSE) ||
		!strings.Contains(err.Error(), held.Addr().String()) || !strings.Contains(err.Error(), "device_id 0") {
		t.Fatalf("open with the metrics port held: %v", err)
	}
	s := openStore(t, text) // the refused open left no instance lock behind
	if s.Config().Instance != cfg.Instance {
		t.Fatalf("reopened as %q, want %q", s.Config().Instance, cfg.Instance)
	}
}
