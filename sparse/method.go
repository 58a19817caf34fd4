package sparse

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/kernels"
)

// Role says which side of the serving engine a method instance runs on.
type Role int

// Roles.
const (
	// RoleScheduler is the scheduler process: it estimates the KV slots a request needs.
	RoleScheduler Role = iota
	// RoleWorker is a model worker: it selects blocks and rewrites the attention metadata.
	RoleWorker
)

// InvalidSlot is what EstimateNumSlotsSparsed returns for "do not sparsify this request".
const InvalidSlot = -1

// Phase is the kind of forward step an attention call belongs to.
type Phase int

// Phases.
const (
	// PhasePrefill is a step computing many prompt tokens; methods attend densely.
	PhasePrefill Phase = iota
	// PhaseDecode is a one-token step; methods may restrict it to selected blocks.
	PhaseDecode
)

// Request is what the scheduler and the worker know of one request.
type Request struct {
	// ID names the request.
	ID string
	// PromptTokens are the prompt's tokens.
	PromptTokens []int
	// NumComputedTokens is the tokens whose K/V are in the cache; NumOutputTokens the tokens
	// generated so far (KVStar's step; a request with none is in its prefill stage).
	NumComputedTokens, NumOutputTokens int
	// BlockTable is vLLM's block table: the physical block of each logical block.
	BlockTable []int
	// BlockIDs are the stored ids (ucm_block_hashes) of the request's leading full blocks, in
	// order: the keys its sidecars are loaded under. Blocks past len(BlockIDs) have none.
	BlockIDs []engine.BlockID
}

// Stage is KVStar's request stage: PhaseDecode once the request has output tokens.
func (r *Request) Stage() Phase {
	if r.NumOutputTokens > 0 {
		return PhaseDecode
	}
	return PhasePrefill
}

// SchedulerOutput is one step's scheduling decision as the worker sees it.
type SchedulerOutput struct {
	// Requests are the requests scheduled in the step.
	Requests []*Request
	// NumScheduledTokens is the tokens of each request computed in the step, by request ID.
	NumScheduledTokens map[string]int
	// SparsedSlots is req_sparsed_slots: EstimateNumSlotsSparsed's answer per request ID.
	SparsedSlots map[string]int
}

// Shape is the model shape a method serves.
type Shape struct {
	// Layers, QHeads (query heads), KVHeads, HeadDim and BlockSize (tokens per KV block).
	Layers, QHeads, KVHeads, HeadDim, BlockSize int
}

// Validate checks the shape (every field ≥ 1, QHeads a multiple of KVHeads, within the
// kernels' limits) and returns an error wrapping ErrInvalid naming the field.
func (s Shape) Validate() error {
	switch {
	case s.Layers < 1 || s.Layers > kernels.MaxLayers:
		return fmt.Errorf("%w: shape: layers %d not in [1, %d]", ErrInvalid, s.Layers, kernels.MaxLayers)
	case s.KVHeads < 1 || s.KVHeads > kernels.MaxHeads:
		return fmt.Errorf("%w: shape: kv heads %d not in [1, %d]", ErrInvalid, s.KVHeads, kernels.MaxHeads)
	case s.QHeads < s.KVHeads || s.QHeads > kernels.MaxHeads || s.QHeads%s.KVHeads != 0:
		return fmt.Errorf("%w: shape: query heads %d not a multiple of kv heads %d (at most %d)", ErrInvalid, s.QHeads, s.KVHeads, kernels.MaxHeads)
	case s.HeadDim < 1 || s.HeadDim > kernels.MaxDim || s.KVHeads*s.HeadDim > kernels.MaxHeadElems:
		return fmt.Errorf("%w: shape: head dim %d", ErrInvalid, s.HeadDim)
	case s.BlockSize < 1 || s.BlockSize > kernels.MaxBlockTokens:
		return fmt.Errorf("%w: shape: block size %d not in [1, %d]", ErrInvalid, s.BlockSize, kernels.MaxBlockTokens)
	}
	return nil
}

