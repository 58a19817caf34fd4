//go:build mooncake && linux

package tiers

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/kvcache-ai/Mooncake/mooncake-store/go/mooncakestore"
	"github.com/ucm-go/ucm/devio"
)

// MooncakeBuilt reports whether this binary links Mooncake's client library (the `mooncake`
// build tag).
const MooncakeBuilt = true

// mcConnectionPoolEnv is the variable that turns on the connection pool of Mooncake's TCP
// transport (a few connections per peer, reused); a client of the tier sets it to 1 when the
// environment does not set it.
const mcConnectionPoolEnv = "MC_TCP_ENABLE_CONNECTION_POOL"

// mcClient is a MooncakePool over Mooncake's own Go binding (mooncake-store/go, cgo over
// store_c.h). Its staging memory is mmap'd outside the Go heap (the transfer engine keeps the
// addresses it registers, which cgo forbids for Go memory) and re-registered with every new
// client after a Reset.
type mcClient struct {
	cfg MooncakeConfig
	// mu guards store: read-locked by operations, write-locked by Reset and Close. Reset only
	// tries the lock, so an operation stuck in a call to a dead master never blocks the others
	// behind a waiting Reset.
	mu     sync.RWMutex
	store  *mooncakestore.Store // nil while not set up
	allocs [][]byte
	mems   []*devio.HostMemory // allocs' memory
	closed bool
}

// OpenMooncakePool sets up a client of the pool cfg names. A master that does not answer is
// not an error: the client is returned unhealthy and the tier's health loop sets it up once
// the master answers (MooncakePool.Reset).
func OpenMooncakePool(cfg MooncakeConfig) (MooncakePool, error) {
	c := &mcClient{cfg: cfg}
	if s, err := c.setup(); err == nil {
		c.store = s
	}
	return c, nil
}

func (c *mcClient) setup() (*mooncakestore.Store, error) {
	// Mooncake's TCP transport binds MC_TCP_BIND_ADDRESS, else the machine's first interface:
	// unless the environment says otherwise, bind the address the client announces.
	if os.Getenv("MC_TCP_BIND_ADDRESS") == "" && c.cfg.Protocol == "tcp" {
		_ = os.Setenv("MC_TCP_BIND_ADDRESS", c.cfg.LocalHostname)
	}
	// Without its connection pool the TCP transport opens and closes a connection per
	// transfer (a 64 KiB shard object is one): unless the environment chooses, reuse a few
	// connections per peer.
	if _, set := os.LookupEnv(mcConnectionPoolEnv); !set && c.cfg.Protocol == "tcp" {
		_ = os.Setenv(mcConnectionPoolEnv, "1")
	}
	s, err := mooncakestore.New()
	if err != nil {
		return nil, err
	}
	cfg := c.cfg
	if err := s.Setup(cfg.LocalHostname, cfg.MetadataServer, uint64(cfg.GlobalSegmentSize), uint64(cfg.LocalBufferSize),
		cfg.Protocol, cfg.DeviceName, cfg.MasterServerAddress); err != nil {
		s.Close()
		return nil, fmt.Errorf("mooncake setup (master %s, metadata %s): %w", cfg.MasterServerAddress, cfg.MetadataServer, err)
	}
	for _, b := range c.allocs {
		if err := s.RegisterBuffer(uintptr(unsafe.Pointer(&b[0])), uint64(len(b))); err != nil {
			s.Close()
			return nil, fmt.Errorf("mooncake: register %d staging bytes: %w", len(b), err)
		}
	}
	return s, nil
}

// Alloc maps size bytes outside the Go heap in huge pages (devio.HostMemory), faulted in, and
// registers them with the client (now, or at its next setup). The pages are populated at
// once: staging memory lives as long as the tier, and a page the kernel first hands out during
// a transfer costs that transfer its zeroing (docs/mooncake.md, decisions). Huge pages, because
// the tier lends this memory for dumps' payloads, which the engine writes to disk with
// O_DIRECT: each huge page is one DMA segment of the write, where 4 KiB pages make 512.
func (c *mcClient) Alloc(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("mooncake: alloc %d bytes: %w", size, ErrInvalidConfig)
	}
	mem, bufs, err := devio.NewHostBuffers(1, size)
	if err != nil {
		return nil, fmt.Errorf("mooncake: map %d staging bytes: %w", size, err)
	}
	b := bufs[0]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.store != nil {
		if err := c.store.RegisterBuffer(uintptr(unsafe.Pointer(&b[0])), uint64(size)); err != nil {
			_ = mem.Close()
			return nil, fmt.Errorf("mooncake: register %d staging bytes: %w", size, err)
		}
	}
	c.allocs, c.mems = append(c.allocs, b), append(c.mems, mem)
	return b, nil
}

var errNotSetUp = errors.New("mooncake client not set up (master unreachable)")

func ptrs(bufs [][]byte) ([]uintptr, []uint64) {
	p, n := make([]uintptr, len(bufs)), make([]uint64, len(bufs))
	for i, b := range bufs {
		p[i], n[i] = uintptr(unsafe.Pointer(unsafe.SliceData(b))), uint64(len(b))
	}
	return p, n
}

func (c *mcClient) Put(keys []string, bufs [][]byte) ([]int, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.store == nil {
		return nil, errNotSetUp
	}
	p, n := ptrs(bufs)
	rc := mooncakestore.ReplicateConfig{ReplicaNum: c.cfg.Replicas}
	return c.store.BatchPutFrom(keys, p, n, &rc)
}

func (c *mcClient) Get(keys []string, bufs [][]byte) ([]int64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.store == nil {
		return nil, errNotSetUp
	}
	p, n := ptrs(bufs)
	return c.store.BatchGetInto(keys, p, n)
}

func (c *mcClient) Exist(keys []string) ([]bool, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.store == nil {
		return nil, errNotSetUp
	}
	return c.store.BatchExists(keys)
}

func (c *mcClient) Healthy() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.store != nil && c.store.HealthCheck() == nil
}

func (c *mcClient) Reset() error {
	if !c.mu.TryLock() {
		return errors.New("mooncake: reset skipped: an operation is in flight")
	}
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("mooncake: client closed")
	}
	if c.store != nil {
		c.store.Close()
		c.store = nil
	}
	s, err := c.setup()
	if err != nil {
		return err
	}
	c.store = s
	return nil
}

func (c *mcClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.store != nil {
		c.store.Close()
		c.store = nil
	}
	var errs []error
	for _, m := range c.mems {
		errs = append(errs, m.Close())
	}
	c.allocs, c.mems = nil, nil
	return errors.Join(errs...)
}
