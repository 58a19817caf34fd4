package kernels

import (
	"encoding/binary"
	"math"
	"math/bits"

	"github.com/ucm-go/ucm/internal/reuse"
)

// Scoring kernels of sparse-attention selection: the inner loops that read stored block
// representations in place (fp16 or int8 elements, hash codes) against a float32 query.
//
// Each function computes n = len(out) results, result i from the query run q[i·qs : i·qs+d]
// and the representation run starting at element i·vs of v (qs or vs may be 0 to reuse one
// run, e.g. a KV head's representation against each query head of its group). Lengths are
// checked once per call; a short argument is ErrInvalid and writes nothing.
//
// On amd64 with AVX2, FMA and F16C (and d a multiple of 8) the sums run in float32 over eight
// lanes and four independent accumulators; elsewhere a portable loop sums in float32 in order.
// The results differ from a float64 sum by rounding only (relative 1e-6 for the lengths of a
// head or a block); callers that compare with a reference need a tolerance for near ties.

// scoreRuns checks the arguments common to the kernels: n runs of d elements with strides qs
// and vs over q (len nq) and v (elements nv).
func scoreRuns(what string, n, d, qs, vs, nq, nv int) error {
	if n == 0 {
		return nil
	}
	if d < 1 || qs < 0 || vs < 0 {
		return errorf(ErrInvalid, "%s: run of %d with strides %d, %d", what, d, qs, vs)
	}
	if (n-1)*qs+d > nq || (n-1)*vs+d > nv {
		return errorf(ErrInvalid, "%s: %d runs of %d (strides %d, %d) over a query of %d and %d values", what, n, d, qs, vs, nq, nv)
	}
	return nil
}

// DotsF16 sets out[i] = Σ_{j<d} q[i·qs+j]·v[i·vs+j] for the fp16 (little-endian) elements v.
func DotsF16(out, q []float32, v []byte, d, qs, vs int) error {
	if err := scoreRuns("dots f16", len(out), d, qs, vs, len(q), len(v)/2); err != nil {
		return err
	}
	if len(out) > 0 {
		dotsF16(out, q, v, d, qs, vs)
	}
	return nil
}

// DotsF16Rows sets out[r·g+j] = Σ_{i<d} q[j·qs+i]·v[r·vs+i] for the n = len(out)/g rows of the
// fp16 (little-endian) v and the g query runs of q: every row against every query (the g query
// heads of a GQA group against each row of their KV head). On amd64 (AVX2, FMA, F16C, d a
// multiple of 8) each row is converted once per four queries; with g a multiple of four, two
// rows at a time go against four queries and their eight sums are reduced together.
func DotsF16Rows(out, q []float32, v []byte, g, d, qs, vs int) error {
	return DotsF16RowsMax(out, nil, q, v, g, d, qs, vs)
}

// DotsF16RowsMax is DotsF16Rows that also sets mx[j] (len(mx) = g; nil: not computed) to the
// largest result of query j over the rows, ignoring NaN (−Inf when there is none): the
// column maxima a softmax over the rows shifts by.
func DotsF16RowsMax(out, mx, q []float32, v []byte, g, d, qs, vs int) error {
	if g < 1 || len(out)%g != 0 || (mx != nil && len(mx) != g) {
		return errorf(ErrInvalid, "dots f16 rows: %d results and %d maxima for %d queries", len(out), len(mx), g)
	}
	n := len(out) / g
	if err := scoreRuns("dots f16 rows: queries", g, d, qs, 0, len(q), d); err != nil {
		return err
	}
	if err := scoreRuns("dots f16 rows: rows", n, d, 0, vs, d, len(v)/2); err != nil {
		return err
	}
	for j := range mx {
		mx[j] = float32(math.Inf(-1))
	}
	if n == 0 {
		return nil
	}
	dotsF16Rows(out, mx, q, v, n, g, d, qs, vs)
	return nil
}

// dotsF16RowsGo is the portable DotsF16RowsMax (and the amd64 one's remainder): row by row.
func dotsF16RowsGo(out, mx, q []float32, v []byte, n, g, d, qs, vs int) {
	for r := range n {
		o := out[r*g : (r+1)*g]
		dotsF16(o, q, v[2*r*vs:], d, qs, 0)
		colMax(mx, o)
	}
}

// colMax raises mx[j] to row[j] where that is larger (a NaN never is); nil mx: nothing.
func colMax(mx, row []float32) {
	for j, x := range mx {
		if row[j] > x {
			mx[j] = row[j]
		}
	}
}

