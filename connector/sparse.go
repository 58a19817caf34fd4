package connector

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/par"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/sparse"
)

// Selector is sparse attention's block selection over a store, outside the serving engine's
// hooks: it writes a method's block representations into the store as the blocks' sidecars
// (computed from K by the kernels, or precomputed by the caller), reads them back by block id,
// and answers "which blocks does this decode step of this layer attend" for a request given
// its query and its blocks' ids, with the method's own AttentionBegin (windows, budget,
// retrieval stride, lag, representation pool, per-KV-head selection: one code path with the
// hooks). It is safe for concurrent use; selections of one (request, layer) run in the order
// they were submitted.
//
// Representations are stored as sidecars of their block (engine.DumpSidecars): they survive
// a restart, are seen by every instance sharing the store's backends, and go with the block
// when it is evicted. A block not stored has none: dumping its representation fails that
// block (engine.ErrNotFound), and a selection treats it as a candidate without one (kept
// first within the budget, as in the hooks).
type Selector struct {
	s      *Store
	m      sparse.SparseMethod
	shape  sparse.Shape
	spec   kernels.SidecarSpec
	fp     uint32 // the hash encoders' fingerprint (GSA On-Device), else 0
	layout ReprLayout
	sem    chan struct{} // bounds the selections running at once

	mu     sync.Mutex
	tasks  map[uint64]*selectTask
	last   map[string]*selectTask // the latest selection of each (request, layer)
	next   uint64
	closed bool
	wg     sync.WaitGroup
}

// ReprLayout is the float32 layout of one block's representation as DumpReprs computes it,
// PutReprs takes it and LoadReprs returns it: per layer, Rows × Heads × Cols values, row-major
// ([Rows][Heads][Cols]); a whole block is Layers of those, layer after layer.
//
//   - ESA mean or max (and GSA, which scores the mean): Rows 1, Cols head dim.
//   - Quest: Rows 2 (the per-channel minimum, then the maximum), Cols head dim.
//   - KVStar: Rows 1 + block size / merge: row 0 is the kept channels of each head (integers
//     in [0, head dim), ascending per head), then the merged rows; Cols the kept channels d'.
//   - GSA On-Device's hash codes: Rows block size (one per token), Cols the code bytes of a
//     token and head, each byte as a float32 in [0, 255].
type ReprLayout struct {
	Kind                      kernels.SidecarKind
	Layers, Rows, Heads, Cols int
}

// LayerFloats is one layer's values: Rows·Heads·Cols.
func (l ReprLayout) LayerFloats() int { return l.Rows * l.Heads * l.Cols }

// BlockFloats is a whole block's values: Layers·LayerFloats.
func (l ReprLayout) BlockFloats() int { return l.Layers * l.LayerFloats() }

// sidecarSpecer is what the block-scoring methods expose: the representation they read.
type sidecarSpecer interface{ SidecarSpec() kernels.SidecarSpec }

// NewSelector builds the method cfg configures (sparse.ParseMethodConfig, sparse.Choose) for a
// model of the given shape, reading representations from this store. Only the block-scoring
// methods select blocks (ESA, Quest, GSA, KVStar, GSA On-Device); another method, a bad shape
// or the scheduler's store (which only looks up) is ErrInvalidArgument naming what is wrong.
// Representations are stored as float16 (hash codes as bytes). Close the selector before the
// store.
func (s *Store) NewSelector(cfg sparse.MethodConfig, shape sparse.Shape) (*Selector, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if s.cfg.Scheduler {
		return nil, fmt.Errorf("selector: the scheduler's store (no shard_size or tensor sizes configured) only looks up: %w", engine.ErrInvalidArgument)
	}
	if cfg == nil {
		return nil, fmt.Errorf("selector: no sparse method configuration: %w", engine.ErrInvalidArgument)
	}
	m, err := sparse.New(cfg, sparse.Env{Role: sparse.RoleWorker, Shape: shape, Sidecars: s.eng})
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	ss, ok := m.(sidecarSpecer)
	if !ok {
		_ = m.Close()
		return nil, fmt.Errorf("selector: method %s selects no blocks (it reads no block representations): %w", m.Name(), engine.ErrInvalidArgument)
	}
	x := &Selector{s: s, m: m, shape: shape, spec: ss.SidecarSpec(), tasks: map[uint64]*selectTask{}, last: map[string]*selectTask{},
		sem: make(chan struct{}, max(runtime.GOMAXPROCS(0), 1))}
	if x.spec.Kind == kernels.SidecarHash {
		encs, err := x.spec.HashEncoders()
		if err != nil {
			_ = m.Close()
			return nil, fmt.Errorf("selector: %w", err)
		}
		x.fp = kernels.HashFingerprint(encs...)
	}
	x.layout = ReprLayout{Kind: x.spec.Kind, Layers: x.spec.Layers, Rows: x.spec.Rows(), Heads: x.spec.Heads, Cols: x.spec.Cols()}
	if x.spec.Kind == kernels.SidecarKVStar {
		x.layout.Rows++ // the channel row
	}
	return x, nil
}

