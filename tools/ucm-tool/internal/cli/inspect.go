package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tools/verify"
	"github.com/ucm-go/ucm/wal"
)

func newInspectCmd(tc *cliutil.Config, stdout, stderr io.Writer) *cobra.Command {
	var (
		segment uint64
		block   string
	)
	cmd := &cobra.Command{
		Use:   "inspect [DIR]",
		Short: "Show a store's schema, segment table, one segment's records or one block",
		Long: `inspect prints the stored schema and the segment table (number, state, generation,
size, live bytes, live records, live ratio). It never writes to the store, not even to
recover it.

  --segment N   list segment N's records: offset, block id, seq, shards, shard bytes,
                header crc, and whether the index points at the record (a batch
                record: one row per block, with its position in the batch)
  --block HEX   print one block's location and metadata from the index and whether
                the record header at that location matches`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := tc.StoreDir(args)
			if err != nil {
				return err
			}
			var id *format.BlockID
			if cmd.Flags().Changed("block") {
				b, err := format.ParseBlockID(strings.TrimSpace(block))
				if err != nil {
					return cliutil.UsageErr("--block: %v", err)
				}
				id = &b
			}
			seg := -1
			if cmd.Flags().Changed("segment") {
				seg = int(segment)
			}
			return runInspect(dir, seg, id, stdout)
		},
	}
	cmd.Flags().Uint64Var(&segment, "segment", 0, "list the records of segment number `N`")
	cmd.Flags().StringVar(&block, "block", "", "show the block with this id (32 hex digits)")
	return cmd
}

func runInspect(dir string, segment int, id *format.BlockID, stdout io.Writer) error {
	s, err := openStoreReadOnly(dir)
	if err != nil {
		return err
	}
	defer func() { _ = s.close() }()
	fmt.Fprintf(stdout, "store: %s\n", dir)
	fmt.Fprintf(stdout, "layout: %d shards x %d tensors, %d bytes per shard (block %d bytes, record %d bytes on disk)\n",
		s.Layout.Shards, s.Layout.TensorsPerShard, s.Layout.ShardBytes, s.Layout.BlockBytes(), s.Layout.RecordBytes())
	fmt.Fprintf(stdout, "schema (fingerprint %x):\n", s.Fingerprint[:8])
	for _, line := range strings.Split(strings.TrimRight(s.Schema, "\n"), "\n") {
		fmt.Fprintf(stdout, "  %s\n", line)
	}
	rows := s.ix.Segments()
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "segment\ttier\tstate\tgeneration\tsize\tlive bytes\tlive records\tsidecars\tlive ratio\t")
	for _, m := range rows {
		ratio := 0.0
		if m.Size > 0 {
			ratio = float64(m.LiveBytes) / float64(m.Size)
		}
		tier := s.SegmentTier(m.Number)
		if tier == "" {
			tier = "(no file)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%016x\t%d\t%d\t%d\t%d\t%.3f\t\n", m.Number, tier, m.State, m.Generation, m.Size, m.LiveBytes, m.LiveRecords, m.LiveSidecars, ratio)
	}
	_ = tw.Flush()
	blocks, live, files := s.ix.Totals()
	fmt.Fprintf(stdout, "%d segments, %d blocks, %d sidecars, %d live bytes of %d file bytes\n", len(rows), blocks, s.ix.SidecarCount(), live, files)
	if segment >= 0 {
		if err := inspectSegment(s, uint64(segment), stdout); err != nil {
			return err
		}
	}
	if id != nil {
		return inspectBlock(s, *id, stdout)
	}
	return nil
}

