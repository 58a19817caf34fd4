package ucmhash

import (
	"crypto/md5"
	"encoding/binary"
	"slices"
	"strconv"
	"testing"

	"github.com/ucm-go/ucm/engine"
)

// fuzzMaxTokens bounds the tokens FuzzHasher hashes per input (4 KiB of input): at least four
// blocks of the largest block size.
const fuzzMaxTokens = 1024

// refPickleBlock is an independent encoding of pickle.dumps((parent, tuple(tokens)),
// protocol=5) for fewer than ~9000 tokens (one frame), written from the pickle spec rather
// than from the Hasher's encoder.
func refPickleBlock(parent engine.BlockID, tokens []uint32) []byte {
	var body []byte
	body = append(body, 'C', 16)
	body = append(body, parent[:]...)
	body = append(body, 0x94)
	if len(tokens) == 0 {
		body = append(body, ')')
	} else {
		if len(tokens) > 3 {
			body = append(body, '(')
		}
		for _, t := range tokens {
			switch {
			case t <= 0xff:
				body = append(body, 'K', byte(t))
			case t <= 0xffff:
				body = append(body, 'M', byte(t), byte(t>>8))
			case t <= 0x7fffffff:
				body = binary.LittleEndian.AppendUint32(append(body, 'J'), t)
			default:
				body = append(binary.LittleEndian.AppendUint32(append(body, 0x8a, 5), t), 0)
			}
		}
		if len(tokens) > 3 {
			body = append(body, 't', 0x94)
		} else {
			body = append(body, []byte{0x85, 0x86, 0x87}[len(tokens)-1], 0x94)
		}
	}
	body = append(body, 0x86, 0x94, '.')
	out := []byte{0x80, 5, 0x95}
	out = binary.LittleEndian.AppendUint64(out, uint64(len(body)))
	return append(out, body...)
}

// FuzzHasher hashes arbitrary tokens (4 input bytes each) with both schemes, block sizes
// 1..256 and arbitrary model names. It checks the number of ids, that splitting the tokens at
// any block boundary and continuing from the last id gives the same chain, determinism (the
// Hasher pools scratch buffers), the first id of each scheme against an independent
// computation (MD5 of the seed and little-endian tokens; MD5 of the meta and an independent
// pickle encoding), and ForRank.
func FuzzHasher(f *testing.F) {
	f.Add([]byte("the quick brown fox jumps over the lazy dog"), uint8(1), false, uint8(1), "Qwen/Qwen2.5-7B-Instruct", false)
	f.Add([]byte("the quick brown fox jumps over the lazy dog"), uint8(1), true, uint8(2), "Qwen/Qwen2.5-7B-Instruct", true)
	f.Add(make([]byte, 4*64), uint8(15), false, uint8(3), "m", false)
	f.Add(make([]byte, 4*64), uint8(15), true, uint8(3), "m", true)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0x80, 0xff, 0xff, 0, 0, 0x00, 0x01, 0, 0}, uint8(3), true, uint8(0), "", false)
	f.Add(make([]byte, 4*256*3+7), uint8(255), true, uint8(2), "日本語モデル", true)
	f.Add([]byte{}, uint8(0), false, uint8(0), "x", false)
	f.Fuzz(func(t *testing.T, raw []byte, bt uint8, pickle bool, split uint8, model string, rank1 bool) {
		if len(model) > 256 {
			model = model[:256]
		}
		n := min(len(raw)/4, fuzzMaxTokens)
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
		blockTokens := int(bt) + 1
		scheme := engine.HashSchemeUCMGo
		if pickle {
			scheme = engine.HashSchemeUCMPickle
		}
		rank := 0
		if rank1 {
			rank = 1
		}
		meta := HashMeta{Model: model, TPSize: 2, DType: "bfloat16", Rank: rank}
		h, err := NewHasher(meta, scheme, blockTokens)
		if err != nil {
			t.Fatal(err)
		}
		all := h.BlockIDs(tokens, nil)
		nb := len(tokens) / blockTokens
		if len(all) != nb {
			t.Fatalf("%d tokens, block %d: %d ids, want %d", len(tokens), blockTokens, len(all), nb)
		}
		if again := h.BlockIDs(tokens, nil); !slices.Equal(again, all) {
			t.Fatal("hashing the same tokens twice gave different ids")
		}
		seed := h.Seed()
		if fromSeed := h.BlockIDs(tokens, &seed); !slices.Equal(fromSeed, all) {
			t.Fatal("an explicit seed parent differs from nil")
		}
		// Chaining: the first k blocks, then the rest continued from the k-th id.
		k := 0
		if nb > 0 {
			k = int(split) % (nb + 1)
		}
		head := h.BlockIDs(tokens[:k*blockTokens], nil)
		var parent *engine.BlockID
		if k > 0 {
			parent = &head[k-1]
		}
		tail := h.BlockIDs(tokens[k*blockTokens:], parent)
		if got := append(slices.Clone(head), tail...); !slices.Equal(got, all) {
			t.Fatalf("split at block %d of %d: chain differs", k, nb)
		}
		// The trailing partial block is ignored.
		if nb > 0 {
			if trimmed := h.BlockIDs(tokens[:nb*blockTokens], nil); !slices.Equal(trimmed, all) {
				t.Fatal("a trailing partial block changed the ids")
			}
		}

		metaStr := model + ":2:bfloat16:" + strconv.Itoa(rank)
		var wantSeed engine.BlockID
		if pickle {
			s := []byte(metaStr)
			s = append(s, 0x80, 5, 0x95)
			s = binary.LittleEndian.AppendUint64(s, 17)
			s = append(s, 0x8c, 13)
			s = append(s, "UCM_HASH_SEED"...)
			s = append(s, 0x94, '.')
			wantSeed = md5.Sum(s)
		} else {
			wantSeed = md5.Sum([]byte("UCMHASHSEED" + metaStr))
		}
		if seed != wantSeed {
			t.Fatalf("seed %s, independent computation %s", seed, engine.BlockID(wantSeed))
		}
		if nb > 0 {
			var want engine.BlockID
			if pickle {
				want = md5.Sum(append([]byte(metaStr), refPickleBlock(seed, tokens[:blockTokens])...))
			} else {
				b := append([]byte(nil), seed[:]...)
				for _, tok := range tokens[:blockTokens] {
					b = binary.LittleEndian.AppendUint32(b, tok)
				}
				want = md5.Sum(b)
			}
			if all[0] != want {
				t.Fatalf("first id %s, independent computation %s", all[0], want)
			}
			if nb > 1 && !pickle {
				b := append([]byte(nil), all[0][:]...)
				for _, tok := range tokens[blockTokens : 2*blockTokens] {
					b = binary.LittleEndian.AppendUint32(b, tok)
				}
				if all[1] != md5.Sum(b) {
					t.Fatal("second id is not chained from the first")
				}
			}
			if h.ForRank(all[0], 0) != all[0] {
				t.Fatal("ForRank(0) changed the id")
			}
			if got, want := h.ForRank(all[0], 1), md5.Sum(append([]byte(model+":2:bfloat16:1"), all[0][:]...)); got != want {
				t.Fatalf("ForRank(1) %s, want %s", got, engine.BlockID(want))
			}
		}
	})
}
