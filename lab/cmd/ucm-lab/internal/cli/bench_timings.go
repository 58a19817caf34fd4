package cli

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/wal"
)

// timingCollector gathers the engine's per-flight dump timings and per-batch load timings
// (engine Options.OnFlight, OnLoad) for --timings.
type timingCollector struct {
	mu      sync.Mutex
	flights []wal.FlightTiming
	loads   []engine.LoadTiming
}

func (c *timingCollector) onFlight(ft wal.FlightTiming) {
	c.mu.Lock()
	c.flights = append(c.flights, ft)
	c.mu.Unlock()
}

func (c *timingCollector) onLoad(lt engine.LoadTiming) {
	c.mu.Lock()
	c.loads = append(c.loads, lt)
	c.mu.Unlock()
}

// take returns what was gathered since the last take and starts over.
func (c *timingCollector) take() ([]wal.FlightTiming, []engine.LoadTiming) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, l := c.flights, c.loads
	c.flights, c.loads = nil, nil
	return f, l
}

// spanStats summarises one step's durations, in milliseconds.
type spanStats struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	Max  float64 `json:"max_ms"`
}

func summarize(ds []time.Duration) spanStats {
	if len(ds) == 0 {
		return spanStats{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	return spanStats{Mean: ms(sum / time.Duration(len(ds))), P50: ms(ds[len(ds)/2]), P90: ms(ds[len(ds)*9/10]), Max: ms(ds[len(ds)-1])}
}

// dumpTimings is where a timed dump's flights spent their time (wal.FlightTiming).
type dumpTimings struct {
	Flights          int     `json:"flights"`
	RecordsPerFlight float64 `json:"records_per_flight"`
	MiBPerFlight     float64 `json:"MiB_per_flight"`
	FlightsPerBatch  float64 `json:"flights_per_publish_batch"`
	// Placement: Append to the writes' submission (committer, segment, a free flight slot).
	Placement spanStats `json:"placement"`
	// Device: submission to completion of the writes (devio's tokens and the device).
	Device spanStats `json:"device"`
	// Sync: completion to the fdatasync covering the flight; Publish: completion to the
	// callers' answer (earlier flights, sync, index batch).
	Sync    spanStats `json:"sync"`
	Publish spanStats `json:"publish"`
	// Device queue, sampled every millisecond during the phase (Linux).
	Queue *queueSamples `json:"device_queue,omitempty"`
}

func dumpSummary(fs []wal.FlightTiming) *dumpTimings {
	if len(fs) == 0 {
		return nil
	}
	t := &dumpTimings{Flights: len(fs)}
	var place, dev, sync, pub []time.Duration
	var recs, batch int
	var bytes int64
	for _, f := range fs {
		recs += f.Records
		bytes += f.Bytes
		batch += f.Batch
		place = append(place, f.Issued.Sub(f.Appended))
		dev = append(dev, f.Written.Sub(f.Issued))
		if !f.Synced.IsZero() {
			sync = append(sync, f.Synced.Sub(f.Written))
		}
		pub = append(pub, f.Published.Sub(f.Written))
	}
	n := float64(len(fs))
	t.RecordsPerFlight, t.MiBPerFlight, t.FlightsPerBatch = float64(recs)/n, float64(bytes)/n/(1<<20), float64(batch)/n
	t.Placement, t.Device, t.Sync, t.Publish = summarize(place), summarize(dev), summarize(sync), summarize(pub)
	return t
}

// loadTimings is where a timed load's task batches spent their time (engine.LoadTiming).
type loadTimings struct {
	Batches       int           `json:"batches"`
	ReadsPerBatch float64       `json:"reads_per_batch"`
	KiBPerRead    float64       `json:"KiB_per_read"`
	Start         spanStats     `json:"start"` // task created to its goroutine running
	Plan          spanStats     `json:"plan"`  // index, segment and tier look-ups
	IO            spanStats     `json:"io"`    // devio's tokens and the device
	Check         spanStats     `json:"check"` // checksums and copies
	Queue         *queueSamples `json:"device_queue,omitempty"`
}

func loadSummary(ls []engine.LoadTiming) *loadTimings {
	if len(ls) == 0 {
		return nil
	}
	t := &loadTimings{Batches: len(ls)}
	var start, plan, io, check []time.Duration
	var reads int
	var bytes int64
	for _, l := range ls {
		reads += l.Reads
		bytes += l.Bytes
		if !l.Queued.IsZero() {
			start = append(start, l.Start.Sub(l.Queued))
		}
		plan = append(plan, l.Submitted.Sub(l.Start))
		io = append(io, l.Read.Sub(l.Submitted))
		check = append(check, l.Done.Sub(l.Read))
	}
	t.ReadsPerBatch = float64(reads) / float64(len(ls))
	if reads > 0 {
		t.KiBPerRead = float64(bytes) / float64(reads) / 1024
	}
	t.Start, t.Plan, t.IO, t.Check = summarize(start), summarize(plan), summarize(io), summarize(check)
	return t
}

// queueSamples is the device's queue (requests in flight, the in-flight field of
// /sys/dev/block/…/stat: parseStatInFlight) sampled
// every millisecond during a timed phase.
type queueSamples struct {
	Device  string  `json:"device"`
	Samples int     `json:"samples"`
	Mean    float64 `json:"mean_in_flight"`
	// Below8 is the fraction of samples with fewer than 8 requests in flight (the device
	// starved: fio keeps 58–64 there).
	Below8 float64 `json:"fraction_below_8"`
	Max    int     `json:"max_in_flight"`
}

// queueSampler samples a device's queue until stop is called.
type queueSampler struct {
	stop func() *queueSamples
}

// parseStatInFlight returns the in-flight field (the ninth) of a block device's stat file
// (Documentation/block/stat.rst: requests submitted to the device and not yet completed).
func parseStatInFlight(b []byte) (int, bool) {
	f := strings.Fields(string(b))
	if len(f) < 9 {
		return 0, false
	}
	n, err := strconv.Atoi(f[8])
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// sampleQueue starts sampling the queue of the device holding dir every millisecond (reads and
// writes together: the timed phases do one or the other). It returns nil where the device
// cannot be found.
func sampleQueue(dir string) *queueSampler {
	read, closeFn, name := inflightReader(dir)
	if read == nil {
		return nil
	}
	done := make(chan struct{})
	out := make(chan *queueSamples, 1)
	go func() {
		q := &queueSamples{Device: name}
		var sum, below int
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				closeFn()
				if q.Samples > 0 {
					q.Mean = float64(sum) / float64(q.Samples)
					q.Below8 = float64(below) / float64(q.Samples)
				}
				out <- q
				return
			case <-t.C:
				n, ok := read()
				if !ok {
					continue
				}
				q.Samples++
				sum += n
				if n < 8 {
					below++
				}
				q.Max = max(q.Max, n)
			}
		}
	}()
	return &queueSampler{stop: func() *queueSamples { close(done); return <-out }}
}

// end stops the sampler (nil: none) and returns its samples.
func (s *queueSampler) end() *queueSamples {
	if s == nil {
		return nil
	}
	return s.stop()
}

// printLayerwiseOrder prints one order's rows of a layerwise run.
func printLayerwiseOrder(row func(k, format string, args ...any), r *benchResult, o layerwiseOrder) {
	k := o.Order
	if o.Requests > 0 {
		row(k, "%d requests of %.1f blocks on average (at most %d)", o.Requests, o.MeanRequestBlocks, o.MaxRequestBlocks)
	}
	row(k, "dump %.1f MB/s%s%s%s%s", o.DumpMBps, elapsed(o.dumpTime), cpuText(o.DumpCPUSeconds, r.TotalBytes), ratioText(o.DumpRatio, r.FioWriteMBps, "2 MiB write"),
		durableText(o.DumpDurableRatio, r.FioDurableWriteMBps, r.SyncBytes))
	if o.DumpIO != nil {
		row(k, "dump i/o %s", o.DumpIO)
	}
	row(k, "load %.1f MB/s%s%s%s%s", o.LoadMBps, elapsed(o.loadTime), cpuText(o.LoadCPUSeconds, r.TotalBytes), ratioText(o.LoadRatio, r.FioReadMBps, "2 MiB read"),
		ratioText(o.LoadRandRatio, r.FioRandReadMBps, "randread"))
	if o.LoadIO != nil {
		row(k, "load i/o %s", o.LoadIO)
	}
	row(k, "staging peak %s (%d blocks) of %s", cliutil.HumanBytes(o.StagingPeakBytes), o.StagingPeakBlocks, cliutil.HumanBytes(r.MaxStagingBytes))
	span := func(s spanStats) string {
		return fmt.Sprintf("%.2f/%.2f/%.2f/%.1f", s.Mean, s.P50, s.P90, s.Max)
	}
	queue := func(q *queueSamples) string {
		if q == nil {
			return ""
		}
		return fmt.Sprintf("; %s queue: %.1f in flight on average, below 8 in %.0f%% of %d samples, at most %d",
			q.Device, q.Mean, 100*q.Below8, q.Samples, q.Max)
	}
	if t := o.DumpTimings; t != nil {
		row(k, "dump flights (ms mean/p50/p90/max): %d of %.1f records (%.1f MiB), %.1f per publish batch; placement %s, device %s, sync %s, publish %s%s",
			t.Flights, t.RecordsPerFlight, t.MiBPerFlight, t.FlightsPerBatch, span(t.Placement), span(t.Device), span(t.Sync), span(t.Publish), queue(t.Queue))
	}
	if t := o.LoadTimings; t != nil {
		row(k, "load batches (ms mean/p50/p90/max): %d of %.1f reads of %.0f KiB; start %s, plan %s, io %s, check %s%s",
			t.Batches, t.ReadsPerBatch, t.KiBPerRead, span(t.Start), span(t.Plan), span(t.IO), span(t.Check), queue(t.Queue))
	}
}