// Attention is one layer's attention call for one request, as AttentionBegin sees it. A method
// restricting a decode step to selected blocks rewrites BlockTable and SeqLen (sources §3A) and
// sets Selected; AttentionFinished puts the originals back.
type Attention struct {
	// Layer is the layer index, LayerName its name ("model.layers.<n>.self_attn").
	Layer     int
	LayerName string
	// Phase is the step's kind; Step the request's decode step (its output tokens so far).
	Phase Phase
	Step  int
	// Request is the request attending.
	Request *Request
	// Q is the step's queries after RoPE, [tokens][QHeads][HeadDim]; valid during the call.
	Q []float32
	// BlockTable (physical block per logical block) and SeqLen (tokens attended) are the
	// attention metadata; a decode selection rewrites them to the selected blocks.
	BlockTable []int
	SeqLen     int
	// Selected is the logical blocks attended, ascending, after a selection; nil: all.
	Selected []int
	// HeadSelected, with head_select kv, is each KV head's own selection ([KVHeads], each
	// ascending): the query heads of KV head h attend HeadSelected[h] only. Selected (and the
	// rewritten block table) is their union, the blocks the step must have resident. nil with
	// one selection for every head.
	HeadSelected [][]int
	// Recompute, in a masked prefill (Blend), is the layer's rows and keys; AttentionBegin
	// sets its Keep.
	Recompute *Recompute
	// KV is set by a method that loads the attended blocks (a prefetch engine, Env.Blocks):
	// KV[i] is this layer's shard of the i-th attended block (Selected[i], or block i when
	// Selected is nil), nil for a block the host holds itself (no stored id). Valid until
	// AttentionFinished.
	KV [][]byte
	// LoadFailed is the logical blocks whose load failed: they are left out of the attended
	// blocks (never attended with missing bytes), and the host may recompute them. LoadErr
	// joins their *BlockLoadError.
	LoadFailed []int
	LoadErr    error

	origTable  []int
	origSeqLen int
	rewritten  bool
	release    func() // returns the loaded shards (KV) to their cache
}

// Rewrite restricts the call to the logical blocks sel (ascending, unique, in range; the last
// may be partial): BlockTable becomes the old table's entries at sel, SeqLen the tokens of
// those blocks (sources §3A [DECISION]: not len(sel)·block_size). Restore undoes it.
func (a *Attention) Rewrite(sel []int, blockSize int) error {
	if !a.rewritten {
		a.origTable, a.origSeqLen = a.BlockTable, a.SeqLen
	}
	table, seqLen, err := RewriteBlockTable(a.origTable, sel, a.origSeqLen, blockSize)
	if err != nil {
		return err
	}
	a.BlockTable, a.SeqLen, a.Selected, a.rewritten = table, seqLen, sel, true
	return nil
}

// Restore puts back the block table and seq_len Rewrite replaced (sources §4 [DECISION]) and
// releases the loaded shards (KV); a call never rewritten is left as it is.
func (a *Attention) Restore() {
	if a.release != nil {
		a.release()
		a.release, a.KV = nil, nil
	}
	if a.rewritten {
		a.BlockTable, a.SeqLen, a.Selected, a.HeadSelected, a.rewritten = a.origTable, a.origSeqLen, nil, nil, false
	}
}

