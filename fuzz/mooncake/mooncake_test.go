//go:build mooncake && linux

package mooncake

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/tiers"
	"golang.org/x/sys/unix"
)

const segment = 256 << 20 // each engine's contribution to the pool

// Two engine processes share the pool: a child dumps, this process (another engine, nothing on
// its disk) finds every block by Lookup and loads it intact from the pool.
func TestMooncakeTwoProcesses(t *testing.T) {
	m := startMaster(t)
	a := startChild(t, m, "dumper", 0, 64, segment)
	if l := a.line(t, "READY"); l != "READY 64 dropped=0 errors=0 lent=32" {
		t.Fatalf("dumper: %s", l)
	}
	b := openEngine(t, m, t.TempDir(), segment, 32<<20)
	defer b.Close()
	ids := make([]engine.BlockID, 64)
	for i := range ids {
		ids[i] = blockID(i)
	}
	for i, hit := range b.Lookup(ids) {
		if !hit {
			t.Fatalf("lookup misses block %d", i)
		}
	}
	if n := b.LookupPrefix(ids); n != 64 {
		t.Fatalf("LookupPrefix %d", n)
	}
	o, err := loadRange(b, 0, 64)
	if o.ok != 64 {
		t.Fatalf("loads: %s (%v)", o, err)
	}
	if s := mooncakeStats(t, b); s.Hits != 64 || s.Rejected != 0 || s.Errors != 0 {
		t.Fatalf("pool stats %+v", s)
	}
	// A third engine process reads them too.
	r := startChild(t, m, "reader", 0, 64, 0)
	if l := r.line(t, "RESULT"); !strings.HasPrefix(l, "RESULT ok=64 notfound=0 wrong=0 other=0 hits=64") {
		t.Fatalf("reader: %s", l)
	}
	a.stop()
}

// A client whose segment holds the blocks is killed (SIGKILL) while this engine loads them: every
// load is intact bytes or a miss, never wrong bytes; this engine keeps serving its own blocks,
// and the master stays usable.
func TestMooncakeKillClientMidTransfer(t *testing.T) {
	m := startMaster(t)
	a := startChild(t, m, "dumper", 0, 96, segment)
	if l := a.line(t, "READY"); l != "READY 96 dropped=0 errors=0 lent=48" {
		t.Fatalf("dumper: %s", l)
	}
	// B contributes no memory: the dumper's segment holds every object, B's own blocks are
	// on its disk.
	b := openEngine(t, m, t.TempDir(), 0, 0)
	defer b.Close()
	dump(t, b, 1000, 16)

	var total outcome
	var mu sync.Mutex
	var rounds atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				o, _ := loadRange(b, 0, 96)
				mu.Lock()
				total.ok, total.notFound, total.wrong, total.other = total.ok+o.ok, total.notFound+o.notFound, total.wrong+o.wrong, total.other+o.other
				mu.Unlock()
				rounds.Add(1)
			}
		}()
	}
	// Kill the dumper once loads are under way.
	testwait.Until(t, "loads to start", func() bool { return mooncakeStats(t, b).Hits > 0 })
	a.kill()
	after := rounds.Load()
	testwait.Until(t, "two rounds of loads after the kill", func() bool { return rounds.Load() >= after+2 })
	// Own blocks are served throughout.
	own, err := loadRange(b, 1000, 16)
	close(stop)
	wg.Wait()
	t.Logf("loads of the killed client's blocks: %s; pool %+v", total, mooncakeStats(t, b))
	if total.wrong != 0 || total.other != 0 {
		t.Fatalf("loads: %s", total)
	}
	if total.ok == 0 || total.notFound == 0 {
		t.Fatalf("the kill did not happen mid-transfer: %s", total)
	}
	if own.ok != 16 {
		t.Fatalf("own blocks after the kill: %s (%v)", own, err)
	}
	// The pool still works for the survivors: a new client dumps and B loads. Until the master
	// drops the dead client's segment (10-15 s), puts it places there fail: dropped, counted.
	c := startChild(t, m, "dumper", 2000, 8, segment)
	var puts, dropped, errs int
	l := c.line(t, "READY")
	if _, err := fmt.Sscanf(l, "READY %d dropped=%d errors=%d", &puts, &dropped, &errs); err != nil || puts+dropped != 8 || puts == 0 {
		t.Fatalf("new dumper after the kill: %s (%v)", l, err)
	}
	if o, _ := loadRange(b, 2000, 8); o.ok != puts || o.notFound != dropped || o.wrong+o.other != 0 {
		t.Fatalf("loads from the new client (%s): %s", l, o)
	}
	c.stop()
}

