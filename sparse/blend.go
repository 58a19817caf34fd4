package sparse

import (
	"crypto/md5"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/ucm-go/ucm/engine"
	"gopkg.in/yaml.v3"
)

// Blend (sources §6): reuse of stored KV for chunks of a prompt that are not its prefix (RAG: the
// same documents at other offsets, after other documents). Three parts:
//
//   - chunk matching (§6B): the prompt is cut into chunks; a chunk's stored blocks have ids
//     hashed from the chunk's tokens only (ChunkBlockIDs), not from what precedes it, so a
//     chunk stored at one offset is found at any other; chunks not found by id are compared
//     position by position with the stored token sequences (ChunkIndex.Match: FULL, PARTIAL,
//     NO match);
//   - position correction (§6B): stored K is post-RoPE; it is rotated from the position it was
//     stored at to the position it is reused at (RoPE.Rotate), which is exact;
//   - HKVD selective recompute (§6A): in the layers of compute_meta, the reused tokens whose
//     fresh K deviates most from the reused K are recomputed (HKVD), the others keep the reused
//     K/V; tokens without a hit are always computed. lab/model's ForwardRecompute runs a
//     prefill that way, with Blend's AttentionBegin choosing the rows.

// BlendConfig configures Blend (sources §6).
type BlendConfig struct {
	// ChunkSize is the tokens per chunk (blend_chunk_size); a multiple of the block size.
	ChunkSize int
	// MinMatchRatio is the fraction of equal positions a PARTIAL match needs (min_match_ratio).
	MinMatchRatio float64
	// PositionCorrection rotates reused K to their new positions (position_correction).
	PositionCorrection bool
	// RecomputeBoundary is the tokens at each end of a PARTIAL chunk recomputed
	// (recompute_boundary).
	RecomputeBoundary int
	// RopeTheta is the model's RoPE base (rope_theta); HeadDim its head dim (head_dim; 0: the
	// model shape's); RopePairing "neox" (default, HF Llama's) or "interleaved" (UCM-Go key
	// rope_pairing; sources §6B [DECISION]).
	RopeTheta   float64
	HeadDim     int
	RopePairing string
	// ComputeMeta is compute_meta: the layers that select, each with the fraction of its
	// reused candidate tokens recomputed. Unlisted layers keep the previous selection.
	ComputeMeta map[int]float64
	// HKVDThreshold is hkvd_threshold: the ratio of a compute_meta layer given without one.
	HKVDThreshold float64
}

// Method returns NameBlend.
func (*BlendConfig) Method() string { return NameBlend }

// Validate checks the values.
func (c *BlendConfig) Validate() error {
	p := "ucm_sparse_config." + NameBlend
	switch {
	case c.ChunkSize < 1 || c.ChunkSize > 1<<16:
		return configErr(p+".blend_chunk_size", "%d: want a token count in [1, 65536]", c.ChunkSize)
	case !(c.MinMatchRatio > 0 && c.MinMatchRatio <= 1):
		return configErr(p+".min_match_ratio", "%v: want a fraction in (0, 1]", c.MinMatchRatio)
	case c.RecomputeBoundary < 0 || c.RecomputeBoundary > c.ChunkSize:
		return configErr(p+".recompute_boundary", "%d: want a token count in [0, blend_chunk_size]", c.RecomputeBoundary)
	case !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0):
		return configErr(p+".rope_theta", "%v: want a finite number > 1", c.RopeTheta)
	case c.HeadDim < 0 || c.HeadDim%2 != 0 || c.HeadDim > 1<<14:
		return configErr(p+".head_dim", "%d: want an even number (0: the model's)", c.HeadDim)
	case !(c.HKVDThreshold >= 0 && c.HKVDThreshold <= 1):
		return configErr(p+".hkvd_threshold", "%v: want a fraction in [0, 1]", c.HKVDThreshold)
	}
	if _, err := ParsePairing(c.RopePairing); err != nil {
		return configErr(p+".rope_pairing", "%q: want neox or interleaved", c.RopePairing)
	}
	for l, r := range c.ComputeMeta {
		if l < 0 || l > 1<<16 || !(r >= 0 && r <= 1) {
			return configErr(p+".compute_meta."+strconv.Itoa(l), "ratio %v: want a layer ≥ 0 and a fraction in [0, 1]", r)
		}
	}
	return nil
}

