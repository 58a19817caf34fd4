package engine

import (
	"github.com/prometheus/client_golang/prometheus"
)

// latencyBuckets are UCM's I/O latency buckets (seconds), extended down for memory-speed hits.
var latencyBuckets = []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1}

// metrics holds the engine's Prometheus instruments. Counters and gauges are read from Stats at
// scrape time (one source of truth); latencies are histograms observed per task.
type metrics struct {
	dumpLatency prometheus.Histogram
	loadLatency prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{
		dumpLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ucm_dump_latency_seconds",
			Help: "Time from Dump/DumpShard/Commit to the task's completion.", Buckets: latencyBuckets}),
		loadLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ucm_load_latency_seconds",
			Help: "Time from Load/LoadShard to the task's completion.", Buckets: latencyBuckets}),
	}
}

type metricDesc struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(*Stats) float64
}

func counterDesc(name, help string, f func(*Stats) int64) metricDesc {
	return metricDesc{prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, func(s *Stats) float64 { return float64(f(s)) }}
}

func gaugeDesc(name, help string, f func(*Stats) float64) metricDesc {
	return metricDesc{prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, f}
}

var statMetrics = []metricDesc{
	gaugeDesc("ucm_blocks", "Blocks stored.", func(s *Stats) float64 { return float64(s.Blocks) }),
	gaugeDesc("ucm_live_bytes", "On-disk bytes of stored records (exact).", func(s *Stats) float64 { return float64(s.LiveBytes) }),
	gaugeDesc("ucm_file_bytes", "Bytes of all segment files (exact).", func(s *Stats) float64 { return float64(s.FileBytes) }),
	gaugeDesc("ucm_segments", "Segment files.", func(s *Stats) float64 { return float64(s.Segments) }),
	gaugeDesc("ucm_memory_usage_bytes", "Memory held by partly dumped blocks.", func(s *Stats) float64 { return float64(s.StagingBytes) }),
	gaugeDesc("ucm_staging_peak_bytes", "Highest memory held by partly dumped blocks since Open.", func(s *Stats) float64 { return float64(s.StagingPeakBytes) }),
	gaugeDesc("ucm_kv_cache_hit_rate", "Lookup hits / ids looked up since Open.", func(s *Stats) float64 {
		if s.Lookups == 0 {
			return 0
		}
		return float64(s.LookupHits) / float64(s.Lookups)
	}),
	counterDesc("ucm_dumped_blocks_total", "Blocks written to the log.", func(s *Stats) int64 { return s.DumpedBlocks }),
	counterDesc("ucm_dumped_bytes_total", "Block bytes written to the log.", func(s *Stats) int64 { return s.DumpedBytes }),
	counterDesc("ucm_dump_syncs_total", "fdatasyncs of the dump writer's segments (dumped bytes / syncs: what one flush covers).", func(s *Stats) int64 { return s.DumpSyncs }),
	counterDesc("ucm_deduped_dumps_total", "Dumps of blocks already stored or in flight.", func(s *Stats) int64 { return s.DedupedDumps }),
	counterDesc("ucm_failed_blocks_total", "Layer-wise blocks failed by a bad shard.", func(s *Stats) int64 { return s.FailedBlocks }),
	counterDesc("ucm_loaded_blocks_total", "Whole blocks loaded and verified.", func(s *Stats) int64 { return s.LoadedBlocks }),
	counterDesc("ucm_loaded_shards_total", "Single shards loaded and verified.", func(s *Stats) int64 { return s.LoadedShards }),
	counterDesc("ucm_loaded_bytes_total", "Bytes loaded and verified.", func(s *Stats) int64 { return s.LoadedBytes }),
	counterDesc("ucm_load_misses_total", "Blocks a load did not find.", func(s *Stats) int64 { return s.LoadMisses }),
	counterDesc("ucm_corrupt_reads_total", "Loads that found bytes failing a check (served as misses, dropped from the index).", func(s *Stats) int64 { return s.CorruptReads }),
	counterDesc("ucm_caller_buffer_changed_total", "Block loads whose bytes the caller changed in its buffer during the load (the stored block verified and was kept).", func(s *Stats) int64 { return s.CallerBufferChanged }),
	counterDesc("ucm_missing_segment_reads_total", "Loads whose segment file was gone.", func(s *Stats) int64 { return s.MissingSegmentReads }),
	counterDesc("ucm_read_errors_total", "Loads failed by the file system.", func(s *Stats) int64 { return s.ReadErrors }),
	counterDesc("ucm_staging_expired_total", "Partly dumped blocks discarded after the task timeout.", func(s *Stats) int64 { return s.StagingExpired }),
	counterDesc("ucm_lookups_total", "Block ids looked up.", func(s *Stats) int64 { return s.Lookups }),
	counterDesc("ucm_memory_hits_total", "Loads served from the memory tier without touching disk.", func(s *Stats) int64 { return s.MemoryHits }),
	counterDesc("ucm_evicted_blocks_total", "Blocks evicted from a disk tier (demoted or dropped).", func(s *Stats) int64 { return s.EvictedBlocks }),
	counterDesc("ucm_segments_retired_total", "Segment files deleted by reclamation.", func(s *Stats) int64 { return s.SegmentsRetired }),
	counterDesc("ucm_promotions_total", "Blocks moved up to the first disk tier.", func(s *Stats) int64 { return s.Promotions }),
}