// SumRowBlocks treats x as rows of c columns and sets out[b·c+j] = Σ_{i<m} x[(b·m+i)·c+j]:
// each column's sum over every m consecutive rows (a block's share of a softmax over rows).
// len(x) must be len(out)·m and len(out) a multiple of c. On amd64 with AVX2 and four columns
// (m even) two rows are added as one vector, four vectors at a time; otherwise in order.
func SumRowBlocks(out, x []float32, c, m int) error {
	if c < 1 || m < 1 || len(out)%c != 0 || len(x)/m != len(out) || len(x)%m != 0 {
		return errorf(ErrInvalid, "sum row blocks: %d values in blocks of %d rows of %d columns for %d sums", len(x), m, c, len(out))
	}
	if len(out) > 0 {
		sumRowBlocks(out, x, c, m)
	}
	return nil
}

func sumRowBlocksGo(out, x []float32, c, m int) {
	for b := range len(out) / c {
		o := out[b*c : (b+1)*c]
		clear(o)
		for i := range m {
			for j, v := range x[(b*m+i)*c : (b*m+i+1)*c] {
				o[j] += v
			}
		}
	}
}

// DotsF32 sets out[i] = Σ_{j<d} q[i·qs+j]·v[i·vs+j] for float32 v: the dot products of
// representations kept as float32 rows (ESA's retrieval over a caller's matrix). On amd64 the
// sums run over sixteen lanes with AVX-512 (d a multiple of 16) or eight with AVX2 and FMA (d a
// multiple of 8), four accumulators each; otherwise in order in float32.
func DotsF32(out, q, v []float32, d, qs, vs int) error {
	if err := scoreRuns("dots f32", len(out), d, qs, vs, len(q), len(v)); err != nil {
		return err
	}
	if len(out) > 0 {
		dotsF32(out, q, v, d, qs, vs)
	}
	return nil
}

// SqDistsF16 sets out[i] = Σ_{j<d} (q[i·qs+j] − v[i·vs+j])² for the fp16 elements v.
func SqDistsF16(out, q []float32, v []byte, d, qs, vs int) error {
	if err := scoreRuns("sqdists f16", len(out), d, qs, vs, len(q), len(v)/2); err != nil {
		return err
	}
	if len(out) > 0 {
		sqDistsF16(out, q, v, d, qs, vs)
	}
	return nil
}

// QuestBoundsF16 sets out[i] = Σ_{j<d} max(q_j·lo_j, q_j·hi_j) (Quest's bound, as QuestBound)
// over the runs i of q and of the fp16 minima lo and maxima hi (both with stride vs).
func QuestBoundsF16(out, q []float32, lo, hi []byte, d, qs, vs int) error {
	if err := scoreRuns("quest f16", len(out), d, qs, vs, len(q), min(len(lo), len(hi))/2); err != nil {
		return err
	}
	if len(out) > 0 {
		questF16(out, q, lo, hi, d, qs, vs)
	}
	return nil
}

// DotsInt8 sets out[i] = Σ_{j<d} q[i·qs+j]·v[i·vs+j] for the int8 elements v (unscaled: a
// per-tensor scale multiplies the result).
func DotsInt8(out, q []float32, v []int8, d, qs, vs int) error {
	if err := scoreRuns("dots int8", len(out), d, qs, vs, len(q), len(v)); err != nil {
		return err
	}
	if len(out) > 0 {
		dotsInt8(out, q, v, d, qs, vs)
	}
	return nil
}

// HammingRows returns the smallest and the total Hamming distance between q and each of the
// rows consecutive rows of len(q) bytes in codes (min is 0 when rows is 0). It is Hamming of
// q against each row, fused: GSA On-Device's block distance over a block's tokens.
func HammingRows(q, codes []byte, rows int) (minDist, total int, err error) {
	if rows < 0 || rows*len(q) > len(codes) {
		return 0, 0, errorf(ErrInvalid, "hamming rows: %d rows of %d bytes in %d", rows, len(q), len(codes))
	}
	if rows == 0 || len(q) == 0 {
		return 0, 0, nil
	}
	minDist, total = hammingRows(q, codes[:rows*len(q)], rows)
	return minDist, total, nil
}

// Portable implementations (and the amd64 fallbacks for shapes the assembly does not take).

