package eval

import (
	"context"
	"errors"
	"testing"

	"github.com/ucm-go/ucm/sparse"
)

// TestRunPrefetch: decoding through a real engine, every attended block's shard is loaded and
// equals the model's own cache (RunPrefetch checks it at every layer of every step); without
// prediction every load is on demand; with ESA's lag the next step's blocks are prefetched, so
// fewer are loaded on demand.
func TestRunPrefetch(t *testing.T) {
	m := loadModel(t)
	n, prefill := 260, 200
	if testing.Short() || raceEnabled {
		n, prefill = 200, 160
	}
	runs := []PrefetchRun{{sparse.NameGSA, 0}, {sparse.NameGSA, 2}, {"ESA+lag", 0}, {"ESA+lag", 1}}
	res, err := RunPrefetch(context.Background(), PrefetchOptions{Model: m, Windows: [][]byte{testWindow(t, n)}, Prefill: prefill,
		BlockSize: 16, Budget: 0.3, Runs: runs, CacheFactor: 1.5, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		t.Logf("%+v", r)
		if r.Steps != n-1-prefill || r.Failed != 0 || r.Hits+r.InFlight+r.Misses != r.Shards || r.Shards == 0 {
			t.Fatalf("%+v", r)
		}
		if runs[i].Ahead == 0 && (r.Prefetched != 0 || r.InFlight != 0 || r.Hidden == nil || *r.Hidden != 0) {
			t.Fatalf("no prediction, yet prefetches: %+v", r)
		}
	}
	if !(res[3].Misses < res[2].Misses) || res[3].Prefetched == 0 {
		t.Fatalf("ESA+lag: %d demand loads with prefetch, %d without", res[3].Misses, res[2].Misses)
	}
	if _, err := ParsePrefetchRun("GSA"); !errors.Is(err, sparse.ErrInvalid) {
		t.Fatal(err)
	}
	if r, err := ParsePrefetchRun("esa+lag@1"); err != nil || r.Method != "ESA+lag" || r.Ahead != 1 {
		t.Fatalf("%+v %v", r, err)
	}
}
