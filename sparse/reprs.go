package sparse

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
)

// Scoring from rows. A candidate's part (one layer of one block's sidecar) is verified once and
// kept as a *row*: the part's data in the form the scoring kernels read in place.
//
//   - fp16 sidecars (the default): the part's data bytes as stored (header dropped), so the
//     kernels convert fp16 with F16C while they multiply (kernels.DotsF16 and friends);
//   - bfloat16 and float32 sidecars: the values converted to float32 once;
//   - ESA with repr_dtype int8: the values quantized to int8 with one scale per part
//     (symmetric, per tensor: sources §2's int8 storage without the source's out-of-range zero
//     point 128).
//
// KVStar rows keep the channel table in front of the values; hash rows are the codes.
//
// Rows live in the method's representation pool (sources §2's pool: [entries][row] per layer, a
// block id → entry map, a free list), so a decode step scans the rows of blocks seen at earlier
// steps in place, without loading, copying or verifying them again: a block's sidecar does not
// change once stored (the id is its content's). A request holds references on the entries of
// its blocks until RequestFinished; unreferenced entries stay cached (a later request with the
// same prefix finds them) and are reclaimed oldest first when the pool is full. When every
// entry is referenced the pool is exhausted: the candidates that find no entry are loaded and
// scored from a scratch row at every step, as without a pool (SelectStats.Uncached).

// rowKind is the element form of a method's rows.
type rowKind uint8

const (
	rowF16  rowKind = iota // the stored fp16 bytes
	rowF32                 // float32 (from bfloat16 or float32 sidecars)
	rowInt8                // int8 and a scale (ESA repr_dtype int8)
)

// rowFormat returns the row kind and bytes of a method's rows for its sidecar spec.
func rowFormat(spec kernels.SidecarSpec, int8Rows bool) (rowKind, int) {
	values := spec.Rows() * spec.Heads * spec.Cols()
	chBytes := 0
	if spec.Kind == kernels.SidecarKVStar {
		chBytes = (2*spec.Heads*spec.Cols() + 7) &^ 7
	}
	switch {
	case spec.Kind == kernels.SidecarHash:
		return rowF16, values // codes, kind unused
	case int8Rows:
		return rowInt8, (values + 7) &^ 7
	case spec.Elem == kernels.Float16:
		return rowF16, spec.PartBytes() - kernels.SidecarHeaderSize
	}
	return rowF32, chBytes + 4*values
}

// f32Row views a float32 row's values (written by fillRow through the same view).
func f32Row(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// i8Row views an int8 row.
func i8Row(b []byte) []int8 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int8)(unsafe.Pointer(&b[0])), len(b))
}

// fillRow verifies one candidate's part (header CRC, the method's spec and encoders, the
// layer, the data and its zero padding) and writes its row; aux is the rows of data the block
// has (KVStar's merged rows, hash tokens), scale the int8 scale. false: the part is unusable.
func (m *blockMethod) fillRow(st *stepState, layer int, part, row []byte) (aux int32, scale float32, ok bool) {
	h, l, err := kernels.DecodeSidecarHeader(part)
	if err != nil || l != layer || h.SidecarSpec != m.spec || m.encs != nil && h.Fingerprint != m.fp || h.Tokens < 1 {
		return 0, 0, false
	}
	data := part[kernels.SidecarHeaderSize:]
	values := h.Rows() * h.Heads * h.Cols()
	switch {
	case h.Kind == kernels.SidecarHash || m.rowKind == rowF16:
		if _, _, err := kernels.DecodeSidecarPart(part, nil, nil); err != nil {
			return 0, 0, false
		}
		copy(row, data[:len(row)])
	default:
		st.vals = resize(st.vals, values)
		var ch []uint16
		if h.Kind == kernels.SidecarKVStar {
			st.ch = resize(st.ch, h.Heads*h.Cols())
			ch = st.ch
		}
		if _, _, err := kernels.DecodeSidecarPart(part, st.vals, ch); err != nil {
			return 0, 0, false
		}
		for _, v := range st.vals {
			if v != v || math.IsInf(float64(v), 0) {
				return 0, 0, false
			}
		}
		if m.rowKind == rowInt8 {
			scale = quantizeInt8(i8Row(row)[:values], st.vals)
			break
		}
		off := 0
		if ch != nil {
			off = (2*len(ch) + 7) &^ 7
			for i, c := range ch {
				binary.LittleEndian.PutUint16(row[2*i:], c)
			}
		}
		copy(f32Row(row[off:]), st.vals)
	}
	return int32(h.ValidRows()), scale, true
}

