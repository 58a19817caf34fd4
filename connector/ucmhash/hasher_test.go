package ucmhash

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
)

// hasherVectors mirrors connector/ucmhash/testdata/hasher/vectors.json (written by gen_vectors.py).
type hasherVectors struct {
	Python         string `json:"python"`
	PickleProtocol int    `json:"pickle_protocol"`
	Pickle         []struct {
		Kind   string   `json:"kind"`
		Str    string   `json:"str"`
		Parent string   `json:"parent"`
		Tokens []uint32 `json:"tokens"`
		Value  uint32   `json:"value"`
		Count  int      `json:"count"`
		Len    int      `json:"len"`
		MD5    string   `json:"md5"`
		Hex    string   `json:"hex"`
	} `json:"pickle"`
	Chains []struct {
		Model     string   `json:"model"`
		TPSize    int      `json:"tp_size"`
		DType     string   `json:"dtype"`
		Rank      int      `json:"rank"`
		BlockSize int      `json:"block_size"`
		Tokens    []uint32 `json:"tokens"`
		Seed      string   `json:"seed"`
		IDs       []string `json:"ids"`
		ForRank   []struct {
			Rank int      `json:"rank"`
			IDs  []string `json:"ids"`
		} `json:"for_rank"`
	} `json:"chains"`
}

func loadHasherVectors(t *testing.T) *hasherVectors {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "hasher", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v hasherVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.PickleProtocol != 5 || len(v.Pickle) == 0 || len(v.Chains) == 0 {
		t.Fatalf("vectors.json: protocol %d, %d pickle cases, %d chains", v.PickleProtocol, len(v.Pickle), len(v.Chains))
	}
	return &v
}

