package index

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// stallingSyncs holds every sync of Pebble's WAL while armed, reporting each one on stalled.
type stallingSyncs struct {
	armed   atomic.Bool
	stalled chan struct{}
	release chan struct{}
}

func (s *stallingSyncs) String() string { return "stalling-syncs" }

func (s *stallingSyncs) MaybeError(op errorfs.Op) error {
	if s.armed.Load() && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) && strings.HasSuffix(op.Path, ".log") {
		s.stalled <- struct{}{}
		<-s.release
	}
	return nil
}

// A synced Apply waiting for its sync (behind a full device queue, under load) does not hold up
// other Applies: they commit and are visible meanwhile, and the synced one returns once
// durable.
func TestSyncedApplyDoesNotBlockOthers(t *testing.T) {
	inj := &stallingSyncs{stalled: make(chan struct{}, 16), release: make(chan struct{})}
	ix := openFS(t, errorfs.Wrap(vfs.NewMem(), inj))
	defer func() { _ = ix.Close() }()
	apply(t, ix, true, func(b *Batch) { b.SetSegment(seg(1)) })
	release := sync.OnceFunc(func() {
		inj.armed.Store(false)
		close(inj.release)
	})
	defer release() // before Close, which would wait for a stalled sync

	inj.armed.Store(true)
	synced := make(chan error, 1)
	go func() {
		b := ix.NewBatch()
		b.Put(bid(1), testLoc(1, 4096, 1))
		synced <- ix.Apply(b, true)
	}()
	<-inj.stalled

	done := make(chan error, 1)
	go func() {
		b := ix.NewBatch()
		b.Put(bid(2), testLoc(1, 4096+testLoc(1, 0, 1).RecordBytes(), 1))
		done <- ix.Apply(b, false)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an unsynced Apply waited for another Apply's sync")
	}
	if _, ok := mustGet(t, ix, bid(2)); !ok {
		t.Fatal("the unsynced Apply's entry is not visible")
	}
	select {
	case err := <-synced:
		t.Fatalf("the synced Apply returned (%v) before its sync completed", err)
	default:
	}
	release()
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	checkAcc(t, ix)
}
