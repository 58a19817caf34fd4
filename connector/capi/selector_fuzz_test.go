//go:build cgo

package main

import (
	"encoding/binary"
	"math"
	"runtime"
	"syscall"
	"testing"

	"github.com/ucm-go/ucm/connector"
)

// The fuzz selector's model: 4 layers (the fuzz store's 4 shards), 2 query heads over 1 KV
// head of 8 dims, blocks of 4 tokens. ESA: one layer of a block is 8 floats, a block 32.
const (
	fsShape   = `{"layers": 4, "q_heads": 2, "kv_heads": 1, "head_dim": 8, "block_size": 4}`
	fsConfig  = "ESA:\n  sparse_ratio: 0.3\n  init_window_sz: 1\n  local_window_sz: 1\n"
	fsQ       = 16 // query floats of one token
	fsKBytes  = 4 * 8 * 2
	fsLayerF  = 8
	fsBlockF  = 32
	fsLayers  = 4
	offStr    = 12288 // C strings: request id
	offQ      = 13312
	offData   = 16384 // K or representations
	fsDataCap = fzSlots - offData
)

// cString writes s NUL-terminated at off and returns its address.
func cString(mem *cmem, off int, s string) uintptr {
	copy(mem.b[off:], s)
	mem.b[off+len(s)] = 0
	return mem.addr(off)
}

// FuzzSelectorABI drives the selector entry points (selector.go) with arbitrary arguments as
// FuzzABI does the store's: counts, table and output pointers (real memory, null, or values no
// caller's memory can have), layers, dtypes, address and float counts, query lengths, seq_len
// and output capacities. No input may crash the process; an impossible pointer, a count past
// its bound, a size the selector's layout does not have must be refused with EPARAM and a
// message; and after each input the selector still selects over the reference blocks.
func FuzzSelectorABI(f *testing.F) {
	f.Add([]byte{0, 1})                      // dump the representation of one block
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0, 0})    // put
	f.Add([]byte{2, 1, 0, 0, 0, 0, 0, 0, 0}) // load
	f.Add([]byte{3, 0, 0, 0, 0, 0})          // shape
	f.Add([]byte{4, 2})                      // select
	f.Add([]byte{5, 2})                      // submit, check, wait, release
	f.Add([]byte{4, 2, 0, 0, 0, 0, 0, 236})  // select into 2^63
	f.Add([]byte{0, 230})                    // 2^24+1 blocks
	f.Add([]byte{6, 201})                    // request_finished with a bogus id
	// retrieve_dot over the reference blocks and one without a representation (the bytes after
	// the count fill the 8 ids of the table), every row a candidate; then with candidates.
	ids := make([]byte, 16*fzMax)
	f.Add(append([]byte{0, 7, 3}, ids...))
	withCand := append(append([]byte{0, 7, 3}, ids...), 0, 0, 0, 0, 1, 0, 0, 0) // batch 2
	for i := range 2 * fsLayerF {
		withCand = append(withCand, byte(i*7))
	}
	withCand = append(withCand, 1, 0, 3, 2, 1, 0) // width 2: {2, 1}, {0, -1}
	f.Add(withCand)
	m, err := syscall.Mmap(-1, 0, fzSlots+fzMax*fzBlock, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { syscall.Munmap(m) })
	mem := &cmem{m}
	h, refIDs := fuzzStore(f, mem, f.TempDir())
	f.Cleanup(func() { closeStore(h) })
	sel := selectorOpen(h, cString(mem, offStr, fsConfig), cString(mem, offStr+512, fsShape))
	if sel <= 0 {
		f.Fatalf("selector open: %d: %s", sel, lastError())
	}
	// The reference blocks' representations, from K of varied values.
	copy(mem.b[offIDs:], refIDs)
	for i := range 2 * fsLayers {
		for j := range fsKBytes / 2 {
			binary.LittleEndian.PutUint16(mem.b[offData+i*fsKBytes+2*j:], uint16(0x3c00+(i*37+j*11)%512))
		}
		binary.LittleEndian.PutUint64(mem.b[offAddrs+8*i:], uint64(mem.addr(offData+i*fsKBytes)))
	}
	if task := reprsDump(sel, mem.addr(offIDs), 2, mem.addr(offAddrs), fsLayers, 1); task <= 0 || cWait(h, task, 0, 0) != 0 {
		f.Fatalf("reference representations: %d: %s", task, lastError())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		clear(mem.b[:fzSlots])
		in := &fuzzInput{data}
		fuzzSelectorOne(t, mem, h, sel, in, refIDs)
		// The selector still selects over the reference blocks.
		copy(mem.b[offIDs:], refIDs)
		for i := range fsQ {
			binary.LittleEndian.PutUint32(mem.b[offQ+4*i:], math.Float32bits(float32(i%3)))
		}
		st := selectSubmit(sel, cString(mem, offStr, "check"), 1, 0, mem.addr(offQ), fsQ, mem.addr(offIDs), 2, 9, mem.addr(offOut), 3, mem.addr(offOut+64), 0, 0)
		if st <= 0 || selectWait(sel, st, false) != 0 || selectWait(sel, st, true) != 0 {
			t.Fatalf("the selector no longer selects: %d: %s", st, lastError())
		}
		// 3 blocks, windows of 1 and 1: the first and the last at least.
		n := binary.LittleEndian.Uint64(mem.b[offOut+64:])
		first, last := binary.LittleEndian.Uint32(mem.b[offOut:]), binary.LittleEndian.Uint32(mem.b[offOut+4*int(min(n, 3)-1):])
		if n < 2 || n > 3 || first != 0 || last != 2 {
			t.Fatalf("a context of 3 blocks selected %d blocks, first %d, last %d", n, first, last)
		}
	})
}

