package lifecycle

// Kick asks a background worker for a pass now. It holds at most one request: kicks that come
// while one is pending merge into it, and a kick never blocks the kicker.
type Kick chan struct{}

// NewKick returns a Kick with room for the one pending request.
func NewKick() Kick { return make(Kick, 1) }

// Kick requests a pass without blocking: a no-op when one is pending already.
func (k Kick) Kick() {
	select {
	case k <- struct{}{}:
	default:
	}
}
