package connector

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/ucm-go/ucm/engine"
	"gopkg.in/yaml.v3"
)

// UCM's connector metrics (ucm/integration/vllm/ucm_connector.py, examples/metrics/
// metrics_configs.yaml): histograms with the ucm: prefix and a model_name label, which UCM's
// Grafana dashboard charts as rate(ucm:<name>_sum{model_name=...}[...]). A store records one
// observation of each per transfer task (a task is the store's view of one step's batch:
// requests_num counts 1), and interval_lookup_hit_rates per lookup call. Durations are in ms,
// speeds in UCM's GB/s (bytes / 2^20 / ms, as UCM computes it).
var ucmHistograms = []histogramSpec{
	{"load_requests_num", "Number of requests loaded from ucm", []float64{1, 5, 10, 20, 50, 100, 200, 500, 1000}},
	{"load_blocks_num", "Number of blocks loaded from ucm", blockBuckets},
	{"load_duration", "Time to load from ucm (ms)", blockBuckets},
	{"load_speed", "Speed of loading from ucm (GB/s)", speedBuckets},
	{"save_requests_num", "Number of requests saved to ucm", []float64{1, 5, 10, 20, 50, 100, 200, 500, 1000}},
	{"save_blocks_num", "Number of blocks saved to ucm", blockBuckets},
	{"save_duration", "Time to save to ucm (ms)", blockBuckets},
	{"save_speed", "Speed of saving to ucm (GB/s)", speedBuckets},
	{"interval_lookup_hit_rates", "Hit rates of ucm lookup requests", []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}},
}

var (
	blockBuckets = []float64{0, 50, 100, 150, 200, 250, 300, 350, 400, 550, 600, 750, 800, 850, 900, 950, 1000}
	speedBuckets = []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
		31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 50, 60, 70, 80, 90, 100}
)

type histogramSpec struct {
	name, help string
	buckets    []float64
}

// ucmMetricsFile is UCM's metrics configuration (metrics_config_path): its prefix and histogram
// buckets are honoured; the other keys (log_interval, multiproc_dir, histogram_max_length,
// counter, gauge) belong to UCM's Python exporter and are accepted.
type ucmMetricsFile struct {
	MetricPrefix *string `yaml:"metric_prefix"`
	Histogram    []struct {
		Name          string    `yaml:"name"`
		Documentation string    `yaml:"documentation"`
		Buckets       []float64 `yaml:"buckets"`
	} `yaml:"histogram"`
}

// histogramSpecs returns the prefix and histograms a metrics file selects (UCM's defaults
// without one): the names it lists that the store records, with its buckets.
func histogramSpecs(path string) (string, []histogramSpec, error) {
	if path == "" {
		return "ucm:", ucmHistograms, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, fmt.Errorf("metrics_config_path %s: %w: %w", path, err, engine.ErrInvalidArgument)
	}
	var f ucmMetricsFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return "", nil, fmt.Errorf("metrics_config_path %s: %v: %w", path, err, engine.ErrInvalidArgument)
	}
	prefix := "ucm:"
	if f.MetricPrefix != nil {
		prefix = *f.MetricPrefix
	}
	known := map[string]histogramSpec{}
	for _, h := range ucmHistograms {
		known[h.name] = h
	}
	var out []histogramSpec
	for _, h := range f.Histogram {
		spec, ok := known[h.Name]
		if !ok {
			return "", nil, fmt.Errorf("metrics_config_path %s: histogram %q is not one UCM's connector records (%v): %w", path, h.Name, names(ucmHistograms), engine.ErrInvalidArgument)
		}
		if len(h.Buckets) > 0 {
			spec.buckets = h.Buckets
		}
		if h.Documentation != "" {
			spec.help = h.Documentation
		}
		out = append(out, spec)
	}
	return prefix, out, nil
}

func names(specs []histogramSpec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.name
	}
	return out
}

// The process's metrics. Every store has its own registry (its ucm: histograms and its
// engine's families, every series labelled with the store's instance and worker_id), so a
// store's numbers are counted once, by it. An endpoint (one per listen address in the process)
// serves the registries of the stores bound to it and the process's Go and process
// collectors; two endpoints of one process serve different stores.
var metricsState struct {
	sync.Mutex
	process *prometheus.Registry       // Go runtime and process collectors
	servers map[string]*metricsServer  // by listen address
	stores  map[*storeMetrics]struct{} // every open store's metrics
	labels  map[string]struct{}        // store label values in use
}

// metricsServer is one endpoint and the stores it serves.
type metricsServer struct {
	srv    *http.Server
	stores []*storeMetrics
}

// ErrMetricsAddrInUse: the address a store's metrics endpoint derives from its configuration
// is held by another process (or by something else in this one than a UCM-Go endpoint). The
// store is not opened: a metrics endpoint silently moved elsewhere is one no scrape
// configuration names. The error also wraps the listen error (syscall.EADDRINUSE).
var ErrMetricsAddrInUse = errors.New("ucmgo: metrics address already in use")

func initMetricsLocked() {
	if metricsState.process != nil {
		return
	}
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metricsState.process = r
	metricsState.servers = map[string]*metricsServer{}
	metricsState.stores = map[*storeMetrics]struct{}{}
	metricsState.labels = map[string]struct{}{}
}

// Gatherer returns the metrics of every store open in the process and the process's Go and
// process collectors (what an endpoint serving all of them would serve), for embedders that
// export metrics their own way. Store.Gatherer is one store's.
func Gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		metricsState.Lock()
		initMetricsLocked()
		gs := prometheus.Gatherers{metricsState.process}
		for m := range metricsState.stores {
			gs = append(gs, m.registry)
		}
		metricsState.Unlock()
		return gs.Gather()
	})
}

