package loop

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/sparse"
)

// newSparseMethod is GSA at a 30 % budget with init leading blocks, prefetching, with a cache
// of 64 shards.
func newSparseMethod(t *testing.T, s *Server, init int) sparse.SparseMethod {
	t.Helper()
	cfg, err := sparse.ParseMethodConfig(sparse.NameGSA, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.(*sparse.GSAConfig)
	g.Budget, g.MinBlocks, g.InitWindow, g.LocalWindow, g.Ahead, g.CacheSize = 0.3, 0, init, 2, 2, 64
	env, err := s.SparseEnv()
	if err != nil {
		t.Fatal(err)
	}
	m, err := sparse.New(g, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// TestDecodeSparseLoadsAttendedBlocks: with the stored blocks cleared from the device, a sparse
// decode that attends only the blocks its method loads through the prefetch engine generates
// exactly what the same decode with every block resident generates (logits bit for bit): the
// attended stored blocks' K/V are the store's, loaded before the layer that attends them.
func TestDecodeSparseLoadsAttendedBlocks(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	s1, s2 := newServer(t, m, store), newServer(t, m, store)
	n, steps := 300, 24
	if raceEnabled {
		n, steps = 120, 6
	}
	prompt := text(t, n)
	r0, _, err := s1.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Finish(ctx, r0); err != nil {
		t.Fatal(err)
	}
	rA, stA, err := s1.Prefill(ctx, prompt)
	if err != nil || stA.HitTokens == 0 {
		t.Fatalf("%+v %v", stA, err)
	}
	rB, _, err := s2.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	outA, dA, err := s1.DecodeSparse(rA, steps, newSparseMethod(t, s1, 1), false)
	if err != nil {
		t.Fatal(err)
	}
	outB, dB, err := s2.DecodeSparse(rB, steps, newSparseMethod(t, s2, 1), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("offloaded %+v, resident %+v", dA, dB)
	if string(outA) != string(outB) || !sameBits(rA.Logits(), rB.Logits()) {
		t.Fatalf("offloaded decode %q, resident %q: logits differ", outA, outB)
	}
	if dA.Steps != steps || dA.Offloaded != stA.HitTokens/testBlock || dA.Loaded != dA.Attended || dA.Attended == 0 || dA.LoadFailed != 0 {
		t.Fatalf("stats %+v", dA)
	}
	// The device really lost the blocks: a plain decode over the cleared cache diverges.
	rC, _, err := s2.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s2.DecodeSparse(rC, 0, newSparseMethod(t, s2, 1), false); err != nil { // clears, decodes nothing
		t.Fatal(err)
	}
	outC, err := s2.Decode(rC, steps)
	if err != nil {
		t.Fatal(err)
	}
	if string(outC) == string(outA) && sameBits(rC.Logits(), rA.Logits()) {
		t.Fatal("a dense decode over the cleared blocks matches: nothing was offloaded")
	}
	if _, err := s1.Finish(ctx, rA); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s1.DecodeSparse(rA, 1, newSparseMethod(t, s1, 1), false); !errors.Is(err, ErrInvalid) {
		t.Fatalf("finished request: %v", err)
	}
	if _, err := (&Server{}).SparseEnv(); !errors.Is(err, ErrInvalid) {
		t.Fatal("a server without a store gave a sparse env")
	}
}

// TestDecodeSparseLoadFailure: a stored block whose shard fails its checksum when the method
// loads it is left out of the step and reported; decoding goes on.
func TestDecodeSparseLoadFailure(t *testing.T) {
	m := loadModel(t)
	ctx := context.Background()
	store := openStore(t, m, t.TempDir())
	defer store.Close()
	s := newServer(t, m, store)
	n := 200
	if raceEnabled {
		n = 100
	}
	prompt := text(t, n)
	r0, _, err := s.Prefill(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(ctx, r0); err != nil {
		t.Fatal(err)
	}
	r, st, err := s.Prefill(ctx, prompt)
	if err != nil || st.HitTokens < 3*testBlock {
		t.Fatalf("%+v %v", st, err)
	}
	// Block 2 is in the init window (always attended); corrupt its layer-1 shard on disk.
	loc, ok, err := store.Index().Get(r.ids[2])
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	path, _ := store.SegmentPath(loc.Segment)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := loc.Offset + loc.Layout.ShardOffset(1) + 5
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	out, d, err := s.DecodeSparse(r, 4, newSparseMethod(t, s, 3), false)
	if err != nil || len(out) != 4 || d.LoadFailed == 0 || d.Loaded != d.Attended || !errors.Is(d.LoadErr, engine.ErrCorrupt) {
		t.Fatalf("%q %+v %v", out, d, err)
	}
}
