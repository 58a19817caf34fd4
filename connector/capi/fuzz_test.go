//go:build cgo

package main

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ucm-go/ucm/connector"
)

// The fuzz store's layout: 4 shards (layers) of two 4 KiB tensors.
const (
	fzTensor = 4096
	fzShards = 4
	fzShard  = 2 * fzTensor
	fzBlock  = fzShards * fzShard
	fzMax    = 8       // blocks of a call whose tables are real memory
	fzSlots  = 1 << 16 // the data slots start here in the mapping
)

// bogus are pointer and address values no caller's memory can have: the entry points must
// refuse each with EPARAM before reading or writing through it (0 and the first page, the top
// of user space and past it, the kernel's half, values that wrap around when sized). An
// address just below the top is not one of them: a span from it that stays below the top is a
// plausible caller's memory, which the library cannot tell from an unmapped one (as no C
// library can); the spans that cross the top are covered by maxAddr itself.
var bogus = []uint64{0, 1, 4095, maxAddr, maxAddr + 4096, 1 << 63, ^uint64(0) - 4095, ^uint64(0) - 4, ^uint64(0)}

// cmem is memory outside Go's heap (an anonymous mapping), as a C caller's: the tables and
// buffers the fuzz target hands the entry points.
type cmem struct{ b []byte }

func (m *cmem) addr(off int) uintptr { return uintptr(unsafe.Pointer(&m.b[off])) }

// fuzzInput reads the fuzz data a byte or a word at a time; past its end it reads zeros.
type fuzzInput struct{ data []byte }

func (in *fuzzInput) byte() byte {
	if len(in.data) == 0 {
		return 0
	}
	b := in.data[0]
	in.data = in.data[1:]
	return b
}

func (in *fuzzInput) u64() uint64 {
	var w [8]byte
	for i := range w {
		w[i] = in.byte()
	}
	return binary.LittleEndian.Uint64(w[:])
}

// pointer picks a table pointer: the real table (mostly), null, or a bogus value. ok says it
// is the real one.
func (in *fuzzInput) pointer(real uintptr) (uintptr, bool) {
	switch b := in.byte(); {
	case b < 200:
		return real, true
	default:
		return uintptr(bogus[int(b)%len(bogus)]), false
	}
}

// count picks n: up to fzMax (the real tables hold that many), or one of the counts that must
// be refused before any table is read.
func (in *fuzzInput) count() (uint64, bool) {
	b := in.byte()
	if b < 230 {
		return uint64(b) % (fzMax + 1), true
	}
	huge := []uint64{maxBlocks + 1, 1 << 40, 1 << 62, 1 << 63, ^uint64(0)}
	return huge[int(b)%len(huge)], false
}

// fuzzStore opens the store the fuzz target drives (in dir) and dumps blocks it checks after
// each input: the store must still work.
func fuzzStore(t testing.TB, mem *cmem, dir string) (int64, []byte) {
	t.Helper()
	config := fmt.Sprintf(`{"storage_backends": [%q], "device_id": 0, "tensor_size_list": [%d, %d], "shard_size": %d, "block_size": %d, "posix_gc_enable": false, "segment_size": 1048576}`+"\x00",
		dir, fzTensor, fzTensor, fzShard, fzBlock)
	copy(mem.b, config)
	h := openStore(mem.addr(0), 0)
	if h <= 0 {
		t.Fatalf("open: %d", h)
	}
	ids := make([]byte, 2*16)
	for i := range ids {
		ids[i] = byte(i*7 + 1)
	}
	copy(mem.b, ids)
	shards := []int64{-1, -1}
	for i, s := range shards {
		binary.LittleEndian.PutUint64(mem.b[32+8*i:], uint64(s))
	}
	for i := range 2 {
		binary.LittleEndian.PutUint64(mem.b[64+8*i:], uint64(mem.addr(fzSlots+i*fzBlock)))
	}
	task := cDump(h, mem.addr(0), mem.addr(32), 2, mem.addr(64), 1)
	if task <= 0 || cWait(h, task, 0, 0) != 0 {
		t.Fatalf("dump of the reference blocks: %d: %s", task, lastError())
	}
	return h, ids
}

