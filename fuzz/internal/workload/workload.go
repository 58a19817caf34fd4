// Package workload is shared by the crash suites of package fuzz: block ids and payloads that
// are a deterministic function of (id, seed), so a checker needs no oracle file, and a
// checker of the crash contract over an event log of dumps.
//
// The event log is the line protocol a writer process reports over a pipe:
//
//	START <hex id>    a dump of the block is about to be issued: it may be present after a crash
//	ACK <hex id>      the dump (or Commit(true)) returned nil: it must be present, byte-identical
//	DISCARD <hex id>  Commit(false), or a failed Commit, returned: it must be absent
//	                  unless also acknowledged
//
// Any other line is ignored by State.Apply (the caller may use it for its own purposes).
package workload

import (
	"bytes"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

// Kind separates the id namespaces of a workload so that, for example, ids meant to be
// discarded are never produced by a generator of ids meant to be stored.
type Kind byte

// Kinds of blocks.
const (
	Whole     Kind = 'W' // whole-block Dump
	LayerWise Kind = 'L' // DumpShard of every shard
	V0Commit  Kind = 'V' // Create + Dump + Commit(true)
	V0Discard Kind = 'X' // Create + Dump + Commit(false)
	V0Partial Kind = 'P' // Create + some shards + Commit(true): fails, never visible
)

// ID returns the block id of the n-th block of kind k in cycle `cycle` of a run seeded with
// seed. Distinct arguments give distinct ids (MD5 of their text).
func ID(seed uint64, cycle int, k Kind, n int) format.BlockID {
	return md5.Sum(fmt.Appendf(nil, "ucm-workload/%d/%d/%c/%d", seed, cycle, k, n))
}

// pageSize is the unit of a payload's pattern: every 4 KiB page of a block holds the block's
// pattern stamped with the page number, so a check catches another block's bytes, a page at
// the wrong offset, and a page torn between two writes.
const pageSize = 4096

// Fill writes the payload of block id under seed into b (any length): a 4 KiB pseudo-random
// pattern that is a function of (id, seed), repeated, each page's first 16 bytes replaced by a
// stamp of (id, seed, page number). Cheap enough for the race detector (the pattern is made
// once, pages are copied).
func Fill(id format.BlockID, seed uint64, b []byte) {
	k0, k1 := binary.LittleEndian.Uint64(id[:8]), binary.LittleEndian.Uint64(id[8:])
	r := rand.NewPCG(k0^seed, k1)
	var pat [pageSize]byte
	for i := 0; i < pageSize; i += 8 {
		binary.LittleEndian.PutUint64(pat[i:], r.Uint64())
	}
	var stamp [16]byte
	for off, page := 0, uint64(0); off < len(b); off, page = off+pageSize, page+1 {
		n := copy(b[off:], pat[:])
		binary.LittleEndian.PutUint64(stamp[:8], k0^seed^page)
		binary.LittleEndian.PutUint64(stamp[8:], k1+page*0x9e3779b97f4a7c15)
		copy(b[off:off+n], stamp[:])
	}
}

// Block returns the payload of a whole block of n bytes.
func Block(id format.BlockID, seed uint64, n int64) []byte {
	b := make([]byte, n)
	Fill(id, seed, b)
	return b
}

// Check reports whether got is the payload of block id under seed, starting at byte offset
// off of the block (a shard is checked with off = shard × ShardBytes), naming the first
// differing byte.
func Check(id format.BlockID, seed uint64, off int64, got []byte) error {
	want := make([]byte, off+int64(len(got)))
	Fill(id, seed, want)
	want = want[off:]
	if bytes.Equal(want, got) {
		return nil
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("block %s: byte %d is %#02x, want %#02x (of %d bytes at offset %d)", id, off+int64(i), got[i], want[i], len(got), off)
		}
	}
	return fmt.Errorf("block %s: bytes differ", id)
}

// Sidecars of the workloads: kind SidecarKind, one part of SidecarPart bytes per shard of the
// block, a function of the block id (Sidecar).
const SidecarKind format.SidecarKind = 1

// SidecarPart is the bytes of one part of a workload sidecar.
const SidecarPart = 128

const sidecarSeed = 0x5eedca7

// Sidecar returns the sidecar bytes of block id for parts parts.
func Sidecar(id format.BlockID, seed uint64, parts int) []byte {
	return Block(id, seed^sidecarSeed, int64(parts)*SidecarPart)
}

// State is what a crash may and may not lose, built from the event log. Safe for concurrent
// use. Sidecar events (SIDE_START, SIDE_ACK) say the same of the blocks' sidecars.
type State struct {
	mu        sync.Mutex
	started   map[format.BlockID]bool
	acked     map[format.BlockID]bool
	discarded map[format.BlockID]bool
	// sideStarted and sideAcked: sidecars whose dump started, and was acknowledged.
	sideStarted, sideAcked map[format.BlockID]bool
	touched                map[format.BlockID]int // epoch of the id's last event
	epoch                  int
	acks                   int64 // ACK lines, duplicates included
}

