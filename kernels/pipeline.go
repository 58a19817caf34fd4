package kernels

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// LoadFunc fills one layer's staged shards from the store: shards[j] is block j's slot for
// layer `layer` (Record().ShardBytes bytes, 4096-aligned when ShardBytes is a multiple of
// 4096), in the order of the blocks given to Load. It plugs straight into the engine:
//
//	func(ctx context.Context, layer int, shards [][]byte) error {
//		return eng.LoadShard(ids, layer, shards).WaitContext(ctx)
//	}
//
// Calls for different layers run concurrently (up to PipelineOptions.Buffers at once, each
// with its own shards), so it must be safe for that. It must honour ctx (return soon after it
// is cancelled) and must not keep shards after it returns.
type LoadFunc func(ctx context.Context, layer int, shards [][]byte) error

// DumpFunc hands one layer's gathered shards to the store: shards[j] is block j's shard of
// layer `layer`, in the order of the blocks given to Dump; for example
// eng.DumpShard(ids, layer, shards).WaitContext(ctx). Calls for different layers run
// concurrently (up to PipelineOptions.Buffers at once), so it must be safe for that: state it
// shares across layers (a SidecarWriter, say) needs a lock. The shards are reused once it
// returns.
type DumpFunc func(ctx context.Context, layer int, shards [][]byte) error

// PipelineOptions sizes a Pipeline's staging memory: Buffers × MaxBlocks × ShardBytes bytes.
type PipelineOptions struct {
	// Buffers is the number of staging buffers, each holding one layer of up to MaxBlocks
	// blocks: the most layers in flight (being read from the store, copied, or handed to a
	// dumper) across every load and dump of the pipeline. Default 2, which is enough for a load
	// of layer i+1 to overlap the copy of layer i; more lets store reads of several layers
	// overlap. At most 64.
	Buffers int
	// MaxBlocks is the most blocks one Load or Dump moves (required).
	MaxBlocks int
	// Staging says where the buffers are placed (NUMA node of the GPU, huge pages, locking).
	Staging StagingOptions
}

// Pipeline moves layers of blocks between the store and a PagedKV through a fixed set of
// staging buffers, layer by layer, so that the compute of layer i overlaps the transfer of
// layer i+1. Its loads and dumps may run concurrently and share the buffers. Close it when
// done; it is safe for concurrent use.
type Pipeline struct {
	p    *PagedKV
	opts PipelineOptions
	free chan *stageBuf
	bufs []*stageBuf

	mu     sync.Mutex
	closed bool
	active map[pipelineOp]struct{}
}

// pipelineOp is a running load or dump, closed by Pipeline.Close.
type pipelineOp interface{ Close() error }

// stageBuf is one staging buffer with its shard slots.
type stageBuf struct {
	st    *Staging
	slots [][]byte // MaxBlocks slots of ShardBytes
}

// NewPipeline maps the staging buffers for loads and dumps of p.
func NewPipeline(p *PagedKV, opts PipelineOptions) (*Pipeline, error) {
	if opts.Buffers == 0 {
		opts.Buffers = 2
	}
	if opts.Buffers < 1 || opts.Buffers > 64 {
		return nil, errorf(ErrInvalid, "pipeline: buffers %d outside [1, 64]", opts.Buffers)
	}
	sb := p.rec.ShardBytes
	if opts.MaxBlocks < 1 || int64(opts.MaxBlocks) > MaxStagingBytes/sb {
		return nil, errorf(ErrInvalid, "pipeline: max blocks %d outside [1, %d] (buffers of %d-byte shards)", opts.MaxBlocks, MaxStagingBytes/sb, sb)
	}
	pl := &Pipeline{p: p, opts: opts, free: make(chan *stageBuf, opts.Buffers), active: map[pipelineOp]struct{}{}}
	for i := 0; i < opts.Buffers; i++ {
		st, err := NewStaging(int64(opts.MaxBlocks)*sb, opts.Staging)
		if err != nil {
			_ = pl.Close()
			return nil, fmt.Errorf("pipeline: %w", err)
		}
		b := &stageBuf{st: st, slots: make([][]byte, opts.MaxBlocks)}
		all := st.Bytes()
		for j := range b.slots {
			b.slots[j] = all[int64(j)*sb : int64(j+1)*sb : int64(j+1)*sb]
		}
		pl.bufs = append(pl.bufs, b)
		pl.free <- b
	}
	return pl, nil
}

