package connector

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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

// The process's metrics: one registry (UCM's histograms, each store's engine families labelled
// with its instance, Go and process collectors) and at most one endpoint per address.
var metricsState struct {
	sync.Mutex
	registry   *prometheus.Registry
	histograms map[string]*prometheus.HistogramVec // by full name
	servers    map[string]*metricsServer           // by listen address
}

type metricsServer struct {
	srv   *http.Server
	users int
}

// Gatherer returns the process's metrics registry: what the endpoint serves, for embedders that
// export metrics their own way.
func Gatherer() prometheus.Gatherer {
	metricsState.Lock()
	defer metricsState.Unlock()
	initRegistryLocked()
	return metricsState.registry
}

func initRegistryLocked() {
	if metricsState.registry != nil {
		return
	}
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metricsState.registry = r
	metricsState.histograms = map[string]*prometheus.HistogramVec{}
	metricsState.servers = map[string]*metricsServer{}
}

// storeMetrics records one store's observations.
type storeMetrics struct {
	model  string
	hist   map[string]prometheus.Observer // by UCM name (without prefix)
	engine prometheus.Collector
	listen string
}

// openMetrics registers a store's metrics, and starts the endpoint its configuration asks for
// (an address already served by this process is shared).
func openMetrics(cfg *StoreConfig, eng *engine.Engine) (*storeMetrics, error) {
	prefix, specs, err := histogramSpecs(cfg.Config.MetricsConfigPath)
	if err != nil {
		return nil, err
	}
	metricsState.Lock()
	defer metricsState.Unlock()
	initRegistryLocked()
	m := &storeMetrics{model: cfg.ModelName, hist: map[string]prometheus.Observer{}}
	for _, spec := range specs {
		full := prefix + spec.name
		vec, ok := metricsState.histograms[full]
		if !ok {
			vec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: full, Help: spec.help, Buckets: spec.buckets}, []string{"model_name"})
			if err := metricsState.registry.Register(vec); err != nil {
				return nil, fmt.Errorf("metrics: %s: %v: %w", full, err, engine.ErrInvalidArgument)
			}
			metricsState.histograms[full] = vec
		}
		m.hist[spec.name] = vec.WithLabelValues(cfg.ModelName)
	}
	m.engine = eng.Collector()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"store": cfg.Instance}, metricsState.registry)
	if err := wrapped.Register(m.engine); err != nil {
		return nil, fmt.Errorf("metrics: engine families of %s: %v: %w", cfg.Instance, err, engine.ErrInvalidArgument)
	}
	m.engine = wrappedCollector{m.engine, wrapped}
	if cfg.MetricsListen != "" {
		srv, ok := metricsState.servers[cfg.MetricsListen]
		if !ok {
			ln, err := net.Listen("tcp", cfg.MetricsListen)
			if err != nil {
				metricsState.registry.Unregister(m.engine)
				return nil, fmt.Errorf("metrics endpoint %s: %w", cfg.MetricsListen, err)
			}
			mux := http.NewServeMux()
			mux.Handle("/metrics", promhttp.HandlerFor(metricsState.registry, promhttp.HandlerOpts{}))
			srv = &metricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
			go func() { _ = srv.srv.Serve(ln) }()
			metricsState.servers[cfg.MetricsListen] = srv
		}
		srv.users++
		m.listen = cfg.MetricsListen
	}
	return m, nil
}

// wrappedCollector remembers the registerer a collector went through, to unregister it.
type wrappedCollector struct {
	prometheus.Collector
	reg prometheus.Registerer
}

func (m *storeMetrics) close() {
	metricsState.Lock()
	defer metricsState.Unlock()
	if w, ok := m.engine.(wrappedCollector); ok {
		w.reg.Unregister(w.Collector)
	}
	if m.listen == "" {
		return
	}
	if srv := metricsState.servers[m.listen]; srv != nil {
		if srv.users--; srv.users == 0 {
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

// MetricsAddr returns the address the store's metrics endpoint listens on.
func (s *Store) MetricsAddr() (string, error) {
	if s.metrics.listen == "" {
		return "", errMetricsOff
	}
	return s.metrics.listen, nil
}