// NewState returns an empty state.
func NewState() *State {
	return &State{started: map[format.BlockID]bool{}, acked: map[format.BlockID]bool{},
		discarded: map[format.BlockID]bool{}, touched: map[format.BlockID]int{},
		sideStarted: map[format.BlockID]bool{}, sideAcked: map[format.BlockID]bool{}}
}

// NextEpoch starts a new epoch (a crash cycle, say) and returns its number; every event
// applied from now on is of that epoch (see VerifyOptions.RecentEpochs).
func (s *State) NextEpoch() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	return s.epoch
}

// Apply records one line of the event log. It reports whether the line was an event; a
// malformed event is an error.
func (s *State) Apply(line string) (bool, error) {
	verb, arg, ok := strings.Cut(strings.TrimSpace(line), " ")
	var m map[format.BlockID]bool
	s.mu.Lock()
	defer s.mu.Unlock()
	switch verb {
	case "START":
		m = s.started
	case "ACK":
		m = s.acked
		s.acks++
	case "DISCARD":
		m = s.discarded
	case "SIDE_START":
		m = s.sideStarted
	case "SIDE_ACK":
		m = s.sideAcked
	default:
		return false, nil
	}
	if !ok {
		return true, fmt.Errorf("event %q: no block id", line)
	}
	id, err := format.ParseBlockID(arg)
	if err != nil {
		return true, fmt.Errorf("event %q: %w", line, err)
	}
	m[id] = true
	s.touched[id] = s.epoch
	return true, nil
}

// Counts returns the number of distinct started, acknowledged and discarded ids and of ACK
// events.
func (s *State) Counts() (started, acked, discarded int, acks int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.started), len(s.acked), len(s.discarded), s.acks
}

// Result is what Verify checked.
type Result struct {
	Present  int // blocks in the index
	Acked    int // distinct acknowledged blocks, all present and byte-identical
	Verified int // blocks loaded and compared byte for byte
	Lost     int // acknowledged blocks missing (a failure)
	Wrong    int // visible blocks that loaded with wrong bytes (torn, another block's: a failure)
	// Sidecars counts the sidecars found (beside a present block) and compared byte for byte.
	Sidecars int
}

// VerifyOptions bound what Verify reads.
type VerifyOptions struct {
	// SegDir, when set, is the store's segment directory: the index's file bytes must equal
	// the sizes of the files in it.
	SegDir string
	// Sample, when positive, bounds the blocks loaded and compared: every block with an
	// event in the last RecentEpochs epochs, and Sample others chosen with Rand. Zero: every
	// block in the index. Lookup still covers every known id.
	Sample       int
	RecentEpochs int
	Rand         *rand.Rand
}

// maxProblems bounds the problems Verify lists.
const maxProblems = 20