func mustParseID(t *testing.T, s string) engine.BlockID {
	t.Helper()
	id, err := format.ParseBlockID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// formulaTokens reproduces gen_vectors.py's "block_formula" token list.
func formulaTokens(n int) []uint32 {
	edge := []uint32{0, 1, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, 1<<32 - 1}
	toks := make([]uint32, n)
	for i := range toks {
		if i%3 == 0 {
			toks[i] = edge[i%len(edge)]
		} else {
			toks[i] = uint32(uint64(i)*2654435761 + 12345)
		}
	}
	return toks
}

func TestPickleEncoderMatchesCPython(t *testing.T) {
	v := loadHasherVectors(t)
	for i, c := range v.Pickle {
		var got []byte
		switch c.Kind {
		case "str":
			got = appendPickleStr([]byte("prefix"), c.Str)[len("prefix"):]
		case "block", "block_repeat", "block_formula":
			parent := mustParseID(t, c.Parent)
			toks := c.Tokens
			switch c.Kind {
			case "block_repeat":
				toks = make([]uint32, c.Count)
				for j := range toks {
					toks[j] = c.Value
				}
			case "block_formula":
				toks = formulaTokens(c.Count)
			}
			if toks == nil {
				toks = []uint32{}
			}
			got = appendPickleBlock([]byte("prefix"), &parent, toks)[len("prefix"):]
			if max := pickleBlockMaxLen(len(toks)); len(got) > max {
				t.Errorf("case %d: pickle length %d exceeds bound %d", i, len(got), max)
			}
		default:
			t.Fatalf("case %d: unknown kind %q", i, c.Kind)
		}
		if c.Hex != "" {
			if h := hex.EncodeToString(got); h != c.Hex {
				t.Errorf("case %d (%s, %d tokens):\n got %s\nwant %s", i, c.Kind, len(c.Tokens), h, c.Hex)
			}
			continue
		}
		sum := md5.Sum(got)
		if len(got) != c.Len || hex.EncodeToString(sum[:]) != c.MD5 {
			t.Errorf("case %d (%s, value %d, count %d): len %d md5 %x, want len %d md5 %s",
				i, c.Kind, c.Value, c.Count, len(got), sum, c.Len, c.MD5)
		}
	}
}

func TestHasherUCMPickleVectors(t *testing.T) {
	v := loadHasherVectors(t)
	for i, c := range v.Chains {
		meta := HashMeta{Model: c.Model, TPSize: c.TPSize, DType: c.DType, Rank: c.Rank}
		h, err := NewHasher(meta, engine.HashSchemeUCMPickle, c.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Seed().String(); got != c.Seed {
			t.Errorf("chain %d: seed %s, want %s", i, got, c.Seed)
		}
		ids := h.BlockIDs(c.Tokens, nil)
		if len(ids) != len(c.IDs) {
			t.Fatalf("chain %d: %d ids, want %d", i, len(ids), len(c.IDs))
		}
		for j := range ids {
			if ids[j].String() != c.IDs[j] {
				t.Errorf("chain %d block %d: %s, want %s", i, j, ids[j], c.IDs[j])
			}
		}
		for _, fr := range c.ForRank {
			for j, want := range fr.IDs {
				if got := h.ForRank(mustParseID(t, c.IDs[j]), fr.Rank).String(); got != want {
					t.Errorf("chain %d rank %d block %d: %s, want %s", i, fr.Rank, j, got, want)
				}
			}
		}
	}
}

func TestHasherUCMGoByHand(t *testing.T) {
	meta := HashMeta{Model: "m", TPSize: 2, DType: "bf16", Rank: 1}
	h, err := NewHasher(meta, engine.HashSchemeUCMGo, 2)
	if err != nil {
		t.Fatal(err)
	}
	seed := md5.Sum([]byte("UCMHASHSEEDm:2:bf16:1"))
	if h.Seed() != seed {
		t.Fatalf("seed %s, want %x", h.Seed(), seed)
	}
	tokens := []uint32{1, 0x01020304, 300, 0xffffffff, 7} // trailing 7 is a partial block
	b0 := md5.Sum(append(append([]byte{}, seed[:]...), 1, 0, 0, 0, 4, 3, 2, 1))
	b1 := md5.Sum(append(append([]byte{}, b0[:]...), 0x2c, 1, 0, 0, 0xff, 0xff, 0xff, 0xff))
	ids := h.BlockIDs(tokens, nil)
	if len(ids) != 2 || ids[0] != b0 || ids[1] != b1 {
		t.Fatalf("ids %v, want [%x %x]", ids, b0, b1)
	}
	if got := h.BlockIDs(tokens[:1], nil); got != nil {
		t.Fatalf("partial block hashed: %v", got)
	}
	// ForRank follows UCM's rule under both schemes.
	want := md5.Sum(append([]byte("m:2:bf16:3"), b0[:]...))
	if got := h.ForRank(b0, 3); got != want {
		t.Fatalf("ForRank %s, want %x", got, want)
	}
	if got := h.ForRank(b0, 0); got != b0 {
		t.Fatalf("ForRank(0) changed the id")
	}
}

func TestHasherChainAndPartial(t *testing.T) {
	for _, scheme := range []engine.HashScheme{engine.HashSchemeUCMGo, engine.HashSchemeUCMPickle} {
		const bt = 16
		h, err := NewHasher(HashMeta{Model: "x", TPSize: 1, DType: "fp16"}, scheme, bt)
		if err != nil {
			t.Fatal(err)
		}
		tokens := formulaTokens(5*bt + 7)
		all := h.BlockIDs(tokens, nil)
		if len(all) != 5 {
			t.Fatalf("%v: %d ids, want 5", scheme, len(all))
		}
		// Partial trailing block ignored.
		if got := h.BlockIDs(tokens[:5*bt], nil); !equalIDs(got, all) {
			t.Fatalf("%v: trailing partial block changed ids", scheme)
		}
		// Incremental extension from a parent.
		first := h.BlockIDs(tokens[:2*bt], nil)
		rest := h.BlockIDs(tokens[2*bt:], &first[1])
		if !equalIDs(append(first, rest...), all) {
			t.Fatalf("%v: chained extension differs", scheme)
		}
		seed := h.Seed()
		if got := h.BlockIDs(tokens, &seed); !equalIDs(got, all) {
			t.Fatalf("%v: explicit seed parent differs from nil", scheme)
		}
		if got := h.BlockIDs(nil, nil); got != nil {
			t.Fatalf("%v: no tokens gave %v", scheme, got)
		}
		// Different meta, different seed and ids.
		for _, m := range []HashMeta{
			{Model: "y", TPSize: 1, DType: "fp16"},
			{Model: "x", TPSize: 2, DType: "fp16"},
			{Model: "x", TPSize: 1, DType: "bf16"},
			{Model: "x", TPSize: 2, DType: "fp16", Rank: 1},
		} {
			h2, err := NewHasher(m, scheme, bt)
			if err != nil {
				t.Fatal(err)
			}
			if h2.Seed() == h.Seed() || h2.BlockIDs(tokens, nil)[0] == all[0] {
				t.Fatalf("%v: meta %+v collides with %+v", scheme, m, h.Meta())
			}
		}
		// Token ids > 255 must matter (Python's bytes(list) bug would truncate or reject them).
		a := make([]uint32, bt)
		b := make([]uint32, bt)
		b[3] = 256 // same low byte as 0
		if h.BlockIDs(a, nil)[0] == h.BlockIDs(b, nil)[0] {
			t.Fatalf("%v: token 256 hashed like 0", scheme)
		}
		b[3] = 1 << 24
		if h.BlockIDs(a, nil)[0] == h.BlockIDs(b, nil)[0] {
			t.Fatalf("%v: token 1<<24 hashed like 0", scheme)
		}
	}
}

func TestHasherSchemesDiffer(t *testing.T) {
	meta := HashMeta{Model: "x", TPSize: 1, DType: "fp16"}
	a, _ := NewHasher(meta, engine.HashSchemeUCMGo, 4)
	b, _ := NewHasher(meta, engine.HashSchemeUCMPickle, 4)
	if a.Seed() == b.Seed() {
		t.Fatal("schemes share a seed")
	}
}

func TestHasherConcurrent(t *testing.T) {
	for _, scheme := range []engine.HashScheme{engine.HashSchemeUCMGo, engine.HashSchemeUCMPickle} {
		h, _ := NewHasher(HashMeta{Model: "x", TPSize: 1, DType: "fp16"}, scheme, 64)
		tokens := formulaTokens(64 * 8)
		want := h.BlockIDs(tokens, nil)
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					n := (g + i) % 9
					if got := h.BlockIDs(tokens[:64*n], nil); !equalIDs(got, want[:n]) {
						t.Errorf("%v: concurrent mismatch", scheme)
						return
					}
				}
			}(g)
		}
		wg.Wait()
	}
}

