package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/lab/eval"
)

// evalPrefetchOptions are the flags of ucm-lab eval prefetch.
type evalPrefetchOptions struct {
	heldOutOptions
	dir                  string
	prefill, blockSize   int
	init, local, workers int
	budget, cacheFactor  float64
	eviction             string
	runs                 []string
	directIO             bool
}

func newEvalPrefetchCmd(stdout, stderr io.Writer) *cobra.Command {
	o := evalPrefetchOptions{heldOutOptions: heldOutOptions{windows: 8, context: 1024}, prefill: 768, blockSize: 16, init: 1, local: 2, workers: 4, budget: 0.3,
		cacheFactor: 2, eviction: "lru", runs: []string{"GSA@0", "GSA@1", "GSA@2", "GSA@3", "ESA+lag@0", "ESA+lag@1"}}
	cmd := &cobra.Command{
		Use:   "prefetch",
		Short: "Measure how much of the selected blocks' load time the prefetch engine hides",
		Long: `prefetch stores each window's prefill blocks and their sidecars in a real engine
(a temporary directory, in --dir when given, removed at the end), then decodes the rest of the
window token by token, teacher-forced, with a method (--runs method@prefetch_ahead: GSA, or
ESA+lag, ESA with its one-step retrieval lag) that loads every attended block's shard through
its prefetch engine
(engine LoadShard) into a cache of --cache-factor times the shards one step attends. A step
waits for the shards not resident (the stall); prefetch_ahead 0 predicts nothing (every miss is
loaded on demand) and is the reference: "hidden" is 1 − stall / stall at prefetch_ahead 0. The
loaded bytes are checked against the model's own cache at every layer of every step.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEvalPrefetch(cmd.Context(), o, stdout, stderr)
		},
	}
	f := cmd.Flags()
	o.register(f, "windows of held-out text", "tokens per window")
	f.StringVar(&o.dir, "dir", "", "where the stores' temporary directory is created (default: the system's)")
	f.IntVar(&o.prefill, "prefill", o.prefill, "tokens of each window stored before decoding; the rest are decoded")
	f.IntVar(&o.blockSize, "block-tokens", o.blockSize, "tokens per KV block")
	f.Float64Var(&o.budget, "budget", o.budget, "fraction of the context's blocks attended, windows included")
	f.IntVar(&o.init, "init", o.init, "leading blocks kept")
	f.IntVar(&o.local, "local", o.local, "trailing blocks kept (the current block included)")
	f.IntVar(&o.workers, "workers", o.workers, "prefetch_workers")
	f.Float64Var(&o.cacheFactor, "cache-factor", o.cacheFactor, "prefetch_cache_size in shards attended per step")
	f.StringVar(&o.eviction, "eviction", o.eviction, "eviction_policy: lru, score or hybrid")
	f.StringSliceVar(&o.runs, "runs", o.runs, "method@prefetch_ahead configurations")
	f.BoolVar(&o.directIO, "direct-io", false, "open the stores with O_DIRECT, so that every load reads the device (no page cache)")
	return cmd
}

func runEvalPrefetch(ctx context.Context, o evalPrefetchOptions, stdout, stderr io.Writer) error {
	m, man, err := o.loadModel()
	if err != nil {
		return err
	}
	switch {
	case o.blockSize < 1 || o.blockSize > 1024:
		return cliutil.UsageErr("--block-tokens %d: want [1, 1024]", o.blockSize)
	case o.prefill < o.blockSize || o.prefill > o.context-1:
		return cliutil.UsageErr("--prefill %d: want [block tokens, %d]", o.prefill, o.context-1)
	case !(o.budget > 0 && o.budget <= 1) || !(o.cacheFactor > 0):
		return cliutil.UsageErr("--budget %v, --cache-factor %v: want a fraction in (0, 1] and a positive factor", o.budget, o.cacheFactor)
	}
	runs := make([]eval.PrefetchRun, len(o.runs))
	for i, s := range o.runs {
		if runs[i], err = eval.ParsePrefetchRun(s); err != nil {
			return cliutil.UsageErr("--runs: %v", err)
		}
	}
	windows, _, err := o.heldOutWindows(o.context+1, o.windows)
	if err != nil {
		return err
	}
	start := time.Now()
	var engineOpts func(*engine.Options)
	if o.directIO {
		engineOpts = func(eo *engine.Options) { eo.DirectIO = devio.DirectOn }
	}
	res, err := eval.RunPrefetch(ctx, eval.PrefetchOptions{Model: m, Windows: windows, Prefill: o.prefill, BlockSize: o.blockSize,
		Budget: o.budget, Init: o.init, Local: o.local, Runs: runs, Workers: o.workers, Eviction: o.eviction, CacheFactor: o.cacheFactor, Dir: o.dir,
		EngineOptions: engineOpts})
	if err != nil {
		return err
	}
	if o.asJSON {
		return writeJSON(stdout, map[string]any{"model": modelName(man), "windows": o.windows, "context": o.context,
			"prefill": o.prefill, "block_tokens": o.blockSize, "budget": o.budget, "results": res})
	}
	fmt.Fprintf(stdout, "model %s; %d windows of %d tokens, %d stored, the rest decoded; blocks of %d; budget %.0f%%; eviction %s; direct I/O %v; %s\n",
		modelName(man), o.windows, o.context, o.prefill, o.blockSize, 100*o.budget, o.eviction, o.directIO, time.Since(start).Round(time.Second))
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tahead\tcache\tsteps\tshards\thits\tin flight\tmisses\tprefetched\tstall µs/step\tstep µs\thidden\t")
	for _, r := range res {
		hidden := "-"
		if r.Hidden != nil {
			hidden = fmt.Sprintf("%.0f%%", 100**r.Hidden)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%.0f\t%s\t\n", r.Method, r.Ahead, r.Cache, r.Steps, r.Shards, r.Hits,
			r.InFlight, r.Misses, r.Prefetched, r.StallMicros, r.StepMicros, hidden)
	}
	return tw.Flush()
}
