package fuzz_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
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
	"github.com/ucm-go/ucm/tiers"
)

// The blackbox kill -9 loop (after RocksDB's db_crashtest): the test binary re-executes itself
// as a writer child that runs concurrent whole-block, layer-wise and V0 dumps, commits,
// discards, duplicate dumps and loads on the real disk (O_DIRECT; io_uring when built with
// -tags uring), reporting every dump it starts and every acknowledgement over a pipe. The
// parent SIGKILLs it at a random moment, reopens the store (recovery), checks every
// acknowledged block of every cycle so far byte for byte (payloads are a function of the block
// id: no oracle file), checks that nothing discarded or never dumped is visible and nothing
// visible is torn, runs `ucm-tool verify`, and loops on the same directory.
//
// It covers process crashes on the real I/O path, not power loss (the page cache survives a
// kill -9; TestCrashAtEveryWrite in package engine simulates power loss).
//
// Environment:
//
//	UCM_KILL_CYCLES  cycles to run (default 20; `make crashtest` runs 200)
//	UCM_KILL_SEED    seed of the kill schedule, block ids and payloads (default: from the clock; logged)
//	UCM_KILL_REPORT  append the figures as one JSON line to this file
//	UCM_KILL_TOOL    a ucm-tool binary to use (default: built with go build for the test)
//	UCM_KILL_MODE    the store's configuration (default flat; killModes): flat, tiered,
//	                 shared, memory, interval, psync, compaction, recycling. Each mode asserts
//	                 at the end that its feature was exercised in the children (see killModes)
//	UCM_KILL_CHILD   internal: set by the parent in the child, the store directory
//
// The run ends with one line "kill-summary mode=... cycles=... acked=... loads=... lost=...
// wrong=..." (also when it fails), which `make crashtest-long` collects into a table.
const (
	envCycles = "UCM_KILL_CYCLES"
	envSeed   = "UCM_KILL_SEED"
	envReport = "UCM_KILL_REPORT"
	envTool   = "UCM_KILL_TOOL"
	envMode   = "UCM_KILL_MODE"
	envChild  = "UCM_KILL_CHILD"
	// Internal, child only.
	envChildCycle = "UCM_KILL_CHILD_CYCLE"
	envChildSeed  = "UCM_KILL_CHILD_SEED"

	defaultKillCycles = 20
	// childMaxRun bounds a child the parent failed to kill: it then closes the store and
	// exits 0.
	childMaxRun = 10 * time.Second
	// Kill delays after the child reported its store open.
	minKillDelay = 20 * time.Millisecond
	maxKillDelay = 400 * time.Millisecond
	// childBlockRate paces the child's new blocks (duplicates and loads are not paced) so the
	// store, which only grows until eviction exists, stays a few GiB after 200 cycles.
	childBlockRate = 500 // blocks a second
	// Past fullCheckBlocks blocks in the store, a cycle byte-checks the blocks of the last two
	// cycles and sampleBlocks others (every 10th cycle and the last still check every block;
	// every cycle looks every acknowledged block up), and ucm-tool verify (which reads the
	// whole store) runs past toolEveryBytes only every third cycle and at the end.
	fullCheckBlocks = 4096
	sampleBlocks    = 512
	toolEveryBytes  = 512 << 20
	// Child exit codes other than 0 (ran childMaxRun and closed cleanly).
	exitChildSetup = 2 // open failed
	exitChildCheck = 3 // a load returned wrong bytes, or an operation failed unexpectedly
)

// killLayout: 8 layers, K and V, 16 KiB a shard: 128 KiB blocks, about 7 to a 1 MiB segment,
// so segments rotate every few dumps.
var killLayout = engine.Layout{Shards: 8, TensorsPerShard: 2, ShardBytes: 16 << 10}

var killSchema = engine.Schema{Model: "killloop", DType: "bfloat16", KVLayout: "mha", TPRank: 0, TPSize: 1, BlockTokens: 16}

func killOptions(dir string) engine.Options {
	o := engine.Options{
		Layout:      killLayout,
		Schema:      killSchema,
		FS:          vfs.Default,
		SegmentSize: 1 << 20,
		SyncPolicy:  engine.SyncAlways,
		IOEngine:    devio.EngineAuto,
		DirectIO:    devio.DirectOn,
		TaskTimeout: 10 * time.Second,
	}
	switch killMode() {
	case "tiered":
		o.Tiers = []tiers.Config{
			// The headroom above the high watermark (1.2 MiB) keeps a retired segment's file
			// for reuse: kills land between a reuse's rename and its first write too.
			{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir, dir + "-ssd2"}, Capacity: 6 << 20, HighWatermark: 0.8, LowWatermark: 0.6},
			{Name: "cold", Kind: tiers.KindDisk, Paths: []string{dir + "-cold"}},
		}
	case "shared":
		// The store's one tier is shared: the child seals and publishes segments (manifest,
		// publication log) every few dumps while it is killed.
		o.Tiers = []tiers.Config{{Name: "shared", Kind: tiers.KindDisk, Paths: []string{dir + "-shared"}, Shared: true}}
		o.SharedRefreshInterval, o.SharedSealAge, o.SharedRetireGrace = 20*time.Millisecond, 50*time.Millisecond, time.Second
	case "memory":
		// A memory tier smaller than a cycle's blocks in front of the disk: loads hit it, it
		// evicts, and the kill loses all of it (nothing acknowledged may live only there).
		o.Tiers = []tiers.Config{
			{Name: "dram", Kind: tiers.KindMemory, Capacity: 4 << 20},
			{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}},
		}
	case "interval":
		// Acknowledged once written and indexed, synced only every 20 ms: a kill -9 (the page
		// cache survives it) must lose nothing acknowledged.
		o.SyncPolicy, o.SyncInterval = engine.SyncInterval, 20*time.Millisecond
	case "compaction":
		// The child compacts (killChild.compact) into new files; retired ones are deleted.
		o.RecycleSegments = -1
	case "recycling":
		// The child compacts, and the retired segments' files are kept and reused by new
		// segments: kills land between a reuse's rename and its first write.
		o.RecycleSegments = 16
	}
	return o
}

