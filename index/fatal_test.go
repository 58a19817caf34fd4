package index

import (
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// walFault fails writes to Pebble's WAL with err while armed.
type walFault struct {
	armed atomic.Bool
	err   error
}

func (w *walFault) String() string { return "wal-fault" }

func (w *walFault) MaybeError(op errorfs.Op) error {
	if w.armed.Load() && op.Kind == errorfs.OpFileWrite && strings.HasSuffix(op.Path, ".log") {
		return w.err
	}
	return nil
}

// TestFatalCommitErrorFailsIndex: a WAL write that fails on a full disk makes Pebble call
// Fatalf ("fatal commit error"); the index survives it: the Apply returns an error wrapping
// ErrFailed and ENOSPC, later writes fail the same way at once, reads keep working, Close
// returns, and the entries committed before are there after a reopen.
func TestFatalCommitErrorFailsIndex(t *testing.T) {
	mem := vfs.NewMem()
	fault := &walFault{err: syscall.ENOSPC}
	ix, err := Open(testDir, Options{FS: errorfs.Wrap(mem, fault)})
	if err != nil {
		t.Fatal(err)
	}
	l1 := testLoc(1, 4096, 3)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.Put(bid(1), l1)
	})
	fault.armed.Store(true)
	b := ix.NewBatch()
	b.Put(bid(2), testLoc(1, 4096+l1.RecordBytes(), 3))
	err = ix.Apply(b, true)
	if !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Apply on a full disk: %v, want ErrFailed and ENOSPC", err)
	}
	if ix.Failed() == nil {
		t.Fatal("the index does not report its failure")
	}
	fault.armed.Store(false) // space is back: the index stays failed until reopened
	b = ix.NewBatch()
	b.Put(bid(3), testLoc(1, 4096+2*l1.RecordBytes(), 3))
	if err := ix.Apply(b, false); !errors.Is(err, ErrFailed) {
		t.Fatalf("Apply after the failure: %v, want ErrFailed", err)
	}
	if err := ix.SetMeta("k", []byte("v"), true); !errors.Is(err, ErrFailed) {
		t.Fatalf("SetMeta after the failure: %v", err)
	}
	if _, ok := mustGet(t, ix, bid(1)); !ok {
		t.Fatal("a committed entry is not readable after the failure")
	}
	_ = ix.Close() // returns, whatever it says
	ix = openFS(t, mem)
	defer ix.Close()
	if _, ok := mustGet(t, ix, bid(1)); !ok {
		t.Fatal("an entry synced before the failure is gone after reopening")
	}
	apply(t, ix, true, func(b *Batch) { b.Put(bid(4), testLoc(1, 4096+3*l1.RecordBytes(), 3)) })
}
