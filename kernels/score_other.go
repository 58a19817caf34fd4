//go:build !amd64

package kernels

func dotsF16(out, q []float32, v []byte, d, qs, vs int) { dotsF16Go(out, q, v, d, qs, vs) }

func dotsF16Rows(out, mx, q []float32, v []byte, n, g, d, qs, vs int) {
	dotsF16RowsGo(out, mx, q, v, n, g, d, qs, vs)
}

func sumRowBlocks(out, x []float32, c, m int) { sumRowBlocksGo(out, x, c, m) }

func dotsF32(out, q, v []float32, d, qs, vs int) { dotsF32Go(out, q, v, d, qs, vs) }

func sqDistsF16(out, q []float32, v []byte, d, qs, vs int) { sqDistsF16Go(out, q, v, d, qs, vs) }

func questF16(out, q []float32, lo, hi []byte, d, qs, vs int) { questF16Go(out, q, lo, hi, d, qs, vs) }

func dotsInt8(out, q []float32, v []int8, d, qs, vs int) { dotsInt8Go(out, q, v, d, qs, vs) }

func hammingRows(q, codes []byte, rows int) (int, int) { return hammingRowsGo(q, codes, rows) }

// haveHammingPlanes is false: HammingTable uses its tables.
var haveHammingPlanes = false

func hammingPlanesAVX512(codes *byte, planes *uint64, out *int32, w, chunks, nplanes, rows, n int) {
	panic("kernels: no planes kernel on this architecture")
}
