package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/tools/verify"
)

// reclaimReport is what compact, gc and evict print (the --json form has these field names).
type reclaimReport struct {
	Dir     string `json:"dir"`
	Command string `json:"command"`
	// LiveRatio: compact, gc. Tier and ToBytes: evict.
	LiveRatio float64 `json:"live_ratio,omitempty"`
	Tier      string  `json:"tier,omitempty"`
	ToBytes   *int64  `json:"to_bytes,omitempty"`

	SegmentsCompacted int   `json:"segments_compacted"`
	SegmentsRetired   int   `json:"segments_retired"`
	RecordsMoved      int   `json:"records_moved"`
	BytesReclaimed    int64 `json:"bytes_reclaimed"`
	// BytesAdded: a run that stopped after copying records but before deleting the segments
	// they came from leaves the store larger; the next compact reclaims them.
	BytesAdded    int64 `json:"bytes_added,omitempty"`
	BlocksEvicted int   `json:"blocks_evicted"`
	BlocksDemoted int   `json:"blocks_demoted"`
	// Tiers is every disk tier's space before and after (after: once the store is closed,
	// every segment sealed at its final size).
	Tiers    []tierChange  `json:"tiers"`
	Recovery *recoveryJSON `json:"recovery,omitempty"`
	Seconds  float64       `json:"seconds"`
	// Error is why the command stopped early ("" when it completed).
	Error string `json:"error,omitempty"`
}

// tierChange is one disk tier before and after a reclaim command.
type tierChange struct {
	Name         string `json:"name"`
	Capacity     int64  `json:"capacity_bytes"`
	UsedBefore   int64  `json:"used_bytes_before"`
	UsedAfter    int64  `json:"used_bytes_after"`
	BlocksBefore int64  `json:"blocks_before"`
	BlocksAfter  int64  `json:"blocks_after"`
}

type reclaimFlags struct {
	asJSON, progress bool
}

func (f *reclaimFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print one JSON object")
	cmd.Flags().BoolVar(&f.progress, "progress", false, "show a progress bar on stderr even when it is not a terminal")
}

const reclaimExit = `
The store must not be in use by an engine. Opening it recovers a store left by a crash
first (printed). Exit status: 0 done, 1 the command failed part way (what it did until
then is printed) or evict could not bring the tier down to --to, 2 usage error or the
store could not be opened.`

func newCompactCmd(tc *cliutil.Config, stdout, stderr io.Writer) *cobra.Command {
	var (
		f     reclaimFlags
		ratio float64
	)
	cmd := &cobra.Command{
		Use:   "compact [DIR]",
		Short: "Compact sparse segments and delete empty ones, in every disk tier (offline)",
		Long: `compact opens the store (with the tiers it recorded), deletes every sealed segment no
block lives in any more, and compacts every sealed segment whose live ratio (live
bytes / file bytes) is at most --live-ratio: its live records are copied forward into
a new segment of the same tier, verified, and the old segment is deleted. No block is
evicted. It prints segments compacted and deleted, records moved, bytes reclaimed and
every disk tier's used bytes before and after.
` + reclaimExit,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := tc.StoreDir(args)
			if err != nil {
				return err
			}
			if !(ratio > 0 && ratio < 1) {
				return cliutil.UsageErr("--live-ratio %v: want a ratio between 0 and 1 (exclusive)", ratio)
			}
			return runReclaim(dir, reclaimReport{Command: "compact", LiveRatio: ratio}, f, stdout, stderr)
		},
	}
	cmd.Flags().Float64Var(&ratio, "live-ratio", engine.DefaultCompactLiveRatio, "compact sealed segments whose live ratio is at most this (0 < r < 1)")
	f.register(cmd)
	return cmd
}

func newGCCmd(tc *cliutil.Config, stdout, stderr io.Writer) *cobra.Command {
	var f reclaimFlags
	cmd := &cobra.Command{
		Use:   "gc [DIR]",
		Short: "Reclaim dead space without evicting live blocks: compact --live-ratio 0.5",
		Long: fmt.Sprintf(`gc reclaims the space of superseded and evicted records without evicting any live
block. It is an alias of 'ucm-tool compact --live-ratio %v' (the engine's default
compaction ratio): empty sealed segments are deleted and sealed segments at most
half live are compacted, in every disk tier.
`, engine.DefaultCompactLiveRatio) + reclaimExit,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := tc.StoreDir(args)
			if err != nil {
				return err
			}
			return runReclaim(dir, reclaimReport{Command: "gc", LiveRatio: engine.DefaultCompactLiveRatio}, f, stdout, stderr)
		},
	}
	f.register(cmd)
	return cmd
}