// The master is killed (SIGKILL) while an engine loads through the pool: every load is intact
// (from the pool, or from the disk once the pool fails), dumps go on, the tier goes down, counted
// and skipped; a new master on the same address brings it back, and blocks dumped after that are
// shared again.
func TestMooncakeKillMasterAndRestart(t *testing.T) {
	m := startMaster(t)
	b := openEngine(t, m, t.TempDir(), segment, 0)
	defer b.Close()
	dump(t, b, 0, 64)
	b.FlushMooncake()
	if s := mooncakeStats(t, b); s.Puts != 64 {
		t.Fatalf("write-through %+v", s)
	}

	var total outcome
	var firstErr error
	var rounds atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			o, err := loadRange(b, 0, 64)
			total.ok, total.notFound, total.wrong, total.other = total.ok+o.ok, total.notFound+o.notFound, total.wrong+o.wrong, total.other+o.other
			if err != nil && firstErr == nil {
				firstErr = err
			}
			rounds.Add(1)
		}
	}()
	testwait.Until(t, "loads from the pool", func() bool { return mooncakeStats(t, b).Hits > 0 })
	m.kill()
	testwait.Until(t, "the tier to go down", func() bool { return !mooncakeStats(t, b).Up })
	after := rounds.Load()
	testwait.Until(t, "two rounds of loads with the master down", func() bool { return rounds.Load() >= after+2 })
	dump(t, b, 100, 8) // dumps go on
	close(stop)
	<-done
	s := mooncakeStats(t, b)
	t.Logf("loads across the master's death: %s; pool %+v", total, s)
	if total.ok == 0 || total.notFound != 0 || total.wrong != 0 || total.other != 0 {
		t.Fatalf("loads: %s (%v)", total, firstErr)
	}
	if s.Downs == 0 || s.Skipped == 0 {
		t.Fatalf("the tier was not taken down and skipped: %+v", s)
	}

	m.restart()
	testwait.Until(t, "the tier to rejoin", func() bool { return mooncakeStats(t, b).Up })
	// The new master knows nothing: blocks dumped now are written through again and another
	// process hits them.
	putsBefore := mooncakeStats(t, b).Puts
	dump(t, b, 200, 16)
	b.FlushMooncake()
	testwait.Until(t, "write-throughs to the new master", func() bool {
		if mooncakeStats(t, b).Puts >= putsBefore+16 {
			return true
		}
		// The client remounts its segment in the background after the restart; puts before
		// that are dropped: dump again.
		dump(t, b, 200, 16)
		b.FlushMooncake()
		return false
	})
	r := startChild(t, m, "reader", 200, 16, 0)
	if l := r.line(t, "RESULT"); !strings.HasPrefix(l, "RESULT ok=16 notfound=0 wrong=0 other=0 hits=16") {
		t.Fatalf("reader after the restart: %s", l)
	}
	if s := mooncakeStats(t, b); s.Rejoins == 0 {
		t.Fatalf("no rejoin counted: %+v", s)
	}
}

