package cliutil

import (
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Progress is a byte progress bar on stderr, or nothing when disabled.
type Progress struct{ bar *progressbar.ProgressBar }

// NewProgress returns a bar over total bytes when enabled (--progress, or stderr is a
// terminal), else a no-op.
func NewProgress(w io.Writer, enabled bool, total int64, desc string) *Progress {
	return newBar(w, enabled, total, desc, true)
}

// NewCountProgress is NewProgress over a count of items (segments) instead of bytes.
func NewCountProgress(w io.Writer, enabled bool, total int64, desc string) *Progress {
	return newBar(w, enabled, total, desc, false)
}

func newBar(w io.Writer, enabled bool, total int64, desc string, bytes bool) *Progress {
	if !enabled {
		return &Progress{}
	}
	return &Progress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(bytes),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(w, "\n") }),
	)}
}

// Add advances the bar by n (bytes or items); a disabled bar ignores it.
func (p *Progress) Add(n int64) {
	if p.bar != nil {
		_ = p.bar.Add64(n)
	}
}

// Finish completes the bar and ends its line; a disabled bar ignores it.
func (p *Progress) Finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