// Method is the selector's method name ("ESA", "Quest", ...).
func (x *Selector) Method() string { return x.m.Name() }

// Shape is the model shape the selector serves.
func (x *Selector) Shape() sparse.Shape { return x.shape }

// Spec is the sidecar spec of the representations the selector writes and reads.
func (x *Selector) Spec() kernels.SidecarSpec { return x.spec }

// Layout is the float32 layout of one block's representation (PutReprs, LoadReprs).
func (x *Selector) Layout() ReprLayout { return x.layout }

// Close waits for the selections in flight and stops the method. Later calls fail with
// engine.ErrClosed; Close is idempotent.
func (x *Selector) Close() error {
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return nil
	}
	x.closed = true
	x.mu.Unlock()
	x.wg.Wait()
	return x.m.Close()
}

func (x *Selector) checkOpen() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("selector: %w", engine.ErrClosed)
	}
	return x.s.check()
}

// checkIDs refuses zero and duplicate ids, naming the position.
func checkIDs(op string, ids []engine.BlockID) error {
	if len(ids) > maxCallBlocks {
		return fmt.Errorf("%s: %d block ids: more than %d in one call: %w", op, len(ids), maxCallBlocks, engine.ErrInvalidArgument)
	}
	seen := make(map[engine.BlockID]int, len(ids))
	for i, id := range ids {
		if id.IsZero() {
			return fmt.Errorf("%s: position %d: zero block id: %w", op, i, engine.ErrInvalidArgument)
		}
		if j, dup := seen[id]; dup {
			return fmt.Errorf("%s: block %s at positions %d and %d: %w", op, id, j, i, ErrDuplicate)
		}
		seen[id] = i
	}
	return nil
}

// maxCallBlocks bounds the blocks of one selector call (the C ABI's bound).
const maxCallBlocks = 1 << 24

