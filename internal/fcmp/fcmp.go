// Package fcmp is the one float-vector comparison of the repository's tests: how far one
// vector is from another, relative to the reference's largest element, so that a tolerance
// means the same for K of any scale.
package fcmp

import "math"

// MaxRelDiff returns the largest |got[i] − want[i]| divided by the largest |want[i]| (a
// reference of all zeros divides by 1e-30), and 1 when the lengths differ, so that a mismatch in
// shape never passes a tolerance below 1.
func MaxRelDiff(got, want []float32) float64 {
	if len(got) != len(want) {
		return 1
	}
	var d, n float64
	for i := range got {
		d = max(d, math.Abs(float64(got[i])-float64(want[i])))
		n = max(n, math.Abs(float64(want[i])))
	}
	return d / max(n, 1e-30)
}
