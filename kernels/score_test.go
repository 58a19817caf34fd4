package kernels

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// scoreCase is one random argument set of the scoring kernels: n runs of d elements with
// strides qs, vs (0 included: one run reused) over q and over the fp16, int8 values.
type scoreCase struct {
	n, d, qs, vs int
	q            []float32
	f16, lo, hi  []byte
	i8           []int8
}

func randScoreCase(r *rand.Rand) scoreCase {
	c := scoreCase{n: 1 + r.IntN(13), d: []int{1, 3, 8, 16, 24, 32, 40, 64, 128, 136}[r.IntN(10)]}
	c.qs = []int{0, c.d, c.d + 8}[r.IntN(3)]
	c.vs = []int{0, c.d, 2 * c.d}[r.IntN(3)]
	nq, nv := (c.n-1)*c.qs+c.d, (c.n-1)*c.vs+c.d
	c.q = make([]float32, nq)
	for i := range c.q {
		c.q[i] = float32(r.NormFloat64())
	}
	f16 := func() []byte {
		b := make([]byte, 2*nv)
		for i := range nv {
			binary.LittleEndian.PutUint16(b[2*i:], Float32ToFloat16(float32(r.NormFloat64()*3)))
		}
		return b
	}
	c.f16, c.lo, c.hi = f16(), f16(), f16()
	c.i8 = make([]int8, nv)
	for i := range c.i8 {
		c.i8[i] = int8(r.IntN(256) - 128)
	}
	return c
}