func dotsF16Go(out, q []float32, v []byte, d, qs, vs int) {
	t := f16Table()
	for i := range out {
		qq, vv := q[i*qs:i*qs+d], v[2*i*vs:2*(i*vs+d)]
		var s float32
		for j, x := range qq {
			s += x * t[binary.LittleEndian.Uint16(vv[2*j:])]
		}
		out[i] = s
	}
}

func dotsF32Go(out, q, v []float32, d, qs, vs int) {
	for i := range out {
		qq, vv := q[i*qs:i*qs+d], v[i*vs:i*vs+d]
		var s float32
		for j, x := range qq {
			s += x * vv[j]
		}
		out[i] = s
	}
}

func sqDistsF16Go(out, q []float32, v []byte, d, qs, vs int) {
	t := f16Table()
	for i := range out {
		qq, vv := q[i*qs:i*qs+d], v[2*i*vs:2*(i*vs+d)]
		var s float32
		for j, x := range qq {
			e := x - t[binary.LittleEndian.Uint16(vv[2*j:])]
			s += e * e
		}
		out[i] = s
	}
}

func questF16Go(out, q []float32, lo, hi []byte, d, qs, vs int) {
	t := f16Table()
	for i := range out {
		qq := q[i*qs : i*qs+d]
		l, h := lo[2*i*vs:2*(i*vs+d)], hi[2*i*vs:2*(i*vs+d)]
		var s float32
		for j, x := range qq {
			s += max(x*t[binary.LittleEndian.Uint16(l[2*j:])], x*t[binary.LittleEndian.Uint16(h[2*j:])])
		}
		out[i] = s
	}
}

func dotsInt8Go(out, q []float32, v []int8, d, qs, vs int) {
	for i := range out {
		qq, vv := q[i*qs:i*qs+d], v[i*vs:i*vs+d]
		var s float32
		for j, x := range qq {
			s += x * float32(vv[j])
		}
		out[i] = s
	}
}

func hammingRowsGo(q, codes []byte, rows int) (minDist, total int) {
	w := len(q)
	minDist = 8*w + 1
	for r := range rows {
		row := codes[r*w : (r+1)*w]
		d, j := 0, 0
		for ; j+8 <= w; j += 8 {
			d += bits.OnesCount64(binary.LittleEndian.Uint64(q[j:]) ^ binary.LittleEndian.Uint64(row[j:]))
		}
		for ; j < w; j++ {
			d += bits.OnesCount8(q[j] ^ row[j])
		}
		total += d
		minDist = min(minDist, d)
	}
	return minDist, total
}

// HammingTable holds a set of n query codes of w bytes each as per-byte lookup tables, so that
// the sum over the set of the Hamming distances to one key code, Σ_i Hamming(q_i, k), costs w
// table lookups rather than n·w/8 popcounts. It is GSA On-Device's MLA distance: the query
// heads (after reduction_head_num) are hashed one by one and all compared with the single
// latent head's code of each token.
//
// For bit j let c_j be the number of queries with bit j set; then Σ_i [q_ij ≠ k_j] is n − c_j
// when k_j is 1 and c_j when it is 0, so the sum is Σ_j c_j + Σ_{j: k_j = 1} (n − 2c_j): a base
// plus, for each byte of k, a precomputed sum over that byte's set bits. The zero value is an
// empty table; Reset fills it (reusing its storage).
type HammingTable struct {
	w, n, base int
	// tab[p][v] is byte position p's sum for byte value v, |·| ≤ 8·n ≤ 8·MaxHeads: int16
	// keeps a 576-bit code's tables (36 KiB) in a first-level cache. Built only when the
	// planes below are not.
	tab [][256]int16
	// With AVX-512 VPOPCNTDQ and codes of at least 32 bytes, Rows counts by bit planes
	// instead (hammingPlanesAVX512): Σ_j k_j·c_j = Σ_b 2^b·popcount(k AND plane_b), plane_b
	// holding bit b of every c_j, so a token costs (planes + 1) popcounts per 256 bits.
	// planes is [nplanes+1][chunks][4] words, the last plane the mask of the bits that count
	// (the last chunk is the code's last 32 bytes and may overlap the one before); out holds
	// the kernel's per-row results; counts is c_j for every bit j.
	planes          []uint64
	chunks, nplanes int
	out             []int32
	counts          []int32
}

// MaxHammingTableBytes bounds the code width a HammingTable takes (a 64 Ki-bit code: 4 MiB of
// tables).
const MaxHammingTableBytes = 8192