// Verify checks an engine opened on a store the writer crashed in, against the event log:
//
//   - every acknowledged block is present (Lookup) and loads byte-identical;
//   - no discarded, never acknowledged block is visible;
//   - every block in the index was started (no phantom ids), loads, and is byte-identical
//     (never torn, never another block's bytes): every one, or a sample (opts.Sample);
//   - the index's space accounting agrees with itself, and with the segment files' sizes
//     when segDir is not empty.
func (s *State) Verify(e *engine.Engine, seed uint64, opts VerifyOptions) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var res Result
	var problems []string
	fail := func(f string, args ...any) {
		if len(problems) < maxProblems {
			problems = append(problems, fmt.Sprintf(f, args...))
		} else if len(problems) == maxProblems {
			problems = append(problems, "...")
		}
	}

	// Lookup of every known id.
	known := make([]format.BlockID, 0, len(s.started)+len(s.discarded))
	for id := range s.started {
		known = append(known, id)
	}
	for id := range s.discarded {
		if !s.started[id] {
			known = append(known, id)
		}
	}
	for id := range s.acked {
		if !s.started[id] && !s.discarded[id] {
			fail("block %s acknowledged but never started (event log out of order)", id)
			known = append(known, id)
		}
	}
	hits := e.Lookup(known)
	hit := make(map[format.BlockID]bool, len(known))
	for i, id := range known {
		hit[id] = hits[i]
		switch {
		case s.acked[id] && !hits[i]:
			res.Lost++
			fail("acknowledged block %s lost", id)
		case s.discarded[id] && !s.acked[id] && hits[i]:
			fail("discarded block %s visible", id)
		}
	}
	res.Acked = len(s.acked)

	// Every indexed block: started, and byte-identical.
	var present []format.BlockID
	if err := e.Index().Iterate(func(id format.BlockID, _ index.Location) bool {
		present = append(present, id)
		return true
	}); err != nil {
		fail("iterate index: %v", err)
	}
	res.Present = len(present)
	for _, id := range present {
		if !s.started[id] && !s.acked[id] {
			fail("block %s in the index was never dumped (phantom)", id)
		} else if !hit[id] {
			fail("block %s in the index but Lookup misses it", id)
		}
	}
	load := present
	if opts.Sample > 0 {
		load = nil
		var rest []format.BlockID
		for _, id := range present {
			if ep, ok := s.touched[id]; ok && ep > s.epoch-opts.RecentEpochs {
				load = append(load, id)
			} else {
				rest = append(rest, id)
			}
		}
		if opts.Rand != nil {
			opts.Rand.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
		}
		load = append(load, rest[:min(len(rest), opts.Sample)]...)
	}
	l := e.Layout()
	const batch = 32
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = devio.AlignedBuffer(int(l.BlockBytes()))
	}
	for lo := 0; lo < len(load); lo += batch {
		ids := load[lo:min(lo+batch, len(load))]
		dst := bufs[:len(ids)]
		t := e.Load(ids, dst)
		_ = t.Wait()
		for i, err := range t.BlockErrors() {
			if err != nil {
				fail("visible block %s does not load: %v", ids[i], err)
				continue
			}
			if err := Check(ids[i], seed, 0, dst[i]); err != nil {
				res.Wrong++
				fail("visible block loads wrong bytes: %v", err)
				continue
			}
			res.Verified++
		}
	}
	// Sidecars of every known id, first and last part: none without its block, none never
	// dumped, every one byte-identical, the acknowledged ones of present blocks there.
	parts := l.Shards
	want := map[format.BlockID][]byte{}
	for _, p := range []int{0, parts - 1} {
		dst := make([]byte, len(known)*SidecarPart)
		found, err := e.LoadSidecars(SidecarKind, p, known, dst)
		if err != nil {
			fail("load sidecars: %v", err)
			break
		}
		for i, id := range known {
			switch {
			case found[i] && !hits[i]:
				fail("sidecar of block %s outlives its block", id)
			case found[i] && !s.sideStarted[id]:
				fail("sidecar of block %s found, never dumped (phantom)", id)
			case found[i]:
				if want[id] == nil {
					want[id] = Sidecar(id, seed, parts)
				}
				if !bytes.Equal(dst[i*SidecarPart:(i+1)*SidecarPart], want[id][p*SidecarPart:(p+1)*SidecarPart]) {
					fail("sidecar of block %s part %d: wrong bytes", id, p)
				} else if p == 0 {
					res.Sidecars++
				}
			case hits[i] && s.sideAcked[id]:
				fail("acknowledged sidecar of block %s lost (its block is present)", id)
			}
		}
	}
	if err := e.Index().CheckAccounting(); err != nil {
		fail("accounting: %v", err)
	}
	if opts.SegDir != "" {
		if err := fileSizesMatch(e, opts.SegDir); err != nil {
			fail("%v", err)
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems[:min(len(problems), maxProblems)])
		return res, errors.New(strings.Join(problems, "\n"))
	}
	return res, nil
}

// fileSizesMatch compares the index's file bytes with the sizes of the segment files.
func fileSizesMatch(e *engine.Engine, segDir string) error {
	ents, err := os.ReadDir(segDir)
	if err != nil {
		return err
	}
	// An active segment counts for its recorded size: its file may be preallocated beyond its
	// last record, or not hold its header yet (the dump writer's prepared next segment).
	active := map[uint64]int64{}
	for _, r := range e.Index().Segments() {
		if r.State == index.SegmentActive {
			active[r.Number] = r.Size
		}
	}
	var total, recycled int64
	for _, de := range ents {
		st, err := os.Stat(filepath.Join(segDir, de.Name()))
		if err != nil {
			return err
		}
		size := st.Size()
		if _, ok := wal.ParseRecycleFileName(de.Name()); ok {
			// A retired segment's file kept for reuse: no segment row holds it; its tier
			// accounts it as recycled.
			recycled += size
			continue
		}
		if n, ok := wal.ParseSegmentFileName(de.Name()); ok {
			if recorded, ok := active[n]; ok {
				size = recorded
			}
		}
		total += size
	}
	if _, _, fileBytes := e.Index().Totals(); fileBytes != total {
		return fmt.Errorf("accounted file bytes %d, segment files hold %d", fileBytes, total)
	}
	var pooled int64
	for _, ts := range e.TierStats() {
		pooled += ts.Recycled
	}
	if pooled != recycled {
		return fmt.Errorf("accounted recycled bytes %d, recycled files hold %d", pooled, recycled)
	}
	return nil
}