func f16At(b []byte, i int) float64 {
	return float64(Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
}

// closeTo: float32 accumulation against a float64 reference, relative to the sum of the
// magnitudes of the terms.
func closeTo(got float32, want, mag float64) bool {
	return math.Abs(float64(got)-want) <= 1e-5*mag+1e-6
}

// TestScoreKernels checks every kernel, the assembly one where the CPU has it and the
// portable one, against float64 sums computed element by element.
func TestScoreKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for it := range 2000 {
		c := randScoreCase(r)
		type impl struct {
			name string
			run  func(out []float32)
		}
		refs := map[string]func(i int) (float64, float64){
			"dots": func(i int) (s, m float64) {
				for j := range c.d {
					p := float64(c.q[i*c.qs+j]) * f16At(c.f16, i*c.vs+j)
					s, m = s+p, m+math.Abs(p)
				}
				return
			},
			"sqdists": func(i int) (s, m float64) {
				for j := range c.d {
					e := float64(c.q[i*c.qs+j]) - f16At(c.f16, i*c.vs+j)
					s += e * e
				}
				return s, s
			},
			"quest": func(i int) (s, m float64) {
				for j := range c.d {
					x := float64(c.q[i*c.qs+j])
					p := max(x*f16At(c.lo, i*c.vs+j), x*f16At(c.hi, i*c.vs+j))
					s, m = s+p, m+math.Abs(p)
				}
				return
			},
			"int8": func(i int) (s, m float64) {
				for j := range c.d {
					p := float64(c.q[i*c.qs+j]) * float64(c.i8[i*c.vs+j])
					s, m = s+p, m+math.Abs(p)
				}
				return
			},
		}
		impls := map[string][]impl{
			"dots": {{"exported", func(o []float32) { must(t, DotsF16(o, c.q, c.f16, c.d, c.qs, c.vs)) }},
				{"go", func(o []float32) { dotsF16Go(o, c.q, c.f16, c.d, c.qs, c.vs) }}},
			"sqdists": {{"exported", func(o []float32) { must(t, SqDistsF16(o, c.q, c.f16, c.d, c.qs, c.vs)) }},
				{"go", func(o []float32) { sqDistsF16Go(o, c.q, c.f16, c.d, c.qs, c.vs) }}},
			"quest": {{"exported", func(o []float32) { must(t, QuestBoundsF16(o, c.q, c.lo, c.hi, c.d, c.qs, c.vs)) }},
				{"go", func(o []float32) { questF16Go(o, c.q, c.lo, c.hi, c.d, c.qs, c.vs) }}},
			"int8": {{"exported", func(o []float32) { must(t, DotsInt8(o, c.q, c.i8, c.d, c.qs, c.vs)) }},
				{"go", func(o []float32) { dotsInt8Go(o, c.q, c.i8, c.d, c.qs, c.vs) }}},
		}
		for name, ref := range refs {
			for _, im := range impls[name] {
				out := make([]float32, c.n+1)
				out[c.n] = 42
				im.run(out[:c.n])
				if out[c.n] != 42 {
					t.Fatalf("case %d %s/%s wrote past out", it, name, im.name)
				}
				for i := range c.n {
					want, mag := ref(i)
					if !closeTo(out[i], want, mag) {
						t.Fatalf("case %d %s/%s: n %d d %d qs %d vs %d: run %d = %v, want %v", it, name, im.name, c.n, c.d, c.qs, c.vs, i, out[i], want)
					}
				}
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestScoreKernelsRefuseShortArguments: a run beyond q or v is ErrInvalid and nothing is
// written.
func TestScoreKernelsRefuseShortArguments(t *testing.T) {
	q := make([]float32, 16)
	v := make([]byte, 32)
	out := []float32{7, 7}
	for _, err := range []error{
		DotsF16(out, q, v, 16, 16, 0), // q needs 32
		DotsF16(out, q, v, 16, 0, 16), // v needs 32 elements
		SqDistsF16(out, q, v[:30], 16, 0, 0),
		QuestBoundsF16(out, q, v, v[:2], 16, 0, 0),
		DotsInt8(out, q, make([]int8, 15), 16, 0, 0),
		DotsF16(out, q, v, 0, 0, 0),
		DotsF16(out, q, v, 8, -1, 0),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("err %v, want ErrInvalid", err)
		}
	}
	if out[0] != 7 || out[1] != 7 {
		t.Fatalf("out written: %v", out)
	}
	if _, _, err := HammingRows(make([]byte, 32), make([]byte, 63), 2); !errors.Is(err, ErrInvalid) {
		t.Fatalf("hamming rows: %v", err)
	}
}

// TestHammingRows: min and total equal Hamming row by row, for the assembly widths (multiples
// of 32 bytes) and others.
func TestHammingRows(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for it := range 500 {
		w := []int{1, 4, 8, 13, 32, 64, 96, 512}[r.IntN(8)]
		rows := r.IntN(20)
		q := make([]byte, w)
		codes := make([]byte, rows*w+r.IntN(5))
		for i := range q {
			q[i] = byte(r.Uint32())
		}
		for i := range codes {
			codes[i] = byte(r.Uint32())
			if r.IntN(4) == 0 && i < rows*w {
				codes[i] = q[i%w] // near rows
			}
		}
		wantMin, wantTotal := 0, 0
		for j := range rows {
			d := Hamming(q, codes[j*w:(j+1)*w])
			wantTotal += d
			if j == 0 || d < wantMin {
				wantMin = d
			}
		}
		gotMin, gotTotal, err := HammingRows(q, codes, rows)
		if err != nil || gotMin != wantMin || gotTotal != wantTotal {
			t.Fatalf("case %d (w %d rows %d): %d, %d, %v; want %d, %d", it, w, rows, gotMin, gotTotal, err, wantMin, wantTotal)
		}
		if rows > 0 {
			m, tot := hammingRowsGo(q, codes[:rows*w], rows)
			if m != wantMin || tot != wantTotal {
				t.Fatalf("case %d portable: %d, %d; want %d, %d", it, m, tot, wantMin, wantTotal)
			}
		}
	}
}

// BenchmarkScoreKernels: the kernels over 8 MiB of fp16 (a 128K-token context's ESA layer at
// 32 heads × 128 dims), 4 MiB of int8 and 64 MiB of hash codes.
func BenchmarkScoreKernels(b *testing.B) {
	const blocks, row = 1024, 32 * 128
	q := make([]float32, row)
	for i := range q {
		q[i] = float32(i%7) - 3
	}
	v := make([]byte, 2*blocks*row)
	for i := range blocks * row {
		binary.LittleEndian.PutUint16(v[2*i:], Float32ToFloat16(float32(i%13)-6))
	}
	out := make([]float32, 1)
	b.Run("dotsF16-8MiB", func(b *testing.B) {
		b.SetBytes(int64(len(v)))
		for range b.N {
			for j := range blocks {
				dotsF16(out, q, v[2*j*row:], row, 0, 0)
			}
		}
	})
	i8 := make([]int8, blocks*row)
	b.Run("dotsInt8-4MiB", func(b *testing.B) {
		b.SetBytes(int64(len(i8)))
		for range b.N {
			for j := range blocks {
				dotsInt8(out, q, i8[j*row:], row, 0, 0)
			}
		}
	})
	codes := make([]byte, 64<<20) // filled: untouched zero pages would all be one page
	for i := range codes {
		codes[i] = byte(i * 131 >> 3)
	}
	b.Run("hammingRows-64MiB", func(b *testing.B) {
		b.SetBytes(int64(len(codes)))
		for range b.N {
			for j := range blocks {
				hammingRows(codes[:512], codes[j<<16:(j+1)<<16], 128)
			}
		}
	})
	dst := make([]byte, len(v))
	b.Run("memcpy-8MiB", func(b *testing.B) {
		b.SetBytes(int64(len(v)))
		for range b.N {
			for j := range blocks {
				copy(dst[2*j*row:2*(j+1)*row], v[2*j*row:])
			}
		}
	})
}

// TestHammingTable: the table's per-row sums over a query set equal Σ_i Hamming(q_i, row) by
// the bit loop of Hamming, and with one query HammingRows; bad shapes are ErrInvalid.
func TestHammingTable(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var tab HammingTable
	for it := range 300 {
		n, w, rows := 1+r.IntN(20), 1+r.IntN(80), r.IntN(12)
		q := make([]byte, n*w)
		for i := range q {
			q[i] = byte(r.Uint32())
		}
		codes := make([]byte, rows*w+r.IntN(3))
		for i := range codes {
			codes[i] = byte(r.Uint32())
		}
		if it%5 == 0 && rows > 0 {
			copy(codes, q[:w]) // a row equal to one query
		}
		if err := tab.Reset(q, n); err != nil || tab.Width() != w {
			t.Fatalf("case %d: reset: %v, width %d", it, err, tab.Width())
		}
		wantMin, wantTotal := 0, 0
		for j := range rows {
			d := 0
			for i := range n {
				d += Hamming(q[i*w:(i+1)*w], codes[j*w:(j+1)*w])
			}
			wantTotal += d
			if j == 0 || d < wantMin {
				wantMin = d
			}
		}
		gotMin, gotTotal, err := tab.Rows(codes, rows)
		if err != nil || gotMin != wantMin || gotTotal != wantTotal {
			t.Fatalf("case %d (n %d w %d rows %d): %d, %d, %v; want %d, %d", it, n, w, rows, gotMin, gotTotal, err, wantMin, wantTotal)
		}
		if n == 1 {
			m, tot, _ := HammingRows(q, codes, rows)
			if m != gotMin || tot != gotTotal {
				t.Fatalf("case %d: one query: %d, %d; HammingRows %d, %d", it, gotMin, gotTotal, m, tot)
			}
		}
	}
	for _, c := range []struct {
		q []byte
		n int
	}{{nil, 1}, {make([]byte, 5), 2}, {make([]byte, 4), 0}, {make([]byte, 2*(MaxHeads+1)), MaxHeads + 1}, {make([]byte, MaxHammingTableBytes+1), 1}} {
		if err := tab.Reset(c.q, c.n); !errors.Is(err, ErrInvalid) || tab.Width() != 0 {
			t.Fatalf("reset %d bytes for %d: %v, width %d; want ErrInvalid and an empty table", len(c.q), c.n, err, tab.Width())
		}
	}
	if _, _, err := tab.Rows(make([]byte, 8), 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("rows on an empty table: %v", err)
	}
	_ = tab.Reset(make([]byte, 8), 2)
	if _, _, err := tab.Rows(make([]byte, 7), 2); !errors.Is(err, ErrInvalid) {
		t.Fatalf("rows beyond the codes: %v", err)
	}
}

// BenchmarkHammingTable: MLA's distance over a 128K-token layer (1,024 blocks of 128 tokens,
// 72-byte codes: 512 + 64 bits) against 64 query codes.
func BenchmarkHammingTable(b *testing.B) {
	const w, heads, tokens = 72, 64, 1024 * 128
	r := rand.New(rand.NewPCG(1, 2))
	q := make([]byte, heads*w)
	codes := make([]byte, tokens*w)
	for i := range q {
		q[i] = byte(r.Uint32())
	}
	for i := range codes {
		codes[i] = byte(r.Uint32())
	}
	var t HammingTable
	if err := t.Reset(q, heads); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(codes)))
	for range b.N {
		for j := range 1024 {
			if _, _, err := t.Rows(codes[j*128*w:], 128); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestHammingTablePlanes: where the CPU has the planes kernel, its sums equal the tables' for
// query sets up to MaxHeads (eleven planes) and code widths that are and are not multiples of
// 32 bytes (the last chunk overlapping the one before).
func TestHammingTablePlanes(t *testing.T) {
	if !haveHammingPlanes {
		t.Skip("no AVX-512 VPOPCNTDQ")
	}
	defer func() { haveHammingPlanes = true }()
	r := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 2, 63, 64, 65, 1024} {
		for _, w := range []int{32, 40, 64, 72, 96, 200} {
			q := make([]byte, n*w)
			for i := range q {
				q[i] = byte(r.Uint32())
			}
			const rows = 37
			codes := make([]byte, rows*w)
			for i := range codes {
				codes[i] = byte(r.Uint32())
			}
			copy(codes[5*w:], q[:w])
			var planes, tables HammingTable
			haveHammingPlanes = true
			if err := planes.Reset(q, n); err != nil || planes.chunks == 0 {
				t.Fatalf("n %d w %d: %v, chunks %d", n, w, err, planes.chunks)
			}
			haveHammingPlanes = false
			if err := tables.Reset(q, n); err != nil {
				t.Fatal(err)
			}
			for k := 1; k <= rows; k += 9 {
				pm, pt, err1 := planes.Rows(codes, k)
				tm, tt, err2 := tables.Rows(codes, k)
				if err1 != nil || err2 != nil || pm != tm || pt != tt {
					t.Fatalf("n %d w %d rows %d: planes %d, %d (%v); tables %d, %d (%v)", n, w, k, pm, pt, err1, tm, tt, err2)
				}
			}
		}
	}
}

// randF32Case draws n runs of d float32 values with strides qs, vs over q and v, d spanning
// the kernels' shapes: below a lane width, multiples of 8 and of 16, and ESA's row widths.
func randF32Case(r *rand.Rand) (n, d, qs, vs int, q, v []float32) {
	n = 1 + r.IntN(9)
	d = []int{1, 3, 8, 16, 24, 40, 64, 72, 128, 136, 1024, 4096}[r.IntN(12)]
	qs = []int{0, d, d + 8}[r.IntN(3)]
	vs = []int{0, d, 2*d + 3}[r.IntN(3)]
	q = make([]float32, (n-1)*qs+d)
	v = make([]float32, (n-1)*vs+d)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	for i := range v {
		v[i] = float32(r.NormFloat64() * 3)
	}
	return
}

// checkDotsF32 runs dots over a random case and compares every result with a float64 sum
// (relative to the sum of the terms' magnitudes), and checks nothing past out is written.
func checkDotsF32(t *testing.T, name string, seed uint64, dots func(out, q, v []float32, d, qs, vs int)) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 11))
	for it := range 600 {
		n, d, qs, vs, q, v := randF32Case(r)
		out := make([]float32, n+1)
		out[n] = 42
		dots(out[:n], q, v, d, qs, vs)
		if out[n] != 42 {
			t.Fatalf("%s case %d wrote past out", name, it)
		}
		for i := range n {
			var want, mag float64
			for j := range d {
				p := float64(q[i*qs+j]) * float64(v[i*vs+j])
				want, mag = want+p, mag+math.Abs(p)
			}
			if !closeTo(out[i], want, mag) {
				t.Fatalf("%s case %d: n %d d %d qs %d vs %d: run %d = %v, want %v", name, it, n, d, qs, vs, i, out[i], want)
			}
		}
	}
}

