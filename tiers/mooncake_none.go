//go:build !mooncake || !linux

package tiers

// MooncakeBuilt reports whether this binary links Mooncake's client library (the `mooncake`
// build tag, Linux only).
const MooncakeBuilt = false

// OpenMooncakePool fails with ErrMooncakeNotBuilt: this binary does not link Mooncake.
func OpenMooncakePool(cfg MooncakeConfig) (MooncakePool, error) {
	return nil, ErrMooncakeNotBuilt
}
