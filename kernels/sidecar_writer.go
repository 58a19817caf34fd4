package kernels

import (
	"fmt"
	"sync"
)

// SidecarWriter computes one block's sidecar payload of one kind from the block's staged K,
// layer by layer, as the dump path runs it: Begin, then AddLayer once for every layer (in any
// order, as layers arrive), then AppendPayload. Values go straight into the payload buffer,
// which is reused from block to block. A SidecarWriter is not safe for concurrent use: give
// each dump worker its own (they share the hash encoders).
type SidecarWriter struct {
	h       SidecarHeader
	encs    []*HashEncoder
	payload []byte
	have    []bool
	left    int
	begun   bool
	vals    []float32
	ch      []uint16
}

// NewSidecarWriter returns a writer of sidecars of spec computed from K of dtype input. For
// SidecarHash it builds (or reuses, process-wide) the spec's hash encoders.
func NewSidecarWriter(spec SidecarSpec, input DType) (*SidecarWriter, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if !input.Valid() {
		return nil, errorf(ErrInvalid, "sidecar writer: input dtype %v", input)
	}
	w := &SidecarWriter{h: SidecarHeader{SidecarSpec: spec, Input: input}}
	if spec.Kind == SidecarHash {
		var err error
		if w.encs, err = cachedEncoders(spec); err != nil {
			return nil, err
		}
		w.h.Fingerprint = HashFingerprint(w.encs...)
	} else {
		w.vals = make([]float32, spec.valueCount())
		if spec.Kind == SidecarKVStar {
			w.ch = make([]uint16, spec.Heads*spec.Cols())
		}
	}
	w.payload = make([]byte, spec.Layers*int(spec.partBytes()))
	w.have = make([]bool, spec.Layers)
	return w, nil
}

type encoderKey struct {
	dim, bits int
	seed      uint64
}

// encoderCache holds the hash encoders built for writers, by (input dim, hash bits, seed):
// they are immutable and costly to build (a QR of the projection).
var encoderCache sync.Map // encoderKey → *HashEncoder

func cachedEncoder(dim, bits int, seed uint64) (*HashEncoder, error) {
	k := encoderKey{dim, bits, seed}
	if e, ok := encoderCache.Load(k); ok {
		return e.(*HashEncoder), nil
	}
	e, err := NewHashEncoder(dim, bits, seed)
	if err != nil {
		return nil, err
	}
	got, _ := encoderCache.LoadOrStore(k, e)
	return got.(*HashEncoder), nil
}

func cachedEncoders(s SidecarSpec) ([]*HashEncoder, error) {
	e0, err := cachedEncoder(s.Dim-s.RopeDim, s.HashBits, s.Seed)
	if err != nil {
		return nil, err
	}
	if s.RopeDim == 0 {
		return []*HashEncoder{e0}, nil
	}
	e1, err := cachedEncoder(s.RopeDim, s.RopeBits, s.Seed+1)
	if err != nil {
		return nil, err
	}
	return []*HashEncoder{e0, e1}, nil
}

// Spec is the writer's spec.
func (w *SidecarWriter) Spec() SidecarSpec { return w.h.SidecarSpec }

// Begin starts the payload of a block of the given tokens (BlockSize, or fewer for a partial
// last block), discarding any unfinished one.
func (w *SidecarWriter) Begin(tokens int) error {
	if tokens < 1 || tokens > w.h.BlockSize {
		return errorf(ErrInvalid, "sidecar %v: tokens %d not in [1, block size %d]", w.h.Kind, tokens, w.h.BlockSize)
	}
	w.h.Tokens = tokens
	clear(w.payload)
	for l := range w.h.Layers {
		off, _, _ := w.h.LayerRange(l)
		putHeader(w.payload[off:], &w.h, l)
	}
	clear(w.have)
	w.left = w.h.Layers
	w.begun = true
	return nil
}

// AddLayer runs the kind's kernel on layer's staged K ([tokens][heads][dim] of the input dtype,
// tokens as given to Begin) and stores the result in the payload. k may also be a whole
// block's K tensor ([BlockSize][heads][dim], as in a staged record shard, whose first
// TensorBytes bytes are K): only its first tokens rows are read. A layer outside [0, Layers)
// is ErrOutOfRange; adding a layer twice, K of another size, or a call before Begin is
// ErrInvalid; a value overflowing the element dtype is ErrOutOfRange.
func (w *SidecarWriter) AddLayer(layer int, k []byte) error {
	h := &w.h
	if !w.begun {
		return errorf(ErrInvalid, "sidecar %v: AddLayer before Begin", h.Kind)
	}
	if layer < 0 || layer >= h.Layers {
		return errorf(ErrOutOfRange, "sidecar %v: layer %d of %d", h.Kind, layer, h.Layers)
	}
	if w.have[layer] {
		return errorf(ErrInvalid, "sidecar %v: layer %d added twice", h.Kind, layer)
	}
	s := KShape{Tokens: h.Tokens, Heads: h.Heads, Dim: h.Dim}
	if row := h.Heads * h.Dim * h.Input.Size(); len(k) == h.BlockSize*row {
		k = k[:h.Tokens*row]
	}
	off, n, _ := h.LayerRange(layer)
	part := w.payload[off : off+n]
	var err error
	switch h.Kind {
	case SidecarESAMean:
		err = ESAPool(w.vals, nil, k, h.Input, s)
	case SidecarESAMax:
		err = ESAPool(nil, w.vals, k, h.Input, s)
	case SidecarQuest:
		err = QuestMinMax(w.vals, k, h.Input, s)
	case SidecarKVStar:
		valid := h.ValidRows() * h.rowValues()
		clear(w.vals[valid:])
		err = KVStar(w.vals[:valid], w.ch, k, h.Input, s, h.kvstar())
		if err == nil {
			err = h.putChannels(part, w.ch)
		}
	case SidecarHash:
		data := part[SidecarHeaderSize:]
		err = HashBlock(data[:h.ValidRows()*h.rowValues()], k, h.Input, s, w.encs...)
	}
	if err == nil && h.Kind != SidecarHash {
		err = h.putValues(part, w.vals)
	}
	if err != nil {
		clear(part[SidecarHeaderSize:])
		return fmt.Errorf("sidecar %v: layer %d: %w", h.Kind, layer, err)
	}
	w.have[layer] = true
	w.left--
	return nil
}

// AppendPayload appends the finished payload to dst. Every layer must have been added
// (ErrInvalid otherwise, naming the first missing one). The writer may then Begin again.
func (w *SidecarWriter) AppendPayload(dst []byte) ([]byte, error) {
	if !w.begun {
		return dst, errorf(ErrInvalid, "sidecar %v: AppendPayload before Begin", w.h.Kind)
	}
	if w.left > 0 {
		for l, ok := range w.have {
			if !ok {
				return dst, errorf(ErrInvalid, "sidecar %v: layer %d of %d not added", w.h.Kind, l, w.h.Layers)
			}
		}
	}
	return append(dst, w.payload...), nil
}
