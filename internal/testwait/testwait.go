// Package testwait is the one wait-until helper of the repository's tests: it polls a
// condition that background work makes true (a refresh, a reclamation, a health check) and
// fails the test if it never does. Its bound is generous and only a backstop for a hang, never
// a timing assertion: a test that uses it must not depend on how long the condition took.
package testwait

import (
	"testing"
	"time"
)

// Bound is how long Until waits before it fails the test: long enough for a loaded, shared
// machine running the race detector, short enough that a hang fails within the suite's timeout.
const Bound = 2 * time.Minute

// Until polls cond until it holds, sleeping between polls from 1 ms up to 50 ms, and fails
// the test (t.Fatalf naming what) if it still does not hold after Bound. cond runs in the
// caller's goroutine, so it may call t.Fatal itself.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	until(t, what, cond, Bound)
}

func until(t testing.TB, what string, cond func() bool, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", bound, what)
			return
		}
		time.Sleep(pause)
	}
}
