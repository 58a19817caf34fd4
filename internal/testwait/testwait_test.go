package testwait

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Until returns as soon as the condition holds, having polled it until then.
func TestUntil(t *testing.T) {
	calls := 0
	Until(t, "three polls", func() bool { calls++; return calls >= 3 })
	if calls != 3 {
		t.Fatalf("condition evaluated %d times, want 3 (it held at the third)", calls)
	}
}

// fatalTB records Fatalf instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

// A condition that never holds fails the test, naming what was awaited, once the bound is
// past (a small one here; Until's is Bound).
func TestUntilGivesUp(t *testing.T) {
	f := &fatalTB{TB: t}
	until(f, "the impossible", func() bool { return false }, 5*time.Millisecond)
	if !strings.Contains(f.msg, "the impossible") {
		t.Fatalf("failure message %q does not name what was awaited", f.msg)
	}
}
