package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/lab/eval"
)

// evalBlendOptions are the flags of ucm-lab eval blend.
type evalBlendOptions struct {
	heldOutOptions
	suffix               int
	blockSize, chunkSize int
	checkLayer           int
	ratios               []float64
	sources, selections  []string
	noCorrection         bool
}

func newEvalBlendCmd(stdout, stderr io.Writer) *cobra.Command {
	o := evalBlendOptions{heldOutOptions: heldOutOptions{windows: 8, context: 1024}, suffix: 256, blockSize: 16, chunkSize: 64, checkLayer: 1,
		ratios: []float64{0, 0.05, 0.1, 0.15, 0.2}, sources: []string{eval.SourceStandalone, eval.SourceShuffled}, selections: []string{eval.SelectHKVD, eval.SelectRandom}}
	cmd := &cobra.Command{
		Use:   "blend",
		Short: "Prefill RAG-like prompts of reused chunks by Blend against full recompute",
		Long: `blend builds, from windows of the small model's held-out text, prompts whose first
tokens are chunks stored before at other positions (--sources: each chunk prefilled alone, or
all of them in a shuffled order) and whose last --suffix tokens are a fresh query. Each prompt
is prefilled once with full recompute and once per (source mode, ratio) by Blend: chunk
matching by position-independent ids, the matched K/V loaded with K rotated to the new
positions, and the --ratio of the reused tokens whose layer --check-layer K deviates most
recomputed (HKVD; every layer before it computes every token). It prints, over the query's
next-token predictions: top-1 agreement with full recompute, KL divergence, perplexity and its
change, and the share of reused tokens recomputed. With ratio 0 among --ratios, each run also
reports the share of ratio 0's KL its recompute removes, and HKVD is tabled against its two
baselines from the same run: no recompute (ratio 0) and random selection at the same ratio.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEvalBlend(cmd.Context(), o, stdout, stderr)
		},
	}
	f := cmd.Flags()
	o.register(f, "prompts (windows of held-out text)", "tokens per prompt")
	f.IntVar(&o.suffix, "suffix", o.suffix, "fresh query tokens at the end of each prompt (the rest is whole reused chunks)")
	f.IntVar(&o.blockSize, "block-tokens", o.blockSize, "tokens per KV block")
	f.IntVar(&o.chunkSize, "chunk-tokens", o.chunkSize, "tokens per chunk (blend_chunk_size; whole blocks)")
	f.IntVar(&o.checkLayer, "check-layer", o.checkLayer, "the layer whose K deviation selects the tokens recomputed (compute_meta)")
	f.Float64SliceVar(&o.ratios, "ratios", o.ratios, "fractions of the reused tokens recomputed")
	f.StringSliceVar(&o.sources, "sources", o.sources, "how the chunks were computed before: standalone, shuffled")
	f.StringSliceVar(&o.selections, "selections", o.selections, "how the reused tokens recomputed are picked: hkvd (Blend's), random (the same count, uniformly)")
	f.BoolVar(&o.noCorrection, "no-correction", false, "also run without rotating reused K to their new positions")
	return cmd
}

func runEvalBlend(ctx context.Context, o evalBlendOptions, stdout, stderr io.Writer) error {
	m, man, err := o.loadModel()
	if err != nil {
		return err
	}
	cfg := m.Config()
	switch {
	case o.blockSize < 1 || o.chunkSize < o.blockSize || o.chunkSize%o.blockSize != 0:
		return cliutil.UsageErr("--chunk-tokens %d, --block-tokens %d: want whole blocks per chunk", o.chunkSize, o.blockSize)
	case o.suffix < 1 || o.suffix > o.context-o.chunkSize || (o.context-o.suffix)%o.chunkSize != 0:
		return cliutil.UsageErr("--suffix %d: want [1, context − chunk] leaving whole chunks (context %d, chunks of %d)", o.suffix, o.context, o.chunkSize)
	case o.checkLayer < 0 || o.checkLayer >= cfg.Layers:
		return cliutil.UsageErr("--check-layer %d: the model has layers 0…%d", o.checkLayer, cfg.Layers-1)
	}
	for _, r := range o.ratios {
		if !(r >= 0 && r <= 1) {
			return cliutil.UsageErr("--ratios %v: want fractions in [0, 1]", r)
		}
	}
	for _, s := range o.sources {
		if s != eval.SourceStandalone && s != eval.SourceShuffled {
			return cliutil.UsageErr("--sources %q: want standalone or shuffled", s)
		}
	}
	for _, s := range o.selections {
		if s != eval.SelectHKVD && s != eval.SelectRandom {
			return cliutil.UsageErr("--selections %q: want hkvd or random", s)
		}
	}
	windows, text, err := o.heldOutWindows(o.context+1, o.windows)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := eval.RunBlend(ctx, eval.BlendOptions{Model: m, Windows: windows, Suffix: o.suffix, BlockSize: o.blockSize,
		ChunkSize: o.chunkSize, Sources: o.sources, Ratios: o.ratios, CheckLayer: o.checkLayer, NoCorrection: o.noCorrection, Selections: o.selections, Seed: 1,
		Progress: func(r eval.BlendResult) {
			if !o.asJSON {
				fmt.Fprintf(stderr, "  %s %s ratio %.2f correction %v: %s\n", r.Source, r.Selection, r.Ratio, r.Corrected, time.Since(start).Round(time.Second))
			}
		}})
	if err != nil {
		return err
	}
	if o.asJSON {
		return writeJSON(stdout, text.json(map[string]any{"model": modelName(man), "windows": o.windows, "context": o.context, "suffix": o.suffix, "block_tokens": o.blockSize,
			"chunk_tokens": o.chunkSize, "check_layer": o.checkLayer, "results": res}))
	}
	fmt.Fprintf(stdout, "model %s; %d prompts of %d tokens from %s: %d reused tokens in chunks of %d, then a %d-token query; blocks of %d; HKVD at layer %d; %d predictions per run\n",
		modelName(man), o.windows, o.context, text.describe(), o.context-o.suffix, o.chunkSize, o.suffix, o.blockSize, o.checkLayer, res[0].Positions)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "source\tcorrection\tselection\tratio\treused\trecomputed\tlayer work\ttop-1\tKL nats\tKL recovered\tppl\tΔppl\tprefill ms\t")
	for _, r := range res {
		fmt.Fprintf(tw, "%s\t%v\t%s\t%.2f\t%.3f\t%.3f\t%.3f\t%.4f\t%.4f\t%.1f%%\t%.3f\t%+.2f%%\t%.0f\t\n", r.Source, r.Corrected, r.Selection, r.Ratio,
			r.HitFraction, r.Recomputed, r.LayerWork, r.Top1, r.KL, 100*r.KLRecovered, r.PPL, 100*r.PPLChange, r.PrefillMillis)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return blendBaselines(stdout, res)
}

// blendBaselines prints each HKVD run next to its baselines from the same run: no recompute
// (ratio 0, same source and correction) and random selection at the same ratio; nothing when
// the run has neither.
func blendBaselines(w io.Writer, res []eval.BlendResult) error {
	find := func(r eval.BlendResult, sel string, ratio float64) (eval.BlendResult, bool) {
		for _, b := range res {
			if b.Source == r.Source && b.Corrected == r.Corrected && b.Ratio == ratio && (sel == "" || b.Selection == sel) {
				return b, true
			}
		}
		return eval.BlendResult{}, false
	}
	cell := func(r eval.BlendResult, ok bool) string {
		if !ok {
			return "—"
		}
		return fmt.Sprintf("%.1f%% %.4f %+.2f%%", 100*r.Top1, r.KL, 100*r.PPLChange)
	}
	var rows []string
	for _, r := range res {
		if r.Selection != eval.SelectHKVD || r.Ratio == 0 {
			continue
		}
		none, okN := find(r, "", 0)
		rnd, okR := find(r, eval.SelectRandom, r.Ratio)
		if !okN && !okR {
			continue
		}
		rec := "—"
		if okN && okR {
			rec = fmt.Sprintf("%.1f%% / %.1f%%", 100*r.KLRecovered, 100*rnd.KLRecovered)
		}
		rows = append(rows, fmt.Sprintf("%s\t%v\t%.2f\t%s\t%s\t%s\t%s\t", r.Source, r.Corrected, r.Ratio, cell(none, okN), cell(rnd, okR), cell(r, true), rec))
	}
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nHKVD against its baselines in this run (each cell: top-1, KL nats, Δppl)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "source\tcorrection\tratio\tno recompute\trandom\thkvd\tKL recovered hkvd / random\t")
	for _, row := range rows {
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}
