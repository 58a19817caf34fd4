package index

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/ucm-go/ucm/format"
)

// GetMany looks up the location of every ids[i] into locs[i], setting found[i] (len(locs) and
// len(found) must equal len(ids)). It reads what Get would for each id, through one iterator
// over the ids in key order instead of one Pebble point lookup per id: a layer-wise load asks
// for the same run of blocks once per layer. An entry that fails to decode is an error
// wrapping format.ErrCorrupt naming the block id, as for Get.
func (ix *Index) GetMany(ids []format.BlockID, locs []Location, found []bool) error {
	if len(locs) != len(ids) || len(found) != len(ids) {
		return fmt.Errorf("%w: index: GetMany: %d locations and %d flags for %d ids", format.ErrInvalid, len(locs), len(found), len(ids))
	}
	if err := ix.checkOpen(); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	order := make([]int, len(ids))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return bytes.Compare(ids[a][:], ids[b][:]) })
	var lo, hi [blockKeySize]byte
	it, err := ix.db.NewIter(&pebble.IterOptions{
		LowerBound: blockKey(lo[:], ids[order[0]]),
		UpperBound: append(blockKey(hi[:], ids[order[len(order)-1]]), 0),
	})
	if err != nil {
		return fmt.Errorf("index: get %d blocks: %w", len(ids), err)
	}
	var kb [blockKeySize]byte
	for _, i := range order {
		key := blockKey(kb[:], ids[i])
		locs[i], found[i] = Location{}, false
		if !it.SeekGE(key) || !bytes.Equal(it.Key(), key) {
			continue
		}
		v, err := it.ValueAndErr()
		if err == nil {
			locs[i], err = DecodeLocation(v)
		}
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("index: block %s: %w", ids[i], err)
		}
		found[i] = true
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("index: get %d blocks: %w", len(ids), err)
	}
	return nil
}