// statuses are the codes an entry point may return.
var statuses = map[int64]bool{}

func init() {
	for _, s := range []connector.Status{connector.StatusOK, connector.StatusError, connector.StatusEParam, connector.StatusEOOM,
		connector.StatusEOSError, connector.StatusEDuplicate, connector.StatusERetry, connector.StatusENoObj, connector.StatusEDeserialize,
		connector.StatusEUnsupported, connector.StatusENoSpace, connector.StatusETimeout} {
		statuses[int64(s)] = true
	}
}

// FuzzABI drives the entry points with arbitrary arguments: counts, table pointers (real
// memory, null, or values no caller's memory can have), shard indexes, address counts and
// addresses (in a real buffer, or impossible). Loads and dumps go through the C entry points
// (queue.c's fast path and its fallback into Go), waits and checks through tasks.c, the rest
// through the Go functions their exports call with the same words. No input may crash the
// process; an argument that cannot be the caller's memory, a count past its bound, a shard
// index or address count the layout does not have must be refused with EPARAM and a message;
// and after each input the store still finds the blocks dumped before.
func FuzzABI(f *testing.F) {
	id := []byte(strings.Repeat("0123456789abcdef", fzMax)) // the id table: fzMax ids
	seed := func(parts ...any) []byte {
		var out []byte
		for _, p := range parts {
			switch v := p.(type) {
			case int:
				out = append(out, byte(v))
			case []byte:
				out = append(out, v...)
			}
		}
		return out
	}
	// handle byte, op, count, the id table's bytes, its pointer, then the op's own.
	f.Add(seed(0, 0, 1, id, 0, 0, 0, 0, 2, 0))                      // load shard 0 of one block, one address
	f.Add(seed(0, 1, 1, id, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0)) // dump a whole block, one address per tensor
	f.Add(seed(0, 1, 1, id, 0, 0, 0, 0, 2, 231))                    // dump from address 1
	f.Add(seed(0, 1, 1, id, 0, 0, 0, 0, 2, 238))                    // dump from address 2^64-5
	f.Add(seed(0, 1, 1, id, 0, 0, 0, 0, 2, 237))                    // dump from address 2^64-4096
	f.Add(seed(0, 0, 1, id, 236, 0, 0, 0, 2, 0))                    // an id table at 2^63
	f.Add(seed(0, 0, 1, id, 0, 0, 6, 0, 2, 0))                      // 2^62 addresses per block
	f.Add(seed(0, 0, 230, id, 0, 0, 0, 0))                          // 2^24+1 blocks
	f.Add(seed(0, 2, 1, id, 0, 200, 1, 0, 0, 0, 0, 0, 0, 0))        // wait with a bogus mask
	f.Add(seed(0, 3, 0, id, 0, 236, 1, 0, 0, 0, 0, 0, 0, 0))        // check into 2^63
	f.Add(seed(0, 4, 3, id, 0, 238))                                // lookup into 2^64-5
	f.Add(seed(0, 9, 0, id, 0, 0, 4))                               // stats with a 1 GiB+1 buffer
	f.Add(seed(0, 10, 0, id, 0, 0, 0, 1, 'A', '=', 'b'))            // open_env
	f.Add(seed(241, 1, 2, 3, 4, 5, 6, 7, 8, 0, 2))                  // another handle
	for _, r := range retrieveSeeds() {
		f.Add(r)
	}
	m, err := syscall.Mmap(-1, 0, fzSlots+fzMax*fzBlock, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { syscall.Munmap(m) })
	mem := &cmem{m}
	h, refIDs := fuzzStore(f, mem, f.TempDir())
	f.Cleanup(func() { closeStore(h) })
	f.Fuzz(func(t *testing.T, data []byte) {
		runtime.LockOSThread() // ucmgo_last_error is per thread
		defer runtime.UnlockOSThread()
		clear(mem.b[:fzSlots])
		in := &fuzzInput{data}
		fuzzOne(t, mem, h, in)
		// The store still works.
		copy(mem.b, refIDs)
		if st := lookup(h, mem.addr(0), 2, mem.addr(64)); st != 0 || mem.b[64] != 1 || mem.b[65] != 1 {
			t.Fatalf("the store lost its blocks: status %d, found %v: %s", st, mem.b[64:66], lastError())
		}
	})
}

