package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/loop"
)

// chatOptions are the flags of ucm-lab chat.
type chatOptions struct {
	dir, weights, corpus string
	keep, turnsGiven     bool
	blockSize            int
	replay               loop.ReplayOptions
	sidecars             string
	linkGBps             float64
	asJSON               bool
}

func newChatCmd(stdout, stderr io.Writer) *cobra.Command {
	o := chatOptions{replay: loop.DefaultReplay}
	cmd := &cobra.Command{
		Use:   "chat",
		Short: "Replay multi-turn chats on the small model, with and without the store",
		Long: `chat runs the reference connector loop (lab/loop) on the small byte-level model
(lab/model) over a multi-turn chat replay: several conversations, interleaved, sharing
a system prompt, each turn appending user text (Go source from the standard library) to the
conversation so far and generating an answer. Each turn runs twice, back to back: without a
store (every prompt token computed), then with a store under --dir (prefix hits loaded layer by
layer through the staging layer, unless loading them is estimated to take longer than computing
them; new blocks dumped layer by layer with their sidecars). A row is printed as each turn
completes: the prompt tokens, the tokens served from the store and the time to first token of
both; at the end chat checks that every answer is identical.

The store directory is emptied first unless --keep (a kept store serves even first turns).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.turnsGiven = cmd.Flags().Changed("turns")
			return runChat(cmd.Context(), o, stdout, stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "./ucm-data/chat", "store directory")
	f.BoolVar(&o.keep, "keep", false, "keep what the store holds from earlier runs")
	weightsFlag(f, &o.weights)
	f.StringVar(&o.corpus, "corpus", "", "directory of Go source the prompts are taken from (default: $(go env GOROOT)/src)")
	f.IntVar(&o.blockSize, "block-tokens", loop.DefaultBlockSize, "tokens per KV block")
	f.IntVar(&o.replay.Conversations, "conversations", o.replay.Conversations, "conversations, interleaved")
	f.IntVar(&o.replay.Turns, "turns", o.replay.Turns, "turns per conversation")
	f.IntVar(&o.replay.SystemBytes, "system", o.replay.SystemBytes, "tokens of the system prompt every conversation starts with")
	f.IntVar(&o.replay.UserBytes, "user", o.replay.UserBytes, "tokens of user text per turn")
	f.IntVar(&o.replay.AnswerTokens, "answer", o.replay.AnswerTokens, "tokens generated per turn")
	f.StringVar(&o.sidecars, "sidecars", "esa-mean,quest,hash", "representations stored beside each block (esa-mean, esa-max, quest, kvstar, hash; empty: none)")
	f.Float64Var(&o.linkGBps, "link-gbps", 0, "modelled host-device link bandwidth in GB/s of the simulated device (0: unlimited)")
	f.BoolVar(&o.asJSON, "json", false, "print one JSON object")
	return cmd
}

// chatJSON is what chat --json prints.
type chatJSON struct {
	Model          string             `json:"model"`
	Turns          []chatTurnJSON     `json:"turns"`
	PromptTokens   int                `json:"prompt_tokens"`
	HitTokens      int                `json:"hit_tokens"`
	SavedFraction  float64            `json:"saved_fraction"`
	MeanTTFTMs     map[string]float64 `json:"mean_ttft_ms"`
	AnswersSame    bool               `json:"answers_identical"`
	DumpedBlocks   int                `json:"dumped_blocks"`
	DumpedSidecars int                `json:"dumped_sidecars"`
}

type chatTurnJSON struct {
	Conversation int     `json:"conversation"`
	Turn         int     `json:"turn"`
	Prompt       int     `json:"prompt_tokens"`
	Hit          int     `json:"hit_tokens"`
	TTFTNoStore  float64 `json:"ttft_ms_no_store"`
	TTFTStore    float64 `json:"ttft_ms_store"`
	LoadMs       float64 `json:"load_ms"`
	Skipped      int     `json:"skipped_tokens"`
}

func parseSidecars(s string) ([]kernels.SidecarSpec, error) {
	var out []kernels.SidecarSpec
	for _, name := range strings.Split(s, ",") {
		switch strings.TrimSpace(name) {
		case "":
		case "esa-mean":
			out = append(out, kernels.SidecarSpec{Kind: kernels.SidecarESAMean})
		case "esa-max":
			out = append(out, kernels.SidecarSpec{Kind: kernels.SidecarESAMax})
		case "quest":
			out = append(out, kernels.SidecarSpec{Kind: kernels.SidecarQuest})
		case "kvstar":
			out = append(out, kernels.SidecarSpec{Kind: kernels.SidecarKVStar, PruneRatio: 0.5, Merge: 4})
		case "hash":
			out = append(out, kernels.SidecarSpec{Kind: kernels.SidecarHash, HashBits: 32, Seed: 1})
		default:
			return nil, cliutil.UsageErr("--sidecars: unknown kind %q (esa-mean, esa-max, quest, kvstar, hash)", name)
		}
	}
	return out, nil
}

func runChat(ctx context.Context, o chatOptions, stdout, stderr io.Writer) error {
	sidecars, err := parseSidecars(o.sidecars)
	if err != nil {
		return err
	}
	m, man, err := loadModel(o.weights)
	if err != nil {
		return err
	}
	if o.corpus == "" {
		root, err := loop.GoRoot()
		if err != nil {
			return cliutil.UsageErr("--corpus not given and %v", err)
		}
		o.corpus = filepath.Join(root, "src")
	}
	corpus, err := loop.GoSourceCorpus(o.corpus, 4<<10, 1+o.replay.Conversations*8)
	if err != nil {
		return cliutil.UsageErr("%v", err)
	}
	name := modelName(man)
	if ctxLen := min(loop.DefaultMaxContext, m.Config().MaxCtx); !o.turnsGiven {
		// The default conversation length follows the model's context.
		per := o.replay.UserBytes + o.replay.AnswerTokens
		o.replay.Turns = max(1, min(o.replay.Turns, (ctxLen-o.replay.SystemBytes)/max(per, 1)))
	}
	dev := kernels.SimOptions{LinkBytesPerSec: o.linkGBps * 1e9}
	newServer := func(store *engine.Engine) (*loop.Server, error) {
		return loop.NewServer(loop.Options{Model: m, ModelName: name, Store: store, BlockSize: o.blockSize, Sidecars: sidecars, Device: dev})
	}
	if !o.keep {
		if err := os.RemoveAll(o.dir); err != nil {
			return err
		}
	}
	layout, err := loop.StoreLayout(m.Config(), o.blockSize)
	if err != nil {
		return cliutil.UsageErr("%v", err)
	}
	e, err := engine.Open(o.dir, engine.Options{Layout: layout, Schema: loop.StoreSchema(name, o.blockSize)})
	if err != nil {
		return err
	}
	defer e.Close()
	plain, err := newServer(nil)
	if err != nil {
		return cliutil.UsageErr("%v", err)
	}
	defer plain.Close()
	srv, err := newServer(e)
	if err != nil {
		return cliutil.UsageErr("%v", err)
	}
	defer srv.Close()
	var row func([]loop.TurnReport)
	if !o.asJSON {
		cfg := m.Config()
		fmt.Fprintf(stdout, "model %s: %d layers, d_model %d, %d query / %d KV heads; %d-token blocks; store %s\n",
			name, cfg.Layers, cfg.DModel, cfg.Heads, cfg.KVHeads, o.blockSize, o.dir)
		fmt.Fprintf(stdout, "%d conversations of %d turns, interleaved; each turn runs without the store, then with it, back to back.\n%s",
			o.replay.Conversations, o.replay.Turns, chatColumns)
		fmt.Fprintf(stdout, "%4s %4s %6s %10s %7s %13s %13s %11s %8s\n", "conv", "turn", "prompt", "from store", "skipped",
			"TTFT no store", "TTFT store", "load", "speedup")
		row = func(t []loop.TurnReport) {
			b, w := t[0].Prefill, t[1].Prefill
			fmt.Fprintf(stdout, "%4d %4d %6d %10d %7d %10.1f ms %10.1f ms %8.1f ms %7.2fx\n", t[1].Conversation, t[1].Turn,
				w.PromptTokens, w.HitTokens, w.SkippedTokens, ms(b.TTFT), ms(w.TTFT), ms(w.Load), ms(b.TTFT)/max(ms(w.TTFT), 1e-9))
		}
	}
	reps, err := loop.ReplayEach(ctx, []*loop.Server{plain, srv}, corpus, o.replay, row)
	if err != nil {
		return err
	}
	base, with := reps[0], reps[1]
	same := true
	out := chatJSON{Model: name, PromptTokens: with.PromptTokens, HitTokens: with.HitTokens, SavedFraction: with.SavedFraction(),
		MeanTTFTMs: map[string]float64{"no_store": ms(base.MeanTTFT()), "store": ms(with.MeanTTFT())}}
	for i, t := range with.Turns {
		b := base.Turns[i]
		same = same && string(t.Answer) == string(b.Answer)
		out.DumpedBlocks += t.Dump.Blocks
		out.DumpedSidecars += t.Dump.Sidecars
		out.Turns = append(out.Turns, chatTurnJSON{Conversation: t.Conversation, Turn: t.Turn, Prompt: t.Prefill.PromptTokens, Hit: t.Prefill.HitTokens,
			TTFTNoStore: ms(b.Prefill.TTFT), TTFTStore: ms(t.Prefill.TTFT), LoadMs: ms(t.Prefill.Load), Skipped: t.Prefill.SkippedTokens})
	}
	out.AnswersSame = same
	if o.asJSON {
		if err := writeJSON(stdout, out); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "prefill tokens: %d, from the store %d (%.1f%%), computed %d\n", with.PromptTokens, with.HitTokens,
			100*with.SavedFraction(), with.ComputedTokens)
		fmt.Fprintf(stdout, "mean TTFT: %.1f ms without the store, %.1f ms with it (%.2fx)\n", ms(base.MeanTTFT()), ms(with.MeanTTFT()),
			float64(base.MeanTTFT())/float64(max(with.MeanTTFT(), 1)))
		fmt.Fprintf(stdout, "stored: %d blocks, %d sidecars; answers identical with and without the store: %v\n", out.DumpedBlocks, out.DumpedSidecars, same)
	}
	if !same {
		fmt.Fprintln(stderr, "ucm-lab chat: answers differ with and without the store")
		return cliutil.ProblemsFound
	}
	return nil
}

// chatColumns explains chat's table.
const chatColumns = `  prompt         tokens of the turn's prompt: the conversation so far and the new user text
  from store     prompt tokens whose KV was loaded from the store instead of computed
  skipped        stored tokens computed anyway: loading them was estimated to take longer
  TTFT           time to first token: hashing, lookup, loads and the compute of the rest
  load           until the last layer of the loaded blocks was resident (overlapped with compute)
  speedup        TTFT no store / TTFT store
`

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
