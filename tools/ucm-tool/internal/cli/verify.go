package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tools/verify"
)

type verifyFlags struct {
	noRecover bool
	progress  bool
}

func newVerifyCmd(tc *cliutil.Config, stdout, stderr io.Writer) *cobra.Command {
	var f verifyFlags
	cmd := &cobra.Command{
		Use:   "verify [DIR]",
		Short: "Check every record, checksum and index entry of a store",
		Long: `verify reads every record of every segment and checks every checksum (segment
header, record headers, every shard, footers of sealed segments), then cross-checks
the index and the log both ways: every index entry must point at a valid record at
that exact offset with the same header checksum, sequence number and shard checksums;
every registered segment must have its file and every segment file must be registered;
the segment table's live bytes and records must equal what the index entries add up
to, and a sealed segment's recorded size must equal its file size. Records in the log
that the index does not point at are dead space (counted, not a problem).

A store with tiers keeps segments under every path of every disk tier: verify finds
them all through the tier configuration the store recorded.

A store left by a crash (a segment still active, or a segment marked deleting because
the crash interrupted its retirement) is not corrupt: verify first recovers it
(truncates the torn tail and seals the segment, finishes deleting retired segments, as
opening the engine does) and prints what recovery did. With --no-recover it changes nothing and reports
what recovery will do instead; so it does, saying why, when recovery cannot run (the file
system is full: the engine opens the store read-only).

Exit status: 0 clean, 1 problems found, 2 usage or open error.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := tc.StoreDir(args)
			if err != nil {
				return err
			}
			return runVerify(dir, f, stdout, stderr)
		},
	}
	cmd.Flags().BoolVar(&f.noRecover, "no-recover", false, "do not recover a crash-left store; report what recovery will do and verify the rest read-only")
	cmd.Flags().BoolVar(&f.progress, "progress", false, "show a progress bar on stderr even when it is not a terminal")
	return cmd
}

func runVerify(dir string, f verifyFlags, stdout, stderr io.Writer) error {
	var bar *cliutil.Progress
	r, err := verify.Store(dir, verify.Options{
		Recover: !f.noRecover,
		ProgressTotal: func(total int64) {
			bar = cliutil.NewProgress(stderr, f.progress || cliutil.IsTerminal(stderr), total, "verify")
		},
		Progress: func(n int64) { bar.Add(n) },
	})
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		return cliutil.UsageErr("%v", err)
	}
	fmt.Fprintf(stdout, "verify %s\n", dir)
	if r.Recovery != nil {
		printRecovery(stdout, r.Recovery)
	}
	var skipped error
	if r.RecoverySkipped != "" {
		skipped = errors.New(r.RecoverySkipped)
		fmt.Fprintf(stdout, "recovery: not run: %s; verified read-only\n", r.RecoverySkipped)
	}
	if len(r.Pending) > 0 {
		printPending(stdout, r.Pending, skipped)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(stdout, "note: %s\n", n)
	}
	for _, p := range r.Problems {
		fmt.Fprintln(stdout, p)
	}
	fmt.Fprintf(stdout, "segments: %d (sealed %d, active %d, quarantined %d, being retired %d, files missing %d, unregistered files %d); recycled files kept for reuse: %d\n",
		r.Segments, r.Sealed, r.Active, r.Quarantined, r.Retiring, r.MissingFiles, r.UnregisteredFiles, r.RecycledFiles)
	fmt.Fprintf(stdout, "segment directories: %s\n", strings.Join(r.SegDirs, ", "))
	fmt.Fprintf(stdout, "records: %d (valid %d, dead %d = %d bytes)\n", r.Records, r.ValidRecords, r.DeadRecords, r.DeadBytes)
	fmt.Fprintf(stdout, "index entries: %d; blocks verified: %d; sidecars: %d, verified: %d", r.IndexEntries, r.BlocksVerified, r.SidecarEntries, r.SidecarsVerified)
	if r.PendingDrops > 0 {
		fmt.Fprintf(stdout, "; past a torn tail (recovery drops them): %d", r.PendingDrops)
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "bytes read: %d (%s)\n", r.BytesRead, cliutil.HumanBytes(r.BytesRead))
	fmt.Fprintf(stdout, "problems: %d\n", len(r.Problems))
	if !r.Clean() {
		return cliutil.ProblemsFound
	}
	fmt.Fprintln(stdout, "store is clean")
	return nil
}
