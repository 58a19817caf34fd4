package tiers

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
)

func TestNamespacesAndManifest(t *testing.T) {
	fs := vfs.NewMem()
	root := "/shared"
	a, b := format.InstanceID{1, 2, 3}, format.InstanceID{9}
	if ids, err := ListNamespaces(fs, root); err != nil || len(ids) != 0 {
		t.Fatalf("empty root: %v, %v", ids, err)
	}
	for _, id := range []format.InstanceID{a, b} {
		if err := fs.MkdirAll(NamespaceDir(root, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.MkdirAll(filepath.Join(root, InstancesDir, "not-a-namespace"), 0o755); err != nil {
		t.Fatal(err)
	}
	ids, err := ListNamespaces(fs, root)
	if err != nil || len(ids) != 2 {
		t.Fatalf("namespaces %v, %v", ids, err)
	}
	if _, err := ReadManifest(fs, NamespaceDir(root, a), a); !errors.Is(err, ErrNoManifest) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no manifest yet: %v", err)
	}
	m := &format.Manifest{Instance: a, Sequence: 1, Segments: []format.ManifestEntry{{Number: 4, Generation: 7, Size: 3 * format.Alignment, Records: 1}}}
	if err := WriteManifest(fs, NamespaceDir(root, a), m); err != nil {
		t.Fatal(err)
	}
	m.Sequence, m.Segments = 2, append(m.Segments, format.ManifestEntry{Number: 5, Generation: 8, Size: 2 * format.Alignment})
	if err := WriteManifest(fs, NamespaceDir(root, a), m); err != nil {
		t.Fatal(err)
	}
	got, err := ReadManifest(fs, NamespaceDir(root, a), a)
	if err != nil || got.Sequence != 2 || len(got.Segments) != 2 {
		t.Fatalf("read back %+v, %v", got, err)
	}
	// A manifest in the wrong namespace (copied there) is refused.
	if err := WriteManifest(fs, NamespaceDir(root, b), m); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadManifest(fs, NamespaceDir(root, b), b); !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("foreign manifest: %v", err)
	}
	// A torn manifest is corruption, not a shorter list.
	m.Sequence = 1 // a clock that went back: written as 3, the older ones removed
	if err := WriteManifest(fs, NamespaceDir(root, a), m); err != nil || m.Sequence != 3 {
		t.Fatalf("a manifest with an old sequence: %v, written as %d", err, m.Sequence)
	}
	if seqs, _ := manifestNames(fs, NamespaceDir(root, a)); len(seqs) != 1 || seqs[0] != 3 {
		t.Fatalf("older manifests not removed: %v", seqs)
	}
	if got, err := ReadManifest(fs, NamespaceDir(root, a), a); err != nil || got.Sequence != 3 {
		t.Fatalf("newest manifest: %+v, %v", got, err)
	}
	f, err := fs.Create(filepath.Join(NamespaceDir(root, a), ManifestName(4)), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := format.EncodeManifest(m)
	_, _ = f.Write(buf[:len(buf)-1])
	_ = f.Close()
	if _, err := ReadManifest(fs, NamespaceDir(root, a), a); !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("torn manifest: %v", err)
	}
	if _, ok := ParseNamespace("00000000000000000000000000000000"); ok {
		t.Fatal("the zero instance is not a namespace")
	}
}

// TestLeaser: one holder at a time; the holder renews; another instance takes a lapsed (or
// unreadable) lease over with the next term, and the old holder then knows it lost it.
func TestLeaser(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/shared", 0o755); err != nil {
		t.Fatal(err)
	}
	a := &Leaser{FS: fs, Root: "/shared", Self: format.InstanceID{1}, Duration: 10 * time.Second, Skew: 2 * time.Second}
	b := &Leaser{FS: fs, Root: "/shared", Self: format.InstanceID{2}, Duration: 10 * time.Second, Skew: 2 * time.Second}
	t0 := time.Unix(1_000_000, 0)
	if held, l, err := a.Hold(t0); err != nil || !held || l.Term != 1 {
		t.Fatalf("first Hold: %v %+v %v", held, l, err)
	}
	if held, _, err := b.Hold(t0.Add(time.Second)); err != nil || held {
		t.Fatalf("B took a live lease: %v %v", held, err)
	}
	if held, l, err := a.Hold(t0.Add(9 * time.Second)); err != nil || !held || l.Term != 1 {
		t.Fatalf("renewal: %v %+v %v", held, l, err)
	}
	// A stops renewing: B waits for expiry + skew.
	if held, _, _ := b.Hold(t0.Add(20 * time.Second)); held {
		t.Fatal("B took the lease within the skew")
	}
	held, l, err := b.Hold(t0.Add(22 * time.Second))
	if err != nil || !held || l.Term != 2 || l.Holder != b.Self {
		t.Fatalf("takeover: %v %+v %v", held, l, err)
	}
	if held, _, _ := a.Hold(t0.Add(23 * time.Second)); held {
		t.Fatal("A still holds after B's takeover")
	}
	// An unreadable lease is taken over.
	f, _ := fs.Create("/shared/"+LeaseFile, vfs.WriteCategoryUnspecified)
	_, _ = f.Write([]byte("garbage"))
	_ = f.Close()
	if held, _, err := a.Hold(t0.Add(24 * time.Second)); err != nil || !held {
		t.Fatalf("corrupt lease not taken over: %v %v", held, err)
	}
}

