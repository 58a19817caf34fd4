package eval

import (
	"errors"
	"testing"

	"github.com/ucm-go/ucm/sparse"
)

// TestSelectLatency: at a small shape, every step of a 30 % budget over 64 blocks attends
// ⌊64·0.3⌋ = 19 blocks per KV head, shared or per KV head, and the CPU times are ordered
// (median ≤ p90); a method that selects no blocks and a bad shape are refused.
func TestSelectLatency(t *testing.T) {
	o := LatencyOptions{Blocks: 64, BlockTokens: 16, QHeads: 8, KVHeads: 4, HeadDim: 32, Steps: 6, Init: 1, Local: 2}
	for _, name := range []string{"ESA+softmax", "ESA+softmax+kv", "ESA+int8+softmax+kv", "Quest+kv", "KVStarMultiStep+retrieval_stride=1"} {
		r, err := SelectLatency(name, 0.3, o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Attended != 19.0/64 || r.Steps != 6 || r.Blocks != 64 || r.KVHeads != 4 {
			t.Errorf("%s: %+v: want 19/64 attended over 6 steps", name, r)
		}
		if !(r.CPUMedianMicros >= 0 && r.CPUMedianMicros <= r.CPUP90Micros) {
			t.Errorf("%s: median %v, p90 %v", name, r.CPUMedianMicros, r.CPUP90Micros)
		}
	}
	if _, err := SelectLatency("Blend", 0.3, o); !errors.Is(err, sparse.ErrInvalid) {
		t.Errorf("Blend: %v, want ErrInvalid", err)
	}
	bad := o
	bad.QHeads = 6
	if _, err := SelectLatency("ESA", 0.3, bad); !errors.Is(err, sparse.ErrInvalid) {
		t.Errorf("6 query heads on 4 KV heads: %v, want ErrInvalid", err)
	}
}

// BenchmarkSelectLatency reports SelectLatency's per-step process CPU time (median, p90) of
// the configurations docs/sparse.md compares, at DefaultLatency's shape and a 30 % budget, b.N
// steps each (the setup, writing the sidecars, is in the benchmark's own time: read the
// metrics). For a profile of the step (whose metrics are then tick-grained: SelectLatency):
//
//	GOMAXPROCS=1 go test -run '^$' -bench SelectLatency -benchtime 2000x -cpuprofile cpu.prof ./lab/eval/
func BenchmarkSelectLatency(b *testing.B) {
	for _, name := range []string{"ESA+softmax", "ESA+softmax+kv", "ESA+int8+softmax+kv"} {
		b.Run(name, func(b *testing.B) {
			o := DefaultLatency
			o.Steps = b.N
			r, err := SelectLatency(name, 0.3, o)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(r.CPUMedianMicros, "cpu-µs-median")
			b.ReportMetric(r.CPUP90Micros, "cpu-µs-p90")
			b.ReportMetric(r.Attended, "attended")
		})
	}
}