// Placement reports where the staging buffers were placed (all are mapped alike).
func (pl *Pipeline) Placement() Placement {
	if len(pl.bufs) == 0 {
		return Placement{RequestedNode: -1, Node: -1}
	}
	return pl.bufs[0].st.Placement()
}

// Close cancels the loads and dumps still running, waits for them and unmaps the staging
// buffers. Closing twice is a no-op.
func (pl *Pipeline) Close() error {
	pl.mu.Lock()
	if pl.closed {
		pl.mu.Unlock()
		return nil
	}
	pl.closed = true
	ops := make([]pipelineOp, 0, len(pl.active))
	for o := range pl.active {
		ops = append(ops, o)
	}
	pl.mu.Unlock()
	for _, o := range ops {
		_ = o.Close()
	}
	var errs []error
	for _, b := range pl.bufs {
		errs = append(errs, b.st.Close())
	}
	return errors.Join(errs...)
}

func (pl *Pipeline) register(o pipelineOp) error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed {
		return errorf(ErrInvalid, "pipeline closed")
	}
	pl.active[o] = struct{}{}
	return nil
}

func (pl *Pipeline) unregister(o pipelineOp) {
	pl.mu.Lock()
	delete(pl.active, o)
	pl.mu.Unlock()
}

// acquire takes a free buffer, or fails when ctx ends first.
func (pl *Pipeline) acquire(ctx context.Context) (*stageBuf, error) {
	select {
	case b := <-pl.free:
		return b, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (pl *Pipeline) release(b *stageBuf) { pl.free <- b }

// layerState is the outcome of one layer: done is closed once err is set.
type layerState struct {
	done chan struct{}
	err  error
	once sync.Once
}

func (l *layerState) finish(err error) {
	l.once.Do(func() {
		l.err = err
		close(l.done)
	})
}

func newLayerStates(n int) []*layerState {
	ls := make([]*layerState, n)
	for i := range ls {
		ls[i] = &layerState{done: make(chan struct{})}
	}
	return ls
}

// errCanceled is the cause a closed load or dump cancels with.
var errCanceled = fmt.Errorf("closed: %w", context.Canceled)

// LayerLoad is a running layer-wise load (Pipeline.Load): layer i is read from the store into
// a staging buffer by the LoadFunc, then scattered into the caches on the stream, in layer
// order, while later layers are being read.
type LayerLoad struct {
	pl     *Pipeline
	s      *Stream
	blocks []int
	load   LoadFunc
	ctx    context.Context
	cancel context.CancelCauseFunc
	layers []*layerState
	wg     sync.WaitGroup // the feeder, the sequencer, loaders and queued scatters
	closed sync.Once

	mu       sync.Mutex
	failedAt int   // the lowest failed layer, len(layers) while none has
	failed   error // its error
}

// recordFailure notes that layer failed with err.
func (l *LayerLoad) recordFailure(layer int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if layer < l.failedAt {
		l.failedAt, l.failed = layer, err
	}
}

// failureBefore returns the error of the lowest failed layer below layer, or nil.
func (l *LayerLoad) failureBefore(layer int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failedAt < layer {
		return l.failed
	}
	return nil
}

type loadResult struct {
	buf *stageBuf // nil when the loader was never started
	err error
}

// Load starts loading every layer of blocks (engine block ids of the PagedKV, each at most
// once) into the caches: for each layer in order, a staging buffer is taken (waiting while all
// are in use), load fills it, and the layer is scattered on s. Loads of up to Buffers layers
// run concurrently, their scatters are issued in layer order, and WaitLayer(i) returns as soon
// as layer i is resident. The first layer to fail (its LoadFunc's error, a scatter's error, or
// ctx ending) fails itself and every later layer; layers before it still complete. Once every
// layer is resident or failed the load holds no goroutine; Close cancels it sooner.
func (pl *Pipeline) Load(ctx context.Context, s *Stream, blocks []int, load LoadFunc) (*LayerLoad, error) {
	if err := pl.check(s, blocks, true); err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if load == nil {
		return nil, errorf(ErrInvalid, "load: nil LoadFunc")
	}
	l := &LayerLoad{pl: pl, s: s, blocks: append([]int(nil), blocks...), load: load, layers: newLayerStates(pl.p.Layers()), failedAt: pl.p.Layers()}
	l.ctx, l.cancel = context.WithCancelCause(ctx)
	if err := pl.register(l); err != nil {
		l.cancel(err)
		return nil, fmt.Errorf("load: %w", err)
	}
	// Every layer's channel receives exactly one result: its loader's, or the feeder's when it
	// gives up before starting that loader.
	results := make([]chan loadResult, len(l.layers))
	for i := range results {
		results[i] = make(chan loadResult, 1)
	}
	l.wg.Add(2)
	go l.feed(results)
	go l.sequence(results)
	return l, nil
}

func (pl *Pipeline) check(s *Stream, blocks []int, unique bool) error {
	if s == nil || s.dev != pl.p.dev {
		return errorf(ErrInvalid, "stream of another device")
	}
	if len(blocks) > pl.opts.MaxBlocks {
		return errorf(ErrInvalid, "%d blocks exceed the pipeline's max blocks %d", len(blocks), pl.opts.MaxBlocks)
	}
	return pl.p.checkBlocks(blocks, unique)
}

// feed starts the loader of each layer in order as buffers become free.
func (l *LayerLoad) feed(results []chan loadResult) {
	defer l.wg.Done()
	n := len(l.blocks)
	for layer := range l.layers {
		buf, err := l.pl.acquire(l.ctx)
		if err == nil && l.ctx.Err() != nil {
			l.pl.release(buf)
			err = context.Cause(l.ctx)
		}
		if err != nil {
			for k := layer; k < len(results); k++ {
				results[k] <- loadResult{err: err}
			}
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			err := safeCall(func() error { return l.load(l.ctx, layer, buf.slots[:n]) })
			results[layer] <- loadResult{buf: buf, err: err}
		}()
	}
}

// sequence scatters the layers in order as their loads complete; after a failure it collects
// the remaining results, returning their buffers.
func (l *LayerLoad) sequence(results []chan loadResult) {
	defer l.wg.Done()
	defer func() {
		// Unregister once the scatters have made every layer resident or failed.
		for _, ls := range l.layers {
			<-ls.done
		}
		l.pl.unregister(l)
	}()
	for layer, ls := range l.layers {
		r := <-results[layer]
		if failed := l.failureBefore(layer); failed != nil {
			if r.buf != nil {
				l.pl.release(r.buf)
			}
			ls.finish(fmt.Errorf("layer %d not loaded: %w", layer, failed))
			continue
		}
		if r.err == nil {
			if r.err = l.scatter(layer, ls, r.buf); r.err == nil {
				continue
			}
		} else if r.buf != nil {
			l.pl.release(r.buf)
		}
		err := fmt.Errorf("layer %d: %w", layer, r.err)
		l.recordFailure(layer, err)
		ls.finish(err)
		l.cancel(err) // stop the loaders of later layers
	}
}

// scatter enqueues the layer's scatter with the notification that makes it resident and
// returns the buffer; on error nothing was enqueued and the buffer is returned at once.
func (l *LayerLoad) scatter(layer int, ls *layerState, buf *stageBuf) error {
	n := int64(len(l.blocks))
	l.wg.Add(1)
	err := l.pl.p.transfer(l.s, false, layer, l.blocks, buf.st.Bytes()[:n*l.pl.p.rec.ShardBytes], xferHooks{notify: func(err error) {
		defer l.wg.Done()
		l.pl.release(buf)
		if err != nil {
			err = fmt.Errorf("layer %d: %w", layer, err)
			l.recordFailure(layer, err)
			l.cancel(err)
		} else if f := l.failureBefore(layer); f != nil {
			// An earlier layer's scatter failed (notifications run in layer order).
			err = fmt.Errorf("layer %d not loaded: %w", layer, f)
		}
		ls.finish(err)
	}})
	if err != nil {
		l.wg.Done()
		l.pl.release(buf)
	}
	return err
}

// WaitLayer returns once layer i is resident in the caches (nil), or with the error that
// failed it: its own, or that of an earlier layer. It is safe to call from several goroutines
// and repeatedly. An i outside the layers is ErrOutOfRange.
func (l *LayerLoad) WaitLayer(i int) error {
	if i < 0 || i >= len(l.layers) {
		return errorf(ErrOutOfRange, "wait layer %d outside [0, %d)", i, len(l.layers))
	}
	<-l.layers[i].done
	return l.layers[i].err
}

// Wait waits for every layer and returns the first layer's error, if any.
func (l *LayerLoad) Wait() error {
	for i := range l.layers {
		if err := l.WaitLayer(i); err != nil {
			return err
		}
	}
	return nil
}

// Close cancels the load if it is still running (layers not yet resident fail with an error
// wrapping context.Canceled), waits for its loaders, which must honour their context, and for
// its queued scatters, and returns its buffers. Its result stays readable through WaitLayer.
func (l *LayerLoad) Close() error {
	l.closed.Do(func() {
		l.cancel(errCanceled)
		l.wg.Wait()
		for _, ls := range l.layers {
			ls.finish(fmt.Errorf("load: %w", errCanceled))
		}
		l.pl.unregister(l)
	})
	return nil
}

// safeCall runs a user callback, turning a panic into an error.
func safeCall(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("callback panicked: %v", r)
		}
	}()
	return fn()
}

