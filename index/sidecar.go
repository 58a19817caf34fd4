package index

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ucm-go/ucm/format"
)

// Sidecar entries: a block's representations (format.RecordSidecar records) are indexed under
// (block id, kind), beside the block entries, and counted in their segments' live bytes and
// records like blocks. The index keeps one invariant about them: a sidecar entry exists only
// while its block's entry does. PutSidecar for a block without an entry does nothing, and
// every removal of a block entry (Delete, DeleteIf, DropSegmentEntries) removes the block's
// sidecar entries in the same commit. A sidecar entry may go without its block (its own
// segment evicted): a block with no sidecar is a block whose representation must be
// recomputed, never wrong.

// sidecarKey writes the key of (id, kind) into dst (sidecarKeySize bytes) and returns it.
func sidecarKey(dst []byte, id format.BlockID, kind format.SidecarKind) []byte {
	dst[0] = prefixSidecar
	copy(dst[1:], id[:])
	dst[blockKeySize] = byte(kind >> 8)
	dst[blockKeySize+1] = byte(kind)
	return dst[:sidecarKeySize]
}

// decodeSidecarEntry decodes one sidecar key and value, naming the block and kind in any error.
func decodeSidecarEntry(k, v []byte) (format.BlockID, format.SidecarKind, Location, error) {
	id, kind, err := parseSidecarKey(k)
	if err != nil {
		return id, kind, Location{}, err
	}
	loc, err := DecodeLocation(v)
	if err != nil {
		return id, kind, Location{}, fmt.Errorf("index: sidecar %d of %s: %w", kind, id, err)
	}
	return id, kind, loc, nil
}

// parseSidecarKey returns the block and kind of a sidecar key, or an error wrapping
// format.ErrCorrupt naming what is wrong.
func parseSidecarKey(k []byte) (format.BlockID, format.SidecarKind, error) {
	var id format.BlockID
	if len(k) != sidecarKeySize || k[0] != prefixSidecar {
		return id, 0, fmt.Errorf("%w: index: sidecar key %x: bad length %d", format.ErrCorrupt, k, len(k))
	}
	copy(id[:], k[1:])
	kind := format.SidecarKind(k[blockKeySize])<<8 | format.SidecarKind(k[blockKeySize+1])
	if !format.ValidSidecarKind(kind) {
		return id, kind, fmt.Errorf("%w: index: sidecar of %s: kind %d out of range [1, %d]", format.ErrCorrupt, id, kind, format.MaxSidecarKind)
	}
	return id, kind, nil
}

// GetSidecar returns the location of block id's sidecar of kind; ok=false if absent. Errors are
// as Get's.
func (ix *Index) GetSidecar(id format.BlockID, kind format.SidecarKind) (loc Location, ok bool, err error) {
	if err := ix.checkOpen(); err != nil {
		return Location{}, false, err
	}
	if !ix.HasSidecar(id, kind) {
		return Location{}, false, nil
	}
	var kb [sidecarKeySize]byte
	return ix.getLocation(sidecarKey(kb[:], id, kind), id)
}

// HasSidecar reports whether block id has a sidecar of kind, from memory (no I/O; until the
// membership is built after Open, from the DB). Like Has, it may report one that a read then
// does not find, never the other way round.
func (ix *Index) HasSidecar(id format.BlockID, kind format.SidecarKind) bool {
	if !format.ValidSidecarKind(kind) {
		return false
	}
	return ix.sidecarKindsOf(id)&(1<<kind) != 0
}

// SidecarKinds returns the kinds of block id's sidecars, in increasing order, as HasSidecar
// answers them.
func (ix *Index) SidecarKinds(id format.BlockID) []format.SidecarKind {
	kinds := ix.sidecarKindsOf(id)
	var out []format.SidecarKind
	for k := format.SidecarKind(1); k <= format.MaxSidecarKind; k++ {
		if kinds&(1<<k) != 0 {
			out = append(out, k)
		}
	}
	return out
}

