package kernels

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/internal/crc32c"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata/repr")

// golden compares got with testdata/repr/name, rewriting it under -update. The golden files
// pin the sidecar payload format: a diff is a format change and needs a SidecarVersion bump.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "repr", name)
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run go test ./kernels -run Golden -update once to create it)", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: bytes differ from the golden file: the format changed; bump SidecarVersion", name)
	}
}

// goldenSpecs is one small spec per kind (and an MLA hash), the ones pinned by golden files.
func goldenSpecs() map[string]SidecarSpec {
	return map[string]SidecarSpec{
		"esa_mean":  {Kind: SidecarESAMean, Layers: 2, Heads: 2, Dim: 4, BlockSize: 4, Elem: Float16},
		"esa_max":   {Kind: SidecarESAMax, Layers: 2, Heads: 2, Dim: 4, BlockSize: 4, Elem: BFloat16},
		"quest":     {Kind: SidecarQuest, Layers: 2, Heads: 1, Dim: 3, BlockSize: 4, Elem: Float32},
		"kvstar":    {Kind: SidecarKVStar, Layers: 2, Heads: 2, Dim: 6, BlockSize: 4, Elem: Float16, PruneRatio: 0.5, Merge: 2},
		"hash":      {Kind: SidecarHash, Layers: 2, Heads: 2, Dim: 16, BlockSize: 4, HashBits: 8, Seed: 7},
		"hash_mla":  {Kind: SidecarHash, Layers: 1, Heads: 1, Dim: 24, BlockSize: 4, HashBits: 16, Seed: 9, RopeDim: 8, RopeBits: 8},
		"kvstar_pt": {Kind: SidecarKVStar, Layers: 1, Heads: 1, Dim: 4, BlockSize: 4, Elem: Float16, PruneRatio: 1, Merge: 2},
	}
}

// goldenK is deterministic staged K for a golden payload: small fp16 values.
func goldenK(s KShape, layer int) []byte {
	f := make([]float32, s.Elems())
	for i := range f {
		f[i] = float32((i*7+layer*13)%17-8) / 4
	}
	b := make([]byte, len(f)*2)
	encodeRow(b, f, Float16)
	return b
}

func makePayload(spec SidecarSpec, input DType, tokens int, k func(layer int) []byte) ([]byte, error) {
	w, err := NewSidecarWriter(spec, input)
	if err != nil {
		return nil, err
	}
	if err := w.Begin(tokens); err != nil {
		return nil, err
	}
	for l := spec.Layers - 1; l >= 0; l-- { // any order
		if err := w.AddLayer(l, k(l)); err != nil {
			return nil, err
		}
	}
	return w.AppendPayload(nil)
}