// LayerDump is a running layer-wise dump (Pipeline.Dump): each layer the caller saves is
// gathered from the caches into a staging buffer on the stream, then handed to the DumpFunc.
type LayerDump struct {
	pl     *Pipeline
	s      *Stream
	blocks []int
	dump   DumpFunc
	ctx    context.Context
	cancel context.CancelCauseFunc
	layers []*layerState
	queue  chan saveReq

	mu        sync.Mutex
	saved     []bool
	order     []int // the order in which layers were saved
	nsaved    int
	finished  bool  // Finish was called
	stopped   bool  // the feeder has stopped: saves fail at once
	failedSeq int   // the save order of the first failed layer, len(layers) while none has
	failed    error // its error
	running   map[int]context.CancelCauseFunc

	wg     sync.WaitGroup
	closed sync.Once
}

type saveReq struct {
	layer int // -1: Finish's end marker
	after *streamMark
}

// Dump starts a layer-wise dump of blocks (engine block ids; repeats allowed): the caller
// saves layers with SaveLayer as their KV becomes final (after each layer's forward, as
// vLLM's save_kv_layer does), then calls Finish. Up to Buffers layers are gathered or being
// dumped at once. A layer that fails (its gather's or its DumpFunc's error) fails itself and
// every layer saved after it (their running DumpFuncs see their context cancelled); layers
// saved before it still complete. ctx ending fails every layer not done. Once Finish has
// returned the dump holds no goroutine.
func (pl *Pipeline) Dump(ctx context.Context, s *Stream, blocks []int, dump DumpFunc) (*LayerDump, error) {
	if err := pl.check(s, blocks, false); err != nil {
		return nil, fmt.Errorf("dump: %w", err)
	}
	if dump == nil {
		return nil, errorf(ErrInvalid, "dump: nil DumpFunc")
	}
	n := pl.p.Layers()
	d := &LayerDump{pl: pl, s: s, blocks: append([]int(nil), blocks...), dump: dump, layers: newLayerStates(n),
		queue: make(chan saveReq, n+1), saved: make([]bool, n), order: make([]int, n), failedSeq: n, running: map[int]context.CancelCauseFunc{}}
	d.ctx, d.cancel = context.WithCancelCause(ctx)
	if err := pl.register(d); err != nil {
		d.cancel(err)
		return nil, fmt.Errorf("dump: %w", err)
	}
	d.wg.Add(1)
	go d.feed()
	return d, nil
}

