package cli

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/tools/verify/verifytest"
)

// TestInspectBatchSegment: inspect --segment lists each block of a batch record (offset, id,
// position, seq, indexed) and an abandoned batch as dead space; --block on a batch block
// prints its position and the batch's offset and extent, and checks the batch against the
// entry. verify counts the abandoned batch as dead space.
func TestInspectBatchSegment(t *testing.T) {
	dir := buildStore(t, 10)
	committed := &verifytest.Batch{IDs: []format.BlockID{testID(500), testID(501), testID(502)}, Commit: true}
	abandoned := &verifytest.Batch{IDs: []format.BlockID{testID(600), testID(601)}}
	seg, err := verifytest.WriteBatchSegment(nil, dir, []*verifytest.Batch{committed, abandoned})
	if err != nil {
		t.Fatal(err)
	}
	loc, _ := locate(t, dir, testID(501))
	out, _, code := run(t, "inspect", dir, "--segment", fmt.Sprint(seg), "--block", testID(501).String())
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	// hasRow: a line of the listing starts with these fields.
	hasRow := func(fields ...string) {
		t.Helper()
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= len(fields) && slices.Equal(f[:len(fields)], fields) {
				return
			}
		}
		t.Errorf("no row %q", fields)
	}
	at := func(off int64) string { return fmt.Sprint(off) }
	hasRow(at(committed.Offset), testID(500).String(), "batch", "0/3")
	hasRow(at(committed.Offset), testID(501).String(), "batch", "1/3", fmt.Sprint(loc.Seq))
	hasRow(at(committed.Offset), testID(502).String(), "batch", "2/3")
	hasRow(at(abandoned.Offset), testID(601).String(), "batch", "1/2")
	clitest.MustContain(t, out, "footer lists 1 records (and 1 uncommitted batch record: dead space), data end", "UNCOMMITTED (dead space)",
		fmt.Sprintf("position 1 of 3 blocks in the batch record at %d of %d bytes", committed.Offset, committed.Extent),
		"batch header and commit: match the index")
	if strings.Contains(out, "INVALID") {
		t.Error("a batch record listed as invalid")
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, testID(502).String()) && !strings.Contains(line, " yes ") {
			t.Errorf("committed block 2 not shown as indexed: %q", line)
		}
	}
	out, _, code = run(t, "verify", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("verify: exit %d", code)
	}
	clitest.MustContain(t, out, fmt.Sprintf("dead 1 = %d bytes", abandoned.Extent))
}