// quantizeInt8 writes v/scale rounded to the nearest int8 (ties away from zero) and returns
// scale = max|v|/127 (1 for an all-zero v): symmetric per-tensor quantization.
func quantizeInt8(dst []int8, v []float32) float32 {
	var mx float32
	for _, x := range v {
		mx = max(mx, float32(math.Abs(float64(x))))
	}
	if mx == 0 {
		clear(dst)
		return 1
	}
	scale := mx / 127
	for i, x := range v {
		dst[i] = int8(max(-127, min(127, math.Round(float64(x/scale)))))
	}
	return scale
}

// scoreRow scores one candidate's row (higher is better); it fills st.perHead when set.
func (m *blockMethod) scoreRow(st *stepState, row []byte, aux int32, scale float32) float64 {
	s := m.shape
	d, hq, hkv := s.HeadDim, s.QHeads, s.KVHeads
	g := hq / hkv
	st.tmp = resize(st.tmp, max(hq, m.spec.Rows()))
	switch m.spec.Kind {
	case kernels.SidecarESAMean, kernels.SidecarESAMax:
		if m.gsa {
			return m.gsaRow(st, row)
		}
		if st.perHead != nil { // per query head: q_h · r_{kv(h)}, one call per KV head's group
			groups, n, vs := hkv, g, 0
			if g == 1 {
				groups, n, vs = 1, hq, d // one call over every head
			}
			for kv := range groups {
				out := st.perHead[kv*n : (kv+1)*n]
				q := st.q[kv*n*d : (kv+1)*n*d]
				switch m.rowKind {
				case rowF16:
					_ = kernels.DotsF16(out, q, row[2*kv*d:], d, d, vs)
				case rowInt8:
					_ = kernels.DotsInt8(out, q, i8Row(row)[kv*d:], d, d, vs)
				default:
					dotsF32(out, q, f32Row(row)[kv*d:], d, d, vs)
				}
			}
			sc := scale1(m.rowKind, scale) * m.logitScale()
			for i, x := range st.perHead {
				st.perHead[i] = x * sc
			}
			return 0
		}
		if st.perKV != nil { // per KV head: q̄_h · r_h
			out := st.tmp[:hkv]
			switch m.rowKind {
			case rowF16:
				_ = kernels.DotsF16(out, st.qr, row, d, d, d)
			case rowInt8:
				_ = kernels.DotsInt8(out, st.qr, i8Row(row), d, d, d)
			default:
				dotsF32(out, st.qr, f32Row(row), d, d, d)
			}
			var sum float64
			for h, x := range out {
				st.perKV[h] = float64(x) * float64(scale1(m.rowKind, scale))
				sum += st.perKV[h]
			}
			return sum
		}
		out := st.tmp[:1]
		switch m.rowKind {
		case rowF16:
			_ = kernels.DotsF16(out, st.qr, row, hkv*d, 0, 0)
		case rowInt8:
			_ = kernels.DotsInt8(out, st.qr, i8Row(row), hkv*d, 0, 0)
			return float64(out[0]) * float64(scale)
		default:
			dotsF32(out, st.qr, f32Row(row), hkv*d, 0, 0)
		}
		return float64(out[0])
	case kernels.SidecarQuest:
		if m.rowKind == rowF16 {
			n := 2 * hkv * d // bytes of the minima
			groups, gn, vs := hkv, g, 0
			if g == 1 {
				groups, gn, vs = 1, hq, d // one call over every head
			}
			for kv := range groups {
				_ = kernels.QuestBoundsF16(st.tmp[kv*gn:(kv+1)*gn], st.q[kv*gn*d:(kv+1)*gn*d], row[2*kv*d:], row[n+2*kv*d:], d, d, vs)
			}
		} else {
			v := f32Row(row)
			for qh := range hq {
				kv := qh / g
				st.tmp[qh] = kernels.QuestBound(st.q[qh*d:(qh+1)*d], v[kv*d:(kv+1)*d], v[(hkv+kv)*d:(hkv+kv+1)*d])
			}
		}
		var sum float64
		ls := m.logitScale()
		for i, b := range st.tmp[:hq] {
			if st.perHead != nil {
				st.perHead[i] = b * ls
			}
			sum += float64(b)
		}
		if st.perKV != nil {
			clear(st.perKV)
			for i, b := range st.tmp[:hq] {
				st.perKV[i/g] += float64(b)
			}
		}
		return sum
	case kernels.SidecarKVStar:
		return m.kvstarRow(st, row, int(aux))
	case kernels.SidecarHash:
		w := len(st.codes)
		if st.perKV != nil {
			return m.hashRowPerKV(st, row, int(aux))
		}
		var minD, total int
		var err error
		if m.mlaReduce > 0 {
			w = st.mla.Width()
			minD, total, err = st.mla.Rows(row, int(aux))
		} else {
			minD, total, err = kernels.HammingRows(st.codes, row, int(aux))
		}
		if err != nil || aux < 1 || int(aux)*w > len(row) {
			return math.NaN()
		}
		if m.meanDist {
			return -float64(total) / float64(aux)
		}
		return -float64(minD)
	}
	return math.NaN()
}