// SaveLayer queues layer i for dumping once every operation recorded in after (its current
// Record) has run, for example the compute stream's work on that layer; nil means at once.
// It never blocks. Each layer may be saved once (ErrInvalid otherwise); out-of-range layers
// are ErrOutOfRange.
func (d *LayerDump) SaveLayer(i int, after *Event) error {
	if i < 0 || i >= len(d.layers) {
		return errorf(ErrOutOfRange, "save layer %d outside [0, %d)", i, len(d.layers))
	}
	var m *streamMark
	if after != nil {
		if after.dev != d.pl.p.dev {
			return errorf(ErrInvalid, "save layer %d: event of another device", i)
		}
		after.mu.Lock()
		m = after.cur
		after.mu.Unlock()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.finished:
		return errorf(ErrInvalid, "save layer %d after Finish", i)
	case d.saved[i]:
		return errorf(ErrInvalid, "layer %d saved twice", i)
	}
	d.saved[i] = true
	d.order[i] = d.nsaved
	d.nsaved++
	if d.stopped {
		d.layers[i].finish(fmt.Errorf("layer %d not dumped: %w", i, context.Cause(d.ctx)))
		return nil
	}
	d.queue <- saveReq{layer: i, after: m} // capacity: one per layer and the end marker
	return nil
}