func writePayload(t *testing.T, spec SidecarSpec, input DType, tokens int, k func(layer int) []byte) []byte {
	t.Helper()
	p, err := makePayload(spec, input, tokens, k)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSidecarGolden(t *testing.T) {
	for name, spec := range goldenSpecs() {
		tokens := spec.BlockSize
		if name == "kvstar_pt" {
			tokens = 3 // a partial block: the second merged row has one token, no padding row
		}
		s := KShape{tokens, spec.Heads, spec.Dim}
		p := writePayload(t, spec, Float16, tokens, func(l int) []byte { return goldenK(s, l) })
		if len(p) != spec.PayloadBytes() {
			t.Fatalf("%s: %d bytes, PayloadBytes %d", name, len(p), spec.PayloadBytes())
		}
		golden(t, "sidecar_"+name+".golden", p)
		sc, err := DecodeSidecar(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		again, err := EncodeSidecar(nil, sc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(again, p) {
			t.Fatalf("%s: decode/encode changed the payload", name)
		}
	}
	// A partial hash block: rows from tokens on are zero.
	spec := goldenSpecs()["hash"]
	p := writePayload(t, spec, Float16, 3, func(l int) []byte { return goldenK(KShape{3, spec.Heads, spec.Dim}, l) })
	golden(t, "sidecar_hash_partial.golden", p)
	// A whole block's K tensor whose last row is garbage gives the same partial payload.
	whole := writePayload(t, spec, Float16, 3, func(l int) []byte {
		k := goldenK(KShape{3, spec.Heads, spec.Dim}, l)
		return append(k, bytes.Repeat([]byte{0x7c}, spec.Heads*spec.Dim*2)...)
	})
	if !bytes.Equal(whole, p) {
		t.Fatal("a whole block's K tensor for a partial block read past its tokens")
	}
}

// TestSidecarMatchesKernels checks that what a writer stores, decoded, is the kernels' output
// rounded to the element type, for every kind, dtype and a partial block.
func TestSidecarMatchesKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	const layers = 3
	for _, input := range allDTypes {
		elem := DefaultSidecarElem(input)
		for _, spec := range []SidecarSpec{
			{Kind: SidecarESAMean, Heads: 2, Dim: 16, BlockSize: 16, Elem: elem},
			{Kind: SidecarESAMax, Heads: 2, Dim: 16, BlockSize: 16, Elem: elem},
			{Kind: SidecarQuest, Heads: 2, Dim: 16, BlockSize: 16, Elem: elem},
			{Kind: SidecarKVStar, Heads: 2, Dim: 16, BlockSize: 16, Elem: elem, PruneRatio: 0.5, Merge: 4},
			{Kind: SidecarHash, Heads: 2, Dim: 16, BlockSize: 16, HashBits: 16, Seed: 3},
			{Kind: SidecarHash, Heads: 1, Dim: 40, BlockSize: 16, HashBits: 24, Seed: 3, RopeDim: 8, RopeBits: 8},
		} {
			spec.Layers = layers
			for _, tokens := range []int{16, 7} {
				s := KShape{tokens, spec.Heads, spec.Dim}
				ks := make([][]byte, layers)
				for l := range ks {
					ks[l] = randK(rng, input, s)
				}
				p := writePayload(t, spec, input, tokens, func(l int) []byte { return ks[l] })
				sc, err := DecodeSidecar(p)
				if err != nil {
					t.Fatalf("%v %v: %v", input, spec.Kind, err)
				}
				if sc.Tokens != tokens || sc.Input != input || sc.SidecarSpec != spec {
					t.Fatalf("%v %v: header %+v", input, spec.Kind, sc.SidecarHeader)
				}
				round := func(v []float32) []float32 {
					b := make([]byte, len(v)*elem.Size())
					encodeRow(b, v, elem)
					out := make([]float32, len(v))
					decodeRow(out, b, elem)
					return out
				}
				per := int(spec.valueCount())
				for l := range layers {
					var want []float32
					var wantCh []uint16
					var wantCodes []byte
					n := spec.Heads * spec.Dim
					switch spec.Kind {
					case SidecarESAMean:
						want = make([]float32, n)
						err = ESAPool(want, nil, ks[l], input, s)
					case SidecarESAMax:
						want = make([]float32, n)
						err = ESAPool(nil, want, ks[l], input, s)
					case SidecarQuest:
						want = make([]float32, 2*n)
						err = QuestMinMax(want, ks[l], input, s)
					case SidecarKVStar:
						p := spec.kvstar()
						want = make([]float32, p.Rows(tokens)*spec.Heads*spec.Cols())
						wantCh = make([]uint16, spec.Heads*spec.Cols())
						err = KVStar(want, wantCh, ks[l], input, s, p)
						want = append(want, make([]float32, per-len(want))...) // zero padding rows
					case SidecarHash:
						parts, _ := spec.HashEncoders()
						wantCodes = make([]byte, tokens*spec.Heads*spec.Cols())
						err = HashBlock(wantCodes, ks[l], input, s, parts...)
						wantCodes = append(wantCodes, make([]byte, per-len(wantCodes))...)
						if sc.Fingerprint != HashFingerprint(parts...) || sc.Fingerprint == 0 {
							t.Fatalf("fingerprint %#x", sc.Fingerprint)
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					if want != nil && !slices.Equal(sc.Values[l*per:(l+1)*per], round(want)) {
						t.Fatalf("%v %v tokens %d layer %d: stored values differ from the kernel's", input, spec.Kind, tokens, l)
					}
					if wantCh != nil && !slices.Equal(sc.Channels[l*len(wantCh):(l+1)*len(wantCh)], wantCh) {
						t.Fatalf("%v %v layer %d: channels differ", input, spec.Kind, l)
					}
					if wantCodes != nil && !slices.Equal(sc.Codes[l*per:(l+1)*per], wantCodes) {
						t.Fatalf("%v %v layer %d: codes differ", input, spec.Kind, l)
					}
					// One layer's part, read alone, decodes to the same.
					off, ln, err := spec.LayerRange(l)
					if err != nil {
						t.Fatal(err)
					}
					if off != l*spec.PartBytes() || ln != spec.PartBytes() || ln%8 != 0 {
						t.Fatalf("LayerRange(%d) = %d, %d", l, off, ln)
					}
					var v []float32
					var ch []uint16
					if spec.Kind != SidecarHash {
						v = make([]float32, per)
					}
					if spec.Kind == SidecarKVStar {
						ch = make([]uint16, spec.Heads*spec.Cols())
					}
					ph, pl, err := DecodeSidecarPart(p[off:off+ln], v, ch)
					if err != nil {
						t.Fatal(err)
					}
					if ph != sc.SidecarHeader || pl != l {
						t.Fatalf("part %d: header %+v layer %d", l, ph, pl)
					}
					if v != nil && !slices.Equal(v, sc.Values[l*per:(l+1)*per]) || ch != nil && !slices.Equal(ch, sc.Channels[l*len(ch):(l+1)*len(ch)]) {
						t.Fatalf("%v %v layer %d: DecodeSidecarPart differs from DecodeSidecar", input, spec.Kind, l)
					}
					if spec.Kind == SidecarHash && !bytes.Equal(p[off+SidecarHeaderSize:off+SidecarHeaderSize+per], sc.Codes[l*per:(l+1)*per]) {
						t.Fatalf("layer %d: codes are not stored as is", l)
					}
				}
			}
		}
	}
}

// TestSidecarFP16RoundTripExact: representations already in float16 are stored and read back
// exactly (docs/sparse-sources.md §10, ESA store round trip), including ±0, subnormals, ±Inf
// and the extremes.
func TestSidecarFP16RoundTripExact(t *testing.T) {
	spec := SidecarSpec{Kind: SidecarESAMean, Layers: 4, Heads: 8, Dim: 64, BlockSize: 16, Elem: Float16}
	rng := rand.New(rand.NewPCG(27, 28))
	v := make([]float32, spec.Layers*spec.Heads*spec.Dim)
	specials := []float32{0, float32(math.Copysign(0, -1)), 0x1p-24, -0x1p-24, 65504, -65504, float32(math.Inf(1)), float32(math.Inf(-1))}
	for i := range v {
		if i < len(specials) {
			v[i] = specials[i]
			continue
		}
		h := uint16(rng.Uint32())
		for h&0x7c00 == 0x7c00 { // no NaN (NaN ≠ NaN) and no Inf from random codes
			h = uint16(rng.Uint32())
		}
		v[i] = Float16ToFloat32(h)
	}
	sc := &Sidecar{SidecarHeader: SidecarHeader{SidecarSpec: spec, Input: Float16, Tokens: 16}, Values: v}
	p, err := EncodeSidecar([]byte("prefix"), sc)
	if err != nil {
		t.Fatal(err)
	}
	if string(p[:6]) != "prefix" {
		t.Fatal("EncodeSidecar does not append")
	}
	got, err := DecodeSidecar(p[6:])
	if err != nil {
		t.Fatal(err)
	}
	for i := range v {
		if math.Float32bits(got.Values[i]) != math.Float32bits(v[i]) {
			t.Fatalf("value %d: %v stored as %v", i, v[i], got.Values[i])
		}
	}
	// A finite value beyond float16 is refused, not stored as Inf.
	v[100] = 1e6
	if _, err := EncodeSidecar(nil, sc); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("overflow: %v", err)
	}
	// So is one from K through a writer whose element type is too narrow.
	w, err := NewSidecarWriter(SidecarSpec{Kind: SidecarESAMax, Layers: 1, Heads: 1, Dim: 2, BlockSize: 1, Elem: Float16}, Float32)
	if err != nil {
		t.Fatal(err)
	}
	k := make([]byte, 8)
	encodeRow(k, []float32{1, 1e9}, Float32)
	if err := w.Begin(1); err != nil {
		t.Fatal(err)
	}
	if err := w.AddLayer(0, k); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("writer overflow: %v", err)
	}
	if _, err := w.AppendPayload(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("payload with a failed layer: %v", err)
	}
}

func TestSidecarSpecSizes(t *testing.T) {
	for _, c := range []struct {
		spec       SidecarSpec
		rows, cols int
		dataBytes  int // one layer's data, padded to 8
	}{
		// Llama-3-8B-like: 32 layers, 8 KV heads, dim 128, block 128.
		{SidecarSpec{Kind: SidecarESAMean, Layers: 32, Heads: 8, Dim: 128, BlockSize: 128, Elem: Float16}, 1, 128, 2048},
		{SidecarSpec{Kind: SidecarQuest, Layers: 32, Heads: 8, Dim: 128, BlockSize: 128, Elem: BFloat16}, 2, 128, 4096},
		{SidecarSpec{Kind: SidecarKVStar, Layers: 32, Heads: 8, Dim: 128, BlockSize: 128, Elem: Float16, PruneRatio: 0.5, Merge: 4}, 32, 64, 8*64*2 + 32*8*64*2},
		{SidecarSpec{Kind: SidecarHash, Layers: 32, Heads: 8, Dim: 128, BlockSize: 128, HashBits: 128}, 128, 16, 128 * 8 * 16},
		// DeepSeek-V2 MLA: one head of 512 + 64, hash bits = input dims.
		{SidecarSpec{Kind: SidecarHash, Layers: 60, Heads: 1, Dim: 576, BlockSize: 64, HashBits: 512, RopeDim: 64, RopeBits: 64}, 64, 72, 64 * 72},
		// Odd sizes are padded to 8 bytes: channel table 2·1·3 = 6 → 8, values 2 rows·3·2 = 12 → 16.
		{SidecarSpec{Kind: SidecarKVStar, Layers: 3, Heads: 1, Dim: 5, BlockSize: 4, Elem: Float16, PruneRatio: 0.6, Merge: 2}, 2, 3, 8 + 16},
	} {
		s := c.spec
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		part := SidecarHeaderSize + c.dataBytes
		if s.Rows() != c.rows || s.Cols() != c.cols || s.PartBytes() != part || s.PayloadBytes() != s.Layers*part {
			t.Errorf("%v: rows %d cols %d part bytes %d payload %d; want %d %d %d", s.Kind, s.Rows(), s.Cols(), s.PartBytes(), s.PayloadBytes(), c.rows, c.cols, part)
		}
	}
}

func TestSidecarSpecRejects(t *testing.T) {
	ok := SidecarSpec{Kind: SidecarESAMean, Layers: 2, Heads: 2, Dim: 4, BlockSize: 4, Elem: Float16}
	hash := SidecarSpec{Kind: SidecarHash, Layers: 2, Heads: 2, Dim: 16, BlockSize: 4, HashBits: 8}
	kv := SidecarSpec{Kind: SidecarKVStar, Layers: 2, Heads: 2, Dim: 4, BlockSize: 4, Elem: Float16, PruneRatio: 0.5, Merge: 2}
	bad := map[string]SidecarSpec{}
	add := func(name string, base SidecarSpec, f func(*SidecarSpec)) {
		f(&base)
		bad[name] = base
	}
	add("kind 0", ok, func(s *SidecarSpec) { s.Kind = 0 })
	add("kind 6", ok, func(s *SidecarSpec) { s.Kind = 6 })
	add("layers 0", ok, func(s *SidecarSpec) { s.Layers = 0 })
	add("layers huge", ok, func(s *SidecarSpec) { s.Layers = MaxLayers + 1 })
	add("heads 0", ok, func(s *SidecarSpec) { s.Heads = 0 })
	add("dim huge", ok, func(s *SidecarSpec) { s.Dim = MaxDim + 1 })
	add("block 0", ok, func(s *SidecarSpec) { s.BlockSize = 0 })
	add("elem fp8", ok, func(s *SidecarSpec) { s.Elem = Float8E4M3 })
	add("elem 0", ok, func(s *SidecarSpec) { s.Elem = 0 })
	add("esa merge", ok, func(s *SidecarSpec) { s.Merge = 2 })
	add("esa seed", ok, func(s *SidecarSpec) { s.Seed = 2 })
	add("kv merge", kv, func(s *SidecarSpec) { s.Merge = 3 })
	add("kv ratio", kv, func(s *SidecarSpec) { s.PruneRatio = 0 })
	add("hash elem", hash, func(s *SidecarSpec) { s.Elem = Float16 })
	add("hash bits", hash, func(s *SidecarSpec) { s.HashBits = 12 })
	add("hash bits > dim", hash, func(s *SidecarSpec) { s.HashBits = 24 })
	add("rope bits alone", hash, func(s *SidecarSpec) { s.RopeBits = 8 })
	add("rope dim = dim", hash, func(s *SidecarSpec) { s.RopeDim = 16 })
	add("rope bits", hash, func(s *SidecarSpec) { s.RopeDim = 8; s.RopeBits = 16 })
	add("too big", SidecarSpec{Kind: SidecarHash, Layers: 4096, Heads: 64, Dim: 1024, BlockSize: 1 << 15, HashBits: 1024}, func(*SidecarSpec) {})
	for name, s := range bad {
		if err := s.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
		if s.PartBytes() != 0 || s.PayloadBytes() != 0 {
			t.Errorf("%s: sizes of an invalid spec", name)
		}
		if _, _, err := s.LayerRange(0); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: LayerRange: %v", name, err)
		}
		if _, err := NewSidecarWriter(s, Float16); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: writer: %v", name, err)
		}
	}
	if _, _, err := ok.LayerRange(2); !errors.Is(err, ErrOutOfRange) {
		t.Error(err)
	}
	if _, _, err := ok.LayerRange(-1); !errors.Is(err, ErrOutOfRange) {
		t.Error(err)
	}
	if _, err := ok.HashEncoders(); !errors.Is(err, ErrInvalid) {
		t.Error(err)
	}
}

