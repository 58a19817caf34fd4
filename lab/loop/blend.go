package loop

import (
	"context"
	"fmt"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
	"github.com/ucm-go/ucm/sparse"
)

// Blend in the loop (docs/sparse.md "Blend"): a request's chunks are stored under
// position-independent ids (DumpChunks), and a later prompt holding them at other offsets
// reuses their K/V, rotated to the new positions, recomputing only the tokens Blend's HKVD
// picks (PrefillBlend).

// NewChunkIndex returns a Blend chunk index over this server's store: chunks of chunkSize
// tokens (whole blocks), hashed with the server's hasher.
func (s *Server) NewChunkIndex(chunkSize int) (*sparse.ChunkIndex, error) {
	if s.store == nil {
		return nil, fmt.Errorf("%w: Blend chunks need a store", ErrInvalid)
	}
	return sparse.NewChunkIndex(s.hasher, chunkSize)
}

// DumpChunks stores the whole chunks of r's tokens [0, chunkEnd) as Blend chunks: it indexes
// them in ix and dumps each chunk's blocks under their chunk ids (sparse.ChunkBlockIDs), K
// rotated by rope to the chunk's own offsets (as if the chunk started at position 0), V as
// computed. Blocks already stored are kept (the first writer wins). Call it before Finish,
// which frees the request's cache blocks; it returns the blocks dumped.
func (s *Server) DumpChunks(ctx context.Context, r *Request, ix *sparse.ChunkIndex, rope sparse.RoPE, chunkEnd int) (int, error) {
	if s.store == nil || r.done {
		return 0, fmt.Errorf("%w: dump chunks: no store, or the request is finished", ErrInvalid)
	}
	if chunkEnd < 0 || chunkEnd > r.seq.Len {
		return 0, fmt.Errorf("%w: dump chunks: chunk end %d outside [0, %d]", ErrInvalid, chunkEnd, r.seq.Len)
	}
	_, chunkIDs, err := ix.Add(r.tokens[:chunkEnd])
	if err != nil {
		return 0, err
	}
	bs, chunk := s.opts.BlockSize, ix.ChunkSize()
	var ids []engine.BlockID
	var src [][]byte
	for c, cids := range chunkIDs {
		have := s.store.Lookup(cids)
		for bi, id := range cids {
			if have[bi] {
				continue
			}
			rec, err := s.chunkBlock(r, rope, c*chunk+bi*bs, c*chunk)
			if err != nil {
				return 0, err
			}
			ids, src = append(ids, id), append(src, rec)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if err := s.store.Dump(ids, src).WaitContext(ctx); err != nil {
		return 0, fmt.Errorf("dump of %d chunk blocks: %w", len(ids), err)
	}
	return len(ids), nil
}

// chunkBlock builds the store record (shard-major: per layer K then V) of r's block starting
// at token from, K rotated by −chunkStart.
func (s *Server) chunkBlock(r *Request, rope sparse.RoPE, from, chunkStart int) ([]byte, error) {
	bs, tb := s.opts.BlockSize, s.cfg.KVDim()*2
	shard, err := s.chunkShard()
	if err != nil {
		return nil, err
	}
	rec := make([]byte, s.cfg.Layers*shard)
	kf := make([]float32, s.cfg.KVDim())
	for l := range s.cfg.Layers {
		layer, out := s.cache.Layer(l), rec[l*shard:(l+1)*shard]
		for i := range bs {
			p := from + i
			slot := r.seq.Blocks[p/bs]*bs + p%bs
			ko, vo := s.cache.Offset(0, slot), s.cache.Offset(1, slot)
			if err := kernels.DecodeFloat32(kf, layer[ko:ko+tb], kernels.Float16); err != nil {
				return nil, err
			}
			if err := rope.Rotate(kf, -chunkStart); err != nil {
				return nil, err
			}
			if err := kernels.EncodeFloat32(out[i*tb:(i+1)*tb], kf, kernels.Float16); err != nil {
				return nil, err
			}
			copy(out[bs*tb+i*tb:bs*tb+(i+1)*tb], layer[vo:vo+tb])
		}
	}
	return rec, nil
}

// chunkShard is a record shard's bytes, checked to be one layer's K then V of a block as
// chunkBlock and loadChunks read them ([block][kv heads][head dim] fp16 each).
func (s *Server) chunkShard() (int, error) {
	rec, kv := s.paged.Record(), s.opts.BlockSize*s.cfg.KVDim()*2
	if rec.TensorsPerShard != 2 || int(rec.TensorBytes) != kv || int(rec.ShardBytes) != 2*kv {
		return 0, fmt.Errorf("%w: record layout %+v is not K then V of %d bytes", ErrInvalid, rec, kv)
	}
	return 2 * kv, nil
}

// PrefillBlend starts a request with prompt like Prefill, reusing instead the stored K/V of
// the chunks b matches in prompt[:chunkEnd] (chunkEnd < len(prompt): the last token is always
// computed): it loads their blocks, rotates their K to the new positions (when b's
// position_correction is on), and runs the prefill computing every token without a hit and
// the reused tokens b's HKVD selects (model.ForwardRecompute with b.Pick). A failed load
// computes everything (PrefillStats.LoadFailed). HitTokens counts the tokens reused.
func (s *Server) PrefillBlend(ctx context.Context, prompt []byte, chunkEnd int, b *sparse.Blend) (*Request, PrefillStats, error) {
	start := time.Now()
	st := PrefillStats{PromptTokens: len(prompt)}
	switch {
	case s.store == nil || b == nil:
		return nil, st, fmt.Errorf("%w: Blend needs a store and a method", ErrInvalid)
	case len(prompt) == 0 || len(prompt) > s.opts.MaxContext:
		return nil, st, fmt.Errorf("%w: prompt of %d tokens outside [1, %d]", ErrInvalid, len(prompt), s.opts.MaxContext)
	case chunkEnd < 0 || chunkEnd >= len(prompt):
		return nil, st, fmt.Errorf("%w: chunk end %d outside [0, %d)", ErrInvalid, chunkEnd, len(prompt))
	}
	r := &Request{tokens: make([]int, len(prompt))}
	for i, c := range prompt {
		r.tokens[i] = int(c)
	}
	if err := r.seq.Reserve(s.cache, len(r.tokens)); err != nil {
		return nil, st, err
	}
	req := &sparse.Request{ID: fmt.Sprintf("blend-%p", r), PromptTokens: r.tokens}
	b.RequestBeginChunks(req.ID, r.tokens, chunkEnd)
	defer b.RequestFinished(req.ID)
	_, hit, src := b.Plan(req.ID)
	t0 := time.Now()
	if err := s.loadChunks(ctx, r, hit, src, b); err != nil {
		if ctx.Err() != nil {
			_ = r.seq.Release(s.cache)
			return nil, st, err
		}
		st.LoadFailed = err
		clear(hit) // compute everything
	}
	st.Load = time.Since(t0)
	for _, h := range hit {
		if h {
			st.HitTokens++
		}
	}
	pick := b.Pick(req)
	if st.LoadFailed != nil {
		pick = nil
	}
	r.seq.Len = len(r.tokens)
	t0 = time.Now()
	logits, rows, err := s.m.ForwardRecompute(s.cache, &r.seq, r.tokens, positions(0, len(r.tokens)), pick)
	st.Compute = time.Since(t0)
	if err != nil {
		_ = r.seq.Release(s.cache)
		return nil, st, err
	}
	if rows[len(rows)-1] != len(r.tokens)-1 {
		_ = r.seq.Release(s.cache)
		return nil, st, fmt.Errorf("%w: the last token was not computed", ErrInvalid)
	}
	r.last = logits[len(logits)-s.cfg.Vocab:]
	st.ComputedTokens = len(r.tokens) - st.HitTokens
	st.TTFT = time.Since(start)
	return r, st, nil
}

// loadChunks loads the stored blocks of r's hit tokens and writes each hit token's K (rotated
// from its stored offset to its position when b corrects positions) and V into r's cache
// slots.
func (s *Server) loadChunks(ctx context.Context, r *Request, hit []bool, src []sparse.TokenSource, b *sparse.Blend) error {
	where := map[engine.BlockID]int{}
	var ids []engine.BlockID
	for t, h := range hit {
		if _, ok := where[src[t].Block]; h && !ok {
			where[src[t].Block] = len(ids)
			ids = append(ids, src[t].Block)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	bs, tb := s.opts.BlockSize, s.cfg.KVDim()*2
	shard, err := s.chunkShard()
	if err != nil {
		return err
	}
	dst := make([][]byte, len(ids))
	for i := range dst {
		dst[i] = make([]byte, s.cfg.Layers*shard)
	}
	if err := s.store.Load(ids, dst).WaitContext(ctx); err != nil {
		return fmt.Errorf("load of %d chunk blocks: %w", len(ids), err)
	}
	rope, correct := b.RoPE(), b.Config().PositionCorrection
	kf := make([]float32, s.cfg.KVDim())
	for t, h := range hit {
		if !h {
			continue
		}
		rec := dst[where[src[t].Block]]
		slot := r.seq.Blocks[t/bs]*bs + t%bs
		for l := range s.cfg.Layers {
			in, layer := rec[l*shard:(l+1)*shard], s.cache.Layer(l)
			k, v := in[src[t].Offset*tb:(src[t].Offset+1)*tb], in[bs*tb+src[t].Offset*tb:bs*tb+(src[t].Offset+1)*tb]
			ko, vo := s.cache.Offset(0, slot), s.cache.Offset(1, slot)
			if correct {
				if err := kernels.DecodeFloat32(kf, k, kernels.Float16); err != nil {
					return err
				}
				if err := rope.Rotate(kf, t-src[t].RefPos); err != nil {
					return err
				}
				if err := kernels.EncodeFloat32(layer[ko:ko+tb], kf, kernels.Float16); err != nil {
					return err
				}
			} else {
				copy(layer[ko:ko+tb], k)
			}
			copy(layer[vo:vo+tb], v)
		}
	}
	return nil
}
