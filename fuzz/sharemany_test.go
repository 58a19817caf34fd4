package fuzz_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/fuzz/internal/workload"
)

// TestSharedManyKill: many instances share one tier, each in its own process (a child
// re-executing this test binary with its own store directory), half of them through one view
// of the shared directory and half through another (UCM_SHARE_KILL_DIR and
// UCM_SHARE_KILL_DIR2: two mounts of one GlusterFS volume), with one host id per view
// (engine.HostIDEnv), so that the instances of one view are on one host and the two views are
// two hosts. Every instance dumps its own blocks and loads the others' (any hit must be the
// right bytes); instances picked at random are SIGKILLed and restarted on their stores, and
// at the end all of them are. Then every instance is reopened and must load every block any
// instance acknowledged, byte-exact, while the bytes of the files under the shared directory
// (summed every few milliseconds over the whole run, on the GlusterFS bricks when
// UCM_SHARE_KILL_BRICKS names them) never exceed the bound manyBound states.
//
// The instances run with a shared capacity (manyCapacity) large enough that no acknowledged
// block need be reclaimed, so admission works through the kills — shares granted, held by
// killed instances, resumed at restart — while a block lost is a failure (reclamation under
// a capacity is TestSharedTierCapacityBound's), and a dump refused for lack of room is one too
// (a share leaked by a kill). Bytes beyond the bound — what the instances' blocks need
// (manyNeed) plus what each may hold ahead — are what kills leaked (segments abandoned, files
// of runs never removed).
//
// Environment: UCM_SHARE_MANY_INSTANCES (default 8), UCM_SHARE_MANY_KILLS (default 12),
// UCM_SHARE_MANY_BLOCKS (each instance's blocks, default 48) — 4, 4 and 24 on a local
// directory, where make unit runs it under the race detector —, UCM_SHARE_KILL_DIR,
// UCM_SHARE_KILL_DIR2, UCM_SHARE_KILL_REFRESH (as in TestSharedKillWhileReading),
// UCM_SHARE_KILL_BRICKS (colon-separated directories holding the volume's files, the shared
// directory's relative path found under each).
const (
	envManyInstances = "UCM_SHARE_MANY_INSTANCES"
	envManyKills     = "UCM_SHARE_MANY_KILLS"
	envManyBlocks    = "UCM_SHARE_MANY_BLOCKS"
	envManyBricks    = "UCM_SHARE_KILL_BRICKS"
	// internal: "run|<instance>|<store dir>|<shared dir>|<first block>|<blocks>|<blocks every
	// instance had acknowledged, comma-separated>|<mean pause between dumps>" or "check|<instance>|<store
	// dir>|<shared dir>|<file of acknowledged ids>".
	envManyChild = "UCM_SHARE_MANY_CHILD"
	// internal: the shared tier's capacity every child opens with (manyCapacity).
	envManyCapacity = "UCM_SHARE_MANY_CAPACITY"
	manySeed        = 78
	// manyStuckMargin is what the test keeps of its deadline (go test -timeout) to name an
	// instance that never answers — a file system call that never returns, a deadlock — with
	// its goroutines, rather than die in the test binary's own timeout, which shows only the
	// parent's. Without a deadline it waits manyStuckDefault.
	manyStuckMargin  = 45 * time.Second
	manyStuckDefault = 10 * time.Minute
)

// manyNeed is what instances dumping blocks each need on the volume: the segments their blocks
// fill (a record is the block and a 4 KiB header; a segment starts and ends with 4 KiB of its
// own: 7 killLayout blocks to a 1 MiB segment), plus one segment per instance for its last,
// partly filled one.
func manyNeed(instances, blocks int) int64 {
	seg := shareKillOptions("").SegmentSize
	perSeg := (seg - 8<<10) / (killLayout.BlockBytes() + 4<<10)
	return int64(instances) * ((int64(blocks)+perSeg-1)/perSeg + 1) * seg
}

