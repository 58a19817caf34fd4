package kernels

import (
	"cmp"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var allDTypes = []DType{Float16, BFloat16, Float8E4M3, Float8E5M2, Float32}

// randK returns staged K of the shape: normal values (scale 3) encoded as dt.
func randK(rng *rand.Rand, dt DType, s KShape) []byte {
	f := make([]float32, s.Elems())
	for i := range f {
		f[i] = float32(rng.NormFloat64() * 3)
	}
	b := make([]byte, len(f)*dt.Size())
	if err := EncodeFloat32(b, f, dt); err != nil {
		panic(err)
	}
	return b
}

// refElem decodes element i of k with the scalar conversions (the bulk path is under test).
func refElem(k []byte, dt DType, i int) float64 {
	switch dt {
	case Float16:
		return float64(Float16ToFloat32(uint16(k[2*i]) | uint16(k[2*i+1])<<8))
	case BFloat16:
		return float64(BFloat16ToFloat32(uint16(k[2*i]) | uint16(k[2*i+1])<<8))
	case Float8E4M3:
		return float64(Float8E4M3ToFloat32(k[i]))
	case Float8E5M2:
		return float64(Float8E5M2ToFloat32(k[i]))
	case Float32:
		return float64(math.Float32frombits(uint32(k[4*i]) | uint32(k[4*i+1])<<8 | uint32(k[4*i+2])<<16 | uint32(k[4*i+3])<<24))
	}
	panic("dtype")
}

// refAt is K[t][h][d] by the reference decoder.
func refAt(k []byte, dt DType, s KShape, t, h, d int) float64 {
	return refElem(k, dt, (t*s.Heads+h)*s.Dim+d)
}

func close32(a float32, b float64) bool {
	return math.Abs(float64(a)-b) <= 1e-6*math.Max(1, math.Abs(b))
}

func TestESAPoolMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range allDTypes {
		for _, s := range []KShape{{1, 1, 1}, {16, 2, 8}, {7, 3, 5}, {128, 2, 64}} {
			k := randK(rng, dt, s)
			mean := make([]float32, s.Heads*s.Dim)
			max := make([]float32, s.Heads*s.Dim)
			if err := ESAPool(mean, max, k, dt, s); err != nil {
				t.Fatal(err)
			}
			for h := range s.Heads {
				for d := range s.Dim {
					sum, mx := 0.0, math.Inf(-1)
					for tok := range s.Tokens {
						v := refAt(k, dt, s, tok, h, d)
						sum += v
						mx = math.Max(mx, v)
					}
					i := h*s.Dim + d
					if !close32(mean[i], sum/float64(s.Tokens)) || float64(max[i]) != mx {
						t.Fatalf("%v %v [%d][%d]: mean %v max %v, want %v %v", dt, s, h, d, mean[i], max[i], sum/float64(s.Tokens), mx)
					}
					if max[i] < mean[i] {
						t.Fatalf("%v %v [%d][%d]: max %v < mean %v", dt, s, h, d, max[i], mean[i])
					}
				}
			}
			// Each output alone equals the fused one.
			m2 := make([]float32, len(mean))
			x2 := make([]float32, len(max))
			if err := ESAPool(m2, nil, k, dt, s); err != nil {
				t.Fatal(err)
			}
			if err := ESAPool(nil, x2, k, dt, s); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m2, mean) || !slices.Equal(x2, max) {
				t.Fatalf("%v %v: mean-only or max-only differs from the fused pool", dt, s)
			}
		}
	}
}

func TestESAMeanOfIdenticalKeysIsTheKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range allDTypes {
		for _, tokens := range []int{1, 3, 7, 100, 128} {
			s := KShape{tokens, 4, 32}
			one := randK(rng, dt, KShape{1, s.Heads, s.Dim})
			var k []byte
			for range tokens {
				k = append(k, one...)
			}
			mean := make([]float32, s.Heads*s.Dim)
			max := make([]float32, s.Heads*s.Dim)
			if err := ESAPool(mean, max, k, dt, s); err != nil {
				t.Fatal(err)
			}
			key := make([]float32, s.Heads*s.Dim)
			if err := DecodeFloat32(key, one, dt); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mean, key) || !slices.Equal(max, key) {
				t.Fatalf("%v tokens %d: pool of identical keys is not the key", dt, tokens)
			}
		}
	}
}