func scale1(k rowKind, scale float32) float32 {
	if k == rowInt8 {
		return scale
	}
	return 1
}

// gsaRow: −Σ_h ‖q̄_h − r_h‖₂ (sources §3A, the active code).
func (m *blockMethod) gsaRow(st *stepState, row []byte) float64 {
	d, hkv := m.shape.HeadDim, m.shape.KVHeads
	out := st.tmp[:hkv]
	if m.rowKind == rowF16 {
		_ = kernels.SqDistsF16(out, st.qr, row, d, d, d)
	} else {
		v := f32Row(row)
		for h := range hkv {
			var s float32
			for i := h * d; i < (h+1)*d; i++ {
				e := st.qr[i] - v[i]
				s += e * e
			}
			out[h] = s
		}
	}
	var sum float64
	for h, x := range out {
		if st.perKV != nil {
			st.perKV[h] = -math.Sqrt(float64(x))
		}
		sum += math.Sqrt(float64(x))
	}
	return -sum
}

// hashRowPerKV is the hash score per KV head (head_select kv): −(the minimum, or mean, over the
// block's tokens of Hamming(q_h, k_{t,h})), written to st.perKV; it returns their sum.
func (m *blockMethod) hashRowPerKV(st *stepState, row []byte, tokens int) float64 {
	hkv := m.shape.KVHeads
	c := len(st.codes) / hkv
	w := len(st.codes)
	if tokens < 1 || tokens*w > len(row) {
		return math.NaN()
	}
	var sum float64
	for h := range hkv {
		q := st.codes[h*c : (h+1)*c]
		best, total := math.MaxInt, 0
		for t := range tokens {
			dist := kernels.Hamming(q, row[t*w+h*c:t*w+(h+1)*c])
			best, total = min(best, dist), total+dist
		}
		v := -float64(best)
		if m.meanDist {
			v = -float64(total) / float64(tokens)
		}
		st.perKV[h] = v
		sum += v
	}
	return sum
}

// kvstarRow: Σ_h max_m q̄_h[channels_h]·row_{m,h} (sources §5 [DECISION]) over the block's rows.
// With head_score softmax (st.perHead set) it writes, per query head h, the log-sum-exp over
// the rows of the logits q_h[channels]·row/√D, so that the softmax over candidates gives each
// block its share of Σ_rows exp over every candidate's rows.
func (m *blockMethod) kvstarRow(st *stepState, row []byte, rows int) float64 {
	d, heads, dk := m.shape.HeadDim, m.spec.Heads, m.spec.Cols()
	off := (2*heads*dk + 7) &^ 7
	st.qg = resize(st.qg, dk)
	out := st.tmp[:rows]
	if st.perHead != nil {
		g, ls := m.shape.QHeads/heads, m.logitScale()
		for qh := range m.shape.QHeads {
			if !m.kvstarDots(st, out, row, st.q[qh*d:(qh+1)*d], qh/g, off) {
				return math.NaN()
			}
			mx := [1]float32{float32(math.Inf(-1))}
			for i, x := range out {
				out[i] = x * ls
				if out[i] > mx[0] { // NaN is no maximum (and adds no attention below)
					mx[0] = out[i]
				}
			}
			if math.IsInf(float64(mx[0]), -1) {
				st.perHead[qh] = mx[0]
				continue
			}
			z := [1]float32{}
			_ = kernels.ExpColumns(out, mx[:], z[:])
			st.perHead[qh] = mx[0] + float32(math.Log(float64(z[0])))
		}
		return 0
	}
	var sum float64
	for hd := range heads {
		if !m.kvstarDots(st, out, row, st.qr[hd*d:(hd+1)*d], hd, off) {
			return math.NaN()
		}
		best := float32(math.Inf(-1))
		for _, x := range out {
			best = max(best, x)
		}
		if st.perKV != nil {
			st.perKV[hd] = float64(best)
		}
		sum += float64(best)
	}
	return sum
}