// SaveAll saves every layer not saved yet, in order, after the event (see SaveLayer).
func (d *LayerDump) SaveAll(after *Event) error {
	for i := range d.layers {
		d.mu.Lock()
		done := d.saved[i]
		d.mu.Unlock()
		if done {
			continue
		}
		if err := d.SaveLayer(i, after); err != nil {
			return err
		}
	}
	return nil
}

// feed gathers saved layers in the order they were saved, as buffers become free, until
// Finish's end marker or the dump's cancellation.
func (d *LayerDump) feed() {
	defer d.wg.Done()
	for {
		var req saveReq
		select {
		case req = <-d.queue:
		case <-d.ctx.Done():
			d.stop()
			return
		}
		if req.layer < 0 {
			d.stop()
			return
		}
		if err := d.failure(req.layer); err != nil {
			d.layers[req.layer].finish(fmt.Errorf("layer %d not dumped: %w", req.layer, err))
			continue
		}
		buf, err := d.pl.acquire(d.ctx)
		if err != nil {
			d.fail(req.layer, err)
			continue
		}
		d.gather(req, buf)
	}
}

// stop ends the feeding: saved layers still queued fail, later saves fail at once.
func (d *LayerDump) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	for {
		select {
		case req := <-d.queue:
			if req.layer >= 0 {
				d.layers[req.layer].finish(fmt.Errorf("layer %d not dumped: %w", req.layer, context.Cause(d.ctx)))
			}
		default:
			return
		}
	}
}

