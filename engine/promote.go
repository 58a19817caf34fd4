package engine

import (
	"fmt"
	"time"

	"github.com/ucm-go/ucm/devio"
)

// promoteQueue bounds the lower-tier hits waiting to be promoted; beyond it hits are not
// promoted (the next hit asks again).
const promoteQueue = 1024

// promoter moves blocks that were loaded from a lower disk tier up to the first one, in the
// background, in small batches.
func (e *Engine) promoter() {
	defer e.bg.Done()
	for {
		var ids []BlockID
		select {
		case <-e.stop:
			return
		case id := <-e.promote:
			ids = append(ids, id)
		}
	gather:
		for len(ids) < relocateBatch {
			select {
			case id := <-e.promote:
				ids = append(ids, id)
			default:
				break gather
			}
		}
		if _, err := e.promoteBlocks(ids); err != nil {
			e.opts.Logger.Debug("ucm: promotion skipped", "blocks", len(ids), "err", err)
		}
	}
}

// wantPromotion queues a block read from a lower tier for promotion, without blocking.
func (e *Engine) wantPromotion(id BlockID) {
	select {
	case e.promote <- id:
	default:
	}
}

// promoteBlocks moves those of ids stored in a lower disk tier to the first one and returns
// how many moved. The first tier refuses (ErrNoSpace) when it is above capacity.
func (e *Engine) promoteBlocks(ids []BlockID) (int, error) {
	// Another instance's block is copied into this instance's first disk tier unless that tier
	// is the shared one itself (a second copy there would save nothing).
	foreignToo := e.share != nil && !e.tiers[0].Shared()
	if len(e.tiers) < 2 && !foreignToo {
		return 0, nil
	}
	if e.tiers[0].Space().OverHigh() {
		// The first tier is being reclaimed (or a dump waits for room): a promotion now would
		// take the space back and evict another block to make room for it.
		return 0, fmt.Errorf("tier %q is above its high watermark: %w", e.tiers[0].Name(), ErrNoSpace)
	}
	var move, foreign []recordRef
	for _, id := range ids {
		loc, ok, err := e.ix.Get(id)
		if err != nil {
			return 0, err
		}
		if !ok && foreignToo {
			if loc, ok = e.share.Get(id); ok {
				foreign = append(foreign, recordRef{id: id, loc: loc})
				continue
			}
		}
		if t := e.tierOf(loc.Segment); ok && t != nil && t.Pos() > 0 {
			move = append(move, recordRef{id: id, loc: loc})
		}
	}
	// A block's sidecars move with it, wherever they are below the first tier.
	var up []recordRef
	for _, r := range e.sidecarsOf(move, nil) {
		if t := e.tierOf(r.loc.Segment); t != nil && t.Pos() > 0 {
			up = append(up, r)
		}
	}
	_, n, _, err := e.relocate(append(move, up...), e.tiers[0])
	e.stats.promotions.Add(int64(n))
	if err != nil || len(foreign) == 0 {
		return n, err
	}
	// Other instances' blocks, apart: counted as local copies (their sidecars too).
	_, nf, _, err := e.relocate(append(foreign, e.foreignSidecarsOf(foreign)...), e.tiers[0])
	e.stats.promotions.Add(int64(nf))
	e.share.NoteCopiedToDisk(int64(nf))
	return n + nf, err
}

// Prefetch promotes blocks ahead of their use: those stored in a lower disk tier move to the
// first one, and with a memory tier every stored block (including blocks only the mooncake
// tier's pool holds) is read (verified) into memory. Blocks not stored are reported as
// ErrNotFound in the task's BlockErrors. A block the first tier has no room for (it is above
// its high watermark, or fills up during the move) stays where it is, its error wraps
// ErrNoSpace and names it, and it is still read into the memory tier: the loads that follow
// are served from memory, or else from the tier it stays in.
func (e *Engine) Prefetch(ids []BlockID) *Task {
	if e.opts.LookupOnly {
		return failedTask(ids, errLookupOnly)
	}
	return e.startTask(ids, e.metrics.loadLatency, func(t *Task) {
		stored := make([]bool, len(t.ids))
		for i, id := range t.ids {
			stored[i] = e.ix.Contains(id) || e.share.Contains(id)
		}
		e.lookupCaches(t.ids, stored) // blocks only a shared cache (Mooncake's pool) holds are read into memory too
		for i, id := range t.ids {
			if !stored[i] {
				t.errs[i] = blockErr(ErrNotFound, id, "prefetch")
			}
		}
		if _, err := e.promoteBlocks(t.ids); err != nil {
			// The blocks that did not move say why; the others (and the memory tier) go on.
			for i, id := range t.ids {
				if t.errs[i] == nil && e.belowFirstTier(id) {
					t.errs[i] = fmt.Errorf("prefetch: block %s stays in its tier: %w", id, err)
				}
			}
		}
		if e.mem == nil {
			return
		}
		l := e.opts.Layout
		var (
			need []BlockID
			bufs [][]byte
		)
		for i, id := range t.ids {
			if stored[i] && !e.mem.Contains(id) {
				need = append(need, id)
				bufs = append(bufs, devio.AlignedBuffer(int(l.BlockBytes())))
			}
		}
		if len(need) == 0 {
			return
		}
		// A load backfills the memory tier with every block it reads from disk.
		lt := newTask(need, e.opts.TaskTimeout)
		e.runLoad(lt, AllShards, oneSpanEach(bufs), time.Time{})
		for k, err := range lt.errs {
			if err != nil {
				for i, id := range t.ids {
					if id == need[k] {
						t.errs[i] = err
					}
				}
			}
		}
	})
}

// belowFirstTier reports whether promoteBlocks would move id: it is stored in a lower disk
// tier, or, when other instances' blocks are copied into the first tier, only another
// instance holds it. An index that cannot be read counts as below (not moved).
func (e *Engine) belowFirstTier(id BlockID) bool {
	loc, ok, err := e.ix.Get(id)
	if err != nil {
		return true
	}
	if !ok {
		return e.share != nil && !e.tiers[0].Shared() && e.share.Contains(id)
	}
	t := e.tierOf(loc.Segment)
	return t != nil && t.Pos() > 0
}