func inspectSegment(s *store, n uint64, stdout io.Writer) error {
	m, ok := s.ix.Segment(n)
	if !ok {
		return cliutil.UsageErr("segment %d is not registered in the index", n)
	}
	name := wal.SegmentFileName(n)
	path := s.SegmentPath(n)
	res, err := verify.ReadSegment(s.FS, path, m, false, nil)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return cliutil.UsageErr("segment %d: file %s is missing", n, path)
		}
		return cliutil.UsageErr("read %s: %v", path, err)
	}
	fmt.Fprintf(stdout, "\nsegment %d (%s, %s, tier %q): file %s, %d bytes", n, name, m.State, s.SegmentTier(n), path, res.FileSize)
	uncommitted := 0 // batch records that never committed: not in a footer, none indexed
	for _, r := range res.Records {
		if r.Batch != nil && !r.Batch.Committed && !r.Batch.Listed && !batchIndexed(s, n, r) {
			uncommitted++
		}
	}
	dead := ""
	switch {
	case uncommitted == 1:
		dead = " (and 1 uncommitted batch record: dead space)"
	case uncommitted > 1:
		dead = fmt.Sprintf(" (and %d uncommitted batch records: dead space)", uncommitted)
	}
	if res.Footer {
		fmt.Fprintf(stdout, ", footer lists %d records%s, data end %d", len(res.Records)-uncommitted, dead, res.DataEnd)
	} else {
		fmt.Fprintf(stdout, ", no footer; %d records%s walked up to %d", len(res.Records)-uncommitted, dead, res.DataEnd)
	}
	fmt.Fprintln(stdout)
	for _, p := range res.Problems {
		fmt.Fprintf(stdout, "  problem at %d: %s\n", p.Offset, p.Msg)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "offset\tblock id\trecord\tseq\tshards\tshard bytes\tcompression\trecord bytes\theader crc\tindexed\t")
	for _, r := range res.Records {
		if r.Batch != nil {
			printBatch(tw, s, n, r)
			continue
		}
		if r.Header == nil {
			indexed := "no"
			if loc, ok, err := s.ix.Get(r.ID); err == nil && ok && loc.Segment == n && loc.Offset == r.Offset {
				indexed = "yes"
			}
			fmt.Fprintf(tw, "%d\t%s\t-\t%d\t-\t-\t-\t-\t-\t%s\tINVALID: %v\n", r.Offset, r.ID, r.Seq, indexed, r.Err)
			continue
		}
		var (
			loc  index.Location
			ok   bool
			err  error
			what = "block"
		)
		if k := r.Header.Kind; k != 0 {
			loc, ok, err = s.ix.GetSidecar(r.ID, k)
			what = fmt.Sprintf("sidecar %d", k)
		} else {
			loc, ok, err = s.ix.Get(r.ID)
		}
		indexed := "no"
		if err == nil && ok && loc.Segment == n && loc.Offset == r.Offset {
			indexed = "yes"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%v\t%d\t%08x\t%s\t", r.Offset, r.ID, what, r.Seq, r.Header.Layout.Shards, r.Header.Layout.ShardBytes,
			r.Header.Compression, r.Header.RecordBytes(), r.HeaderCRC, indexed)
		if r.Err != nil {
			fmt.Fprintf(tw, "INVALID: %v", r.Err)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	if res.Stop != nil {
		fmt.Fprintf(stdout, "  log ends at %d (torn tail: %v)\n", res.DataEnd, res.Stop)
	}
	return nil
}

// printBatch prints one row per block of the batch record r of segment n: its offset, id,
// position, sequence number and whether the index points at it; an uncommitted batch's rows
// say it is dead space, and a bad block's row why it is invalid.
func printBatch(tw io.Writer, s *store, n uint64, r verify.RecordInfo) {
	b := r.Batch
	nb := len(b.Header.IDs)
	for k, id := range b.Header.IDs {
		indexed := "no"
		if loc, ok, err := s.ix.Get(id); err == nil && ok && loc.Segment == n && loc.Offset == r.Offset && loc.IsBatch() && loc.BatchPos == k {
			indexed = "yes"
		}
		fmt.Fprintf(tw, "%d\t%s\tbatch %d/%d\t%d\t%d\t%d\t%v\t%d\t%08x\t%s\t", r.Offset, id, k, nb, b.Header.FirstSeq+uint64(k),
			b.Header.Layout.Shards, b.Header.Layout.ShardBytes, format.CompressionNone, r.Length, r.HeaderCRC, indexed)
		switch {
		case !b.Committed && (b.Listed || batchIndexed(s, n, r)):
			fmt.Fprintf(tw, "COMMIT BLOCK DAMAGED (the batch committed; indexed blocks load if their shards match the index): %v", b.CommitErr)
		case !b.Committed:
			fmt.Fprintf(tw, "UNCOMMITTED (dead space): %v", b.CommitErr)
		case r.Err != nil && (len(b.Bad) == 0 || slices.Contains(b.Bad, k)):
			fmt.Fprintf(tw, "INVALID: %v", r.Err)
		}
		fmt.Fprintln(tw)
	}
}

func inspectBlock(s *store, id format.BlockID, stdout io.Writer) error {
	loc, ok, err := s.ix.Get(id)
	if err != nil {
		return cliutil.UsageErr("block %s: %v", id, err)
	}
	fmt.Fprintf(stdout, "\nblock %s\n", id)
	if !ok {
		fmt.Fprintln(stdout, "  not in the index")
		return nil
	}
	for _, k := range s.ix.SidecarKinds(id) {
		if sl, ok, err := s.ix.GetSidecar(id, k); err == nil && ok {
			fmt.Fprintf(stdout, "  sidecar %d:  segment %d offset %d, %d parts of %d bytes, %d bytes on disk\n", k, sl.Segment, sl.Offset, sl.Layout.Shards, sl.Layout.ShardBytes, sl.RecordBytes())
		}
	}
	name := wal.SegmentFileName(loc.Segment)
	fmt.Fprintf(stdout, "  segment:    %d (%s)\n", loc.Segment, name)
	fmt.Fprintf(stdout, "  offset:     %d\n", loc.Offset)
	fmt.Fprintf(stdout, "  layout:     %d shards x %d tensors, %d bytes per shard\n", loc.Layout.Shards, loc.Layout.TensorsPerShard, loc.Layout.ShardBytes)
	if loc.IsBatch() {
		bh := format.BatchHeader{Layout: loc.Layout, IDs: make([]format.BlockID, loc.BatchBlocks)}
		fmt.Fprintf(stdout, "  batch:      position %d of %d blocks in the batch record at %d of %d bytes (to %d): shard i at %d + i x %d, %d bytes of the batch counted for it\n",
			loc.BatchPos, loc.BatchBlocks, loc.Offset, bh.ExtentBytes(), loc.Offset+bh.ExtentBytes(), loc.ShardOffset(0),
			int64(loc.BatchBlocks)*loc.Layout.ShardStride(), loc.RecordBytes())
	} else {
		fmt.Fprintf(stdout, "  record:     %d bytes on disk, payload at %d\n", loc.RecordBytes(), loc.ShardOffset(0))
	}
	fmt.Fprintf(stdout, "  compression: %v", loc.Compression)
	if loc.Compression != format.CompressionNone {
		var sum int64
		for _, n := range loc.StoredLens {
			sum += int64(n)
		}
		fmt.Fprintf(stdout, ", %d raw bytes stored in %d (ratio %.3f)\n  stored lens:", loc.Layout.BlockBytes(), sum, float64(loc.Layout.BlockBytes())/float64(sum))
		for i, n := range loc.StoredLens {
			if i > 0 && i%8 == 0 {
				fmt.Fprintf(stdout, "\n             ")
			}
			fmt.Fprintf(stdout, " %d", n)
		}
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "  seq:        %d\n", loc.Seq)
	fmt.Fprintf(stdout, "  header crc: %08x\n", loc.HeaderCRC)
	fmt.Fprintf(stdout, "  shard crcs:")
	for i, c := range loc.ShardCRCs {
		if i > 0 && i%8 == 0 {
			fmt.Fprintf(stdout, "\n             ")
		}
		fmt.Fprintf(stdout, " %08x", c)
	}
	fmt.Fprintln(stdout)
	m, registered := s.ix.Segment(loc.Segment)
	if !registered {
		fmt.Fprintf(stdout, "  record header: segment %d is not registered\n", loc.Segment)
		return nil
	}
	if loc.IsBatch() {
		// No record header of its own: the batch's header and commit block (not its shards,
		// which `ucm-tool verify` checks) are checked against the entry.
		ri, err := verify.ReadRecordAt(s.FS, s.SegmentPath(loc.Segment), m, loc.Offset, false, nil)
		var why []string
		switch {
		case err != nil:
			fmt.Fprintf(stdout, "  batch header: cannot read it: %v\n", err)
			return nil
		case ri.Err != nil:
			why = []string{ri.Err.Error()}
		default:
			why = verify.BatchEntryMismatch(ri, id, 0, loc)
		}
		switch {
		case len(why) == 0 && ri.Batch != nil && !ri.Batch.Committed:
			fmt.Fprintf(stdout, "  batch header: matches the index; commit block DAMAGED (%v): the batch committed (the block is indexed) and the block loads if its shards match the index's checksums (ucm-tool verify checks them)\n", ri.Batch.CommitErr)
		case len(why) == 0:
			fmt.Fprintln(stdout, "  batch header and commit: match the index")
		default:
			fmt.Fprintf(stdout, "  batch header and commit: DO NOT MATCH the index: %s\n", strings.Join(why, "; "))
		}
		return nil
	}
	f, err := s.FS.Open(s.SegmentPath(loc.Segment))
	if err != nil {
		fmt.Fprintf(stdout, "  record header: cannot open the segment file: %v\n", err)
		return nil
	}
	defer func() { _ = f.Close() }()
	b := make([]byte, format.RecordHeaderSize)
	if _, err := f.ReadAt(b, loc.Offset); err != nil {
		fmt.Fprintf(stdout, "  record header: cannot read it: %v\n", err)
		return nil
	}
	h, crc, err := format.DecodeRecordHeader(b)
	var why []string
	switch {
	case err != nil:
		why = append(why, err.Error())
	default:
		if h.ID != id {
			why = append(why, fmt.Sprintf("holds block %s", h.ID))
		}
		if h.Segment != loc.Segment || h.Generation != m.Generation {
			why = append(why, fmt.Sprintf("names segment %d generation %#x, want %d generation %#x", h.Segment, h.Generation, loc.Segment, m.Generation))
		}
		if crc != loc.HeaderCRC {
			why = append(why, fmt.Sprintf("header crc %08x", crc))
		}
		if h.Seq != loc.Seq {
			why = append(why, fmt.Sprintf("seq %d", h.Seq))
		}
		if h.Layout != loc.Layout || !slices.Equal(h.ShardCRCs, loc.ShardCRCs) {
			why = append(why, "layout or shard checksums differ")
		}
		if h.Compression != loc.Compression || !slices.Equal(h.StoredLens, loc.StoredLens) || !slices.Equal(h.StoredCRCs, loc.StoredCRCs) {
			why = append(why, "compression or stored lengths differ")
		}
	}
	if len(why) == 0 {
		fmt.Fprintln(stdout, "  record header: matches the index")
	} else {
		fmt.Fprintf(stdout, "  record header: DOES NOT MATCH the index: %s\n", strings.Join(why, "; "))
	}
	return nil
}

// batchIndexed reports whether an index entry points at a block of the batch record r of
// segment n (which then committed, whatever its commit block holds now).
func batchIndexed(s *store, n uint64, r verify.RecordInfo) bool {
	for k, id := range r.Batch.Header.IDs {
		if loc, ok, err := s.ix.Get(id); err == nil && ok && loc.Segment == n && loc.Offset == r.Offset && loc.IsBatch() && loc.BatchPos == k {
			return true
		}
	}
	return false
}
