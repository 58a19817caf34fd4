package index

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ucm-go/ucm/format"
)

// holdMembers makes the next membership build wait before its swap until the returned release
// is called (and waits for the build to reach that point first); later builds do not wait.
func holdMembers(t *testing.T) (release func()) {
	t.Helper()
	reached, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once // the next build only: a later open of the test builds at once
	beforeMembersSwap = func() { once.Do(func() { close(reached); <-gate }) }
	t.Cleanup(func() { beforeMembersSwap = nil })
	return func() { <-reached; close(gate) }
}

// TestMembersBuildInBackground: right after Open, before the membership is built, lookups are
// answered exactly from the DB; blocks and sidecars put, deleted and put again meanwhile are
// seen at once; once the table is swapped in it holds exactly the committed state, and the
// accounting check agrees.
func TestMembersBuildInBackground(t *testing.T) {
	fs := vfs.NewCrashableMem()
	ix := openFS(t, fs)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		for n := uint64(0); n < 100; n++ {
			b.Put(bid(n), testLoc(1, int64(4096*(n+1)), 1))
		}
		b.PutSidecar(bid(7), 1, sideLoc(1, 1<<20, 1))
		b.PutSidecar(bid(8), 9, sideLoc(1, 2<<20, 1))
	})
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}

	release := holdMembers(t)
	ix = openFS(t, fs)
	defer ix.Close()
	if ix.MembersBytes() != 0 {
		t.Fatal("the membership was built before the test let it")
	}
	// Lookups during the build read the DB.
	hits := make([]bool, 3)
	if err := ix.Has([]format.BlockID{bid(1), bid(100), bid(99)}, hits); err != nil || !hits[0] || hits[1] || !hits[2] {
		t.Fatalf("Has during the build: %v %v", hits, err)
	}
	if n, err := ix.PrefixLen([]format.BlockID{bid(0), bid(1), bid(100), bid(2)}); err != nil || n != 2 {
		t.Fatalf("PrefixLen during the build: %d %v", n, err)
	}
	if !ix.HasSidecar(bid(7), 1) || !ix.HasSidecar(bid(8), 9) || ix.HasSidecar(bid(7), 9) {
		t.Fatal("HasSidecar during the build disagrees with the DB")
	}
	// Changes during the build: new blocks, deleted ones (from the snapshot and new), one
	// deleted and put again, sidecars added and dropped with their block.
	apply(t, ix, false, func(b *Batch) {
		b.Put(bid(100), testLoc(1, 1<<22, 1))
		b.Put(bid(101), testLoc(1, 1<<23, 1))
		b.Delete(bid(3))
		b.Delete(bid(8)) // its sidecar goes with it
		b.PutSidecar(bid(100), 2, sideLoc(1, 3<<20, 1))
	})
	apply(t, ix, false, func(b *Batch) {
		b.Delete(bid(101))
		b.Delete(bid(4))
	})
	apply(t, ix, false, func(b *Batch) { b.Put(bid(4), testLoc(1, 1<<24, 1)) })
	if !ix.Contains(bid(100)) || ix.Contains(bid(101)) || ix.Contains(bid(3)) || !ix.Contains(bid(4)) || ix.HasSidecar(bid(8), 9) {
		t.Fatal("a change during the build is not seen at once")
	}
	release()
	if err := ix.WaitMembers(); err != nil {
		t.Fatal(err)
	}
	if ix.MembersBytes() == 0 {
		t.Fatal("no membership after the build")
	}
	want := map[format.BlockID]bool{}
	for n := uint64(0); n < 102; n++ {
		want[bid(n)] = n < 100 && n != 3 && n != 8 || n == 100
	}
	for id, present := range want {
		if ix.Contains(id) != present {
			t.Fatalf("block %s: present %v after the build, want %v", id, !present, present)
		}
	}
	if !ix.HasSidecar(bid(7), 1) || !ix.HasSidecar(bid(100), 2) || ix.HasSidecar(bid(8), 9) {
		t.Fatal("sidecar kinds after the build disagree with the DB")
	}
	if got := ix.members.tab.live; got != 99 {
		t.Fatalf("%d blocks in the membership, want 99", got)
	}
	checkAcc(t, ix)
}

// TestMembersCloseDuringBuild: Close while the membership is being built stops the loader and
// closes the DB.
func TestMembersCloseDuringBuild(t *testing.T) {
	fs := vfs.NewCrashableMem()
	ix := openFS(t, fs)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.Put(bid(1), testLoc(1, 4096, 1))
	})
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	release := holdMembers(t)
	ix = openFS(t, fs)
	go release()
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openFS(t, fs) // the DB's lock was released
	defer ix.Close()
	if err := ix.WaitMembers(); err != nil || !ix.Contains(bid(1)) {
		t.Fatalf("after reopening: %v", err)
	}
}

// TestMembersDamagedKey: a block key of the wrong length stops the build with an error naming
// it; lookups keep reading the DB (right answers), and the accounting check reports it.
func TestMembersDamagedKey(t *testing.T) {
	fs := vfs.NewCrashableMem()
	ix := openFS(t, fs)
	apply(t, ix, true, func(b *Batch) {
		b.SetSegment(seg(1))
		b.Put(bid(1), testLoc(1, 4096, 1))
	})
	if err := ix.db.Set([]byte{prefixBlock, 1, 2, 3}, []byte{0}, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openFS(t, fs)
	defer ix.Close()
	err := ix.WaitMembers()
	if !errors.Is(err, format.ErrCorrupt) || !strings.Contains(err.Error(), "block key of 4 bytes") {
		t.Fatalf("WaitMembers = %v, want the damaged key", err)
	}
	if !ix.Contains(bid(1)) || ix.Contains(bid(2)) {
		t.Fatal("lookups without a membership disagree with the DB")
	}
	if err := ix.CheckAccounting(); err == nil {
		t.Fatal("the accounting check passed without a membership")
	}
}
