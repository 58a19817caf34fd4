package sparse

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"gopkg.in/yaml.v3"
)

func parseBlendDoc(t *testing.T, doc string) (*BlendConfig, error) {
	t.Helper()
	var block map[string]yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &block); err != nil {
		t.Fatal(err)
	}
	cfg, err := Choose(block, nil, "")
	if err != nil {
		return nil, err
	}
	return cfg.(*BlendConfig), nil
}

// TestBlendConfig: defaults, compute_meta's forms, and every bad key named.
func TestBlendConfig(t *testing.T) {
	c, err := parseBlendDoc(t, "Blend: {}")
	if err != nil {
		t.Fatal(err)
	}
	if c.ChunkSize != 64 || c.MinMatchRatio != 0.8 || !c.PositionCorrection || c.RecomputeBoundary != 2 || c.RopeTheta != 10000 || c.ComputeMeta[1] != 0.15 || c.RopePairing != "neox" {
		t.Fatalf("defaults: %+v", c)
	}
	c, err = parseBlendDoc(t, "Blend: {compute_meta: {0: {ratio: 0.1}, model.layers.2.self_attn: 0.05, 3: {}}, hkvd_threshold: 0.3, position_correction: false, rope_pairing: interleaved}")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.ComputeMeta) != 3 || c.ComputeMeta[0] != 0.1 || c.ComputeMeta[2] != 0.05 || c.ComputeMeta[3] != 0.3 || c.PositionCorrection || c.RopePairing != "interleaved" {
		t.Fatalf("parsed: %+v", c)
	}
	for doc, key := range map[string]string{
		"Blend: {blend_chunk_size: 0}":                      "blend_chunk_size",
		"Blend: {min_match_ratio: 1.5}":                     "min_match_ratio",
		"Blend: {recompute_boundary: -1}":                   "recompute_boundary",
		"Blend: {rope_theta: .nan}":                         "rope_theta",
		"Blend: {head_dim: 7}":                              "head_dim",
		"Blend: {rope_pairing: gptj}":                       "rope_pairing",
		"Blend: {position_correction: maybe}":               "position_correction",
		"Blend: {compute_meta: {1: {ratio: 2}}}":            "compute_meta.1",
		"Blend: {compute_meta: {x: 0.1}}":                   "compute_meta.x",
		"Blend: {compute_meta: {1: 0.1, layers.1: 0.2}}":    "compute_meta.layers.1",
		"Blend: {compute_meta: {1: {ratio: 0.1, rate: 1}}}": "compute_meta.1.rate",
		"Blend: {compute_meta: [1]}":                        "compute_meta",
		"Blend: {hkvd_threshold: 3}":                        "hkvd_threshold",
		"Blend: {chunk: 64}":                                "Blend.chunk",
	} {
		_, err := parseBlendDoc(t, doc)
		var ce *ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) || !strings.HasSuffix(ce.Key, key) {
			t.Errorf("%s: %v, want a ConfigError on %s", doc, err, key)
		}
	}
	// New checks the configuration against the model.
	shape := Shape{Layers: 4, QHeads: 8, KVHeads: 2, HeadDim: 32, BlockSize: 16}
	m, err := New(DefaultBlendConfig(), Env{Role: RoleWorker, Shape: shape})
	if err != nil {
		t.Fatal(err)
	}
	if b := m.(*Blend); b.Name() != NameBlend || b.Config().HeadDim != 32 {
		t.Fatalf("built %+v", b.Config())
	}
	for name, mod := range map[string]func(*BlendConfig){
		"chunk not whole blocks": func(c *BlendConfig) { c.ChunkSize = 40 },
		"layer beyond the model": func(c *BlendConfig) { c.ComputeMeta = map[int]float64{4: 0.1} },
		"head dim not the model": func(c *BlendConfig) { c.HeadDim = 64 },
	} {
		c := DefaultBlendConfig()
		mod(c)
		if _, err := New(c, Env{Role: RoleWorker, Shape: shape}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// chainHasher is a ChainHasher for the tests: id[i] = MD5(id[i-1] ‖ LE32 of each token of
// block i), from the seed MD5("test") (the connector's hasher is connector/ucmhash, above
// sparse).
type chainHasher struct{ bs int }

func (h chainHasher) BlockTokens() int { return h.bs }

func (h chainHasher) Seed() engine.BlockID { return md5.Sum([]byte("test")) }

func (h chainHasher) BlockIDs(tokens []uint32, parent *engine.BlockID) []engine.BlockID {
	prev := h.Seed()
	if parent != nil {
		prev = *parent
	}
	var ids []engine.BlockID
	for i := 0; i+h.bs <= len(tokens); i += h.bs {
		b := append([]byte(nil), prev[:]...)
		for _, t := range tokens[i : i+h.bs] {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
		prev = md5.Sum(b)
		ids = append(ids, prev)
	}
	return ids
}

func testHasher(t testing.TB, bs int) ChainHasher {
	t.Helper()
	if bs < 1 {
		t.Fatalf("block size %d", bs)
	}
	return chainHasher{bs: bs}
}

func u32(t []int) []uint32 {
	out := make([]uint32, len(t))
	for i, v := range t {
		out[i] = uint32(v)
	}
	return out
}

// TestChunkBlockIDs: a chunk's ids do not depend on where it is or what precedes it, differ
// from the prefix chain's, and change from the block of a changed token on.
func TestChunkBlockIDs(t *testing.T) {
	h := testHasher(t, 4)
	rng := rand.New(rand.NewPCG(5, 6))
	a, chunk := make([]int, 40), make([]int, 16)
	for i := range a {
		a[i] = rng.IntN(256)
	}
	for i := range chunk {
		chunk[i] = rng.IntN(256)
	}
	p1 := append(slices.Clone(a[:8]), chunk...)
	p2 := append(slices.Clone(a[:24]), chunk...)
	id1 := ChunkBlockIDs(h, u32(p1[8:]))
	id2 := ChunkBlockIDs(h, u32(p2[24:]))
	if len(id1) != 4 || !slices.Equal(id1, id2) {
		t.Fatalf("ids of the same chunk at offsets 8 and 24 differ")
	}
	prefix := h.BlockIDs(u32(chunk), nil)
	for i := range id1 {
		if id1[i] == prefix[i] || slices.Contains(h.BlockIDs(u32(p1), nil), id1[i]) {
			t.Fatalf("chunk id %d is a prefix-chain id", i)
		}
	}
	changed := slices.Clone(chunk)
	changed[9]++ // block 2
	id3 := ChunkBlockIDs(h, u32(changed))
	if id3[0] != id1[0] || id3[1] != id1[1] || id3[2] == id1[2] || id3[3] == id1[3] {
		t.Fatalf("one changed token in block 2 changed ids %v", []bool{id3[0] != id1[0], id3[1] != id1[1], id3[2] != id1[2], id3[3] != id1[3]})
	}
}

// TestClassify: 1 is FULL, [min, 1) PARTIAL, below NO, exactly at the thresholds.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		r    float64
		want MatchKind
	}{{1, FullMatch}, {0.8, PartialMatch}, {0.99999, PartialMatch}, {0.79999, NoMatch}, {0, NoMatch}} {
		if got := Classify(c.r, 0.8); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.r, got, c.want)
		}
	}
	if FullMatch.String() != "FULL_MATCH" || NoMatch.String() != "NO_MATCH" {
		t.Fatal(FullMatch.String())
	}
}