// manyBound is what the files under the shared directory may sum to at any instant: what the
// blocks need plus, per instance, the segment it prepares ahead (at its full size: segments are
// preallocated) and 128 KiB for its manifests, publication logs and summaries, plus the lease.
func manyBound(need int64, instances int) int64 {
	seg := shareKillOptions("").SegmentSize
	return need + int64(instances)*(seg+128<<10) + 4<<10
}

// manyCapacity is the shared capacity the instances run with: admission is at work (each
// instance writes only within the share the lease holder granted it, killed instances keep
// theirs until they restart), but what the blocks need stays under the low watermark with
// room for every instance's share ahead (two segments), so that the reclaimer never has to
// retire an acknowledged block.
func manyCapacity(need int64, instances int) int64 {
	seg := shareKillOptions("").SegmentSize
	return need*100/80 + int64(instances)*3*seg
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want an integer >= 1", name, v)
	}
	return n
}

// manyInstance is the parent's view of one instance: its store, its view of the shared
// directory, its host, and what it acknowledged over all its runs.
type manyInstance struct {
	i        int
	store    string
	shared   string
	host     string
	capacity int64            // the shared tier's capacity it opens with
	next     int              // the first block its next run dumps
	acked    []format.BlockID // acknowledged over all runs, in order
	run      *manyRun         // the running child, or nil
	hits     int64            // loads of other instances' blocks, over all runs
	misses   int64
	// lockedOpens counts its runs whose Open still found the killed run's lock held, for
	// lockedMax at the longest
	lockedOpens int
	lockedMax   time.Duration
}

// noteLocked counts run r's wait for the lock of the run killed before it.
func (in *manyInstance) noteLocked(r *manyRun) {
	if r.locked > 0 {
		in.lockedOpens++
		in.lockedMax = max(in.lockedMax, r.locked)
	}
}

// manyRun is one child process and what its output said.
type manyRun struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer // read once exited is closed
	open   chan struct{}
	done   chan struct{} // its output ended
	exited chan struct{} // and it was waited for: waitErr and stderr are set
	// waitErr is what cmd.Wait returned
	waitErr error
	// checked is closed once the child reported its check (or a failure, or exited)
	checked chan struct{}
	// set by the reader goroutine; read after done is closed
	acked        []format.BlockID
	dumping      bool // a dump was under way (started, not acknowledged) when the output ended
	hits, misses int64
	loaded       int64
	reloaded     int64 // loads that missed after a hit and were retried (the block had moved)
	// locked is how long its Open still found the store locked by the run killed before it
	locked time.Duration
	fail   string
}

func startManyChild(t *testing.T, in *manyInstance, spec string) *manyRun {
	t.Helper()
	r := &manyRun{open: make(chan struct{}), done: make(chan struct{}), exited: make(chan struct{}), checked: make(chan struct{})}
	r.cmd = exec.Command(os.Args[0], "-test.run=^TestSharedManyKill$", "-test.count=1", "-test.timeout=0")
	// GOTRACEBACK=all: a child sent SIGQUIT because it hangs prints every goroutine
	r.cmd.Env = append(os.Environ(), "GOTRACEBACK=all", envManyChild+"="+spec, engine.HostIDEnv+"="+in.host, fmt.Sprintf("%s=%d", envManyCapacity, in.capacity))
	r.cmd.Stderr = &r.stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer func() {
			close(r.done)
			r.waitErr = r.cmd.Wait() // after the last read of the pipe, as Wait requires
			close(r.exited)
		}()
		sc := bufio.NewScanner(out)
		opened, checked := false, false
		report := func() {
			if !checked {
				checked = true
				close(r.checked)
			}
		}
		defer report()
		for sc.Scan() {
			verb, rest, _ := strings.Cut(sc.Text(), " ")
			f := strings.Fields(rest)
			switch verb {
			case "OPEN":
				if len(f) > 0 {
					us, _ := strconv.ParseInt(f[0], 10, 64)
					r.locked = time.Duration(us) * time.Microsecond
				}
				if !opened {
					opened = true
					close(r.open)
				}
			case "DUMPING":
				r.dumping = true
			case "ACK":
				r.dumping = false
				if id, err := format.ParseBlockID(f[0]); err == nil {
					r.acked = append(r.acked, id)
				}
			case "LOADS":
				r.hits, _ = strconv.ParseInt(f[0], 10, 64)
				r.misses, _ = strconv.ParseInt(f[1], 10, 64)
			case "RELOADED":
				r.reloaded, _ = strconv.ParseInt(f[0], 10, 64)
			case "CHECKED":
				r.loaded, _ = strconv.ParseInt(f[0], 10, 64)
				report()
			case "FAIL":
				r.fail = rest
				report()
			}
		}
		if !opened {
			close(r.open)
		}
	}()
	return r
}

