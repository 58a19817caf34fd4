package cli

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
)

// workload is one bench workload. run drives the engine through env and fills in the
// measured fields of the result (throughputs, open time, verification); bench prints it.
type workload interface {
	// name is the --workload value that selects it.
	name() string
	run(env *benchEnv, res *benchResult) error
}

// workloads lists the available workloads by name. Add new ones here.
var workloads = map[string]func() workload{
	"seq": func() workload { return seqWorkload{} },
}

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
	// open opens the bench store (creating it the first time) and says how long it took.
	open func() (*engine.Engine, time.Duration, error)
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