// kvstarDots writes into out, for each of the block's rows, the dot product of KV head hd's
// kept channels of q (gathered through the row's channel list into st.qg) with the row's
// values of that head; payload is the rows' offset in row. False when the row names a channel
// beyond the head's dimension.
func (m *blockMethod) kvstarDots(st *stepState, out []float32, row []byte, q []float32, hd, payload int) bool {
	d, heads, dk := m.shape.HeadDim, m.spec.Heads, m.spec.Cols()
	ch := row[2*hd*dk : 2*(hd+1)*dk]
	for j := range st.qg {
		c := int(binary.LittleEndian.Uint16(ch[2*j:]))
		if c >= d {
			return false
		}
		st.qg[j] = q[c]
	}
	if m.rowKind == rowF16 {
		_ = kernels.DotsF16(out, st.qg, row[payload+2*hd*dk:], dk, 0, heads*dk)
	} else {
		dotsF32(out, st.qg, f32Row(row[payload:])[hd*dk:], dk, 0, heads*dk)
	}
	return true
}

// dotsF32 is kernels.DotsF16's loop over float32 values (rows of bfloat16 and float32
// sidecars; lengths checked by the caller's row format).
func dotsF32(out, q, v []float32, d, qs, vs int) {
	for i := range out {
		qq, vv := q[i*qs:i*qs+d], v[i*vs:i*vs+d]
		var s float32
		for j, x := range qq {
			s += x * vv[j]
		}
		out[i] = s
	}
}

// ---------------------------------------------------------------------------------------------
// The representation pool.

// DefaultReprPoolBytes is the bytes of rows a method keeps when Env.ReprPoolBytes is 0.
const DefaultReprPoolBytes = 1 << 30

// poolChunk is the entries allocated together in one layer.
const poolChunk = 64

type reprPool struct {
	rowBytes, layers, capacity int

	mu    sync.Mutex
	index map[engine.BlockID]int32
	ids   []engine.BlockID // by entry
	refs  []int32
	idle  []int32    // entries whose references dropped to 0, oldest first (may hold stale ones)
	rows  [][][]byte // [layer][chunk] poolChunk rows
	valid [][]bool   // [layer][entry]
	aux   [][]int32
	scale [][]float32
	reqs  map[string]*poolReq
	// reclaimed counts entries given to another block.
	reclaimed int64
}

// poolReq is a request's entries by logical block.
type poolReq struct {
	ids []engine.BlockID
	ent []int32 // -1: none (the pool was full)
}

func newReprPool(rowBytes, layers int, bytes int64) *reprPool {
	if bytes < 0 || rowBytes < 1 {
		return nil
	}
	if bytes == 0 {
		bytes = DefaultReprPoolBytes
	}
	c := bytes / int64(rowBytes) / int64(layers)
	if c < 1 {
		return nil
	}
	return &reprPool{rowBytes: rowBytes, layers: layers, capacity: int(min(c, math.MaxInt32)),
		index: map[engine.BlockID]int32{}, rows: make([][][]byte, layers), valid: make([][]bool, layers),
		aux: make([][]int32, layers), scale: make([][]float32, layers), reqs: map[string]*poolReq{}}
}

// acquire sets ent[j] to the entry of the candidate at logical block pos[j] of the request
// (ids[pos[j]] its id), taking the request's reference on entries new to it; -1 when the pool
// is full. It sets need[j] when the entry's row of layer is not filled yet.
func (p *reprPool) acquire(reqID string, ids []engine.BlockID, pos []int, layer int, ent []int32, need []bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.reqs[reqID]
	if r == nil {
		r = &poolReq{}
		p.reqs[reqID] = r
	}
	for j, i := range pos {
		for len(r.ent) <= i {
			r.ent = append(r.ent, -1)
			r.ids = append(r.ids, engine.BlockID{})
		}
		e := r.ent[i]
		if e >= 0 && r.ids[i] != ids[i] { // the request's block changed: let the old entry go
			p.release(e)
			e, r.ent[i] = -1, -1
		}
		if e < 0 {
			e = p.entry(ids[i])
			if e >= 0 {
				p.refs[e]++
				r.ent[i], r.ids[i] = e, ids[i]
			}
		}
		ent[j] = e
		need[j] = e >= 0 && !p.valid[layer][e]
	}
}