// DumpReprs computes the representation of each block from its K on the host (the kernels:
// ESA pooling, Quest bounds, KVStar pruning and merging, hash codes) and stores it as the
// block's sidecar. k[i][l] is the K of block ids[i] at layer l, [block size][kv heads][head
// dim] of dtype dt (float16, bfloat16, float32 or a float8); it is read before DumpReprs
// returns. The returned task is waited for with Store.Wait (or checked with Store.Check) like
// a dump: a block that is not stored fails alone with engine.ErrNotFound; a block that already
// has this representation keeps it (a representation is a function of the block's bytes). Bad
// arguments fail the call, naming the block and layer.
func (x *Selector) DumpReprs(ids []engine.BlockID, k [][][]byte, dt kernels.DType) (uint64, error) {
	if err := x.checkOpen(); err != nil {
		return 0, err
	}
	if err := checkIDs("dump reprs", ids); err != nil {
		return 0, err
	}
	if !dt.Valid() {
		return 0, fmt.Errorf("dump reprs: K dtype %v: %w", dt, engine.ErrInvalidArgument)
	}
	if len(k) != len(ids) {
		return 0, fmt.Errorf("dump reprs: %d block ids and K of %d blocks: %w", len(ids), len(k), engine.ErrInvalidArgument)
	}
	sh := x.shape
	want := sh.BlockSize * sh.KVHeads * sh.HeadDim * dt.Size()
	for i, layers := range k {
		if len(layers) != sh.Layers {
			return 0, fmt.Errorf("dump reprs: block %s (position %d): K of %d layers, the shape has %d: %w", ids[i], i, len(layers), sh.Layers, engine.ErrInvalidArgument)
		}
		for l, b := range layers {
			if len(b) != want {
				return 0, fmt.Errorf("dump reprs: block %s (position %d), layer %d: K of %d bytes, want %d ([%d tokens][%d kv heads][%d] %v): %w",
					ids[i], i, l, len(b), want, sh.BlockSize, sh.KVHeads, sh.HeadDim, dt, engine.ErrInvalidArgument)
			}
		}
	}
	payloads := make([][]byte, len(ids))
	errs := make([]error, len(ids))
	par.Chunks(len(ids), 4, runtime.GOMAXPROCS(0), func(lo, hi int) {
		w, err := kernels.NewSidecarWriter(x.spec, dt)
		for i := lo; i < hi; i++ {
			if err == nil {
				err = w.Begin(sh.BlockSize)
			}
			for l := 0; err == nil && l < sh.Layers; l++ {
				if err = w.AddLayer(l, k[i][l]); err != nil {
					err = fmt.Errorf("layer %d: %w", l, err)
				}
			}
			if err == nil {
				payloads[i], err = w.AppendPayload(nil)
			}
			if err != nil {
				errs[i] = fmt.Errorf("dump reprs: block %s (position %d): %w: %w", ids[i], i, engine.ErrInvalidArgument, err)
				return
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return x.storeSidecars(ids, payloads), nil
}

// storeSidecars starts storing the payloads and registers the store task.
func (x *Selector) storeSidecars(ids []engine.BlockID, payloads [][]byte) uint64 {
	t := &Task{ids: ids, start: time.Now(), done: make(chan struct{}), sidecars: true}
	if len(ids) > 0 {
		t.parts = []*engine.Task{x.s.eng.DumpSidecars(engine.SidecarKind(x.spec.Kind), x.spec.Layers, ids, payloads)}
		all := make([]int, len(ids))
		for i := range all {
			all[i] = i
		}
		t.members = [][]int{all}
	}
	return x.s.register(t)
}

// PutReprs stores precomputed representations as the blocks' sidecars: reprs[i] is block
// ids[i]'s, Layout().BlockFloats() float32 values in the layout ReprLayout describes (the
// values are stored as float16 and must be finite; hash codes must have been computed with the
// selector's hash encoders). The task is as DumpReprs's; a block that already has a representation of this
// kind keeps it (ESA mean and GSA share one). Values of the wrong count, channels out of order or
// range, codes that are not bytes, or values float16 cannot hold fail the call, naming the
// block.
func (x *Selector) PutReprs(ids []engine.BlockID, reprs [][]float32) (uint64, error) {
	if err := x.checkOpen(); err != nil {
		return 0, err
	}
	if err := checkIDs("put reprs", ids); err != nil {
		return 0, err
	}
	if len(reprs) != len(ids) {
		return 0, fmt.Errorf("put reprs: %d block ids and %d representations: %w", len(ids), len(reprs), engine.ErrInvalidArgument)
	}
	lay := x.layout
	payloads := make([][]byte, len(ids))
	for i, r := range reprs {
		if len(r) != lay.BlockFloats() {
			return 0, fmt.Errorf("put reprs: block %s (position %d): %d values, want %d (%d layers × %d rows × %d heads × %d): %w",
				ids[i], i, len(r), lay.BlockFloats(), lay.Layers, lay.Rows, lay.Heads, lay.Cols, engine.ErrInvalidArgument)
		}
		sc, err := x.decodeFloats(r)
		if err == nil {
			payloads[i], err = kernels.EncodeSidecar(nil, sc)
		}
		if err != nil {
			return 0, fmt.Errorf("put reprs: block %s (position %d): %w: %w", ids[i], i, engine.ErrInvalidArgument, err)
		}
	}
	return x.storeSidecars(ids, payloads), nil
}

// decodeFloats turns one block's float32 layout into the sidecar to encode.
func (x *Selector) decodeFloats(r []float32) (*kernels.Sidecar, error) {
	sp, lay := x.spec, x.layout
	sc := &kernels.Sidecar{SidecarHeader: kernels.SidecarHeader{SidecarSpec: sp, Input: kernels.Float16, Tokens: sp.BlockSize, Fingerprint: x.fp}}
	per := lay.LayerFloats()
	switch sp.Kind {
	case kernels.SidecarHash:
		sc.Codes = make([]byte, len(r))
		for j, v := range r {
			if v != float32(math.Trunc(float64(v))) || v < 0 || v > 255 {
				return nil, fmt.Errorf("hash code byte %d (layer %d): %v is not an integer in [0, 255]", j, j/per, v)
			}
			sc.Codes[j] = byte(v)
		}
	case kernels.SidecarKVStar:
		chN := lay.Heads * lay.Cols
		for l := range lay.Layers {
			part := r[l*per : (l+1)*per]
			for j, v := range part[:chN] {
				if v != float32(math.Trunc(float64(v))) || v < 0 || int(v) >= sp.Dim {
					return nil, fmt.Errorf("layer %d: channel %d (head %d): %v is not an integer in [0, %d)", l, j%lay.Cols, j/lay.Cols, v, sp.Dim)
				}
				sc.Channels = append(sc.Channels, uint16(v))
			}
			sc.Values = append(sc.Values, part[chN:]...)
		}
	default:
		sc.Values = r
	}
	for j, v := range sc.Values {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("value %d (layer %d): %v: representations are finite", j, j/max(len(sc.Values)/lay.Layers, 1), v)
		}
	}
	return sc, nil
}

// LoadReprs reads layer's representation of each block into dst (len(ids) ×
// Layout().LayerFloats() float32, block after block, in the layout ReprLayout describes) and
// returns which blocks had one. A block without one (not stored, never given one, or whose
// stored bytes fail a check or were made for another spec) is not found and its values are
// zero; nothing else is lost. Bad arguments are ErrInvalidArgument naming the field.
func (x *Selector) LoadReprs(layer int, ids []engine.BlockID, dst []float32) ([]bool, error) {
	if err := x.checkOpen(); err != nil {
		return nil, err
	}
	if layer < 0 || layer >= x.spec.Layers {
		return nil, fmt.Errorf("load reprs: layer %d not in [0, %d): %w", layer, x.spec.Layers, engine.ErrInvalidArgument)
	}
	if len(ids) > maxCallBlocks {
		return nil, fmt.Errorf("load reprs: %d block ids: more than %d in one call: %w", len(ids), maxCallBlocks, engine.ErrInvalidArgument)
	}
	for i, id := range ids {
		if id.IsZero() {
			return nil, fmt.Errorf("load reprs: position %d: zero block id: %w", i, engine.ErrInvalidArgument)
		}
	}
	per := x.layout.LayerFloats()
	if len(dst) != len(ids)*per {
		return nil, fmt.Errorf("load reprs: destination of %d floats, want %d (%d blocks × %d): %w", len(dst), len(ids)*per, len(ids), per, engine.ErrInvalidArgument)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	found, err := x.loadInto(layer, ids, dst, nil)
	if err != nil {
		return nil, fmt.Errorf("load reprs: %w", err)
	}
	return found, nil
}

// loadInto reads layer's representation of each block of ids (checked by the caller) into
// dst (len(ids) × LayerFloats) with one LoadSidecars call through buf (grown as needed;
// returned for reuse by the caller's pool) and returns which blocks had a usable one; the
// others' values are zero.
func (x *Selector) loadInto(layer int, ids []engine.BlockID, dst []float32, buf *[]byte) ([]bool, error) {
	per, pb := x.layout.LayerFloats(), x.spec.PartBytes()
	var local []byte
	if buf == nil {
		buf = &local
	}
	if cap(*buf) < len(ids)*pb {
		*buf = make([]byte, len(ids)*pb)
	}
	raw := (*buf)[:len(ids)*pb]
	found, err := x.s.eng.LoadSidecars(engine.SidecarKind(x.spec.Kind), layer, ids, raw)
	if err != nil {
		return nil, err
	}
	chN := 0
	if x.spec.Kind == kernels.SidecarKVStar {
		chN = x.spec.Heads * x.spec.Cols()
	}
	ch := make([]uint16, chN)
	for i := range ids {
		out := dst[i*per : (i+1)*per]
		if !found[i] || !x.decodePart(raw[i*pb:(i+1)*pb], layer, out, ch) {
			found[i] = false
			clear(out)
		}
	}
	return found, nil
}

// dotRows is RetrieveDot's pooled working memory: the sidecar parts read and the float32 rows.
type dotRows struct {
	raw  []byte
	rows []float32
	cand []int32
}

var dotRowsPool = sync.Pool{New: func() any { return new(dotRows) }}

// RetrieveDot is ESA's retrieval (sparse.DotTopK: per query row, the a.K candidate rows of
// largest dot product) over representations read from the store by block id instead of a
// matrix the caller keeps: layer's representation of each block of ids is loaded in one
// engine LoadSidecars call, verified and converted into pooled float32 rows (row i is ids[i]'s,
// Layout().LayerFloats() values: every KV head's pooled key, head after head), and the
// retrieval runs over them on the calling goroutine and up to workers−1 helpers. a.Data must
// be nil (the rows are the store's) and a.Dim Layout().LayerFloats(); a.Cand (nil: every
// block) and the results number blocks by their position in ids. A block without a usable
// representation (not stored, none dumped, corrupt) is no candidate of any row and found[i]
// is false; on the same rows the results are DotTopK's over the matrix LoadReprs returns.
// Only the methods whose representation is one row per block (ESA's mean or max key, GSA's
// mean) have it; others, bad arguments and more than one call's blocks are
// ErrInvalidArgument naming the field.
func (x *Selector) RetrieveDot(layer int, ids []engine.BlockID, a *sparse.DotArgs, workers int) (found []bool, err error) {
	if err := x.checkOpen(); err != nil {
		return nil, err
	}
	switch {
	case x.layout.Rows != 1 || x.spec.Kind == kernels.SidecarKVStar || x.spec.Kind == kernels.SidecarHash:
		return nil, fmt.Errorf("retrieve dot: %s's %v representation is not one row per block: %w", x.m.Name(), x.spec.Kind, engine.ErrInvalidArgument)
	case layer < 0 || layer >= x.spec.Layers:
		return nil, fmt.Errorf("retrieve dot: layer %d not in [0, %d): %w", layer, x.spec.Layers, engine.ErrInvalidArgument)
	case a == nil:
		return nil, fmt.Errorf("retrieve dot: no arguments: %w", engine.ErrInvalidArgument)
	case a.Data != nil:
		return nil, fmt.Errorf("retrieve dot: data of %d values given: the rows are read from the store: %w", len(a.Data), engine.ErrInvalidArgument)
	case a.Dim != x.layout.LayerFloats():
		return nil, fmt.Errorf("retrieve dot: dim %d: want the representation's %d (%d heads × %d): %w", a.Dim, x.layout.LayerFloats(), x.layout.Heads, x.layout.Cols, engine.ErrInvalidArgument)
	case len(ids) > maxCallBlocks:
		return nil, fmt.Errorf("retrieve dot: %d block ids: more than %d in one call: %w", len(ids), maxCallBlocks, engine.ErrInvalidArgument)
	}
	for i, id := range ids {
		if id.IsZero() {
			return nil, fmt.Errorf("retrieve dot: position %d: zero block id: %w", i, engine.ErrInvalidArgument)
		}
	}
	w := dotRowsPool.Get().(*dotRows)
	defer dotRowsPool.Put(w)
	per := x.layout.LayerFloats()
	if cap(w.rows) < len(ids)*per {
		w.rows = make([]float32, len(ids)*per)
	}
	run := *a
	run.Data = w.rows[:len(ids)*per]
	// Check the shapes and candidates against the rows before reading anything.
	if err := run.Check(); err != nil {
		return nil, fmt.Errorf("retrieve dot: %w", err) // sparse.ErrInvalid: ErrInvalidArgument
	}
	if len(ids) > 0 {
		if found, err = x.loadInto(layer, ids, run.Data, &w.raw); err != nil {
			return nil, fmt.Errorf("retrieve dot: %w", err)
		}
	}
	missing := 0
	for _, f := range found {
		if !f {
			missing++
		}
	}
	if missing > 0 { // the blocks without a representation are no candidates
		b := run.Batch()
		if run.Cand == nil {
			run.Width = len(ids)
			w.cand = slices.Grow(w.cand[:0], b*len(ids))[:b*len(ids)]
			for i := range w.cand {
				w.cand[i] = int32(i % len(ids))
			}
		} else {
			w.cand = append(w.cand[:0], run.Cand...)
			if w.cand == nil { // an empty table stays a table: nil would be every block
				w.cand = []int32{}
			}
		}
		for i, c := range w.cand {
			if c >= 0 && !found[c] {
				w.cand[i] = -1
			}
		}
		run.Cand = w.cand
	}
	if err := sparse.DotTopK(&run, workers); err != nil {
		return nil, fmt.Errorf("retrieve dot: %w", err)
	}
	return found, nil
}

// decodePart verifies one block's part against the selector's spec and layer and writes its
// float32 layout into out; false when it is unusable.
func (x *Selector) decodePart(part []byte, layer int, out []float32, ch []uint16) bool {
	h, l, err := kernels.DecodeSidecarHeader(part)
	if err != nil || l != layer || h.SidecarSpec != x.spec || h.Fingerprint != x.fp {
		return false
	}
	switch x.spec.Kind {
	case kernels.SidecarHash:
		if _, _, err := kernels.DecodeSidecarPart(part, nil, nil); err != nil {
			return false
		}
		for j, b := range part[kernels.SidecarHeaderSize:][:len(out)] {
			out[j] = float32(b)
		}
	case kernels.SidecarKVStar:
		if _, _, err := kernels.DecodeSidecarPart(part, out[len(ch):], ch); err != nil {
			return false
		}
		for j, c := range ch {
			out[j] = float32(c)
		}
	default:
		if _, _, err := kernels.DecodeSidecarPart(part, out, nil); err != nil {
			return false
		}
	}
	return true
}

// SelectArgs is one decode step's selection request for one layer of one request.
type SelectArgs struct {
	// Request names the request (its held selections, lag and pool references are kept under
	// it until RequestFinished).
	Request string
	// Layer is the layer index; Step the request's decode step (its output tokens so far).
	Layer, Step int
	// Q is the step's queries after RoPE, [tokens][query heads][head dim] (the last token's
	// select); it is copied.
	Q []float32
	// IDs are the stored ids of the request's leading full blocks, in order (the keys of their
	// representations); it is copied. Blocks of the context past len(IDs) have none.
	IDs []engine.BlockID
	// SeqLen is the tokens attended: the context is ⌈SeqLen / block size⌉ blocks, at least
	// len(IDs).
	SeqLen int
}

// Selection is the blocks one decode step of one layer attends.
type Selection struct {
	// Blocks is the logical blocks attended (positions in the context, ascending): every block
	// when Dense.
	Blocks []int
	// Heads, with head_select kv, is each KV head's own selection (ascending); Blocks is their
	// union. nil when every head attends Blocks.
	Heads [][]int
	// Dense says the step attends every block (the windows and budget cover the context).
	Dense bool
}

// validate checks a selection's arguments and returns the context's block count.
func (x *Selector) validate(a *SelectArgs) (int, error) {
	sh := x.shape
	qd := sh.QHeads * sh.HeadDim
	switch {
	case a.Request == "":
		return 0, fmt.Errorf("select: request id: empty: %w", engine.ErrInvalidArgument)
	case a.Layer < 0 || a.Layer >= sh.Layers:
		return 0, fmt.Errorf("select: layer %d not in [0, %d): %w", a.Layer, sh.Layers, engine.ErrInvalidArgument)
	case a.Step < 0:
		return 0, fmt.Errorf("select: step %d: negative: %w", a.Step, engine.ErrInvalidArgument)
	case len(a.Q) < qd || len(a.Q)%qd != 0:
		return 0, fmt.Errorf("select: query of %d floats, want a positive multiple of %d (%d query heads × %d): %w", len(a.Q), qd, sh.QHeads, sh.HeadDim, engine.ErrInvalidArgument)
	case a.SeqLen < 1 || int64(a.SeqLen) > int64(maxCallBlocks)*int64(sh.BlockSize):
		return 0, fmt.Errorf("select: seq_len %d not in [1, %d]: %w", a.SeqLen, int64(maxCallBlocks)*int64(sh.BlockSize), engine.ErrInvalidArgument)
	}
	n := (a.SeqLen + sh.BlockSize - 1) / sh.BlockSize
	if len(a.IDs) > n {
		return 0, fmt.Errorf("select: %d block ids for seq_len %d (%d blocks of %d tokens): %w", len(a.IDs), a.SeqLen, n, sh.BlockSize, engine.ErrInvalidArgument)
	}
	for i, v := range a.Q {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return 0, fmt.Errorf("select: query value %d: %v: %w", i, v, engine.ErrInvalidArgument)
		}
	}
	return n, checkIDs("select", a.IDs)
}

// Select runs one selection on the calling goroutine (after the selections submitted before
// for the same request and layer) and returns it; the same as Submit, Wait and Release,
// without a goroutine between the caller and the method.
func (x *Selector) Select(a SelectArgs) (*Selection, error) {
	n, err := x.validate(&a)
	if err != nil {
		return nil, err
	}
	a.Q, a.IDs = slices.Clone(a.Q), slices.Clone(a.IDs)
	t, prev, key, err := x.enqueue(&a)
	if err != nil {
		return nil, err
	}
	x.execute(t, prev, key, &a, n, nil)
	return t.sel, t.err
}

// selectTask is one submitted selection.
type selectTask struct {
	done chan struct{}
	sel  *Selection
	err  error
}

// Submit checks a selection's arguments (bad ones fail the call, naming the field), copies
// them and starts it; it runs after the selections submitted before for the same (request,
// layer), in the background. then, when not nil, is called with the outcome before the task
// counts as done (Check, Wait). Returns the task's handle (> 0), valid until Release.
func (x *Selector) Submit(a SelectArgs, then func(*Selection, error)) (uint64, error) {
	n, err := x.validate(&a)
	if err != nil {
		return 0, err
	}
	a.Q, a.IDs = slices.Clone(a.Q), slices.Clone(a.IDs)
	t, prev, key, err := x.enqueue(&a)
	if err != nil {
		return 0, err
	}
	x.mu.Lock()
	x.next++
	id := x.next
	x.tasks[id] = t
	x.mu.Unlock()
	go x.execute(t, prev, key, &a, n, then)
	return id, nil
}

// enqueue makes a's task the latest of its (request, layer) and returns the one before it
// (nil: none), so that the calls of one pair run in order, as the hooks require.
func (x *Selector) enqueue(a *SelectArgs) (t, prev *selectTask, key string, err error) {
	t = &selectTask{done: make(chan struct{})}
	key = fmt.Sprintf("%s\x00%d", a.Request, a.Layer)
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, nil, "", fmt.Errorf("selector: %w", engine.ErrClosed)
	}
	prev = x.last[key]
	x.last[key] = t
	x.wg.Add(1)
	return t, prev, key, nil
}

// execute runs task t once prev is done, calls then, and marks t done.
func (x *Selector) execute(t, prev *selectTask, key string, a *SelectArgs, n int, then func(*Selection, error)) {
	defer x.wg.Done()
	if prev != nil {
		<-prev.done
	}
	x.sem <- struct{}{}
	t.sel, t.err = x.run(a, n)
	<-x.sem
	if then != nil {
		then(t.sel, t.err)
	}
	x.mu.Lock()
	if x.last[key] == t {
		delete(x.last, key)
	}
	x.mu.Unlock()
	close(t.done)
}

// run is one selection: the method's AttentionBegin on a decode call over an identity block
// table of the context's n blocks.
func (x *Selector) run(a *SelectArgs, n int) (*Selection, error) {
	if err := x.s.check(); err != nil {
		return nil, err
	}
	table := make([]int, n)
	for i := range table {
		table[i] = i
	}
	req := &sparse.Request{ID: a.Request, NumComputedTokens: a.SeqLen, NumOutputTokens: a.Step, BlockTable: table, BlockIDs: a.IDs}
	call := &sparse.Attention{Layer: a.Layer, LayerName: fmt.Sprintf("model.layers.%d.self_attn", a.Layer), Phase: sparse.PhaseDecode,
		Step: a.Step, Request: req, Q: a.Q, BlockTable: table, SeqLen: a.SeqLen}
	if err := x.m.AttentionBegin(call); err != nil {
		return nil, fmt.Errorf("select: request %q, layer %d, step %d: %w", a.Request, a.Layer, a.Step, err)
	}
	out := &Selection{}
	if call.Selected == nil {
		out.Blocks, out.Dense = table, true
	} else {
		out.Blocks = slices.Clone(call.Selected)
		for _, h := range call.HeadSelected {
			out.Heads = append(out.Heads, slices.Clone(h))
		}
	}
	if err := x.m.AttentionFinished(call); err != nil {
		return nil, fmt.Errorf("select: request %q, layer %d: %w", a.Request, a.Layer, err)
	}
	return out, nil
}

func (x *Selector) selectTask(id uint64) (*selectTask, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	t, ok := x.tasks[id]
	if !ok {
		return nil, fmt.Errorf("selection task %d: never submitted or already released: %w", id, ErrUnknownTask)
	}
	return t, nil
}

// Check reports whether selection task id is done, without blocking, and its error if so.
func (x *Selector) Check(id uint64) (bool, error) {
	t, err := x.selectTask(id)
	if err != nil {
		return false, err
	}
	select {
	case <-t.done:
		return true, t.err
	default:
		return false, nil
	}
}

// Wait blocks until selection task id is done and returns its outcome; it does not consume
// the handle (Release does), so it may be called again.
func (x *Selector) Wait(id uint64) (*Selection, error) {
	t, err := x.selectTask(id)
	if err != nil {
		return nil, err
	}
	<-t.done
	return t.sel, t.err
}

// Release waits for selection task id to be done and forgets it: its handle is unknown
// afterwards (ErrUnknownTask).
func (x *Selector) Release(id uint64) error {
	t, err := x.selectTask(id)
	if err != nil {
		return err
	}
	<-t.done
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.tasks[id]; !ok {
		return fmt.Errorf("selection task %d: released by another caller: %w", id, ErrUnknownTask)
	}
	delete(x.tasks, id)
	return nil
}

// RequestFinished forgets the request's state in the method (held selections, lag, pool
// references), after its selections in flight are done.
func (x *Selector) RequestFinished(request string) error {
	if err := x.checkOpen(); err != nil {
		return err
	}
	x.mu.Lock()
	var pending []*selectTask
	prefix := request + "\x00"
	for k, t := range x.last {
		if len(k) > len(prefix) && k[:len(prefix)] == prefix {
			pending = append(pending, t)
		}
	}
	x.mu.Unlock()
	for _, t := range pending {
		<-t.done
	}
	x.m.RequestFinished(request)
	return nil
}
