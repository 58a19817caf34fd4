package kernels

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/ucm-go/ucm/internal/memcopy"
)

// GatherBlocks enqueues on s the copy of whole blocks from the caches into dst (device to
// host), block-major: block blocks[j]'s record (Record().BlockBytes() bytes) at
// dst[j·BlockBytes], its layer l shard at +l·ShardBytes, each in the RecordLayout. That is the
// buffer engine.Dump takes per block. len(dst) must be exactly len(blocks)·BlockBytes. Ids may
// repeat (each occurrence gets its copy). Bad ids (ErrOutOfRange) and sizes (ErrInvalid) are
// reported here and enqueue nothing; dst must not be read or released until the stream has
// run the copy.
func (p *PagedKV) GatherBlocks(s *Stream, blocks []int, dst []byte) error {
	return p.transfer(s, true, -1, blocks, dst, xferHooks{})
}

// ScatterBlocks enqueues on s the reverse of GatherBlocks: src holds len(blocks) whole
// records, block-major, copied into the caches (host to device). An id may appear only once
// (ErrInvalid otherwise).
func (p *PagedKV) ScatterBlocks(s *Stream, blocks []int, src []byte) error {
	return p.transfer(s, false, -1, blocks, src, xferHooks{})
}

// GatherLayer enqueues on s the copy of one layer's shard of many blocks into dst,
// layer-major: block blocks[j]'s shard (Record().ShardBytes bytes) at dst[j·ShardBytes], what
// a layer-wise dump (engine.DumpShard) takes. len(dst) must be exactly len(blocks)·ShardBytes;
// ids may repeat.
func (p *PagedKV) GatherLayer(s *Stream, layer int, blocks []int, dst []byte) error {
	if layer < 0 || layer >= len(p.layers) {
		return errorf(ErrOutOfRange, "gather: layer %d outside [0, %d)", layer, len(p.layers))
	}
	return p.transfer(s, true, layer, blocks, dst, xferHooks{})
}

// ScatterLayer enqueues on s the reverse of GatherLayer: src holds one layer's shard of
// len(blocks) blocks, layer-major, as engine.LoadShard fills it. An id may appear only once.
func (p *PagedKV) ScatterLayer(s *Stream, layer int, blocks []int, src []byte) error {
	if layer < 0 || layer >= len(p.layers) {
		return errorf(ErrOutOfRange, "scatter: layer %d outside [0, %d)", layer, len(p.layers))
	}
	return p.transfer(s, false, layer, blocks, src, xferHooks{})
}

// xitem is one block shard's copy (or, for single-run templates, one coalesced run): src is
// the byte offset in the layer's memory, dst the offset in the host buffer, n its bytes.
type xitem struct {
	layer int32
	src   int64
	dst   int64
	n     int64
}

// maxRun caps coalesced runs so a large copy still splits across CopyThreads.
const maxRun = 1 << 20

var itemPool = sync.Pool{New: func() any { s := make([]xitem, 0, 256); return &s }}

// xferHooks attach stream semantics to a transfer's operation: wait for a recorded point
// first, and notify when done (called exactly once when the enqueue succeeds, never when it
// fails).
type xferHooks struct {
	wait   *streamMark
	notify func(error)
}