// lockHookFS runs hook before each Lock: what another instance does between a Leaser's read
// of the lease and its lock.
type lockHookFS struct {
	vfs.FS
	hook func(name string) error
}

func (f lockHookFS) Lock(name string) (io.Closer, error) {
	if err := f.hook(name); err != nil {
		return nil, err
	}
	return f.FS.Lock(name)
}

// The lease is written only under the lock of LeaseLockFile: while another instance holds it,
// nobody takes over or renews (the holder keeps its unexpired lease), and a takeover is
// decided again under the lock on the lease as it stands.
func TestLeaserWritesUnderLock(t *testing.T) {
	mem := vfs.NewMem()
	if err := mem.MkdirAll("/shared", 0o755); err != nil {
		t.Fatal(err)
	}
	var hook func(string) error
	fs := lockHookFS{FS: mem, hook: func(name string) error {
		if hook != nil {
			return hook(name)
		}
		return nil
	}}
	mk := func(id byte) *Leaser {
		return &Leaser{FS: fs, Root: "/shared", Self: format.InstanceID{id}, Duration: 10 * time.Second, Skew: 2 * time.Second}
	}
	a, b, c := mk(1), mk(2), mk(3)
	t0 := time.Unix(1_000_000, 0)
	if held, _, err := a.Hold(t0); err != nil || !held {
		t.Fatalf("first Hold: %v %v", held, err)
	}
	other, err := mem.Lock("/shared/" + LeaseLockFile) // another instance writing the lease
	if err != nil {
		t.Fatal(err)
	}
	if held, l, err := a.Hold(t0.Add(5 * time.Second)); err != nil || !held || l.Expiry != t0.Add(10*time.Second).UnixNano() {
		t.Fatalf("holder, lock taken: %v %+v %v; want held, not renewed", held, l, err)
	}
	if held, _, err := b.Hold(t0.Add(13 * time.Second)); err != nil || held {
		t.Fatalf("takeover while the lock is taken: %v %v", held, err)
	}
	if held, _, err := a.Hold(t0.Add(13 * time.Second)); err != nil || held {
		t.Fatalf("holder past its expiry, lock taken: %v %v; want not held", held, err)
	}
	if got, err := ReadLease(mem, "/shared"); err != nil || got.Holder != a.Self {
		t.Fatalf("lease changed while the lock was taken: %+v %v", got, err)
	}
	_ = other.Close()

	// B read the lapsed lease; C takes it over before B gets the lock: B must not write.
	hook = func(string) error {
		hook = nil
		if held, _, err := c.Hold(t0.Add(13 * time.Second)); err != nil || !held {
			t.Errorf("C's takeover: %v %v", held, err)
		}
		return nil
	}
	if held, l, err := b.Hold(t0.Add(13 * time.Second)); err != nil || held || l.Holder != c.Self {
		t.Fatalf("B after C's takeover: %v %+v %v; want not held, C's lease", held, l, err)
	}
	if got, err := ReadLease(mem, "/shared"); err != nil || got.Holder != c.Self || got.Term != 2 {
		t.Fatalf("lease %+v %v, want C's, term 2", got, err)
	}

	// A lock that fails for another reason than a holder is Hold's error; the lease stays.
	broken := errors.New("lock: input/output error")
	hook = func(string) error { return broken }
	d := mk(4)
	d.LockHeld = func(err error) bool { return !errors.Is(err, broken) }
	if held, _, err := d.Hold(t0.Add(30 * time.Second)); !errors.Is(err, broken) || held {
		t.Fatalf("failed lock: %v %v, want the lock's error", held, err)
	}
	if got, _ := ReadLease(mem, "/shared"); got.Holder != c.Self {
		t.Fatalf("lease %+v after a failed lock, want C's", got)
	}
}