// frameRegs matches the registers a SIGQUIT dump prints after each frame.
var frameRegs = regexp.MustCompile(` fp=0x[0-9a-f]+ sp=0x[0-9a-f]+ pc=0x[0-9a-f]+`)

// manyWatch bounds the parent's waits on its children: past giveUp, a child that has not
// answered is named, with its goroutines, and the test fails.
type manyWatch struct {
	ins    []*manyInstance
	giveUp time.Time
}

func newManyWatch(t *testing.T, ins []*manyInstance) *manyWatch {
	giveUp := time.Now().Add(manyStuckDefault)
	if d, ok := t.Deadline(); ok {
		giveUp = d.Add(-manyStuckMargin)
	}
	return &manyWatch{ins: ins, giveUp: giveUp}
}

// await waits until ch is closed; past the watch's deadline it fails the test naming in's
// child as stuck at what, with the goroutines of every child still running.
func (w *manyWatch) await(t *testing.T, in *manyInstance, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		return
	case <-time.After(time.Until(w.giveUp)):
	}
	var b strings.Builder
	fmt.Fprintf(&b, "instance %d did not %s by %s; the children still running, with their goroutines:\n", in.i, what, w.giveUp.Format(time.TimeOnly))
	for _, o := range w.ins {
		if o.run != nil {
			_ = o.run.cmd.Process.Signal(syscall.SIGQUIT)
		}
	}
	for _, o := range w.ins {
		if o.run == nil {
			continue
		}
		fmt.Fprintf(&b, "instance %d %s", o.i, stuckReport(o.run.cmd.Process.Pid, o.run.exited, &o.run.stderr))
	}
	t.Fatal(b.String())
}

// stuckReport describes child pid, just sent SIGQUIT (with GOTRACEBACK=all): once it has
// exited (exited closed, its stderr complete), the goroutines it printed; if it has not
// within 5 s it is stuck in a file system call (a FUSE request never answered), which it
// leaves only when the call returns, and its threads' kernel stacks say where.
func stuckReport(pid int, exited <-chan struct{}, stderr *bytes.Buffer) string {
	select {
	case <-exited:
		return fmt.Sprintf("(pid %d): %.20000s\n", pid, frameRegs.ReplaceAllString(stderr.String(), ""))
	case <-time.After(5 * time.Second):
		return fmt.Sprintf("(pid %d): did not exit on SIGQUIT; its threads in the kernel:\n%s", pid, kernelStacks(pid))
	}
}

// kernelStacks lists the distinct kernel stacks of process pid's threads (/proc/pid/task/*/stack,
// readable by root), each with the names of the threads in it.
func kernelStacks(pid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	var order []string
	threads := map[string][]string{}
	for _, task := range tasks {
		stack, err := os.ReadFile(filepath.Join(task, "stack"))
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(task, "comm"))
		k := string(stack)
		if _, ok := threads[k]; !ok {
			order = append(order, k)
		}
		threads[k] = append(threads[k], filepath.Base(task)+" "+strings.TrimSpace(string(comm)))
	}
	var b strings.Builder
	for _, k := range order {
		fmt.Fprintf(&b, "  threads %s:\n%s", strings.Join(threads[k], ", "), k)
	}
	return b.String()
}

