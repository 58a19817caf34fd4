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

	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
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
	var out, errb bytes.Buffer
	code = Main(args, &out, &errb)
	t.Logf("ucm-tool %s → %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	return out.String(), errb.String(), code
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

func mustContain(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func TestVerifyCleanStore(t *testing.T) {
	dir := buildStore(t, 100)
	out, _, code := run(t, "verify", dir)
	if code != ExitOK {
		t.Fatalf("exit %d, want 0", code)
	}
	mustContain(t, out, "problems: 0", "blocks verified: 100", "store is clean")
	if !strings.Contains(out, "segments: 4") && !strings.Contains(out, "segments: 5") {
		t.Errorf("want several segments")
	}
	// Verify changes nothing in a clean store: a second run sees the same.
	if _, _, code := run(t, "verify", "--progress", dir); code != ExitOK {
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
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, fmt.Sprintf("PROBLEM %s offset %d block %s", wal.SegmentFileName(loc.Segment), loc.Offset, id),
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
	if code != ExitOK {
		t.Fatalf("verify after the drop: exit %d, want 0", code)
	}
	mustContain(t, out, "no longer indexed", "problems: 0", "blocks verified: 59")
}

func TestVerifyFlippedHeaderByte(t *testing.T) {
	dir := buildStore(t, 60)
	id := testID(31)
	loc, _ := locate(t, dir, id)
	flipByte(t, segPath(dir, loc.Segment), loc.Offset+45) // inside the sequence number
	out, _, code := run(t, "verify", dir)
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, fmt.Sprintf("PROBLEM %s offset %d block %s", wal.SegmentFileName(loc.Segment), loc.Offset, id),
		"field crc", "problems: 1")
	// The records after the bad one are still read and verified (the footer lists them).
	mustContain(t, out, "blocks verified: 59")
	// inspect shows the record as invalid and the block's header as not matching.
	out, _, code = run(t, "inspect", dir, "--segment", fmt.Sprint(loc.Segment), "--block", id.String())
	if code != ExitOK {
		t.Fatalf("inspect: exit %d", code)
	}
	mustContain(t, out, "INVALID", "DOES NOT MATCH")
}

func TestVerifyMissingSegmentFile(t *testing.T) {
	dir := buildStore(t, 100)
	if err := os.Remove(segPath(dir, 2)); err != nil {
		t.Fatal(err)
	}
	// Without recovery: reported as missing, its entries still there.
	out, _, code := run(t, "verify", "--no-recover", dir)
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, "PROBLEM "+wal.SegmentFileName(2)+": segment file missing", "files missing 1",
		wal.SegmentFileName(2)+": sealed, file missing; drop its")
	// verify recovers first: the loss is reported once, the entries dropped; then it is clean.
	out, _, code = run(t, "verify", dir)
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, "sealed segments whose file is missing (their blocks dropped): [2]",
		"PROBLEM "+wal.SegmentFileName(2)+": sealed segment file was missing; recovery dropped")
	if out, _, code = run(t, "verify", dir); code != ExitOK || strings.Contains(out, "recovery") {
		t.Fatalf("second verify: exit %d", code)
	}
	// stats agrees with itself: the store's blocks are the tier's blocks.
	out, _, code = run(t, "stats", "--json", dir)
	var st statsReport
	if code != ExitOK || json.Unmarshal([]byte(out), &st) != nil {
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
	if code != ExitOK {
		t.Fatalf("stats --no-recover: exit %d", code)
	}
	mustContain(t, out, "recovery pending", wal.SegmentFileName(loc.Segment)+": sealed but cut short")
	out, _, code = run(t, "verify", dir)
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, fmt.Sprintf("sealed segments cut short, sealed again after their last intact record: [%d]", loc.Segment),
		"PROBLEM "+wal.SegmentFileName(loc.Segment)+": sealed segment file was cut short")
	if out, _, code = run(t, "verify", dir); code != ExitOK || strings.Contains(out, "recovery") {
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
	if code != ExitOK {
		t.Fatalf("--no-recover: exit %d, want 0\n%s", code, out)
	}
	mustContain(t, out, wal.SegmentFileName(9999)+" not registered in the index: recovery will adopt it")
	// Recovery tries to adopt it; its header names segment 1, so it is quarantined (kept for
	// inspection, its blocks never served) and reported.
	out, _, code = run(t, "verify", dir)
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	mustContain(t, out, "segments quarantined (unreadable or corrupt): [9999]", "PROBLEM "+wal.SegmentFileName(9999))
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
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, "differs from its file size", "4096 bytes after the footer", "problems: 2", "blocks verified: 100")
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
	if code != ExitOK {
		t.Fatalf("--no-recover: exit %d, want 0 (a torn tail is not corruption)", code)
	}
	// Without recovery only what the index holds is verified: it may lack the newest entries.
	mustContain(t, out, "recovery pending", fmt.Sprintf("cut %d bytes", len(garbage)), "problems: 0", "blocks verified: ")
	// --no-recover changed nothing.
	if st, err := os.Stat(path); err != nil || st.Size() != last.ValidEnd+int64(len(garbage)) {
		t.Errorf("--no-recover modified %s: %v %v", path, st.Size(), err)
	}
	out, _, code = run(t, "stats", "--no-recover", cp)
	if code != ExitOK {
		t.Fatalf("stats --no-recover: exit %d", code)
	}
	mustContain(t, out, "recovery pending", fmt.Sprintf("active %d", len(all)))

	out, _, code = run(t, "verify", cp)
	if code != ExitOK {
		t.Fatalf("verify: exit %d, want 0", code)
	}
	mustContain(t, out, "recovery:", "segments left active by a crash, truncated to their valid end and sealed: 1",
		fmt.Sprintf("tail bytes cut: %d", len(garbage)), "problems: 0", "blocks verified: 70", "active 0")
	// Recovered: now it is a clean store.
	if out, _, code = run(t, "verify", cp); code != ExitOK || strings.Contains(out, "recovery") {
		t.Fatalf("second verify: exit %d", code)
	}

	// stats recovers first too.
	out, _, code = run(t, "stats", "--json", cp2)
	if code != ExitOK {
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
	if _, _, code := run(t, "verify", "--no-recover", cp); code != ExitOK {
		t.Fatalf("--no-recover: exit %d", code)
	}
	out, _, code := run(t, "verify", cp)
	if code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, out, "recovery:", "blocks verified: 45")
}

func TestVerifyLockedStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s")
	e := openTestEngine(t, dir)
	defer func() { _ = e.Close() }()
	dump(t, e, 0, 5)
	_, errOut, code := run(t, "verify", dir)
	if code != ExitUsage {
		t.Fatalf("exit %d, want 2", code)
	}
	mustContain(t, errOut, "lock")
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
		{"bench", "--workload", "random", "--dir", notStore},
		{"bench", "--block-size", "1000", "--shards", "3", "--dir", notStore},
		{"bench", "--total", "8MB", "--dir", notStore},
	} {
		if _, _, code := run(t, args...); code != ExitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	// A directory that is not a store is left untouched.
	if ents, _ := os.ReadDir(notStore); len(ents) != 0 {
		t.Errorf("a failed command wrote into %s: %v", notStore, ents)
	}
	dir := buildStore(t, 5)
	if _, _, code := run(t, "inspect", dir, "--block", "xyz"); code != ExitUsage {
		t.Errorf("bad --block: exit %d", code)
	}
	if _, _, code := run(t, "inspect", dir, "--segment", "42"); code != ExitUsage {
		t.Errorf("unknown --segment: exit %d", code)
	}
}

func TestStatsMatchesEngine(t *testing.T) {
	dir := buildStore(t, 100)
	out, _, code := run(t, "stats", "--json", dir)
	if code != ExitOK {
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
	if code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, out, fmt.Sprintf("blocks:      %d", st.Blocks), fmt.Sprintf("live bytes:  %d", st.LiveBytes),
		fmt.Sprintf("file bytes:  %d", st.FileBytes))
}

