package kernels

import (
	"encoding/binary"
	"math/bits"
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
