package cli

import (
	"strings"
	"testing"
)

// A baseline made on another CPU model is pointed out (its CPU-bound ratios are not the code's
// alone); one made on this model, or an unknown model, says nothing.
func TestOtherCPUNote(t *testing.T) {
	amd := "vm: 2 CPUs (AMD EPYC), Linux 6.18, stores on ext4 (/dev/vda at /), vm.nr_hugepages 160; load average 1 1 1 before, 1 1 1 after"
	if note := otherCPUNote(amd, "AMD EPYC"); note != "" {
		t.Errorf("same CPU: %q, want no note", note)
	}
	for _, unknown := range []struct{ machine, model string }{{amd, "?"}, {"", "Intel(R) Xeon(R) Processor"}} {
		if note := otherCPUNote(unknown.machine, unknown.model); note != "" {
			t.Errorf("%q on %q: %q, want no note", unknown.machine, unknown.model, note)
		}
	}
	note := otherCPUNote(amd, "Intel(R) Xeon(R) Processor")
	if !strings.Contains(note, "AMD EPYC") || !strings.Contains(note, "Intel(R) Xeon(R) Processor") || !strings.Contains(note, "--update") {
		t.Errorf("other CPU: %q, want both models named and how to make a baseline here", note)
	}
}