// TestESABlockCount pools a sequence block by block: ⌈T/bs⌉ representations, the last over the
// partial block's tokens.
func TestESABlockCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const heads, dim, bs = 2, 8, 16
	for _, T := range []int{1, 15, 16, 17, 100, 128} {
		seq := randK(rng, Float16, KShape{T, heads, dim})
		row := heads * dim * 2
		var reprs [][]float32
		for start := 0; start < T; start += bs {
			end := min(start+bs, T)
			mean := make([]float32, heads*dim)
			if err := ESAPool(mean, nil, seq[start*row:end*row], Float16, KShape{end - start, heads, dim}); err != nil {
				t.Fatal(err)
			}
			reprs = append(reprs, mean)
		}
		if want := (T + bs - 1) / bs; len(reprs) != want {
			t.Fatalf("T %d: %d representations, want %d", T, len(reprs), want)
		}
		last := (len(reprs) - 1) * bs
		for i := range heads * dim {
			sum := 0.0
			for tok := last; tok < T; tok++ {
				sum += refElem(seq, Float16, tok*heads*dim+i)
			}
			if !close32(reprs[len(reprs)-1][i], sum/float64(T-last)) {
				t.Fatalf("T %d: last block's mean element %d is %v, want %v", T, i, reprs[len(reprs)-1][i], sum/float64(T-last))
			}
		}
	}
}

func TestNaNPropagates(t *testing.T) {
	s := KShape{4, 1, 2}
	f := []float32{1, 2, float32(math.NaN()), 3, 0, 1, 5, 4}
	k := make([]byte, len(f)*2)
	if err := EncodeFloat32(k, f, Float16); err != nil {
		t.Fatal(err)
	}
	mean, max := make([]float32, 2), make([]float32, 2)
	mm := make([]float32, 4)
	if err := ESAPool(mean, max, k, Float16, s); err != nil {
		t.Fatal(err)
	}
	if err := QuestMinMax(mm, k, Float16, s); err != nil {
		t.Fatal(err)
	}
	isNaN := func(f float32) bool { return f != f }
	if !isNaN(mean[0]) || !isNaN(max[0]) || !isNaN(mm[0]) || !isNaN(mm[2]) || mean[1] != 2.5 || max[1] != 4 || mm[1] != 1 || mm[3] != 4 {
		t.Fatalf("mean %v max %v min/max %v", mean, max, mm)
	}
}

func TestQuestMinMaxAndBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, dt := range allDTypes {
		s := KShape{13, 3, 16}
		k := randK(rng, dt, s)
		n := s.Heads * s.Dim
		mm := make([]float32, 2*n)
		if err := QuestMinMax(mm, k, dt, s); err != nil {
			t.Fatal(err)
		}
		for h := range s.Heads {
			for d := range s.Dim {
				lo, hi := math.Inf(1), math.Inf(-1)
				for tok := range s.Tokens {
					v := refAt(k, dt, s, tok, h, d)
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
				if float64(mm[h*s.Dim+d]) != lo || float64(mm[n+h*s.Dim+d]) != hi {
					t.Fatalf("%v [%d][%d]: min/max %v %v want %v %v", dt, h, d, mm[h*s.Dim+d], mm[n+h*s.Dim+d], lo, hi)
				}
			}
		}
		// The bound is an upper bound of q·k for every key of the block, per head, and equals
		// its formula.
		for range 20 {
			q := make([]float32, s.Dim)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			for h := range s.Heads {
				lo, hi := mm[h*s.Dim:(h+1)*s.Dim], mm[n+h*s.Dim:n+(h+1)*s.Dim]
				bound := QuestBound(q, lo, hi)
				want := 0.0
				for d := range q {
					want += math.Max(float64(q[d])*float64(lo[d]), float64(q[d])*float64(hi[d]))
				}
				if !close32(bound, want) {
					t.Fatalf("%v: bound %v want %v", dt, bound, want)
				}
				for tok := range s.Tokens {
					dot := 0.0
					for d := range q {
						dot += float64(q[d]) * refAt(k, dt, s, tok, h, d)
					}
					if float64(bound) < dot-1e-4*math.Max(1, math.Abs(dot)) {
						t.Fatalf("%v: bound %v below q·k %v of token %d head %d", dt, bound, dot, tok, h)
					}
				}
			}
		}
	}
	if b := QuestBound([]float32{1, 2}, []float32{1}, []float32{1, 2}); !math.IsNaN(float64(b)) {
		t.Fatalf("short min: %v", b)
	}
}