func TestSidecarWriterMisuse(t *testing.T) {
	spec := goldenSpecs()["esa_mean"]
	w, err := NewSidecarWriter(spec, Float16)
	if err != nil {
		t.Fatal(err)
	}
	k := goldenK(KShape{4, 2, 4}, 0)
	if err := w.AddLayer(0, k); !errors.Is(err, ErrInvalid) {
		t.Fatalf("before Begin: %v", err)
	}
	if _, err := w.AppendPayload(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("append before Begin: %v", err)
	}
	for _, tokens := range []int{0, 5, -1} {
		if err := w.Begin(tokens); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Begin(%d): %v", tokens, err)
		}
	}
	if err := w.Begin(4); err != nil {
		t.Fatal(err)
	}
	if err := w.AddLayer(2, k); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("layer 2: %v", err)
	}
	if err := w.AddLayer(0, k[:5]); !errors.Is(err, ErrInvalid) {
		t.Fatalf("short K: %v", err)
	}
	if err := w.AddLayer(0, k); err != nil {
		t.Fatal(err)
	}
	if err := w.AddLayer(0, k); !errors.Is(err, ErrInvalid) {
		t.Fatalf("twice: %v", err)
	}
	if _, err := w.AppendPayload(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("missing layer: %v", err)
	}
	if err := w.AddLayer(1, k); err != nil {
		t.Fatal(err)
	}
	first, err := w.AppendPayload(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Reused for the next block: the same K gives the same bytes.
	if err := w.Begin(4); err != nil {
		t.Fatal(err)
	}
	for l := range 2 {
		if err := w.AddLayer(l, k); err != nil {
			t.Fatal(err)
		}
	}
	second, err := w.AppendPayload(nil)
	if err != nil || !bytes.Equal(first, second) {
		t.Fatalf("reuse: %v", err)
	}
	if w.Spec() != spec {
		t.Fatal("Spec")
	}
	if _, err := NewSidecarWriter(spec, DType(0)); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

func TestEncodeSidecarRejects(t *testing.T) {
	spec := goldenSpecs()["kvstar"]
	p := writePayload(t, spec, Float16, 4, func(l int) []byte { return goldenK(KShape{4, spec.Heads, spec.Dim}, l) })
	good, err := DecodeSidecar(p)
	if err != nil {
		t.Fatal(err)
	}
	clone := func() *Sidecar {
		c := *good
		c.Values = slices.Clone(good.Values)
		c.Channels = slices.Clone(good.Channels)
		return &c
	}
	for name, f := range map[string]func(*Sidecar){
		"short values":     func(s *Sidecar) { s.Values = s.Values[1:] },
		"codes":            func(s *Sidecar) { s.Codes = []byte{1} },
		"channel order":    func(s *Sidecar) { s.Channels[0], s.Channels[1] = s.Channels[1], s.Channels[0] },
		"channel range":    func(s *Sidecar) { s.Channels[2] = 6 },
		"tokens":           func(s *Sidecar) { s.Tokens = 5 },
		"input":            func(s *Sidecar) { s.Input = 0 },
		"fingerprint":      func(s *Sidecar) { s.Fingerprint = 1 },
		"padding row":      func(s *Sidecar) { s.Tokens = 2; s.Values[len(s.Values)-1] = 1 },
		"negative padding": func(s *Sidecar) { s.Tokens = 2; s.Values[len(s.Values)-1] = float32(math.Copysign(0, -1)) },
	} {
		s := clone()
		f(s)
		if _, err := EncodeSidecar(nil, s); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestDecodeSidecarCorrupt: every flipped bit of a part's header, any nonzero padding, a wrong
// length, parts out of order and bad channel tables are ErrCorrupt.
func TestDecodeSidecarCorrupt(t *testing.T) {
	for name, spec := range goldenSpecs() {
		p := writePayload(t, spec, Float16, 3, func(l int) []byte { return goldenK(KShape{3, spec.Heads, spec.Dim}, l) })
		if _, err := DecodeSidecar(p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		last, n, _ := spec.LayerRange(spec.Layers - 1)
		for _, base := range []int{0, last} {
			for i := range SidecarHeaderSize * 8 {
				q := slices.Clone(p)
				q[base+i/8] ^= 1 << (i % 8)
				if _, err := DecodeSidecar(q); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s: part at %d: header bit %d flipped: %v", name, base, i, err)
				}
				if _, _, err := DecodeSidecarPart(q[base:base+n], nil, nil); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s: part at %d: header bit %d flipped: %v", name, base, i, err)
				}
			}
		}
		for _, cut := range []int{0, 10, SidecarHeaderSize, len(p) - 1} {
			if _, err := DecodeSidecar(p[:cut]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s: cut to %d: %v", name, cut, err)
			}
		}
		if _, err := DecodeSidecar(append(slices.Clone(p), 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: one byte more: %v", name, err)
		}
		if _, _, err := DecodeSidecarPart(p[:n-1], nil, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: short part: %v", name, err)
		}
		if spec.Layers > 1 {
			q := slices.Clone(p)
			copy(q[:n], p[n:2*n])
			copy(q[n:2*n], p[:n])
			if _, err := DecodeSidecar(q); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s: parts swapped: %v", name, err)
			}
		}
		// The last byte of every part is padding (or in a padding row: tokens 3 < 4) for
		// these specs, except where the part is all data.
		h, _, _ := DecodeSidecarHeader(p)
		used := SidecarHeaderSize + h.channelBytes() + int64(h.ValidRows()*h.rowValues())*h.elemSize()
		for l := range spec.Layers {
			off, n, _ := spec.LayerRange(l)
			if int64(n) == used {
				continue
			}
			q := slices.Clone(p)
			q[off+n-1] = 0x40
			if _, err := DecodeSidecar(q); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s layer %d: nonzero padding: %v", name, l, err)
			}
			if _, _, err := DecodeSidecarPart(q[off:off+n], nil, nil); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s layer %d: DecodeSidecarPart of nonzero padding: %v", name, l, err)
			}
			if _, _, err := DecodeSidecarPart(p[off:off+n], make([]float32, 1), nil); !errors.Is(err, ErrInvalid) {
				t.Fatalf("%s layer %d: DecodeSidecarPart into a wrong slice: %v", name, l, err)
			}
		}
		if spec.Kind == SidecarKVStar {
			for _, c := range []uint16{uint16(spec.Dim), 0} { // out of range; not ascending
				q := slices.Clone(p)
				binary.LittleEndian.PutUint16(q[SidecarHeaderSize+2:], c)
				if _, err := DecodeSidecar(q); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s: channel %d: %v", name, c, err)
				}
			}
		}
	}
}