// entry returns the block's entry, allocating one (a new one, or the oldest unreferenced
// one's) when it has none; -1 when the pool is full.
func (p *reprPool) entry(id engine.BlockID) int32 {
	if e, ok := p.index[id]; ok {
		return e
	}
	var e int32 = -1
	if len(p.ids) < p.capacity {
		e = int32(len(p.ids))
		p.ids, p.refs = append(p.ids, id), append(p.refs, 0)
		for l := range p.layers {
			p.valid[l], p.aux[l], p.scale[l] = append(p.valid[l], false), append(p.aux[l], 0), append(p.scale[l], 0)
		}
	} else {
		for len(p.idle) > 0 {
			c := p.idle[0]
			p.idle = p.idle[1:]
			if p.refs[c] == 0 && p.index[p.ids[c]] == c {
				e = c
				break
			}
		}
		if e < 0 {
			return -1
		}
		delete(p.index, p.ids[e])
		p.ids[e] = id
		for l := range p.layers {
			p.valid[l][e] = false
		}
		p.reclaimed++
	}
	p.index[id] = e
	return e
}

func (p *reprPool) release(e int32) {
	p.refs[e]--
	if p.refs[e] == 0 {
		p.idle = append(p.idle, e)
		if len(p.idle) > 2*len(p.ids)+64 {
			p.compactIdle()
		}
	}
}

// compactIdle drops the idle list's stale entries (referenced again, or released more than
// once: the last release counts), keeping the order of the rest, so the list stays within
// the number of entries however many requests come and go.
func (p *reprPool) compactIdle() {
	seen := make([]bool, len(p.ids))
	out := p.idle[:0:0]
	for i := len(p.idle) - 1; i >= 0; i-- {
		e := p.idle[i]
		if !seen[e] && p.refs[e] == 0 {
			seen[e] = true
			out = append(out, e)
		}
	}
	slices.Reverse(out)
	p.idle = out
}

// finish drops a request's references.
func (p *reprPool) finish(reqID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.reqs[reqID]
	if r == nil {
		return
	}
	for _, e := range r.ent {
		if e >= 0 {
			p.release(e)
		}
	}
	delete(p.reqs, reqID)
}

// row returns entry e's row of layer, allocating its chunk; p.mu held.
func (p *reprPool) row(layer int, e int32) []byte {
	c := int(e) / poolChunk
	for len(p.rows[layer]) <= c {
		p.rows[layer] = append(p.rows[layer], nil)
	}
	if p.rows[layer][c] == nil {
		p.rows[layer][c] = make([]byte, poolChunk*p.rowBytes)
	}
	o := (int(e) % poolChunk) * p.rowBytes
	return p.rows[layer][c][o : o+p.rowBytes : o+p.rowBytes]
}

// PoolStats describes a method's representation pool.
type PoolStats struct {
	// Entries is the blocks with an entry, Capacity the most there can be; Referenced those held
	// by live requests; Reclaimed the entries given to another block so far.
	Entries, Capacity, Referenced int
	Reclaimed                     int64
	// RowBytes is one layer's row of one block.
	RowBytes int
}

