// Package mooncakefake is an in-memory stand-in for a Mooncake Store pool (tiers.MooncakePool)
// for tests: objects in a map, Mooncake's error codes, and switches that make it fail the way a
// real pool does (master down, transport errors, full pool, damaged or foreign objects).
package mooncakefake

import (
	"errors"
	"sync"
)

// Mooncake error codes the fake returns (mooncake-store/include/types.h).
const (
	CodeBufferOverflow = -10
	CodeNoSpace        = -200
	CodeNotFound       = -704
	CodeExists         = -705
	CodeTransferFail   = -800
	CodeRPCFail        = -900
)

// ErrDown is the batch error of every operation while the fake's master is down.
var ErrDown = errors.New("mooncakefake: master unreachable")

// Pool is the fake pool. The zero value is not usable: call New. Several Pools may share one
// Store, as clients of one master share its pool.
type Pool struct {
	st *Store

	mu sync.Mutex
	// Unhealthy makes Healthy false (as when the client's pings to the master fail).
	Unhealthy bool
	// Resets counts Reset calls; ResetHeals makes a Reset clear Unhealthy.
	Resets     int
	ResetHeals bool
	closed     bool
	allocs     int
}

// Store is the pool's content, shared by Pools.
type Store struct {
	mu   sync.Mutex
	objs map[string][]byte
	// Capacity bounds the stored bytes (0: unlimited); a put beyond it fails with CodeNoSpace.
	Capacity int
	// Down fails every operation of every client with ErrDown.
	Down bool
	// GetCode, when non-zero, is the result of every get of an existing object.
	GetCode int64
	// PutCode, when non-zero, is the result of every put.
	PutCode int
	// Gets and Puts count keys asked for and written.
	Gets, Puts int
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{objs: map[string][]byte{}} }

// New returns a client of st.
func New(st *Store) *Pool { return &Pool{st: st} }

// Store returns the store the pool is a client of.
func (p *Pool) Store() *Store { return p.st }

// Set stores obj under key directly (to plant stale, foreign or damaged objects).
func (s *Store) Set(key string, obj []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs[key] = append([]byte(nil), obj...)
}

// Object returns a copy of the object under key.
func (s *Store) Object(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	return append([]byte(nil), o...), ok
}

// Keys returns every stored key.
func (s *Store) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.objs {
		out = append(out, k)
	}
	return out
}

// Delete removes key (an eviction).
func (s *Store) Delete(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, key)
}

// SetDown sets Down under the store's lock.
func (s *Store) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Down = down
}

// Alloc returns plain memory (nothing is registered in a fake).
func (p *Pool) Alloc(size int) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.allocs++
	return make([]byte, size), nil
}

// Put stores copies of bufs under keys.
func (p *Pool) Put(keys []string, bufs [][]byte) ([]int, error) {
	s := p.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Down {
		return nil, ErrDown
	}
	out := make([]int, len(keys))
	for i, k := range keys {
		s.Puts++
		switch {
		case s.PutCode != 0:
			out[i] = s.PutCode
		case s.objs[k] != nil:
			out[i] = CodeExists
		case s.Capacity > 0 && s.bytesLocked()+len(bufs[i]) > s.Capacity:
			out[i] = CodeNoSpace
		default:
			s.objs[k] = append([]byte(nil), bufs[i]...)
		}
	}
	return out, nil
}

func (s *Store) bytesLocked() int {
	n := 0
	for _, o := range s.objs {
		n += len(o)
	}
	return n
}

// Get copies each object into its buffer, as Mooncake's get_into does: the object's length,
// CodeNotFound, or CodeBufferOverflow when the buffer is too small.
func (p *Pool) Get(keys []string, bufs [][]byte) ([]int64, error) {
	s := p.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Down {
		return nil, ErrDown
	}
	out := make([]int64, len(keys))
	for i, k := range keys {
		s.Gets++
		o, ok := s.objs[k]
		switch {
		case !ok:
			out[i] = CodeNotFound
		case s.GetCode != 0:
			out[i] = s.GetCode
		case len(o) > len(bufs[i]):
			out[i] = CodeBufferOverflow
		default:
			out[i] = int64(copy(bufs[i], o))
		}
	}
	return out, nil
}

// Exist reports which keys are stored.
func (p *Pool) Exist(keys []string) ([]bool, error) {
	s := p.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Down {
		return nil, ErrDown
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i] = s.objs[k]
	}
	return out, nil
}

// Healthy is false while the store is down or the pool is marked unhealthy.
func (p *Pool) Healthy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	return !p.closed && !p.Unhealthy && !p.st.Down
}

// SetUnhealthy sets Unhealthy under the pool's lock.
func (p *Pool) SetUnhealthy(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Unhealthy = v
}

// ResetCount returns Resets under the pool's lock.
func (p *Pool) ResetCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.Resets
}

// Reset counts the call and, with ResetHeals, clears Unhealthy.
func (p *Pool) Reset() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Resets++
	if p.ResetHeals {
		p.Unhealthy = false
		return nil
	}
	return ErrDown
}

// Close marks the pool closed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// Closed reports whether Close was called.
func (p *Pool) Closed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}
