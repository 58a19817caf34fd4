package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/tools/verify"
)

// statsReport is what stats prints (the --json form has these field names).
type statsReport struct {
	Dir       string  `json:"dir"`
	Blocks    int64   `json:"blocks"`
	Sidecars  int64   `json:"sidecars"`
	LiveBytes int64   `json:"live_bytes"`
	FileBytes int64   `json:"file_bytes"`
	DeadBytes int64   `json:"dead_bytes"`
	LiveRatio float64 `json:"live_ratio"`
	Segments  int     `json:"segments"`
	// SegmentsByState counts segments per state ("active", "sealed", "quarantined").
	SegmentsByState map[string]int `json:"segments_by_state"`
	// Tiers is every tier, fastest first (a memory tier is empty offline).
	Tiers           []tierJSON               `json:"tiers"`
	Recovery        *recoveryJSON            `json:"recovery,omitempty"`
	PendingRecovery []*verify.PendingSegment `json:"pending_recovery,omitempty"`
	// RecoverySkipped is why recovery could not run (the file system is full: the engine
	// opened the store read-only); PendingRecovery then says what it will do.
	RecoverySkipped string `json:"recovery_skipped,omitempty"`
}

// tierJSON is engine.TierStats in the --json form.
type tierJSON struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"`
	Paths    []string `json:"paths,omitempty"`
	Capacity int64    `json:"capacity_bytes"` // 0: unlimited
	// SegmentSize: disk tiers' segment size (chosen from the capacity unless configured).
	SegmentSize int64 `json:"segment_size_bytes,omitempty"`
	Used        int64 `json:"used_bytes"`
	Recycled    int64 `json:"recycled_bytes"` // of used: retired segment files kept for reuse
	FileBytes   int64 `json:"file_bytes"`
	LiveBytes   int64 `json:"live_bytes"`
	DeadBytes   int64 `json:"dead_bytes"`
	Blocks      int64 `json:"blocks"`
	Segments    int   `json:"segments"`
	// Memory tier only.
	Hits      *int64 `json:"hits,omitempty"`
	Misses    *int64 `json:"misses,omitempty"`
	Evictions *int64 `json:"evictions,omitempty"`
	Corrupt   *int64 `json:"corrupt,omitempty"` // cached blocks that failed their checksums on a hit
}

func newTierJSON(ts []engine.TierStats) []tierJSON {
	out := make([]tierJSON, 0, len(ts))
	for _, t := range ts {
		j := tierJSON{Name: t.Name, Kind: string(t.Kind), Paths: t.Paths, Capacity: t.Capacity, SegmentSize: t.SegmentSize, Used: t.Used, Recycled: t.Recycled, FileBytes: t.FileBytes,
			LiveBytes: t.LiveBytes, DeadBytes: t.DeadBytes, Blocks: t.Blocks, Segments: t.Segments}
		if t.Kind == tiers.KindMemory {
			j.Hits, j.Misses, j.Evictions, j.Corrupt = &t.Hits, &t.Misses, &t.Evictions, &t.Corrupt
		}
		out = append(out, j)
	}
	return out
}

// printTiers prints the per-tier table of stats.
func printTiers(w io.Writer, ts []tierJSON) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "tier\tkind\tcapacity\tsegment\tused\tfile\tlive\tdead\tblocks\tsegments\thits\tmisses\tpaths")
	for _, t := range ts {
		capacity := "unlimited"
		if t.Capacity > 0 {
			capacity = cliutil.HumanBytes(t.Capacity)
		}
		segment := "-"
		if t.SegmentSize > 0 {
			segment = cliutil.HumanBytes(t.SegmentSize)
		}
		hits, misses := "-", "-"
		if t.Hits != nil {
			hits, misses = fmt.Sprint(*t.Hits), fmt.Sprint(*t.Misses)
		}
		paths := strings.Join(t.Paths, ",")
		if paths == "" {
			paths = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", t.Name, t.Kind, capacity, segment, cliutil.HumanBytes(t.Used), cliutil.HumanBytes(t.FileBytes),
			cliutil.HumanBytes(t.LiveBytes), cliutil.HumanBytes(t.DeadBytes), t.Blocks, t.Segments, hits, misses, paths)
	}
	_ = tw.Flush()
}

// recoveryJSON is engine.RecoveryReport in the --json form.
type recoveryJSON struct {
	SegmentsRecovered      int      `json:"segments_recovered"`
	TruncatedBytes         int64    `json:"truncated_bytes"`
	EntriesDropped         int      `json:"entries_dropped"`
	OrphansRemoved         int      `json:"orphans_removed"`
	RetiredSegmentsDeleted int      `json:"retired_segments_deleted"`
	EmptySegmentsDeleted   int      `json:"empty_segments_deleted"`
	MissingSegments        []uint64 `json:"missing_segments"`
	TruncatedSegments      []uint64 `json:"truncated_segments"`
	IndexSetAside          string   `json:"index_set_aside,omitempty"`
	Seconds                float64  `json:"seconds"`
}

