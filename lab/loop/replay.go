package loop

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ReplayOptions shape a multi-turn chat replay: Conversations conversations of Turns turns,
// interleaved (turn t of every conversation before turn t+1 of any). Every conversation starts
// with the same system prompt; each turn appends UserBytes of new user text to the
// conversation so far (its earlier prompts and answers), and the model answers with
// AnswerTokens greedy tokens, which become part of the conversation.
type ReplayOptions struct {
	Conversations int
	Turns         int
	SystemBytes   int
	UserBytes     int
	AnswerTokens  int
}

// Defaults of ReplayOptions: 4 conversations of 6 turns, a 128-byte system prompt, 96 bytes
// of user text and 32 answer tokens per turn (a conversation ends at 896 tokens).
var DefaultReplay = ReplayOptions{Conversations: 4, Turns: 6, SystemBytes: 128, UserBytes: 96, AnswerTokens: 32}

// TurnReport is one turn of a replay.
type TurnReport struct {
	Conversation, Turn int
	Prefill            PrefillStats
	Dump               DumpStats
	Answer             []byte
}

// ReplayReport is a whole replay.
type ReplayReport struct {
	Turns []TurnReport
	// PromptTokens, HitTokens and ComputedTokens sum the turns' prefills.
	PromptTokens, HitTokens, ComputedTokens int
	// TTFT sums the turns' times to first token; Wall is the replay's whole time (of all the
	// servers, for ReplayEach).
	TTFT, Wall time.Duration
}

// SavedFraction is the fraction of prompt tokens served from the store instead of computed.
func (r ReplayReport) SavedFraction() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.HitTokens) / float64(r.PromptTokens)
}

// MeanTTFT is the mean time to first token over the turns.
func (r ReplayReport) MeanTTFT() time.Duration {
	if len(r.Turns) == 0 {
		return 0
	}
	return r.TTFT / time.Duration(len(r.Turns))
}

// GoRoot returns the Go installation's root (`go env GOROOT`), whose src directory is the
// replay's default corpus: on every machine that builds this repository.
func GoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOROOT: %w", err)
	}
	root := strings.TrimSpace(string(out))
	if root == "" {
		return "", fmt.Errorf("%w: go env GOROOT printed nothing", ErrInvalid)
	}
	return root, nil
}

// Corpus is where a replay's text comes from: Go source files, which the model was trained on.
type Corpus struct {
	files [][]byte
}

// GoSourceCorpus reads the .go files (tests and testdata excluded) of the Go standard library
// packages under root (GOROOT/src), at most max files of at least minBytes each, in path order.
func GoSourceCorpus(root string, minBytes, max int) (*Corpus, error) {
	c := &Corpus{}
	var paths []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == "testdata" || d.Name() == "vendor"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		paths = append(paths, path)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("corpus %s: %w", root, err)
	}
	slices.Sort(paths)
	for _, p := range paths {
		if len(c.files) == max {
			break
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("corpus: %w", err)
		}
		if len(b) >= minBytes {
			c.files = append(c.files, b)
		}
	}
	if len(c.files) == 0 {
		return nil, fmt.Errorf("%w: corpus %s: no Go file of %d bytes or more", ErrInvalid, root, minBytes)
	}
	return c, nil
}

// text returns n bytes of file i (modulo the corpus), from offset off (modulo what fits).
func (c *Corpus) text(i, off, n int) []byte {
	f := c.files[i%len(c.files)]
	if n >= len(f) {
		return f
	}
	off %= len(f) - n + 1
	return f[off : off+n]
}

// userOffset skips the head of a Go file in user turns: every file starts with the same
// license comment, which would make the conversations' first turns share more than the
// system prompt.
const userOffset = 512

// Replay runs the chat replay on s and reports every turn. Prompts are bytes of the corpus:
// the system prompt is the head of file 0 (the license comment every Go file starts with);
// conversation k's user turns are consecutive pieces of file k+1 from its userOffset-th byte.
func Replay(ctx context.Context, s *Server, c *Corpus, o ReplayOptions) (ReplayReport, error) {
	reps, err := ReplayEach(ctx, []*Server{s}, c, o, nil)
	if err != nil {
		return ReplayReport{}, err
	}
	return reps[0], nil
}

// ReplayEach runs the chat replay on every server at once, turn by turn: each turn runs on the
// servers one after the other before the next turn starts, so that a comparison of the servers
// turn by turn is not skewed by what else the machine did in between. Each server keeps its own
// conversations (its own answers). After each turn, done (if not nil) is called with that
// turn's report from every server, in the servers' order.
func ReplayEach(ctx context.Context, servers []*Server, c *Corpus, o ReplayOptions, done func([]TurnReport)) ([]ReplayReport, error) {
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: a replay on no server", ErrInvalid)
	}
	for _, s := range servers {
		switch {
		case o.Conversations < 1 || o.Turns < 1 || o.SystemBytes < 0 || o.UserBytes < 1 || o.AnswerTokens < 0:
			return nil, fmt.Errorf("%w: replay %+v", ErrInvalid, o)
		case o.SystemBytes+o.Turns*(o.UserBytes+o.AnswerTokens) > s.opts.MaxContext:
			return nil, fmt.Errorf("%w: a conversation of %d tokens exceeds the context %d", ErrInvalid,
				o.SystemBytes+o.Turns*(o.UserBytes+o.AnswerTokens), s.opts.MaxContext)
		}
	}
	start := time.Now()
	system := c.text(0, 0, o.SystemBytes)
	reps := make([]ReplayReport, len(servers))
	history := make([][][]byte, len(servers)) // per server, per conversation
	for i := range servers {
		history[i] = make([][]byte, o.Conversations)
		for k := range history[i] {
			history[i][k] = append([]byte{}, system...)
		}
	}
	turnReps := make([]TurnReport, len(servers))
	for turn := range o.Turns {
		for k := range o.Conversations {
			user := c.text(k+1, userOffset+turn*o.UserBytes, o.UserBytes)
			for i, s := range servers {
				prompt := append(history[i][k], user...)
				tr, err := replayTurn(ctx, s, prompt, o.AnswerTokens)
				if err != nil {
					return nil, fmt.Errorf("conversation %d turn %d: %w", k, turn, err)
				}
				tr.Conversation, tr.Turn = k, turn
				history[i][k] = append(prompt, tr.Answer...)
				reps[i].add(tr)
				turnReps[i] = tr
			}
			if done != nil {
				done(turnReps)
			}
		}
	}
	for i := range reps {
		reps[i].Wall = time.Since(start)
	}
	return reps, nil
}

// replayTurn prefills prompt on s, generates answer tokens and finishes the request.
func replayTurn(ctx context.Context, s *Server, prompt []byte, answer int) (TurnReport, error) {
	r, pst, err := s.Prefill(ctx, prompt)
	if err != nil {
		return TurnReport{}, err
	}
	tokens, err := s.Decode(r, answer)
	if err != nil {
		return TurnReport{}, err
	}
	dst, err := s.Finish(ctx, r)
	if err != nil {
		return TurnReport{}, err
	}
	return TurnReport{Prefill: pst, Dump: dst, Answer: tokens}, nil
}

// add counts one turn in the report.
func (r *ReplayReport) add(t TurnReport) {
	r.Turns = append(r.Turns, t)
	r.PromptTokens += t.Prefill.PromptTokens
	r.HitTokens += t.Prefill.HitTokens
	r.ComputedTokens += t.Prefill.ComputedTokens
	r.TTFT += t.Prefill.TTFT
}