func newEvictCmd(tc *cliutil.Config, stdout, stderr io.Writer) *cobra.Command {
	var (
		f          reclaimFlags
		to, tierFl string
	)
	cmd := &cobra.Command{
		Use:   "evict [DIR] --to BYTES [--tier NAME]",
		Short: "Evict least recently used segments until a disk tier holds at most --to bytes (offline)",
		Long: `evict brings the disk tier --tier (default: the first disk tier) down to at most --to
bytes of segment files, by the engine's reclamation policy: empty segments are deleted
and sparse ones compacted first, then the blocks of the least recently used segments
are evicted (in write order: recency is not kept across restarts). Blocks evicted from a tier with a
slower tier below it move down (demoted); blocks evicted from the last tier are
DELETED from the store. --to 0 empties the tier (compacting nothing: every block
leaves it). --to counts what the segment files
hold (an active segment counts its written bytes, not the room reserved for it).

Sizes accept plain bytes or K/KiB, M/MiB, G/GiB, T/TiB (binary units).
` + reclaimExit,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := tc.StoreDir(args)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("to") {
				return cliutil.UsageErr("--to: required (the bytes the tier may hold after eviction)")
			}
			n, err := ucmconfig.ParseSize(to)
			if err != nil {
				return cliutil.UsageErr("--to: %v", err)
			}
			return runReclaim(dir, reclaimReport{Command: "evict", Tier: tierFl, ToBytes: &n}, f, stdout, stderr)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "bytes the tier may hold afterwards (required; 0 empties it)")
	cmd.Flags().StringVar(&tierFl, "tier", "", "name of the disk tier to evict from (default: the first disk tier)")
	f.register(cmd)
	return cmd
}

// diskTierNames lists the disk tiers' names.
func diskTierNames(ts []engine.TierStats) []string {
	var names []string
	for _, t := range ts {
		if t.Kind == tiers.KindDisk {
			names = append(names, t.Name)
		}
	}
	return names
}

// recovered reports whether opening the store recovered anything.
func recovered(r engine.RecoveryReport) bool {
	return r.SegmentsRecovered > 0 || r.TruncatedBytes > 0 || r.EntriesDropped > 0 || r.OrphansRemoved > 0 ||
		r.SegmentsAdopted > 0 || r.RetiredSegmentsDeleted > 0 || r.EmptySegmentsDeleted > 0 || len(r.MissingSegments) > 0 ||
		len(r.QuarantinedSegments) > 0
}

// compactCandidates counts the segments Compact will take: sealed, non-empty files that are
// empty of blocks or at most liveRatio live.
func compactCandidates(rows []index.SegmentMeta, liveRatio float64) int64 {
	var n int64
	for _, m := range rows {
		if m.State == index.SegmentSealed && m.Size > 0 && (m.LiveRecords == 0 || float64(m.LiveBytes)/float64(m.Size) <= liveRatio) {
			n++
		}
	}
	return n
}