// DefaultBlendConfig is 003's defaults (chunk 64, ratio 0.8, correction on, boundary 2,
// θ 10000) with NeoX pairing, the head dim of the model, and compute_meta {1: 0.15}: layer 0's
// K does not depend on the context (only on the token and, through RoPE, its position), so
// its deviation says nothing; layer 1 is the first whose deviation does (CacheBlend selects
// there).
func DefaultBlendConfig() *BlendConfig {
	return &BlendConfig{ChunkSize: 64, MinMatchRatio: 0.8, PositionCorrection: true, RecomputeBoundary: 2,
		RopeTheta: 10000, RopePairing: "neox", ComputeMeta: map[int]float64{1: 0.15}, HKVDThreshold: 0.1}
}

func boolField(dst *bool, keys ...string) field {
	return field{keys: keys, set: func(key string, v *yaml.Node) error {
		var x bool
		if v.Kind != yaml.ScalarNode || v.Decode(&x) != nil {
			return configErr(key, "%q: want true or false", short(v))
		}
		*dst = x
		return nil
	}}
}

// computeMetaField parses compute_meta: a mapping of layers (an index, or a name
// "model.layers.<n>…") to {ratio: r} (or a bare ratio); a layer without ratio takes
// hkvd_threshold's (resolved after the block is parsed: ratio −1 marks it).
func computeMetaField(dst *map[int]float64) field {
	return field{keys: []string{"compute_meta"}, set: func(key string, v *yaml.Node) error {
		if v.Kind != yaml.MappingNode {
			return configErr(key, "want a mapping of layers to {ratio: r}")
		}
		out := map[int]float64{}
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, val := v.Content[i], v.Content[i+1]
			lkey := key + "." + k.Value
			l, err := strconv.Atoi(k.Value)
			if err != nil {
				if l, err = LayerID(k.Value); err != nil {
					return configErr(lkey, "want a layer index or a name model.layers.<n>…")
				}
			}
			if _, dup := out[l]; dup {
				return configErr(lkey, "layer %d given twice", l)
			}
			ratio := -1.0
			switch {
			case val.Kind == yaml.ScalarNode && val.Tag != "!!null":
				if err := floatField(&ratio).set(lkey, val); err != nil {
					return err
				}
			case val.Kind == yaml.MappingNode:
				if err := parseFields(lkey, val, []field{floatField(&ratio, "ratio")}); err != nil {
					return err
				}
			case val.Kind != yaml.ScalarNode:
				return configErr(lkey, "want {ratio: r}")
			}
			out[l] = ratio
		}
		*dst = out
		return nil
	}}
}

func parseBlend(key string, node *yaml.Node) (MethodConfig, error) {
	c := DefaultBlendConfig()
	var meta map[int]float64
	err := parseFields(key, node, []field{
		intField(&c.ChunkSize, "blend_chunk_size"),
		floatField(&c.MinMatchRatio, "min_match_ratio"),
		boolField(&c.PositionCorrection, "position_correction"),
		intField(&c.RecomputeBoundary, "recompute_boundary"),
		floatField(&c.RopeTheta, "rope_theta"),
		intField(&c.HeadDim, "head_dim"),
		stringField(&c.RopePairing, "rope_pairing"),
		computeMetaField(&meta),
		floatField(&c.HKVDThreshold, "hkvd_threshold"),
	})
	if err != nil {
		return nil, err
	}
	if meta != nil {
		for l, r := range meta {
			if r < 0 {
				meta[l] = c.HKVDThreshold
			}
		}
		c.ComputeMeta = meta
	}
	return c, nil
}

// ---------------------------------------------------------------------------------------------
// Chunk ids and matching (sources §6B).

// blendSeedSuffix derives the chunk chains' seed from a hasher's.
const blendSeedSuffix = "UCMBLENDCHUNK"

// ChainHasher is what Blend needs of the connector's token hasher (connector/ucmhash's Hasher
// is one): its block size, its chain's seed, and the ids of the full blocks of tokens chained
// from a parent. BlockIDs must be deterministic and give no id to a trailing partial block.
type ChainHasher interface {
	// BlockTokens is the tokens per block, >= 1.
	BlockTokens() int
	// Seed is the parent of a chain's first block.
	Seed() engine.BlockID
	// BlockIDs returns one id per full block of tokens, chained from parent (nil: the seed).
	BlockIDs(tokens []uint32, parent *engine.BlockID) []engine.BlockID
}