// endpointGatherer gathers what one endpoint serves: its stores' registries at the time of the
// scrape and the process collectors.
type endpointGatherer struct{ srv *metricsServer }

func (g endpointGatherer) Gather() ([]*dto.MetricFamily, error) {
	metricsState.Lock()
	gs := prometheus.Gatherers{metricsState.process}
	for _, m := range g.srv.stores {
		gs = append(gs, m.registry)
	}
	metricsState.Unlock()
	return gs.Gather()
}

// storeMetrics records one store's observations into the store's own registry.
type storeMetrics struct {
	registry *prometheus.Registry
	hist     map[string]prometheus.Observer // by UCM name (without prefix)
	label    string                         // the store label's value
	listen   string
}

// openMetrics makes a store's registry and binds it to the endpoint its configuration asks
// for, starting the endpoint unless this process already serves that address.
func openMetrics(cfg *StoreConfig, eng *engine.Engine) (*storeMetrics, error) {
	prefix, specs, err := histogramSpecs(cfg.Config.MetricsConfigPath)
	if err != nil {
		return nil, err
	}
	metricsState.Lock()
	defer metricsState.Unlock()
	initMetricsLocked()
	m := &storeMetrics{registry: prometheus.NewRegistry(), hist: map[string]prometheus.Observer{}}
	// The store label is the instance name; stores of one process on different
	// storage_backends may share one, and their series must still differ.
	m.label = cfg.Instance
	for k := 2; ; k++ {
		if _, taken := metricsState.labels[m.label]; !taken {
			break
		}
		m.label = fmt.Sprintf("%s-%d", cfg.Instance, k)
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"store": m.label, "worker_id": cfg.WorkerID}, m.registry)
	for _, spec := range specs {
		full := prefix + spec.name
		vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: full, Help: spec.help, Buckets: spec.buckets}, []string{"model_name"})
		if err := reg.Register(vec); err != nil {
			return nil, fmt.Errorf("metrics: %s: %v: %w", full, err, engine.ErrInvalidArgument)
		}
		m.hist[spec.name] = vec.WithLabelValues(cfg.ModelName)
	}
	if err := reg.Register(eng.Collector()); err != nil {
		return nil, fmt.Errorf("metrics: engine families of %s: %v: %w", cfg.Instance, err, engine.ErrInvalidArgument)
	}
	if cfg.MetricsListen != "" {
		srv, ok := metricsState.servers[cfg.MetricsListen]
		if !ok {
			ln, err := net.Listen("tcp", cfg.MetricsListen)
			if err != nil {
				if errors.Is(err, syscall.EADDRINUSE) {
					err = fmt.Errorf("%w: %w", ErrMetricsAddrInUse, err)
				}
				return nil, fmt.Errorf("metrics endpoint %s of store %s (%s; set another metrics_port, or turn the endpoint off): %w",
					cfg.MetricsListen, cfg.Instance, cfg.MetricsFrom, err)
			}
			srv = &metricsServer{}
			mux := http.NewServeMux()
			mux.Handle("/metrics", promhttp.HandlerFor(endpointGatherer{srv}, promhttp.HandlerOpts{}))
			srv.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = srv.srv.Serve(ln) }()
			metricsState.servers[cfg.MetricsListen] = srv
		}
		srv.stores = append(srv.stores, m)
		m.listen = cfg.MetricsListen
	}
	metricsState.labels[m.label] = struct{}{}
	metricsState.stores[m] = struct{}{}
	return m, nil
}

// close unbinds the store from its endpoint, stopping the endpoint when it was its last store.
func (m *storeMetrics) close() {
	metricsState.Lock()
	defer metricsState.Unlock()
	delete(metricsState.stores, m)
	delete(metricsState.labels, m.label)
	if m.listen == "" {
		return
	}
	if srv := metricsState.servers[m.listen]; srv != nil {
		srv.stores = slices.DeleteFunc(srv.stores, func(o *storeMetrics) bool { return o == m })
		if len(srv.stores) == 0 {
			_ = srv.srv.Close()
			delete(metricsState.servers, m.listen)
		}
	}
}

func (m *storeMetrics) observe(name string, v float64) {
	if o, ok := m.hist[name]; ok {
		o.Observe(v)
	}
}

// lookup records a lookup call's hit rate (hits of n ids).
func (m *storeMetrics) lookup(hits, n int) {
	if n > 0 {
		m.observe("interval_lookup_hit_rates", float64(hits)/float64(n))
	}
}

// transfer records a finished task: UCM records a step's batch, the store a task; failed tasks
// are not speeds.
func (m *storeMetrics) transfer(load bool, blocks int, bytes int64, d time.Duration, ok bool) {
	if !ok || blocks == 0 {
		return
	}
	pre := "save_"
	if load {
		pre = "load_"
	}
	ms := float64(d) / float64(time.Millisecond)
	m.observe(pre+"requests_num", 1)
	m.observe(pre+"blocks_num", float64(blocks))
	m.observe(pre+"duration", ms)
	if ms > 0 {
		m.observe(pre+"speed", float64(bytes)/(1<<20)/ms)
	}
}

// errMetricsOff is returned by MetricsAddr for a store without an endpoint.
var errMetricsOff = errors.New("ucmgo: metrics endpoint off")

// Gatherer returns the store's own metrics: its ucm: histograms and its engine's families,
// labelled store and worker_id (what its endpoint serves of it).
func (s *Store) Gatherer() prometheus.Gatherer { return s.metrics.registry }

// MetricsAddr returns the address the store's metrics endpoint listens on.
func (s *Store) MetricsAddr() (string, error) {
	if s.metrics.listen == "" {
		return "", errMetricsOff
	}
	return s.metrics.listen, nil
}