// Table offsets in the mapping.
const (
	offIDs    = 0
	offShards = 512
	offAddrs  = 1024
	offOut    = 4096
	offEnv    = 8192
)

func fuzzOne(t *testing.T, mem *cmem, h int64, in *fuzzInput) {
	refuse := "" // why the call must be refused with EPARAM
	must := func(cond bool, why string) {
		if cond && refuse == "" {
			refuse = why
		}
	}
	handle := h
	if in.byte() >= 240 { // another store handle: never the open one
		if handle = int64(in.u64()); handle == h {
			handle = -h
		}
		must(true, "store handle")
	}
	op := in.byte() % 12
	// Which arguments the op takes: check (3), stats (9) and open_env (10) take no count, and
	// only the transfers and the id calls take the id table.
	takesCount := op <= 2 || (op >= 4 && op <= 8)
	if op == 11 { // the retriever ABI (retrieve_fuzz_test.go): its own handle and arguments
		st, why := fuzzRetrieve(t, mem, in)
		refuse = why
		if !statuses[st] && st <= 0 {
			t.Fatalf("retrieve: status %d is none of UCM's", st)
		}
		if refuse != "" && (st != int64(connector.StatusEParam) || lastError() == "") {
			t.Fatalf("retrieve: %s impossible, got %d, want EPARAM (%d): %s", refuse, st, connector.StatusEParam, lastError())
		}
		return
	}
	takesIDs := op <= 1 || (op >= 4 && op <= 8)
	n, nOK := in.count()
	must(takesCount && !nOK, "count")
	// The ids: distinct, nonzero.
	for i := range fzMax {
		for j := range 16 {
			mem.b[offIDs+16*i+j] = in.byte() ^ byte(i+1)
		}
	}
	ids, idsOK := in.pointer(mem.addr(offIDs))
	must(takesIDs && n > 0 && !idsOK, "id table")
	var st int64
	switch op {
	case 0, 1: // ucmgo_load, ucmgo_dump
		shards, shOK := in.pointer(mem.addr(offShards))
		must(n > 0 && !shOK, "shard table")
		perChoices := []uint64{1, 2, fzShards, 2 * fzShards, 0, 3, 1 << 62, ^uint64(0)}
		per := perChoices[int(in.byte())%len(perChoices)]
		must(n > 0 && (per == 0 || per > 2*fzShards), "address count")
		table, tOK := in.pointer(mem.addr(offAddrs))
		must(n > 0 && per <= 2*fzShards && !tOK, "address table")
		for i := range min(n, fzMax) {
			v := int64(in.byte()%7) - 2 // -2 .. 4: -1 the whole block, 0..3 a shard, the rest out of range
			if v == -2 {
				v = int64(in.u64())
			}
			binary.LittleEndian.PutUint64(mem.b[offShards+8*int(i):], uint64(v))
			must(shOK && (v < -1 || v >= fzShards), "shard index")
			whole := v == -1
			must(shOK && v >= -1 && v < fzShards && per <= 2*fzShards && !(per == 1 || (!whole && per == 2) || (whole && (per == fzShards || per == 2*fzShards))), "address count for the form")
			for j := range min(per, 2*fzShards) {
				a := uint64(mem.addr(fzSlots + int(i)*fzBlock + int(j)*fzTensor))
				if b := in.byte(); b >= 230 {
					a = bogus[int(b)%len(bogus)]
					must(tOK && j < per, "address")
				}
				binary.LittleEndian.PutUint64(mem.b[offAddrs+8*int(i*per+j):], a)
			}
		}
		if op == 0 {
			st = cLoad(handle, ids, shards, n, table, per)
		} else {
			st = cDump(handle, ids, shards, n, table, per)
		}
		if st > 0 {
			// The task's own mask, or an impossible one (refused, the handle kept). A task of no
			// blocks has a mask of no entries, which is never read wherever it points.
			if in.byte() >= 200 && n > 0 {
				if ws := cWait(handle, st, uintptr(bogus[1+int(in.byte())%(len(bogus)-1)]), n); ws != int32(connector.StatusEParam) {
					t.Fatalf("wait with an impossible mask for %d blocks: %d", n, ws)
				}
			}
			if ws := cWait(handle, st, mem.addr(offOut), n); !statuses[int64(ws)] {
				t.Fatalf("wait: status %d", ws)
			}
		}
	case 2: // ucmgo_wait of an arbitrary task
		mask, _ := in.pointer(mem.addr(offOut))
		st = int64(cWait(handle, int64(in.u64()), mask, n))
	case 3: // ucmgo_check of an arbitrary task
		fin, finOK := in.pointer(mem.addr(offOut))
		st = int64(cCheck(handle, int64(in.u64()), fin))
		must(!finOK, "result pointer")
	case 4: // ucmgo_lookup
		found, fOK := in.pointer(mem.addr(offOut))
		must(n > 0 && !fOK, "result array")
		st = int64(lookup(handle, ids, n, found))
	case 5: // ucmgo_lookup_on_prefix
		idx, iOK := in.pointer(mem.addr(offOut))
		must(!iOK, "result pointer")
		st = int64(lookupOnPrefix(handle, ids, n, idx))
	case 6: // ucmgo_prefetch
		st = int64(prefetch(handle, ids, n))
	case 7, 8: // ucmgo_create, then ucmgo_commit (discarding)
		res, rOK := in.pointer(mem.addr(offOut))
		must(n > 0 && !rOK, "result array")
		if st = int64(create(handle, ids, n, res)); st == 0 && op == 8 {
			st = int64(commit(handle, ids, n, 0))
		}
	case 9: // ucmgo_stats
		buf, bOK := in.pointer(mem.addr(offOut))
		sizes := []uint64{0, 1, 16, 4096, maxStatsBuffer + 1, 1 << 40, ^uint64(0)}
		size := sizes[int(in.byte())%len(sizes)]
		must(buf != 0 && (size > maxStatsBuffer || (size > 0 && !bOK)), "stats buffer")
		st = stats(handle, buf, size)
		if st >= 0 && bOK && size > 0 && size <= 4096 && !strings.Contains(string(mem.b[offOut:offOut+int(size)]), "\x00") {
			t.Fatalf("stats: no NUL in a %d-byte buffer", size)
		}
	case 10: // ucmgo_open_env with a config no store opens from, and an arbitrary environment
		copy(mem.b[offIDs:], `{"storage_backends": "/nonexistent", "shard_sise": 1}`+"\x00")
		config, cOK := in.pointer(mem.addr(offIDs))
		env, eOK := in.pointer(mem.addr(offEnv))
		entries := int(in.byte() % 4)
		for i := range entries {
			s := offEnv + 256 + 64*i
			copy(mem.b[s:s+63], in.data[:min(len(in.data), 63)])
			in.data = in.data[min(len(in.data), 63):]
			entry := uint64(mem.addr(s))
			if in.byte() >= 240 {
				entry = bogus[1+int(in.byte())%(len(bogus)-1)]
			}
			binary.LittleEndian.PutUint64(mem.b[offEnv+8*i:], entry)
		}
		binary.LittleEndian.PutUint64(mem.b[offEnv+8*entries:], 0)
		must(config != 0 && !cOK, "config")
		must(env != 0 && !eOK, "environment")
		st = openStore(config, env)
		if st > 0 {
			closeStore(st)
			t.Fatalf("a store opened from a config with an unknown key")
		}
		must(true, "config") // the config is always refused
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
