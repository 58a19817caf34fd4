package cli

import (
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress is a byte progress bar on stderr, or nothing when disabled.
type progress struct{ bar *progressbar.ProgressBar }

// newProgress returns a bar over total bytes when enabled (--progress, or stderr is a
// terminal), else a no-op.
func newProgress(w io.Writer, enabled bool, total int64, desc string) *progress {
	return newBar(w, enabled, total, desc, true)
}

// newCountProgress is newProgress over a count of items (segments) instead of bytes.
func newCountProgress(w io.Writer, enabled bool, total int64, desc string) *progress {
	return newBar(w, enabled, total, desc, false)
}

func newBar(w io.Writer, enabled bool, total int64, desc string, bytes bool) *progress {
	if !enabled {
		return &progress{}
	}
	return &progress{bar: progressbar.NewOptions64(total,
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

func (p *progress) add(n int64) {
	if p.bar != nil {
		_ = p.bar.Add64(n)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
