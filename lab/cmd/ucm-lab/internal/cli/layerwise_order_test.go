package cli

import (
	"slices"
	"testing"
)

// tasksOf returns every task of the connector order over reqs, request by request.
func tasksOf(reqs []lwRequest, layers int) []lwTask {
	var out []lwTask
	for _, r := range reqs {
		out = append(out, r.layerTasks(layers)...)
	}
	return out
}

// The connector order covers every block exactly once per layer, each request's layers in
// order 0..L-1 over all of its blocks, with the lengths the generator drew.
func TestConnectorOrderCoversEveryBlockOncePerLayer(t *testing.T) {
	const blocks, layers, maxLen = 1000, 80, 64
	reqs := connectorRequests(blocks, maxLen, uniformLengths(maxLen, 7))
	next := uniformLengths(maxLen, 7)
	for i, r := range reqs {
		want := next()
		if i == len(reqs)-1 {
			want = min(want, blocks-r.first)
		}
		if r.n != want || r.n < 1 || r.n > maxLen {
			t.Fatalf("request %d is %d blocks, want %d (the generator's, within 1..%d)", i, r.n, want, maxLen)
		}
	}
	seen := make([]int, blocks*layers)
	for _, r := range reqs {
		for i, task := range r.layerTasks(layers) {
			if task.layer != i || task.first != r.first || task.n != r.n {
				t.Fatalf("request %+v: task %d is %+v, want layer %d of all its blocks", r, i, task, i)
			}
		}
	}
	for _, task := range tasksOf(reqs, layers) {
		for b := task.first; b < task.first+task.n; b++ {
			seen[b*layers+task.layer]++
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("block %d layer %d dumped %d times, want once", k/layers, k%layers, n)
		}
	}
}

// The same seed gives the same requests; another seed other ones.
func TestConnectorOrderDeterministic(t *testing.T) {
	a := connectorRequests(5000, 64, uniformLengths(64, 1))
	b := connectorRequests(5000, 64, uniformLengths(64, 1))
	c := connectorRequests(5000, 64, uniformLengths(64, 2))
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave different requests")
	}
	if slices.Equal(a, c) {
		t.Fatal("seeds 1 and 2 gave the same requests")
	}
	mean := 5000.0 / float64(len(a))
	if mean < 24 || mean > 41 { // uniform on 1..64: 32.5
		t.Fatalf("mean request length %.1f blocks, want about 32.5", mean)
	}
}

// Trace lengths are the trace's requests' hash-id counts in file order, starting over at the
// end, requests without blocks skipped, each capped at the longest allowed.
func TestConnectorOrderTraceLengths(t *testing.T) {
	trace := []traceRequest{{HashIDs: make([]int64, 3)}, {}, {HashIDs: make([]int64, 100)}, {HashIDs: make([]int64, 5)}}
	next, err := traceLengths(trace)
	if err != nil {
		t.Fatal(err)
	}
	reqs := connectorRequests(150, 64, next)
	var got []int
	for _, r := range reqs {
		got = append(got, r.n)
	}
	if want := []int{3, 64, 5, 3, 64, 5, 3, 3}; !slices.Equal(got, want) {
		t.Fatalf("request lengths %v, want %v", got, want)
	}
	if _, err := traceLengths([]traceRequest{{}}); err == nil {
		t.Fatal("a trace without blocks gave lengths")
	}
}

// The random order loads every (group, shard) pair once, in the same order for one seed.
func TestRandomUnits(t *testing.T) {
	u := randomUnits(50, 32, 3)
	sorted := slices.Clone(u)
	slices.Sort(sorted)
	for i, v := range sorted {
		if int(v) != i {
			t.Fatalf("unit %d missing or repeated", i)
		}
	}
	if !slices.Equal(u, randomUnits(50, 32, 3)) || slices.Equal(u, sorted) {
		t.Fatal("random order not deterministic, or not shuffled")
	}
}

func TestLayerwiseOrders(t *testing.T) {
	for in, want := range map[string][]string{"": {"connector", "random"}, "both": {"connector", "random"},
		"connector": {"connector"}, "random": {"random"}} {
		if got, err := layerwiseOrders(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("--order %q: %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := layerwiseOrders("sequential"); err == nil {
		t.Error("--order sequential accepted")
	}
}
