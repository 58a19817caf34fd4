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
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/internal/cliutil"
)

// fioRun is one fio job of a --fio comparison.
type fioRun struct {
	RW        string `json:"rw"` // write, read, randread
	BlockSize int64  `json:"bs"`
	IODepth   int    `json:"iodepth"`
	Mem       string `json:"mem"` // fio's buffers: malloc (4 KiB pages) or mmaphuge (hugetlb pages)
	// FdatasyncEvery: the job fdatasyncs after this many writes (the durable limit); 0: once,
	// at its end.
	FdatasyncEvery int      `json:"fdatasync_every,omitempty"`
	MBps           float64  `json:"MBps"`
	IO             *ioShape `json:"io,omitempty"` // what the job issued to the device
}

// fioMems are fio's buffer kinds: malloc always, and mmaphuge (hugetlb pages) when the machine
// has enough of them free for every buffer of a job at depth 64. Buffers in 4 KiB pages are
// scattered in physical memory, so the kernel splits a large O_DIRECT request into several
// device requests (on the development VM fio's 2 MiB writes ran at 1.2–1.4 GB/s from malloc
// buffers and 1.9–2.2 GB/s from huge pages, reads 3.0–3.2 against 7.7–8.3 GB/s); the engine's
// own buffers come from huge pages where the kernel allows, so the physical limit is fio's
// better figure. hugetlbFree is a variable so tests can pretend either way.
func fioMems(maxBS int64) []string {
	if hugetlbFree() >= 64*maxBS+hugetlbSlack {
		return []string{"malloc", "mmaphuge"}
	}
	return []string{"malloc"}
}

// hugetlbSlack is what fio needs beyond depth × block size (alignment, rounding to a page).
const hugetlbSlack = 8 << 20

var hugetlbFree = readHugetlbFree

// readHugetlbFree returns the bytes of free hugetlb pages (HugePages_Free × Hugepagesize in
// /proc/meminfo), 0 where there are none or no /proc.
func readHugetlbFree() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return parseHugetlbFree(b)
}

// parseHugetlbFree returns HugePages_Free × Hugepagesize from the text of /proc/meminfo, 0 when
// either is missing or unreadable.
func parseHugetlbFree(b []byte) int64 {
	var free, size int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "HugePages_Free:":
			free = n
		case "Hugepagesize:":
			size = n << 10 // kB
		}
	}
	return free * size
}

// fioHugeNote says how to give fio huge-page buffers when it has none.
const fioHugeNote = "fio ran with malloc buffers only (4 KiB pages, which split large O_DIRECT requests); " +
	"reserve hugetlb pages (sysctl -w vm.nr_hugepages=160) and fio also runs from huge pages, as the engine's buffers are"

// fioDepths are the queue depths fio runs at: --fio-iodepth and 64, the better of the two
// being the denominator of a ratio.
func fioDepths(cfg benchConfig) []int {
	if cfg.fioIODepth == 64 {
		return []int{64}
	}
	return []int{cfg.fioIODepth, 64}
}

// fioFigures is one fio measurement of a --fio comparison: the best rate of each kind of job
// over the depths and buffer kinds run, and the runs themselves. applyFio narrows the best
// read rates to the runs whose buffers are as large as the engine's (atFootprint).
type fioFigures struct {
	WriteMBps float64 `json:"write_MBps"`
	// DurableWriteMBps: the write with an fdatasync every time the engine's dump synced
	// (benchResult.SyncBytes); 0 when the round's dump did not sync.
	DurableWriteMBps float64 `json:"durable_write_MBps,omitempty"`
	ReadMBps         float64 `json:"read_MBps"`
	RandReadMBps     float64 `json:"randread_MBps,omitempty"`
	runs             []fioRun
	note             string // why fio ran from malloc buffers only, when it did
}

// fioShapes returns the request sizes of fio's write, read and random-read jobs for a workload
// of res's shape (randBS 0: no random reads), or a note saying why fio does not apply.
func fioShapes(workload string, res *benchResult) (writeBS, readBS, randBS int64, note string) {
	switch workload {
	case "seq":
		return res.BlockBytes, res.BlockBytes, 0, ""
	case "layerwise":
		// The disk's sequential speed (the layer-wise targets' denominator) and random reads of one shard
		// (what a load of shards scattered over whole-block records does).
		return fioSeqBS, fioSeqBS, res.ShardBytes, ""
	default:
		return 0, 0, 0, fmt.Sprintf("--fio applies to the seq and layerwise workloads, not %s", workload)
	}
}