// refKVStar is a direct transcription of docs/sparse-sources.md §5 for one block, in float64.
func refKVStar(k []byte, dt DType, s KShape, p KVStarParams) (rows [][][]float64, channels [][]int) {
	kept := s.Dim
	if p.PruneRatio < 0.98 {
		kept = int(math.RoundToEven(float64(s.Dim) * p.PruneRatio))
	}
	channels = make([][]int, s.Heads)
	for h := range s.Heads {
		type ch struct {
			d    int
			mean float64
		}
		var cs []ch
		for d := range s.Dim {
			sum := 0.0
			for tok := range s.Tokens {
				sum += math.Abs(refAt(k, dt, s, tok, h, d))
			}
			cs = append(cs, ch{d, sum / float64(s.Tokens)})
		}
		slices.SortStableFunc(cs, func(a, b ch) int { return cmp.Compare(b.mean, a.mean) })
		for _, c := range cs[:kept] {
			channels[h] = append(channels[h], c.d)
		}
		slices.Sort(channels[h])
	}
	for start := 0; start < s.Tokens; start += p.Merge {
		end := min(start+p.Merge, s.Tokens)
		row := make([][]float64, s.Heads)
		for h := range s.Heads {
			for _, d := range channels[h] {
				sum := 0.0
				for tok := start; tok < end; tok++ {
					sum += refAt(k, dt, s, tok, h, d)
				}
				row[h] = append(row[h], sum/float64(end-start))
			}
		}
		rows = append(rows, row)
	}
	return rows, channels
}

func TestKVStarMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, dt := range allDTypes {
		for _, tc := range []struct {
			s KShape
			p KVStarParams
		}{
			{KShape{16, 2, 16}, KVStarParams{16, 0.5, 4}},
			{KShape{16, 3, 10}, KVStarParams{16, 0.25, 2}}, // d' = round(2.5) = 2 (ties to even)
			{KShape{13, 2, 8}, KVStarParams{16, 0.7, 4}},   // partial block: rows 4, last of 1 token
			{KShape{128, 2, 32}, KVStarParams{128, 1, 8}},
			{KShape{5, 1, 6}, KVStarParams{8, 0.99, 1}},
		} {
			s, p := tc.s, tc.p
			k := randK(rng, dt, s)
			kept := p.KeptDims(s.Dim)
			rows := p.Rows(s.Tokens)
			dst := make([]float32, rows*s.Heads*kept)
			ch := make([]uint16, s.Heads*kept)
			if err := KVStar(dst, ch, k, dt, s, p); err != nil {
				t.Fatal(err)
			}
			want, wantCh := refKVStar(k, dt, s, p)
			if len(want) != rows || len(wantCh[0]) != kept {
				t.Fatalf("%v %v %+v: rows %d kept %d, reference %d %d", dt, s, p, rows, kept, len(want), len(wantCh[0]))
			}
			for h := range s.Heads {
				for j := range kept {
					if int(ch[h*kept+j]) != wantCh[h][j] {
						t.Fatalf("%v %v %+v head %d: channels %v want %v", dt, s, p, h, ch[h*kept:(h+1)*kept], wantCh[h])
					}
				}
			}
			for r := range rows {
				for h := range s.Heads {
					for j := range kept {
						if got := dst[(r*s.Heads+h)*kept+j]; !close32(got, want[r][h][j]) {
							t.Fatalf("%v %v %+v [%d][%d][%d]: %v want %v", dt, s, p, r, h, j, got, want[r][h][j])
						}
					}
				}
			}
		}
	}
}