// ChunkBlockIDs returns the ids of a chunk's blocks (h's block size; a trailing partial block
// has none): a chain hashed from the chunk's tokens only, seeded by a Blend seed derived from
// h's, so that a chunk has the same ids at every offset of every prompt and never the ids of
// a prefix block.
func ChunkBlockIDs(h ChainHasher, chunk []uint32) []engine.BlockID {
	seed := h.Seed()
	s := engine.BlockID(md5.Sum(append(seed[:], blendSeedSuffix...)))
	return h.BlockIDs(chunk, &s)
}

// MatchKind is a chunk's match (sources §6B).
type MatchKind int

// Match kinds.
const (
	// NoMatch: no stored chunk agrees on at least min_match_ratio of the positions.
	NoMatch MatchKind = iota
	// PartialMatch: a stored chunk agrees on at least min_match_ratio of the positions, not
	// all; the differing tokens and RecomputeBoundary tokens at each end are recomputed.
	PartialMatch
	// FullMatch: a stored chunk holds these tokens.
	FullMatch
)

// String returns NO_MATCH, PARTIAL_MATCH or FULL_MATCH.
func (k MatchKind) String() string {
	return [...]string{"NO_MATCH", "PARTIAL_MATCH", "FULL_MATCH"}[k]
}

// Classify is the match kind of a ratio of equal positions: 1 FULL, [min, 1) PARTIAL, else NO.
func Classify(ratio, minRatio float64) MatchKind {
	switch {
	case ratio >= 1:
		return FullMatch
	case ratio >= minRatio:
		return PartialMatch
	}
	return NoMatch
}

// ChunkMatch is one chunk of a prompt and where its K/V can be reused from.
type ChunkMatch struct {
	// Start and Len are the chunk's tokens in the prompt.
	Start, Len int
	// Kind and Ratio (the fraction of equal positions) of the best match.
	Kind  MatchKind
	Ratio float64
	// Source and SourceStart locate the matched tokens in the index (ChunkIndex.Source); -1
	// without a match.
	Source, SourceStart int
}

// TokenSource is where one reused token's K/V is stored: block Block, token Offset of it,
// with K rotated to position RefPos (its offset in its stored chunk: chunks are stored as if
// they started at position 0).
type TokenSource struct {
	Block  engine.BlockID
	Offset int
	RefPos int
}

// ChunkIndex is the token index of the sources whose chunks are stored (sources §6B "cached
// blocks' token IDs"): for each, its tokens and its chunks' block ids. It is safe for
// concurrent use.
type ChunkIndex struct {
	h     ChainHasher
	chunk int
	mu    sync.RWMutex
	srcs  [][]int
	ids   [][][]engine.BlockID // [source][chunk] block ids
	byID  map[engine.BlockID][2]int
	maxSz int
}

// MaxIndexTokens bounds the tokens a ChunkIndex holds.
const MaxIndexTokens = 1 << 24

// NewChunkIndex returns an empty index of chunks of chunkSize tokens, hashed with h (whose
// block size must divide chunkSize).
func NewChunkIndex(h ChainHasher, chunkSize int) (*ChunkIndex, error) {
	if h == nil || chunkSize < 1 || chunkSize%h.BlockTokens() != 0 {
		bs := 0
		if h != nil {
			bs = h.BlockTokens()
		}
		return nil, fmt.Errorf("%w: blend: chunk of %d tokens is not whole blocks of %d", ErrInvalid, chunkSize, bs)
	}
	return &ChunkIndex{h: h, chunk: chunkSize, byID: map[engine.BlockID][2]int{}}, nil
}

// ChunkSize is the tokens per chunk.
func (x *ChunkIndex) ChunkSize() int { return x.chunk }