// measureFio runs fio's jobs for a workload of res's shape (block and shard sizes, total bytes,
// I/O engine and direct flag) on a scratch file in --dir, removed afterwards. It returns nil
// figures with a note when fio does not apply or is not installed.
func measureFio(cfg benchConfig, res *benchResult, stderr io.Writer) (*fioFigures, string, error) {
	writeBS, readBS, randBS, note := fioShapes(cfg.workload, res)
	if note != "" {
		return nil, note, nil
	}
	bin, err := exec.LookPath("fio")
	if err != nil {
		note = "fio not found on PATH: install it (apt-get install fio) for engine/fio ratios"
		fmt.Fprintf(stderr, "bench: %s\n", note)
		return nil, note, nil
	}
	ioengine := "io_uring"
	if res.IOEngine == "psync" {
		ioengine = "psync"
	}
	file := filepath.Join(cfg.dir, "bench-fio.dat")
	defer func() { _ = os.Remove(file) }()
	size := res.TotalBytes
	fig := &fioFigures{}
	mems := fioMems(max(writeBS, readBS, randBS))
	if len(mems) == 1 {
		fig.note = fioHugeNote
	}
	// The durable job fdatasyncs as often as the engine's dump did: every SyncBytes, in writes
	// of writeBS (at least every write).
	syncEvery := 0
	if res.SyncBytes > 0 {
		syncEvery = int(max(1, (res.SyncBytes+writeBS/2)/writeBS))
	}
	runSynced := func(rw string, bs int64, depth int, mem string, every int) (float64, error) {
		if !cfg.json {
			synced := ""
			if every > 0 {
				synced = fmt.Sprintf(" fdatasync=%d", every)
			}
			fmt.Fprintf(stderr, "bench: fio %s bs=%s iodepth=%d mem=%s size=%s%s ...\n", rw, cliutil.FormatSize(bs), depth, mem, cliutil.FormatSize(size), synced)
		}
		meter := startIOMeter(cfg.dir)
		mb, err := runFio(bin, cfg.dir, fioJob{file: file, rw: rw, bs: bs, size: size, depth: depth,
			direct: res.Direct, ioengine: ioengine, mem: mem, fdatasync: every})
		if err != nil {
			return 0, err
		}
		fig.runs = append(fig.runs, fioRun{RW: rw, BlockSize: bs, IODepth: depth, Mem: mem, FdatasyncEvery: every, MBps: mb, IO: meter.end()})
		return mb, nil
	}
	run := func(rw string, bs int64, depth int, mem string) (float64, error) {
		return runSynced(rw, bs, depth, mem, 0)
	}
	// A job from huge pages that fails (the reserved pages taken by someone else meanwhile) is
	// dropped with a note: the malloc runs still give a denominator.
	hugeFailed := func(mem string, err error) bool {
		if mem != "mmaphuge" {
			return false
		}
		fig.note = fmt.Sprintf("fio could not run from huge pages (%v): the ratios use its malloc runs only", err)
		if !cfg.json {
			fmt.Fprintf(stderr, "bench: %s\n", fig.note)
		}
		return true
	}
	if cfg.recycled {
		// The engine's dump writes into recycled segment files: fio overwrites a file it wrote
		// first, untimed.
		if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
			return nil, "", err
		}
		if _, err := runFio(bin, cfg.dir, fioJob{file: file, rw: "write", bs: writeBS, size: size, depth: fioDepths(cfg)[0],
			direct: res.Direct, ioengine: ioengine, mem: "malloc"}); err != nil {
			return nil, "", err
		}
	}
	writeKinds := []int{0}
	if syncEvery > 0 {
		writeKinds = append(writeKinds, syncEvery) // the durable limit
	}
	for _, mem := range mems {
	writes:
		for _, d := range fioDepths(cfg) { // writes first: they lay out the file the reads read
			for _, every := range writeKinds {
				// Each write run starts from no file, as the engine's dumps fill new segment
				// files: a second run over the first one's file would measure overwrites of
				// allocated blocks, which skip the block allocation and extent conversion every
				// new write pays (on ext4 here 2.8–3.2 GB/s against 1.6–1.9 for the same job on
				// a fresh file). With --recycled the engine's dumps are such overwrites, and so
				// are fio's.
				if !cfg.recycled {
					if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
						return nil, "", err
					}
				}
				settleFS(cfg.dir)
				mb, err := runSynced("write", writeBS, d, mem, every)
				if err == nil {
					if every == 0 {
						fig.WriteMBps = max(fig.WriteMBps, mb)
					} else {
						fig.DurableWriteMBps = max(fig.DurableWriteMBps, mb)
					}
					continue
				}
				if !hugeFailed(mem, err) {
					return nil, "", err
				}
				// The reads need a whole file: lay it out again from malloc buffers.
				mems = mems[:1]
				if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
					return nil, "", err
				}
				if _, err := run("write", writeBS, fioDepths(cfg)[0], "malloc"); err != nil {
					return nil, "", err
				}
				break writes
			}
		}
	}
	reads := []struct {
		rw   string
		bs   int64
		best *float64
	}{{"read", readBS, &fig.ReadMBps}}
	if randBS > 0 {
		reads = append(reads, struct {
			rw   string
			bs   int64
			best *float64
		}{"randread", randBS, &fig.RandReadMBps})
	}
	for _, rd := range reads {
	mem:
		for _, mem := range mems {
			for _, d := range fioDepths(cfg) {
				mb, err := run(rd.rw, rd.bs, d, mem)
				if err != nil {
					if hugeFailed(mem, err) {
						break mem
					}
					return nil, "", err
				}
				*rd.best = max(*rd.best, mb)
			}
		}
	}
	return fig, "", nil
}

