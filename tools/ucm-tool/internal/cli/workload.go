package cli

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
)

// workload is one bench workload. run drives the engine through env and fills in the
// measured fields of the result (throughputs, open time, verification); bench prints it.
type workload interface {
	// name is the --workload value that selects it.
	name() string
	// defaults are flag values (by flag name) used when the user did not set the flag.
	defaults() map[string]string
	// blocks checks the configuration and says how many blocks the workload stores.
	blocks(cfg benchConfig, l format.Layout) (int, error)
	run(env *benchEnv, res *benchResult) error
}

// workloads lists the available workloads by name. Add new ones here.
var workloads = map[string]func() workload{
	"seq":       func() workload { return seqWorkload{} },
	"layerwise": func() workload { return layerwiseWorkload{} },
	"lookup":    func() workload { return lookupWorkload{} },
	"open":      func() workload { return openWorkload{} },
	"trace":     func() workload { return &traceWorkload{} },
}

// totalBlocks is --total / --block-size, for the workloads that dump --total bytes.
func totalBlocks(cfg benchConfig, l format.Layout) (int, error) {
	if cfg.total < l.BlockBytes() {
		return 0, fmt.Errorf("--total %d is less than one block (%d bytes)", cfg.total, l.BlockBytes())
	}
	blocks := cfg.total / l.BlockBytes()
	if blocks > 1<<31 {
		return 0, fmt.Errorf("--total %d: too many blocks (%d)", cfg.total, blocks)
	}
	return int(blocks), nil
}

// metadataDefaults are the defaults of the workloads that only need many indexed blocks:
// a tiny layout, no syncs and big dump tasks.
var metadataDefaults = map[string]string{"block-size": "4KiB", "shards": "1", "sync": "none", "batch": "1024"}

func workloadNames() string {
	var names []string
	for n := range workloads {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// benchEnv is what a workload gets: the configuration, a way to (re)open the bench store,
// and the deterministic payloads.
type benchEnv struct {
	cfg     benchConfig
	blocks  int
	payload *payloadPool
	// storeDir is the bench store; opts open it.
	storeDir string
	opts     engine.Options
	stderr   io.Writer
}

// open opens the bench store (creating it the first time) and says how long it took.
func (env *benchEnv) open() (*engine.Engine, time.Duration, error) { return env.openDir(env.storeDir) }

// openDir opens the store in dir with the bench options.
func (env *benchEnv) openDir(dir string) (*engine.Engine, time.Duration, error) {
	start := time.Now()
	e, err := engine.Open(dir, env.opts)
	if err != nil {
		return nil, 0, &exitError{code: ExitUsage, err: err}
	}
	return e, time.Since(start), nil
}

// progressf prints a progress line on stderr unless the output is JSON.
func (env *benchEnv) progressf(format string, args ...any) {
	if !env.cfg.json {
		fmt.Fprintf(env.stderr, "bench: "+format+"\n", args...)
	}
}

// blockID is the id of the bench's i-th block: MD5 of the counter.
func blockID(i int) format.BlockID {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	return md5.Sum(b[:])
}

// payloadPoolSize is how many distinct payload buffers the pool holds.
const payloadPoolSize = 8

// payloadSeed seeds the pool: any reader that knows it regenerates the pool and checks every
// block's bytes without an oracle.
const payloadSeed = 0x75636d2d62656e63 // "ucm-benc"

// payloadPool holds the deterministic payloads: block id's bytes are pool[id mod n] with the
// id stamped into the first 16 bytes, a pure function of the id.
type payloadPool struct {
	bufs [][]byte
}

func newPayloadPool(blockBytes int64) *payloadPool {
	p := &payloadPool{bufs: make([][]byte, payloadPoolSize)}
	for k := range p.bufs {
		b := make([]byte, blockBytes)
		r := rand.New(rand.NewPCG(payloadSeed, uint64(k)))
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], r.Uint64())
		}
		for i := len(b) &^ 7; i < len(b); i++ {
			b[i] = byte(r.Uint64())
		}
		p.bufs[k] = b
	}
	return p
}

func (p *payloadPool) index(id format.BlockID) int {
	return int(binary.LittleEndian.Uint64(id[8:]) % uint64(len(p.bufs)))
}

// fill writes block id's bytes into dst (len = block bytes).
func (p *payloadPool) fill(dst []byte, id format.BlockID) {
	copy(dst, p.bufs[p.index(id)])
	copy(dst, id[:])
}

// checkRange reports where dst differs from bytes [off, off+len(dst)) of block id.
func (p *payloadPool) checkRange(dst []byte, id format.BlockID, off int64) error {
	full := p.bufs[p.index(id)]
	if off < 0 || off+int64(len(dst)) > int64(len(full)) {
		return fmt.Errorf("block %s: %d bytes at %d, block is %d", id, len(dst), off, len(full))
	}
	want := full[off : off+int64(len(dst))]
	for i := range dst {
		j := off + int64(i)
		if j >= int64(len(id)) {
			if bytes.Equal(dst[i:], want[i:]) {
				return nil
			}
			for k := i; k < len(dst); k++ {
				if dst[k] != want[k] {
					return fmt.Errorf("block %s: byte %d is %#02x, want %#02x", id, off+int64(k), dst[k], want[k])
				}
			}
		}
		if dst[i] != id[j] {
			return fmt.Errorf("block %s: byte %d is %#02x, want %#02x (id stamp)", id, j, dst[i], id[j])
		}
	}
	return nil
}

// check reports where dst differs from block id's bytes, nil when it matches.
func (p *payloadPool) check(dst []byte, id format.BlockID) error {
	want := p.bufs[p.index(id)]
	n := min(len(id), len(dst))
	if len(dst) != len(want) {
		return fmt.Errorf("block %s: %d bytes, want %d", id, len(dst), len(want))
	}
	if !bytes.Equal(dst[:n], id[:n]) {
		return fmt.Errorf("block %s: id stamp in the first %d bytes is %x", id, n, dst[:n])
	}
	if !bytes.Equal(dst[n:], want[n:]) {
		for i := n; i < len(dst); i++ {
			if dst[i] != want[i] {
				return fmt.Errorf("block %s: byte %d is %#02x, want %#02x", id, i, dst[i], want[i])
			}
		}
	}
	return nil
}

// parallel calls fn(worker, i) for every i in [0, n), with `workers` goroutines taking the
// next i in order, and returns the wall time. The first error stops new calls.
func parallel(n, workers int, fn func(worker, i int) error) (time.Duration, error) {
	var (
		next     atomic.Int64
		firstErr error
		errOnce  sync.Once
		failed   atomic.Bool
		wg       sync.WaitGroup
	)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(w, i); err != nil {
					errOnce.Do(func() { firstErr = err })
					failed.Store(true)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	return time.Since(start), firstErr
}