// gather enqueues the layer's gather; its notification hands the staged shards to the
// DumpFunc on a goroutine of its own, so the stream goes on with other work.
func (d *LayerDump) gather(req saveReq, buf *stageBuf) {
	n := len(d.blocks)
	d.wg.Add(1)
	err := d.pl.p.transfer(d.s, true, req.layer, d.blocks, buf.st.Bytes()[:int64(n)*d.pl.p.rec.ShardBytes], xferHooks{wait: req.after, notify: func(err error) {
		if err != nil {
			d.pl.release(buf)
			d.fail(req.layer, err)
			d.wg.Done()
			return
		}
		go func() {
			defer d.wg.Done()
			ctx, cancel := context.WithCancelCause(d.ctx)
			defer cancel(nil)
			d.mu.Lock()
			d.running[req.layer] = cancel
			d.mu.Unlock()
			err := d.failure(req.layer)
			if err == nil {
				err = safeCall(func() error { return d.dump(ctx, req.layer, buf.slots[:n]) })
			} else {
				err = fmt.Errorf("not dumped: %w", err)
			}
			d.mu.Lock()
			delete(d.running, req.layer)
			d.mu.Unlock()
			d.pl.release(buf)
			if err != nil {
				d.fail(req.layer, err)
				return
			}
			d.layers[req.layer].finish(nil)
		}()
	}})
	if err != nil {
		d.wg.Done()
		d.pl.release(buf)
		d.fail(req.layer, err)
	}
}

// failure is the error that stops layer: that of a layer saved before it, or the context's
// end; nil when it may proceed.
func (d *LayerDump) failure(layer int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failedSeq < d.order[layer] {
		return d.failed
	}
	if d.ctx.Err() != nil {
		return context.Cause(d.ctx)
	}
	return nil
}

// fail fails layer with err, which then also stops every layer saved after it (running
// DumpFuncs of those see their context cancelled).
func (d *LayerDump) fail(layer int, err error) {
	err = fmt.Errorf("layer %d: %w", layer, err)
	d.mu.Lock()
	seq := d.order[layer]
	if seq < d.failedSeq {
		d.failedSeq, d.failed = seq, err
	}
	for l, cancel := range d.running {
		if d.order[l] > seq {
			cancel(err)
		}
	}
	d.mu.Unlock()
	d.layers[layer].finish(err)
}

// WaitLayer returns once layer i's DumpFunc has returned (nil when it succeeded), or with the
// error that failed it. It blocks until the layer is saved and processed. An i outside the
// layers is ErrOutOfRange.
func (d *LayerDump) WaitLayer(i int) error {
	if i < 0 || i >= len(d.layers) {
		return errorf(ErrOutOfRange, "wait layer %d outside [0, %d)", i, len(d.layers))
	}
	<-d.layers[i].done
	return d.layers[i].err
}

// Finish declares that no more layers will be saved, waits for the saved ones and returns the
// first failure. Layers never saved fail with ErrInvalid (a block is published only with all
// its shards, so a dump missing layers stores nothing).
func (d *LayerDump) Finish() error {
	d.mu.Lock()
	if !d.finished {
		d.finished = true
		for i, ok := range d.saved {
			if !ok {
				d.layers[i].finish(errorf(ErrInvalid, "layer %d never saved", i))
			}
		}
		if !d.stopped {
			d.queue <- saveReq{layer: -1}
		}
	}
	d.mu.Unlock()
	var first error
	for i := range d.layers {
		if err := d.WaitLayer(i); err != nil && first == nil {
			first = err
		}
	}
	d.wg.Wait() // the feeder has seen the end marker or stopped; the dumpers have returned
	d.pl.unregister(d)
	return first
}

// Close cancels the dump if it is still running (layers not yet dumped fail with an error
// wrapping context.Canceled; running DumpFuncs see their context cancelled), waits for its
// goroutines and queued gathers, and returns its buffers.
func (d *LayerDump) Close() error {
	d.closed.Do(func() {
		d.cancel(errCanceled)
		d.wg.Wait()
		for _, ls := range d.layers {
			ls.finish(fmt.Errorf("dump: %w", errCanceled))
		}
		d.pl.unregister(d)
	})
	return nil
}