// TestChunkMatch: chunks tile the prompt; a chunk stored at another offset is FULL; one with a
// few tokens changed PARTIAL; random tokens NO; a missing block in the store turns a match into
// none; every ratio is the brute-force best over sources and offsets; Hits map each reused
// token to the stored copy of the same token.
func TestChunkMatch(t *testing.T) {
	const bs, chunk = 4, 16
	h := testHasher(t, bs)
	x, err := NewChunkIndex(h, chunk)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewChunkIndex(h, 18); !errors.Is(err, ErrInvalid) {
		t.Fatalf("chunk of 18 in blocks of 4: %v", err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	rnd := func(n, alpha int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = rng.IntN(alpha)
		}
		return out
	}
	src0, src1 := rnd(64, 50), rnd(48, 50)
	where := map[engine.BlockID][3]int{} // block id → source, chunk, block
	for s, src := range [][]int{src0, src1} {
		si, ids, err := x.Add(src)
		if err != nil || si != s || len(ids) != len(src)/chunk {
			t.Fatal(si, len(ids), err)
		}
		for c, cids := range ids {
			for b, id := range cids {
				where[id] = [3]int{s, c, b}
			}
		}
	}
	partial := slices.Clone(src0[16:32])
	partial[5], partial[11] = 999, 998 // 14/16 = 0.875
	prompt := slices.Concat(src1[32:48], rnd(16, 1000), partial, src0[0:16], src0[40:56], rnd(7, 50))
	ms := x.Match(prompt, 0.8, nil)
	next := 0
	for i, m := range ms {
		if m.Start != next || m.Len < 1 || m.Len > chunk {
			t.Fatalf("chunk %d: %+v does not tile", i, m)
		}
		next += m.Len
		// Brute force: the best ratio over every source and offset.
		ch := prompt[m.Start : m.Start+m.Len]
		best := 0
		for _, src := range [][]int{src0, src1} {
			for o := 0; o+len(ch) <= len(src); o++ {
				eq := 0
				for j, v := range ch {
					if src[o+j] == v {
						eq++
					}
				}
				best = max(best, eq)
			}
		}
		if want := float64(best) / float64(len(ch)); m.Ratio != want {
			t.Errorf("chunk %d ratio %v, brute force %v", i, m.Ratio, want)
		}
	}
	if next != len(prompt) {
		t.Fatalf("chunks cover %d of %d", next, len(prompt))
	}
	kinds := []MatchKind{FullMatch, NoMatch, PartialMatch, FullMatch, FullMatch, NoMatch}
	for i, k := range kinds {
		if ms[i].Kind != k {
			t.Errorf("chunk %d: %v, want %v (%+v)", i, ms[i].Kind, k, ms[i])
		}
	}
	if ms[0].Source != 1 || ms[0].SourceStart != 32 || ms[4].Source != 0 || ms[4].SourceStart != 40 {
		t.Errorf("sources: %+v %+v", ms[0], ms[4])
	}
	hit, src := x.Hits(prompt, ms, 2)
	for tk := range prompt {
		m := ms[tk/chunk]
		i := tk - m.Start
		want := m.Kind == FullMatch || m.Kind == PartialMatch && i >= 2 && i < m.Len-2 && i != 5 && i != 11
		if hit[tk] != want {
			t.Fatalf("token %d (chunk %v, %d in it): hit %v", tk, m.Kind, i, hit[tk])
		}
		if !hit[tk] {
			continue
		}
		w, ok := where[src[tk].Block]
		if !ok {
			t.Fatalf("token %d: block not stored", tk)
		}
		sp := w[1]*chunk + w[2]*bs + src[tk].Offset
		if got := x.Source(w[0])[sp]; got != prompt[tk] || src[tk].RefPos != sp%chunk {
			t.Fatalf("token %d: stored token %d (want %d), ref %d", tk, got, prompt[tk], src[tk].RefPos)
		}
	}
	// A block missing from the store: no match for the chunks that need it.
	gone := ChunkBlockIDs(h, u32(src0[0:16]))[2]
	ms2 := x.Match(prompt, 0.8, func(ids []engine.BlockID) []bool {
		out := make([]bool, len(ids))
		for i, id := range ids {
			out[i] = id != gone
		}
		return out
	})
	if ms2[3].Kind != NoMatch || ms2[0].Kind != FullMatch {
		t.Fatalf("with a block gone: %v %v", ms2[3].Kind, ms2[0].Kind)
	}
	// A presence check answering for fewer blocks than asked: no match by it.
	short := x.Match(prompt, 0.8, func(ids []engine.BlockID) []bool { return []bool{true} })
	if short[0].Kind != NoMatch {
		t.Fatalf("short presence answer: %v", short[0].Kind)
	}
	if x.Source(-1) != nil || x.Source(2) != nil {
		t.Fatal("unknown sources")
	}
	// No matches: no hits.
	hit, _ = x.Hits(prompt, nil, 2)
	if slices.Contains(hit, true) {
		t.Fatal("hits without matches")
	}
}

// hkvdRef is HKVD the long way: sort the candidates by diff descending, ties to the lower row.
func hkvdRef(rows []int, hit []bool, fresh, cached []float32, width int, ratio float64) []int {
	type c struct {
		row  int
		diff float64
	}
	var cs []c
	var keep []int
	for i, r := range rows {
		if !hit[r] {
			keep = append(keep, r)
			continue
		}
		var d float64
		for j := range width {
			v := float64(cached[i*width+j]) - float64(fresh[i*width+j])
			if v < 0 {
				v = -v
			}
			d += v
		}
		cs = append(cs, c{r, d})
	}
	sort.SliceStable(cs, func(a, b int) bool { return cs[a].diff > cs[b].diff })
	for _, x := range cs[:int(float64(len(cs))*ratio)] {
		keep = append(keep, x.row)
	}
	slices.Sort(keep)
	return keep
}

// TestHKVD: ⌊candidates·ratio⌋ reused tokens recomputed, every token without a hit kept,
// equal to a brute-force sort (with ties); bad input is ErrInvalid.
func TestHKVD(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const width = 6
	for trial := range 200 {
		T := 1 + rng.IntN(60)
		hit := make([]bool, T)
		var rows []int
		for i := range T {
			hit[i] = rng.IntN(4) != 0
			if rng.IntN(5) != 0 {
				rows = append(rows, i)
			}
		}
		fresh, cached := make([]float32, len(rows)*width), make([]float32, len(rows)*width)
		for i := range fresh {
			fresh[i] = float32(rng.IntN(3)) // many ties
			cached[i] = float32(rng.IntN(3))
		}
		ratio := []float64{0, 0.1, 0.15, 0.5, 1, rng.Float64()}[trial%6]
		got, err := HKVD(rows, hit, fresh, cached, width, ratio)
		if err != nil {
			t.Fatal(err)
		}
		want := hkvdRef(rows, hit, fresh, cached, width, ratio)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: %v, brute force %v", trial, got, want)
		}
		cand, misses := 0, 0
		for _, r := range rows {
			if hit[r] {
				cand++
			} else {
				misses++
				if !slices.Contains(got, r) {
					t.Fatalf("token %d without a hit not recomputed", r)
				}
			}
		}
		if len(got) != misses+int(float64(cand)*ratio) {
			t.Fatalf("recomputed %d, want %d + ⌊%d·%v⌋", len(got), misses, cand, ratio)
		}
	}
	for name, c := range map[string]struct {
		rows  []int
		hit   []bool
		n     int
		ratio float64
	}{
		"short fresh":  {[]int{0, 1}, []bool{true, true}, 1, 0.5},
		"descending":   {[]int{1, 0}, []bool{true, true}, 2, 0.5},
		"out of range": {[]int{0, 5}, []bool{true, true}, 2, 0.5},
		"negative":     {[]int{-1, 0}, []bool{true, true}, 2, 0.5},
		"ratio":        {[]int{0, 1}, []bool{true, true}, 2, 1.5},
	} {
		if _, err := HKVD(c.rows, c.hit, make([]float32, c.n*2), make([]float32, c.n*2), 2, c.ratio); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestMaskMeta: query_lens count the mask, query_start_loc is their prefix sums from 0,
// num_actual_tokens their sum, the slot mapping the masked slots in order, and the logits
// indices query_start_loc[1:] − 1.
func TestMaskMeta(t *testing.T) {
	masks := [][]bool{{true, false, true, true}, {false, true}, {true, true, true}}
	slots := [][]int{{10, 11, 12, 13}, {20, 21}, {30, 31, 32}}
	m, err := MaskMeta(masks, slots)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.QueryLens, []int{3, 1, 3}) || !slices.Equal(m.QueryStartLoc, []int{0, 3, 4, 7}) || m.NumActualTokens != 7 ||
		!slices.Equal(m.SlotMapping, []int{10, 12, 13, 21, 30, 31, 32}) || !slices.Equal(m.LogitsIndices(), []int{2, 3, 6}) {
		t.Fatalf("%+v, logits %v", m, m.LogitsIndices())
	}
	if len(m.SlotMapping) != m.NumActualTokens {
		t.Fatal("slot mapping length")
	}
	if _, err := MaskMeta(masks, slots[:2]); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := MaskMeta([][]bool{{true}}, [][]int{{1, 2}}); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

// TestBlendMethod: AttentionBegin recomputes by HKVD in compute_meta layers only (other
// layers, decode steps and calls without Recompute untouched); a request without hits
// recomputes everything; ExecuteFinished answers the bound metadata's logits indices.
func TestBlendMethod(t *testing.T) {
	shape := Shape{Layers: 3, QHeads: 2, KVHeads: 1, HeadDim: 4, BlockSize: 4}
	c := DefaultBlendConfig()
	c.ChunkSize, c.ComputeMeta = 8, map[int]float64{1: 0.5}
	b, err := NewBlend(*c, shape)
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewChunkIndex(testHasher(t, 4), 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.UseIndex(x, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.Add([]int{1, 2, 3, 4, 5, 6, 7, 8}); err != nil {
		t.Fatal(err)
	}
	prompt := []int{9, 9, 9, 9, 9, 9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	req := &Request{ID: "r", PromptTokens: prompt}
	b.RequestBegin("r", prompt)
	ms, hit, _ := b.Plan("r")
	if len(ms) != 2 || ms[1].Kind != FullMatch || slices.Index(hit, true) != 8 {
		t.Fatalf("plan %+v %v", ms, hit)
	}
	rows := make([]int, len(prompt))
	for i := range rows {
		rows[i] = i
	}
	fresh, cached := make([]float32, len(rows)*4), make([]float32, len(rows)*4)
	for i := range fresh {
		fresh[i] = float32(i % 7)
	}
	pick := b.Pick(req)
	for layer := range 3 {
		keep, err := pick(layer, rows, fresh, cached)
		if err != nil {
			t.Fatal(err)
		}
		if layer != 1 && !slices.Equal(keep, rows) {
			t.Fatalf("layer %d not in compute_meta changed the rows: %v", layer, keep)
		}
		if layer == 1 {
			want, _ := HKVD(rows, hit, fresh, cached, 4, 0.5)
			if !slices.Equal(keep, want) || len(keep) != 9+4 {
				t.Fatalf("layer 1: %v, want %v", keep, want)
			}
		}
	}
	a := &Attention{Layer: 1, Phase: PhaseDecode, Request: req, Recompute: &Recompute{Rows: rows, Fresh: fresh, Cached: cached}}
	if err := b.AttentionBegin(a); err != nil || !slices.Equal(a.Recompute.Keep, rows) {
		t.Fatalf("decode: %v %v", a.Recompute.Keep, err)
	}
	if err := b.AttentionBegin(&Attention{Layer: 1, Phase: PhasePrefill, Request: req}); err != nil {
		t.Fatal(err)
	}
	if _, err := pick(1, rows, fresh[:4], cached); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad keys: %v", err)
	}
	b.RequestFinished("r")
	if keep, err := pick(1, rows, fresh, cached); err != nil || !slices.Equal(keep, rows) {
		t.Fatalf("finished request: %v %v", keep, err)
	}
	// Tokens from the chunk end on are never reused, even where they match; RequestBegin
	// leaves the last token out.
	b.RequestBeginChunks("q", prompt, 12)
	if _, hit, _ := b.Plan("q"); slices.Index(hit, true) != 8 || slices.Contains(hit[12:], true) {
		t.Fatalf("chunk end 12: %v", hit)
	}
	b.RequestBeginChunks("q", prompt, 99)
	if _, hit, _ := b.Plan("q"); len(hit) != len(prompt) || hit[15] != true {
		t.Fatalf("chunk end past the prompt: %v", hit)
	}
	tail := append(slices.Clone(prompt[:8]), 1, 2, 3, 4, 5, 6, 7, 8)
	b.RequestBegin("t", tail)
	if _, hit, _ := b.Plan("t"); hit[15] || !hit[8] {
		t.Fatalf("RequestBegin reused the last token: %v", hit)
	}
	// No index: no hits.
	b2, _ := NewBlend(*c, shape)
	b2.RequestBegin("r", prompt)
	if _, hit, _ := b2.Plan("r"); slices.Contains(hit, true) {
		t.Fatal("hits without an index")
	}
	if got := b.ExecuteFinished([]int{5}); !slices.Equal(got, []int{5}) {
		t.Fatal(got)
	}
	meta, _ := MaskMeta([][]bool{{true, false, true}}, [][]int{{0, 1, 2}})
	b.BindSparseMetadata(&meta)
	if got := b.ExecuteFinished([]int{5}); !slices.Equal(got, []int{1}) {
		t.Fatal(got)
	}
	if err := b.UseIndex(&ChunkIndex{chunk: 16}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

// FuzzBlendInputs: HKVD over any rows, hits, keys and ratio, and Hits over any matches
// against an index, return a valid answer or ErrInvalid, never a panic: HKVD's answer is an
// ascending subset of the rows holding every row without a hit; Hits reuses only tokens equal
// to the stored ones.
func FuzzBlendInputs(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(3), 0.5)
	f.Add([]byte{9, 3, 3, 200, 1}, uint8(1), 1.0)
	f.Add([]byte{}, uint8(0), 0.0)
	h := testHasher(f, 4)
	x, err := NewChunkIndex(h, 8)
	if err != nil {
		f.Fatal(err)
	}
	_, ids, err := x.Add([]int{1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 9})
	if err != nil {
		f.Fatal(err)
	}
	start := map[engine.BlockID]int{} // block id → its first token in the source
	for c, cids := range ids {
		for bi, id := range cids {
			start[id] = c*8 + bi*4
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, width uint8, ratio float64) {
		w := int(width%8) + 1
		T := 0
		if len(b) > 0 {
			T = int(b[0] % 40)
		}
		hit := make([]bool, T)
		var rows []int
		for i := 1; i < len(b) && len(rows) < 64; i++ {
			rows = append(rows, int(b[i])-20) // out of range, unordered: to be refused
			if int(b[i]) < T {
				hit[int(b[i])] = b[i]%2 == 0
			}
		}
		fresh := make([]float32, len(rows)*w)
		for i := range fresh {
			fresh[i] = float32(b[i%max(1, len(b))])
		}
		keep, err := HKVD(rows, hit, fresh, make([]float32, len(fresh)), w, ratio)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatal(err)
			}
		} else {
			for i, r := range keep {
				if !slices.Contains(rows, r) || i > 0 && r <= keep[i-1] {
					t.Fatalf("keep %v not an ascending subset of %v", keep, rows)
				}
			}
			for _, r := range rows {
				if !hit[r] && !slices.Contains(keep, r) {
					t.Fatalf("row %d without a hit dropped", r)
				}
			}
		}
		prompt := make([]int, len(b))
		for i, v := range b {
			prompt[i] = int(v % 10)
		}
		var ms []ChunkMatch
		for i := 0; i+4 < len(b); i += 5 {
			ms = append(ms, ChunkMatch{Start: int(b[i]) - 5, Len: int(b[i+1]), Kind: MatchKind(b[i+2] % 3), Source: int(b[i+3]%3) - 1, SourceStart: int(b[i+4]) - 5})
		}
		hits, src := x.Hits(prompt, append(ms, x.Match(prompt, 0.5, nil)...), int(width%5))
		for tk, ok := range hits {
			if !ok {
				continue
			}
			p, known := start[src[tk].Block]
			if p += src[tk].Offset; !known || x.Source(0)[p] != prompt[tk] || src[tk].RefPos != p%8 {
				t.Fatalf("token %d (%d) reused from %+v", tk, prompt[tk], src[tk])
			}
		}
	})
}