// Add records a source, tokens whose whole chunks the caller stores (a trailing partial chunk
// is not indexed), and returns its number and, per chunk, the ids to store the chunk's blocks
// under (ChunkBlockIDs), K rotated to the chunk's own offsets (position − chunk start).
func (x *ChunkIndex) Add(tokens []int) (int, [][]engine.BlockID, error) {
	n := len(tokens) / x.chunk * x.chunk
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.maxSz+n > MaxIndexTokens {
		return 0, nil, fmt.Errorf("%w: blend: index full (%d tokens)", ErrInvalid, x.maxSz)
	}
	src := slices.Clone(tokens[:n])
	buf := make([]uint32, x.chunk)
	ids := make([][]engine.BlockID, n/x.chunk)
	si := len(x.srcs)
	for c := range ids {
		for i, t := range src[c*x.chunk : (c+1)*x.chunk] {
			buf[i] = uint32(t)
		}
		ids[c] = ChunkBlockIDs(x.h, buf)
		last := ids[c][len(ids[c])-1]
		if _, ok := x.byID[last]; !ok {
			x.byID[last] = [2]int{si, c * x.chunk}
		}
	}
	x.srcs = append(x.srcs, src)
	x.ids = append(x.ids, ids)
	x.maxSz += n
	return si, ids, nil
}

// Source returns source s's tokens (not to be modified), nil for an unknown source.
func (x *ChunkIndex) Source(s int) []int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if s < 0 || s >= len(x.srcs) {
		return nil
	}
	return x.srcs[s]
}

// Match cuts prompt into chunks of ChunkSize tokens (the last may be shorter; chunks tile [0,
// len)) and finds each one's best stored match: first by id (a chunk stored anywhere, FULL),
// else by sliding it over every source, token by token, and counting equal positions (the
// first best wins: lowest source, then lowest offset). A match whose blocks present does not
// report all present (nil: all are) is not one. minRatio is min_match_ratio.
func (x *ChunkIndex) Match(prompt []int, minRatio float64, present func([]engine.BlockID) []bool) []ChunkMatch {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []ChunkMatch
	buf := make([]uint32, x.chunk)
	for start := 0; start < len(prompt); start += x.chunk {
		ch := prompt[start:min(start+x.chunk, len(prompt))]
		m := ChunkMatch{Start: start, Len: len(ch), Source: -1, SourceStart: -1}
		if len(ch) == x.chunk {
			for i, t := range ch {
				buf[i] = uint32(t)
			}
			ids := ChunkBlockIDs(x.h, buf)
			if loc, ok := x.byID[ids[len(ids)-1]]; ok && slices.Equal(x.srcs[loc[0]][loc[1]:loc[1]+x.chunk], ch) && x.allPresent(loc[0], loc[1], len(ch), present) {
				m.Kind, m.Ratio, m.Source, m.SourceStart = FullMatch, 1, loc[0], loc[1]
				out = append(out, m)
				continue
			}
		}
		best, bs, bo := -1, -1, -1
		for s, src := range x.srcs {
			for o := 0; o+len(ch) <= len(src); o++ {
				eq := 0
				for i, t := range ch {
					if src[o+i] == t {
						eq++
					}
				}
				if eq > best {
					best, bs, bo = eq, s, o
				}
			}
		}
		if best > 0 {
			ratio := float64(best) / float64(len(ch))
			if k := Classify(ratio, minRatio); k != NoMatch && x.allPresent(bs, bo, len(ch), present) {
				m.Kind, m.Ratio, m.Source, m.SourceStart = k, ratio, bs, bo
			} else {
				m.Ratio = ratio
			}
		}
		out = append(out, m)
	}
	return out
}

// allPresent reports whether the blocks holding source s's tokens [o, o+n) are all present.
func (x *ChunkIndex) allPresent(s, o, n int, present func([]engine.BlockID) []bool) bool {
	if present == nil {
		return true
	}
	var ids []engine.BlockID
	bs := x.h.BlockTokens()
	for p := o; p < o+n; p += bs - (p % bs) {
		ids = append(ids, x.ids[s][p/x.chunk][p%x.chunk/bs])
	}
	found := present(ids)
	if len(found) != len(ids) {
		return false // a presence check answering for other blocks answers for none
	}
	for _, ok := range found {
		if !ok {
			return false
		}
	}
	return true
}

