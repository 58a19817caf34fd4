package sparse

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ucm-go/ucm/engine"
)

// SidecarSource is where selection reads block representations: one part (one layer) of many
// blocks' sidecars of one kind into one array, as engine.(*Engine).LoadSidecars does.
// found[i] false is a miss (the bytes of dst are then zero).
type SidecarSource interface {
	LoadSidecars(kind engine.SidecarKind, part int, ids []engine.BlockID, dst []byte) (found []bool, err error)
}

// MapSidecars is an in-memory SidecarSource: whole payloads by (block, kind), split into equal
// parts as the engine does. Evaluations and tests use it where a store would add nothing but
// I/O; it is safe for concurrent use.
type MapSidecars struct {
	mu    sync.RWMutex
	m     map[sidecarKey]sidecarVal
	loads atomic.Int64
}

type sidecarKey struct {
	id   engine.BlockID
	kind engine.SidecarKind
}

type sidecarVal struct {
	payload []byte
	parts   int
}

// Put stores a block's payload of parts equal parts (it is not copied).
func (s *MapSidecars) Put(kind engine.SidecarKind, id engine.BlockID, parts int, payload []byte) error {
	if parts < 1 || len(payload)%parts != 0 {
		return fmt.Errorf("%w: sidecar of %d bytes in %d parts", ErrInvalid, len(payload), parts)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[sidecarKey]sidecarVal{}
	}
	s.m[sidecarKey{id, kind}] = sidecarVal{payload, parts}
	return nil
}

// Has reports whether a block's sidecar of kind is stored.
func (s *MapSidecars) Has(kind engine.SidecarKind, id engine.BlockID) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.m[sidecarKey{id, kind}]
	return ok
}

// Loads is the number of LoadSidecars calls so far.
func (s *MapSidecars) Loads() int64 { return s.loads.Load() }

// LoadSidecars implements SidecarSource with engine.LoadSidecars's argument rules and miss
// semantics.
func (s *MapSidecars) LoadSidecars(kind engine.SidecarKind, part int, ids []engine.BlockID, dst []byte) ([]bool, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if len(dst)%len(ids) != 0 || len(dst) == 0 || part < 0 {
		return nil, fmt.Errorf("%w: load sidecars: %d bytes for %d blocks, part %d", ErrInvalid, len(dst), len(ids), part)
	}
	s.loads.Add(1)
	n := len(dst) / len(ids)
	found := make([]bool, len(ids))
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i, id := range ids {
		out := dst[i*n : (i+1)*n]
		v, ok := s.m[sidecarKey{id, kind}]
		if !ok || part >= v.parts || len(v.payload)/v.parts != n {
			clear(out)
			continue
		}
		copy(out, v.payload[part*n:])
		found[i] = true
	}
	return found, nil
}
