package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/lab/benchcheck"
)

// benchCheckConfig is the parsed bench-check flags.
type benchCheckConfig struct {
	baseline  string
	update    bool
	dir       string
	rounds    int
	tolerance float64
	kernels   string // the kernels package directory, for its transfer benchmark
	goCmd     string
	args      []string // the command line, recorded in an updated baseline
}

// The fixed set's sizes: short enough for a few minutes on a 2-core VM, long enough that a
// dump is not just its first flush.
const (
	checkTotal   = "1GiB"    // seq and layer-wise 32 × 64 KiB: 512 blocks of 2 MiB
	checkTotal80 = "1280MiB" // layer-wise 80 × 16 KiB: 1,024 blocks of 1,280 KiB
	// checkBufferSpan is the memory the seq runs' buffers span (bench --buffer-span): about what
	// the layer-wise runs' requests touch (8 requests of up to 64 blocks), so that the whole-block
	// path a layer-wise ratio is taken against reads into and writes from as much memory (on a
	// VM's disk a small buffer set runs faster: docs/performance.md, "Method").
	checkBufferSpan    = "512MiB"
	checkLookupBlocks  = 100_000
	checkLookupBatches = 1000
	checkSeed          = 1
	// checkTransfer selects the transfer benchmark's one-thread layer gathers and scatters at 16
	// and 128 tokens (go test -bench matches each level of a sub-benchmark name separately).
	checkTransfer  = `BenchmarkTransfer/^tokens=(16|128)$/^threads=1$/^layer$/`
	checkBenchtime = "20x"
)

