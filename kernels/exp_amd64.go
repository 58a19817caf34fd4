package kernels

import "golang.org/x/sys/cpu"

// expColumnsAVX2 is ExpColumns over rows of cols values, cols a positive multiple of 8
// (exp_amd64.s).
//
//go:noescape
func expColumnsAVX2(x, shift, sum *float32, rows, cols int)

var haveAVX2FMA = cpu.X86.HasAVX2 && cpu.X86.HasFMA

func expColumns(x, shift, sum []float32) {
	c := len(shift)
	switch {
	case !haveAVX2FMA:
	case c%8 == 0:
		expColumnsAVX2(&x[0], &shift[0], &sum[0], len(x)/c, c)
		return
	case 8%c == 0 && len(x) >= 8:
		// 1, 2 or 4 columns: as 8, the shifts repeated and the lanes' sums folded; the last
		// values (fewer than 8) by the portable loop.
		var sh, s8 [8]float32
		for i := range sh {
			sh[i] = shift[i%c]
		}
		whole := len(x) &^ 7
		expColumnsAVX2(&x[0], &sh[0], &s8[0], whole/8, 8)
		for i, v := range s8 {
			sum[i%c] += v
		}
		expColumnsGo(x[whole:], shift, sum)
		return
	}
	expColumnsGo(x, shift, sum)
}
