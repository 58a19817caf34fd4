package cli

import (
	"fmt"
	"io"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tools/verify"
)

// store is a store directory opened read-only for a tool (see verify.Handle).
type store struct {
	*verify.Handle
	ix *index.Index
}

func newStore(h *verify.Handle) *store { return &store{Handle: h, ix: h.Index} }

// openStoreReadOnly opens the store in dir without writing to it.
func openStoreReadOnly(dir string) (*store, error) {
	h, err := verify.Open(dir, nil)
	if err != nil {
		return nil, cliutil.UsageErr("%v", err)
	}
	return newStore(h), nil
}

// openRecovered opens dir read-only after recovering it first when a segment is still active
// and recover is set. rep is non-nil when recovery ran (RecoverySkipped says why it could not).
func openRecovered(dir string, recover bool) (*store, *engine.RecoveryReport, error) {
	h, rep, err := verify.OpenRecovered(dir, nil, recover)
	if err != nil {
		return nil, nil, cliutil.UsageErr("%v", err)
	}
	return newStore(h), rep, nil
}

func (s *store) close() error { return s.Close() }

func (s *store) activeSegments() []index.SegmentMeta { return s.ActiveSegments() }

// printRecovery prints what a recovery did.
func printRecovery(w io.Writer, r *engine.RecoveryReport) {
	fmt.Fprintf(w, "recovery: recovered the store in %v:\n", r.Duration.Round(1e5))
	fmt.Fprintf(w, "  segments left active by a crash, truncated to their valid end and sealed: %d\n", r.SegmentsRecovered)
	fmt.Fprintf(w, "  torn tail bytes cut: %d\n", r.TruncatedBytes)
	fmt.Fprintf(w, "  index entries dropped (past a valid end or in a missing segment): %d\n", r.EntriesDropped)
	fmt.Fprintf(w, "  unregistered segments adopted: %d (%d block entries indexed)\n", r.SegmentsAdopted, r.EntriesAdopted)
	fmt.Fprintf(w, "  orphan files removed: %d\n", r.OrphansRemoved)
	if r.RetiredSegmentsDeleted > 0 {
		fmt.Fprintf(w, "  interrupted retirements finished (segments deleted): %d\n", r.RetiredSegmentsDeleted)
	}
	if r.EmptySegmentsDeleted > 0 {
		fmt.Fprintf(w, "  active segments without a valid record deleted: %d\n", r.EmptySegmentsDeleted)
	}
	if len(r.MissingSegments) > 0 {
		fmt.Fprintf(w, "  sealed segments whose file is missing (their blocks dropped): %v\n", r.MissingSegments)
	}
	if len(r.TruncatedSegments) > 0 {
		fmt.Fprintf(w, "  sealed segments cut short, sealed again after their last intact record: %v\n", r.TruncatedSegments)
	}
	if r.IndexSetAside != "" {
		fmt.Fprintf(w, "  index unreadable: set aside at %s and rebuilt from the segments\n", r.IndexSetAside)
	}
	if len(r.QuarantinedSegments) > 0 {
		fmt.Fprintf(w, "  segments quarantined (unreadable or corrupt): %v\n", r.QuarantinedSegments)
	}
}

// printPending prints what recovery will do, for --no-recover, or when recovery could not run
// (skipped says why).
func printPending(w io.Writer, ps []*verify.PendingSegment, skipped error) {
	why := "not recovering (--no-recover)"
	if skipped != nil {
		why = fmt.Sprintf("not recovered: %v", skipped)
	}
	fmt.Fprintf(w, "recovery pending: %d segment(s) still active, being retired, missing or cut short; %s. Recovery will:\n", len(ps), why)
	for _, p := range ps {
		switch {
		case p.Truncated && p.Missing:
			fmt.Fprintf(w, "  %s: sealed, file missing; drop its %d index entries\n", p.File, p.EntriesToDrop)
		case p.Truncated && p.Unreadable == "":
			fmt.Fprintf(w, "  %s: sealed but cut short (file is %d bytes); keep %d intact records up to offset %d, drop %d index entries, seal it again\n",
				p.File, p.FileSize, p.Records, p.ValidEnd, p.EntriesToDrop)
		case p.Retiring && p.Missing:
			fmt.Fprintf(w, "  %s: being retired, file already deleted; forget its row\n", p.File)
		case p.Retiring:
			fmt.Fprintf(w, "  %s: being retired (a crash interrupted it); delete its file (%d bytes) and row\n", p.File, p.FileSize)
		case p.Missing:
			fmt.Fprintf(w, "  %s: file missing; drop its %d index entries\n", p.File, p.EntriesToDrop)
		case p.Unreadable != "":
			fmt.Fprintf(w, "  %s: header unreadable (%s); quarantine it and drop its %d index entries\n", p.File, p.Unreadable, p.EntriesToDrop)
		case p.Empty:
			fmt.Fprintf(w, "  %s: no valid record (a prepared segment, or its first records never became durable); delete it (%d bytes) and drop its %d index entries\n",
				p.File, p.FileSize, p.EntriesToDrop)
		default:
			fmt.Fprintf(w, "  %s: keep %d valid records up to offset %d, cut %d bytes (file is %d), drop %d index entries, seal it\n",
				p.File, p.Records, p.ValidEnd, p.CutBytes, p.FileSize, p.EntriesToDrop)
			if p.Stop != "" {
				fmt.Fprintf(w, "    tail stops at: %s\n", p.Stop)
			}
		}
	}
}