func TestKVStarProperties(t *testing.T) {
	for _, tc := range []struct {
		dim   int
		ratio float64
		kept  int
	}{{128, 0.98, 128}, {128, 1, 128}, {128, 0.97, 124}, {128, 0.5, 64}, {128, 0.7, 90}, {128, 0.2, 26}, {5, 0.5, 2}, {7, 0.5, 4}, {3, 0.1, 0}} {
		if got := (KVStarParams{PruneRatio: tc.ratio}).KeptDims(tc.dim); got != tc.kept {
			t.Errorf("KeptDims(%d, %v) = %d want %d", tc.dim, tc.ratio, got, tc.kept)
		}
	}
	// Merge 1 without pruning gives the keys back, channels 0…d−1.
	rng := rand.New(rand.NewPCG(15, 16))
	for _, dt := range allDTypes {
		s := KShape{9, 2, 12}
		k := randK(rng, dt, s)
		dst := make([]float32, s.Elems())
		ch := make([]uint16, s.Heads*s.Dim)
		if err := KVStar(dst, ch, k, dt, s, KVStarParams{BlockSize: 16, PruneRatio: 0.99, Merge: 1}); err != nil {
			t.Fatal(err)
		}
		keys := make([]float32, s.Elems())
		if err := DecodeFloat32(keys, k, dt); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(dst, keys) {
			t.Fatalf("%v: merge 1 without pruning is not the keys", dt)
		}
		for i, c := range ch {
			if int(c) != i%s.Dim {
				t.Fatalf("%v: channels %v", dt, ch)
			}
		}
	}
	// docs/sparse-sources.md §5's example: [128, 32, 128] at prune 0.5, merge 4 → [32, 32, 64], 524,288 → 65,536.
	s := KShape{128, 32, 128}
	p := KVStarParams{BlockSize: 128, PruneRatio: 0.5, Merge: 4}
	k := randK(rng, BFloat16, s)
	dst := make([]float32, p.Rows(s.Tokens)*s.Heads*p.KeptDims(s.Dim))
	ch := make([]uint16, s.Heads*p.KeptDims(s.Dim))
	if err := KVStar(dst, ch, k, BFloat16, s, p); err != nil {
		t.Fatal(err)
	}
	if s.Elems() != 524288 || len(dst) != 65536 || p.Rows(128) != 32 || p.KeptDims(128) != 64 {
		t.Fatalf("%d elements → %d (rows %d, kept %d)", s.Elems(), len(dst), p.Rows(128), p.KeptDims(128))
	}
	// Equal channel means: ties go to the lower channel.
	s = KShape{2, 1, 4}
	f := []float32{1, -2, 2, 1, -1, 2, -2, 1} // |k| means: 1, 2, 2, 1
	kb := make([]byte, len(f)*4)
	if err := EncodeFloat32(kb, f, Float32); err != nil {
		t.Fatal(err)
	}
	ch = make([]uint16, 3)
	dst = make([]float32, 3)
	if err := KVStar(dst, ch, kb, Float32, s, KVStarParams{BlockSize: 2, PruneRatio: 0.75, Merge: 2}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ch, []uint16{0, 1, 2}) || !slices.Equal(dst, []float32{0, 0, 0}) {
		t.Fatalf("ties: channels %v rows %v", ch, dst)
	}
}

func TestReductions(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	const qHeads, kvHeads, dim = 12, 3, 5
	q := make([]float32, qHeads*dim)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	g := make([]float32, kvHeads*dim)
	if err := ReduceGQA(g, q, qHeads, kvHeads, dim); err != nil {
		t.Fatal(err)
	}
	G := qHeads / kvHeads
	for j := range kvHeads {
		for d := range dim {
			sum := 0.0
			for h := j * G; h < j*G+G; h++ {
				sum += float64(q[h*dim+d])
			}
			if !close32(g[j*dim+d], sum/float64(G)) {
				t.Fatalf("GQA head %d dim %d: %v want %v", j, d, g[j*dim+d], sum/float64(G))
			}
		}
	}
	const r = 4
	m := make([]float32, qHeads/r*dim)
	if err := ReduceStrided(m, q, qHeads, r, dim); err != nil {
		t.Fatal(err)
	}
	for j := range qHeads / r {
		for d := range dim {
			sum := 0.0
			for i := range r {
				sum += float64(q[(j+i*qHeads/r)*dim+d])
			}
			if !close32(m[j*dim+d], sum/r) {
				t.Fatalf("strided head %d dim %d: %v want %v", j, d, m[j*dim+d], sum/r)
			}
		}
	}
	for _, err := range []error{
		ReduceGQA(g, q, qHeads, 5, dim),
		ReduceGQA(g[:1], q, qHeads, kvHeads, dim),
		ReduceGQA(g, q, qHeads, 0, dim),
		ReduceStrided(m, q, qHeads, 5, dim),
		ReduceStrided(m, q, qHeads, 0, dim),
		ReduceStrided(m, q[:3], qHeads, r, dim),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("bad reduction: %v", err)
		}
	}
}