// killModes are the store configurations UCM_KILL_MODE selects, and what each must show it
// exercised by the end of a run (asserted in TestKillLoop):
//
//	flat        one unlimited disk tier in the store directory, SyncAlways
//	tiered      a 6 MiB first tier over two paths above an unlimited one: blocks demoted
//	shared      one shared tier: the children published manifests
//	memory      a 4 MiB memory tier in front of the disk: loads served from memory
//	interval    SyncInterval (20 ms): as flat, acknowledgements do not wait for a sync
//	psync       as flat, on the build without the uring tag: the children ran on psync
//	compaction  the child compacts continuously: segments compacted, kills during compaction
//	recycling   as compaction, keeping retired files: segments created in recycled files
var killModes = []string{"flat", "tiered", "shared", "memory", "interval", "psync", "compaction", "recycling"}

// killMode returns UCM_KILL_MODE (default flat).
func killMode() string {
	if m := os.Getenv(envMode); m != "" {
		return m
	}
	return "flat"
}

// killCompacts reports whether the mode's child compacts (killChild.compact).
func killCompacts() bool { m := killMode(); return m == "compaction" || m == "recycling" }

// killFigures are the figures of a run, logged and written to UCM_KILL_REPORT.
type killFigures struct {
	Cycles            int     `json:"cycles"`
	Kills             int     `json:"kills"`
	KillsBeforeReady  int     `json:"kills_before_ready"`
	CleanExits        int     `json:"clean_exits"`
	IOEngine          string  `json:"io_engine"`
	DirectIO          bool    `json:"direct_io"`
	RaceDetector      bool    `json:"race_detector"`
	AckEvents         int64   `json:"ack_events"`
	BlocksAcked       int     `json:"blocks_acked"`
	SidecarsVerified  int64   `json:"sidecars_verified"`
	BlocksStarted     int     `json:"blocks_started"`
	BlocksDiscarded   int     `json:"blocks_discarded"`
	BlocksPresent     int     `json:"blocks_present_at_end"`
	BlocksVerified    int64   `json:"blocks_verified"`
	FullChecks        int     `json:"full_checks"`
	ToolRecoveries    int     `json:"tool_recoveries"`
	EngineRecoveries  int     `json:"engine_recoveries"`
	RecoveryMaxMs     float64 `json:"recovery_max_ms"`
	RecoveryMeanMs    float64 `json:"recovery_mean_ms"`
	OpenMaxMs         float64 `json:"open_max_ms"`
	OpenMeanMs        float64 `json:"open_mean_ms"`
	SegmentsRecovered int     `json:"segments_recovered"`
	TruncatedBytes    int64   `json:"truncated_bytes"`
	EntriesDropped    int     `json:"entries_dropped"`
	OrphansRemoved    int     `json:"orphans_removed"`
	StoreBytes        int64   `json:"store_bytes_at_end"`
	Mode              string  `json:"mode"`
	// BlocksLost and BlocksWrong sum the acknowledged blocks found missing and the visible
	// blocks that loaded wrong bytes over the cycles' checks (any is a failure).
	BlocksLost  int `json:"blocks_lost"`
	BlocksWrong int `json:"blocks_wrong"`
	// ChildLoadsChecked counts the loads the children checked byte for byte while they ran
	// (as last reported before each kill).
	ChildLoadsChecked int64 `json:"child_loads_checked"`
	// What the children did, as last reported before each kill, summed over the cycles:
	// segments compacted and records they moved (compaction, recycling; KillsInCompaction: kills
	// that landed during a Compact call), segments created in recycled files, loads served from
	// the memory tier, manifests published to a shared tier.
	SegmentsCompacted  int64 `json:"segments_compacted"`
	RecordsMoved       int64 `json:"records_moved"`
	KillsInCompaction  int   `json:"kills_in_compaction"`
	SegmentsRecycled   int64 `json:"segments_recycled"`
	MemoryHits         int64 `json:"memory_hits"`
	ManifestsPublished int64 `json:"manifests_published"`
	// Tiered runs: the most blocks found in the second tier after a kill (demoted by the
	// child), and the segments retired by recoveries finishing an interrupted retirement.
	DemotedBlocksMax   int64 `json:"demoted_blocks_max"`
	RetirementsResumed int   `json:"retirements_resumed"`
	// RecycledFilesSeen counts reopens that found recycled segment files kept for reuse, and
	// EmptySegmentsDeleted the active segments recovery deleted as never written (a recycled
	// file renamed for a segment whose header never reached the disk among them).
	RecycledFilesSeen    int     `json:"recycled_files_seen"`
	EmptySegmentsDeleted int     `json:"empty_segments_deleted"`
	Seconds              float64 `json:"seconds"`
	Seed                 uint64  `json:"seed"`
}

