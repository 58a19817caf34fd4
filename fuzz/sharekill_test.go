package fuzz_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/fuzz/internal/workload"
	"github.com/ucm-go/ucm/internal/testwait"
	"github.com/ucm-go/ucm/tiers"
)

// TestSharedKillWhileReading: two instances share a tier, each in its own process. The writer
// (a child re-executing this test binary) dumps blocks continuously and is SIGKILLed at random
// moments, then restarted on its store; the reader, in this process, loads the writer's
// acknowledged blocks all the while through its foreign index. The reader must only ever get
// the right bytes or a miss; after the last kill the writer's recovered store holds every
// block it acknowledged, it never took the reader's namespace over, and once it has published
// them the reader loads every one of them byte-exact.
//
// Environment: UCM_SHARE_KILL_CYCLES (default 5), UCM_SHARE_KILL_DIR (run the shared tier in
// this directory, e.g. a GlusterFS mount, instead of a temporary one; the store directories
// stay local), UCM_SHARE_KILL_DIR2 (the reader's view of the same directory through a second
// mount of the same volume: two "hosts").
const (
	envShareCycles = "UCM_SHARE_KILL_CYCLES"
	envShareDir    = "UCM_SHARE_KILL_DIR"
	envShareDir2   = "UCM_SHARE_KILL_DIR2"
	// UCM_SHARE_KILL_REFRESH: the instances' SharedRefreshInterval (default 20ms; the engine's
	// default is 500ms).
	envShareRefresh = "UCM_SHARE_KILL_REFRESH"
	envShareChild   = "UCM_SHARE_KILL_CHILD" // internal: "<store dir>|<shared dir>|<cycle>"
	shareSeed       = 77
)

// killedLockWait bounds how long openAfterKill waits for the lock of a killed holder to go.
const killedLockWait = 10 * time.Second

