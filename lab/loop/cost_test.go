package loop

import (
	"math"
	"testing"
)

// The fit finds a fixed cost and a cost per unit apart, follows a change, and says when it has
// nothing to go on.
func TestLinearFit(t *testing.T) {
	var f linearFit
	if _, ok := f.predict(3); ok {
		t.Fatal("a prediction without samples")
	}
	f.add(4, 8)
	if y, ok := f.predict(2); !ok || y != 4 {
		t.Fatalf("one sample: predict(2) = %v %v, want 4 (proportional)", y, ok)
	}
	for x := 1.0; x <= 8; x++ {
		f.add(x, 5+2*x) // 5 fixed, 2 per unit
	}
	if y, _ := f.predict(10); math.Abs(y-25) > 0.5 {
		t.Fatalf("predict(10) = %v, want about 25", y)
	}
	for range 60 {
		for x := 1.0; x <= 8; x++ {
			f.add(x, 1+x) // the medium got faster
		}
	}
	if y, _ := f.predict(10); math.Abs(y-11) > 0.5 {
		t.Fatalf("after the change predict(10) = %v, want about 11", y)
	}
}

// A load is skipped only when the estimates say the whole prompt computes sooner than the load
// (overlapped with the rest's compute), and is probed again every loadProbeEvery skips.
func TestWorthLoading(t *testing.T) {
	var c prefillCosts
	if !c.worthLoading(4, 64, 100) {
		t.Fatal("skipped a load with no estimate")
	}
	for n := 10.0; n <= 200; n += 10 {
		c.compute.add(n, 0.001*n) // 1 ms per token
	}
	c.load.add(4, 0.010) // 4 blocks in 10 ms
	c.load.add(8, 0.012)
	if !c.worthLoading(4, 64, 100) { // load 10 ms, rest 36 ms: 36 < 100
		t.Fatal("a cheap load skipped")
	}
	c.load = linearFit{}
	c.load.add(1, 0.5) // 500 ms for one block
	c.load.add(2, 0.6)
	skips := 0
	for range 2 * loadProbeEvery {
		if !c.worthLoading(1, 16, 40) {
			skips++
		}
	}
	if skips != 2*loadProbeEvery-2 {
		t.Fatalf("%d of %d prefills skipped a slow load, want all but the two probes", skips, 2*loadProbeEvery)
	}
}