func TestKillLoop(t *testing.T) {
	if dir := os.Getenv(envChild); dir != "" {
		os.Exit(runKillChild(dir))
	}
	if testing.Short() {
		t.Skip("kill -9 loop: skipped in -short mode")
	}
	cycles := defaultKillCycles
	if s := os.Getenv(envCycles); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", envCycles, s)
		}
		cycles = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envSeed); s != "" {
		n, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envSeed, s, err)
		}
		seed = n
	}
	mode := killMode()
	if !slices.Contains(killModes, mode) {
		t.Fatalf("%s=%q: want one of %v", envMode, mode, killModes)
	}
	if mode == "psync" && uringTag {
		t.Fatalf("%s=psync runs on the build without the uring tag (go test without -tags uring)", envMode)
	}
	t.Logf("kill loop: mode %s, %d cycles, seed %d (rerun with %s=%s %s=%d)", mode, cycles, seed, envMode, mode, envSeed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	begin := time.Now()

	tool := buildUCMTool(t)
	dir := filepath.Join(t.TempDir(), "store")
	segDir := filepath.Join(dir, engine.SegmentDir)
	state := workload.NewState()
	fig := killFigures{Seed: seed, RaceDetector: raceEnabled(), Mode: mode}
	// The summary line, also when the run fails: what was checked up to then.
	defer func() {
		_, acked, _, _ := state.Counts()
		t.Logf("kill-summary mode=%s cycles=%d kills=%d acked=%d loads=%d child_loads=%d lost=%d wrong=%d io=%s evidence=%s seconds=%.0f failed=%v",
			mode, fig.Cycles, fig.Kills, acked, fig.BlocksVerified, fig.ChildLoadsChecked, fig.BlocksLost, fig.BlocksWrong,
			fig.IOEngine, killEvidence(&fig), time.Since(begin).Seconds(), t.Failed())
	}()
	var recoverySum, openSum time.Duration
	lastReady := 300 * time.Millisecond // time from start to READY, for kills before it
	present := 0

	for c := 0; c < cycles; c++ {
		state.NextEpoch()
		last := c == cycles-1
		// 1 in 6 cycles kills at a random moment from the process start (possibly before or
		// during Open); the others at a random moment of the workload.
		early := c > 0 && rng.IntN(6) == 0
		var delay time.Duration
		if early {
			delay = time.Duration(rng.Int64N(int64(lastReady + 50*time.Millisecond)))
		} else {
			delay = minKillDelay + time.Duration(rng.Int64N(int64(maxKillDelay-minKillDelay)))
		}
		out := runKillCycle(t, dir, c, seed, early, delay, state)
		if out.ready > 0 {
			lastReady = out.ready
		}
		if out.ioEngine != "" {
			fig.IOEngine, fig.DirectIO = out.ioEngine, out.direct
		}
		fig.ChildLoadsChecked += out.stats.Loads
		fig.SegmentsCompacted += out.compacted
		fig.RecordsMoved += out.moved
		fig.SegmentsRecycled += out.stats.Recycled
		fig.MemoryHits += out.stats.MemoryHits
		fig.ManifestsPublished += out.stats.Published
		if out.killed && out.inCompact {
			fig.KillsInCompaction++
		}
		switch {
		case out.killed && out.ready == 0:
			fig.Kills++
			fig.KillsBeforeReady++
		case out.killed:
			fig.Kills++
		default:
			fig.CleanExits++
		}
		if t.Failed() {
			t.Fatalf("cycle %d: child failed (seed %d)", c, seed)
		}

		// Every third cycle ucm-tool verify meets the crash-left store first and recovers it;
		// otherwise the engine's Open does.
		toolFirst := c%3 == 2
		toolAfter := !toolFirst && (last || dirBytes(dir) <= toolEveryBytes)
		if toolFirst {
			runVerify(t, tool, dir, c)
			fig.ToolRecoveries++
		}
		start := time.Now()
		// The child compacts and retires in the background (it is killed in the middle of
		// that too); the check holds still: files and accounting are compared on an open
		// store, so nothing may retire a segment between the two.
		checkOpts := killOptions(dir)
		checkOpts.CompactInterval = -1
		e, err := engine.Open(dir, checkOpts)
		openTook := time.Since(start)
		if err != nil {
			t.Fatalf("cycle %d: reopen after kill -9: %v (seed %d)", c, err, seed)
		}
		rep := e.Recovery()
		fig.RetirementsResumed += rep.RetiredSegmentsDeleted
		fig.EmptySegmentsDeleted += rep.EmptySegmentsDeleted
		ts := e.TierStats()
		if mode == "tiered" {
			fig.DemotedBlocksMax = max(fig.DemotedBlocksMax, ts[1].Blocks)
		}
		if slices.ContainsFunc(ts, func(s engine.TierStats) bool { return s.Recycled > 0 }) {
			fig.RecycledFilesSeen++
		}
		if !toolFirst {
			fig.EngineRecoveries++
			recoverySum += rep.Duration
			openSum += openTook
			fig.RecoveryMaxMs = max(fig.RecoveryMaxMs, ms(rep.Duration))
			fig.OpenMaxMs = max(fig.OpenMaxMs, ms(openTook))
		}
		fig.SegmentsRecovered += rep.SegmentsRecovered
		fig.TruncatedBytes += rep.TruncatedBytes
		fig.EntriesDropped += rep.EntriesDropped
		fig.OrphansRemoved += rep.OrphansRemoved
		if len(rep.MissingSegments) > 0 {
			t.Errorf("cycle %d: recovery reports missing sealed segments %v", c, rep.MissingSegments)
		}
		vopts := workload.VerifyOptions{SegDir: segDir}
		if mode == "tiered" || mode == "shared" {
			// Segments live on other paths (tiered: three, and loads from the second tier
			// start promotions, new segments, while the check runs): ucm-tool verify compares
			// files and accounting on the closed store instead.
			vopts.SegDir = ""
		}
		if present > fullCheckBlocks && c%10 != 9 && !last {
			vopts.Sample, vopts.RecentEpochs, vopts.Rand = sampleBlocks, 2, rng
		} else {
			fig.FullChecks++
		}
		res, verr := state.Verify(e, seed, vopts)
		fig.BlocksLost += res.Lost
		fig.BlocksWrong += res.Wrong
		fig.BlocksVerified += int64(res.Verified)
		fig.SidecarsVerified += int64(res.Sidecars)
		fig.BlocksPresent, present = res.Present, res.Present
		st := e.Stats()
		if err := e.Close(); err != nil {
			t.Errorf("cycle %d: close: %v", c, err)
		}
		if verr != nil {
			t.Fatalf("cycle %d (seed %d, killed after %v, early %v): crash contract violated:\n%v", c, seed, delay, early, verr)
		}
		started, acked, _, _ := state.Counts()
		t.Logf("cycle %3d: kill after %3dms%s (ready %3dms, %4d events) | open %4.0fms, recovered %d seg, cut %6d B, dropped %d, orphans %d | %5d present, %5d acked of %5d started, %d segs",
			c, delay.Milliseconds(), map[bool]string{true: " early", false: "      "}[early], out.ready.Milliseconds(), out.events,
			ms(openTook), rep.SegmentsRecovered, rep.TruncatedBytes, rep.EntriesDropped, rep.OrphansRemoved,
			res.Present, acked, started, st.Segments)
		if toolAfter {
			runVerify(t, tool, dir, c)
		}
		if t.Failed() {
			t.Fatalf("cycle %d failed (seed %d)", c, seed)
		}
		fig.Cycles++
	}

	fig.BlocksStarted, fig.BlocksAcked, fig.BlocksDiscarded, fig.AckEvents = state.Counts()
	if fig.EngineRecoveries > 0 {
		fig.RecoveryMeanMs = ms(recoverySum) / float64(fig.EngineRecoveries)
		fig.OpenMeanMs = ms(openSum) / float64(fig.EngineRecoveries)
	}
	fig.StoreBytes = dirBytes(dir)
	fig.Seconds = time.Since(begin).Seconds()
	t.Logf("kill loop done: %d cycles (%d kills, %d before the store was open, %d clean exits), io %s direct %v, race %v",
		fig.Cycles, fig.Kills, fig.KillsBeforeReady, fig.CleanExits, fig.IOEngine, fig.DirectIO, fig.RaceDetector)
	t.Logf("  acks: %d events, %d distinct blocks acked, %d started, %d discarded; %d present at the end; %d block loads verified byte for byte (%d cycles checked every block); %d sidecars found beside their blocks and verified",
		fig.AckEvents, fig.BlocksAcked, fig.BlocksStarted, fig.BlocksDiscarded, fig.BlocksPresent, fig.BlocksVerified, fig.FullChecks, fig.SidecarsVerified)
	t.Logf("  recovery (%d engine recoveries, %d by ucm-tool verify): recovery max %.1f ms mean %.1f ms, Open max %.1f ms mean %.1f ms",
		fig.EngineRecoveries, fig.ToolRecoveries, fig.RecoveryMaxMs, fig.RecoveryMeanMs, fig.OpenMaxMs, fig.OpenMeanMs)
	t.Logf("  segments recovered %d, truncated bytes %d, entries dropped %d, orphans removed %d; store %d bytes; %.1f s",
		fig.SegmentsRecovered, fig.TruncatedBytes, fig.EntriesDropped, fig.OrphansRemoved, fig.StoreBytes, fig.Seconds)
	if mode == "tiered" {
		t.Logf("  tiers: up to %d blocks found demoted after a kill; %d interrupted retirements finished by recovery; recycled files found by %d reopens; %d never-written segments deleted",
			fig.DemotedBlocksMax, fig.RetirementsResumed, fig.RecycledFilesSeen, fig.EmptySegmentsDeleted)
		if fig.DemotedBlocksMax == 0 {
			t.Errorf("tiered run demoted nothing: the first tier never filled")
		}
	}
	if fig.BlocksAcked == 0 {
		t.Errorf("no block was ever acknowledged: the kill loop tested nothing")
	}
	t.Logf("  mode %s: %s", mode, killEvidence(&fig))
	switch {
	case mode == "shared" && fig.ManifestsPublished == 0:
		t.Errorf("shared run published no manifest: the shared tier was never exercised")
	case mode == "memory" && fig.MemoryHits == 0:
		t.Errorf("memory run served no load from the memory tier")
	case mode == "psync" && fig.IOEngine != "psync":
		t.Errorf("psync run ran on %q", fig.IOEngine)
	case mode == "compaction" && (fig.SegmentsCompacted == 0 || fig.KillsInCompaction == 0):
		t.Errorf("compaction run: %d segments compacted, %d kills during compaction: want both above 0", fig.SegmentsCompacted, fig.KillsInCompaction)
	case mode == "recycling" && fig.SegmentsRecycled == 0:
		t.Errorf("recycling run created no segment in a recycled file")
	}
	if uringTag && fig.IOEngine != "uring" {
		t.Logf("built with the uring tag but the store ran on %q (io_uring not permitted here?)", fig.IOEngine)
	}
	if p := os.Getenv(envReport); p != "" {
		b, _ := json.Marshal(fig)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err == nil {
			_, err = f.Write(append(b, '\n'))
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Errorf("%s: %v", envReport, err)
		}
	}
}