// FuzzDecodeSidecar feeds arbitrary bytes to the decoders: they never panic, allocate at most
// what the (bounded) header promises, fail only with ErrCorrupt, and what they accept encodes
// back to the same bytes. Seeds are the golden payloads; inputs whose header checksum is wrong
// are also tried with it fixed, so the fuzzer reaches the field and layer checks.
func FuzzDecodeSidecar(f *testing.F) {
	for _, spec := range goldenSpecs() {
		p, err := makePayload(spec, Float16, 3, func(l int) []byte { return goldenK(KShape{3, spec.Heads, spec.Dim}, l) })
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Add([]byte("UCRP"))
	f.Add(make([]byte, SidecarHeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(b []byte) {
			s, err := DecodeSidecar(b)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error is not ErrCorrupt: %v", err)
				}
				return
			}
			again, err := EncodeSidecar(nil, s)
			if err != nil {
				t.Fatalf("decoded sidecar does not encode: %v", err)
			}
			if !bytes.Equal(again, b) {
				t.Fatalf("decode/encode is not the identity")
			}
			for l := range s.Layers {
				off, n, err := s.LayerRange(l)
				if err != nil || off+n > len(b) {
					t.Fatalf("layer %d range %d+%d of %d: %v", l, off, n, len(b), err)
				}
				if _, pl, err := DecodeSidecarPart(b[off:off+n], nil, nil); err != nil || pl != l {
					t.Fatalf("part %d of a valid payload: layer %d, %v", l, pl, err)
				}
			}
		}
		check(b)
		if len(b) >= SidecarHeaderSize {
			q := slices.Clone(b)
			binary.LittleEndian.PutUint32(q[scOffCRC:], crc32c.Checksum(q[:scOffCRC]))
			// With a valid first header, fix every part's header CRC too, to reach the checks
			// that parts agree.
			if h, _, err := DecodeSidecarHeader(q); err == nil {
				pb := int(h.partBytes())
				for off := pb; off+SidecarHeaderSize <= len(q); off += pb {
					binary.LittleEndian.PutUint32(q[off+scOffCRC:], crc32c.Checksum(q[off:off+scOffCRC]))
				}
			}
			check(q)
			if _, _, err := DecodeSidecarPart(q, nil, nil); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("part error is not ErrCorrupt: %v", err)
			}
		}
	})
}