// SidecarCount returns how many sidecar entries the index holds, from the segment table
// (exact).
func (ix *Index) SidecarCount() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := int64(0)
	for _, m := range ix.mu.segments {
		n += m.LiveSidecars
	}
	return int(n)
}

// IterateSidecars calls fn for every sidecar entry in (block id, kind) order, on a snapshot
// taken at the call; fn returning false stops it. An entry that fails to decode stops it with
// an error wrapping format.ErrCorrupt.
func (ix *Index) IterateSidecars(fn func(id format.BlockID, kind format.SidecarKind, loc Location) bool) error {
	if err := ix.checkOpen(); err != nil {
		return err
	}
	snap := ix.db.NewSnapshot()
	defer func() { _ = snap.Close() }()
	return iterateSidecars(snap, fn)
}

func iterateSidecars(r iterReader, fn func(id format.BlockID, kind format.SidecarKind, loc Location) bool) error {
	it, err := r.NewIter(&pebble.IterOptions{
		LowerBound: []byte{prefixSidecar},
		UpperBound: []byte{prefixSidecar + 1},
	})
	if err != nil {
		return fmt.Errorf("index: iterate sidecars: %w", err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("index: iterate sidecars: %w", err)
		}
		id, kind, loc, err := decodeSidecarEntry(it.Key(), v)
		if err != nil {
			_ = it.Close()
			return err
		}
		if !fn(id, kind, loc) {
			break
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("index: iterate sidecars: %w", err)
	}
	return nil
}

// PutSidecar records that block id's sidecar of kind is at loc (insert or overwrite), only if
// the block has an entry at that point of the batch: the returned *bool is set by Apply to
// whether the entry was written (false also when Apply fails). Accounting and validation are
// as Put's; a kind out of range fails Apply with format.ErrInvalid.
func (b *Batch) PutSidecar(id format.BlockID, kind format.SidecarKind, loc Location) *bool {
	return b.sidecarOp(opPutSidecar, id, kind, Location{}, loc)
}

// PutSidecarIf moves block id's sidecar of kind to loc only if its entry exists and points at
// exactly (old.Segment, old.Offset) (relocation), as PutIf does for blocks.
func (b *Batch) PutSidecarIf(id format.BlockID, kind format.SidecarKind, old, loc Location) *bool {
	return b.sidecarOp(opPutSidecarIf, id, kind, old, loc)
}

// DeleteSidecarIf removes block id's sidecar of kind only if its entry exists and points at
// exactly (old.Segment, old.Offset), as DeleteIf does for blocks. The block is left alone.
func (b *Batch) DeleteSidecarIf(id format.BlockID, kind format.SidecarKind, old Location) *bool {
	return b.sidecarOp(opDeleteSidecarIf, id, kind, old, Location{})
}

func (b *Batch) sidecarOp(kind opKind, id format.BlockID, side format.SidecarKind, old, loc Location) *bool {
	res := new(bool)
	if !format.ValidSidecarKind(side) {
		b.setErr(fmt.Errorf("%w: index: sidecar of %s: kind %d out of range [1, %d]", format.ErrInvalid, id, side, format.MaxSidecarKind))
		return res
	}
	o := op{kind: kind, id: id, side: side, oldSeg: old.Segment, oldOff: old.Offset, result: res}
	if kind != opDeleteSidecarIf {
		if err := loc.validate(); err != nil {
			b.setErr(fmt.Errorf("index: put sidecar %d of %s: %w", side, id, err))
			return res
		}
		if loc.IsBatch() {
			b.setErr(fmt.Errorf("%w: index: put sidecar %d of %s: a sidecar is never part of a batch record", format.ErrInvalid, side, id))
			return res
		}
		o.enc = EncodeLocation(nil, loc)
		loc.ShardCRCs = nil
		o.loc = loc
	}
	b.ops = append(b.ops, o)
	return res
}
