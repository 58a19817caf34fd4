package model

import (
	"os"
	"path/filepath"
	"testing"
)

// benchContext is 1K bytes of Go source from the held-out files' neighbourhood (this package's
// own source: any Go text will do for speed).
func benchContext(b *testing.B, n int) []byte {
	src, err := os.ReadFile(filepath.Join(".", "forward.go"))
	if err != nil {
		b.Fatal(err)
	}
	for len(src) < n {
		src = append(src, src...)
	}
	return src[:n]
}

// BenchmarkPrefill1K is a 1024-token prefill in one call (tokens/s reported).
func BenchmarkPrefill1K(b *testing.B) {
	m := trained(b)
	prompt := benchContext(b, 1024)
	c := newCache(b, m, 64, 16)
	b.ResetTimer()
	for b.Loop() {
		seq := Sequence{Blocks: span(0, 64)}
		if _, err := m.Forward(c, &seq, toks(prompt), span(0, len(prompt))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(prompt))/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkDecode1K is one decode step at context 1024 (the step recomputes position 1023 of a
// prefilled 1024-token sequence; tokens/s reported).
func BenchmarkDecode1K(b *testing.B) {
	m := trained(b)
	prompt := benchContext(b, 1024)
	c := newCache(b, m, 64, 16)
	seq := Sequence{Blocks: span(0, 64)}
	if _, err := m.Forward(c, &seq, toks(prompt), span(0, len(prompt))); err != nil {
		b.Fatal(err)
	}
	tok := []int{int(prompt[1023])}
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.Forward(c, &seq, tok, []int{1023}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
