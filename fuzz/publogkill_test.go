package fuzz_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/fuzz/internal/workload"
)

// TestSharedReadYourWritesKill: the writer child of TestSharedKillWhileReading dumps blocks in
// another process and prints each batch's ids once its Wait returned; it is SIGKILLed at
// random moments and restarted. The reader, in this process on the same host, must find every
// acknowledged block at its first lookup after the acknowledgement and load it byte-exact —
// with its refresh interval set to an hour, so only the writer's publication log can have
// told it — across the kills and restarts.
//
// With UCM_SHARE_KILL_DIR2 (the shared directory through a second mount of one GlusterFS
// volume: another "host" with its own client cache; the writer gets another host identity,
// engine.HostIDEnv) nothing is immediate by design: the reader runs at the engine's default
// refresh interval and the test reports the lookup-after-acknowledgement latency (p50, p99,
// max) instead, bounded only by 30 s.
func TestSharedReadYourWritesKill(t *testing.T) {
	cycles := 3
	base := t.TempDir()
	shared := filepath.Join(base, "shared")
	readerShared := shared
	crossHost := false
	if d := os.Getenv(envShareDir); d != "" {
		sub := fmt.Sprintf("ryw-%d", time.Now().UnixNano())
		shared, readerShared = filepath.Join(d, sub), filepath.Join(d, sub)
		if d2 := os.Getenv(envShareDir2); d2 != "" {
			readerShared, crossHost = filepath.Join(d2, sub), true
		}
		t.Cleanup(func() { _ = os.RemoveAll(shared) })
	}
	opts := shareKillOptions(readerShared)
	if crossHost {
		opts.SharedRefreshInterval = engine.DefaultSharedRefreshInterval
	} else {
		opts.SharedRefreshInterval, opts.SharedOwnerTimeout = time.Hour, 4*time.Hour
	}
	reader, err := engine.Open(filepath.Join(base, "reader"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	writerDir := filepath.Join(base, "writer")
	var acked []format.BlockID
	var lat []time.Duration
	dst := [][]byte{devio.AlignedBuffer(int(killLayout.BlockBytes()))}
	for cycle := range cycles {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSharedKillWhileReading$", "-test.count=1", "-test.timeout=0")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d", envShareChild, writerDir, shared, cycle))
		if crossHost {
			cmd.Env = append(cmd.Env, engine.HostIDEnv+"=the-writer's-host") // another host: no page cache shared
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		run := 300*time.Millisecond + time.Duration(rand.IntN(500))*time.Millisecond
		if crossHost {
			run *= 4 // more blocks behind each measurement of the refresh-bound latency
		}
		killAt := time.Now().Add(run)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			verb, rest, _ := strings.Cut(sc.Text(), " ")
			if verb == "FAIL" {
				t.Fatalf("writer child, cycle %d: %s", cycle, rest)
			}
			if verb != "ACK" {
				continue
			}
			f := strings.Fields(rest)
			id, err := format.ParseBlockID(f[0])
			if err != nil || len(f) != 2 {
				t.Fatalf("writer printed %q: %v", rest, err)
			}
			at, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			acked = append(acked, id)
			start := time.Unix(0, at) // when the writer's Wait returned (one clock: one machine)
			for !reader.Lookup([]format.BlockID{id})[0] {
				if !crossHost {
					t.Fatalf("cycle %d: block %s acknowledged by the writer is not found by the reader on the same host", cycle, id)
				}
				if time.Since(start) > 30*time.Second {
					t.Fatalf("block %s not visible to the other host after 30 s", id)
				}
				time.Sleep(time.Millisecond)
			}
			lat = append(lat, time.Since(start))
			if len(acked)%7 == 0 { // a sample loaded at once, byte-exact
				if err := reader.Load([]format.BlockID{id}, dst).Wait(); err != nil {
					t.Fatalf("cycle %d: load of acknowledged block %s: %v", cycle, id, err)
				}
				if err := workload.Check(id, shareSeed, 0, dst[0]); err != nil {
					t.Fatalf("cycle %d: %v", cycle, err)
				}
			}
			if time.Now().After(killAt) {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				break
			}
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	if len(acked) == 0 {
		t.Fatal("the writer acknowledged nothing")
	}
	// Every block acknowledged before the kills is still found and loads byte-exact.
	if !lookupAll(reader, acked) {
		t.Fatal("acknowledged blocks lost their visibility after the writer was killed")
	}
	checkIDs(t, reader, acked)
	slices.Sort(lat)
	t.Logf("%d blocks acknowledged over %d kills (cross-host %v): lookup after acknowledgement p50 %v, p99 %v, max %v",
		len(acked), cycles, crossHost, lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
}
