package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/lab/eval"
	"github.com/ucm-go/ucm/lab/loop"
	"github.com/ucm-go/ucm/lab/model"
)

// evalSparseOptions are the flags of ucm-lab eval sparse.
type evalSparseOptions struct {
	heldOutOptions
	prefill      int
	init, local  int
	denseLayers  []int
	blockSizes   []int
	budgets      []float64
	methods      []string
	split        string
	fitWindows   int
	layerBudgets []float64
	latency      eval.LatencyOptions
	evictMiB     int
}

func newEvalCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Measure quality on the small model",
	}
	cmd.AddCommand(newEvalSparseCmd(stdout, stderr), newEvalBlendCmd(stdout, stderr), newEvalPrefetchCmd(stdout, stderr))
	return cmd
}

func newEvalSparseCmd(stdout, stderr io.Writer) *cobra.Command {
	o := evalSparseOptions{heldOutOptions: heldOutOptions{windows: 8, context: 1024}, prefill: 768, blockSizes: []int{16, 32},
		budgets: []float64{0.1, 0.2, 0.3}, methods: append(eval.SelectionMethods(), eval.Oracle), init: 1, local: 2, split: "a", fitWindows: 32}
	cmd := &cobra.Command{
		Use:   "sparse",
		Short: "Decode held-out text with each sparse-attention method against full attention",
		Long: `sparse decodes windows of the small model's held-out text (train.py's split of
$(go env GOROOT)/src) token by token, teacher-forced, once with full attention and once per
(method, block size, budget) with the method choosing the blocks each layer attends from the
sidecars of the blocks (computed from the model's own K as a dump would), and prints per run:
the nominal budget and the fraction of (block, layer, KV head) units actually attended over
the whole run (layers left dense and the windows included), the attention-mass recall of the attended blocks, each
layer's attention-output relative error, next-token top-1 agreement with full attention, the
KL divergence and the perplexity change, and the selection time per layer. Each window is
prefilled densely for --prefill tokens; the rest are decode positions. --text measures on
any text file or directory instead of the model's held-out Go files.

--latency-steps N also times each method configuration (the same name, budget and windows)
at a long context's shape, by default 1,024 blocks of 128 tokens × 32 KV heads × 128 dims
(--latency-*), over sidecars the kernels' writer computes from K-shaped data: the process CPU
time per step (median, 90th percentile) and the fraction of that layer's units attended, next
to the quality figures (run with GOMAXPROCS=1 to time one core).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEvalSparse(cmd.Context(), o, stdout, stderr)
		},
	}
	f := cmd.Flags()
	o.register(f, "windows of held-out text", "tokens per window")
	f.IntVar(&o.prefill, "prefill", o.prefill, "tokens of each window prefilled densely; the rest are decoded")
	f.IntSliceVar(&o.blockSizes, "block-tokens", o.blockSizes, "tokens per KV block")
	f.Float64SliceVar(&o.budgets, "budgets", o.budgets, "fractions of the context's blocks attended, windows included")
	f.StringSliceVar(&o.methods, "methods", o.methods, "methods ("+strings.Join(eval.SelectionMethods(), ", ")+"), ESA+softmax and Quest+softmax (head_score softmax), ESA+lag (retrieval_lag 1), ESA+int8 (repr_dtype int8), ESA+max (max-pooled keys), any of them +kv (head_select kv: each KV head selects its own blocks), and oracle (oracle+kv per KV head): the blocks of most full-attention mass; probe-<estimator>[:options] selects from statistics of the keys (lab/eval ProbePrefix)")
	f.IntSliceVar(&o.denseLayers, "dense-layers", nil, "layers every method leaves dense (rollback layers)")
	f.IntVar(&o.init, "init", o.init, "leading blocks every method keeps")
	f.IntVar(&o.local, "local", o.local, "trailing blocks every method keeps (the current block included)")
	f.StringVar(&o.split, "split", o.split, "held-out windows: a (evenly spread, train.py's) or b (the windows between a's, disjoint from them)")
	f.Float64SliceVar(&o.layerBudgets, "layer-budgets", nil, "one budget per layer for the oracles and probes only (not the methods): what an uneven spread of the budget over layers would be worth")
	o.latency = eval.DefaultLatency
	o.latency.Steps = 0
	f.IntVar(&o.latency.Steps, "latency-steps", 0, "decode steps to time each method's selection at the --latency-* shape (0: not timed)")
	f.IntVar(&o.latency.Blocks, "latency-blocks", o.latency.Blocks, "blocks of the timed context")
	f.IntVar(&o.latency.BlockTokens, "latency-block-tokens", o.latency.BlockTokens, "tokens per block of the timed context")
	f.IntVar(&o.latency.KVHeads, "latency-kv-heads", o.latency.KVHeads, "KV heads of the timed layer")
	f.IntVar(&o.latency.QHeads, "latency-q-heads", o.latency.QHeads, "query heads of the timed layer")
	f.IntVar(&o.latency.HeadDim, "latency-head-dim", o.latency.HeadDim, "head dim of the timed layer")
	f.IntVar(&o.evictMiB, "latency-evict-mib", o.latency.EvictBytes>>20, "MiB written between timed steps (untimed) so that a step reads its rows from memory, as in a model of many layers; 0: the previous step's cache stays warm")
	f.IntVar(&o.fitWindows, "fit-windows", o.fitWindows, "windows of training text (never held out) the learned representations fit the model's queries on")
	return cmd
}

func runEvalSparse(ctx context.Context, o evalSparseOptions, stdout, stderr io.Writer) error {
	m, man, err := o.loadModel()
	if err != nil {
		return err
	}
	switch {
	case o.prefill < 1 || o.prefill > o.context-1:
		return cliutil.UsageErr("--prefill %d: want [1, %d]", o.prefill, o.context-1)
	case o.init < 0 || o.local < 1:
		return cliutil.UsageErr("--init %d, --local %d: want ≥ 0 and ≥ 1", o.init, o.local)
	case o.split != "a" && o.split != "b":
		return cliutil.UsageErr("--split %q: want a or b", o.split)
	case o.latency.Steps < 0 || o.evictMiB < 0 || o.evictMiB > 1<<14:
		return cliutil.UsageErr("--latency-steps %d, --latency-evict-mib %d: want ≥ 0, and at most 16384 MiB", o.latency.Steps, o.evictMiB)
	case o.latency.Steps > 0 && (o.latency.Blocks < 1 || o.latency.BlockTokens < 1 || o.latency.KVHeads < 1 || o.latency.HeadDim < 1 ||
		o.latency.QHeads < o.latency.KVHeads || o.latency.QHeads%o.latency.KVHeads != 0):
		return cliutil.UsageErr("--latency-blocks %d, --latency-block-tokens %d, --latency-q-heads %d, --latency-kv-heads %d, --latency-head-dim %d: want positive, query heads a multiple of KV heads",
			o.latency.Blocks, o.latency.BlockTokens, o.latency.QHeads, o.latency.KVHeads, o.latency.HeadDim)
	}
	for _, l := range o.denseLayers {
		if l < 0 || l >= m.Config().Layers {
			return cliutil.UsageErr("--dense-layers %d: the model has layers 0…%d", l, m.Config().Layers-1)
		}
	}
	for _, bs := range o.blockSizes {
		if bs < 1 || bs > 1024 {
			return cliutil.UsageErr("--block-tokens %d: want [1, 1024]", bs)
		}
	}
	for _, b := range o.budgets {
		if !(b > 0 && b <= 1) {
			return cliutil.UsageErr("--budgets %v: want fractions in (0, 1]", b)
		}
	}
	for i, name := range o.methods {
		n, err := eval.CanonicalMethod(name)
		if err != nil {
			return cliutil.UsageErr("--methods: %v", err)
		}
		o.methods[i] = n
	}
	cut := eval.Windows
	if o.split == "b" {
		cut = eval.WindowsB
	}
	windows, text, err := o.heldOutSplit(o.context+1, o.windows, cut)
	if err != nil {
		return err
	}
	start := time.Now()
	fit, err := fitQueries(m, o)
	if err != nil {
		return err
	}
	res, err := eval.Run(ctx, eval.Options{Model: m, Windows: windows, Prefill: o.prefill, BlockSizes: o.blockSizes, Fit: fit, LayerBudgets: o.layerBudgets,
		Budgets: o.budgets, Methods: o.methods, Init: o.init, Local: o.local, DenseLayers: o.denseLayers, Progress: func(r eval.Result) {
			if !o.asJSON {
				fmt.Fprintf(stderr, "  %s %d-token blocks %.0f%%: %s\n", r.Method, r.BlockSize, 100*r.Budget, time.Since(start).Round(time.Second))
			}
		}})
	if err != nil {
		return err
	}
	lat, err := selectLatencies(res, o)
	if err != nil {
		return err
	}
	if o.asJSON {
		doc := map[string]any{"model": modelName(man),
			"windows": o.windows, "split": o.split, "context": o.context, "prefill": o.prefill, "init": o.init, "local": o.local, "dense_layers": o.denseLayers, "results": res}
		if lat != nil {
			doc["latency"] = lat
		}
		return writeJSON(stdout, text.json(doc))
	}
	fmt.Fprintf(stdout, "model %s; %d windows (split %s) of %d tokens from %s, prefill %d, %d decode positions per run; windows init %d, local %d blocks\n",
		modelName(man), o.windows, o.split, o.context, text.describe(), o.prefill, res[0].Positions, o.init, o.local)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tblock\tnominal\tattended\trecall\tmin recall\tlayer rel err\ttop-1\tKL nats\tppl\tΔppl\tselect µs/layer\t")
	for _, r := range res {
		errs := make([]string, len(r.LayerRelErr))
		for i, e := range r.LayerRelErr {
			errs[i] = fmt.Sprintf("%.3f", e)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f%%\t%.1f%%\t%.4f\t%.3f\t%s\t%.4f\t%.4f\t%.3f\t%+.2f%%\t%.1f\t\n", r.Method, r.BlockSize, 100*r.Budget,
			100*r.Attended, r.Recall, r.MinRecall, strings.Join(errs, " "), r.Top1, r.KL, r.PPL, 100*r.PPLChange, r.SelectMicros)
	}
	if err := tw.Flush(); err != nil || lat == nil {
		return err
	}
	l0 := lat[0]
	fmt.Fprintf(stdout, "\nthe same configurations at %d blocks of %d tokens × %d query heads on %d KV heads × %d dims, one layer, %d steps, %d MiB evicted between steps: process CPU time per step\n",
		l0.Blocks, l0.BlockTokens, l0.QHeads, l0.KVHeads, l0.HeadDim, l0.Steps, l0.EvictBytes>>20)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tblock\tnominal\tattended\tattended sparse layers\ttop-1\tΔppl\tattended at long context\tCPU µs median\tp90\tmean\twall µs median\t")
	for _, r := range res {
		i := slices.IndexFunc(lat, func(l eval.LatencyResult) bool { return l.Method == r.Method && l.Budget == r.Budget })
		if i < 0 {
			continue
		}
		l := lat[i]
		fmt.Fprintf(tw, "%s\t%d\t%.0f%%\t%.1f%%\t%.1f%%\t%.4f\t%+.2f%%\t%.1f%%\t%.0f\t%.0f\t%.0f\t%.0f\t\n", r.Method, r.BlockSize, 100*r.Budget, 100*r.Attended,
			100*r.AttendedSparse, r.Top1, 100*r.PPLChange, 100*l.Attended, l.CPUMedianMicros, l.CPUP90Micros, l.CPUMeanMicros, l.WallMedianMicros)
	}
	return tw.Flush()
}

// selectLatencies times every selecting method of res at each of its budgets (once per
// method and budget, whatever the block size) when --latency-steps is set; nil otherwise.
func selectLatencies(res []eval.Result, o evalSparseOptions) ([]eval.LatencyResult, error) {
	if o.latency.Steps == 0 {
		return nil, nil
	}
	var out []eval.LatencyResult
	for _, r := range res {
		if r.Method == "dense" || r.Method == eval.Oracle || r.Method == eval.OracleKV || strings.HasPrefix(r.Method, eval.ProbePrefix) ||
			slices.ContainsFunc(out, func(l eval.LatencyResult) bool { return l.Method == r.Method && l.Budget == r.Budget }) {
			continue
		}
		lo := o.latency
		lo.Init, lo.Local, lo.EvictBytes = o.init, o.local, o.evictMiB<<20
		l, err := eval.SelectLatency(r.Method, r.Budget, lo)
		if err != nil {
			return nil, fmt.Errorf("latency of %s at %.0f%%: %w", r.Method, 100*r.Budget, err)
		}
		out = append(out, l)
	}
	return out, nil
}

// fitQueries fits the model's queries on --fit-windows windows of training text of the
// model's full context when a method needs them (eval.NeedsFit), else returns nil.
func fitQueries(m *model.Model, o evalSparseOptions) (*eval.QueryFit, error) {
	if !slices.ContainsFunc(o.methods, eval.NeedsFit) {
		return nil, nil
	}
	corpus := o.corpus
	if corpus == "" {
		root, err := loop.GoRoot()
		if err != nil {
			return nil, cliutil.UsageErr("--corpus not given and %v", err)
		}
		corpus = filepath.Join(root, "src")
	}
	stream, _, err := eval.TrainStream(corpus)
	if err != nil {
		return nil, cliutil.UsageErr("%v", err)
	}
	ctx := m.Config().MaxCtx
	windows, err := eval.Windows(stream, ctx, o.fitWindows)
	if err != nil {
		return nil, cliutil.UsageErr("training text: %v", err)
	}
	return eval.FitQueries(m, windows, ctx/2, 1024)
}

// heldOutOptions are the flags every eval command takes: the model (--weights), the held-out
// text it is measured on (--corpus, or --text), how many windows of it and of how many tokens, and --json.
type heldOutOptions struct {
	weights, corpus  string
	text             string
	windows, context int
	asJSON           bool
}

// register adds the flags to f; windows and context say what a window is for this command.
func (h *heldOutOptions) register(f *pflag.FlagSet, windows, context string) {
	weightsFlag(f, &h.weights)
	f.StringVar(&h.corpus, "corpus", "", "the Go source tree the model's held-out files (train.py's split) are taken from (default: $(go env GOROOT)/src)")
	f.StringVar(&h.text, "text", "", "measure on this text instead of the model's held-out files: a file, or a directory whose every regular file is taken in path order (binary files, with a NUL in the first 8 KiB, and files over 256 KiB left out and counted)")
	f.IntVar(&h.windows, "windows", h.windows, windows)
	f.IntVar(&h.context, "context", h.context, context+" (at most the model's context)")
	f.BoolVar(&h.asJSON, "json", false, "print one JSON object")
}

// weightsFlag registers --weights, the small model's weights directory (eval and chat), into
// *dst; the default is the committed model, relative to the repository's root.
func weightsFlag(f *pflag.FlagSet, dst *string) {
	f.StringVar(dst, "weights", "lab/model/weights", "the model's weights directory (MANIFEST.json and the weights file)")
}

// loadModel loads the small model from its weights directory (eval and chat), or a usage
// error naming the directory.
func loadModel(weights string) (*model.Model, *model.Manifest, error) {
	m, man, err := model.LoadDir(weights)
	if err != nil {
		return nil, nil, cliutil.UsageErr("model weights %s: %v (run from the repository's root, or pass --weights)", weights, err)
	}
	return m, man, nil
}

// loadModel loads the small model the eval commands decode with and checks --context against
// it and --windows: a usage error names the directory or the flag.
func (h *heldOutOptions) loadModel() (*model.Model, *model.Manifest, error) {
	m, man, err := loadModel(h.weights)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case h.context < 2 || h.context > m.Config().MaxCtx:
		return nil, nil, cliutil.UsageErr("--context %d: want [2, %d]", h.context, m.Config().MaxCtx)
	case h.windows < 1:
		return nil, nil, cliutil.UsageErr("--windows %d: want at least 1", h.windows)
	}
	return m, man, nil
}

// modelName names the model in reports by its weights' digest.
func modelName(man *model.Manifest) string { return "ucm-go-small@" + man.WeightsSHA256[:12] }

// writeJSON prints v as one indented JSON object (the --json form of a report).
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// heldOut is the held-out text an eval command measured on, for its report.
type heldOut struct {
	// Source is the --text path, or the corpus root whose held-out Go files were taken.
	Source string
	// Files and Bytes are the text's files and size; SkippedBinary and SkippedLarge the files
	// of --text left out (eval.ReadText).
	Files, Bytes                int
	SkippedBinary, SkippedLarge int
}

// describe is the held-out text in a report's first line.
func (h heldOut) describe() string {
	if h.Source == "" {
		return fmt.Sprintf("%d held-out files (%d bytes)", h.Files, h.Bytes)
	}
	return fmt.Sprintf("%d held-out files of %s (%d bytes; %d binary and %d over %d bytes left out)",
		h.Files, h.Source, h.Bytes, h.SkippedBinary, h.SkippedLarge, eval.MaxFileBytes)
}

// json is the held-out text's keys in a --json report.
func (h heldOut) json(m map[string]any) map[string]any {
	m["heldout_files"], m["heldout_bytes"] = h.Files, h.Bytes
	if h.Source != "" {
		m["heldout_text"], m["heldout_skipped_binary"], m["heldout_skipped_large"] = h.Source, h.SkippedBinary, h.SkippedLarge
	}
	return m
}

// heldOutWindows cuts n windows of size bytes from the held-out text: --text's file or
// directory (eval.ReadText) when given, else the held-out Go files under --corpus (the Go
// toolchain's sources when empty). It returns them with what the text was, for the report.
func (h *heldOutOptions) heldOutWindows(size, n int) ([][]byte, heldOut, error) {
	return h.heldOutSplit(size, n, eval.Windows)
}

// heldOutSplit is heldOutWindows with the windows cut by cut (eval.Windows or eval.WindowsB).
func (h *heldOutOptions) heldOutSplit(size, n int, cut func([]byte, int, int) ([][]byte, error)) ([][]byte, heldOut, error) {
	var stream []byte
	var ho heldOut
	if h.text != "" {
		t, err := eval.ReadText(h.text)
		if err != nil {
			return nil, ho, cliutil.UsageErr("--text: %v", err)
		}
		stream, ho = t.Stream, heldOut{Source: h.text, Files: t.Files, SkippedBinary: t.SkippedBinary, SkippedLarge: t.SkippedLarge}
	} else {
		corpus := h.corpus
		if corpus == "" {
			root, err := loop.GoRoot()
			if err != nil {
				return nil, ho, cliutil.UsageErr("--corpus not given and %v", err)
			}
			corpus = filepath.Join(root, "src")
		}
		var err error
		if stream, ho.Files, err = eval.HeldOutStream(corpus); err != nil {
			return nil, ho, cliutil.UsageErr("%v", err)
		}
	}
	ho.Bytes = len(stream)
	windows, err := cut(stream, size, n)
	if err != nil {
		return nil, ho, cliutil.UsageErr("held-out text (%s): %v", ho.describe(), err)
	}
	return windows, ho, nil
}