// applyFio fills in res's fio fields and ratios from fio measured just before its round
// (before; nil: not measured) and just after it. With both, each denominator is the mean of
// the two, so that a disk whose speed drifts during the minutes of a round (as the shared
// development VMs' do, by a third between rounds) is compared with what it did around the
// engine's run rather than after it.
func applyFio(res *benchResult, before, after *fioFigures) {
	if after == nil {
		return
	}
	after = after.atFootprint(res.HostBufferBytes)
	if before != nil {
		before = before.atFootprint(res.HostBufferBytes)
	}
	res.FioWriteMBps, res.FioReadMBps, res.FioRandReadMBps = after.WriteMBps, after.ReadMBps, after.RandReadMBps
	// The fio before the first round of a bracketed run knows no flush interval yet: then the
	// durable limit is the one after.
	res.FioDurableWriteMBps = after.DurableWriteMBps
	res.FioNote = after.note
	if before != nil {
		res.FioBefore, res.FioAfter = before, after
		res.FioWriteMBps = (before.WriteMBps + after.WriteMBps) / 2
		res.FioReadMBps = (before.ReadMBps + after.ReadMBps) / 2
		if before.DurableWriteMBps > 0 && after.DurableWriteMBps > 0 {
			res.FioDurableWriteMBps = (before.DurableWriteMBps + after.DurableWriteMBps) / 2
		}
		res.FioRandReadMBps = (before.RandReadMBps + after.RandReadMBps) / 2
		res.Fio = append(res.Fio, before.runs...)
		if res.FioNote == "" {
			res.FioNote = before.note
		}
	}
	res.Fio = append(res.Fio, after.runs...)
	ratio := func(engine, fio float64) float64 {
		if fio <= 0 {
			return 0
		}
		return engine / fio
	}
	res.DumpRatio, res.LoadRatio = ratio(res.DumpMBps, res.FioWriteMBps), ratio(res.LoadMBps, res.FioReadMBps)
	res.LoadRandRatio = ratio(res.LoadMBps, res.FioRandReadMBps)
	res.DumpDurableRatio = ratio(res.DumpMBps, res.FioDurableWriteMBps)
	for k := range res.Layerwise {
		o := &res.Layerwise[k]
		o.DumpDurableRatio = ratio(o.DumpMBps, res.FioDurableWriteMBps)
		o.DumpRatio, o.LoadRatio = ratio(o.DumpMBps, res.FioWriteMBps), ratio(o.LoadMBps, res.FioReadMBps)
		o.LoadRandRatio = ratio(o.LoadMBps, res.FioRandReadMBps)
	}
}

