package kernels

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTestDevice(t testing.TB, opts SimOptions) *Device {
	t.Helper()
	d, err := NewSimDevice(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func mustAlloc(t testing.TB, d *Device, label string, n int64) *Memory {
	t.Helper()
	m, err := d.Alloc(label, n)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustStream(t testing.TB, d *Device) *Stream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustSpan(t testing.TB, m *Memory, off, n int64) Span {
	t.Helper()
	s, err := m.Span(off, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkNoLeak waits (bounded) for the goroutine count to fall back to base.
func checkNoLeak(t *testing.T, base int) {
	t.Helper()
	var n int
	for i := 0; i < 200; i++ {
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Fatalf("goroutines: %d, want <= %d\n%s", n, base, buf[:runtime.Stack(buf, true)])
}

func TestSimCopiesRoundTrip(t *testing.T) {
	for _, threads := range []int{1, 4} {
		d := newTestDevice(t, SimOptions{CopyThreads: threads})
		const n = parallelMinBytes + 123 // split across threads, not a multiple of the chunk
		m := mustAlloc(t, d, "buf", 2*n)
		s := mustStream(t, d)
		src := testRandomBytes(n, 1)
		if err := s.CopyH2D(mustSpan(t, m, 0, n), src); err != nil {
			t.Fatal(err)
		}
		if err := s.CopyD2D(mustSpan(t, m, n, n), mustSpan(t, m, 0, n)); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, n)
		if err := s.CopyD2H(dst, mustSpan(t, m, n, n)); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("threads %d: round trip differs", threads)
		}
		if hb, ok := m.HostBytes(); !ok || !bytes.Equal(hb[:n], src) {
			t.Fatal("HostBytes does not show the copied bytes")
		}
		if addrOf(memBytes(m))%4096 != 0 {
			t.Fatal("allocation not aligned to 4096")
		}
	}
}

func memBytes(m *Memory) []byte { b, _ := m.HostBytes(); return b }

func TestSimBoundsChecked(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	m := mustAlloc(t, d, "kv-layer-3", 4096)
	s := mustStream(t, d)
	for _, c := range []struct{ off, n int64 }{{-1, 1}, {0, 4097}, {4096, 1}, {4000, 97}, {0, -1}, {1 << 62, 1 << 62}} {
		_, err := m.Span(c.off, c.n)
		if !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("Span(%d, %d): %v, want ErrOutOfRange", c.off, c.n, err)
		}
		if !strings.Contains(err.Error(), `"kv-layer-3"`) {
			t.Fatalf("error does not name the allocation: %v", err)
		}
	}
	if _, err := m.Span(4096, 0); err != nil {
		t.Fatalf("empty span at the end: %v", err)
	}
	// A span forged past its allocation is refused at enqueue time.
	forged := Span{mem: m, off: 4000, n: 200}
	if err := s.CopyH2D(forged, make([]byte, 200)); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("forged span: %v", err)
	}
	if err := s.CopyH2D(Span{}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("zero span: %v", err)
	}
	if err := s.CopyH2D(mustSpan(t, m, 0, 10), make([]byte, 11)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("length mismatch: %v", err)
	}
	if err := s.CopyD2D(mustSpan(t, m, 0, 10), mustSpan(t, m, 10, 11)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("d2d length mismatch: %v", err)
	}
	other := newTestDevice(t, SimOptions{Name: "other"})
	om := mustAlloc(t, other, "o", 16)
	if err := s.CopyH2D(mustSpan(t, om, 0, 16), make([]byte, 16)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("memory of another device: %v", err)
	}
	if err := d.Free(m); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(m); !errors.Is(err, ErrInvalid) {
		t.Fatalf("double free: %v", err)
	}
	if err := s.CopyH2D(Span{mem: m, n: 16}, make([]byte, 16)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "freed") {
		t.Fatalf("freed memory: %v", err)
	}
	if _, ok := m.HostBytes(); ok {
		t.Fatal("HostBytes of freed memory")
	}
	for _, n := range []int64{0, -5, MaxAllocBytes + 1} {
		if _, err := d.Alloc("x", n); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Alloc(%d): %v", n, err)
		}
	}
	capped := newTestDevice(t, SimOptions{MemoryBytes: 8192})
	a := mustAlloc(t, capped, "a", 8000)
	if _, err := capped.Alloc("b", 200); !errors.Is(err, ErrInvalid) {
		t.Fatalf("over capacity: %v", err)
	}
	if err := capped.Free(a); err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, capped, "b", 200)
	if got := capped.Info().MemoryUsed; got != 200 {
		t.Fatalf("MemoryUsed %d", got)
	}
}

