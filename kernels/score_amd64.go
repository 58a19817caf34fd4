package kernels

import (
	"math"

	"golang.org/x/sys/cpu"
)

// The assembly kernels (score_amd64.s) take runs of d elements, d a positive multiple of 8;
// strides are in elements. The Go wrappers below choose them when the CPU has the instructions.

//go:noescape
func dotsF16AVX2(out, q *float32, v *byte, n, d, qs, vs int)

// dotsF16x4AVX2 is dotsF16AVX2 for four runs sharing one run of v (vs = 0).
//
//go:noescape
func dotsF16x4AVX2(out, q *float32, v *byte, d, qs int)

// dotsF16Rows4AVX2 is four queries against n (even) rows, row r's results at out + r·os, with
// eight running maxima in mx (score_amd64.s).
//
//go:noescape
func dotsF16Rows4AVX2(out, q *float32, v *byte, mx *float32, n, d, qs, vs, os int)

// sumRows4AVX2 is SumRowBlocks for four columns and m even (score_amd64.s).
//
//go:noescape
func sumRows4AVX2(out, x *float32, blocks, m int)

//go:noescape
func sqDistsF16AVX2(out, q *float32, v *byte, n, d, qs, vs int)

//go:noescape
func questF16AVX2(out, q *float32, lo, hi *byte, n, d, qs, vs int)

//go:noescape
func dotsInt8AVX2(out, q *float32, v *int8, n, d, qs, vs int)

//go:noescape
func dotsF32AVX2(out, q, v *float32, n, d, qs, vs int)

//go:noescape
func dotsF32AVX512(out, q, v *float32, n, d, qs, vs int)

//go:noescape
func hammingRowsAVX512(q, codes *byte, w, rows int) (minDist, total int)

// hammingPlanesAVX512 writes n·ones − 2·dot of each of rows key codes (score_amd64.s).
//
//go:noescape
func hammingPlanesAVX512(codes *byte, planes *uint64, out *int32, w, chunks, nplanes, rows, n int)

var (
	haveF16FMA   = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C
	havePopcnt32 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPOPCNTDQ
	// haveHammingPlanes enables HammingTable's planes kernel (a variable so tests can
	// compare it with the tables).
	haveHammingPlanes = havePopcnt32
	haveF32FMA        = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	// haveF32AVX512 enables DotsF32's sixteen-lane kernel (a variable so tests can compare it
	// with the eight-lane one).
	haveF32AVX512 = cpu.X86.HasAVX512F
)

func dotsF16(out, q []float32, v []byte, d, qs, vs int) {
	if haveF16FMA && d%8 == 0 {
		if vs == 0 && len(out) >= 4 { // a group's query heads against one row: convert it once
			i := 0
			for ; i+4 <= len(out); i += 4 {
				dotsF16x4AVX2(&out[i], &q[i*qs], &v[0], d, qs)
			}
			if i == len(out) {
				return
			}
			out, q = out[i:], q[i*qs:]
		}
		dotsF16AVX2(&out[0], &q[0], &v[0], len(out), d, qs, vs)
		return
	}
	dotsF16Go(out, q, v, d, qs, vs)
}

// haveRows4 enables DotsF16Rows's two-row kernel (a variable so tests can compare it with the
// row-by-row path).
var haveRows4 = haveF16FMA

func dotsF16Rows(out, mx, q []float32, v []byte, n, g, d, qs, vs int) {
	if !haveRows4 || g%4 != 0 || d%8 != 0 || n < 2 {
		dotsF16RowsGo(out, mx, q, v, n, g, d, qs, vs)
		return
	}
	even := n &^ 1
	for j := 0; j < g; j += 4 {
		var m8 [8]float32
		for i := range m8 {
			m8[i] = float32(math.Inf(-1))
		}
		dotsF16Rows4AVX2(&out[j], &q[j*qs], &v[0], &m8[0], even, d, qs, vs, g)
		if mx != nil {
			colMax(mx[j:j+4], m8[:4])
			colMax(mx[j:j+4], m8[4:])
		}
	}
	if even < n {
		dotsF16RowsGo(out[even*g:], mx, q, v[2*even*vs:], 1, g, d, qs, vs)
	}
}

func sumRowBlocks(out, x []float32, c, m int) {
	if haveAVX2FMA && c == 4 && m%2 == 0 {
		sumRows4AVX2(&out[0], &x[0], len(out)/4, m)
		return
	}
	sumRowBlocksGo(out, x, c, m)
}

func dotsF32(out, q, v []float32, d, qs, vs int) {
	switch {
	case haveF32AVX512 && d%16 == 0:
		dotsF32AVX512(&out[0], &q[0], &v[0], len(out), d, qs, vs)
	case haveF32FMA && d%8 == 0:
		dotsF32AVX2(&out[0], &q[0], &v[0], len(out), d, qs, vs)
	default:
		dotsF32Go(out, q, v, d, qs, vs)
	}
}

func sqDistsF16(out, q []float32, v []byte, d, qs, vs int) {
	if haveF16FMA && d%8 == 0 {
		sqDistsF16AVX2(&out[0], &q[0], &v[0], len(out), d, qs, vs)
		return
	}
	sqDistsF16Go(out, q, v, d, qs, vs)
}

func questF16(out, q []float32, lo, hi []byte, d, qs, vs int) {
	if haveF16FMA && d%8 == 0 {
		questF16AVX2(&out[0], &q[0], &lo[0], &hi[0], len(out), d, qs, vs)
		return
	}
	questF16Go(out, q, lo, hi, d, qs, vs)
}

func dotsInt8(out, q []float32, v []int8, d, qs, vs int) {
	if haveF16FMA && d%8 == 0 {
		dotsInt8AVX2(&out[0], &q[0], &v[0], len(out), d, qs, vs)
		return
	}
	dotsInt8Go(out, q, v, d, qs, vs)
}

func hammingRows(q, codes []byte, rows int) (int, int) {
	if havePopcnt32 && len(q)%32 == 0 {
		return hammingRowsAVX512(&q[0], &codes[0], len(q), rows)
	}
	return hammingRowsGo(q, codes, rows)
}