// kill SIGKILLs the instance's running child, waits for it and takes in what it acknowledged.
// It reports whether the child was in a dump (started, not acknowledged).
func (in *manyInstance) kill(t *testing.T, w *manyWatch) bool {
	t.Helper()
	r := in.run
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	w.await(t, in, r.exited, "exit on SIGKILL")
	err := r.waitErr
	in.run = nil
	if r.fail != "" {
		t.Fatalf("instance %d: %s\n%s", in.i, r.fail, r.stderr.String())
	}
	// Killed, or it ran childMaxRun unkilled and closed its store: anything else is a failure.
	if ws, ok := r.cmd.ProcessState.Sys().(syscall.WaitStatus); err != nil && !(ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL) {
		t.Fatalf("instance %d: %v\n%s", in.i, err, r.stderr.String())
	}
	in.acked = append(in.acked, r.acked...)
	in.next += len(r.acked)
	in.hits += r.hits
	in.misses += r.misses
	in.noteLocked(r)
	return r.dumping
}

// volumeBytes sums the sizes of the regular files under rel in each root, leaving out
// GlusterFS's own .glusterfs directory (hard links to the files counted already).
func volumeBytes(roots []string, rel string) int64 {
	var sum int64
	for _, root := range roots {
		_ = filepath.WalkDir(filepath.Join(root, rel), func(_ string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // a file removed while walking
			}
			if d.IsDir() && d.Name() == ".glusterfs" {
				return filepath.SkipDir
			}
			if d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					sum += fi.Size()
				}
			}
			return nil
		})
	}
	return sum
}