func TestSimStreamOrder(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	m := mustAlloc(t, d, "m", 1<<16)
	s := mustStream(t, d)
	var got []int
	// Interleave copies that overwrite the same bytes with launches that observe them: every
	// launch must see exactly the copy enqueued before it.
	for i := 0; i < 200; i++ {
		src := bytes.Repeat([]byte{byte(i)}, 1<<16)
		if err := s.CopyH2D(m.Whole(), src); err != nil {
			t.Fatal(err)
		}
		if err := s.Launch("observe", func() error {
			b := memBytes(m)
			if b[0] != byte(i) || b[len(b)-1] != byte(i) {
				t.Errorf("launch %d saw %d", i, b[0])
			}
			got = append(got, i)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("ran out of order: %v", got)
		}
	}
	if len(got) != 200 {
		t.Fatalf("ran %d launches", len(got))
	}
	if done, err := s.Query(); !done || err != nil {
		t.Fatalf("Query after Synchronize: %v %v", done, err)
	}
}

func TestSimEvents(t *testing.T) {
	base := runtime.NumGoroutine()
	d, err := NewSimDevice(SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := mustStream(t, d)
	b := mustStream(t, d)
	ev, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); !done || err != nil {
		t.Fatal("an unrecorded event is complete")
	}
	if err := ev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var aDone, bRan bool
	var mu sync.Mutex
	if err := a.Launch("blocked", func() error {
		<-release
		mu.Lock()
		aDone = true
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitEvent(ev); err != nil {
		t.Fatal(err)
	}
	bEv, _ := d.NewEvent()
	if err := b.Launch("after", func() error {
		mu.Lock()
		defer mu.Unlock()
		if !aDone {
			t.Error("stream b ran before the event it waits for")
		}
		bRan = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Record(bEv); err != nil {
		t.Fatal(err)
	}
	if done, _ := ev.Query(); done {
		t.Fatal("event complete while its stream is blocked")
	}
	if done, _ := b.Query(); done {
		t.Fatal("stream b idle while it waits")
	}
	close(release)
	if err := bEv.Synchronize(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if !bRan {
		t.Fatal("b's launch did not run")
	}
	mu.Unlock()
	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("event after completion: %v %v", done, err)
	}
	// Re-recording moves the event: a wait enqueued before the new record is not affected.
	rel2 := make(chan struct{})
	_ = a.Launch("blocked2", func() error { <-rel2; return nil })
	_ = a.Record(ev)
	if done, _ := ev.Query(); done {
		t.Fatal("re-recorded event still reports the old point")
	}
	close(rel2)
	if err := ev.Synchronize(); err != nil {
		t.Fatal(err)
	}
	other := newTestDevice(t, SimOptions{})
	oev, _ := other.NewEvent()
	if err := a.Record(oev); !errors.Is(err, ErrInvalid) {
		t.Fatalf("record of another device's event: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Launch("x", func() error { return nil }); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("launch on closed stream: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	checkNoLeak(t, base)
}

func TestSimStickyErrors(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	s := mustStream(t, d)
	boom := errors.New("boom")
	ran := false
	ev, _ := d.NewEvent()
	_ = s.Launch("fail", func() error { return boom })
	_ = s.Launch("skipped", func() error { ran = true; return nil })
	_ = s.Record(ev)
	if err := ev.Synchronize(); !errors.Is(err, boom) {
		t.Fatalf("event after failure: %v", err)
	}
	// Another stream waiting on the failed event inherits the error.
	s2 := mustStream(t, d)
	_ = s2.WaitEvent(ev)
	if err := s2.Synchronize(); !errors.Is(err, boom) {
		t.Fatalf("waiting stream: %v", err)
	}
	if err := s.Synchronize(); !errors.Is(err, boom) || !strings.Contains(err.Error(), "fail") {
		t.Fatalf("Synchronize: %v", err)
	}
	if ran {
		t.Fatal("operation after a failure ran")
	}
	// Synchronize cleared the error: the stream works again.
	_ = s.Launch("ok", func() error { ran = true; return nil })
	if err := s.Synchronize(); err != nil || !ran {
		t.Fatalf("after clearing: %v %v", err, ran)
	}
	_ = s.Launch("panics", func() error { panic("oops") })
	if err := s.Synchronize(); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("panic in launch: %v", err)
	}
	if err := s.Launch("nil", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nil launch: %v", err)
	}
}

func TestSimCloseReleasesWaiters(t *testing.T) {
	base := runtime.NumGoroutine()
	d, err := NewSimDevice(SimOptions{LinkBytesPerSec: 1, LinkLatency: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a := mustStream(t, d)
	b := mustStream(t, d)
	m := mustAlloc(t, d, "m", 1<<20)
	never, _ := d.NewEvent()
	_ = b.Record(never)
	block := make(chan struct{})
	_ = b.Launch("block", func() error { <-block; return nil })
	_ = b.Record(never) // b never gets here before Close
	_ = a.WaitEvent(never)
	// A copy on the modelled link that would take an hour.
	slow := mustStream(t, d)
	_ = slow.CopyH2D(m.Whole(), make([]byte, 1<<20))
	ev, _ := d.NewEvent()
	_ = slow.Record(ev)
	notified := make(chan error, 1)
	_ = a.notify(func(err error) { notified <- err })
	go func() {
		time.Sleep(20 * time.Millisecond)
		close(block)
	}()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ev.Synchronize(); err != nil && !errors.Is(err, ErrNoDevice) {
		t.Fatalf("event after close: %v", err)
	}
	if err := <-notified; !errors.Is(err, ErrNoDevice) {
		t.Fatalf("notify after close: %v", err)
	}
	if err := a.Synchronize(); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("synchronize after close: %v", err)
	}
	if _, err := d.Alloc("x", 1); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("alloc after close: %v", err)
	}
	if _, err := d.NewStream(); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("stream after close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	checkNoLeak(t, base)
}

func TestSimLinkModel(t *testing.T) {
	// 1 MiB over a 100 MiB/s link takes at least 10 ms: a lower bound only, never an upper one.
	d := newTestDevice(t, SimOptions{LinkBytesPerSec: 100 << 20})
	m := mustAlloc(t, d, "m", 1<<20)
	s := mustStream(t, d)
	start := time.Now()
	_ = s.CopyH2D(m.Whole(), make([]byte, 1<<20))
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 10*time.Millisecond {
		t.Fatalf("1 MiB at 100 MiB/s took %v", el)
	}
	// Launches (compute) do not use the link.
	if _, err := NewSimDevice(SimOptions{LinkBytesPerSec: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative bandwidth: %v", err)
	}
}

func TestStagingPinnedAcrossClose(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	st, err := NewStaging(1<<20, StagingOptions{HugePages: true, Lock: true, Place: true, NUMANode: 0})
	if err != nil {
		t.Fatal(err)
	}
	if addrOf(st.Bytes())%StagingAlign != 0 || st.Len() != 1<<20 {
		t.Fatalf("staging not aligned: %x len %d", addrOf(st.Bytes()), st.Len())
	}
	p := st.Placement()
	t.Logf("placement: %+v", p)
	if p.RequestedNode != 0 {
		t.Fatalf("requested node %d", p.RequestedNode)
	}
	if nodes, err := HostNUMANodes(); err == nil && len(nodes) == 1 && !p.Placed {
		t.Fatalf("single-node host, placement on node 0 failed: %+v", p)
	}
	m := mustAlloc(t, d, "m", 1<<20)
	s := mustStream(t, d)
	for i := range st.Bytes() {
		st.Bytes()[i] = byte(i * 7)
	}
	want := append([]byte(nil), st.Bytes()...)
	block := make(chan struct{})
	_ = s.Launch("block", func() error { <-block; return nil })
	if err := s.CopyH2D(m.Whole(), st.Bytes()); err != nil {
		t.Fatal(err)
	}
	// Closing the buffer while the copy is queued must not unmap it under the copy.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	close(block)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(memBytes(m), want) {
		t.Fatal("copy from a closed-while-queued staging buffer differs")
	}
	stagingMu.Lock()
	live := len(stagingLive)
	stagingMu.Unlock()
	if live != 0 {
		t.Fatalf("%d staging buffers still registered", live)
	}
	for _, n := range []int64{0, MaxStagingBytes + 1} {
		if _, err := NewStaging(n, StagingOptions{}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("NewStaging(%d): %v", n, err)
		}
	}
	if _, err := NewStaging(4096, StagingOptions{Place: true, NUMANode: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad node: %v", err)
	}
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"": nil, "0": {0}, "0-3": {0, 1, 2, 3}, "0-1,4,6-7": {0, 1, 4, 6, 7}} {
		got, err := parseCPUList(in)
		if err != nil || len(got) != len(want) {
			t.Fatalf("%q: %v %v", in, got, err)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%q: %v", in, got)
			}
		}
	}
	for _, bad := range []string{"x", "3-1", "-1", "0-99999999", "1,,2"} {
		if _, err := parseCPUList(bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	tot, free := parseNodeMeminfo("Node 0 MemTotal:       12412704 kB\nNode 0 MemFree:         8297652 kB\nNode 0 MemUsed: 1 kB\n")
	if tot != 12412704<<10 || free != 8297652<<10 {
		t.Fatalf("meminfo: %d %d", tot, free)
	}
}

func TestHostNUMANodesFromSysfs(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, dir+"/online", "0-1\n")
	writeTestFile(t, dir+"/node0/cpulist", "0-3\n")
	writeTestFile(t, dir+"/node0/meminfo", "Node 0 MemTotal: 1024 kB\nNode 0 MemFree: 512 kB\n")
	writeTestFile(t, dir+"/node1/cpulist", "4-7\n")
	nodes, err := hostNUMANodesAt(dir)
	if err != nil || len(nodes) != 2 || nodes[0].MemTotal != 1<<20 || nodes[0].MemFree != 512<<10 || len(nodes[1].CPUs) != 4 || nodes[1].MemTotal != 0 {
		t.Fatalf("%+v %v", nodes, err)
	}
	if _, err := hostNUMANodesAt(dir + "/missing"); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("missing sysfs: %v", err)
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// randomBytes returns n deterministic pseudo-random bytes.
func testRandomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	var key [32]byte
	key[0] = byte(seed)
	key[1] = byte(seed >> 8)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// Device memory of hugePageBytes or more starts on a huge page boundary (its pages can be
// huge pages), is zeroed and exactly as long as asked; smaller allocations stay 4096-aligned.
func TestAllocAlignment(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	for _, c := range []struct {
		size  int64
		align uintptr
	}{{4096, 4096}, {hugePageBytes - 1, 4096}, {hugePageBytes, hugePageBytes}, {3*hugePageBytes + 5, hugePageBytes}} {
		m := mustAlloc(t, d, "kv", c.size)
		b := memBytes(m)
		if int64(len(b)) != c.size || int64(cap(b)) != c.size {
			t.Fatalf("alloc of %d bytes: len %d cap %d", c.size, len(b), cap(b))
		}
		if addrOf(b)%c.align != 0 {
			t.Fatalf("alloc of %d bytes at %#x: not aligned to %d", c.size, addrOf(b), c.align)
		}
		for i, v := range b {
			if v != 0 {
				t.Fatalf("alloc of %d bytes: byte %d is %d, not zero", c.size, i, v)
			}
		}
		if err := d.Free(m); err != nil {
			t.Fatal(err)
		}
	}
}

// Synchronize may run queued copies on its own goroutine (syncInline) while the stream's
// goroutine also takes work: copies, launched functions, callbacks and recorded events still
// run one at a time, in the order enqueued, each once, with a failed copy's error reported by
// the next Synchronize only and the copies after it skipped, also with a second goroutine
// synchronising the same stream.
func TestSimSynchronizeInlineOrder(t *testing.T) {
	d := newTestDevice(t, SimOptions{})
	s := mustStream(t, d)
	var (
		mu      sync.Mutex
		ran     []int
		running atomic.Int32
	)
	step := func(i int) func() error {
		return func() error {
			if running.Add(1) != 1 {
				t.Errorf("op %d ran while another op was running", i)
			}
			mu.Lock()
			ran = append(ran, i)
			mu.Unlock()
			running.Add(-1)
			return nil
		}
	}
	boom := errors.New("boom")
	var next int
	var want []int
	for round := 0; round < 300; round++ {
		for k := 0; k < round%5+1; k++ {
			i := next
			next++
			want = append(want, i)
			op := streamOp{name: "copy", dir: linkD2H, run: step(i)}
			switch k % 4 {
			case 1:
				op.dir, op.name = linkNone, "launch" // not run inline
			case 2:
				op.notify = func(error) {}
			}
			if err := s.enqueue(op); err != nil {
				t.Fatal(err)
			}
		}
		failing := round%7 == 3
		if failing {
			if err := s.enqueue(streamOp{name: "failing copy", dir: linkH2D, run: func() error { return boom }}); err != nil {
				t.Fatal(err)
			}
			// Skipped: an op after a failure does not run until the error is synchronised.
			if err := s.enqueue(streamOp{name: "skipped copy", dir: linkH2D, run: func() error {
				t.Errorf("round %d: a copy after a failed one ran", round)
				return nil
			}}); err != nil {
				t.Fatal(err)
			}
		}
		var other error
		var wg sync.WaitGroup
		if round%3 == 0 { // a second goroutine synchronising at the same time
			wg.Add(1)
			go func() { defer wg.Done(); other = s.Synchronize() }()
		}
		err := s.Synchronize()
		wg.Wait()
		if failing && !errors.Is(err, boom) && !errors.Is(other, boom) {
			t.Fatalf("round %d: Synchronize returned %v and %v, want the failed copy's error", round, err, other)
		}
		if !failing && (err != nil || other != nil) {
			t.Fatalf("round %d: Synchronize returned %v and %v after copies that succeeded", round, err, other)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatalf("round %d: the error was not cleared: %v", round, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(ran, want) {
		i := 0
		for i < min(len(ran), len(want)) && ran[i] == want[i] {
			i++
		}
		t.Fatalf("%d ops ran, %d enqueued; from position %d they ran as %v, want %v", len(ran), len(want), i, ran[i:min(len(ran), i+5)], want[i:min(len(want), i+5)])
	}
}