// Reset makes t the table of the n codes of w = len(q)/n bytes in q (code i at q[i·w:]). n
// must be in [1, MaxHeads], len(q) a nonzero multiple of n and w ≤ MaxHammingTableBytes;
// otherwise it returns ErrInvalid and t is emptied.
func (t *HammingTable) Reset(q []byte, n int) error {
	t.w, t.n, t.base = 0, 0, 0
	if n < 1 || n > MaxHeads || len(q) == 0 || len(q)%n != 0 || len(q)/n > MaxHammingTableBytes {
		return errorf(ErrInvalid, "hamming table: %d bytes of codes for %d queries (at most %d queries of %d bytes)", len(q), n, MaxHeads, MaxHammingTableBytes)
	}
	w := len(q) / n
	t.counts = reuse.Grow(t.counts, 8*w)
	for i := range n {
		for j, v := range q[i*w : (i+1)*w] {
			for ; v != 0; v &= v - 1 {
				t.counts[8*j+bits.TrailingZeros8(v)]++
			}
		}
	}
	for _, c := range t.counts {
		t.base += int(c)
	}
	t.w, t.n = w, n
	if t.setPlanes() {
		return nil
	}
	if cap(t.tab) < w {
		t.tab = make([][256]int16, w)
	}
	t.tab = t.tab[:w]
	var weight [8]int16
	for p := range w {
		for b := range weight {
			weight[b] = int16(n - 2*int(t.counts[8*p+b]))
		}
		tab := &t.tab[p]
		tab[0] = 0
		for v := 1; v < 256; v++ { // v's lowest set bit plus the rest of v
			tab[v] = weight[bits.TrailingZeros8(uint8(v))] + tab[v&(v-1)]
		}
	}
	return nil
}

// setPlanes builds the bit planes of t.counts when the planes kernel can take t's codes, and
// reports whether it did (else Rows uses the byte tables).
func (t *HammingTable) setPlanes() bool {
	t.chunks = 0
	if !haveHammingPlanes || t.w < 32 {
		return false
	}
	t.chunks, t.nplanes = (t.w+31)/32, bits.Len(uint(t.n))
	size := t.chunks * 4
	t.planes = reuse.Grow(t.planes, (t.nplanes+1)*size)
	last := t.chunks - 1
	for c := range t.chunks {
		first := 256 * c // the chunk's first bit of the code
		if c == last {
			first = 8 * (t.w - 32)
		}
		for p := range 256 {
			j := first + p
			if c == last && j < 256*last { // counted by the chunk before
				continue
			}
			word, bit := c*4+p/64, uint64(1)<<(p%64)
			t.planes[t.nplanes*size+word] |= bit // the mask
			for b := range t.nplanes {
				if t.counts[j]>>b&1 != 0 {
					t.planes[b*size+word] |= bit
				}
			}
		}
	}
	return true
}

// Width is the bytes of one code (0 for an empty table).
func (t *HammingTable) Width() int { return t.w }

// Rows returns the smallest and the total over rows consecutive key codes of t.Width() bytes
// in codes of Σ_i Hamming(q_i, k_row): HammingRows with the whole query set in place of one
// code. It returns ErrInvalid for an empty table or codes shorter than rows·Width().
func (t *HammingTable) Rows(codes []byte, rows int) (minDist, total int, err error) {
	if t.w == 0 || rows < 0 || rows*t.w > len(codes) {
		return 0, 0, errorf(ErrInvalid, "hamming table: %d rows of %d bytes in %d", rows, t.w, len(codes))
	}
	if rows == 0 {
		return 0, 0, nil
	}
	w := t.w
	minDist = t.n*8*w + 1
	if t.chunks > 0 {
		t.out = reuse.Grow(t.out, rows)
		hammingPlanesAVX512(&codes[0], &t.planes[0], &t.out[0], w, t.chunks, t.nplanes, rows, t.n)
		for _, v := range t.out {
			d := t.base + int(v)
			total += d
			minDist = min(minDist, d)
		}
		return minDist, total, nil
	}
	for r := range rows {
		row := codes[r*w : (r+1)*w]
		tab := t.tab[:len(row)]
		// Two accumulators over alternate bytes: the table loads are independent.
		var d0, d1 int32
		p := 0
		for ; p+1 < len(row); p += 2 {
			d0 += int32(tab[p][row[p]])
			d1 += int32(tab[p+1][row[p+1]])
		}
		if p < len(row) {
			d0 += int32(tab[p][row[p]])
		}
		d := t.base + int(d0+d1)
		total += d
		minDist = min(minDist, d)
	}
	return minDist, total, nil
}