func TestInspect(t *testing.T) {
	dir := buildStore(t, 40)
	id := testID(3)
	loc, _ := locate(t, dir, id)
	out, _, code := run(t, "inspect", dir, "--segment", fmt.Sprint(loc.Segment), "--block", id.String())
	if code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, out, `model="tool-test"`, "live ratio", "sealed",
		fmt.Sprintf("%d  %s", loc.Offset, id), "record header: matches the index", fmt.Sprintf("offset:     %d", loc.Offset))
	if strings.Contains(out, "  no\n") {
		t.Errorf("every record of a fresh store is indexed")
	}
	out, _, _ = run(t, "inspect", dir, "--block", testID(1000).String())
	mustContain(t, out, "not in the index")
}

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"4096", 4096, true},
		{"1K", 1024, true},
		{"1KiB", 1024, true},
		{"256kib", 256 << 10, true},
		{"2M", 2 << 20, true},
		{"2MiB", 2 << 20, true},
		{"1G", 1 << 30, true},
		{"1GiB", 1 << 30, true},
		{" 8MiB ", 8 << 20, true},
		{"10B", 10, true},
		{"8589934591G", 8589934591 << 30, true},
		{"8589934592G", 0, false},
		{"99999999999999999999", 0, false},
		{"", 0, false},
		{"MiB", 0, false},
		{"-1", 0, false},
		{"+1K", 0, false},
		{"1.5G", 0, false},
		{"2MB", 0, false},
		{"2 MiB", 2 << 20, true},
		{"1T", 1 << 40, true},
		{"abc", 0, false},
	} {
		got, err := ucmconfig.ParseSize(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ucmconfig.ParseSize(%q) = %d, %v; want %d, ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
	for n, want := range map[int64]string{2 << 20: "2MiB", 256 << 10: "256KiB", 1 << 30: "1GiB", 1000: "1000", 0: "0"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestBenchEndToEnd(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep-me")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"bench", "--dir", dir, "--total", "8MiB", "--block-size", "256KiB", "--shards", "4", "--segment-size", "1MiB"}
	out, _, code := run(t, args...)
	if code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, out, "verified", "dump", "load", "MB/s", "seq", "blocks      32")
	out, _, code = run(t, append(args, "--json", "--io-engine", "psync", "--direct", "off", "--sync", "none")...)
	if code != ExitOK {
		t.Fatalf("--json: exit %d", code)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("bench --json does not parse: %v", err)
	}
	for _, k := range []string{"workload", "block_bytes", "shards", "blocks", "total_bytes", "io_engine", "direct", "sync",
		"dump_MBps", "load_MBps", "open_s", "verified"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if m["verified"] != true || m["blocks"] != 32.0 || m["total_bytes"] != float64(8<<20) || m["direct"] != false ||
		m["sync"] != "none" || m["io_engine"] != "psync" || m["shards"] != 4.0 {
		t.Errorf("JSON %v", m)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("bench removed a file it does not own: %v", err)
	}
	// The bench store is a valid store.
	if _, _, code := run(t, "verify", filepath.Join(dir, "bench-256KiB-4")); code != ExitOK {
		t.Errorf("verify of the bench store: exit %d", code)
	}
}

func TestPayloadPoolDetectsMismatch(t *testing.T) {
	p := newPayloadPool(64 << 10)
	b := make([]byte, 64<<10)
	id := blockID(5)
	p.fill(b, id)
	if err := p.check(b, id); err != nil {
		t.Fatal(err)
	}
	if err := p.check(b, blockID(6)); err == nil {
		t.Error("another block's bytes verified")
	}
	b[40000] ^= 1
	if err := p.check(b, id); err == nil || !strings.Contains(err.Error(), "byte 40000") {
		t.Errorf("flipped byte: %v", err)
	}
}

func TestVerifyCorruptFooterStillChecksRecords(t *testing.T) {
	dir := buildStore(t, 60)
	st, err := os.Stat(segPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, segPath(dir, 1), st.Size()-10) // inside the trailer's checksummed bytes
	out, _, code := run(t, "verify", dir)
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, "PROBLEM "+wal.SegmentFileName(1)+": no valid footer", "blocks verified: 60", "problems: 1")
	// A payload flip in the same segment is still found by the walk.
	loc, _ := locate(t, dir, testID(2))
	if loc.Segment != 1 {
		t.Skipf("block 2 is in segment %d", loc.Segment)
	}
	flipByte(t, segPath(dir, 1), loc.Offset+format.RecordHeaderSize+1)
	out, _, _ = run(t, "verify", dir)
	mustContain(t, out, fmt.Sprintf("PROBLEM %s offset %d block %s", wal.SegmentFileName(1), loc.Offset, testID(2)), "blocks verified: 59")
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
	if code != ExitProblems {
		t.Fatalf("exit %d, want 1", code)
	}
	mustContain(t, out, "PROBLEM "+wal.SegmentFileName(loc.Segment), fmt.Sprintf("blocks verified: %d", 100-inSeg))
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
		if code != ExitOK {
			t.Fatalf("%s: verify exit %d, want 0", how, code)
		}
		mustContain(t, out, "recovery:", "blocks verified: 40", "problems: 0")
		if out, _, code = run(t, "verify", dir); code != ExitOK || strings.Contains(out, "recovery") {
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
	if code != ExitOK {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, out, "10 blocks, 10 sidecars", "sidecar 4", "packed", "sidecar 4:  segment", "3 parts of 512 bytes")
	if strings.Contains(out, "  no\n") {
		t.Errorf("every record of a fresh store is indexed")
	}
	out, _, code = run(t, "verify", dir)
	if code != ExitOK {
		t.Fatalf("verify exit %d:\n%s", code, out)
	}
	mustContain(t, out, "blocks verified: 10", "sidecars: 10, verified: 10", "store is clean")
	out, _, _ = run(t, "stats", dir)
	mustContain(t, out, "blocks:      10", "sidecars:    10")
}