func TestKernelsRejectBadInput(t *testing.T) {
	s := KShape{4, 2, 8}
	k := make([]byte, s.Elems()*2)
	n := s.Heads * s.Dim
	p := KVStarParams{BlockSize: 4, PruneRatio: 0.5, Merge: 2}
	enc, err := NewHashEncoder(8, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"short K":          ESAPool(make([]float32, n), nil, k[:10], Float16, s),
		"no output":        ESAPool(nil, nil, k, Float16, s),
		"short mean":       ESAPool(make([]float32, n-1), nil, k, Float16, s),
		"bad dtype":        ESAPool(make([]float32, n), nil, k, DType(0), s),
		"zero tokens":      ESAPool(make([]float32, n), nil, nil, Float16, KShape{0, 2, 8}),
		"huge shape":       ESAPool(make([]float32, n), nil, k, Float16, KShape{1 << 20, 1 << 20, 1 << 20}),
		"negative":         ESAPool(make([]float32, n), nil, k, Float16, KShape{-4, -2, 8}),
		"heads×dim":        ESAPool(nil, make([]float32, 1), nil, Float16, KShape{1, 1024, 4096}),
		"quest dst":        QuestMinMax(make([]float32, n), k, Float16, s),
		"kvstar tokens":    KVStar(make([]float32, 2*2*4), make([]uint16, 8), k, Float16, s, KVStarParams{BlockSize: 2, PruneRatio: 0.5, Merge: 2}),
		"kvstar merge":     KVStar(make([]float32, 2*2*4), make([]uint16, 8), k, Float16, s, KVStarParams{BlockSize: 4, PruneRatio: 0.5, Merge: 3}),
		"kvstar ratio":     KVStar(make([]float32, 2*2*4), make([]uint16, 8), k, Float16, s, KVStarParams{BlockSize: 4, PruneRatio: 0, Merge: 2}),
		"kvstar ratio NaN": KVStar(make([]float32, 2*2*4), make([]uint16, 8), k, Float16, s, KVStarParams{BlockSize: 4, PruneRatio: math.NaN(), Merge: 2}),
		"kvstar ratio >1":  KVStar(make([]float32, 2*2*8), make([]uint16, 16), k, Float16, s, KVStarParams{BlockSize: 4, PruneRatio: 1.5, Merge: 2}),
		"kvstar keeps 0":   KVStar(nil, nil, k, Float16, s, KVStarParams{BlockSize: 4, PruneRatio: 0.01, Merge: 2}),
		"kvstar dst":       KVStar(make([]float32, 3), make([]uint16, 8), k, Float16, s, p),
		"kvstar channels":  KVStar(make([]float32, 2*2*4), make([]uint16, 7), k, Float16, s, p),
		"hash no parts":    HashBlock(make([]byte, 8), k, Float16, s),
		"hash nil part":    HashBlock(make([]byte, 8), k, Float16, s, nil),
		"hash dims":        HashBlock(make([]byte, 8), k, Float16, s, enc, enc),
		"hash dst":         HashBlock(make([]byte, 7), k, Float16, s, enc),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestKeepTopMatchesSort checks the threshold selection against a stable sort by decreasing
// sum (cmp.Compare: NaN lowest), on sums with many ties, NaNs and infinities.
func TestKeepTopMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 30))
	pool := []float64{0, 1, 1, 2, 3, math.NaN(), math.Inf(1), 0.5}
	for range 2000 {
		n := 1 + rng.IntN(20)
		sums := make([]float64, n)
		for i := range sums {
			sums[i] = pool[rng.IntN(len(pool))]
		}
		kept := 1 + rng.IntN(n)
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(sums[b], sums[a]) })
		want := slices.Clone(idx[:kept])
		slices.Sort(want)
		got := make([]uint16, kept)
		keepTop(got, sums, make([]float64, n))
		for i := range want {
			if int(got[i]) != want[i] {
				t.Fatalf("sums %v keep %d: %v want %v", sums, kept, got, want)
			}
		}
	}
}
