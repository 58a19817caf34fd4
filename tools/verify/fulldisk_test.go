package verify_test

import (
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fullFS is a file system that reports itself full, as a disk filled by something else.
type fullFS struct{ vfs.FS }

func (fullFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{TotalBytes: 1 << 30, UsedBytes: 1 << 30}, nil
}

// On a full file system the engine opens the store read-only and recovery cannot run: verify
// says so, verifies read-only, and reports what recovery will do as --no-recover does (which
// is what recovery then does: here, keep every record), not a recovery that never happened nor
// every entry of the active segments as dropped.
func TestVerifyOnFullDisk(t *testing.T) {
	mem := vfs.NewCrashableMem()
	e := openEngine(t, mem)
	defer func() { _ = e.Close() }()
	dump(t, e, 0, 25)
	fs := mem.CrashClone(vfs.CrashCloneCfg{})

	r := run(t, fullFS{fs}, true)
	if r.Recovery != nil {
		t.Fatalf("verify reports a recovery that could not run: %+v", r.Recovery)
	}
	if !strings.Contains(r.RecoverySkipped, "full") || r.Active == 0 || len(r.Pending) == 0 {
		t.Fatalf("want recovery reported as not run for a full disk and what it will do: skipped %q, %d active, pending %v",
			r.RecoverySkipped, r.Active, r.Pending)
	}
	pendingDrops := 0
	for _, p := range r.Pending {
		pendingDrops += p.EntriesToDrop
	}
	if !r.Clean() || r.PendingDrops != pendingDrops {
		t.Fatalf("full disk: clean %v, %d entries past a torn tail, pending segments drop %d", r.Clean(), r.PendingDrops, pendingDrops)
	}
	indexed := r.BlocksVerified + r.PendingDrops

	// Once there is room, recovery does what the report said.
	r = run(t, fs, true)
	if r.Recovery == nil || r.Recovery.EntriesDropped != pendingDrops || !r.Clean() {
		t.Fatalf("recovery with room: %+v, want %d entries dropped", r.Recovery, pendingDrops)
	}
	if r.BlocksVerified != indexed-pendingDrops+r.Recovery.EntriesAdopted {
		t.Fatalf("after recovery %d blocks verified, want %d indexed before less %d dropped plus %d adopted",
			r.BlocksVerified, indexed, pendingDrops, r.Recovery.EntriesAdopted)
	}
}