func newRecoveryJSON(r *engine.RecoveryReport) *recoveryJSON {
	if r == nil {
		return nil
	}
	return &recoveryJSON{SegmentsRecovered: r.SegmentsRecovered, TruncatedBytes: r.TruncatedBytes, EntriesDropped: r.EntriesDropped,
		OrphansRemoved: r.OrphansRemoved, RetiredSegmentsDeleted: r.RetiredSegmentsDeleted, EmptySegmentsDeleted: r.EmptySegmentsDeleted,
		MissingSegments: append([]uint64{}, r.MissingSegments...), TruncatedSegments: append([]uint64{}, r.TruncatedSegments...), IndexSetAside: r.IndexSetAside, Seconds: r.Duration.Seconds()}
}

func newStatsCmd(tc *cliutil.Config, stdout, stderr io.Writer) *cobra.Command {
	var noRecover, asJSON bool
	cmd := &cobra.Command{
		Use:   "stats [DIR]",
		Short: "Print a store's space accounting",
		Long: `stats prints the number of blocks, live bytes (on-disk bytes of the records the index
points at), file bytes (all segment files), dead bytes (file bytes minus live bytes:
superseded records, headers, footers), the live ratio and the segments by state, from
the index's exact accounting, then a table of the tiers: name, kind, capacity, used
(accounted) bytes, file, live and dead bytes, blocks and segments of each disk tier
(a memory tier is empty offline: its hits and misses are 0).

Like verify, a store left by a crash is recovered first (--no-recover: report what
recovery will do instead, without changing anything).

With --config and no --instance, when storage_backends is shared by processes (the
connector's layout: an instance store per process under <storage_backends[0]>/stores/),
stats lists every instance store — name, state, blocks, file, live and dead bytes,
segments — and their total, changing nothing: a stopped instance is read from its index
(not recovered), a running one (its process holds the store) from the segments it
published in its manifests, which leave out its active segment and its live/dead split.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				backends, names, ok, err := sharedInstances(tc)
				if err != nil {
					return err
				}
				if ok {
					return runInstanceStats(backends, names, asJSON, stdout)
				}
			}
			dir, err := tc.StoreDir(args)
			if err != nil {
				return err
			}
			return runStats(dir, noRecover, asJSON, stdout)
		},
	}
	cmd.Flags().BoolVar(&noRecover, "no-recover", false, "do not recover a crash-left store; report what recovery will do")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func runStats(dir string, noRecover, asJSON bool, stdout io.Writer) error {
	s, rep, err := openRecovered(dir, !noRecover)
	if err != nil {
		return err
	}
	defer func() { _ = s.close() }()
	st := s.Engine.Stats()
	r := statsReport{Dir: dir, Blocks: st.Blocks, Sidecars: st.Sidecars, LiveBytes: st.LiveBytes, FileBytes: st.FileBytes,
		DeadBytes: st.FileBytes - st.LiveBytes, Segments: st.Segments, Recovery: newRecoveryJSON(rep),
		SegmentsByState: map[string]int{}, Tiers: newTierJSON(s.Engine.TierStats())}
	for _, state := range []index.SegmentState{index.SegmentActive, index.SegmentSealed, index.SegmentQuarantined, index.SegmentDeleting} {
		r.SegmentsByState[state.String()] = 0
	}
	for _, m := range s.ix.Segments() {
		r.SegmentsByState[m.State.String()]++
	}
	if st.FileBytes > 0 {
		r.LiveRatio = float64(st.LiveBytes) / float64(st.FileBytes)
	}
	if skipped := s.RecoverySkipped(); skipped != nil {
		r.RecoverySkipped = skipped.Error()
	}
	if noRecover || s.RecoverySkipped() != nil {
		if r.PendingRecovery, err = s.ScanPending(); err != nil {
			return cliutil.UsageErr("%v", err)
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	if rep != nil {
		printRecovery(stdout, rep)
	}
	if r.RecoverySkipped != "" {
		fmt.Fprintf(stdout, "recovery: not run: %s\n", r.RecoverySkipped)
	}
	if len(r.PendingRecovery) > 0 {
		printPending(stdout, r.PendingRecovery, s.RecoverySkipped())
	}
	fmt.Fprintf(stdout, "store:       %s\n", dir)
	fmt.Fprintf(stdout, "blocks:      %d\n", r.Blocks)
	fmt.Fprintf(stdout, "sidecars:    %d\n", r.Sidecars)
	fmt.Fprintf(stdout, "live bytes:  %d (%s)\n", r.LiveBytes, cliutil.HumanBytes(r.LiveBytes))
	fmt.Fprintf(stdout, "file bytes:  %d (%s)\n", r.FileBytes, cliutil.HumanBytes(r.FileBytes))
	fmt.Fprintf(stdout, "dead bytes:  %d (%s)\n", r.DeadBytes, cliutil.HumanBytes(r.DeadBytes))
	fmt.Fprintf(stdout, "live ratio:  %.4f\n", r.LiveRatio)
	fmt.Fprintf(stdout, "segments:    %d (active %d, sealed %d, quarantined %d, being retired %d)\n", r.Segments,
		r.SegmentsByState["active"], r.SegmentsByState["sealed"], r.SegmentsByState["quarantined"], r.SegmentsByState["deleting"])
	fmt.Fprintln(stdout)
	printTiers(stdout, r.Tiers)
	return nil
}