// runReclaim runs compact, gc or evict (r says which and with what) on the store in dir.
func runReclaim(dir string, r reclaimReport, f reclaimFlags, stdout, stderr io.Writer) error {
	r.Dir = dir
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := verify.OpenWritable(dir, nil, logger)
	if err != nil {
		return cliutil.UsageErr("%v", err)
	}
	if rec := e.Recovery(); recovered(rec) {
		r.Recovery = newRecoveryJSON(&rec)
		if !f.asJSON {
			printRecovery(stdout, &rec)
		}
	}
	before := e.TierStats()
	if r.Command == "evict" {
		names := diskTierNames(before)
		if r.Tier == "" {
			r.Tier = names[0]
		}
		known := false
		for _, n := range names {
			known = known || n == r.Tier
		}
		if !known {
			_ = e.Close()
			return cliutil.UsageErr("--tier %q: no such disk tier (the store's disk tiers: %s)", r.Tier, strings.Join(names, ", "))
		}
	}
	start := time.Now()
	var rep engine.ReclaimReport
	var runErr error
	switch r.Command {
	case "evict":
		rep, runErr = e.Evict(r.Tier, *r.ToBytes)
	default:
		bar := cliutil.NewCountProgress(stderr, f.progress || cliutil.IsTerminal(stderr), compactCandidates(e.Index().Segments(), r.LiveRatio), r.Command+" segments")
		done := 0
		rep, runErr = e.Compact(r.LiveRatio, func(p engine.ReclaimReport) {
			bar.Add(int64(p.SegmentsRetired - done))
			done = p.SegmentsRetired
		})
		bar.Finish()
	}
	if cerr := e.Close(); runErr == nil && cerr != nil {
		runErr = fmt.Errorf("close: %w", cerr)
	}
	r.Seconds = time.Since(start).Seconds()
	r.SegmentsCompacted, r.SegmentsRetired, r.RecordsMoved = rep.SegmentsCompacted, rep.SegmentsRetired, rep.RecordsMoved
	r.BlocksEvicted, r.BlocksDemoted = rep.BlocksEvicted, rep.BlocksDemoted

	// After: reopened read-only, every segment sealed at its final size.
	h, err := verify.Open(dir, nil)
	if err != nil {
		return cliutil.UsageErr("reopen after %s: %v", r.Command, err)
	}
	after := h.Engine.TierStats()
	_ = h.Close()
	for _, b := range before {
		if b.Kind != tiers.KindDisk {
			continue
		}
		c := tierChange{Name: b.Name, Capacity: b.Capacity, UsedBefore: b.Used, BlocksBefore: b.Blocks}
		for _, a := range after {
			if a.Name == b.Name {
				c.UsedAfter, c.BlocksAfter = a.Used, a.Blocks
			}
		}
		r.Tiers = append(r.Tiers, c)
	}
	// Bytes reclaimed are measured on the closed store (the engine's own count, taken while
	// a new segment is still active, includes that segment's whole reservation).
	var change int64
	for _, c := range r.Tiers {
		change += c.UsedBefore - c.UsedAfter
	}
	r.BytesReclaimed, r.BytesAdded = max(change, 0), max(-change, 0)
	if runErr == nil && r.Command == "evict" {
		for _, c := range r.Tiers {
			if c.Name == r.Tier && c.UsedAfter > *r.ToBytes {
				runErr = fmt.Errorf("tier %q still holds %d bytes, more than --to %d", r.Tier, c.UsedAfter, *r.ToBytes)
			}
		}
	}
	if runErr != nil {
		r.Error = runErr.Error()
	}
	if f.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		printReclaim(stdout, &r)
	}
	if runErr != nil {
		if errors.Is(runErr, engine.ErrInvalidArgument) {
			return cliutil.UsageErr("%s: %v", r.Command, runErr)
		}
		return &cliutil.ExitError{Code: cliutil.ExitProblems, Err: fmt.Errorf("%s: %w", r.Command, runErr)}
	}
	return nil
}

func printReclaim(w io.Writer, r *reclaimReport) {
	switch r.Command {
	case "evict":
		fmt.Fprintf(w, "evict %s: tier %q down to %d bytes (%s)\n", r.Dir, r.Tier, *r.ToBytes, cliutil.HumanBytes(*r.ToBytes))
	default:
		fmt.Fprintf(w, "%s %s: live ratio <= %v\n", r.Command, r.Dir, r.LiveRatio)
	}
	fmt.Fprintf(w, "segments compacted: %d\n", r.SegmentsCompacted)
	fmt.Fprintf(w, "segments deleted:   %d (compacted ones included)\n", r.SegmentsRetired)
	fmt.Fprintf(w, "records moved:      %d\n", r.RecordsMoved)
	if r.Command == "evict" {
		fmt.Fprintf(w, "blocks evicted:     %d (%d demoted to the next tier, %d deleted)\n", r.BlocksEvicted, r.BlocksDemoted, r.BlocksEvicted-r.BlocksDemoted)
	}
	fmt.Fprintf(w, "bytes reclaimed:    %d (%s)\n", r.BytesReclaimed, cliutil.HumanBytes(r.BytesReclaimed))
	if r.BytesAdded > 0 {
		fmt.Fprintf(w, "bytes added:        %d (%s): records copied before the run stopped; the next compact reclaims them\n", r.BytesAdded, cliutil.HumanBytes(r.BytesAdded))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tier\tcapacity\tused before\tused after\tblocks before\tblocks after\t")
	for _, c := range r.Tiers {
		capacity := "unlimited"
		if c.Capacity > 0 {
			capacity = cliutil.HumanBytes(c.Capacity)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t\n", c.Name, capacity, cliutil.HumanBytes(c.UsedBefore), cliutil.HumanBytes(c.UsedAfter), c.BlocksBefore, c.BlocksAfter)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "took %.2f s\n", r.Seconds)
	if r.Error != "" {
		fmt.Fprintf(w, "STOPPED EARLY: %s\n", r.Error)
	}
}
