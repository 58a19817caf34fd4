package loop

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ucm-go/ucm/connector/ucmhash"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/lab/model"
)

var (
	modelOnce sync.Once
	testModel *model.Model
	modelErr  error
)

func loadModel(t testing.TB) *model.Model {
	t.Helper()
	modelOnce.Do(func() { testModel, _, modelErr = model.LoadDir(filepath.Join("..", "model", "weights")) })
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return testModel
}

// text returns n bytes of Go source from the standard library (on every machine): what the
// model was trained on, so its predictions are meaningful.
func text(t testing.TB, n int) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goRoot(t), "src", "strings", "strings.go"))
	if err != nil {
		t.Fatal(err)
	}
	return b[1000 : 1000+n]
}

func goRoot(t testing.TB) string {
	t.Helper()
	root, err := GoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

const testBlock = 16

func openStore(t testing.TB, m *model.Model, dir string) *engine.Engine {
	t.Helper()
	l, err := StoreLayout(m.Config(), testBlock)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(dir, engine.Options{Layout: l, Schema: StoreSchema("test-model", testBlock)})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

var testSidecars = []kernels.SidecarSpec{
	{Kind: kernels.SidecarESAMean},
	{Kind: kernels.SidecarQuest},
	{Kind: kernels.SidecarHash, HashBits: 32, Seed: 7},
}

func newServer(t testing.TB, m *model.Model, store *engine.Engine) *Server {
	t.Helper()
	// Every stored prefix is loaded: the tests check what loads do (LoadWhenFaster has its own).
	s, err := NewServer(Options{Model: m, ModelName: "test-model", Store: store, BlockSize: testBlock, MaxContext: 512, Sidecars: testSidecars,
		LoadPolicy: LoadAlways})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestLoadWhenFaster: with the default policy, a stored prefix whose load is estimated to take
// longer than computing the whole prompt is computed (counted as skipped), with the same logits;
// one estimated cheaper is loaded.
func TestLoadWhenFaster(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	s, err := NewServer(Options{Model: m, ModelName: "test-model", Store: store, BlockSize: testBlock, MaxContext: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	without := newServer(t, m, nil)
	n := 120
	if raceEnabled {
		n = 60
	}
	prompt := text(t, n)
	r, st, err := s.Prefill(ctx, prompt) // nothing stored: a compute, the compute's estimate
	if err != nil || st.HitTokens != 0 {
		t.Fatalf("first prefill: %+v %v", st, err)
	}
	if _, err := s.Finish(ctx, r); err != nil {
		t.Fatal(err)
	}
	stored := (n - 1) / testBlock * testBlock
	ref, _, err := without.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		perBlock   float64 // seconds a block's load is made to cost
		hit, skips int
	}{
		{"slow medium", 10, 0, stored},
		{"fast medium", 1e-9, stored, 0},
	} {
		s.costs.load = linearFit{}
		s.costs.load.add(1, c.perBlock)
		s.costs.skipped = 0
		r, st, err := s.Prefill(ctx, prompt)
		if err != nil {
			t.Fatal(err)
		}
		if st.HitTokens != c.hit || st.SkippedTokens != c.skips {
			t.Fatalf("%s: %d tokens loaded, %d skipped; want %d, %d", c.name, st.HitTokens, st.SkippedTokens, c.hit, c.skips)
		}
		if !sameBits(r.Logits(), ref.Logits()) {
			t.Fatalf("%s: logits differ from a full compute", c.name)
		}
		if _, err := s.Finish(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHitsChangeNothing: a second turn whose prompt extends the first's (prompt and answer) is
// served mostly from the store, and its logits and greedy continuation are bit-identical to a
// server without a store computing every token; the dumped blocks carry their sidecars.
func TestHitsChangeNothing(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	with, without := newServer(t, m, store), newServer(t, m, nil)

	n1, n2 := 150, 260
	if raceEnabled {
		n1, n2 = 40, 90
	}
	turn1 := text(t, n1)
	r, st, err := with.Prefill(ctx, turn1)
	if err != nil || st.HitTokens != 0 || st.ComputedTokens != len(turn1) {
		t.Fatalf("first turn: %+v %v", st, err)
	}
	answer, err := with.Decode(r, 8)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := with.Finish(ctx, r)
	if err != nil || dst.Blocks != (len(turn1)+len(answer))/testBlock || dst.Sidecars != dst.Blocks*len(testSidecars) {
		t.Fatalf("finish: %+v %v", dst, err)
	}

	turn2 := append(append(append([]byte{}, turn1...), answer...), text(t, n2)[n1+20:]...)
	r2, st2, err := with.Prefill(ctx, turn2)
	if err != nil {
		t.Fatal(err)
	}
	if want := (len(turn1) + len(answer)) / testBlock * testBlock; st2.HitTokens != want || st2.LoadFailed != nil {
		t.Fatalf("second turn: %d tokens from the store, want %d (%+v)", st2.HitTokens, want, st2)
	}
	ref, _, err := without.Prefill(ctx, turn2)
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(r2.Logits(), ref.Logits()) {
		t.Fatal("logits after a prefix hit differ from a full compute")
	}
	a2, err := with.Decode(r2, 4)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := without.Decode(ref, 4)
	if err != nil || string(a2) != string(b2) {
		t.Fatalf("continuations differ: %q vs %q (%v)", a2, b2, err)
	}
	if !sameBits(r2.Logits(), ref.Logits()) {
		t.Fatal("decode logits differ")
	}

	// Every dumped block has its sidecars, and their parts decode.
	hasher, _ := ucmhash.NewHasher(ucmhash.HashMeta{Model: "test-model", TPSize: 1, DType: "torch.float16"}, engine.HashSchemeUCMGo, testBlock)
	ids := hasher.BlockIDs(tokensU32(r.Tokens()[:dst.Blocks*testBlock]), nil)
	for k, spec := range with.sidecars {
		part := int(spec.PartBytes())
		buf := make([]byte, len(ids)*part)
		found, err := store.LoadSidecars(engine.SidecarKind(spec.Kind), m.Config().Layers-1, ids, buf)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ids {
			if !found[i] {
				t.Fatalf("sidecar %d (%v) of block %d missing", k, spec.Kind, i)
			}
			if _, layer, err := kernels.DecodeSidecarPart(buf[i*part:(i+1)*part], nil, nil); err != nil || layer != m.Config().Layers-1 {
				t.Fatalf("sidecar %v of block %d: layer %d, %v", spec.Kind, i, layer, err)
			}
		}
	}
}

// TestLoadFailureRecomputes: a hit block that cannot be loaded (its bytes corrupt on disk, or
// evicted between the lookup and the load) is recomputed, with the same logits.
func TestLoadFailureRecomputes(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	with, without := newServer(t, m, store), newServer(t, m, nil)
	prompt := text(t, 200)
	if raceEnabled {
		prompt = text(t, 64)
	}
	r, _, err := with.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := with.Finish(ctx, r); err != nil {
		t.Fatal(err)
	}
	hasher, _ := ucmhash.NewHasher(ucmhash.HashMeta{Model: "test-model", TPSize: 1, DType: "torch.float16"}, engine.HashSchemeUCMGo, testBlock)
	ids := hasher.BlockIDs(tokensU32(r.Tokens()[:len(prompt)/testBlock*testBlock]), nil)
	// Flip a byte of block 2's layer-1 shard on disk: the lookup hits, the load fails its
	// checksum, and the prompt is computed from block 2 on instead.
	corruptShard(t, store, ids[2], 1)
	r2, st, err := with.Prefill(ctx, prompt)
	if err != nil || st.HitTokens != 2*testBlock || st.FailedBlocks != 1 || !errors.Is(st.LoadFailed, engine.ErrCorrupt) {
		t.Fatalf("corrupt hit: %+v %v", st, err)
	}
	ref, _, err := without.Prefill(ctx, prompt)
	if err != nil || !sameBits(r2.Logits(), ref.Logits()) {
		t.Fatalf("logits after a failed load differ from a full compute (%v)", err)
	}
	if _, err := with.Finish(ctx, r2); err != nil { // stores the block again
		t.Fatal(err)
	}
	// Evicted between a lookup and the load: the load reports the miss.
	if _, err := store.Evict("", 0); err != nil {
		t.Fatal(err)
	}
	if err := with.loadBlocks(ctx, ids[:3], []int{0, 1, 2}); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("loading evicted blocks: %v, want ErrNotFound", err)
	}
}

func TestBadOptions(t *testing.T) {
	m := loadModel(t)
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	for name, o := range map[string]Options{
		"no model":      {},
		"block size":    {Model: m, BlockSize: -1},
		"context":       {Model: m, MaxContext: 1 << 30},
		"store no name": {Model: m, Store: store, BlockSize: testBlock},
		"layout":        {Model: m, Store: store, ModelName: "test-model", BlockSize: 32},
		"sidecar":       {Model: m, Sidecars: []kernels.SidecarSpec{{Kind: 99}}},
	} {
		if s, err := NewServer(o); err == nil {
			s.Close()
			t.Errorf("%s: accepted", name)
		}
	}
	s := newServer(t, m, nil)
	if _, _, err := s.Prefill(context.Background(), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty prompt: %v", err)
	}
}

// TestReplay: in a chat replay with a store, later turns are served mostly from the store
// (each turn's prompt starts with the previous turn's prompt and answer, and every
// conversation with the same system prompt), and every answer is identical to the replay
// without a store.
func TestReplay(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	corpus, err := GoSourceCorpus(filepath.Join(goRoot(t), "src", "strings"), 2000, 8)
	if err != nil {
		t.Fatal(err)
	}
	o := ReplayOptions{Conversations: 2, Turns: 3, SystemBytes: 64, UserBytes: 40, AnswerTokens: 8}
	if raceEnabled {
		o = ReplayOptions{Conversations: 2, Turns: 2, SystemBytes: 32, UserBytes: 20, AnswerTokens: 2}
	}
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	calls := 0
	reps, err := ReplayEach(ctx, []*Server{newServer(t, m, store), newServer(t, m, nil)}, corpus, o, func(turn []TurnReport) {
		if len(turn) != 2 || turn[0].Conversation != calls%o.Conversations || turn[1].Turn != calls/o.Conversations {
			t.Errorf("report %d: %+v", calls, turn)
		}
		calls++
	})
	if err != nil {
		t.Fatal(err)
	}
	with, without := reps[0], reps[1]
	if calls != o.Conversations*o.Turns {
		t.Fatalf("%d turn reports, want %d", calls, o.Conversations*o.Turns)
	}
	if one, err := Replay(ctx, newServer(t, m, nil), corpus, o); err != nil || len(one.Turns) != len(without.Turns) ||
		string(one.Turns[len(one.Turns)-1].Answer) != string(without.Turns[len(without.Turns)-1].Answer) {
		t.Fatalf("a replay on one server: %v", err)
	}
	if len(with.Turns) != o.Conversations*o.Turns || without.HitTokens != 0 || without.ComputedTokens != without.PromptTokens {
		t.Fatalf("replays: %d turns, without a store %d hits", len(with.Turns), without.HitTokens)
	}
	for i, tr := range with.Turns {
		if string(tr.Answer) != string(without.Turns[i].Answer) {
			t.Fatalf("turn %d: answers differ with and without the store", i)
		}
		switch {
		case i == 1 && tr.Prefill.HitTokens != o.SystemBytes: // the second conversation's system prompt
			t.Fatalf("conversation 1 turn 0: %d hit tokens, want the %d-token system prompt", tr.Prefill.HitTokens, o.SystemBytes)
		case tr.Turn > 0 && tr.Prefill.HitTokens < tr.Prefill.PromptTokens-o.UserBytes-testBlock:
			t.Fatalf("conversation %d turn %d: %d of %d tokens hit", tr.Conversation, tr.Turn, tr.Prefill.HitTokens, tr.Prefill.PromptTokens)
		}
	}
	if with.SavedFraction() < 0.5 {
		t.Fatalf("saved %.2f of prefill tokens", with.SavedFraction())
	}
	if _, err := Replay(ctx, newServer(t, m, nil), corpus, ReplayOptions{Conversations: 1, Turns: 100, UserBytes: 100}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a replay beyond the context: %v", err)
	}
}

// corruptShard flips a byte of a stored block's shard on disk.
func corruptShard(t *testing.T, store *engine.Engine, id engine.BlockID, shard int) {
	t.Helper()
	loc, ok, err := store.Index().Get(id)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	path, _ := store.SegmentPath(loc.Segment)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := loc.ShardOffset(shard) + 5 // absolute: a block of a batch record has its shards apart
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestCorruptBlocksRecomputedFromFirst: with two hit blocks broken in different layers (the
// later block in the first layer, the earlier one in the last), one prefill finds and drops
// both, loads the blocks before the first broken one and computes from there, with the logits
// of a full compute; once its blocks are stored again the next turn is served from the store.
func TestCorruptBlocksRecomputedFromFirst(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	with, without := newServer(t, m, store), newServer(t, m, nil)
	prompt, early, late := text(t, 200), 2, 5
	if raceEnabled {
		prompt, early, late = text(t, 100), 1, 3
	}
	r, _, err := with.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := with.Finish(ctx, r); err != nil {
		t.Fatal(err)
	}
	hasher, _ := ucmhash.NewHasher(ucmhash.HashMeta{Model: "test-model", TPSize: 1, DType: "torch.float16"}, engine.HashSchemeUCMGo, testBlock)
	ids := hasher.BlockIDs(tokensU32(r.Tokens()[:len(prompt)/testBlock*testBlock]), nil)
	hit := (len(prompt) - 1) / testBlock
	corruptShard(t, store, ids[early], m.Config().Layers-1)
	corruptShard(t, store, ids[late], 0)

	r2, st, err := with.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if st.HitTokens != early*testBlock || st.ComputedTokens != len(prompt)-early*testBlock || st.FailedBlocks != 2 ||
		!errors.Is(st.LoadFailed, engine.ErrCorrupt) {
		t.Errorf("two broken hit blocks: %+v, want %d tokens from the store and both blocks failed", st, early*testBlock)
	}
	for i, ok := range store.Lookup(ids[:hit]) {
		if broken := i == early || i == late; ok == broken {
			t.Errorf("block %d: stored %v after the failed load (broken %v): every broken block is dropped, no other", i, ok, broken)
		}
	}
	ref, _, err := without.Prefill(ctx, prompt)
	if err != nil || !sameBits(r2.Logits(), ref.Logits()) {
		t.Fatalf("logits after a partly failed load differ from a full compute (%v)", err)
	}
	if _, err := with.Finish(ctx, r2); err != nil { // stores the recomputed blocks again
		t.Fatal(err)
	}
	r3, st3, err := with.Prefill(ctx, prompt)
	if err != nil || st3.HitTokens != hit*testBlock || st3.LoadFailed != nil {
		t.Fatalf("the turn after: %+v %v, want all %d hit blocks served", st3, err, hit)
	}
	if !sameBits(r3.Logits(), ref.Logits()) {
		t.Fatal("logits of the turn after differ from a full compute")
	}
}
