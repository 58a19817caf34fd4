package loop

// LoadPolicy says when Prefill loads the stored prefix of a prompt.
type LoadPolicy int

const (
	// LoadWhenFaster loads the stored prefix only when the prefill is estimated to finish
	// sooner with the load than by computing the whole prompt (see prefillCosts): a short
	// prefix on a slow medium is computed instead. The estimates come from the server's own
	// prefills; until both exist, and at every loadProbeEvery-th prefill that skipped a load,
	// the prefix is loaded, so the load's estimate keeps up with the medium.
	LoadWhenFaster LoadPolicy = iota
	// LoadAlways loads every stored prefix.
	LoadAlways
)

// loadProbeEvery is how often a prefill loads a prefix the estimates say to compute: one of
// every loadProbeEvery skips, so a medium that got faster is noticed.
const loadProbeEvery = 8

// prefillCosts estimates a prefill's parts from the server's past prefills: the compute's time
// against the tokens computed, and the load's time (until the last layer of the loaded blocks
// was resident) against the blocks loaded, each an exponentially weighted linear fit, so that
// a fixed cost per load (submission, staging) is seen apart from the cost per block.
type prefillCosts struct {
	compute, load linearFit
	skipped       int // prefills that computed a stored prefix since the last probe
}

// worthLoading reports whether a prompt of promptTokens should load its stored prefix of
// hitTokens: with the layer-wise overlap the prefill takes about the longer of the load and the
// compute of the rest, against the compute of the whole prompt without it.
func (c *prefillCosts) worthLoading(hitBlocks, hitTokens, promptTokens int) bool {
	load, okLoad := c.load.predict(float64(hitBlocks))
	rest, okRest := c.compute.predict(float64(promptTokens - hitTokens))
	all, okAll := c.compute.predict(float64(promptTokens))
	if !okLoad || !okRest || !okAll || max(load, rest) < all {
		return true
	}
	c.skipped++
	if c.skipped >= loadProbeEvery {
		c.skipped = 0
		return true
	}
	return false
}

// fitDecay is the weight a sample keeps at each newer one in a linearFit.
const fitDecay = 0.9

// linearFit is an exponentially weighted least-squares fit of y = a + b·x, with a, b >= 0.
type linearFit struct{ w, sx, sy, sxx, sxy float64 }

// add adds a sample; older ones weigh fitDecay times less at each.
func (f *linearFit) add(x, y float64) {
	f.w = f.w*fitDecay + 1
	f.sx = f.sx*fitDecay + x
	f.sy = f.sy*fitDecay + y
	f.sxx = f.sxx*fitDecay + x*x
	f.sxy = f.sxy*fitDecay + x*y
}

// predict returns the fit's y at x, and false before any sample. While every sample has the
// same x, y is taken as proportional to x.
func (f *linearFit) predict(x float64) (float64, bool) {
	if f.w == 0 {
		return 0, false
	}
	mx, my := f.sx/f.w, f.sy/f.w
	vx := f.sxx/f.w - mx*mx
	if vx <= 1e-9*max(1, mx*mx) {
		if mx == 0 {
			return my, true
		}
		return my / mx * x, true
	}
	b := max(0, (f.sxy/f.w-mx*my)/vx)
	a := max(0, my-b*mx)
	return a + b*x, true
}