func TestHasherErrors(t *testing.T) {
	for _, bt := range []int{0, -1} {
		if _, err := NewHasher(HashMeta{}, engine.HashSchemeUCMGo, bt); !errors.Is(err, format.ErrInvalid) {
			t.Errorf("blockTokens %d: err %v, want ErrInvalid", bt, err)
		}
	}
	for _, m := range []HashMeta{{TPSize: -1}, {TPSize: 2, Rank: -1}, {TPSize: 2, Rank: 2}} {
		if _, err := NewHasher(m, engine.HashSchemeUCMGo, 16); !errors.Is(err, format.ErrInvalid) {
			t.Errorf("meta %+v: err %v, want ErrInvalid", m, err)
		}
	}
	if _, err := NewHasher(HashMeta{}, engine.HashScheme(7), 16); !errors.Is(err, format.ErrInvalid) {
		t.Errorf("scheme 7: err %v, want ErrInvalid", err)
	}
}

func TestHasherAllocs(t *testing.T) {
	for _, scheme := range []engine.HashScheme{engine.HashSchemeUCMGo, engine.HashSchemeUCMPickle} {
		h, _ := NewHasher(HashMeta{Model: "x", TPSize: 1, DType: "fp16"}, scheme, 128)
		tokens := formulaTokens(128 * 16)
		h.BlockIDs(tokens, nil) // warm the pool
		allocs := testing.AllocsPerRun(100, func() { h.BlockIDs(tokens, nil) })
		if allocs > 2 { // the result slice (+ a pool refill after a GC)
			t.Errorf("%v: %.1f allocs per BlockIDs", scheme, allocs)
		}
		id := engine.BlockID{1}
		if a := testing.AllocsPerRun(100, func() { h.ForRank(id, 3) }); a != 0 {
			t.Errorf("%v: %.1f allocs per ForRank", scheme, a)
		}
	}
}

func equalIDs(a, b []engine.BlockID) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i][:], b[i][:]) {
			return false
		}
	}
	return true
}

func BenchmarkBlockIDs(b *testing.B) {
	for _, scheme := range []engine.HashScheme{engine.HashSchemeUCMGo, engine.HashSchemeUCMPickle} {
		for _, bt := range []int{16, 128} {
			b.Run(scheme.String()+"/block"+strconv.Itoa(bt), func(b *testing.B) {
				h, _ := NewHasher(HashMeta{Model: "Qwen/Qwen2.5-7B-Instruct", TPSize: 1, DType: "bfloat16"}, scheme, bt)
				tokens := formulaTokens(32 * 1024)
				b.SetBytes(int64(4 * len(tokens))) // MB/s of uint32 tokens
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					h.BlockIDs(tokens, nil)
				}
				b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