// raceEnabled reports whether the test binary was built with -race (the child, being the same
// binary, runs under the race detector too).
func raceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// killEvidence says, in one word-joined field, what the run's mode exercised.
func killEvidence(f *killFigures) string {
	switch f.Mode {
	case "tiered":
		return fmt.Sprintf("demoted_max=%d,retirements_resumed=%d", f.DemotedBlocksMax, f.RetirementsResumed)
	case "shared":
		return fmt.Sprintf("manifests_published=%d", f.ManifestsPublished)
	case "memory":
		return fmt.Sprintf("memory_hits=%d", f.MemoryHits)
	case "compaction", "recycling":
		return fmt.Sprintf("segments_compacted=%d,records_moved=%d,kills_in_compaction=%d,segments_recycled=%d,recycled_files_seen=%d",
			f.SegmentsCompacted, f.RecordsMoved, f.KillsInCompaction, f.SegmentsRecycled, f.RecycledFilesSeen)
	case "interval":
		return "sync_interval=20ms"
	}
	return "io=" + f.IOEngine
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cycleOutcome is what one child run did.
type cycleOutcome struct {
	ready    time.Duration // from start to READY; 0: killed before
	killed   bool
	events   int
	ioEngine string
	direct   bool
	// stats is the child's last STATS line; compacted and moved count the segments its
	// compactor compacted and the records they moved; inCompact: its last compaction event
	// was the start of a Compact call (the kill landed during one).
	stats            killChildStats
	compacted, moved int64
	inCompact        bool
}

// killChildStats is what a child reports on its STATS lines, counted since its Open.
type killChildStats struct {
	Loads      int64 `json:"loads"`       // blocks its loads checked byte for byte
	Recycled   int64 `json:"recycled"`    // segments created in a recycled file
	MemoryHits int64 `json:"memory_hits"` // loads served from the memory tier
	Published  int64 `json:"published"`   // manifests published to shared tiers
}

// runKillCycle runs one child on dir, kills it delay after its READY line (or after its start
// when early), and feeds its event log into state. A child failure is reported on t.
func runKillCycle(t *testing.T, dir string, cycle int, seed uint64, early bool, delay time.Duration, state *workload.State) cycleOutcome {
	t.Helper()
	var out cycleOutcome
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillLoop$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(os.Environ(), envChild+"="+dir, envChildCycle+"="+strconv.Itoa(cycle), envChildSeed+"="+strconv.FormatUint(seed, 10))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	cmd.ExtraFiles = []*os.File{pw} // fd 3 in the child: the event log
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()

	ready := make(chan time.Duration, 1)
	var fails []string
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		r := bufio.NewReaderSize(pr, 64<<10)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				// EOF: the child is gone; a line cut short by the kill is dropped.
				return
			}
			out.events++
			verb, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
			switch verb {
			case "READY":
				f := strings.Fields(rest)
				if len(f) == 2 {
					out.ioEngine, out.direct = f[0], f[1] == "true"
				}
				ready <- time.Since(start)
			case "FAIL":
				fails = append(fails, rest)
			case "STATS":
				if err := json.Unmarshal([]byte(rest), &out.stats); err != nil {
					fails = append(fails, fmt.Sprintf("bad stats line %q: %v", line, err))
				}
			case "COMPACT_BEGIN":
				out.inCompact = true
			case "COMPACT_END":
				out.inCompact = false
			case "COMPACTED":
				var segs, recs int64
				if _, err := fmt.Sscan(rest, &segs, &recs); err != nil {
					fails = append(fails, fmt.Sprintf("bad compaction line %q: %v", line, err))
				}
				out.compacted += segs
				out.moved += recs
			default:
				if ok, err := state.Apply(line); err != nil || !ok {
					fails = append(fails, fmt.Sprintf("bad event line %q: %v", line, err))
				}
			}
		}
	}()

	timer := time.NewTimer(delay)
	if !early {
		select {
		case d := <-ready:
			out.ready = d
			timer.Reset(delay)
		case <-readDone:
			// The child died before it opened the store; Wait below says why.
		case <-time.After(2 * time.Minute):
			t.Errorf("cycle %d: child not ready after 2 minutes", cycle)
		}
	}
	exited := make(chan struct{})
	var werr error
	go func() { werr = cmd.Wait(); close(exited) }()
	select {
	case <-timer.C:
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	case <-exited:
	}
	<-readDone
	_ = pr.Close()
	if out.ready == 0 {
		select {
		case d := <-ready:
			out.ready = d
		default:
		}
	}

	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL:
		out.killed = true
	case ws.Exited() && ws.ExitStatus() == 0:
		t.Logf("cycle %d: child ran %v without being killed and closed the store", cycle, childMaxRun)
	default:
		t.Errorf("cycle %d: child ended unexpectedly: %v", cycle, werr)
	}
	for _, f := range fails {
		t.Errorf("cycle %d: child: %s", cycle, f)
	}
	if s := stderr.String(); strings.Contains(s, "DATA RACE") || strings.Contains(s, "panic:") || strings.Contains(s, "fatal error:") || t.Failed() {
		t.Errorf("cycle %d: child output:\n%s", cycle, tail(s, 8000))
	}
	return out
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// buildUCMTool builds ucm-tool once for the test, with the uring tag and its link flag when
// the test binary has it, unless UCM_KILL_TOOL names one.
func buildUCMTool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(envTool); p != "" {
		return p
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		if root := os.Getenv("GOROOT"); root != "" {
			goBin = filepath.Join(root, "bin", "go")
		} else {
			t.Fatalf("ucm-tool: no go command to build it with: %v", err)
		}
	}
	bin := filepath.Join(t.TempDir(), "ucm-tool")
	args := []string{"build", "-o", bin}
	if uringTag {
		args = append(args, "-tags", "uring", "-ldflags=-checklinkname=0")
	}
	args = append(args, "github.com/ucm-go/ucm/tools/ucm-tool")
	cmd := exec.Command(goBin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// runVerify runs `ucm-tool verify dir`, which must exit 0.
func runVerify(t *testing.T, tool, dir string, cycle int) {
	t.Helper()
	out, err := exec.Command(tool, "verify", dir).CombinedOutput()
	if err != nil {
		t.Errorf("cycle %d: ucm-tool verify %s: %v\n%s", cycle, dir, err, tail(string(out), 8000))
	}
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// ---- The child ----

// killChild is the writer process of one cycle.
type killChild struct {
	e     *engine.Engine
	l     engine.Layout
	seed  uint64
	cycle int
	log   *os.File // fd 3, the event log

	logMu   sync.Mutex
	next    [256]atomic.Int64 // per kind: next block number of this cycle
	stop    atomic.Bool
	begin   time.Time
	fresh   atomic.Int64 // new blocks reserved (pace)
	checked atomic.Int64 // blocks loads checked byte for byte

	mu     sync.Mutex
	acked  []format.BlockID // acknowledged in this cycle
	recent []format.BlockID // whole-block and layer-wise dumps started recently (maybe in flight)
}

func runKillChild(dir string) int {
	log := os.NewFile(3, "events")
	cycle, _ := strconv.Atoi(os.Getenv(envChildCycle))
	seed, _ := strconv.ParseUint(os.Getenv(envChildSeed), 10, 64)
	e, err := engine.Open(dir, killOptions(dir))
	if err != nil {
		fmt.Fprintf(os.Stderr, "child: open: %v\n", err)
		fmt.Fprintf(log, "FAIL open: %s\n", strings.ReplaceAll(err.Error(), "\n", " | "))
		return exitChildSetup
	}
	c := &killChild{e: e, l: e.Layout(), seed: seed, cycle: cycle, log: log, begin: time.Now()}
	name, direct := e.IOEngine()
	c.emitLine(fmt.Sprintf("READY %s %v\n", name, direct))

	workers := []func(*rand.Rand) error{c.wholeDumps, c.wholeDumps, c.layerDumps, c.v0Dumps, c.loads, c.report}
	if killCompacts() {
		workers = append(workers, c.compact, c.abandonedDumps)
	}
	errs := make(chan error, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		r := rand.New(rand.NewPCG(seed^uint64(cycle)<<20, uint64(i)))
		wg.Go(func() {
			for !c.stop.Load() {
				if err := w(r); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	code := 0
	select {
	case err := <-errs:
		c.fail(err)
		code = exitChildCheck
	case <-time.After(childMaxRun):
	}
	c.stop.Store(true)
	wg.Wait()
	if err := e.Close(); err != nil {
		c.fail(fmt.Errorf("close: %w", err))
		code = exitChildCheck
	}
	return code
}

func (c *killChild) fail(err error) {
	msg := strings.ReplaceAll(err.Error(), "\n", " | ")
	fmt.Fprintf(os.Stderr, "child cycle %d: %s\n", c.cycle, msg)
	c.emitLine("FAIL " + msg + "\n")
}

// emitLine writes one line to the event log in one write.
func (c *killChild) emitLine(s string) {
	c.logMu.Lock()
	defer c.logMu.Unlock()
	_, _ = c.log.WriteString(s)
}

// emit writes one event line per id, each in its own write, in order.
func (c *killChild) emit(verb string, ids ...format.BlockID) {
	c.logMu.Lock()
	defer c.logMu.Unlock()
	for _, id := range ids {
		_, _ = c.log.WriteString(verb + " " + id.String() + "\n")
	}
}

// pace reserves n new blocks, sleeping to keep to childBlockRate (with a burst of 32).
func (c *killChild) pace(n int) {
	total := c.fresh.Add(int64(n))
	allowed := int64(time.Since(c.begin).Seconds()*childBlockRate) + 32
	if total > allowed {
		time.Sleep(time.Duration(total-allowed) * time.Second / childBlockRate)
	}
}

func (c *killChild) newID(k workload.Kind) format.BlockID {
	return workload.ID(c.seed, c.cycle, k, int(c.next[k].Add(1)-1))
}

// oldID returns an id a previous cycle may have used for kind k (or false in cycle 0).
func (c *killChild) oldID(r *rand.Rand, k workload.Kind) (format.BlockID, bool) {
	if c.cycle == 0 {
		return format.BlockID{}, false
	}
	return workload.ID(c.seed, r.IntN(c.cycle), k, r.IntN(64)), true
}

func (c *killChild) payload(id format.BlockID) []byte {
	return workload.Block(id, c.seed, c.l.BlockBytes())
}

func (c *killChild) ack(ids ...format.BlockID) {
	c.emit("ACK", ids...)
	c.mu.Lock()
	c.acked = append(c.acked, ids...)
	c.mu.Unlock()
}

// pick returns a random element of *list (under c.mu), or false if it is empty.
func (c *killChild) pick(r *rand.Rand, list *[]format.BlockID) (format.BlockID, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(*list) == 0 {
		return format.BlockID{}, false
	}
	return (*list)[r.IntN(len(*list))], true
}

// remember adds ids to the recently started whole-block and layer-wise dumps.
func (c *killChild) remember(ids []format.BlockID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recent = append(c.recent, ids...)
	if len(c.recent) > 64 {
		c.recent = slices.Delete(c.recent, 0, len(c.recent)-64)
	}
}

// wholeDumps dumps a batch of 1-8 new blocks, sometimes with duplicates: of a block
// acknowledged in this cycle, of one maybe stored by an earlier cycle, of one another worker
// may be dumping right now (whole, or layer by layer: then this dump completes the block or
// waits for it), or twice in the same batch.
func (c *killChild) wholeDumps(r *rand.Rand) error {
	n := 1 + r.IntN(8)
	c.pace(n)
	ids := make([]format.BlockID, 0, n+1)
	for range n {
		ids = append(ids, c.newID(workload.Whole))
	}
	c.remember(ids)
	if r.IntN(3) == 0 {
		var dup format.BlockID
		var ok bool
		switch r.IntN(4) {
		case 0:
			dup, ok = c.pick(r, &c.acked)
		case 1:
			dup, ok = c.oldID(r, []workload.Kind{workload.Whole, workload.LayerWise, workload.V0Commit}[r.IntN(3)])
		case 2:
			dup, ok = c.pick(r, &c.recent)
		case 3:
			dup, ok = ids[r.IntN(len(ids))], true
		}
		if ok {
			ids = append(ids, dup)
		}
	}
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = c.payload(id)
	}
	c.emit("START", ids...)
	if err := c.e.Dump(ids, src).Wait(); err != nil {
		return fmt.Errorf("dump of %d whole blocks: %w", len(ids), err)
	}
	c.ack(ids...)
	if r.IntN(2) == 0 {
		return c.sidecars(ids)
	}
	return nil
}

// sidecars dumps the sidecars of blocks just acknowledged. A block evicted meanwhile (tiered
// runs) refuses its sidecar with ErrNotFound: not acknowledged, not a failure.
func (c *killChild) sidecars(ids []format.BlockID) error {
	src := make([][]byte, len(ids))
	for i, id := range ids {
		src[i] = workload.Sidecar(id, c.seed, c.l.Shards)
	}
	c.emit("SIDE_START", ids...)
	t := c.e.DumpSidecars(workload.SidecarKind, c.l.Shards, ids, src)
	_ = t.Wait()
	var acked []format.BlockID
	for i, err := range t.BlockErrors() {
		switch {
		case err == nil:
			acked = append(acked, ids[i])
		case !errors.Is(err, engine.ErrNotFound):
			return fmt.Errorf("dump of %d sidecars: %w", len(ids), err)
		}
	}
	c.emit("SIDE_ACK", acked...)
	return nil
}

// layerDumps dumps 1-4 new blocks layer by layer, shards in a random order, either one shard
// task at a time or all shard tasks at once.
func (c *killChild) layerDumps(r *rand.Rand) error {
	n := 1 + r.IntN(4)
	c.pace(n)
	ids := make([]format.BlockID, n)
	full := make([][]byte, n)
	for i := range ids {
		ids[i] = c.newID(workload.LayerWise)
		full[i] = c.payload(ids[i])
	}
	sb := c.l.ShardBytes
	shard := func(sh int) [][]byte {
		src := make([][]byte, n)
		for i := range src {
			src[i] = full[i][int64(sh)*sb : int64(sh+1)*sb]
		}
		return src
	}
	c.remember(ids)
	c.emit("START", ids...)
	order := r.Perm(c.l.Shards)
	if r.IntN(2) == 0 {
		for _, sh := range order {
			if err := c.e.DumpShard(ids, sh, shard(sh)).Wait(); err != nil {
				return fmt.Errorf("layer-wise dump, shard %d: %w", sh, err)
			}
		}
	} else {
		tasks := make([]*engine.Task, len(order))
		for k, sh := range order {
			tasks[k] = c.e.DumpShard(ids, sh, shard(sh))
		}
		for k, task := range tasks {
			if err := task.Wait(); err != nil {
				return fmt.Errorf("concurrent layer-wise dump, shard %d: %w", order[k], err)
			}
		}
	}
	c.ack(ids...)
	return nil
}

// v0Dumps creates three blocks: one filled and committed (acknowledged), one filled and
// discarded, one with shards missing and committed (which must fail); the last two must never
// be visible.
func (c *killChild) v0Dumps(r *rand.Rand) error {
	c.pace(1)
	d, x, p := c.newID(workload.V0Commit), c.newID(workload.V0Discard), c.newID(workload.V0Partial)
	for i, err := range c.e.Create([]format.BlockID{d, x, p}) {
		if err != nil {
			return fmt.Errorf("create block %d of 3: %w", i, err)
		}
	}
	c.emit("START", d)
	sb := c.l.ShardBytes
	fill := func(id format.BlockID, shards int) error {
		full := c.payload(id)
		if shards == c.l.Shards && r.IntN(2) == 0 {
			return c.e.Dump([]format.BlockID{id}, [][]byte{full}).Wait()
		}
		for _, sh := range r.Perm(c.l.Shards)[:shards] {
			if err := c.e.DumpShard([]format.BlockID{id}, sh, [][]byte{full[int64(sh)*sb : int64(sh+1)*sb]}).Wait(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := fill(d, c.l.Shards); err != nil {
		return fmt.Errorf("v0 fill: %w", err)
	}
	if err := fill(x, c.l.Shards); err != nil {
		return fmt.Errorf("v0 fill of the block to discard: %w", err)
	}
	if err := fill(p, r.IntN(c.l.Shards)); err != nil {
		return fmt.Errorf("v0 partial fill: %w", err)
	}
	discard := func() error {
		if err := c.e.Commit([]format.BlockID{x}, false); err != nil {
			return fmt.Errorf("commit(false): %w", err)
		}
		c.emit("DISCARD", x)
		return nil
	}
	discarded := r.IntN(2) == 0
	if discarded {
		if err := discard(); err != nil {
			return err
		}
	}
	if err := c.e.Commit([]format.BlockID{d}, true); err != nil {
		return fmt.Errorf("commit(true): %w", err)
	}
	c.ack(d)
	if c.e.Lookup([]format.BlockID{x})[0] {
		return fmt.Errorf("block %s created and not committed is visible", x)
	}
	if err := c.e.Commit([]format.BlockID{p}, true); !errors.Is(err, engine.ErrBlockFailed) {
		return fmt.Errorf("commit(true) of a block with shards missing: %v, want ErrBlockFailed", err)
	}
	c.emit("DISCARD", p)
	if !discarded {
		return discard()
	}
	return nil
}

// loads reads blocks back while the writers run: blocks acknowledged in this cycle must load
// byte-identical (whole, or a single shard; into aligned or misaligned buffers); blocks of
// earlier cycles are a miss or byte-identical; discarded blocks of earlier cycles are misses.
func (c *killChild) loads(r *rand.Rand) error {
	n := 1 + r.IntN(8)
	var strict, loose []format.BlockID
	for range n {
		if id, ok := c.pick(r, &c.acked); ok && r.IntN(4) != 0 {
			strict = append(strict, id)
		} else if id, ok := c.oldID(r, []workload.Kind{workload.Whole, workload.LayerWise, workload.V0Commit}[r.IntN(3)]); ok {
			loose = append(loose, id)
		}
	}
	if id, ok := c.oldID(r, []workload.Kind{workload.V0Discard, workload.V0Partial}[r.IntN(2)]); ok {
		if c.e.Lookup([]format.BlockID{id})[0] {
			return fmt.Errorf("discarded block %s of an earlier cycle is visible", id)
		}
	}
	ids := append(strict, loose...)
	if len(ids) == 0 {
		time.Sleep(time.Millisecond)
		return nil
	}
	shard := engine.AllShards
	size := c.l.BlockBytes()
	if r.IntN(3) == 0 {
		shard = r.IntN(c.l.Shards)
		size = c.l.ShardBytes
	}
	dst := make([][]byte, len(ids))
	for i := range dst {
		b := devio.AlignedBuffer(int(size) + 1)
		if r.IntN(2) == 0 {
			dst[i] = b[:size]
		} else {
			dst[i] = b[1:] // misaligned: through a bounce buffer
		}
	}
	var task *engine.Task
	off := int64(0)
	if shard == engine.AllShards {
		task = c.e.Load(ids, dst)
	} else {
		task = c.e.LoadShard(ids, shard, dst)
		off = int64(shard) * c.l.ShardBytes
	}
	_ = task.Wait()
	for i, err := range task.BlockErrors() {
		switch {
		case err != nil && i < len(strict):
			return fmt.Errorf("load of acknowledged block (shard %d): %w", shard, err)
		case err != nil && errors.Is(err, engine.ErrNotFound):
		case err != nil:
			return fmt.Errorf("load of block %s of an earlier cycle (shard %d): %w", ids[i], shard, err)
		default:
			if err := workload.Check(ids[i], c.seed, off, dst[i]); err != nil {
				return fmt.Errorf("load (shard %d): %w", shard, err)
			}
			c.checked.Add(1)
		}
	}
	return nil
}

// abandonedDumps gives the compaction modes dead space to compact, the way a request
// cancelled during prefill does: it starts a layer-wise dump of 1-4 new blocks and never
// finishes it, writing 1 to Shards-1 of their shards (batch records on disk). The blocks are
// started, never acknowledged and never visible; their records are dead from the next Open on
// (recovery drops incomplete batch blocks), so segments of earlier cycles fall below the
// compaction ratio.
func (c *killChild) abandonedDumps(r *rand.Rand) error {
	n := 1 + r.IntN(4)
	c.pace(n)
	ids := make([]format.BlockID, n)
	for i := range ids {
		ids[i] = c.newID(workload.LayerWise)
	}
	sb := c.l.ShardBytes
	c.emit("START", ids...)
	for _, sh := range r.Perm(c.l.Shards)[:1+r.IntN(c.l.Shards-1)] {
		src := make([][]byte, n)
		for i, id := range ids {
			src[i] = c.payload(id)[int64(sh)*sb : int64(sh+1)*sb]
		}
		if err := c.e.DumpShard(ids, sh, src).Wait(); err != nil {
			return fmt.Errorf("layer-wise dump left unfinished, shard %d: %w", sh, err)
		}
	}
	return nil
}

// report writes a STATS line (killChildStats) every 20 ms: what the parent knows of the
// child's counters when it is killed.
func (c *killChild) report(*rand.Rand) error {
	time.Sleep(20 * time.Millisecond)
	st := c.e.Stats()
	b, err := json.Marshal(killChildStats{Loads: c.checked.Load(), Recycled: st.SegmentsRecycled, MemoryHits: st.MemoryHits, Published: st.Sharing.ManifestsPublished})
	if err != nil {
		return err
	}
	c.emitLine("STATS " + string(b) + "\n")
	return nil
}

// killCompactRatio is the live ratio at or below which the compaction modes' child compacts a
// sealed segment.
const killCompactRatio = 0.9

// compact runs Compact over the store every 10 ms (the engine's own periodic pass starts a
// second after Open, later than most kills), reporting each call's start and end and every
// segment it compacts, so that the parent knows whether a kill landed during one.
func (c *killChild) compact(*rand.Rand) error {
	time.Sleep(10 * time.Millisecond)
	c.emitLine("COMPACT_BEGIN\n")
	var last engine.ReclaimReport
	_, err := c.e.Compact(killCompactRatio, func(p engine.ReclaimReport) {
		if p.SegmentsCompacted > last.SegmentsCompacted {
			c.emitLine(fmt.Sprintf("COMPACTED %d %d\n", p.SegmentsCompacted-last.SegmentsCompacted, p.RecordsMoved-last.RecordsMoved))
		}
		last = p
	})
	if err != nil && !errors.Is(err, engine.ErrClosed) {
		return fmt.Errorf("compact: %w", err)
	}
	c.emitLine("COMPACT_END\n")
	return nil
}
