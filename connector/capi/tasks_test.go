//go:build cgo

package main

import (
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/ucm-go/ucm/connector"
)

// A task issued while its store closes and registered with the C side only after the close
// dropped the store's tasks (a caller's thread descheduled between the two) is dropped too:
// a wait on it reports the store closed, as waits on every other task of a closed store do,
// not the task's own outcome.
func TestTaskRegisteredAfterClose(t *testing.T) {
	runtime.LockOSThread() // ucmgo_last_error is per thread
	defer runtime.UnlockOSThread()
	m, err := syscall.Mmap(-1, 0, fzSlots+fzMax*fzBlock, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Munmap(m) }()
	mem := &cmem{m}
	h, _ := fuzzStore(t, mem, t.TempDir()) // ids at 0, shards at 32, addresses at 64, as its dump
	s, task, err := start(true, h, mem.addr(0), mem.addr(32), 2, mem.addr(64), 1)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if st := closeStore(h); st != 0 {
		t.Fatalf("close: %d: %s", st, lastError())
	}
	register(h, s, task, 2) // what the issuing thread does next, after the close
	if st := cWait(h, int64(task), 0, 0); st != int32(connector.StatusEParam) || !strings.Contains(lastError(), "not open") {
		t.Fatalf("wait on a task of a closed store: %d (%s), want EPARAM: not open", st, lastError())
	}
	if st := cCheck(h, int64(task), mem.addr(fzSlots-8)); st != int32(connector.StatusEParam) {
		t.Fatalf("check on a task of a closed store: %d (%s), want EPARAM", st, lastError())
	}
}