// Hits turns matches into the prompt's reuse plan: hit[t] is true when token t's K/V are
// reused, from src[t]. FULL chunks are hits throughout; PARTIAL chunks at their equal
// positions except boundary tokens at each end; NO chunks nowhere.
func (x *ChunkIndex) Hits(prompt []int, matches []ChunkMatch, boundary int) (hit []bool, src []TokenSource) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	hit = make([]bool, len(prompt))
	src = make([]TokenSource, len(prompt))
	bs := x.h.BlockTokens()
	for _, m := range matches {
		if m.Kind == NoMatch || m.Source < 0 || m.Source >= len(x.srcs) || m.Start < 0 || m.Start+m.Len > len(prompt) || m.SourceStart < 0 || m.SourceStart+m.Len > len(x.srcs[m.Source]) {
			continue
		}
		for i := range m.Len {
			t, sp := m.Start+i, m.SourceStart+i
			if x.srcs[m.Source][sp] != prompt[t] {
				continue
			}
			if m.Kind == PartialMatch && (i < boundary || i >= m.Len-boundary) {
				continue
			}
			hit[t] = true
			src[t] = TokenSource{Block: x.ids[m.Source][sp/x.chunk][sp%x.chunk/bs], Offset: sp % bs, RefPos: sp % x.chunk}
		}
	}
	return hit, src
}

// ---------------------------------------------------------------------------------------------
// HKVD selective recompute (sources §6A).

// HKVD is the selection of one compute_meta layer: among rows (the tokens computed so far,
// ascending), the candidates are the reused ones (hit); diff[t] = Σ |cached[t] − fresh[t]|
// over the token's width elements (all KV heads × head dim); the ⌊candidates·ratio⌋ of largest
// diff (ties to the lower row) are kept, with every row that is not a hit. fresh and cached
// are [len(rows)][width]. The result is ascending.
func HKVD(rows []int, hit []bool, fresh, cached []float32, width int, ratio float64) ([]int, error) {
	if width < 1 || len(fresh) != len(rows)*width || len(cached) != len(fresh) || !(ratio >= 0 && ratio <= 1) {
		return nil, fmt.Errorf("%w: hkvd: %d rows of %d, %d fresh, %d cached, ratio %v", ErrInvalid, len(rows), width, len(fresh), len(cached), ratio)
	}
	var cand []int
	diff := make([]float64, len(rows))
	keep := make([]int, 0, len(rows))
	for i, r := range rows {
		if r < 0 || r >= len(hit) || (i > 0 && r <= rows[i-1]) {
			return nil, fmt.Errorf("%w: hkvd: row %d at %d (of %d tokens, ascending)", ErrInvalid, r, i, len(hit))
		}
		if !hit[r] {
			continue
		}
		var s float64
		f, c := fresh[i*width:(i+1)*width], cached[i*width:(i+1)*width]
		for j, v := range f {
			s += math.Abs(float64(c[j]) - float64(v))
		}
		diff[i] = s
		cand = append(cand, i)
	}
	k := int(float64(len(cand)) * ratio)
	sel := make([]bool, len(rows))
	if k > 0 {
		for _, i := range topK(cand, diff, k) {
			sel[i] = true
		}
	}
	for i, r := range rows {
		if !hit[r] || sel[i] {
			keep = append(keep, r)
		}
	}
	return keep, nil
}

// BlendMeta is the attention metadata of a masked prefill step (sources §6A): per request the
// tokens computed (query_lens), their prefix sums (query_start_loc, len(requests)+1 entries
// from 0), their total (num_actual_tokens) and the slot mapping of the computed tokens only.
type BlendMeta struct {
	QueryLens       []int
	QueryStartLoc   []int
	NumActualTokens int
	SlotMapping     []int
}

// MaskMeta builds the metadata of a step whose requests compute the tokens masks[r] selects,
// with slots[r] their full slot mappings (same lengths as the masks).
func MaskMeta(masks [][]bool, slots [][]int) (BlendMeta, error) {
	if len(masks) != len(slots) {
		return BlendMeta{}, fmt.Errorf("%w: blend: %d masks, %d slot mappings", ErrInvalid, len(masks), len(slots))
	}
	m := BlendMeta{QueryLens: make([]int, len(masks)), QueryStartLoc: make([]int, len(masks)+1)}
	for r, mask := range masks {
		if len(mask) != len(slots[r]) {
			return BlendMeta{}, fmt.Errorf("%w: blend: request %d: mask of %d, %d slots", ErrInvalid, r, len(mask), len(slots[r]))
		}
		for t, on := range mask {
			if on {
				m.QueryLens[r]++
				m.SlotMapping = append(m.SlotMapping, slots[r][t])
			}
		}
		m.QueryStartLoc[r+1] = m.QueryStartLoc[r] + m.QueryLens[r]
	}
	m.NumActualTokens = m.QueryStartLoc[len(masks)]
	return m, nil
}

