package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/sparse"
)

// ucmgo_selector_retrieve_dot is ESA's retrieval (UCMGO_RM_DOT) over the representations the
// store holds for the blocks ids names instead of a matrix the caller keeps: layer's
// representation of each block is read by id (connector.Selector.RetrieveDot) and scored on
// the calling thread and up to workers-1 helpers. Returned numbers are positions into ids.
//
//export ucmgo_selector_retrieve_dot
func ucmgo_selector_retrieve_dot(sel C.int64_t, layer C.int32_t, ids *C.uint8_t, n C.size_t, query *C.float, batch, dim C.int64_t,
	cand *C.int32_t, candWidth C.int64_t, topk, workers C.int32_t, outIdx *C.int32_t, outScores *C.float, outCount *C.int64_t,
	found *C.uint8_t) C.int32_t {
	return C.int32_t(selectorRetrieveDot(int64(sel), int32(layer), uintptr(unsafe.Pointer(ids)), uint64(n), uintptr(unsafe.Pointer(query)),
		int64(batch), int64(dim), uintptr(unsafe.Pointer(cand)), int64(candWidth), int32(topk), int32(workers),
		uintptr(unsafe.Pointer(outIdx)), uintptr(unsafe.Pointer(outScores)), uintptr(unsafe.Pointer(outCount)), uintptr(unsafe.Pointer(found))))
}

// retrieveElems checks that a count argument of ucmgo_selector_retrieve_dot is in [lo,
// sparse.MaxRetrieveElems].
func retrieveElems(name string, v, lo int64) error {
	if v < lo || v > sparse.MaxRetrieveElems {
		return fmt.Errorf("selector_retrieve_dot: %s %d: want %d … %d: %w", name, v, lo, int64(sparse.MaxRetrieveElems), engine.ErrInvalidArgument)
	}
	return nil
}

// retrieveProduct checks that x × y (both checked) is at most sparse.MaxRetrieveElems.
func retrieveProduct(what string, x, y int64) (uint64, error) {
	if p := uint64(x) * uint64(y); p <= sparse.MaxRetrieveElems {
		return p, nil
	}
	return 0, fmt.Errorf("selector_retrieve_dot: %s: %d × %d elements: more than %d: %w", what, x, y, int64(sparse.MaxRetrieveElems), engine.ErrInvalidArgument)
}

func selectorRetrieveDot(h int64, layer int32, ids uintptr, n uint64, q uintptr, batch, dim int64, cand uintptr, width int64, topk, workers int32,
	outIdx, outScores, outCount, found uintptr) int32 {
	e, err := selector(h)
	if err != nil {
		return int32(fail(err))
	}
	bids, err := blockIDs(ids, n)
	if err != nil {
		return int32(fail(fmt.Errorf("selector_retrieve_dot: %w", err)))
	}
	l := e.x.Layout()
	if dim != int64(l.LayerFloats()) {
		return int32(fail(fmt.Errorf("selector_retrieve_dot: dim %d: want the representation's %d (rows %d × heads %d × cols %d): %w",
			dim, l.LayerFloats(), l.Rows, l.Heads, l.Cols, engine.ErrInvalidArgument)))
	}
	if err := retrieveElems("batch", batch, 0); err != nil {
		return int32(fail(err))
	}
	if err := retrieveElems("topk", int64(topk), 0); err != nil {
		return int32(fail(err))
	}
	if workers < 1 || workers > maxRetrieverCPUs {
		return int32(fail(fmt.Errorf("selector_retrieve_dot: workers %d: want 1 … %d: %w", workers, maxRetrieverCPUs, engine.ErrInvalidArgument)))
	}
	nq, err := retrieveProduct("query (batch × dim)", batch, dim)
	if err != nil {
		return int32(fail(err))
	}
	nout, err := retrieveProduct("outputs (batch × topk)", batch, int64(topk))
	if err != nil {
		return int32(fail(err))
	}
	var nc uint64
	if cand != 0 {
		if err := retrieveElems("cand_width", width, 0); err != nil {
			return int32(fail(err))
		}
		if nc, err = retrieveProduct("cand (batch × cand_width)", batch, width); err != nil {
			return int32(fail(err))
		}
	}
	spans := []span{{"query", q, nq, 4}, {"cand", cand, nc, 4}, {"out_idx", outIdx, nout, 4}, {"out_scores", outScores, nout, 4}}
	if outCount != 0 {
		spans = append(spans, span{"out_count", outCount, uint64(batch), 8})
	}
	if found != 0 {
		spans = append(spans, span{"found", found, n, 1})
	}
	for _, r := range spans {
		if err := region("selector_retrieve_dot: "+r.name, r.p, r.n, r.size); err != nil {
			return int32(fail(err))
		}
	}
	// Synchronous: the query, candidates and outputs are read and written in place.
	a := &sparse.DotArgs{Dim: int(dim), K: int(topk), Width: int(width)}
	if nq > 0 {
		a.Q = unsafe.Slice((*float32)(at(q)), nq)
	}
	if cand != 0 {
		a.Cand = make([]int32, 0) // not nil: a table (nil is every block)
		if nc > 0 {
			a.Cand = unsafe.Slice((*int32)(at(cand)), nc)
		}
	}
	if nout > 0 {
		a.Idx = unsafe.Slice((*int32)(at(outIdx)), nout)
		a.Scores = unsafe.Slice((*float32)(at(outScores)), nout)
	}
	if outCount != 0 {
		a.Count = make([]int64, 0)
		if batch > 0 {
			a.Count = unsafe.Slice((*int64)(at(outCount)), batch)
		}
	}
	hits, err := e.x.RetrieveDot(int(layer), bids, a, int(workers))
	if err != nil {
		return int32(fail(fmt.Errorf("selector_retrieve_dot: %w", err)))
	}
	if found != 0 && n > 0 {
		copyMask(bytesAt(found, n), hits)
	}
	return int32(statusOK)
}