// TestDotsF32 checks DotsF32 (the kernel the CPU takes) and the portable loop against float64
// sums, and that short arguments are ErrInvalid with nothing written.
func TestDotsF32(t *testing.T) {
	checkDotsF32(t, "exported", 1, func(out, q, v []float32, d, qs, vs int) { must(t, DotsF32(out, q, v, d, qs, vs)) })
	checkDotsF32(t, "go", 2, dotsF32Go)
	out := []float32{7, 7}
	for _, err := range []error{
		DotsF32(out, make([]float32, 16), make([]float32, 16), 16, 16, 0), // q needs 32
		DotsF32(out, make([]float32, 16), make([]float32, 31), 16, 0, 16), // v needs 32
		DotsF32(out, nil, nil, 0, 0, 0),
		DotsF32(out, make([]float32, 8), make([]float32, 8), 8, 0, -1),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("err %v, want ErrInvalid", err)
		}
	}
	if out[0] != 7 || out[1] != 7 {
		t.Fatalf("out written: %v", out)
	}
}

// TestDotsF16Rows: every row against every query equals a float64 sum within rounding, for
// group sizes 1 to 9 (the four-query kernels and the remainder), odd and even row counts, row
// strides and query strides; DotsF16RowsMax's maxima are the largest results; bad shapes are
// refused.
func TestDotsF16Rows(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for it := range 300 {
		g, n, d := 1+r.IntN(9), 1+r.IntN(20), []int{3, 8, 16, 64, 72}[r.IntN(5)]
		qs, vs := []int{d, d + 8}[r.IntN(2)], []int{d, 3 * d}[r.IntN(2)]
		q := make([]float32, (g-1)*qs+d)
		for i := range q {
			q[i] = float32(r.NormFloat64())
		}
		v := make([]byte, 2*((n-1)*vs+d))
		for i := range len(v) / 2 {
			binary.LittleEndian.PutUint16(v[2*i:], Float32ToFloat16(float32(r.NormFloat64())))
		}
		nan := it%5 == 0 // a NaN in the last row: its results are NaN, no maximum
		if nan {
			binary.LittleEndian.PutUint16(v[2*(n-1)*vs:], 0x7e00)
		}
		out := make([]float32, n*g)
		must(t, DotsF16Rows(out, q, v, g, d, qs, vs))
		out2, mx := make([]float32, n*g), make([]float32, g)
		must(t, DotsF16RowsMax(out2, mx, q, v, g, d, qs, vs))
		if !slices.EqualFunc(out, out2, func(a, b float32) bool { return a == b || a != a && b != b }) {
			t.Fatalf("case %d: with maxima %v, without %v", it, out2, out)
		}
		for j := range g {
			want := float32(math.Inf(-1))
			for row := range n {
				if out[row*g+j] > want {
					want = out[row*g+j]
				}
			}
			if mx[j] != want {
				t.Fatalf("case %d (g %d, n %d): max of query %d %v, want %v", it, g, n, j, mx[j], want)
			}
		}
		for row := range n {
			if nan && row == n-1 {
				for j := range g {
					if !math.IsNaN(float64(out[row*g+j])) {
						t.Fatalf("case %d: NaN row, query %d: %v", it, j, out[row*g+j])
					}
				}
				continue
			}
			for j := range g {
				var want, mag float64
				for i := range d {
					x := float64(q[j*qs+i]) * f16At(v, row*vs+i)
					want += x
					mag += math.Abs(x)
				}
				if !closeTo(out[row*g+j], want, mag) {
					t.Fatalf("case %d (g %d, d %d): row %d query %d: %v, want %v", it, g, d, row, j, out[row*g+j], want)
				}
			}
		}
	}
	if err := DotsF16Rows(make([]float32, 5), make([]float32, 16), make([]byte, 32), 2, 8, 8, 8); !errors.Is(err, ErrInvalid) {
		t.Fatalf("5 results for 2 queries: %v", err)
	}
	if err := DotsF16Rows(make([]float32, 4), make([]float32, 16), make([]byte, 30), 2, 8, 8, 8); !errors.Is(err, ErrInvalid) {
		t.Fatalf("short rows: %v", err)
	}
	if err := DotsF16RowsMax(make([]float32, 4), make([]float32, 3), make([]float32, 16), make([]byte, 32), 2, 8, 8, 8); !errors.Is(err, ErrInvalid) {
		t.Fatalf("3 maxima for 2 queries: %v", err)
	}
}