func fuzzSelectorOne(t *testing.T, mem *cmem, h, sel int64, in *fuzzInput, refIDs []byte) {
	refuse := ""
	must := func(cond bool, why string) {
		if cond && refuse == "" {
			refuse = why
		}
	}
	handle := sel
	if in.byte() >= 240 {
		if handle = int64(in.u64()); handle == sel {
			handle = -sel
		}
		must(true, "selector handle")
	}
	op := in.byte() % 8
	takesIDs := op <= 2 || op == 4 || op == 5 || op == 7
	n, nOK := in.count()
	must(takesIDs && !nOK, "count")
	for i := range fzMax {
		for j := range 16 {
			mem.b[offIDs+16*i+j] = in.byte() ^ byte(i+1)
		}
	}
	if op == 7 && in.byte()%2 == 0 { // the reference blocks, which have representations, first
		copy(mem.b[offIDs:], refIDs)
	}
	ids, idsOK := in.pointer(mem.addr(offIDs))
	must(takesIDs && n > 0 && !idsOK, "id table")
	var st int64
	switch op {
	case 0: // ucmgo_reprs_dump
		perChoices := []uint64{fsLayers, 0, 3, 1 << 62}
		per := perChoices[int(in.byte())%len(perChoices)]
		dtChoices := []int32{1, 5, 2, 0, 9, -1}
		dt := dtChoices[int(in.byte())%len(dtChoices)]
		must(dt < 1 || dt > 5, "k_dtype")
		must(n > 0 && per != fsLayers, "addrs_per_block")
		table, tOK := in.pointer(mem.addr(offAddrs))
		must(n > 0 && per == fsLayers && !tOK, "K address table")
		size := fsKBytes
		if dt == 5 {
			size *= 2
		}
		for i := range min(n, fzMax) * min(per, fsLayers) {
			a := uint64(mem.addr(offData + int(i)*size))
			if b := in.byte(); b >= 230 {
				a = bogus[int(b)%len(bogus)]
				must(tOK && per == fsLayers, "K address")
			}
			binary.LittleEndian.PutUint64(mem.b[offAddrs+8*int(i):], a)
			for j := range size {
				mem.b[offData+int(i)*size+j] = in.byte()
			}
		}
		st = reprsDump(handle, ids, n, table, per, dt)
		if st > 0 {
			if ws := cWait(h, st, mem.addr(offOut), n); !statuses[int64(ws)] {
				t.Fatalf("wait of a representation dump: status %d", ws)
			}
		}
	case 1: // ucmgo_reprs_put
		perChoices := []uint64{fsBlockF, 0, fsBlockF - 1, 1 << 62}
		per := perChoices[int(in.byte())%len(perChoices)]
		must(n > 0 && per != fsBlockF, "floats_per_block")
		reprs, rOK := in.pointer(mem.addr(offData))
		must(n > 0 && per == fsBlockF && !rOK, "representations")
		for i := range min(n, fzMax) * fsBlockF {
			binary.LittleEndian.PutUint32(mem.b[offData+4*int(i):], math.Float32bits(float32(int8(in.byte()))/8))
		}
		st = reprsPut(handle, ids, n, reprs, per)
		if st > 0 {
			if ws := cWait(h, st, 0, 0); !statuses[int64(ws)] {
				t.Fatalf("wait of a representation put: status %d", ws)
			}
		}
	case 2: // ucmgo_reprs_load
		layer := int32(in.byte()%6) - 1
		perChoices := []uint64{fsLayerF, 0, fsLayerF + 1, 1 << 62}
		per := perChoices[int(in.byte())%len(perChoices)]
		dst, dOK := in.pointer(mem.addr(offData))
		found, fOK := in.pointer(mem.addr(offOut))
		must(per != fsLayerF, "floats_per_block")
		must(n > 0 && !dOK, "destination")
		must(n > 0 && !fOK, "found")
		must(layer < 0 || layer >= fsLayers, "layer")
		st = int64(reprsLoad(handle, layer, ids, n, dst, per, found))
	case 3: // ucmgo_reprs_shape
		var ptrs [5]uintptr
		for i := range ptrs {
			p, ok := in.pointer(mem.addr(offOut + 8*i))
			ptrs[i] = p
			must(!ok, "result pointer")
		}
		st = int64(reprsShape(handle, ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4]))
		if st == 0 && binary.LittleEndian.Uint64(mem.b[offOut+8:]) != 1 {
			t.Fatalf("ESA's rows: %d", binary.LittleEndian.Uint64(mem.b[offOut+8:]))
		}
	case 4, 5: // ucmgo_select, or submit then check, wait and release
		req, reqOK := in.pointer(cString(mem, offStr, "fz"))
		must(!reqOK, "request id")
		layer := int32(in.byte()%6) - 1
		must(layer < 0 || layer >= fsLayers, "layer")
		qLens := []uint64{fsQ, 2 * fsQ, fsQ - 1, 0, 1 << 62}
		qLen := qLens[int(in.byte())%len(qLens)]
		must(qLen == 0 || qLen > fsQ*4096 || qLen == fsQ-1, "q_len")
		q, qOK := in.pointer(mem.addr(offQ))
		must(qLen > 0 && qLen <= fsQ*4096 && !qOK, "query")
		for i := range 2 * fsQ {
			binary.LittleEndian.PutUint32(mem.b[offQ+4*i:], math.Float32bits(float32(int8(in.byte()))/16))
		}
		seqs := []int64{int64(min(n, fzMax))*4 + 1, 0, -1, 1 << 62, 3}
		seq := seqs[int(in.byte())%len(seqs)]
		must(seq < 1 || seq > int64(maxBlocks)*4, "seq_len")
		caps := []uint64{64, 0, 1 << 62, 2}
		capacity := caps[int(in.byte())%len(caps)]
		nb := uint64(max(seq, 0)+3) / 4
		must(seq >= 1 && seq <= int64(maxBlocks)*4 && (capacity < nb || capacity > maxBlocks), "out_capacity")
		blocks, bOK := in.pointer(mem.addr(offOut))
		count, cOK := in.pointer(mem.addr(offOut + 512))
		must(capacity > 0 && capacity <= maxBlocks && !bOK, "out_blocks")
		must(!cOK, "out_count")
		var heads, hc uintptr
		switch in.byte() % 4 {
		case 1:
			heads, hc = mem.addr(offOut+1024), mem.addr(offOut+2048)
		case 2:
			heads = mem.addr(offOut + 1024)
			must(true, "out_heads and out_head_counts")
		case 3:
			var ok bool
			heads, ok = in.pointer(mem.addr(offOut + 1024))
			hc = mem.addr(offOut + 2048)
			must(capacity <= maxBlocks && !ok, "out_heads")
		}
		if op == 4 {
			st = int64(selectSync(handle, req, layer, int64(in.byte()), q, qLen, ids, n, seq, blocks, capacity, count, heads, hc))
			break
		}
		st = selectSubmit(handle, req, layer, int64(in.byte()), q, qLen, ids, n, seq, blocks, capacity, count, heads, hc)
		if st > 0 {
			fin, finOK := in.pointer(mem.addr(offOut + 3072))
			if cs := selectCheck(sel, st, fin); !finOK && cs != int32(connector.StatusEParam) {
				t.Fatalf("check into an impossible pointer: %d", cs)
			}
			if ws := selectWait(sel, st, false); !statuses[int64(ws)] {
				t.Fatalf("select wait: %d", ws)
			}
			if rs := selectWait(sel, st, true); rs != 0 {
				t.Fatalf("release: %d: %s", rs, lastError())
			}
			if rs := selectWait(sel, st, true); rs != int32(connector.StatusENoObj) {
				t.Fatalf("second release: %d", rs)
			}
		}
	case 6: // ucmgo_selector_request_finished
		req, reqOK := in.pointer(cString(mem, offStr, "fz"))
		must(!reqOK, "request id")
		st = int64(selectorRequestFinished(handle, req))
	case 7: // ucmgo_selector_retrieve_dot
		st = fuzzRetrieveDot(t, mem, handle, in, ids, n, nOK && (n == 0 || idsOK), must)
	}
	if !statuses[st] && st <= 0 {
		t.Fatalf("op %d: status %d is none of UCM's", op, st)
	}
	if refuse != "" {
		if st != int64(connector.StatusEParam) {
			t.Fatalf("op %d: %s impossible, got %d, want EPARAM (%d): %s", op, refuse, st, connector.StatusEParam, lastError())
		}
		if lastError() == "" {
			t.Fatalf("op %d: EPARAM without a message", op)
		}
	}
}

