//go:build linux && uring

package devio

import (
	"sync"
	"sync/atomic"
)

// Merging across Submits. mergeRuns joins the ops of one batch that continue each other; the
// requests of different Submits often continue each other too. A layer-wise load issues one
// Submit per layer, and layer i+1's run of a batch record starts where layer i's ends; a
// layer-wise dump writes them the same way. Issued one by one they reach the device as
// requests of one layer's run (420–560 KiB for 16 KiB shards), at which the VM's disk runs at
// 0.86–0.90 of its rate for 2 MiB requests, and the kernel does not merge them (they arrive
// through io_uring as separate requests, not one plugged batch).
//
// So a unit that waits for tokens is offered: its file, direction and first offset are
// registered. A Submit that gets a token for a unit looks for an offered unit of another
// Submit starting where its own ends, adopts it (and the one continuing that, and so on,
// within maxMergeBytes and maxMergeOps) and issues them all as one vectored request. Its owner
// is told the outcome through its adopted channel: the bytes of its unit the request
// transferred. The owner settles its ops with them as for a merged run of its own, and issues
// any op the request did not complete again, alone (so every op's N and Err are still its own).
//
// Nothing waits to be merged: only a unit already queued behind the device's queue depth is
// adopted, so the merge costs no latency to the adopted unit (it is issued earlier than its
// turn) and adds the adopted bytes' transfer time to the adopting unit's completion. Only a
// unit's first issue is offered; retries and ops split back out of a merged request are not.

// adjKey is where an offered unit starts: a file descriptor, a direction and an offset.
type adjKey struct {
	fd    uintptr
	write bool
	off   int64
}

// offeredUnit is a unit of a Submit waiting for tokens, which another Submit may adopt.
type offeredUnit struct {
	owner *submitState
	k     int  // the unit's index in its owner's units
	ops   []Op // the owner's ops of the unit: only File, Buf, Off and Write are read
	bytes int
	// adopted is set, with the offer removed, by the Submit that adopts the unit; guarded by
	// adoptions.mu.
	adopted bool
}

// submitState is what other Submits need of a Submit whose units they may adopt.
type submitState struct {
	// adopted receives, for each unit of this Submit issued by another Submit, the outcome
	// of that request for the unit. Its capacity is the Submit's op count (a unit is offered
	// at most once), so an adopter never blocks sending.
	adopted chan adoptedResult
}

// adoptedResult is the outcome, for unit k of its owner, of another Submit's request: n bytes
// of the unit were transferred (0 when the request failed).
type adoptedResult struct{ k, n int }

// adoptionTable holds the offered units of every Submit of one backend.
type adoptionTable struct {
	mu      sync.Mutex
	offered map[adjKey]*offeredUnit
	// n is len(offered), read without mu so that a Submit finds nothing to adopt cheaply.
	n atomic.Int32
}

// offer registers unit k (ops, a fresh unit: nothing transferred yet) of owner.
func (t *adoptionTable) offer(owner *submitState, k int, ops []Op) *offeredUnit {
	last := &ops[len(ops)-1]
	o := &offeredUnit{owner: owner, k: k, ops: ops, bytes: int(last.Off-ops[0].Off) + len(last.Buf)}
	key := adjKey{fd: ops[0].File.fd, write: ops[0].Write, off: ops[0].Off}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.offered == nil {
		t.offered = make(map[adjKey]*offeredUnit)
	}
	if _, dup := t.offered[key]; dup {
		// Two units starting at one place (two reads of the same bytes): the first offer
		// stands, this unit is issued by its owner.
		return nil
	}
	t.offered[key] = o
	t.n.Add(1)
	return o
}

// withdraw takes o back for its owner to issue; false means another Submit adopted it.
func (t *adoptionTable) withdraw(o *offeredUnit) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.adopted {
		return false
	}
	delete(t.offered, adjKey{fd: o.ops[0].File.fd, write: o.ops[0].Write, off: o.ops[0].Off})
	t.n.Add(-1)
	return true
}

// adopt removes and returns the offered units of other Submits that continue a request of
// bytes bytes and nops ops ending at end in fd, in file order, as long as the request stays
// within maxMergeBytes and maxMergeOps.
func (t *adoptionTable) adopt(self *submitState, fd uintptr, write bool, end int64, bytes, nops int) []*offeredUnit {
	if t.n.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var got []*offeredUnit
	for len(t.offered) > 0 {
		key := adjKey{fd: fd, write: write, off: end}
		o := t.offered[key]
		if o == nil || o.owner == self || bytes+o.bytes > maxMergeBytes || nops+len(o.ops) > maxMergeOps {
			break
		}
		delete(t.offered, key)
		t.n.Add(-1)
		o.adopted = true
		got = append(got, o)
		end += int64(o.bytes)
		bytes += o.bytes
		nops += len(o.ops)
	}
	return got
}

// adoptingRequest is the request info of a unit issued with adopted units of other Submits.
type adoptingRequest struct {
	k       int // the issuing Submit's own unit
	own     int // its bytes, the request's first
	adopted []*offeredUnit
}

// settleAdopted hands each adopted unit its share of the n bytes the request transferred after
// the issuing Submit's own.
func (r *adoptingRequest) settleAdopted(n int) {
	n = max(n-r.own, 0)
	for _, o := range r.adopted {
		take := min(n, o.bytes)
		n -= take
		o.owner.adopted <- adoptedResult{k: o.k, n: take}
	}
}
