package cli

import (
	"bytes"
	"crypto/md5"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/internal/cliutil/clitest"
	"github.com/ucm-go/ucm/tools/verify"
	"github.com/ucm-go/ucm/wal"
)

var testSchema = engine.Schema{Model: "tool-test", DType: "bfloat16", KVLayout: "mha", TPSize: 1, BlockTokens: 16}

// testSegmentSize makes a store of 100 test blocks span several segments.
const testSegmentSize = 1 << 20

// testLayout: 4 shards of 2 tensors, 8 KiB per shard: 36 KiB records, ~27 per 1 MiB segment.
var testLayout = format.Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 8 << 10}

// run runs ucm-tool in-process.
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return clitest.Run(t, Main, "ucm-tool", args...)
}

func testID(i int) format.BlockID { return md5.Sum([]byte(fmt.Sprintf("tool-test-%d", i))) }

func testBlock(id format.BlockID) []byte {
	b := devio.AlignedBuffer(int(testLayout.BlockBytes()))
	for i := range b {
		b[i] = id[i%16] ^ byte(i/16)
	}
	return b
}

func openTestEngine(t *testing.T, dir string) *engine.Engine {
	t.Helper()
	e, err := engine.Open(dir, engine.Options{Layout: testLayout, Schema: testSchema, SegmentSize: testSegmentSize})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func dump(t *testing.T, e *engine.Engine, from, to int) {
	t.Helper()
	var ids []format.BlockID
	var src [][]byte
	for i := from; i < to; i++ {
		ids = append(ids, testID(i))
		src = append(src, testBlock(testID(i)))
	}
	if err := e.Dump(ids, src).Wait(); err != nil {
		t.Fatal(err)
	}
}

// buildStore makes a cleanly closed store with n blocks over several segments.
func buildStore(t *testing.T, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	e := openTestEngine(t, dir)
	for i := 0; i < n; i += 10 {
		dump(t, e, i, min(n, i+10))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// locate returns where the index says block id is, and the segment's row.
func locate(t *testing.T, dir string, id format.BlockID) (index.Location, index.SegmentMeta) {
	t.Helper()
	s, err := openStoreReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.close() }()
	loc, ok, err := s.ix.Get(id)
	if err != nil || !ok {
		t.Fatalf("block %s not in the index: %v", id, err)
	}
	m, _ := s.ix.Segment(loc.Segment)
	return loc, m
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = in.Close() }()
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func segPath(dir string, n uint64) string {
	return wal.SegmentPath(filepath.Join(dir, engine.SegmentDir), n)
}

func TestVerifyCleanStore(t *testing.T) {
	dir := buildStore(t, 100)
	out, _, code := run(t, "verify", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d, want 0", code)
	}
	clitest.MustContain(t, out, "problems: 0", "blocks verified: 100", "store is clean")
	if !strings.Contains(out, "segments: 4") && !strings.Contains(out, "segments: 5") {
		t.Errorf("want several segments")
	}
	// Verify changes nothing in a clean store: a second run sees the same.
	if _, _, code := run(t, "verify", "--progress", dir); code != cliutil.ExitOK {
		t.Fatalf("second verify: exit %d", code)
	}
}

func TestVerifyFlippedPayloadByte(t *testing.T) {
	dir := buildStore(t, 60)
	id := testID(7)
	loc, m := locate(t, dir, id)
	if m.State != index.SegmentSealed {
		t.Fatalf("segment %d is %s, want sealed", m.Number, m.State)
	}
	flipByte(t, segPath(dir, loc.Segment), loc.Offset+format.RecordHeaderSize+testLayout.ShardStride()*2+123)
	out, _, code := run(t, "verify", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, fmt.Sprintf("PROBLEM %s offset %d block %s", wal.SegmentFileName(loc.Segment), loc.Offset, id),
		"shard 2 checksum", "problems: 1", "blocks verified: 59")
	// A load finds it broken and drops it: from then on it is dead space, noted, not a problem.
	e := openTestEngine(t, dir)
	buf := make([]byte, testLayout.BlockBytes())
	if err := e.Load([]format.BlockID{id}, [][]byte{buf}).Wait(); !errors.Is(err, engine.ErrCorrupt) {
		t.Fatalf("load of the flipped block: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	out, _, code = run(t, "verify", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("verify after the drop: exit %d, want 0", code)
	}
	clitest.MustContain(t, out, "no longer indexed", "problems: 0", "blocks verified: 59")
}

func TestVerifyFlippedHeaderByte(t *testing.T) {
	dir := buildStore(t, 60)
	id := testID(31)
	loc, _ := locate(t, dir, id)
	flipByte(t, segPath(dir, loc.Segment), loc.Offset+45) // inside the sequence number
	out, _, code := run(t, "verify", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, fmt.Sprintf("PROBLEM %s offset %d block %s", wal.SegmentFileName(loc.Segment), loc.Offset, id),
		"field crc", "problems: 1")
	// The records after the bad one are still read and verified (the footer lists them).
	clitest.MustContain(t, out, "blocks verified: 59")
	// inspect shows the record as invalid and the block's header as not matching.
	out, _, code = run(t, "inspect", dir, "--segment", fmt.Sprint(loc.Segment), "--block", id.String())
	if code != cliutil.ExitOK {
		t.Fatalf("inspect: exit %d", code)
	}
	clitest.MustContain(t, out, "INVALID", "DOES NOT MATCH")
}

func TestVerifyMissingSegmentFile(t *testing.T) {
	dir := buildStore(t, 100)
	if err := os.Remove(segPath(dir, 2)); err != nil {
		t.Fatal(err)
	}
	// Without recovery: reported as missing, its entries still there.
	out, _, code := run(t, "verify", "--no-recover", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, "PROBLEM "+wal.SegmentFileName(2)+": segment file missing", "files missing 1",
		wal.SegmentFileName(2)+": sealed, file missing; drop its")
	// verify recovers first: the loss is reported once, the entries dropped; then it is clean.
	out, _, code = run(t, "verify", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, "sealed segments whose file is missing (their blocks dropped): [2]",
		"PROBLEM "+wal.SegmentFileName(2)+": sealed segment file was missing; recovery dropped")
	if out, _, code = run(t, "verify", dir); code != cliutil.ExitOK || strings.Contains(out, "recovery") {
		t.Fatalf("second verify: exit %d", code)
	}
	// stats agrees with itself: the store's blocks are the tier's blocks.
	out, _, code = run(t, "stats", "--json", dir)
	var st statsReport
	if code != cliutil.ExitOK || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("stats: exit %d", code)
	}
	if st.Blocks != st.Tiers[0].Blocks || st.Segments != st.Tiers[0].Segments || st.Blocks >= 100 {
		t.Fatalf("stats: %d blocks in %d segments, tier row %d in %d", st.Blocks, st.Segments, st.Tiers[0].Blocks, st.Tiers[0].Segments)
	}
	// A clean read-write open has nothing to say about the store.
	e := openTestEngine(t, dir)
	if r := e.Recovery(); len(r.MissingSegments) != 0 || r.EntriesDropped != 0 {
		t.Errorf("reopen after verify recovered again: %+v", r)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyTruncatedSegment: a sealed segment cut short is recovered by verify (reported
// once as a problem: blocks were lost), its intact records kept; the next verify is clean.
func TestVerifyTruncatedSegment(t *testing.T) {
	dir := buildStore(t, 100)
	loc, _ := locate(t, dir, testID(5))
	if err := os.Truncate(segPath(dir, loc.Segment), loc.Offset+100); err != nil {
		t.Fatal(err)
	}
	out, _, code := run(t, "stats", "--no-recover", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("stats --no-recover: exit %d", code)
	}
	clitest.MustContain(t, out, "recovery pending", wal.SegmentFileName(loc.Segment)+": sealed but cut short")
	out, _, code = run(t, "verify", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, fmt.Sprintf("sealed segments cut short, sealed again after their last intact record: [%d]", loc.Segment),
		"PROBLEM "+wal.SegmentFileName(loc.Segment)+": sealed segment file was cut short")
	if out, _, code = run(t, "verify", dir); code != cliutil.ExitOK || strings.Contains(out, "recovery") {
		t.Fatalf("second verify: exit %d\n%s", code, out)
	}
	e := openTestEngine(t, dir)
	defer e.Close()
	hits := e.Lookup([]format.BlockID{testID(4), testID(5)})
	if !hits[0] || hits[1] {
		t.Fatalf("after recovery: block 4 (before the cut) %v, block 5 (cut) %v", hits[0], hits[1])
	}
}

func TestVerifyUnregisteredSegmentFile(t *testing.T) {
	dir := buildStore(t, 100)
	b, err := os.ReadFile(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(segPath(dir, 9999), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Read-only: an unregistered segment is what recovery handles, not corruption.
	out, _, code := run(t, "verify", "--no-recover", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("--no-recover: exit %d, want 0\n%s", code, out)
	}
	clitest.MustContain(t, out, wal.SegmentFileName(9999)+" not registered in the index: recovery will adopt it")
	// Recovery tries to adopt it; its header names segment 1, so it is quarantined (kept for
	// inspection, its blocks never served) and reported.
	out, _, code = run(t, "verify", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	clitest.MustContain(t, out, "segments quarantined (unreadable or corrupt): [9999]", "PROBLEM "+wal.SegmentFileName(9999))
	if _, err := os.Stat(segPath(dir, 9999)); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyBytesAppendedToSealedSegment(t *testing.T) {
	dir := buildStore(t, 100)
	f, err := os.OpenFile(segPath(dir, 1), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(make([]byte, format.Alignment))
	_ = f.Close()
	out, _, code := run(t, "verify", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, "differs from its file size", "4096 bytes after the footer", "problems: 2", "blocks verified: 100")
}

// crashCopy dumps blocks and copies the store while the engine is still open: the copy is
// what a crash leaves (the last segment active, no footer).
func crashCopy(t *testing.T, n int) (string, *engine.Engine) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "live")
	e := openTestEngine(t, dir)
	for i := 0; i < n; i += 10 {
		dump(t, e, i, min(n, i+10))
	}
	cp := filepath.Join(t.TempDir(), "crashed")
	copyDir(t, dir, cp)
	return cp, e
}

func TestVerifyCrashLeftStore(t *testing.T) {
	cp, e := crashCopy(t, 70)
	defer func() { _ = e.Close() }()
	// A torn record after the last one: garbage that is not a valid record.
	s, err := openStoreReadOnly(cp)
	if err != nil {
		t.Fatal(err)
	}
	// The segment holding the last blocks, found by the read-only scan: the index may lag
	// (dumps do not wait for its sync), and the dump writer's prepared next one is empty.
	all := s.activeSegments()
	pending, err := s.ScanPending()
	_ = s.close()
	if err != nil {
		t.Fatal(err)
	}
	var last *verify.PendingSegment
	for _, p := range pending {
		if p.Records > 0 && (last == nil || p.Number > last.Number) {
			last = p
		}
	}
	if last == nil {
		t.Fatalf("no active segment holding blocks in the crash copy: %+v", pending)
	}
	path := segPath(cp, last.Number)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The active segment may be laid out beyond its last record (fallocate): cut it there, so
	// the garbage directly follows the last record and is the whole tail.
	garbage := bytes.Repeat([]byte("torn"), 3000)
	if err := f.Truncate(last.ValidEnd); err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteAt(garbage, last.ValidEnd)
	_ = f.Close()

	cp2 := filepath.Join(t.TempDir(), "crashed2")
	copyDir(t, cp, cp2)

	out, _, code := run(t, "verify", "--no-recover", cp)
	if code != cliutil.ExitOK {
		t.Fatalf("--no-recover: exit %d, want 0 (a torn tail is not corruption)", code)
	}
	// Without recovery only what the index holds is verified: it may lack the newest entries.
	clitest.MustContain(t, out, "recovery pending", fmt.Sprintf("cut %d bytes", len(garbage)), "problems: 0", "blocks verified: ")
	// --no-recover changed nothing.
	if st, err := os.Stat(path); err != nil || st.Size() != last.ValidEnd+int64(len(garbage)) {
		t.Errorf("--no-recover modified %s: %v %v", path, st.Size(), err)
	}
	out, _, code = run(t, "stats", "--no-recover", cp)
	if code != cliutil.ExitOK {
		t.Fatalf("stats --no-recover: exit %d", code)
	}
	clitest.MustContain(t, out, "recovery pending", fmt.Sprintf("active %d", len(all)))

	out, _, code = run(t, "verify", cp)
	if code != cliutil.ExitOK {
		t.Fatalf("verify: exit %d, want 0", code)
	}
	clitest.MustContain(t, out, "recovery:", "segments left active by a crash, truncated to their valid end and sealed: 1",
		fmt.Sprintf("tail bytes cut: %d", len(garbage)), "problems: 0", "blocks verified: 70", "active 0")
	// Recovered: now it is a clean store.
	if out, _, code = run(t, "verify", cp); code != cliutil.ExitOK || strings.Contains(out, "recovery") {
		t.Fatalf("second verify: exit %d", code)
	}

	// stats recovers first too.
	out, _, code = run(t, "stats", "--json", cp2)
	if code != cliutil.ExitOK {
		t.Fatalf("stats: exit %d", code)
	}
	var r statsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Recovery == nil || r.Recovery.SegmentsRecovered != 1 || r.Blocks != 70 || r.SegmentsByState["active"] != 0 {
		t.Errorf("stats after recovery: %+v", r)
	}
}

func TestVerifyCrashCopyWithoutGarbage(t *testing.T) {
	cp, e := crashCopy(t, 45)
	defer func() { _ = e.Close() }()
	if _, _, code := run(t, "verify", "--no-recover", cp); code != cliutil.ExitOK {
		t.Fatalf("--no-recover: exit %d", code)
	}
	out, _, code := run(t, "verify", cp)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "recovery:", "blocks verified: 45")
}

func TestVerifyLockedStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	e := openTestEngine(t, dir)
	defer func() { _ = e.Close() }()
	dump(t, e, 0, 5)
	_, errOut, code := run(t, "verify", dir)
	if code != cliutil.ExitUsage {
		t.Fatalf("exit %d, want 2", code)
	}
	clitest.MustContain(t, errOut, "lock")
}

func TestUsageErrors(t *testing.T) {
	notStore := t.TempDir()
	for _, args := range [][]string{
		{"verify"},
		{"verify", filepath.Join(notStore, "nope")},
		{"verify", notStore},
		{"stats", notStore},
		{"inspect", notStore},
		{"verify", "--bogus", notStore},
		{"nosuchcommand"},
	} {
		if _, _, code := run(t, args...); code != cliutil.ExitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	// A directory that is not a store is left untouched.
	if ents, _ := os.ReadDir(notStore); len(ents) != 0 {
		t.Errorf("a failed command wrote into %s: %v", notStore, ents)
	}
	dir := buildStore(t, 5)
	if _, _, code := run(t, "inspect", dir, "--block", "xyz"); code != cliutil.ExitUsage {
		t.Errorf("bad --block: exit %d", code)
	}
	if _, _, code := run(t, "inspect", dir, "--segment", "42"); code != cliutil.ExitUsage {
		t.Errorf("unknown --segment: exit %d", code)
	}
}

func TestStatsMatchesEngine(t *testing.T) {
	dir := buildStore(t, 100)
	out, _, code := run(t, "stats", "--json", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	var r statsReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("stats --json does not parse: %v", err)
	}
	e, err := engine.Open(dir, engine.Options{ReadOnly: true, AdoptStoredSchema: true})
	if err != nil {
		t.Fatal(err)
	}
	st := e.Stats()
	_ = e.Close()
	if r.Blocks != st.Blocks || r.LiveBytes != st.LiveBytes || r.FileBytes != st.FileBytes || r.Segments != st.Segments ||
		r.DeadBytes != st.FileBytes-st.LiveBytes || r.SegmentsByState["sealed"] != st.Segments || r.Recovery != nil {
		t.Errorf("stats %+v, engine %+v", r, st)
	}
	if r.Blocks != 100 {
		t.Errorf("blocks %d, want 100", r.Blocks)
	}
	out, _, code = run(t, "stats", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, fmt.Sprintf("blocks:      %d", st.Blocks), fmt.Sprintf("live bytes:  %d", st.LiveBytes),
		fmt.Sprintf("file bytes:  %d", st.FileBytes))
}

func TestInspect(t *testing.T) {
	dir := buildStore(t, 40)
	id := testID(3)
	loc, _ := locate(t, dir, id)
	out, _, code := run(t, "inspect", dir, "--segment", fmt.Sprint(loc.Segment), "--block", id.String())
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, `model="tool-test"`, "live ratio", "sealed",
		fmt.Sprintf("%d  %s", loc.Offset, id), "record header: matches the index", fmt.Sprintf("offset:     %d", loc.Offset))
	if strings.Contains(out, "  no\n") {
		t.Errorf("every record of a fresh store is indexed")
	}
	out, _, _ = run(t, "inspect", dir, "--block", testID(1000).String())
	clitest.MustContain(t, out, "not in the index")
}

func TestVerifyCorruptFooterStillChecksRecords(t *testing.T) {
	dir := buildStore(t, 60)
	st, err := os.Stat(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, segPath(dir, 1), st.Size()-10) // inside the trailer's checksummed bytes
	out, _, code := run(t, "verify", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, "PROBLEM "+wal.SegmentFileName(1)+": no valid footer", "blocks verified: 60", "problems: 1")
	// A payload flip in the same segment is still found by the walk.
	loc, _ := locate(t, dir, testID(2))
	if loc.Segment != 1 {
		t.Skipf("block 2 is in segment %d", loc.Segment)
	}
	flipByte(t, segPath(dir, 1), loc.Offset+format.RecordHeaderSize+1)
	out, _, _ = run(t, "verify", dir)
	clitest.MustContain(t, out, fmt.Sprintf("PROBLEM %s offset %d block %s", wal.SegmentFileName(1), loc.Offset, testID(2)), "blocks verified: 59")
}

// TestVerifyCorruptSegmentHeader: a segment whose header fails its checks cannot serve any of
// its blocks (the engine refuses to open it); verify says so and does not count them verified.
func TestVerifyCorruptSegmentHeader(t *testing.T) {
	dir := buildStore(t, 100)
	loc, _ := locate(t, dir, testID(40))
	s, err := openStoreReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	inSeg := 0
	_ = s.ix.Iterate(func(_ format.BlockID, l index.Location) bool {
		if l.Segment == loc.Segment {
			inSeg++
		}
		return true
	})
	_ = s.close()
	flipByte(t, segPath(dir, loc.Segment), 9)
	out, _, code := run(t, "verify", "--no-recover", dir)
	if code != cliutil.ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	clitest.MustContain(t, out, "PROBLEM "+wal.SegmentFileName(loc.Segment), fmt.Sprintf("blocks verified: %d", 100-inSeg))
	e := openTestEngine(t, dir)
	defer e.Close()
	buf := make([]byte, testLayout.BlockBytes())
	if err := e.Load([]format.BlockID{testID(40)}, [][]byte{buf}).Wait(); err == nil {
		t.Fatal("a block of a segment with a corrupt header loaded")
	}
}

// TestVerifyLostIndex: a store whose index directory was deleted, or whose index lost its WAL
// with the schema record, is recovered by verify from its segments and its schema file.
func TestVerifyLostIndex(t *testing.T) {
	for _, how := range []string{"index deleted", "index WAL deleted"} {
		dir := buildStore(t, 40)
		switch how {
		case "index deleted":
			if err := os.RemoveAll(filepath.Join(dir, engine.IndexDir)); err != nil {
				t.Fatal(err)
			}
		default:
			logs, _ := filepath.Glob(filepath.Join(dir, engine.IndexDir, "*.log"))
			for _, l := range logs {
				if err := os.Remove(l); err != nil {
					t.Fatal(err)
				}
			}
		}
		out, _, code := run(t, "verify", dir)
		if code != cliutil.ExitOK {
			t.Fatalf("%s: verify exit %d, want 0", how, code)
		}
		clitest.MustContain(t, out, "recovery:", "blocks verified: 40", "problems: 0")
		if out, _, code = run(t, "verify", dir); code != cliutil.ExitOK || strings.Contains(out, "recovery") {
			t.Fatalf("%s: second verify: exit %d", how, code)
		}
	}
}

// TestInspectAndVerifySidecars: inspect lists sidecar records beside the blocks (their kind,
// whether indexed) and a block's sidecars; verify reads and counts them.
func TestInspectAndVerifySidecars(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	e := openTestEngine(t, dir)
	dump(t, e, 0, 10)
	ids := make([]format.BlockID, 10)
	src := make([][]byte, 10)
	for i := range ids {
		ids[i], src[i] = testID(i), bytes.Repeat([]byte{byte(i + 1)}, 3*512)
	}
	if err := e.DumpSidecars(4, 3, ids, src).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	id := testID(3)
	loc, _ := locate(t, dir, id)
	out, _, code := run(t, "inspect", dir, "--segment", fmt.Sprint(loc.Segment), "--block", id.String())
	if code != cliutil.ExitOK {
		t.Fatalf("exit %d", code)
	}
	clitest.MustContain(t, out, "10 blocks, 10 sidecars", "sidecar 4", "packed", "sidecar 4:  segment", "3 parts of 512 bytes")
	if strings.Contains(out, "  no\n") {
		t.Errorf("every record of a fresh store is indexed")
	}
	out, _, code = run(t, "verify", dir)
	if code != cliutil.ExitOK {
		t.Fatalf("verify exit %d:\n%s", code, out)
	}
	clitest.MustContain(t, out, "blocks verified: 10", "sidecars: 10, verified: 10", "store is clean")
	out, _, _ = run(t, "stats", dir)
	clitest.MustContain(t, out, "blocks:      10", "sidecars:    10")
}

// TestMovedCommands: bench, eval and chat are ucm-lab's; here, with any arguments, they fail
// with a usage error naming the ucm-lab command and write nothing.
func TestMovedCommands(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"bench", "--workload", "seq", "--dir", dir},
		{"eval", "sparse", "--windows", "1"},
		{"chat", "--dir", dir},
		{"bench"},
	} {
		out, errOut, code := run(t, args...)
		if code != cliutil.ExitUsage || out != "" || !strings.Contains(errOut, "ucm-lab "+args[0]) || !strings.Contains(errOut, ErrMoved.Error()) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 naming ucm-lab %s", args, code, out, errOut, args[0])
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a moved command wrote into %s: %v", dir, ents)
	}
	out, _, _ := run(t, "help")
	for _, name := range []string{"bench", "eval", "chat"} {
		if strings.Contains(out, "\n  "+name+" ") {
			t.Errorf("help lists the moved command %s:\n%s", name, out)
		}
	}
	if !strings.Contains(out, "\n  verify ") {
		t.Errorf("help does not list verify (the check above cannot fail):\n%s", out)
	}
}