func TestSharedManyKill(t *testing.T) {
	if v := os.Getenv(envManyChild); v != "" {
		os.Exit(manyChild(v))
	}
	// On a local directory (make unit, under the race detector) a lighter default.
	instances, kills, blocks := 4, 4, 24
	if os.Getenv(envShareDir) != "" {
		instances, kills, blocks = 8, 12, 48
	}
	instances = envInt(t, envManyInstances, instances)
	kills = envInt(t, envManyKills, kills)
	blocks = envInt(t, envManyBlocks, blocks)
	need := manyNeed(instances, blocks)
	bound := manyBound(need, instances)

	base := t.TempDir()
	rel := fmt.Sprintf("sharemany-%d", time.Now().UnixNano())
	views := []string{filepath.Join(base, "shared")}
	roots := []string{base}
	if d := os.Getenv(envShareDir); d != "" {
		views, roots = []string{d}, []string{d}
		if d2 := os.Getenv(envShareDir2); d2 != "" {
			views = append(views, d2)
		}
	} else {
		rel = "shared"
	}
	if b := os.Getenv(envManyBricks); b != "" {
		roots = strings.Split(b, ":")
	}
	for i := range views {
		views[i] = filepath.Join(views[i], rel)
	}
	if err := os.MkdirAll(views[0], 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(views[0]) })

	// The sampler: the bytes on the volume, every few milliseconds, until the end.
	var peak atomic.Int64
	samples := 0
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := volumeBytes(roots, rel); n > peak.Load() {
				peak.Store(n)
			}
			samples++
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	sampling := true
	endSampling := func() {
		if sampling {
			sampling = false
			close(stopSampling)
			<-sampled
		}
	}
	defer endSampling()

	ins := make([]*manyInstance, instances)
	for i := range ins {
		v := i % len(views)
		ins[i] = &manyInstance{i: i, store: filepath.Join(base, fmt.Sprintf("inst-%d", i)),
			shared: views[v], host: fmt.Sprintf("host-%c", 'a'+v), capacity: manyCapacity(need, instances)}
	}
	// Writers pause between their dumps so that they are still dumping at the last kills: about
	// 300 ms a kill (the pause before it and the restart), over the batches of 4 each dumps.
	pause := time.Duration(kills) * 300 * time.Millisecond / time.Duration((blocks+3)/4)
	runSpec := func(in *manyInstance) string {
		counts := make([]string, len(ins))
		for j, o := range ins {
			counts[j] = strconv.Itoa(o.next)
		}
		return fmt.Sprintf("run|%d|%s|%s|%d|%d|%s|%s", in.i, in.store, in.shared, in.next, blocks, strings.Join(counts, ","), pause)
	}
	defer func() { // whatever still runs when the test fails
		for _, in := range ins {
			if in.run != nil {
				_ = in.run.cmd.Process.Kill()
				// not waited for without bound: a process stuck in a FUSE call dies only
				// when the call returns
				select {
				case <-in.run.exited:
				case <-time.After(5 * time.Second):
				}
			}
		}
	}()
	watch := newManyWatch(t, ins)
	for _, in := range ins {
		in.run = startManyChild(t, in, runSpec(in))
	}
	r := rand.New(rand.NewPCG(manySeed, uint64(time.Now().UnixNano())))
	// kills of an instance that had not acknowledged all its blocks yet, and of one in a dump
	writing, inDump := 0, 0
	for k := 0; k < kills; k++ {
		in := ins[r.IntN(instances)]
		watch.await(t, in, in.run.open, "open its store")
		time.Sleep(time.Duration(50+r.IntN(450)) * time.Millisecond)
		if in.kill(t, watch) {
			inDump++
		}
		if in.next < blocks {
			writing++
		}
		in.run = startManyChild(t, in, runSpec(in))
	}
	for _, in := range ins { // the last kill: every instance, at once
		watch.await(t, in, in.run.open, "open its store")
	}
	time.Sleep(time.Duration(50+r.IntN(200)) * time.Millisecond)
	var all []format.BlockID
	var hits, misses int64
	for _, in := range ins {
		if in.kill(t, watch) {
			inDump++
		}
		if in.next < blocks {
			writing++
		}
		all = append(all, in.acked...)
		hits += in.hits
		misses += in.misses
	}
	if len(all) == 0 {
		t.Fatal("no instance acknowledged a block")
	}

	// Every instance reopened loads every acknowledged block, its own and the others'.
	var ids strings.Builder
	for _, id := range all {
		fmt.Fprintln(&ids, id)
	}
	list := filepath.Join(base, "acked")
	if err := os.WriteFile(list, []byte(ids.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		in.run = startManyChild(t, in, fmt.Sprintf("check|%d|%s|%s|%s", in.i, in.store, in.shared, list))
	}
	var loads, reloads int64
	for _, in := range ins {
		watch.await(t, in, in.run.checked, "report its check")
	}
	// Every instance has checked (or failed): let them close, and collect.
	for _, in := range ins {
		_ = in.run.stdin.Close()
	}
	var failed []string
	for _, in := range ins {
		rn := in.run
		watch.await(t, in, rn.exited, "close its store and exit")
		err := rn.waitErr
		in.run = nil
		if rn.fail != "" || err != nil {
			failed = append(failed, fmt.Sprintf("instance %d (exit %v): %s\n%s", in.i, err, rn.fail, rn.stderr.String()))
		}
		loads += rn.loaded
		reloads += rn.reloaded
		in.noteLocked(rn)
	}
	var lockedOpens int
	var lockedMax time.Duration
	for _, in := range ins {
		lockedOpens += in.lockedOpens
		lockedMax = max(lockedMax, in.lockedMax)
	}
	endSampling()
	if len(failed) > 0 {
		t.Fatal(strings.Join(failed, "\n"))
	}
	if want := int64(len(all) * instances); loads != want {
		t.Fatalf("%d byte-exact loads after the kills, want %d (%d blocks × %d instances)", loads, want, len(all), instances)
	}
	t.Logf("%d instances over %d views, %d kills and %d at the end (%d of a writer with blocks left to dump, %d in a dump): %d blocks acknowledged (%.1f MiB); during the kills %d hits of other instances' blocks, %d misses, 0 wrong; "+
		"after: %d loads byte-exact (%d retried after a miss: moved by a reopened owner), 0 lost; %d reopens found the killed run's lock still held (for at most %v); on-volume bytes peak %d (%.1f MiB, %d samples) against %d (%.1f MiB) the blocks need, bound %d (%.1f MiB); shared capacity %.1f MiB",
		instances, len(views), kills, instances, writing, inDump, len(all), float64(len(all))*float64(killLayout.BlockBytes())/(1<<20), hits, misses,
		loads, reloads, lockedOpens, lockedMax, peak.Load(), float64(peak.Load())/(1<<20), samples, need, float64(need)/(1<<20), bound, float64(bound)/(1<<20), float64(manyCapacity(need, instances))/(1<<20))
	if p := peak.Load(); p > bound {
		t.Fatalf("on-volume bytes peaked at %d, over the bound %d (%d the blocks need + %d instances × (a segment + 128 KiB) + the lease)", p, bound, need, instances)
	}
}

