//go:build cgo

package main

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// clipMessage returns msg when it is at most limit bytes; else as many of its first lines as
// fit with "\n... (N more lines)" after them, N the lines left off. (A task's message is one
// line per failed block, so a cut one still names the first blocks and their causes whole.) A
// first line longer than limit alone is cut at a character boundary and ends
// " ... (N more bytes)". The result is never longer than limit (limit >= 64).
func clipMessage(msg string, limit int) string {
	if len(msg) <= limit {
		return msg
	}
	lines := strings.Count(msg, "\n") + 1
	kept, end := 0, 0
	for pos := 0; ; {
		nl := strings.IndexByte(msg[pos:], '\n')
		lineEnd := len(msg)
		if nl >= 0 {
			lineEnd = pos + nl
		}
		if lineEnd+len(fmt.Sprintf("\n... (%d more lines)", lines-kept-1)) > limit {
			break
		}
		kept, end = kept+1, lineEnd
		if nl < 0 {
			break
		}
		pos = lineEnd + 1
	}
	if kept > 0 {
		return fmt.Sprintf("%s\n... (%d more lines)", msg[:end], lines-kept)
	}
	// The first line alone is too long: the suffix is sized for the most bytes it can name.
	cut := limit - len(fmt.Sprintf(" ... (%d more bytes)", len(msg)))
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return fmt.Sprintf("%s ... (%d more bytes)", msg[:cut], len(msg)-cut)
}