// atFootprint returns f's figures with the read rates taken over the runs whose buffers
// (iodepth × request size) are at least footprint bytes, the memory the engine's loads read
// into, or, where no run has that much, over the runs with the most. The write rates stay the
// best of every run. footprint 0 (not known) keeps every run.
//
// On the development VMs the device's rate depends on how much memory its transfers touch,
// not only on how many are in flight: 2 MiB reads, 8 in flight, cycling through 16 MiB of
// buffers ran at 3.2 GB/s and through 128 MiB at 2.3 (devio's BenchmarkFootprint). A fio job
// at depth 8 reads into 16 MiB, which a connector's KV buffers (gigabytes) never are: that
// job is not the limit an engine reading into the caller's buffers is held to. Writes moved
// by about a tenth there (3.7 against 3.3–3.5 GB/s) and not at all on a GlusterFS mount,
// where fio's deeper durable job is slower for another reason (it drains its queue before
// each fdatasync): so a dump is held to fio's best write, the stricter limit.
func (f *fioFigures) atFootprint(footprint int64) *fioFigures {
	if footprint <= 0 || len(f.runs) == 0 {
		return f
	}
	g := *f
	for _, kind := range []struct {
		rw   string
		best *float64
	}{{"read", &g.ReadMBps}, {"randread", &g.RandReadMBps}} {
		var most int64 // the largest buffers of this kind's runs
		for _, r := range f.runs {
			if r.RW == kind.rw {
				most = max(most, r.bufferBytes())
			}
		}
		need := min(footprint, most)
		*kind.best = 0
		for _, r := range f.runs {
			if r.RW == kind.rw && r.bufferBytes() >= need {
				*kind.best = max(*kind.best, r.MBps)
			}
		}
	}
	return &g
}

// bufferBytes is the memory a fio run's transfers go through: one buffer per request in flight.
func (r fioRun) bufferBytes() int64 { return int64(r.IODepth) * r.BlockSize }

// fioSeqBS is the request size of fio's sequential jobs in layerwise comparisons: the disk's
// sequential speed, whatever the bench's block size.
const fioSeqBS = 2 << 20

// fioJob is one fio job.
type fioJob struct {
	file     string
	rw       string
	bs, size int64
	depth    int
	direct   bool
	ioengine string
	mem      string // fio's iomem: malloc or mmaphuge
	// fdatasync > 0: an fdatasync after every fdatasync writes (a write job), as the engine's
	// group commit makes each group durable before acknowledging it.
	fdatasync int
}

func (j fioJob) text() string {
	var b strings.Builder
	direct := 0
	if j.direct {
		direct = 1
	}
	fmt.Fprintf(&b, "[ucm-bench]\nfilename=%s\nrw=%s\nbs=%d\nsize=%d\niodepth=%d\ndirect=%d\nioengine=%s\n",
		j.file, j.rw, j.bs, j.size, j.depth, direct, j.ioengine)
	b.WriteString("numjobs=1\nthread=1\n")
	if j.mem != "" {
		fmt.Fprintf(&b, "iomem=%s\n", j.mem)
	}
	if j.rw == "write" {
		b.WriteString("end_fsync=1\n") // dumps are durable too (--sync always)
		if j.fdatasync > 0 {
			fmt.Fprintf(&b, "fdatasync=%d\n", j.fdatasync)
		}
	}
	return b.String()
}

// runFio writes the job to a temporary file in dir, runs fio with JSON output and returns the
// job's bandwidth in MB/s (10^6 bytes per second).
func runFio(bin, dir string, j fioJob) (float64, error) {
	jf, err := os.CreateTemp(dir, "bench-fio-*.job")
	if err != nil {
		return 0, err
	}
	defer func() { _ = os.Remove(jf.Name()) }()
	if _, err := jf.WriteString(j.text()); err != nil {
		_ = jf.Close()
		return 0, err
	}
	if err := jf.Close(); err != nil {
		return 0, err
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, "--output-format=json", jf.Name())
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s %s: %v: %s", bin, j.rw, err, strings.TrimSpace(errOut.String()))
	}
	return parseFioBandwidth(out.Bytes(), j.rw)
}

// parseFioBandwidth reads bw_bytes of the read or write side of the first job of fio's JSON
// output (anything fio printed before the JSON object is skipped).
func parseFioBandwidth(out []byte, rw string) (float64, error) {
	i := bytes.IndexByte(out, '{')
	if i < 0 {
		return 0, errors.New("no JSON in fio's output")
	}
	var doc struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				BWBytes float64 `json:"bw_bytes"`
			} `json:"read"`
			Write struct {
				BWBytes float64 `json:"bw_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.NewDecoder(bytes.NewReader(out[i:])).Decode(&doc); err != nil {
		return 0, fmt.Errorf("fio's JSON output: %v", err)
	}
	if len(doc.Jobs) == 0 {
		return 0, errors.New("fio's JSON output has no jobs")
	}
	job := doc.Jobs[0]
	if job.Error != 0 {
		return 0, fmt.Errorf("fio job failed with error %d", job.Error)
	}
	bw := job.Write.BWBytes
	if strings.Contains(rw, "read") {
		bw = job.Read.BWBytes
	}
	if bw <= 0 {
		return 0, fmt.Errorf("fio %s reported no bandwidth", rw)
	}
	return bw / 1e6, nil
}