func newBenchCheckCmd(stdout, stderr io.Writer) *cobra.Command {
	var cfg benchCheckConfig
	cmd := &cobra.Command{
		Use:   "bench-check",
		Short: "Run a short fixed benchmark set and compare its ratios with a committed baseline",
		Long: `bench-check is the performance regression guard (make bench-check). It runs a short
fixed set, --rounds times interleaved (each round runs every case once, in the same order),
and takes one ratio per case as the median of its rounds' ratios. Ratios, not rates: each
is measured against a denominator taken in the same round on the same machine, so that a
slower or busier machine moves both.

  seq/dump/fio, seq/load/fio          whole-block dump and load of 1 GiB of 2 MiB blocks
                                      (32 shards), the tasks cycling through 512 MiB of
                                      buffers (bench --buffer-span), against fio's
                                      sequential write and read of the same file size
                                      right after (bench --fio; reads: the runs whose
                                      buffers span the most); named seq/*/fio-malloc when
                                      no hugetlb pages are reserved (a slower limit)
  layerwise/32x64KiB/{dump,load}/seq  layer-wise, the connector's order, 2 MiB blocks of
                                      32 × 64 KiB shards, against the seq run of the same
                                      round (the same layout, whole blocks, as much memory)
  layerwise/80x16KiB/{dump,load}/seq  the same with 1,280 KiB blocks of 80 × 16 KiB shards,
                                      against a seq run of that layout in the same round
  lookup/engine/map                   exact lookups per second of 1024-id batches (half
                                      hits) on 100,000 indexed blocks, against a Go map of
                                      the stored ids answering the same batches, batch by
                                      batch interleaved (bench --map-baseline)
  {gather,scatter}/tokens={16,128}/copy
                                      the kernels' one-thread layer gather and scatter
                                      against Go's copy of the same bytes (go test -bench
                                      BenchmarkTransfer, metric ratio-inline)

Each case is compared with --baseline: a median more than --tolerance (10 %) below the
baseline's with every round below the baseline is a DROP, a baseline case not measured is
MISSING; either makes the exit status 1. A median that low with a round at or above the
baseline is "drop?": the run's own noise spans the baseline (reported; rerun on a quiet
machine). --update rewrites the baseline from this run instead (with the command line,
date, machine and load average), after printing the comparison with the old one.

The benches run as subprocesses of this binary (ucm-lab bench --json) on stores under
--dir (default: a new directory under /var/tmp, removed at the end); the transfer
benchmark is built with --go from the --kernels package directory, so run it from the
repository (make bench-check does).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.args = []string{"bench-check"}
			cmd.Flags().Visit(func(f *pflag.Flag) {
				if f.Name != "update" {
					cfg.args = append(cfg.args, "--"+f.Name+"="+f.Value.String())
				}
			})
			return runBenchCheck(cfg, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.baseline, "baseline", "lab/benchcheck/baseline.json", "the baseline file to compare with (and to rewrite with --update)")
	fl.BoolVar(&cfg.update, "update", false, "rewrite the baseline file from this run")
	fl.StringVar(&cfg.dir, "dir", "", "directory for the bench stores and fio files (default: a new directory under /var/tmp, removed at the end)")
	fl.IntVar(&cfg.rounds, "rounds", 7, "rounds of the whole set; each case's ratio is the median of its rounds")
	fl.Float64Var(&cfg.tolerance, "tolerance", benchcheck.DefaultTolerance, "fraction a ratio may fall below its baseline before it is a DROP")
	fl.StringVar(&cfg.kernels, "kernels", "./kernels/", "the kernels package (its transfer benchmark is built from here)")
	fl.StringVar(&cfg.goCmd, "go", "go", "the go command that builds the transfer benchmark")
	return cmd
}

// checkRun is one bench-check run in progress: where it works and what it measured.
type checkRun struct {
	cfg     benchCheckConfig
	self    string // this binary, for the bench subprocesses
	dir     string
	kernels string // the built kernels test binary
	stderr  io.Writer
	ratios  map[string][]float64 // case → one ratio per round
	what    map[string]string
	order   []string

	warnedMalloc bool // said once that fio ran from 4 KiB pages
}

func (c *checkRun) add(name, what string, v float64) {
	if _, ok := c.ratios[name]; !ok {
		c.order = append(c.order, name)
		c.what[name] = what
	}
	c.ratios[name] = append(c.ratios[name], v)
}

func runBenchCheck(cfg benchCheckConfig, stdout, stderr io.Writer) error {
	switch {
	case cfg.rounds < 1:
		return cliutil.UsageErr("--rounds %d: want at least 1", cfg.rounds)
	case cfg.tolerance <= 0 || cfg.tolerance >= 1:
		return cliutil.UsageErr("--tolerance %v: want a fraction between 0 and 1", cfg.tolerance)
	}
	old, err := benchcheck.Load(cfg.baseline)
	if err != nil && !(cfg.update && errors.Is(err, os.ErrNotExist)) {
		// A malformed baseline is an error even with --update: it is not silently replaced.
		return cliutil.UsageErr("%v", err)
	}
	if _, err := exec.LookPath("fio"); err != nil {
		return cliutil.UsageErr("fio not found (apt-get install fio): the seq cases are ratios against it")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench-check: find this binary: %w", err)
	}
	dir := cfg.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("/var/tmp", "ucm-bench-check-"); err != nil {
			return fmt.Errorf("bench-check: %w", err)
		}
		defer func() { _ = os.RemoveAll(dir) }()
	}
	run := &checkRun{cfg: cfg, self: self, dir: dir, stderr: stderr, ratios: map[string][]float64{}, what: map[string]string{}}
	started := time.Now()
	loadBefore := loadAverage()
	fmt.Fprintf(stderr, "bench-check: %d rounds in %s (load average %s)\n", cfg.rounds, dir, loadBefore)
	run.kernels = filepath.Join(dir, "kernels.test")
	build := exec.Command(cfg.goCmd, "test", "-c", "-o", run.kernels, "-tags", "uring", "-ldflags=-checklinkname=0", cfg.kernels)
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("bench-check: build the transfer benchmark (%s): %w\n%s", strings.Join(build.Args, " "), err, out)
	}
	for r := 1; r <= cfg.rounds; r++ {
		fmt.Fprintf(stderr, "bench-check: round %d of %d\n", r, cfg.rounds)
		for _, step := range []func() error{run.seqAndLayerwise32, run.layerwise80, run.lookup, run.transfer} {
			if err := step(); err != nil {
				return &cliutil.ExitError{Code: cliutil.ExitProblems, Err: fmt.Errorf("bench-check: round %d: %w", r, err)}
			}
		}
	}
	cases := make([]benchcheck.Case, 0, len(run.order))
	for _, name := range run.order {
		cases = append(cases, benchcheck.Case{Name: name, Ratio: round3(benchcheck.Median(run.ratios[name])),
			Rounds: roundAll(run.ratios[name]), What: run.what[name]})
	}
	loadAfter := loadAverage()
	fmt.Fprintf(stderr, "bench-check: %d rounds in %v (load average %s before, %s after)\n", cfg.rounds,
		time.Since(started).Round(time.Second), loadBefore, loadAfter)
	var rows []benchcheck.Row
	if old != nil {
		if note := otherCPUNote(old.Machine, cpuModel()); note != "" {
			fmt.Fprintln(stderr, note)
		}
		rows = benchcheck.Compare(old, run.ratios, cfg.tolerance)
	} else {
		rows = benchcheck.Compare(&benchcheck.Baseline{}, run.ratios, cfg.tolerance)
	}
	if err := benchcheck.PrintTable(stdout, rows); err != nil {
		return err
	}
	if cfg.update {
		b := &benchcheck.Baseline{Command: "ucm-lab " + strings.Join(cfg.args, " "), Date: started.UTC().Format(time.RFC3339),
			Machine: machineText(dir, loadBefore, loadAfter), Cases: cases}
		if err := benchcheck.Write(cfg.baseline, b); err != nil {
			return fmt.Errorf("bench-check: --update: %w", err)
		}
		fmt.Fprintf(stderr, "bench-check: wrote %s\n", cfg.baseline)
		return nil
	}
	if benchcheck.AnyFailed(rows) {
		return &cliutil.ExitError{Code: cliutil.ExitProblems, Err: fmt.Errorf("bench-check: a ratio dropped more than %.0f%% below %s, or a case is missing",
			100*cfg.tolerance, cfg.baseline)}
	}
	return nil
}

// bench runs `ucm-lab bench --json` with args on a store under the run's directory and returns
// its result; a failed run (verification, fio) is an error with the end of its stderr.
func (c *checkRun) bench(args ...string) (*benchResult, error) {
	args = append([]string{"bench", "--dir", filepath.Join(c.dir, "stores"), "--json", "--seed", fmt.Sprint(checkSeed)}, args...)
	cmd := exec.Command(c.self, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	if err != nil {
		return nil, fmt.Errorf("ucm-lab %s: %w\n%s", strings.Join(args, " "), err, tail(errOut.String(), 2000))
	}
	var res benchResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("ucm-lab %s: its JSON: %w", strings.Join(args, " "), err)
	}
	if !res.Verified {
		return nil, fmt.Errorf("ucm-lab %s: not verified", strings.Join(args, " "))
	}
	fmt.Fprintf(c.stderr, "bench-check:   %s %s (%v)\n", res.Workload, strings.Join(args[6:], " "), time.Since(start).Round(100*time.Millisecond))
	return &res, nil
}

// layerwiseAgainstSeq runs the layer-wise connector order of one shape and records its dump and
// load rates against the whole-block seq run of the same shape and round.
func (c *checkRun) layerwiseAgainstSeq(shape string, seq *benchResult, shapeArgs ...string) error {
	lw, err := c.bench(append([]string{"--workload", "layerwise", "--order", "connector", "--concurrency", "8"}, shapeArgs...)...)
	if err != nil {
		return err
	}
	if seq.DumpMBps <= 0 || seq.LoadMBps <= 0 || lw.DumpMBps <= 0 || lw.LoadMBps <= 0 {
		return fmt.Errorf("layerwise %s: a rate of 0 (seq %v/%v, layer-wise %v/%v MB/s)", shape, seq.DumpMBps, seq.LoadMBps, lw.DumpMBps, lw.LoadMBps)
	}
	what := fmt.Sprintf("layer-wise (bench --workload layerwise --order connector --concurrency 8 %s) %%s MB/s ÷ whole blocks (bench --workload seq %s --buffer-span %s) in the same round",
		strings.Join(shapeArgs, " "), strings.Join(shapeArgs, " "), checkBufferSpan)
	c.add("layerwise/"+shape+"/dump/seq", fmt.Sprintf(what, "dump"), lw.DumpMBps/seq.DumpMBps)
	c.add("layerwise/"+shape+"/load/seq", fmt.Sprintf(what, "load"), lw.LoadMBps/seq.LoadMBps)
	return nil
}

// seqAndLayerwise32 runs seq with fio (2 MiB blocks of 32 shards) and the layer-wise 32 × 64 KiB
// shape against it.
func (c *checkRun) seqAndLayerwise32() error {
	shape := []string{"--block-size", "2MiB", "--shards", "32", "--total", checkTotal}
	seq, err := c.bench(append([]string{"--workload", "seq", "--fio", "--fio-bracket=false", "--buffer-span", checkBufferSpan}, shape...)...)
	if err != nil {
		return err
	}
	if seq.DumpRatio <= 0 || seq.LoadRatio <= 0 {
		return fmt.Errorf("seq: no fio ratios (%s)", seq.FioNote)
	}
	// fio from 4 KiB pages is not the disk's limit (the kernel splits its I/Os), so a ratio
	// against it is another case, named so, than one against fio from hugetlb pages.
	fio, mem := "fio-malloc", "from 4 KiB pages (no hugetlb pages reserved)"
	for _, f := range seq.Fio {
		if f.Mem == "mmaphuge" {
			fio, mem = "fio", "the best of its malloc and hugetlb runs (reads: of those whose buffers span the tasks', bench host_buffer_bytes)"
		}
	}
	if fio != "fio" && !c.warnedMalloc {
		c.warnedMalloc = true
		fmt.Fprintf(c.stderr, "bench-check: fio ran without hugetlb pages (sysctl -w vm.nr_hugepages=160 reserves them): the seq cases are %s/..., comparable only with a baseline made the same way\n", "seq/*/"+fio)
	}
	what := "whole-block %s (bench --workload seq " + strings.Join(shape, " ") + " --buffer-span " + checkBufferSpan + ") ÷ fio sequential %s of the same size right after (--fio --fio-bracket=false), fio " + mem
	c.add("seq/dump/"+fio, fmt.Sprintf(what, "dump", "write"), seq.DumpRatio)
	c.add("seq/load/"+fio, fmt.Sprintf(what, "load", "read"), seq.LoadRatio)
	return c.layerwiseAgainstSeq("32x64KiB", seq, shape...)
}

// layerwise80 runs seq and the layer-wise connector order with 1,280 KiB blocks of 80 × 16 KiB.
func (c *checkRun) layerwise80() error {
	shape := []string{"--block-size", "1280KiB", "--shards", "80", "--total", checkTotal80}
	seq, err := c.bench(append([]string{"--workload", "seq", "--buffer-span", checkBufferSpan}, shape...)...)
	if err != nil {
		return err
	}
	return c.layerwiseAgainstSeq("80x16KiB", seq, shape...)
}

// lookup runs the lookup workload with its Go map baseline (--map-baseline: the same batches
// answered by a map of the stored ids, interleaved batch by batch with the engine's).
func (c *checkRun) lookup() error {
	args := []string{"--workload", "lookup", "--blocks", fmt.Sprint(checkLookupBlocks), "--batches", fmt.Sprint(checkLookupBatches), "--map-baseline"}
	res, err := c.bench(args...)
	if err != nil {
		return err
	}
	if res.LookupMapRatio <= 0 {
		return fmt.Errorf("lookup: no engine/map ratio (engine %v, map %v ids/s)", res.LookupsPerSec, res.MapLookupsPerSec)
	}
	c.add("lookup/engine/map", fmt.Sprintf("exact lookups/s of 1024-id batches, half hits (bench %s) ÷ a Go map of the stored ids answering the same batches, interleaved batch by batch (lookup_map_ratio)",
		strings.Join(args, " ")), res.LookupMapRatio)
	return nil
}

// transfer runs the kernels' transfer benchmark for the fixed gathers and scatters.
func (c *checkRun) transfer() error {
	args := []string{"-test.run", "^$", "-test.bench", checkTransfer, "-test.benchtime", checkBenchtime}
	cmd := exec.Command(c.kernels, args...)
	cmd.Dir = c.cfg.kernels
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("transfer benchmark %s: %w\n%s%s", strings.Join(args, " "), err, tail(out.String(), 2000), tail(errOut.String(), 2000))
	}
	got, err := benchcheck.ParseGoBench(&out, "ratio-inline")
	if err != nil {
		return err
	}
	for _, tokens := range []int{16, 128} {
		for _, op := range []string{"gather", "scatter"} {
			name := fmt.Sprintf("BenchmarkTransfer/tokens=%d/threads=1/layer/%s", tokens, op)
			vs := got[name]
			if len(vs) == 0 {
				return fmt.Errorf("transfer benchmark: no ratio-inline for %s in its output:\n%s", name, tail(out.String(), 2000))
			}
			c.add(fmt.Sprintf("%s/tokens=%d/copy", op, tokens), fmt.Sprintf("kernels one-thread layer %s at %d tokens ÷ Go's copy of the same bytes (go test -bench '%s' -benchtime %s ./kernels/, metric ratio-inline)",
				op, tokens, checkTransfer, checkBenchtime), benchcheck.Median(vs))
		}
	}
	fmt.Fprintf(c.stderr, "bench-check:   transfer gathers and scatters (%v)\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// loadAverage is /proc/loadavg's three load averages ("?" where unavailable).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// machineText describes the machine for the baseline: CPUs and model, kernel, the file system
// the stores were on, hugetlb pages, the load averages.
func machineText(dir, loadBefore, loadAfter string) string {
	model := cpuModel()
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	huge, _ := os.ReadFile("/proc/sys/vm/nr_hugepages")
	host, _ := os.Hostname()
	return fmt.Sprintf("%s: %d CPUs (%s), Linux %s, stores on %s, vm.nr_hugepages %s; load average %s before, %s after",
		host, runtime.NumCPU(), model, strings.TrimSpace(string(kernel)), fsOf(dir), strings.TrimSpace(string(huge)), loadBefore, loadAfter)
}

// cpuModel is the first CPU's model name from /proc/cpuinfo, or "?".
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// otherCPUNote returns a warning when the baseline's machine description (machineText) names
// another CPU model than model, and "" when it names this one or either is unknown. The
// CPU-bound cases (lookups, gathers, scatters) are ratios between two pieces of code on one
// CPU, and how they relate depends on the microarchitecture (a prefetch hint, a copy routine):
// against another CPU's baseline their change measures the hardware as well as the code.
func otherCPUNote(baselineMachine, model string) string {
	if model == "?" || baselineMachine == "" || strings.Contains(baselineMachine, "("+model+")") {
		return ""
	}
	return fmt.Sprintf("bench-check: note: the baseline was made on another CPU (%s) than this one (%s); "+
		"the lookup, gather and scatter cases compare the hardware as well as the code "+
		"(make a baseline on this CPU with --update to compare code alone)", baselineMachine, model)
}

// fsOf names the file system type and device of the mount holding dir, from /proc/mounts.
func fsOf(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "?"
	}
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "?"
	}
	best, what := "", "?"
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		mp := f[1]
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best, what = mp, fmt.Sprintf("%s (%s at %s)", f[2], f[0], mp)
		}
	}
	return what
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// round3 rounds v to 3 decimals (the baseline file's precision).
func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

func roundAll(vs []float64) []float64 {
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = round3(v)
	}
	return out
}
