//go:build mooncake && linux

package mooncake

import (
	"bufio"
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
)

// The block layout of every engine here: 8 shards of 128 KiB (K and V), 1 MiB blocks.
var layout = engine.Layout{Shards: 8, TensorsPerShard: 2, ShardBytes: 128 << 10}

var schema = engine.Schema{Model: "mooncake-test", DType: "bfloat16", KVLayout: "mha", TPSize: 1, BlockTokens: 16}

// blockID is block n's id; blockBytes its content, a function of the id alone, so any process
// checks bytes without an oracle.
func blockID(n int) engine.BlockID { return md5.Sum([]byte(fmt.Sprintf("mooncake-block-%d", n))) }

func blockBytes(id engine.BlockID) []byte {
	b := make([]byte, layout.BlockBytes())
	r := rand.NewPCG(binary.LittleEndian.Uint64(id[:8]), binary.LittleEndian.Uint64(id[8:]))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// master is a mooncake_master on loopback, started and killed by the test.
type master struct {
	t                   *testing.T
	bin                 string
	rpc, http, metrics  int
	cmd                 *exec.Cmd
	exited              chan struct{}
	log                 string
	evictHigh, evictPct float64
}

// freePort returns a loopback port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startMaster starts a master on free loopback ports; it is killed when the test ends.
func startMaster(t *testing.T) *master {
	t.Helper()
	bin := os.Getenv("MOONCAKE_MASTER")
	if bin == "" {
		t.Fatal("MOONCAKE_MASTER is not set: run through tools/mooncake/go.sh or make test-mooncake")
	}
	m := &master{t: t, bin: bin, rpc: freePort(t), http: freePort(t), metrics: freePort(t), log: filepath.Join(t.TempDir(), "master.log")}
	m.start()
	t.Cleanup(m.kill)
	return m
}

func (m *master) metadata() string   { return fmt.Sprintf("http://127.0.0.1:%d/metadata", m.http) }
func (m *master) rpcAddress() string { return fmt.Sprintf("127.0.0.1:%d", m.rpc) }

func (m *master) start() {
	m.t.Helper()
	args := []string{
		"--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
		"--http_metadata_server_port=" + strconv.Itoa(m.http),
		"--rpc_address=127.0.0.1", "--rpc_port=" + strconv.Itoa(m.rpc),
		"--metrics_host=127.0.0.1", "--metrics_port=" + strconv.Itoa(m.metrics),
		"--logtostderr=true",
	}
	if m.evictHigh > 0 {
		args = append(args, fmt.Sprintf("--eviction_high_watermark_ratio=%g", m.evictHigh), fmt.Sprintf("--eviction_ratio=%g", m.evictPct))
	}
	f, err := os.OpenFile(m.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		m.t.Fatal(err)
	}
	cmd := exec.Command(m.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// The master dies with the test process, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start %s: %v", m.bin, err)
	}
	f.Close()
	m.cmd, m.exited = cmd, make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(cmd, m.exited)
	// Ready when both its RPC port and its metadata server accept connections.
	deadline := time.Now().Add(60 * time.Second)
	for _, port := range []int{m.rpc, m.http} {
		for {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-m.exited:
				m.t.Fatalf("mooncake_master exited at start:\n%s", m.tail())
			default:
			}
			if time.Now().After(deadline) {
				m.t.Fatalf("mooncake_master does not listen on %d:\n%s", port, m.tail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// kill kills the master (SIGKILL) and waits for it to be gone.
func (m *master) kill() {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.exited
	m.cmd = nil
}

// restart starts a new master on the same ports.
func (m *master) restart() {
	m.kill()
	m.start()
}

func (m *master) tail() string {
	b, _ := os.ReadFile(m.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// tierConfigs is the chain every engine here uses: [memory |] mooncake | disk.
func tierConfigs(m *master, dir string, segment int64, memory int64) []tiers.Config {
	ts := []tiers.Config{
		{Name: "pool", Kind: tiers.KindMooncake, Mooncake: &tiers.MooncakeConfig{
			LocalHostname: "127.0.0.1", MetadataServer: m.metadata(), MasterServerAddress: m.rpcAddress(),
			GlobalSegmentSize: segment, LocalBufferSize: 16 << 20, StagingBytes: 48 << 20, HealthIntervalMs: 200, ResetAfter: 25}},
		{Name: "ssd", Kind: tiers.KindDisk, Paths: []string{dir}},
	}
	if memory > 0 {
		ts = append([]tiers.Config{{Name: "dram", Kind: tiers.KindMemory, Capacity: memory}}, ts...)
	}
	return ts
}

func openEngine(t testing.TB, m *master, dir string, segment, memory int64) *engine.Engine {
	opts := engine.Options{Layout: layout, Schema: schema, SyncPolicy: engine.SyncNone, TaskTimeout: 60 * time.Second,
		Tiers: tierConfigs(m, dir, segment, memory), Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	e, err := engine.Open(dir, opts)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return e
}

func dump(t testing.TB, e *engine.Engine, from, n int) {
	t.Helper()
	for lo := from; lo < from+n; lo += 8 {
		var ids []engine.BlockID
		var src [][]byte
		for i := lo; i < min(lo+8, from+n); i++ {
			ids, src = append(ids, blockID(i)), append(src, blockBytes(blockID(i)))
		}
		if err := e.Dump(ids, src).Wait(); err != nil {
			t.Fatalf("dump: %v", err)
		}
		// Write-throughs never hold a dump back: a burst larger than the tier's put slots
		// drops some (counted). The tests want every block in the pool: one task at a time.
		e.FlushMooncake()
	}
}

// outcome counts what loads of blocks [from, from+n) gave.
type outcome struct{ ok, notFound, wrong, other int }

func (o outcome) String() string {
	return fmt.Sprintf("ok=%d notfound=%d wrong=%d other=%d", o.ok, o.notFound, o.wrong, o.other)
}

func loadRange(e *engine.Engine, from, n int) (outcome, error) {
	var o outcome
	var firstOther error
	dst := make([]byte, layout.BlockBytes())
	for i := from; i < from+n; i++ {
		id := blockID(i)
		err := e.Load([]engine.BlockID{id}, [][]byte{dst}).Wait()
		switch {
		case err == nil && string(dst) == string(blockBytes(id)):
			o.ok++
		case err == nil:
			o.wrong++
		case isNotFound(err):
			o.notFound++
		default:
			o.other++
			if firstOther == nil {
				firstOther = err
			}
		}
	}
	return o, firstOther
}

func isNotFound(err error) bool {
	return err != nil && (strings.Contains(err.Error(), engine.ErrNotFound.Error()))
}

// Child processes: the test binary run again with UCM_MC_ROLE set (TestMain).
//
//	dumper: opens an engine in UCM_MC_DIR, dumps blocks [UCM_MC_FROM, +UCM_MC_N), waits for the
//	        write-through, prints "READY <puts> dropped=<n> errors=<n> lent=<n>", then serves until its
//	        stdin closes.
//	reader: opens an engine in UCM_MC_DIR (empty), loads blocks [UCM_MC_FROM, +UCM_MC_N) and
//	        prints "RESULT <outcome>".
func TestMain(m *testing.M) {
	if role := os.Getenv("UCM_MC_ROLE"); role != "" {
		os.Exit(child(role))
	}
	// Mooncake's TCP transport binds this address, not the machine's first interface.
	os.Setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
	if v, set := os.LookupEnv("MC_TCP_ENABLE_CONNECTION_POOL"); set {
		connectionPoolEnv = &v
	}
	os.Exit(m.Run())
}

// connectionPoolEnv is MC_TCP_ENABLE_CONNECTION_POOL as the environment set it (nil: unset),
// before any client of the tier set it.
var connectionPoolEnv *string

func child(role string) int {
	atoi := func(k string) int { v, _ := strconv.Atoi(os.Getenv(k)); return v }
	mst := &master{rpc: atoi("UCM_MC_RPC"), http: atoi("UCM_MC_HTTP")}
	opts := engine.Options{Layout: layout, Schema: schema, SyncPolicy: engine.SyncNone, TaskTimeout: 60 * time.Second,
		Tiers:  tierConfigs(mst, os.Getenv("UCM_MC_DIR"), int64(atoi("UCM_MC_SEGMENT")), 0),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	e, err := engine.Open(os.Getenv("UCM_MC_DIR"), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		return 2
	}
	defer e.Close()
	from, n := atoi("UCM_MC_FROM"), atoi("UCM_MC_N")
	switch role {
	case "dumper":
		for lo := from; lo < from+n; lo += 8 {
			var ids []engine.BlockID
			var src [][]byte
			for i := lo; i < min(lo+8, from+n); i++ {
				ids, src = append(ids, blockID(i)), append(src, blockBytes(blockID(i)))
			}
			// Every other batch names each block's shards apart, as a connector names its
			// tensors: the dump copies them into payloads the pool tier lends, and the
			// write-through puts them from there.
			var task *engine.Task
			if (lo-from)/8%2 == 1 {
				spans := make([][][]byte, len(src))
				for i, b := range src {
					for sh := int64(0); sh < int64(layout.Shards); sh++ {
						spans[i] = append(spans[i], b[sh*layout.ShardBytes:(sh+1)*layout.ShardBytes])
					}
				}
				task = e.DumpSpans(ids, engine.AllShards, spans)
			} else {
				task = e.Dump(ids, src)
			}
			if err := task.Wait(); err != nil {
				fmt.Fprintln(os.Stderr, "child dump:", err)
				return 2
			}
			e.FlushMooncake()
		}
		s, _ := e.MooncakeStats()
		fmt.Printf("READY %d dropped=%d errors=%d lent=%d\n", s.Puts, s.PutsDropped, s.Errors, s.PutsLent)
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	case "reader":
		o, err := loadRange(e, from, n)
		s, _ := e.MooncakeStats()
		fmt.Printf("RESULT %s hits=%d err=%v\n", o, s.Hits, err)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// proc is a child engine process.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	exited chan struct{}
}

func startChild(t *testing.T, m *master, role string, from, n int, segment int64) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "UCM_MC_ROLE="+role, "UCM_MC_DIR="+t.TempDir(),
		"UCM_MC_RPC="+strconv.Itoa(m.rpc), "UCM_MC_HTTP="+strconv.Itoa(m.http),
		"UCM_MC_FROM="+strconv.Itoa(from), "UCM_MC_N="+strconv.Itoa(n), "UCM_MC_SEGMENT="+strconv.FormatInt(segment, 10))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, stdin: stdin, lines: make(chan string, 16), exited: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() { wg.Wait(); _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.kill() })
	return p
}

// line waits for the child's next line with prefix.
func (p *proc) line(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(5 * time.Minute)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("child exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("child printed no %q", prefix)
		}
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// stop closes the child's stdin (a dumper closes its engine and exits) and waits for it.
func (p *proc) stop() {
	_ = p.stdin.Close()
	<-p.exited
}

func mooncakeStats(t *testing.T, e *engine.Engine) tiers.MooncakeStats {
	s, ok := e.MooncakeStats()
	if !ok {
		t.Fatal("no mooncake tier")
	}
	return s
}
