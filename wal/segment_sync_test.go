package wal

import (
	"errors"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/internal/testwait"
)

// syncGate holds every fdatasync of a file until the test ends it with the error it chooses.
type syncGate struct {
	started chan struct{}
	results chan error
}

func (g *syncGate) String() string { return "sync-gate" }

func (g *syncGate) MaybeError(op errorfs.Op) error {
	if op.Kind != errorfs.OpFileSyncData {
		return nil
	}
	g.started <- struct{}{}
	return <-g.results
}

// syncCovering shares one fdatasync among the callers that wait while one runs, never returns
// before a sync that started after the call has finished, and, once a sync failed, reports
// that failure to every later caller even when a later sync succeeds.
func TestSyncCovering(t *testing.T) {
	g := &syncGate{started: make(chan struct{}), results: make(chan error)}
	fs := errorfs.Wrap(vfs.NewMem(), g)
	f, err := devio.OpenFile(fs, "/seg", true, devio.DirectOff)
	if err != nil {
		t.Fatal(err)
	}
	s := newSegment(1, 1, "/seg", f)
	call := func() chan error {
		ch := make(chan error, 1)
		go func() { ch <- s.syncCovering() }()
		return ch
	}
	waiters := func() int {
		s.syncs.mu.Lock()
		defer s.syncs.mu.Unlock()
		return s.syncs.waiters
	}
	returned := func(ch chan error) bool {
		select {
		case err := <-ch:
			ch <- err
			return true
		default:
			return false
		}
	}

	a := call()
	<-g.started // sync 1 runs for a
	b, c := call(), call()
	testwait.Until(t, "b and c to wait for the sync under way", func() bool { return waiters() == 2 })
	g.results <- nil // sync 1 done
	if err := <-a; err != nil {
		t.Fatalf("a: %v", err)
	}
	<-g.started // sync 2: the one that covers b and c (sync 1 may have begun before their writes)
	testwait.Until(t, "the other of b and c to wait for sync 2", func() bool { return waiters() == 1 })
	if returned(b) || returned(c) {
		t.Fatal("b or c returned before a sync that started after their call finished")
	}
	g.results <- nil
	if err, err2 := <-b, <-c; err != nil || err2 != nil {
		t.Fatalf("b, c: %v, %v", err, err2)
	}
	if s.syncs.started != 2 {
		t.Fatalf("%d syncs for three callers, two of them waiting together: want 2", s.syncs.started)
	}

	// A failed sync fails its caller and every later one, even after a sync that succeeds.
	d := call()
	<-g.started
	g.results <- syscall.EIO
	if err := <-d; !errors.Is(err, syscall.EIO) {
		t.Fatalf("d, whose sync failed: %v", err)
	}
	e := call()
	<-g.started
	g.results <- nil
	if err := <-e; !errors.Is(err, syscall.EIO) {
		t.Fatalf("e, after a failed sync of the segment: %v, want the failure again", err)
	}
}