// A pool smaller than what is dumped: the master evicts (or refuses puts when full); every load
// is still intact (from the pool or the disk), the most recent blocks are pool hits and the
// oldest are not.
func TestMooncakePoolFullEviction(t *testing.T) {
	m := startMaster(t)
	const small = 64 << 20 // the whole pool: 64 one-MiB blocks at most
	b := openEngine(t, m, t.TempDir(), small, 0)
	defer b.Close()
	const n = 256
	for lo := 0; lo < n; lo += 16 {
		dump(t, b, lo, 16)
		b.FlushMooncake() // the master evicts between batches
	}
	s := mooncakeStats(t, b)
	t.Logf("after dumping %d MiB into a %d MiB pool: %+v", n, small>>20, s)
	if s.Puts+s.PutsDropped != n || s.Puts < 32 {
		t.Fatalf("write-through: %+v", s)
	}
	// The newest blocks are in the pool (the master evicted older ones to take them).
	if o, _ := loadRange(b, n-16, 16); o.ok != 16 {
		t.Fatalf("newest blocks: %s", o)
	}
	newest := mooncakeStats(t, b).Hits - s.Hits
	if newest == 0 {
		t.Fatalf("none of the 16 newest blocks is in the pool: %+v", mooncakeStats(t, b))
	}
	// Every block loads intact, from the pool or the disk; the oldest are not in the pool.
	before := mooncakeStats(t, b)
	o, err := loadRange(b, 0, 16)
	after := mooncakeStats(t, b)
	t.Logf("newest 16: %d pool hits; oldest 16: %s, %d pool hits", newest, o, after.Hits-before.Hits)
	if o.ok != 16 || after.Hits-before.Hits == 16 || after.Rejected != 0 {
		t.Fatalf("oldest blocks: %s (%v), pool %+v", o, err, after)
	}
	if o, err = loadRange(b, 0, n); o.ok != n {
		t.Fatalf("loads: %s (%v)", o, err)
	}
}

// activeOpens is the machine's count of TCP connections opened so far (/proc/net/snmp).
func activeOpens(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "ActiveOpens" && i < len(f) {
				v, err := strconv.Atoi(f[i])
				if err != nil {
					t.Fatalf("/proc/net/snmp ActiveOpens %q: %v", f[i], err)
				}
				return v
			}
		}
	}
	t.Fatal("/proc/net/snmp has no Tcp ActiveOpens")
	return 0
}

// Loads from another process's segment reuse the transport's connections: the tier turns on
// Mooncake's TCP connection pool unless the environment chooses (without it every transfer
// opens and closes a connection of its own, and leaves its port in TIME_WAIT for a minute).
func TestMooncakeReusesConnections(t *testing.T) {
	if connectionPoolEnv != nil {
		t.Skipf("MC_TCP_ENABLE_CONNECTION_POOL=%q is set by the environment", *connectionPoolEnv)
	}
	m := startMaster(t)
	a := startChild(t, m, "dumper", 0, 64, segment)
	defer a.stop()
	if l := a.line(t, "READY"); l != "READY 64 dropped=0 errors=0 lent=32" {
		t.Fatalf("dumper: %s", l)
	}
	b := openEngine(t, m, t.TempDir(), segment, 0)
	defer b.Close()
	if v := os.Getenv("MC_TCP_ENABLE_CONNECTION_POOL"); v != "1" {
		t.Fatalf("MC_TCP_ENABLE_CONNECTION_POOL %q after the tier set up its client, want 1", v)
	}
	const rounds = 4
	before := activeOpens(t)
	for r := 0; r < rounds; r++ {
		if o, err := loadRange(b, 0, 64); o.ok != 64 {
			t.Fatalf("round %d: loads: %s (%v)", r, o, err)
		}
	}
	opened := activeOpens(t) - before
	s := mooncakeStats(t, b)
	if s.Hits != rounds*64 || s.Errors != 0 {
		t.Fatalf("pool stats %+v", s)
	}
	// 256 transfers; with the pool, a few connections per peer (and whatever else the
	// machine opened meanwhile).
	if opened >= 64 {
		t.Fatalf("%d loads from another process opened %d TCP connections: not reused", rounds*64, opened)
	}
	t.Logf("%d loads from another process opened %d TCP connections", rounds*64, opened)
}

// The tier's staging memory is resident from the start: its first transfers pay no page
// faults (a page the kernel hands out for the first time costs its zeroing, on these VMs a
// hypervisor fault, inside the transfer that touches it).
func TestMooncakeStagingResident(t *testing.T) {
	m := startMaster(t)
	cfg := tiers.MooncakeConfig{MetadataServer: m.metadata(), MasterServerAddress: m.rpcAddress(), GlobalSegmentSize: 0}.WithDefaults()
	pool, err := tiers.OpenMooncakePool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const size = 32 << 20
	b, err := pool.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	vec := make([]byte, size/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	absent := 0
	for _, v := range vec {
		if v&1 == 0 {
			absent++
		}
	}
	if absent != 0 {
		t.Fatalf("%d of %d pages of freshly allocated staging memory are not resident", absent, len(vec))
	}
}