// fuzzRetrieveDot drives ucmgo_selector_retrieve_dot with the selector's n ids at ids (idsOK:
// real memory of a bounded count): layer, dim, batch, topk, workers, the query, candidate and
// output pointers and the candidates themselves; must records what has to be refused. A
// retrieval that succeeds must have written well-formed rows: at most topk positions into ids
// of blocks found, then -1.
func fuzzRetrieveDot(t *testing.T, mem *cmem, handle int64, in *fuzzInput, ids uintptr, n uint64, idsOK bool, must func(bool, string)) int64 {
	layers := []int32{1, 0, 3, fsLayers, -1, 1 << 30}
	layer := layers[int(in.byte())%len(layers)]
	must(layer < 0 || layer >= fsLayers, "layer")
	dims := []int64{fsLayerF, 0, fsLayerF - 1, 1 << 62}
	dim := dims[int(in.byte())%len(dims)]
	must(dim != fsLayerF, "dim")
	batches := []int64{1, 2, 0, -1, 1 << 40}
	batch := batches[int(in.byte())%len(batches)]
	must(batch < 0 || batch > 1<<31, "batch")
	topks := []int32{3, 0, 9, -1}
	topk := topks[int(in.byte())%len(topks)]
	must(topk < 0, "topk")
	workerChoices := []int32{1, 2, 0, 2000}
	workers := workerChoices[int(in.byte())%len(workerChoices)]
	must(workers < 1 || workers > maxRetrieverCPUs, "workers")
	sane := dim == fsLayerF && batch >= 0 && batch <= 2 && topk >= 0
	q, qOK := in.pointer(mem.addr(offQ))
	must(sane && batch > 0 && !qOK, "query")
	for i := range 2 * fsLayerF {
		binary.LittleEndian.PutUint32(mem.b[offQ+4*i:], math.Float32bits(float32(int8(in.byte()))/16))
	}
	var cand uintptr
	var width int64
	switch in.byte() % 3 {
	case 1:
		widths := []int64{2, 0, 3, -1}
		width = widths[int(in.byte())%len(widths)]
		must(width < 0, "cand_width")
		cand = mem.addr(offOut + 2048)
		for i := range 6 {
			c := int32(in.byte()%(fzMax+2)) - 1 // -1 … fzMax: outside [-1, n) for some
			binary.LittleEndian.PutUint32(mem.b[offOut+2048+4*i:], uint32(c))
			if sane && width > 0 && int64(i) < batch*width && int64(c) >= int64(n) && idsOK {
				must(true, "candidate")
			}
		}
	case 2:
		var ok bool
		cand, ok = in.pointer(mem.addr(offOut + 2048))
		width = 2
		must(sane && batch > 0 && !ok && cand != 0, "cand") // NULL: no table, every block
		if ok {
			clear(mem.b[offOut+2048 : offOut+2048+4*4]) // block 0 for every entry
			if n == 0 && idsOK {
				must(sane && batch > 0, "candidate")
			}
		}
	}
	outIdx, iOK := in.pointer(mem.addr(offOut))
	outScores, sOK := in.pointer(mem.addr(offOut + 512))
	must(sane && batch > 0 && topk > 0 && (!iOK || !sOK), "outputs")
	var count, found uintptr
	if in.byte()%2 == 0 {
		var ok bool
		count, ok = in.pointer(mem.addr(offOut + 1024))
		must(sane && batch > 0 && !ok && count != 0, "out_count") // NULL: not wanted
	}
	if in.byte()%2 == 0 {
		var ok bool
		found, ok = in.pointer(mem.addr(offOut + 1536))
		must(sane && n > 0 && idsOK && !ok && found != 0, "found") // NULL: not wanted
	}
	st := int64(selectorRetrieveDot(handle, layer, ids, n, q, batch, dim, cand, width, topk, workers, outIdx, outScores, count, found))
	if st != 0 || batch == 0 || topk == 0 {
		return st
	}
	for b := range int(batch) {
		c := int64(topk)
		if count != 0 {
			c = int64(binary.LittleEndian.Uint64(mem.b[offOut+1024+8*b:]))
			if c < 0 || c > int64(topk) { // duplicate candidates may count a block twice
				t.Fatalf("row %d: count %d for topk %d", b, c, topk)
			}
		}
		for j := range int64(topk) {
			x := int32(binary.LittleEndian.Uint32(mem.b[offOut+4*(b*int(topk)+int(j)):]))
			switch {
			case count != 0 && j >= c && x != -1:
				t.Fatalf("row %d entry %d past the count %d: %d, want -1", b, j, c, x)
			case x < -1 || int64(x) >= int64(n):
				t.Fatalf("row %d entry %d: position %d outside [-1, %d)", b, j, x, n)
			case x >= 0 && found != 0 && mem.b[offOut+1536+int(x)] != 1:
				t.Fatalf("row %d entry %d: position %d, a block without a representation", b, j, x)
			}
		}
	}
	return st
}