// PoolStats returns the representation pool's state (zero when the method has none).
func (m *blockMethod) PoolStats() PoolStats {
	p := m.pool
	if p == nil {
		return PoolStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PoolStats{Entries: len(p.index), Capacity: p.capacity, Reclaimed: p.reclaimed, RowBytes: p.rowBytes}
	for _, r := range p.refs {
		if r > 0 {
			s.Referenced++
		}
	}
	return s
}

// scoreCandidates scores the candidates st.pos of a decode step of layer into st.scores: from
// the pool's rows (filling the rows of blocks not seen yet with one LoadSidecars call), or
// from scratch rows when the method has no pool or the pool is full. Missing and unusable
// sidecars score +Inf.
func (m *blockMethod) scoreCandidates(st *stepState, a *Attention) error {
	req, layer := a.Request, a.Layer
	nc := len(st.pos)
	st.ent, st.need = resize(st.ent, nc), resize(st.need, nc)
	st.rowRefs, st.aux, st.scale = resize(st.rowRefs, nc), resize(st.aux, nc), resize(st.scale, nc)
	if m.pool != nil {
		m.pool.acquire(req.ID, req.BlockIDs, st.pos, layer, st.ent, st.need)
	} else {
		for j := range st.ent {
			st.ent[j], st.need[j] = -1, false
		}
	}
	// One load for the rows to fill and the candidates without an entry.
	st.ids, st.loadIdx = st.ids[:0], st.loadIdx[:0]
	for j, i := range st.pos {
		if st.need[j] || st.ent[j] < 0 {
			st.ids = append(st.ids, req.BlockIDs[i])
			st.loadIdx = append(st.loadIdx, j)
		}
	}
	ok := resize(st.ok, nc)
	st.ok = ok
	for j := range ok {
		ok[j] = st.ent[j] >= 0 && !st.need[j]
	}
	if len(st.ids) > 0 {
		pb := m.spec.PartBytes()
		st.parts = resize(st.parts, len(st.ids)*pb) // LoadSidecars writes every byte
		found, err := m.src.LoadSidecars(engine.SidecarKind(m.spec.Kind), layer, st.ids, st.parts)
		if err != nil {
			return fmt.Errorf("%s: layer %d: load %v sidecars of %d blocks: %w", m.name, layer, m.spec.Kind, len(st.ids), err)
		}
		// Uncached candidates get scratch rows; rows to fill are converted into scratch too and
		// copied into the pool under its lock.
		st.scratch = resize(st.scratch, len(st.ids)*m.rowBytes)
		for x, j := range st.loadIdx {
			if !found[x] {
				continue
			}
			row := st.scratch[x*m.rowBytes : (x+1)*m.rowBytes]
			aux, scale, good := m.fillRow(st, layer, st.parts[x*pb:(x+1)*pb], row)
			if good {
				st.rowRefs[j], st.aux[j], st.scale[j], ok[j] = row, aux, scale, true
			}
		}
		if m.pool != nil {
			p := m.pool
			p.mu.Lock()
			for _, j := range st.loadIdx {
				if e := st.ent[j]; e >= 0 && ok[j] && !p.valid[layer][e] {
					copy(p.row(layer, e), st.rowRefs[j])
					p.aux[layer][e], p.scale[layer][e], p.valid[layer][e] = st.aux[j], st.scale[j], true
				}
			}
			p.mu.Unlock()
		}
	}
	if m.pool != nil {
		p := m.pool
		p.mu.Lock()
		for j, e := range st.ent {
			if e >= 0 && !st.need[j] {
				st.rowRefs[j], st.aux[j], st.scale[j] = p.row(layer, e), p.aux[layer][e], p.scale[layer][e]
			}
		}
		p.mu.Unlock()
	}
	hq := m.shape.QHeads
	if m.softmaxHeads {
		st.heads = resize(st.heads, nc*hq)
		st.mx, st.z = resize(st.mx, hq), resize(st.z, hq)
		for h := range st.mx {
			st.mx[h] = float32(math.Inf(-1))
		}
	}
	uncached, n, hkv := 0, len(st.scores), m.shape.KVHeads
	if m.perKV && !m.softmaxHeads {
		st.kvTmp = resize(st.kvTmp, hkv)
		st.perKV = st.kvTmp
	}
	for j, i := range st.pos {
		if st.ent[j] < 0 {
			uncached++
		}
		s := math.Inf(1)
		if m.softmaxHeads {
			st.perHead = st.heads[j*hq : (j+1)*hq]
		}
		if ok[j] {
			if v := m.scoreRow(st, st.rowRefs[j], st.aux[j], st.scale[j]); v == v {
				s = v
				if st.perKV != nil {
					for h, x := range st.perKV {
						st.kvScores[h*n+i] = x
					}
				}
			}
		}
		if m.softmaxHeads { // the heads' maxima, in the scan; an unscored row adds nothing
			if math.IsInf(s, 1) {
				for h := range st.perHead {
					st.perHead[h] = float32(math.Inf(-1))
				}
			} else {
				for h, x := range st.perHead {
					if x > st.mx[h] { // NaN is no maximum
						st.mx[h] = x
					}
				}
			}
		}
		if math.IsInf(s, 1) {
			m.stats.missing.Add(1)
		}
		st.scores[i] = s
	}
	m.stats.uncached.Add(int64(uncached))
	if m.softmaxHeads {
		m.softmaxScores(st)
	}
	st.perHead, st.perKV = nil, nil
	return nil
}

// logitScale is 1/√D: a query head's score of a block times it is its attention logit.
func (m *blockMethod) logitScale() float32 {
	return float32(1 / math.Sqrt(float64(m.shape.HeadDim)))
}