// openAfterKill opens store dir whose previous holder was just SIGKILLed and has exited,
// retrying while the store (or its tier path) is reported locked, up to killedLockWait: on a
// FUSE mount (GlusterFS) the kernel hands the dead process's lock release to the file system's
// client asynchronously, so the holder can be gone before its lock is, and Open reports
// ErrLocked meanwhile, as it must. A supervisor restarting a killed instance retries the same
// way. locked is how long the lock was still seen held (0: not at all).
func openAfterKill(dir string, o engine.Options) (e *engine.Engine, locked time.Duration, err error) {
	start := time.Now()
	for {
		e, err = engine.Open(dir, o)
		if !errors.Is(err, engine.ErrLocked) {
			return e, locked, err
		}
		if locked = time.Since(start); locked >= killedLockWait {
			return nil, locked, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func shareKillOptions(shared string) engine.Options {
	refresh := 20 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv(envShareRefresh)); err == nil && d > 0 {
		refresh = d
	}
	return engine.Options{
		Layout: killLayout, Schema: killSchema, FS: vfs.Default, SegmentSize: 1 << 20,
		SyncPolicy: engine.SyncAlways, IOEngine: devio.EngineAuto, DirectIO: devio.DirectAuto, TaskTimeout: 10 * time.Second,
		Tiers:                 []tiers.Config{{Name: "shared", Kind: tiers.KindDisk, Paths: []string{shared}, Shared: true}},
		SharedRefreshInterval: refresh, SharedSealAge: 50 * time.Millisecond, SharedRetireGrace: time.Second,
	}
}

func TestSharedKillWhileReading(t *testing.T) {
	if v := os.Getenv(envShareChild); v != "" {
		shareKillChild(v)
		return
	}
	cycles := 5
	if v := os.Getenv(envShareCycles); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q", envShareCycles, v)
		}
		cycles = n
	}
	base := t.TempDir()
	shared := filepath.Join(base, "shared")
	readerShared := shared
	if d := os.Getenv(envShareDir); d != "" {
		sub := fmt.Sprintf("sharekill-%d", time.Now().UnixNano())
		shared, readerShared = filepath.Join(d, sub), filepath.Join(d, sub)
		if d2 := os.Getenv(envShareDir2); d2 != "" {
			readerShared = filepath.Join(d2, sub)
		}
		t.Cleanup(func() { _ = os.RemoveAll(shared) })
	}
	writerDir := filepath.Join(base, "writer")
	reader, err := engine.Open(filepath.Join(base, "reader"), shareKillOptions(readerShared))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	// The reader has blocks of its own in the shared tier: the writer must never adopt them.
	readerIDs := make([]format.BlockID, 8)
	for i := range readerIDs {
		readerIDs[i] = workload.ID(shareSeed, -1, workload.Whole, i)
	}
	dumpIDs(t, reader, readerIDs)

	var (
		mu    sync.Mutex
		acked []format.BlockID
	)
	stop := make(chan struct{})
	var hits, misses atomic.Int64
	readErr := make(chan error, 1)
	go func() { // the reader: loads acknowledged blocks, forever checking bytes
		r := rand.New(rand.NewPCG(shareSeed, 1))
		dst := make([][]byte, 8)
		for i := range dst {
			dst[i] = devio.AlignedBuffer(int(killLayout.BlockBytes()))
		}
		for {
			select {
			case <-stop:
				readErr <- nil
				return
			default:
			}
			mu.Lock()
			n := len(acked)
			ids := make([]format.BlockID, 0, len(dst))
			for i := 0; i < len(dst) && n > 0; i++ {
				ids = append(ids, acked[r.IntN(n)])
			}
			mu.Unlock()
			if len(ids) == 0 {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			task := reader.Load(ids, dst[:len(ids)])
			_ = task.Wait()
			time.Sleep(time.Millisecond) // a reader, not a spinner: misses come back at once
			for i, err := range task.BlockErrors() {
				switch {
				case err == nil:
					if cerr := workload.Check(ids[i], shareSeed, 0, dst[i]); cerr != nil {
						readErr <- fmt.Errorf("reader got wrong bytes: %w", cerr)
						return
					}
					hits.Add(1)
				case errors.Is(err, engine.ErrNotFound) || errors.Is(err, engine.ErrCorrupt):
					misses.Add(1)
				default:
					readErr <- fmt.Errorf("reader load of %s: %w", ids[i], err)
					return
				}
			}
		}
	}()

	for cycle := 0; cycle < cycles; cycle++ {
		ids := runShareChild(t, writerDir, shared, cycle, 100+time.Duration(rand.IntN(400))*time.Millisecond)
		mu.Lock()
		acked = append(acked, ids...)
		mu.Unlock()
		select {
		case err := <-readErr:
			t.Fatal(err)
		default:
		}
	}
	close(stop)
	if err := <-readErr; err != nil {
		t.Fatal(err)
	}

	// The writer recovers: every acknowledged block is there; the reader's are not its own.
	w, _, err := openAfterKill(writerDir, shareKillOptions(shared))
	if err != nil {
		t.Fatal(err)
	}
	if rec := w.Recovery(); rec.SegmentsAdopted != 0 {
		t.Fatalf("writer adopted %d segments (the reader's?)", rec.SegmentsAdopted)
	}
	if len(acked) == 0 {
		t.Fatal("the writer acknowledged nothing in any cycle")
	}
	checkIDs(t, w, acked)
	testwait.Until(t, "the reader's blocks visible to the writer", func() bool { return lookupAll(w, readerIDs) })
	checkIDs(t, w, readerIDs)
	if err := w.Close(); err != nil { // seals and publishes the last segment
		t.Fatal(err)
	}
	testwait.Until(t, "every acknowledged block visible to the reader", func() bool { return lookupAll(reader, acked) })
	checkIDs(t, reader, acked)
	t.Logf("%d cycles: %d blocks acknowledged; reader during the kills: %d hits, %d misses, 0 wrong; visibility latency %v",
		cycles, len(acked), hits.Load(), misses.Load(), reader.Stats().Sharing.VisibilityLatency)
}

// runShareChild runs the writer child for one cycle, kills it delay after it reports its store
// open, and returns the ids it acknowledged.
func runShareChild(t *testing.T, dir, shared string, cycle int, delay time.Duration) []format.BlockID {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSharedKillWhileReading$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d", envShareChild, dir, shared, cycle))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var ids []format.BlockID
	open := make(chan struct{})
	done := make(chan struct{})
	var fail string
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			verb, rest, _ := strings.Cut(sc.Text(), " ")
			switch verb {
			case "OPEN":
				close(open)
			case "ACK":
				id, err := format.ParseBlockID(strings.Fields(rest)[0])
				if err == nil {
					ids = append(ids, id)
				}
			case "FAIL":
				fail = rest
			}
		}
	}()
	select {
	case <-open:
	case <-done:
	case <-time.After(30 * time.Second):
	}
	time.Sleep(delay)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		// stuck in a file system call (a FUSE request never answered): it dies only when the
		// call returns, and its stdout stays open until then
		t.Fatalf("writer child, cycle %d (pid %d): not gone 2 minutes after SIGKILL; its threads in the kernel:\n%s",
			cycle, cmd.Process.Pid, kernelStacks(cmd.Process.Pid))
	}
	_ = cmd.Wait()
	if fail != "" {
		t.Fatalf("writer child, cycle %d: %s\n%s", cycle, fail, stderr.String())
	}
	return ids
}