// manyChild runs one instance: "run" dumps its blocks from the first given on, loading other
// instances' blocks in between (a hit must be the right bytes, a miss is allowed), until
// killed; "check" reopens the store, waits until every
// acknowledged block is visible, loads each byte-exact, reports, and closes the store when
// stdin closes. It returns the exit code.
func manyChild(spec string) int {
	f := strings.Split(spec, "|")
	inst, _ := strconv.Atoi(f[1])
	o := shareKillOptions(f[3])
	o.Tiers[0].Capacity, _ = strconv.ParseInt(os.Getenv(envManyCapacity), 10, 64)
	e, locked, err := openAfterKill(f[2], o)
	if err != nil {
		fmt.Printf("FAIL open (locked for %v): %v\n", locked, err)
		return exitChildSetup
	}
	if rec := e.Recovery(); rec.SegmentsAdopted != 0 {
		fmt.Printf("FAIL adopted %d segments (another instance's?)\n", rec.SegmentsAdopted)
		return exitChildCheck
	}
	fmt.Printf("OPEN %d\n", locked.Microseconds())
	if f[0] == "check" {
		return manyCheck(e, f[4])
	}
	first, _ := strconv.Atoi(f[4])
	blocks, _ := strconv.Atoi(f[5])
	var known []int // what the others had acknowledged when this run started
	for _, c := range strings.Split(f[6], ",") {
		n, _ := strconv.Atoi(c)
		known = append(known, n)
	}
	pause, _ := time.ParseDuration(f[7])
	stop, stopped := make(chan struct{}), make(chan struct{})
	if len(known) > 1 {
		go func() {
			defer close(stopped)
			manyReader(e, inst, blocks, known, rand.New(rand.NewPCG(manySeed, uint64(inst)<<32|uint64(first))), stop)
		}()
	} else {
		close(stopped)
	}
	buf := make([][]byte, 4)
	for i := range buf {
		buf[i] = devio.AlignedBuffer(int(killLayout.BlockBytes()))
	}
	deadline := time.Now().Add(childMaxRun)
	for n := first; n < blocks && time.Now().Before(deadline); n += len(buf) {
		ids := make([]format.BlockID, min(len(buf), blocks-n))
		for i := range ids {
			ids[i] = workload.ID(manySeed, inst, workload.Whole, n+i)
			workload.Fill(ids[i], manySeed, buf[i])
		}
		fmt.Println("DUMPING")
		if err := e.Dump(ids, buf[:len(ids)]).Wait(); err != nil {
			fmt.Printf("FAIL dump: %v\n", err)
			return exitChildCheck
		}
		for _, id := range ids {
			fmt.Printf("ACK %s\n", id)
		}
		if pause > 0 {
			time.Sleep(time.Duration(rand.Int64N(2 * int64(pause))))
		}
	}
	time.Sleep(time.Until(deadline)) // all dumped: a reader only
	close(stop)
	<-stopped
	_ = e.Close()
	return 0
}

