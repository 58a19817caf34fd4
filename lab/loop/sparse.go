package loop

import (
	"fmt"
	"time"

	"github.com/ucm-go/ucm/lab/model"
	"github.com/ucm-go/ucm/sparse"
)

// Sparse decoding with offloaded KV: the request's stored blocks leave the device (their K/V
// in the paged cache are cleared, as a device that keeps only a working set would free them),
// and every decode layer attends the blocks a sparse-attention method selects, whose shards
// the method's prefetch engine loads from the store (sparse.Env.Blocks) and which are copied
// into their cache blocks just before the layer's attention. A block that fails to load is left
// out of the step (the method reports it). Blocks computed since the last store stay on the
// device.

// SparseEnv is the sparse.Env a method needs to decode with this server: its model shape, the
// store as sidecar source and as block loader, and one layer's shard size. ErrInvalid without a
// store.
func (s *Server) SparseEnv() (sparse.Env, error) {
	if s.store == nil {
		return sparse.Env{}, fmt.Errorf("%w: sparse decoding loads blocks from a store", ErrInvalid)
	}
	c := s.cfg
	return sparse.Env{Role: sparse.RoleWorker, Sidecars: s.store, Blocks: sparse.EngineBlocks{Engine: s.store},
		ShardBytes: int(s.store.Layout().ShardBytes),
		Shape:      sparse.Shape{Layers: c.Layers, QHeads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, BlockSize: s.opts.BlockSize}}, nil
}

// SparseDecodeStats says what a sparse decode did.
type SparseDecodeStats struct {
	// Steps is the tokens decoded; Offloaded the stored blocks cleared from the device.
	Steps, Offloaded int
	// Attended is the stored block shards attended (all layers), Loaded those copied in from the
	// method's cache; LoadFailed the shards left out because their load failed, LoadErr the
	// first of their errors.
	Attended, Loaded, LoadFailed int
	LoadErr                      error
	// Stall is the time the steps waited for loads (the method's prefetcher).
	Stall time.Duration
}

// DecodeSparse generates n tokens greedily after the request's last position, as Decode, with
// method m (built with SparseEnv) choosing and loading each layer's blocks. Unless
// keepResident, the request's stored blocks are first cleared from the device, so every stored
// block a step attends is the one the store gave back; with keepResident nothing is cleared:
// the loaded bytes are still copied in (they must equal the device's), the reference a decode
// with offloading must match token for token.
func (s *Server) DecodeSparse(r *Request, n int, m sparse.SparseMethod, keepResident bool) (out []byte, st SparseDecodeStats, err error) {
	if r.done {
		return nil, st, fmt.Errorf("%w: request finished", ErrInvalid)
	}
	if s.store == nil || m == nil {
		return nil, st, fmt.Errorf("%w: sparse decoding needs a store and a method", ErrInvalid)
	}
	pf, _ := m.(interface{ Prefetcher() *sparse.Prefetcher })
	var before sparse.PrefetchStats
	if pf != nil && pf.Prefetcher() != nil {
		before = pf.Prefetcher().Stats()
	}
	bs := s.opts.BlockSize
	stored := min(r.stored, len(r.ids))
	if !keepResident {
		for l := range s.cfg.Layers {
			t := s.cache.Layer(l)
			for _, pb := range r.seq.Blocks[:stored] {
				for kv := range 2 {
					off := s.cache.Offset(kv, pb*bs)
					clear(t[off : off+bs*s.cfg.KVHeads*s.cfg.HeadDim*2])
				}
			}
		}
		st.Offloaded = stored
	}
	req := &sparse.Request{ID: fmt.Sprintf("%p", r), BlockIDs: r.ids[:stored], PromptTokens: r.tokens}
	defer m.RequestFinished(req.ID)
	var hookErr error
	step := 0
	hooks := &model.Hooks{SelectBlocks: func(layer, pos int, q []float32, seq *model.Sequence) []int {
		if hookErr != nil {
			return nil
		}
		nb := pos/bs + 1
		req.BlockTable, req.NumComputedTokens, req.NumOutputTokens = seq.Blocks[:nb], pos, step+1
		a := &sparse.Attention{Layer: layer, LayerName: fmt.Sprintf("model.layers.%d.self_attn", layer), Phase: sparse.PhaseDecode,
			Step: step, Request: req, Q: q, BlockTable: seq.Blocks[:nb], SeqLen: pos + 1}
		if err := m.AttentionBegin(a); err != nil {
			hookErr = err
			return nil
		}
		sel := a.Selected
		if sel == nil {
			sel = make([]int, nb)
			for i := range sel {
				sel[i] = i
			}
		}
		st.LoadFailed += len(a.LoadFailed)
		if a.LoadErr != nil && st.LoadErr == nil {
			st.LoadErr = a.LoadErr
		}
		t := s.cache.Layer(layer)
		half := bs * s.cfg.KVHeads * s.cfg.HeadDim * 2
		for j, b := range sel {
			if b >= stored {
				continue
			}
			st.Attended++
			if j >= len(a.KV) || len(a.KV[j]) != 2*half {
				hookErr = fmt.Errorf("%w: layer %d block %d: the method gave no shard of %d bytes (give it SparseEnv's)", ErrInvalid, layer, b, 2*half)
				break
			}
			k, v := s.cache.Offset(0, seq.Blocks[b]*bs), s.cache.Offset(1, seq.Blocks[b]*bs)
			copy(t[k:k+half], a.KV[j][:half])
			copy(t[v:v+half], a.KV[j][half:])
			st.Loaded++
		}
		sel = append([]int(nil), sel...)
		if err := m.AttentionFinished(a); err != nil && hookErr == nil {
			hookErr = err
		}
		if len(a.LoadFailed) > 0 && len(sel) == 0 {
			return []int{nb - 1} // nothing but the current block is attendable
		}
		return sel
	}}
	out = make([]byte, 0, n)
	defer func() {
		if pf != nil && pf.Prefetcher() != nil {
			st.Stall = pf.Prefetcher().Stats().Stall - before.Stall
		}
	}()
	for range n {
		if len(r.tokens) >= s.opts.MaxContext {
			break
		}
		tok := model.Argmax(r.last)
		p := len(r.tokens)
		if err := r.seq.Reserve(s.cache, p+1); err != nil {
			return out, st, err
		}
		logits, err := s.m.ForwardHooks(s.cache, &r.seq, []int{tok}, []int{p}, hooks)
		if err == nil {
			err = hookErr
		}
		if err != nil {
			return out, st, err
		}
		out = append(out, byte(tok))
		r.tokens = append(r.tokens, tok)
		r.seq.Len = p + 1
		r.last = logits
		step++
		st.Steps++
	}
	return out, st, nil
}