// SparseMethod is a sparse-attention method's hooks into the serving engine (sources §1), in the
// order of one step: scheduler EstimateNumSlotsSparsed; worker BindSparseMetadata,
// ExecuteBegin, BuildSparseMeta; per layer LayerBegin, AttentionBegin, (attention),
// AttentionFinished, FFNBegin; then ExecuteFinished. Embed Base for no-op defaults.
type SparseMethod interface {
	// Name is the method's registry name ("ESA", "GSAOnDevice", ...).
	Name() string

	// RequestBegin tells the scheduler a request arrived.
	RequestBegin(reqID string, promptTokens []int)
	// EstimateNumSlotsSparsed returns the KV slots the request needs after sparsification, or
	// InvalidSlot not to sparsify it.
	EstimateNumSlotsSparsed(req *Request) int
	// RequestFinishedInScheduler tells the scheduler the request is done.
	RequestFinishedInScheduler(reqID string)

	// BuildSparseMeta builds the step's metadata (opaque, scheduler → worker).
	BuildSparseMeta(out *SchedulerOutput) (any, error)
	// BindSparseMetadata hands the worker the step's metadata.
	BindSparseMetadata(meta any)
	// RegisterKVCaches gives the worker the paged KV caches, by layer name.
	RegisterKVCaches(spec kernels.CacheSpec, layers map[string][]byte) error
	// ExecuteBegin starts a step on the worker.
	ExecuteBegin(out *SchedulerOutput) error
	// LayerBegin runs before a layer (Blend).
	LayerBegin(layer int, positions []int, hidden, residual []float32) error
	// AttentionBegin runs before a layer's attention; it may rewrite a's metadata.
	AttentionBegin(a *Attention) error
	// AttentionFinished runs after a layer's attention.
	AttentionFinished(a *Attention) error
	// FFNBegin runs before a layer's MLP (Blend).
	FFNBegin(layer int, hidden, residual []float32) error
	// ExecuteFinished ends a step and returns the logits indices to sample from.
	ExecuteFinished(logitsIndices []int) []int
	// RequestFinished releases the worker's state of a request.
	RequestFinished(reqID string)
	// Close stops what the method runs in the background (a prefetch engine's goroutines).
	Close() error
}

// Base implements every SparseMethod hook as a no-op: EstimateNumSlotsSparsed says
// InvalidSlot, AttentionFinished restores a rewritten call, ExecuteFinished returns its
// argument. Methods embed it and override what they use.
type Base struct{}

// RequestBegin does nothing.
func (Base) RequestBegin(string, []int) {}

// EstimateNumSlotsSparsed returns InvalidSlot.
func (Base) EstimateNumSlotsSparsed(*Request) int { return InvalidSlot }

// RequestFinishedInScheduler does nothing.
func (Base) RequestFinishedInScheduler(string) {}

// BuildSparseMeta returns no metadata.
func (Base) BuildSparseMeta(*SchedulerOutput) (any, error) { return nil, nil }

// BindSparseMetadata does nothing.
func (Base) BindSparseMetadata(any) {}

// RegisterKVCaches does nothing.
func (Base) RegisterKVCaches(kernels.CacheSpec, map[string][]byte) error { return nil }

// ExecuteBegin does nothing.
func (Base) ExecuteBegin(*SchedulerOutput) error { return nil }

// LayerBegin does nothing.
func (Base) LayerBegin(int, []int, []float32, []float32) error { return nil }

// AttentionBegin leaves the call dense.
func (Base) AttentionBegin(*Attention) error { return nil }

// AttentionFinished restores a rewritten call.
func (Base) AttentionFinished(a *Attention) error {
	a.Restore()
	return nil
}

// FFNBegin does nothing.
func (Base) FFNBegin(int, []float32, []float32) error { return nil }

// ExecuteFinished returns logitsIndices.
func (Base) ExecuteFinished(logitsIndices []int) []int { return logitsIndices }

// RequestFinished does nothing.
func (Base) RequestFinished(string) {}

// Close does nothing.
func (Base) Close() error { return nil }

// LayerID parses the layer index of a vLLM layer name, the number after "layers." in
// "model.layers.<n>.self_attn" (KVStar's layer_id). A name without one is ErrInvalid.
func LayerID(name string) (int, error) {
	const key = "layers."
	for rest := name; ; {
		i := strings.Index(rest, key)
		if i < 0 {
			return 0, fmt.Errorf("%w: layer name %q has no layers.<n>", ErrInvalid, name)
		}
		rest = rest[i+len(key):]
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if j > 0 && j <= 6 && (j == len(rest) || rest[j] == '.') {
			n, _ := strconv.Atoi(rest[:j])
			return n, nil
		}
	}
}