// TestDecodeSidecarRefusesSignalingNaN: a float16 or bfloat16 value stored as a signaling NaN
// was not written by the encoders (they write NaN quiet), so the decoders refuse the part as
// corrupt rather than hand back a value that would not encode to the stored bytes; a quiet NaN
// decodes and encodes back unchanged.
func TestDecodeSidecarRefusesSignalingNaN(t *testing.T) {
	for _, tc := range []struct {
		name            string
		signal, quieted uint16
	}{{"esa_mean", 0x7d00, 0x7e00}, {"esa_max", 0xff81, 0xffc1}} {
		spec := goldenSpecs()[tc.name]
		p, err := makePayload(spec, Float16, 3, func(l int) []byte { return goldenK(KShape{3, spec.Heads, spec.Dim}, l) })
		if err != nil {
			t.Fatal(err)
		}
		at := SidecarHeaderSize + 2 // the second value of layer 0 (ESA parts have no channel table)
		bad := slices.Clone(p)
		binary.LittleEndian.PutUint16(bad[at:], tc.signal)
		if _, err := DecodeSidecar(bad); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "value 1 is a signaling NaN") {
			t.Errorf("%s: signaling NaN %#04x: %v, want ErrCorrupt naming value 1", tc.name, tc.signal, err)
		}
		quiet := slices.Clone(p)
		binary.LittleEndian.PutUint16(quiet[at:], tc.quieted)
		s, err := DecodeSidecar(quiet)
		if err != nil {
			t.Fatalf("%s: quiet NaN %#04x: %v", tc.name, tc.quieted, err)
		}
		again, err := EncodeSidecar(nil, s)
		if err != nil || !bytes.Equal(again, quiet) {
			t.Errorf("%s: quiet NaN does not encode back to the same bytes: %v", tc.name, err)
		}
	}
}