// Per-tier gauges, labelled by tier name.
var (
	tierUsedDesc     = prometheus.NewDesc("ucm_tier_used_bytes", "Bytes accounted to the tier (segment files; active ones at their reservation).", []string{"tier"}, nil)
	tierCapacityDesc = prometheus.NewDesc("ucm_tier_capacity_bytes", "The tier's capacity (0: unlimited).", []string{"tier"}, nil)
	tierLiveDesc     = prometheus.NewDesc("ucm_tier_live_bytes", "Bytes of the records the index points at in the tier.", []string{"tier"}, nil)
	tierBlocksDesc   = prometheus.NewDesc("ucm_tier_blocks", "Blocks stored in the tier.", []string{"tier"}, nil)
)

// Collector returns a Prometheus collector for the engine's metrics (UCM's names where they
// exist: ucm_load_latency_seconds, ucm_dump_latency_seconds, ucm_kv_cache_hit_rate,
// ucm_memory_usage_bytes; plus the engine's internals). Register it with your registry;
// values are read from Stats at scrape time.
func (e *Engine) Collector() prometheus.Collector { return (*engineCollector)(e) }

type engineCollector Engine

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	e := (*Engine)(c)
	for _, m := range statMetrics {
		ch <- m.desc
	}
	for _, d := range []*prometheus.Desc{tierUsedDesc, tierCapacityDesc, tierLiveDesc, tierBlocksDesc} {
		ch <- d
	}
	e.metrics.dumpLatency.Describe(ch)
	e.metrics.loadLatency.Describe(ch)
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	e := (*Engine)(c)
	st := e.Stats()
	for _, m := range statMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(&st))
	}
	for _, t := range e.TierStats() {
		ch <- prometheus.MustNewConstMetric(tierUsedDesc, prometheus.GaugeValue, float64(t.Used), t.Name)
		ch <- prometheus.MustNewConstMetric(tierCapacityDesc, prometheus.GaugeValue, float64(t.Capacity), t.Name)
		ch <- prometheus.MustNewConstMetric(tierLiveDesc, prometheus.GaugeValue, float64(t.LiveBytes), t.Name)
		ch <- prometheus.MustNewConstMetric(tierBlocksDesc, prometheus.GaugeValue, float64(t.Blocks), t.Name)
	}
	e.metrics.dumpLatency.Collect(ch)
	e.metrics.loadLatency.Collect(ch)
}
