package cli

import (
	"fmt"
	"math/rand/v2"
)

// The orders in which the layerwise workload dumps and loads shards.
const (
	// orderConnector is UCM's layer-wise vLLM connector's order: the blocks are split into
	// requests of varying length; after layer i of a request's prefill, shard i of all its new
	// blocks is dumped in one task (i = 0..L-1); before layer i of a later prefill, shard i of
	// all its hit blocks is loaded in one task; the loads of every layer are issued before the
	// prefill (start_load_kv) and waited for in layer order (wait_for_layer_load;
	// --layers-in-flight bounds how many are in flight), several requests at a time.
	orderConnector = "connector"
	// orderRandom is the bench's earlier order: groups of --batch blocks dumped shard by shard,
	// then every (group, shard) pair loaded in a random order across groups and shards.
	orderRandom = "random"
	// orderBoth runs the connector order, then the random order, on fresh stores in each round.
	orderBoth = "both"
)

// layerwiseOrders returns the orders an --order value runs, in the order they run.
func layerwiseOrders(order string) ([]string, error) {
	switch order {
	case orderConnector, orderRandom:
		return []string{order}, nil
	case orderBoth, "":
		return []string{orderConnector, orderRandom}, nil
	}
	return nil, fmt.Errorf("--order %q: want connector, random or both", order)
}

// lwRequest is one request of the connector order: the bench's blocks [first, first+n), its
// prompt's blocks in chain order.
type lwRequest struct{ first, n int }

// lwTask is one layer-wise task: shard `layer` of the blocks [first, first+n).
type lwTask struct{ layer, first, n int }

// connectorRequests splits blocks into consecutive requests whose lengths are next()'s values
// in turn, each capped at maxLen, the last one at the blocks that remain. Every block is in
// exactly one request.
func connectorRequests(blocks, maxLen int, next func() int) []lwRequest {
	var reqs []lwRequest
	for first := 0; first < blocks; {
		n := min(max(1, next()), maxLen, blocks-first)
		reqs = append(reqs, lwRequest{first: first, n: n})
		first += n
	}
	return reqs
}

// layerTasks returns the request's tasks in the connector's order: shard 0 of all its blocks,
// then shard 1, and so on to shard layers-1.
func (r lwRequest) layerTasks(layers int) []lwTask {
	tasks := make([]lwTask, layers)
	for i := range tasks {
		tasks[i] = lwTask{layer: i, first: r.first, n: r.n}
	}
	return tasks
}

// uniformLengths returns request lengths drawn uniformly from [1, maxLen] by a generator
// seeded with seed: the same seed gives the same lengths. With maxLen 64 the mean (32.5
// blocks) is close to the Mooncake trace's (30.5 hash ids of 512 tokens per request).
func uniformLengths(maxLen int, seed uint64) func() int {
	r := rand.New(rand.NewPCG(seed, 0x72657173)) // "reqs"
	return func() int { return 1 + r.IntN(maxLen) }
}

// traceLengths returns the trace's request lengths (blocks per request: its hash ids) in file
// order, starting over at the end; requests without blocks are skipped.
func traceLengths(reqs []traceRequest) (func() int, error) {
	var lens []int
	for _, r := range reqs {
		if len(r.HashIDs) > 0 {
			lens = append(lens, len(r.HashIDs))
		}
	}
	if len(lens) == 0 {
		return nil, fmt.Errorf("the trace has no request with blocks")
	}
	k := 0
	return func() int {
		n := lens[k%len(lens)]
		k++
		return n
	}, nil
}

// randomUnits returns every (group, shard) pair of the random order, as g*shards + s, shuffled
// by a generator seeded with seed.
func randomUnits(groups, shards int, seed uint64) []int32 {
	units := make([]int32, groups*shards)
	for i := range units {
		units[i] = int32(i)
	}
	rand.New(rand.NewPCG(seed, 0x6c61796572)).Shuffle(len(units), func(i, j int) { units[i], units[j] = units[j], units[i] })
	return units
}