// TestSumRowBlocks: each column's sum over each block of rows equals a float64 sum within
// rounding, for column counts 1 to 9 (the four-column kernel among them), odd and even block
// lengths; bad shapes are refused.
func TestSumRowBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for it := range 300 {
		c, m, blocks := 1+r.IntN(9), 1+r.IntN(40), r.IntN(6)
		x := make([]float32, blocks*m*c)
		for i := range x {
			x[i] = float32(r.ExpFloat64())
		}
		out := make([]float32, blocks*c)
		must(t, SumRowBlocks(out, x, c, m))
		for b := range blocks {
			for j := range c {
				var want float64
				for i := range m {
					want += float64(x[(b*m+i)*c+j])
				}
				if !closeTo(out[b*c+j], want, want) {
					t.Fatalf("case %d (c %d, m %d): block %d column %d: %v, want %v", it, c, m, b, j, out[b*c+j], want)
				}
			}
		}
	}
	if err := SumRowBlocks(make([]float32, 4), make([]float32, 12), 4, 4); !errors.Is(err, ErrInvalid) {
		t.Fatalf("12 values for 4 sums of 4 rows: %v", err)
	}
	if err := SumRowBlocks(make([]float32, 6), make([]float32, 24), 4, 4); !errors.Is(err, ErrInvalid) {
		t.Fatalf("6 sums of 4 columns: %v", err)
	}
}