// manyReader loads other instances' blocks until stop is closed: mostly blocks the other had
// acknowledged when this run started (known), some it may be dumping now. A hit must be the
// right bytes (else the process exits reporting it); a miss is allowed. It prints its counts
// after every batch.
func manyReader(e *engine.Engine, inst, blocks int, known []int, r *rand.Rand, stop <-chan struct{}) {
	buf := make([][]byte, 4)
	for i := range buf {
		buf[i] = devio.AlignedBuffer(int(killLayout.BlockBytes()))
	}
	var hits, misses int64
	for {
		ids := make([]format.BlockID, len(buf))
		for i := range ids {
			other := (inst + 1 + r.IntN(len(known)-1)) % len(known)
			n := r.IntN(blocks)
			if known[other] > 0 && r.IntN(4) != 0 {
				n = r.IntN(known[other])
			}
			ids[i] = workload.ID(manySeed, other, workload.Whole, n)
		}
		task := e.Load(ids, buf)
		_ = task.Wait()
		for i, err := range task.BlockErrors() {
			switch {
			case err == nil:
				if cerr := workload.Check(ids[i], manySeed, 0, buf[i]); cerr != nil {
					fmt.Printf("FAIL wrong bytes: %v\n", cerr)
					os.Exit(exitChildCheck)
				}
				hits++
			case errors.Is(err, engine.ErrNotFound) || errors.Is(err, engine.ErrCorrupt):
				misses++
			default:
				fmt.Printf("FAIL load of %s: %v\n", ids[i], err)
				os.Exit(exitChildCheck)
			}
		}
		fmt.Printf("LOADS %d %d\n", hits, misses)
		select {
		case <-stop:
			return
		case <-time.After(2 * time.Millisecond): // a reader, not a spinner: misses come back at once
		}
	}
}

func manyCheck(e *engine.Engine, list string) int {
	b, err := os.ReadFile(list)
	if err != nil {
		fmt.Printf("FAIL %v\n", err)
		return exitChildSetup
	}
	var ids []format.BlockID
	for _, l := range strings.Fields(string(b)) {
		id, err := format.ParseBlockID(l)
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", list, err)
			return exitChildSetup
		}
		ids = append(ids, id)
	}
	// Visible once every owner has reopened and published what it recovered. A block that
	// hits and then misses at its load was compacted away by its reopened owner while this
	// reader's view lagged the retire grace (docs/sharing.md): it must hit again at its new
	// place and load then; it is counted.
	deadline := time.Now().Add(2 * time.Minute)
	dst := make([][]byte, 16)
	for i := range dst {
		dst[i] = devio.AlignedBuffer(int(killLayout.BlockBytes()))
	}
	var loaded, reloaded int64
	pending := ids
	for len(pending) > 0 {
		var visible, missing []format.BlockID
		for i, h := range e.Lookup(pending) {
			if h {
				visible = append(visible, pending[i])
			} else {
				missing = append(missing, pending[i])
			}
		}
		var again []format.BlockID
		for lo := 0; lo < len(visible); lo += len(dst) {
			batch := visible[lo:min(len(visible), lo+len(dst))]
			task := e.Load(batch, dst[:len(batch)])
			_ = task.Wait() // each block's outcome is in BlockErrors
			for i, err := range task.BlockErrors() {
				switch {
				case errors.Is(err, engine.ErrNotFound):
					again = append(again, batch[i])
					reloaded++
					continue
				case err != nil:
					fmt.Printf("FAIL load of %s: %v\n", batch[i], err)
					_ = e.Close()
					return exitChildCheck
				}
				if err := workload.Check(batch[i], manySeed, 0, dst[i]); err != nil {
					fmt.Printf("FAIL wrong bytes: %v\n", err)
					_ = e.Close()
					return exitChildCheck
				}
				loaded++
			}
		}
		pending = append(missing, again...)
		if len(pending) > 0 && time.Now().After(deadline) {
			fmt.Printf("FAIL %d of %d acknowledged blocks never loaded (lost), e.g. %s\n", len(pending), len(ids), pending[0])
			_ = e.Close()
			return exitChildCheck
		}
		if len(pending) > 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if reloaded > 0 {
		fmt.Printf("RELOADED %d\n", reloaded)
	}
	fmt.Printf("CHECKED %d\n", loaded)
	_, _ = io.Copy(io.Discard, os.Stdin) // the others may still need this instance's publications
	if err := e.Close(); err != nil {
		fmt.Printf("FAIL close: %v\n", err)
		return exitChildCheck
	}
	return 0
}
