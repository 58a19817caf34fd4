//go:build cgo

package main

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// A message longer than ucmgo_last_error's buffer is cut at the end of a line and says how many
// lines it left off; one long line is cut at a character boundary; a short one is unchanged.
// Every result fits the limit and is valid UTF-8.
func TestClipMessage(t *testing.T) {
	var task strings.Builder
	task.WriteString("256 of 256 blocks failed: ")
	for i := range 256 {
		if i > 0 {
			task.WriteByte('\n')
		}
		fmt.Fprintf(&task, "block %032x: not stored, its layer-wise batch failed: layer 3: staging memory full: ucm: no space", i)
	}
	long := strings.Repeat("é", 5000)
	for _, tc := range []struct {
		name, msg, wantEnd string
		wantPrefix         string
	}{
		{"short", "ucm: not found", "ucm: not found", "ucm: not found"},
		{"task", task.String(), "ucm: no space\n... (", "256 of 256 blocks failed: block "},
		{"one-line", long, " more bytes)", "éé"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := clipMessage(tc.msg, errorMax)
			if len(got) > errorMax || !utf8.ValidString(got) || !strings.HasPrefix(got, tc.wantPrefix) || !strings.Contains(got, tc.wantEnd) {
				t.Fatalf("clipped to %d bytes (limit %d), valid %v: ...%q", len(got), errorMax, utf8.ValidString(got), got[max(0, len(got)-80):])
			}
		})
	}
	got := clipMessage(task.String(), errorMax)
	kept := strings.Count(got, "\n") // the kept lines, then the note
	if want := fmt.Sprintf("\n... (%d more lines)", 256-kept); !strings.HasSuffix(got, want) {
		t.Fatalf("ends %q, want %q", got[len(got)-40:], want)
	}
	for _, line := range strings.Split(got, "\n")[:kept] {
		if !strings.HasSuffix(line, "ucm: no space") {
			t.Fatalf("a kept line is cut: %q", line)
		}
	}
}

// A failed call's message read back through ucmgo_last_error ends cleanly, however long.
func TestLastErrorCutCleanly(t *testing.T) {
	runtime.LockOSThread() // ucmgo_last_error is per thread
	defer runtime.UnlockOSThread()
	var msg strings.Builder
	for i := range 200 {
		fmt.Fprintf(&msg, "block %032x: not stored, its layer-wise batch failed: ucm: timeout\n", i)
	}
	_ = fail(errors.New(strings.TrimSuffix(msg.String(), "\n")))
	got := lastError()
	if !strings.HasSuffix(got, " more lines)") || !strings.Contains(got, "ucm: timeout\n... (") {
		t.Fatalf("ucmgo_last_error ends %q", got[max(0, len(got)-80):])
	}
}
