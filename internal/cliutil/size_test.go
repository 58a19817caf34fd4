package cliutil

import (
	"testing"

	"github.com/ucm-go/ucm/connector/ucmconfig"
)

// TestParseSize: the size flags accept bytes and binary units (ucmconfig.ParseSize) and reject
// anything else; FormatSize prints the largest unit that divides exactly.
func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"4096", 4096, true},
		{"1K", 1024, true},
		{"1KiB", 1024, true},
		{"256kib", 256 << 10, true},
		{"2M", 2 << 20, true},
		{"2MiB", 2 << 20, true},
		{"1G", 1 << 30, true},
		{"1GiB", 1 << 30, true},
		{" 8MiB ", 8 << 20, true},
		{"10B", 10, true},
		{"8589934591G", 8589934591 << 30, true},
		{"8589934592G", 0, false},
		{"99999999999999999999", 0, false},
		{"", 0, false},
		{"MiB", 0, false},
		{"-1", 0, false},
		{"+1K", 0, false},
		{"1.5G", 0, false},
		{"2MB", 0, false},
		{"2 MiB", 2 << 20, true},
		{"1T", 1 << 40, true},
		{"abc", 0, false},
	} {
		got, err := ucmconfig.ParseSize(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ucmconfig.ParseSize(%q) = %d, %v; want %d, ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
	for n, want := range map[int64]string{2 << 20: "2MiB", 256 << 10: "256KiB", 1 << 30: "1GiB", 1000: "1000", 0: "0"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}