// signalingNaNRef is the value-by-value rule signalingNaN implements: exponent bits all ones,
// mantissa not zero, quiet bit clear.
func signalingNaNRef(b []byte, elem DType) int {
	var exp, quiet uint16
	switch elem {
	case Float16:
		exp, quiet = 0x7c00, 0x0200
	case BFloat16:
		exp, quiet = 0x7f80, 0x0040
	default:
		return -1
	}
	for i := 0; i+2 <= len(b); i += 2 {
		c := binary.LittleEndian.Uint16(b[i:])
		if c&exp == exp && c&(0x7fff&^exp) != 0 && c&quiet == 0 {
			return i / 2
		}
	}
	return -1
}

// TestSignalingNaNAllCodes: the word-at-a-time check agrees with the value-by-value rule on
// every one of the 65,536 float16 and bfloat16 codes, at every position of a 22-value run (all
// four lanes of the 16-value loop's words, of the word loop's and the odd values after them),
// alone among ordinary values and followed by a later signaling NaN (the first is reported).
func TestSignalingNaNAllCodes(t *testing.T) {
	const n = 22
	for _, tc := range []struct {
		elem          DType
		one, signal   uint16 // an ordinary value and a signaling NaN
		wantSignaling int    // signaling codes among the 65,536
	}{
		{Float16, 0x3c00, 0x7c01, 2 * 0x1ff},
		{BFloat16, 0x3f80, 0xff81, 2 * 0x3f},
		{Float32, 0, 0, 0}, // not a 16-bit float: nothing is refused
	} {
		b := make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(b[2*i:], tc.one)
		}
		signaling := 0
		for _, later := range []bool{false, true} {
			last := n
			if later {
				last = n - 1
				binary.LittleEndian.PutUint16(b[2*last:], tc.signal)
			}
			for c := range 1 << 16 {
				for pos := range last {
					binary.LittleEndian.PutUint16(b[2*pos:], uint16(c))
					want := signalingNaNRef(b, tc.elem)
					if got := signalingNaN(b, tc.elem); got != want {
						t.Fatalf("%v code %#04x at %d (later signaling NaN %v): %d, want %d", tc.elem, c, pos, later, got, want)
					}
					binary.LittleEndian.PutUint16(b[2*pos:], tc.one)
					if !later && pos == 0 && want == 0 {
						signaling++
					}
				}
			}
		}
		if signaling != tc.wantSignaling {
			t.Errorf("%v: %d signaling codes, want %d", tc.elem, signaling, tc.wantSignaling)
		}
	}
}