// LogitsIndices is what execute_finished returns for the step: each request's last computed
// token, query_start_loc[1:] − 1.
func (m BlendMeta) LogitsIndices() []int {
	out := make([]int, len(m.QueryLens))
	for r := range out {
		out[r] = m.QueryStartLoc[r+1] - 1
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// The method.

// Recompute is a masked prefill layer's call into AttentionBegin (Attention.Recompute): the
// rows (indexes into the request's prompt) computed in the layer so far, their fresh K and the
// K reused at their positions, [len(Rows)][KVHeads·HeadDim]. AttentionBegin sets Keep, the
// rows that go on.
type Recompute struct {
	Rows          []int
	Fresh, Cached []float32
	Keep          []int
}

// Blend is the Blend method. Its scheduler side matches a request's chunks at RequestBegin
// (with the index given by UseIndex); its worker side selects, in a compute_meta layer of a
// prefill, the rows to recompute (AttentionBegin with a.Recompute), and ExecuteFinished returns
// query_start_loc[1:] − 1 of the step's masked metadata (MaskMeta, given to
// BindSparseMetadata).
type Blend struct {
	Base
	cfg     BlendConfig
	shape   Shape
	rope    RoPE
	layers  []int // compute_meta layers, ascending
	mu      sync.Mutex
	index   *ChunkIndex
	present func([]engine.BlockID) []bool
	reqs    map[string]*blendRequest
	meta    *BlendMeta
}

type blendRequest struct {
	matches []ChunkMatch
	hit     []bool
	src     []TokenSource
}

func init() {
	register(NameBlend, factory{
		parse: parseBlend,
		build: func(mc MethodConfig, env Env) (SparseMethod, error) {
			c := mc.(*BlendConfig)
			return NewBlend(*c, env.Shape)
		},
	})
}

// NewBlend builds Blend for a model shape: the chunk size must be whole blocks, head_dim (when
// set) the shape's, and the compute_meta layers the model's.
func NewBlend(c BlendConfig, s Shape) (*Blend, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	p := "ucm_sparse_config." + NameBlend
	if c.ChunkSize%s.BlockSize != 0 {
		return nil, configErr(p+".blend_chunk_size", "%d: not whole blocks of %d tokens", c.ChunkSize, s.BlockSize)
	}
	if c.HeadDim == 0 {
		c.HeadDim = s.HeadDim
	}
	if c.HeadDim != s.HeadDim {
		return nil, configErr(p+".head_dim", "%d: the model's is %d", c.HeadDim, s.HeadDim)
	}
	pair, _ := ParsePairing(c.RopePairing)
	b := &Blend{cfg: c, shape: s, rope: RoPE{Dim: c.HeadDim, Theta: c.RopeTheta, Pairing: pair}, reqs: map[string]*blendRequest{}}
	if err := b.rope.Validate(); err != nil {
		return nil, configErr(p+".head_dim", "%v", err)
	}
	for l := range c.ComputeMeta {
		if l >= s.Layers {
			return nil, configErr(p+".compute_meta."+strconv.Itoa(l), "the model has layers 0…%d", s.Layers-1)
		}
		b.layers = append(b.layers, l)
	}
	sort.Ints(b.layers)
	return b, nil
}

// Name returns NameBlend.
func (*Blend) Name() string { return NameBlend }

// Config returns the configuration Blend runs with (head_dim resolved).
func (b *Blend) Config() BlendConfig { return b.cfg }

// RoPE returns the rotation Blend corrects reused keys with.
func (b *Blend) RoPE() RoPE { return b.rope }

// UseIndex gives Blend the index of stored chunks and the store's presence check
// (engine.(*Engine).Lookup; nil: every indexed block is present).
func (b *Blend) UseIndex(x *ChunkIndex, present func([]engine.BlockID) []bool) error {
	if x != nil && x.ChunkSize() != b.cfg.ChunkSize {
		return fmt.Errorf("%w: blend: index of %d-token chunks, configured %d", ErrInvalid, x.ChunkSize(), b.cfg.ChunkSize)
	}
	b.mu.Lock()
	b.index, b.present = x, present
	b.mu.Unlock()
	return nil
}

// RequestBegin matches the prompt's chunks (nothing without an index): RequestBeginChunks
// with every token but the last in the chunk region (the last token is always computed: its
// logits are the step's answer).
func (b *Blend) RequestBegin(reqID string, prompt []int) {
	b.RequestBeginChunks(reqID, prompt, len(prompt)-1)
}

// RequestBeginChunks matches the chunks of prompt[:chunkEnd] (clipped to the prompt), the
// region of reused documents; the tokens from chunkEnd on (the query) are never reused, so
// always recomputed (sources §6A's [chunk_end, query_end)).
func (b *Blend) RequestBeginChunks(reqID string, prompt []int, chunkEnd int) {
	b.mu.Lock()
	x, present := b.index, b.present
	b.mu.Unlock()
	chunkEnd = max(0, min(chunkEnd, len(prompt)))
	r := &blendRequest{hit: make([]bool, len(prompt)), src: make([]TokenSource, len(prompt))}
	if x != nil && chunkEnd > 0 {
		r.matches = x.Match(prompt[:chunkEnd], b.cfg.MinMatchRatio, present)
		hit, src := x.Hits(prompt[:chunkEnd], r.matches, b.cfg.RecomputeBoundary)
		copy(r.hit, hit)
		copy(r.src, src)
	}
	b.mu.Lock()
	b.reqs[reqID] = r
	b.mu.Unlock()
}

// Plan returns a request's matches and reuse plan (RequestBegin's): hit[t] when token t's K/V
// are reused, from src[t]. Unknown requests have none.
func (b *Blend) Plan(reqID string) (matches []ChunkMatch, hit []bool, src []TokenSource) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.reqs[reqID]; ok {
		return r.matches, r.hit, r.src
	}
	return nil, nil, nil
}

// RequestFinishedInScheduler drops the request's plan.
func (b *Blend) RequestFinishedInScheduler(reqID string) { b.RequestFinished(reqID) }

// RequestFinished drops the request's plan.
func (b *Blend) RequestFinished(reqID string) {
	b.mu.Lock()
	delete(b.reqs, reqID)
	b.mu.Unlock()
}

// Ratio returns the recompute ratio of a compute_meta layer, and whether the layer selects.
func (b *Blend) Ratio(layer int) (float64, bool) {
	r, ok := b.cfg.ComputeMeta[layer]
	return r, ok
}

// AttentionBegin selects, for a prefill layer's Recompute call in a compute_meta layer, the
// rows to recompute (HKVD against the request's hits); other layers and calls keep every row.
func (b *Blend) AttentionBegin(a *Attention) error {
	rc := a.Recompute
	if rc == nil {
		return nil
	}
	ratio, ok := b.cfg.ComputeMeta[a.Layer]
	if !ok || a.Phase != PhasePrefill || a.Request == nil {
		rc.Keep = rc.Rows
		return nil
	}
	_, hit, _ := b.Plan(a.Request.ID)
	if hit == nil {
		rc.Keep = rc.Rows
		return nil
	}
	keep, err := HKVD(rc.Rows, hit, rc.Fresh, rc.Cached, b.shape.KVHeads*b.shape.HeadDim, ratio)
	if err != nil {
		return fmt.Errorf("blend: request %s layer %d: %w", a.Request.ID, a.Layer, err)
	}
	rc.Keep = keep
	return nil
}

// Pick returns the recompute choice of a request's prefill for lab/model's
// ForwardRecompute: each layer's call goes through AttentionBegin. The request must have begun.
func (b *Blend) Pick(req *Request) func(layer int, rows []int, fresh, cached []float32) ([]int, error) {
	return func(layer int, rows []int, fresh, cached []float32) ([]int, error) {
		a := &Attention{Layer: layer, Phase: PhasePrefill, Request: req, Recompute: &Recompute{Rows: rows, Fresh: fresh, Cached: cached}}
		if err := b.AttentionBegin(a); err != nil {
			return nil, err
		}
		return a.Recompute.Keep, nil
	}
}

// BindSparseMetadata keeps a *BlendMeta for ExecuteFinished.
func (b *Blend) BindSparseMetadata(meta any) {
	m, _ := meta.(*BlendMeta)
	b.mu.Lock()
	b.meta = m
	b.mu.Unlock()
}

// ExecuteFinished returns query_start_loc[1:] − 1 of the bound metadata, or logitsIndices
// without one.
func (b *Blend) ExecuteFinished(logitsIndices []int) []int {
	b.mu.Lock()
	m := b.meta
	b.mu.Unlock()
	if m == nil {
		return logitsIndices
	}
	return m.LogitsIndices()
}