// transfer plans and enqueues a gather (d2h) or scatter of one layer (layer ≥ 0) or all
// layers (layer < 0, block-major).
func (p *PagedKV) transfer(s *Stream, d2h bool, layer int, blocks []int, host []byte, hooks xferHooks) error {
	verb := "scatter"
	if d2h {
		verb = "gather"
	}
	if s == nil || s.dev != p.dev {
		return errorf(ErrInvalid, "%s: stream of another device", verb)
	}
	if err := p.checkBlocks(blocks, !d2h); err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	lo, hi := 0, len(p.layers)
	per := p.rec.BlockBytes()
	if layer >= 0 {
		lo, hi = layer, layer+1
		per = p.rec.ShardBytes
	}
	if int64(len(host)) != int64(len(blocks))*per {
		return errorf(ErrInvalid, "%s: host buffer of %d bytes for %d blocks of %d bytes", verb, len(host), len(blocks), per)
	}
	if len(blocks) == 0 {
		if hooks.wait != nil || hooks.notify != nil {
			return s.enqueue(streamOp{name: verb + " of no blocks", wait: hooks.wait, notify: hooks.notify})
		}
		return nil
	}
	mems := make([][]byte, len(p.layers))
	for l := lo; l < hi; l++ {
		b, err := p.layers[l].mem.bytesFor(p.dev)
		if err != nil {
			return fmt.Errorf("%s: layer %d (%q): %w", verb, l, p.layers[l].name, err)
		}
		mems[l] = b
	}

	ip := itemPool.Get().(*[]xitem)
	items := (*ip)[:0]
	flat := len(p.tmpl.loops) == 0
	for j, b := range blocks {
		for l := lo; l < hi; l++ {
			src := p.layers[l].off + int64(b)*p.blockStride + p.headOff
			dst := int64(j)*per + int64(l-lo)*p.rec.ShardBytes
			if !flat {
				items = append(items, xitem{layer: int32(l), src: src, dst: dst, n: p.rec.ShardBytes})
				continue
			}
			// A single run per shard: coalesce with the previous run when both sides continue
			// it (FlashInfer and MLA with consecutive ids, whole blocks), and split long runs.
			for n := p.rec.ShardBytes; n > 0; {
				k := len(items) - 1
				if k >= 0 && items[k].layer == int32(l) && items[k].src+items[k].n == src && items[k].dst+items[k].n == dst && items[k].n < maxRun {
					add := min(n, maxRun-items[k].n)
					items[k].n += add
					src, dst, n = src+add, dst+add, n-add
					continue
				}
				c := min(n, maxRun)
				items = append(items, xitem{layer: int32(l), src: src, dst: dst, n: c})
				src, dst, n = src+c, dst+c, n-c
			}
		}
	}
	*ip = items
	total := int64(len(host))
	tmpl := &p.tmpl
	// Large operations write around the caches, as one large memcpy would (memcopy.Stream).
	stream := total >= memcopy.MinOp && p.tmpl.run >= memcopy.MinRun
	run := func() error {
		defer func() {
			*ip = (*ip)[:0]
			itemPool.Put(ip)
		}()
		p.dev.parallel(total, len(items), func(a, b int) {
			if d2h && (flat || tmpl.offs != nil && tmpl.run >= pfMinRun) {
				q := runSeq{items: items[a:b], offs: tmpl.offs, run: tmpl.run}
				if flat {
					q.offs = nil
				}
				q.gatherAhead(mems, host, stream)
				if stream {
					memcopy.Fence()
				}
				return
			}
			for _, it := range items[a:b] {
				mem := mems[it.layer]
				switch {
				case flat && d2h && stream:
					memcopy.Stream(host[it.dst:it.dst+it.n], mem[it.src:it.src+it.n])
				case flat && d2h:
					copy(host[it.dst:it.dst+it.n], mem[it.src:it.src+it.n])
				case flat && stream:
					memcopy.Stream(mem[it.src:it.src+it.n], host[it.dst:it.dst+it.n])
				case flat:
					copy(mem[it.src:it.src+it.n], host[it.dst:it.dst+it.n])
				default:
					tmpl.copy(mem, host, it.src, it.dst, d2h, stream)
				}
			}
			if stream {
				memcopy.Fence() // this goroutine's non-temporal stores, before the op completes
			}
		})
		return nil
	}
	name := verb + " of " + strconv.Itoa(len(blocks)) + " blocks"
	if layer >= 0 {
		name = verb + " of layer " + strconv.Itoa(layer) + ", " + strconv.Itoa(len(blocks)) + " blocks"
	}
	dir := linkH2D
	if d2h {
		dir = linkD2H
	}
	if err := s.enqueue(streamOp{name: name, dir: dir, bytes: total, pins: pinHost(host), run: run, wait: hooks.wait, notify: hooks.notify}); err != nil {
		*ip = items[:0]
		itemPool.Put(ip)
		return fmt.Errorf("%s: %w", verb, err)
	}
	return nil
}

// copy copies one block shard between the cache (mem, the shard at src) and the record (host,
// the shard at dst) run by run: through the table of run offsets when the template has one,
// else walking its loops. With stream, runs are copied with memcopy.Stream (the caller fences).
func (t *copyTemplate) copy(mem, host []byte, src, dst int64, d2h, stream bool) {
	n := t.run
	if t.offs == nil {
		t.walk(mem, host, src, dst, 0, d2h)
		return
	}
	// Slice both shards once so that each run's bounds checks are against short slices.
	ms, hs := mem[src:], host[dst:]
	switch {
	case stream && d2h:
		for _, o := range t.offs {
			memcopy.Stream(hs[o.dst:o.dst+n], ms[o.src:o.src+n])
		}
		return
	case stream:
		for _, o := range t.offs {
			memcopy.Stream(ms[o.src:o.src+n], hs[o.dst:o.dst+n])
		}
		return
	}
	if d2h {
		for _, o := range t.offs {
			copy(hs[o.dst:o.dst+n], ms[o.src:o.src+n])
		}
		return
	}
	for _, o := range t.offs {
		copy(ms[o.src:o.src+n], hs[o.dst:o.dst+n])
	}
}

// walk runs the copyTemplate's loops from loop k for one block shard at src (device) and dst
// (host); the innermost loop is iterated here rather than recursed into.
func (t *copyTemplate) walk(mem, host []byte, src, dst int64, k int, d2h bool) {
	n := t.run
	if k == len(t.loops) {
		if d2h {
			copy(host[dst:dst+n], mem[src:src+n])
		} else {
			copy(mem[src:src+n], host[dst:dst+n])
		}
		return
	}
	l := t.loops[k]
	if k < len(t.loops)-1 {
		for i := int64(0); i < l.n; i++ {
			t.walk(mem, host, src+i*l.src, dst+i*l.dst, k+1, d2h)
		}
		return
	}
	for i := int64(0); i < l.n; i++ {
		s, d := src+i*l.src, dst+i*l.dst
		if d2h {
			copy(host[d:d+n], mem[s:s+n])
		} else {
			copy(mem[s:s+n], host[d:d+n])
		}
	}
}
