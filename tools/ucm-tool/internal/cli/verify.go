package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

type verifyFlags struct {
	noRecover bool
	progress  bool
}

func newVerifyCmd(stdout, stderr io.Writer) *cobra.Command {
	var f verifyFlags
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Check every record, checksum and index entry of a store",
		Long: `verify reads every record of every segment and checks every checksum (segment
header, record headers, every shard, footers of sealed segments), then cross-checks
the index and the log both ways: every index entry must point at a valid record at
that exact offset with the same header checksum, sequence number and shard checksums;
every registered segment must have its file and every segment file must be registered;
the segment table's live bytes and records must equal what the index entries add up
to, and a sealed segment's recorded size must equal its file size. Records in the log
that the index does not point at are dead space (counted, not a problem).

A store left by a crash (a segment still active) is not corrupt: verify first
recovers it (truncates the torn tail and seals the segment, as opening the engine
does) and prints what recovery did. With --no-recover it changes nothing and reports
what recovery will do instead.

Exit status: 0 clean, 1 problems found, 2 usage or open error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerify(args[0], f, stdout, stderr)
		},
	}
	cmd.Flags().BoolVar(&f.noRecover, "no-recover", false, "do not recover a crash-left store; report what recovery will do and verify the rest read-only")
	cmd.Flags().BoolVar(&f.progress, "progress", false, "show a progress bar on stderr even when it is not a terminal")
	return cmd
}

// problem is one finding of verify.
type problem struct {
	file   string // segment file name, "" for the index as a whole
	offset int64  // -1: none
	id     format.BlockID
	msg    string
}

func (p problem) String() string {
	var b strings.Builder
	b.WriteString("PROBLEM ")
	if p.file == "" {
		b.WriteString("index")
	} else {
		b.WriteString(p.file)
	}
	if p.offset >= 0 {
		fmt.Fprintf(&b, " offset %d", p.offset)
	}
	if !p.id.IsZero() {
		fmt.Fprintf(&b, " block %s", p.id)
	}
	b.WriteString(": ")
	b.WriteString(p.msg)
	return b.String()
}

// recKey locates a record: segment number and offset.
type recKey struct {
	seg uint64
	off int64
}

// recState is a record found in the log, with what the index says about it.
type recState struct {
	info    recordInfo
	file    string
	indexed bool
}

type verifySummary struct {
	segments, sealed, active, quarantined, missing int
	records, validRecords, deadRecords             int64
	deadBytes, bytesRead                           int64
	indexEntries, blocksVerified, pendingDrops     int64
}

func runVerify(dir string, f verifyFlags, stdout, stderr io.Writer) error {
	s, rep, err := openRecovered(dir, !f.noRecover)
	if err != nil {
		return err
	}
	defer func() { _ = s.close() }()
	var problems []problem
	add := func(file string, off int64, id format.BlockID, format string, args ...any) {
		problems = append(problems, problem{file: file, offset: off, id: id, msg: fmt.Sprintf(format, args...)})
	}
	fmt.Fprintf(stdout, "verify %s\n", dir)
	if rep != nil {
		printRecovery(stdout, rep)
		for _, n := range rep.MissingSegments {
			add(wal.SegmentFileName(n), -1, format.BlockID{}, "sealed segment file was missing; recovery dropped the index entries pointing into it")
		}
	}
	pending := map[uint64]*pendingSegment{}
	if f.noRecover {
		ps, err := s.scanPending()
		if err != nil {
			return usageErr("%v", err)
		}
		if len(ps) > 0 {
			printPending(stdout, ps)
		}
		for _, p := range ps {
			pending[p.Number] = p
		}
	}

	// Segment files on disk.
	names, err := os.ReadDir(s.segDir)
	if err != nil {
		return usageErr("%v", err)
	}
	onDisk := map[uint64]int64{}
	for _, de := range names {
		name := de.Name()
		if n, ok := wal.ParseSegmentFileName(name); ok {
			size := int64(-1)
			if fi, err := de.Info(); err == nil {
				size = fi.Size()
			}
			onDisk[n] = size
		} else if strings.HasSuffix(name, wal.TempSuffix) {
			fmt.Fprintf(stdout, "note: temporary file %s left by an interrupted operation (the engine removes it at open)\n", name)
		} else {
			fmt.Fprintf(stdout, "note: foreign file %s in the segment directory (ignored by the engine)\n", name)
		}
	}
	rows := s.ix.Segments()
	registered := map[uint64]index.SegmentMeta{}
	var total int64
	for _, m := range rows {
		registered[m.Number] = m
		if sz, ok := onDisk[m.Number]; ok && m.State != index.SegmentQuarantined && sz > 0 {
			total += sz
		}
	}
	for n := range onDisk {
		if _, ok := registered[n]; !ok {
			add(wal.SegmentFileName(n), -1, format.BlockID{}, "segment file not registered in the index (recovery would delete it)")
		}
	}

	// Read every registered segment.
	var sum verifySummary
	recs := map[recKey]*recState{}
	validEnd := map[uint64]int64{} // active segments (--no-recover): entries at or past it will be dropped
	bar := newProgress(stderr, f.progress || isTerminal(stderr), total, "verify")
	for _, m := range rows {
		name := wal.SegmentFileName(m.Number)
		path := filepath.Join(s.segDir, name)
		sum.segments++
		size, present := onDisk[m.Number]
		switch m.State {
		case index.SegmentSealed:
			sum.sealed++
		case index.SegmentActive:
			sum.active++
		case index.SegmentQuarantined:
			sum.quarantined++
			add(name, -1, format.BlockID{}, "segment quarantined (found corrupt when recovery scanned it); its blocks are not served")
			continue
		}
		if !present {
			sum.missing++
			if m.State == index.SegmentSealed {
				add(name, -1, format.BlockID{}, "segment file missing (registered as %s with %d live records)", m.State, m.LiveRecords)
			}
			continue
		}
		if m.State == index.SegmentActive {
			p := pending[m.Number]
			if p == nil || p.scan == nil {
				// Unreadable header: recovery will quarantine it; already reported as pending.
				validEnd[m.Number] = 0
				continue
			}
			validEnd[m.Number] = p.ValidEnd
			sum.bytesRead += p.FileSize
			bar.add(p.FileSize)
			for _, r := range p.scan.Records {
				h := r.Header
				recs[recKey{m.Number, r.Offset}] = &recState{file: name, info: recordInfo{Offset: r.Offset, Length: r.Length(),
					ID: h.ID, Seq: h.Seq, HeaderCRC: r.HeaderCRC, Header: &h, PayloadChecked: true}}
			}
			continue
		}
		res, err := readSegment(path, m.Number, m.Generation, m.Size, modeSealed, true, bar.add)
		if err != nil {
			bar.finish()
			return usageErr("read %s: %v", path, err)
		}
		sum.bytesRead += res.BytesRead
		if m.Size != size {
			add(name, -1, format.BlockID{}, "sealed segment's recorded size %d differs from its file size %d", m.Size, size)
		}
		if res.Header != nil && res.Header.Schema != s.fp {
			add(name, 0, format.BlockID{}, "segment header carries another schema fingerprint than the store's")
		}
		for _, p := range res.Problems {
			add(name, p.Offset, format.BlockID{}, "%s", p.Msg)
		}
		for _, ri := range res.Records {
			recs[recKey{m.Number, ri.Offset}] = &recState{file: name, info: ri}
		}
	}
	bar.finish()

	// Index → log.
	err = s.ix.Iterate(func(id format.BlockID, loc index.Location) bool {
		sum.indexEntries++
		name := wal.SegmentFileName(loc.Segment)
		m, ok := registered[loc.Segment]
		if !ok {
			add(name, loc.Offset, id, "index entry points into segment %d, which is not registered", loc.Segment)
			return true
		}
		if _, present := onDisk[loc.Segment]; !present {
			return true // reported once for the segment
		}
		if m.State == index.SegmentQuarantined {
			add(name, loc.Offset, id, "index entry points into a quarantined segment")
			return true
		}
		if end, ok := validEnd[loc.Segment]; ok && loc.Offset >= end {
			sum.pendingDrops++ // past the valid end of an active segment: recovery drops it
			return true
		}
		r := recs[recKey{loc.Segment, loc.Offset}]
		if r == nil {
			add(name, loc.Offset, id, "index entry points at offset %d, which is not the start of a record", loc.Offset)
			return true
		}
		r.indexed = true
		if r.info.Err != nil {
			return true // reported with the record
		}
		var why []string
		if r.info.ID != id {
			why = append(why, fmt.Sprintf("the record holds block %s", r.info.ID))
		}
		if r.info.HeaderCRC != loc.HeaderCRC {
			why = append(why, fmt.Sprintf("header crc %#08x, index has %#08x", r.info.HeaderCRC, loc.HeaderCRC))
		}
		if r.info.Seq != loc.Seq {
			why = append(why, fmt.Sprintf("seq %d, index has %d", r.info.Seq, loc.Seq))
		}
		if h := r.info.Header; h != nil {
			if h.Layout != loc.Layout {
				why = append(why, fmt.Sprintf("layout %+v, index has %+v", h.Layout, loc.Layout))
			} else if !slices.Equal(h.ShardCRCs, loc.ShardCRCs) {
				why = append(why, "shard checksums differ from the index's")
			}
		}
		if loc.Layout != s.layout {
			why = append(why, fmt.Sprintf("index layout %+v is not the store's %+v", loc.Layout, s.layout))
		}
		if len(why) > 0 {
			add(name, loc.Offset, id, "index entry does not match the record: %s", strings.Join(why, "; "))
			return true
		}
		if r.info.PayloadChecked {
			sum.blocksVerified++
		}
		return true
	})
	if err != nil {
		add("", -1, format.BlockID{}, "reading the index: %v", err)
	}

	// Log → index: invalid records are problems; valid ones nobody points at are dead space.
	for k, r := range recs {
		sum.records++
		if r.info.Err != nil {
			state := "not indexed"
			if r.indexed {
				state = "indexed: loads of it will miss"
			}
			add(r.file, k.off, r.info.ID, "invalid record (%s): %v", state, r.info.Err)
			continue
		}
		sum.validRecords++
		if !r.indexed {
			sum.deadRecords++
			sum.deadBytes += r.info.Length
		}
	}

	// Space accounting.
	if err := s.ix.CheckAccounting(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			add("", -1, format.BlockID{}, "%s", line)
		}
	}

	slices.SortStableFunc(problems, func(a, b problem) int {
		if c := strings.Compare(a.file, b.file); c != 0 {
			return c
		}
		switch {
		case a.offset < b.offset:
			return -1
		case a.offset > b.offset:
			return 1
		}
		return 0
	})
	for _, p := range problems {
		fmt.Fprintln(stdout, p)
	}
	fmt.Fprintf(stdout, "segments: %d (sealed %d, active %d, quarantined %d, files missing %d, unregistered files %d)\n",
		sum.segments, sum.sealed, sum.active, sum.quarantined, sum.missing, countUnregistered(onDisk, registered))
	fmt.Fprintf(stdout, "records: %d (valid %d, dead %d = %d bytes)\n", sum.records, sum.validRecords, sum.deadRecords, sum.deadBytes)
	fmt.Fprintf(stdout, "index entries: %d; blocks verified: %d", sum.indexEntries, sum.blocksVerified)
	if sum.pendingDrops > 0 {
		fmt.Fprintf(stdout, "; past a torn tail (recovery drops them): %d", sum.pendingDrops)
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "bytes read: %d (%s)\n", sum.bytesRead, humanBytes(sum.bytesRead))
	fmt.Fprintf(stdout, "problems: %d\n", len(problems))
	if len(problems) > 0 {
		return problemsFound
	}
	fmt.Fprintln(stdout, "store is clean")
	return nil
}

func countUnregistered(onDisk map[uint64]int64, registered map[uint64]index.SegmentMeta) int {
	n := 0
	for k := range onDisk {
		if _, ok := registered[k]; !ok {
			n++
		}
	}
	return n
}
