package fuzz_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
)

// TestSharedLeaseContention: instances contending for the reclaimer lease of one shared
// directory all at once, each in its own process, half through one view of the directory and
// half through another (UCM_SHARE_KILL_DIR and UCM_SHARE_KILL_DIR2: two mounts of one
// GlusterFS volume, two clients). The lease lapses as soon as it is written (a duration of a
// microsecond, no skew), so every Hold of every instance is a takeover attempt: what happens
// after a holder is killed, without pause. Every instance must keep returning from Hold (on
// a GlusterFS volume of several bricks, two clients renaming onto the lease at once deadlock
// for the volume's frame timeout), and Hold must never fail. On a local directory no two
// instances may take over the same term: a takeover is decided under the lease's lock on the
// lease as it stands. On GlusterFS a client may still read the lease another instance just
// replaced (the distribute translator's rename is a link and an unlink, and clients cache), and
// two instances may then take over one term; the reclaimer tolerates two holders for an
// interval (docs/sharing.md), and the test counts them.
//
// Environment: UCM_SHARE_KILL_DIR, UCM_SHARE_KILL_DIR2 (a temporary directory without them),
// UCM_SHARE_LEASE_INSTANCES (default 8), UCM_SHARE_LEASE_SECONDS (default 5).
const (
	envLeaseInstances = "UCM_SHARE_LEASE_INSTANCES"
	envLeaseSeconds   = "UCM_SHARE_LEASE_SECONDS"
	// internal: "<instance>|<shared dir>|<run for>"
	envLeaseChild = "UCM_SHARE_LEASE_CHILD"
	// leaseStuckAfter is how long past its run an instance may take to report before it is
	// named as stuck.
	leaseStuckAfter = time.Minute
)

func TestSharedLeaseContention(t *testing.T) {
	if spec := os.Getenv(envLeaseChild); spec != "" {
		os.Exit(leaseChild(spec))
	}
	instances := envInt(t, envLeaseInstances, 8)
	run := time.Duration(envInt(t, envLeaseSeconds, 5)) * time.Second
	base := t.TempDir()
	views := []string{filepath.Join(base, "shared")}
	rel := "."
	if d := os.Getenv(envShareDir); d != "" {
		rel = fmt.Sprintf("sharelease-%d", time.Now().UnixNano())
		views = []string{filepath.Join(d, rel)}
		if d2 := os.Getenv(envShareDir2); d2 != "" {
			views = append(views, filepath.Join(d2, rel))
		}
	}
	if err := os.MkdirAll(views[0], 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(views[0]) })

	type child struct {
		cmd    *exec.Cmd
		out    bytes.Buffer
		stderr bytes.Buffer
		exited chan struct{}
		err    error
	}
	children := make([]*child, instances)
	for i := range children {
		c := &child{exited: make(chan struct{})}
		c.cmd = exec.Command(os.Args[0], "-test.run=^TestSharedLeaseContention$", "-test.count=1", "-test.timeout=0")
		c.cmd.Env = append(os.Environ(), "GOTRACEBACK=all", fmt.Sprintf("%s=%d|%s|%s", envLeaseChild, i, views[i%len(views)], run))
		c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.stderr
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { c.err = c.cmd.Wait(); close(c.exited) }()
		children[i] = c
	}
	defer func() { // on a failure, whatever still runs
		for _, c := range children {
			_ = c.cmd.Process.Kill()
		}
	}()
	giveUp := time.After(run + leaseStuckAfter)
	for i, c := range children {
		select {
		case <-c.exited:
			continue
		case <-giveUp:
		}
		var b strings.Builder
		fmt.Fprintf(&b, "instance %d did not finish within %v of its %v run; the instances still running:\n", i, leaseStuckAfter, run)
		for j, o := range children {
			select {
			case <-o.exited:
				continue
			default:
			}
			_ = o.cmd.Process.Signal(syscall.SIGQUIT)
			fmt.Fprintf(&b, "instance %d %s", j, stuckReport(o.cmd.Process.Pid, o.exited, &o.stderr))
		}
		t.Fatal(b.String())
	}

	// Every term taken over by one instance only (on a local directory).
	holder := map[uint64][]int{}
	shared := os.Getenv(envShareDir) != ""
	var holds, calls int
	for i, c := range children {
		if c.err != nil {
			t.Fatalf("instance %d: %v\n%s%s", i, c.err, c.out.String(), c.stderr.String())
		}
		sc := bufio.NewScanner(&c.out)
		done := false
		for sc.Scan() {
			verb, rest, _ := strings.Cut(sc.Text(), " ")
			switch verb {
			case "TERM":
				term, err := strconv.ParseUint(rest, 10, 64)
				if err != nil {
					t.Fatalf("instance %d: %q", i, sc.Text())
				}
				if len(holder[term]) > 0 && !shared {
					t.Fatalf("term %d taken over by instances %d and %d", term, holder[term][0], i)
				}
				holder[term] = append(holder[term], i)
			case "DONE":
				f := strings.Fields(rest)
				h, _ := strconv.Atoi(f[0])
				n, _ := strconv.Atoi(f[1])
				holds, calls, done = holds+h, calls+n, true
			case "FAIL":
				t.Fatalf("instance %d: %s", i, rest)
			}
		}
		if !done {
			t.Fatalf("instance %d reported no result:\n%s%s", i, c.out.String(), c.stderr.String())
		}
	}
	if len(holder) < 2 {
		t.Fatalf("%d takeovers in %d Holds: no contention to speak of", len(holder), calls)
	}
	twice := 0
	for _, hs := range holder {
		if len(hs) > 1 {
			twice++
		}
	}
	t.Logf("%d instances over %d views for %v: %d Holds, %d held, %d terms taken over, %d of them by two instances (a stale read)",
		instances, len(views), run, calls, holds, len(holder), twice)
}

// leaseChild runs one contender: Hold in a loop for the given time, printing each term it took
// over ("TERM t") and, at the end, "DONE <holds> <calls>"; a failed Hold prints "FAIL".
func leaseChild(spec string) int {
	f := strings.Split(spec, "|")
	inst, _ := strconv.Atoi(f[0])
	run, _ := time.ParseDuration(f[2])
	l := &tiers.Leaser{FS: vfs.Default, Root: f[1], Self: format.InstanceID{byte(inst + 1), 0xee},
		Duration: time.Microsecond, Skew: 0}
	var held, calls int
	last := uint64(0)
	for end := time.Now().Add(run); time.Now().Before(end); calls++ {
		ok, lease, err := l.Hold(time.Now())
		if err != nil {
			fmt.Printf("FAIL hold: %v\n", err)
			return exitChildCheck
		}
		if ok {
			held++
			if lease.Term != last {
				last = lease.Term
				fmt.Printf("TERM %d\n", lease.Term)
			}
		}
	}
	fmt.Printf("DONE %d %d\n", held, calls)
	return 0
}