// shareKillChild is the writer: open the store, dump new blocks in small batches until killed,
// print every acknowledged id with the time its dump's Wait returned.
func shareKillChild(spec string) {
	f := strings.Split(spec, "|")
	cycle, _ := strconv.Atoi(f[2])
	e, locked, err := openAfterKill(f[0], shareKillOptions(f[1]))
	if err != nil {
		fmt.Printf("FAIL open (locked for %v): %v\n", locked, err)
		os.Exit(exitChildSetup)
	}
	fmt.Println("OPEN")
	src := make([][]byte, 4)
	for i := range src {
		src[i] = devio.AlignedBuffer(int(killLayout.BlockBytes()))
	}
	deadline := time.Now().Add(childMaxRun)
	for n := 0; time.Now().Before(deadline); n += len(src) {
		ids := make([]format.BlockID, len(src))
		for i := range ids {
			ids[i] = workload.ID(shareSeed, cycle, workload.Whole, n+i)
			workload.Fill(ids[i], shareSeed, src[i])
		}
		if err := e.Dump(ids, src).Wait(); err != nil {
			fmt.Printf("FAIL dump: %v\n", err)
			os.Exit(exitChildCheck)
		}
		acked := time.Now().UnixNano()
		for _, id := range ids {
			fmt.Printf("ACK %s %d\n", id, acked) // the id, and when its dump's Wait returned
		}
	}
	_ = e.Close()
	os.Exit(0)
}

func dumpIDs(t *testing.T, e *engine.Engine, ids []format.BlockID) {
	t.Helper()
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = workload.Block(id, shareSeed, killLayout.BlockBytes())
	}
	if err := e.Dump(ids, src).Wait(); err != nil {
		t.Fatal(err)
	}
}

func checkIDs(t *testing.T, e *engine.Engine, ids []format.BlockID) {
	t.Helper()
	for lo := 0; lo < len(ids); lo += 64 {
		batch := ids[lo:min(len(ids), lo+64)]
		dst := make([][]byte, len(batch))
		for i := range dst {
			dst[i] = devio.AlignedBuffer(int(killLayout.BlockBytes()))
		}
		if err := e.Load(batch, dst).Wait(); err != nil {
			t.Fatalf("load: %v", err)
		}
		for i, id := range batch {
			if err := workload.Check(id, shareSeed, 0, dst[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func lookupAll(e *engine.Engine, ids []format.BlockID) bool {
	for _, h := range e.Lookup(ids) {
		if !h {
			return false
		}
	}
	return true
}
