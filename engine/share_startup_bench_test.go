package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine/internal/share"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/wal"
)

// startupLayout: 256 KiB blocks, as the shared-tier measurements use.
var startupLayout = Layout{Shards: 4, TensorsPerShard: 2, ShardBytes: 64 << 10}

// startupOptions: one shared disk tier at shared, default segment size (256 MiB), the real disk.
func startupOptions(shared string) Options {
	return Options{Layout: startupLayout, Schema: testSchema, FS: vfs.Default, TaskTimeout: time.Minute,
		Tiers:                 []tiers.Config{{Name: "shared", Kind: tiers.KindDisk, Paths: []string{shared}, Shared: true}},
		SharedRefreshInterval: 100 * time.Millisecond, SharedRetireGrace: time.Hour}
}

// BenchmarkSharedStartup measures how fast a new instance indexes what another instance
// published on a shared tier: records/s from Open until every listed segment is indexed, and
// the time from Open to the first block of the tier being a hit in the foreign index.
//
//	real-1GiB/headers:   1 GiB dumped by instance A, indexed from footers and record headers
//	                     (A's summaries moved aside: what an instance did before summaries)
//	real-1GiB/summaries: the same segments, indexed from their summaries
//	simulated/summaries: UCM_STARTUP_SIM_GIB GiB (default 64; 1024 for 1 TiB) of synthetic
//	                     segments: sparse files with a real header and footer, a summary each,
//	                     no payload
//
// UCM_STARTUP_COLD=1 drops the kernel's caches before each new instance opens (root only): the
// tier is read from the medium, as by an instance on another host.
//
// UCM_STARTUP_DIR puts the real-1GiB shared tier on another file system, and
// UCM_STARTUP_DIR2 has the new instance see it through a second mount, as another host would
// (bash fuzz/gluster/harness.sh sh -c 'UCM_STARTUP_DIR=$UCM_GLUSTER_A
// UCM_STARTUP_DIR2=$UCM_GLUSTER_B go test ...').
//
// go test -tags uring -ldflags=-checklinkname=0 -run '^$' -bench BenchmarkSharedStartup -benchtime 1x ./engine/
func BenchmarkSharedStartup(b *testing.B) {
	b.Run("real-1GiB", func(b *testing.B) {
		shared := filepath.Join(b.TempDir(), "shared")
		reader := shared
		if d := os.Getenv("UCM_STARTUP_DIR"); d != "" {
			name := fmt.Sprintf("startup-%d", time.Now().UnixNano())
			shared, reader = filepath.Join(d, name), filepath.Join(d, name)
			if d2 := os.Getenv("UCM_STARTUP_DIR2"); d2 != "" {
				reader = filepath.Join(d2, name) // the same directory through another mount
			}
			b.Cleanup(func() { _ = os.RemoveAll(shared) })
		}
		nsDir := dumpGiB(b, shared, 1)
		b.Run("headers", func(b *testing.B) {
			aside := filepath.Join(nsDir, SummaryDir+".aside")
			if err := os.Rename(filepath.Join(nsDir, SummaryDir), aside); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = os.Rename(aside, filepath.Join(nsDir, SummaryDir)) }()
			benchStartup(b, reader, blockID(0))
		})
		b.Run("summaries", func(b *testing.B) { benchStartup(b, reader, blockID(0)) })
	})
	b.Run("simulated", func(b *testing.B) {
		gib := 64
		if v, err := strconv.Atoi(os.Getenv("UCM_STARTUP_SIM_GIB")); err == nil && v > 0 {
			gib = v
		}
		shared := filepath.Join(b.TempDir(), "shared")
		first := simulateTier(b, shared, gib)
		b.Run(fmt.Sprintf("summaries-%dGiB", gib), func(b *testing.B) { benchStartup(b, shared, first) })
	})
}

// dumpGiB has an instance dump gib GiB of 256 KiB blocks on shared and close; it returns its
// namespace directory.
func dumpGiB(b *testing.B, shared string, gib int) string {
	a := mustOpen(b, filepath.Join(b.TempDir(), "a"), startupOptions(shared))
	n := gib << 30 / int(startupLayout.BlockBytes())
	const batch = 64
	src := alignedBlocks(startupLayout, batch)
	for lo := 0; lo < n; lo += batch {
		ids := ids(lo, lo+batch)
		for i := range src {
			payload(ids[i], 0, src[i])
		}
		if err := a.Dump(ids, src).Wait(); err != nil {
			b.Fatal(err)
		}
	}
	inst := a.instance
	if err := a.Close(); err != nil {
		b.Fatal(err)
	}
	return tiers.NamespaceDir(shared, inst)
}

// dropCaches writes back and drops the kernel's page, dentry and inode caches (root only), so
// that a new instance reads the tier from the medium, as one on another host does.
func dropCaches(b *testing.B) {
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		b.Fatalf("UCM_STARTUP_COLD: %v (needs root)", err)
	}
}

// benchStartup opens a new instance on shared b.N times and reports records/s until every
// listed segment is indexed and the time until block first is in the foreign index.
func benchStartup(b *testing.B, shared string, first BlockID) {
	var recs int64
	var total, firstHit time.Duration
	for range b.N {
		if os.Getenv("UCM_STARTUP_COLD") != "" {
			dropCaches(b)
		}
		start := time.Now()
		e := mustOpen(b, filepath.Join(b.TempDir(), "b"), startupOptions(shared))
		var hitAt atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			for !e.share.ForeignIndex().Contains(first) {
				time.Sleep(100 * time.Microsecond)
			}
			hitAt.Store(int64(time.Since(start)))
		}()
		for {
			st := e.Stats().Sharing
			if st.SegmentsListed > 0 && st.ForeignSegments == st.SegmentsListed {
				break
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(start)
		<-done
		firstHit += time.Duration(hitAt.Load())
		st := e.Stats().Sharing
		recs += st.IndexedRecords
		b.Logf("%d segments (%d from summaries, %d from headers), %d records in %v; first hit after %v",
			st.ForeignSegments, st.IndexedFromSummary, st.IndexedFromHeaders, st.IndexedRecords, time.Since(start), time.Duration(hitAt.Load()))
		if err := e.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(recs)/total.Seconds(), "records/s")
	b.ReportMetric(float64(firstHit.Milliseconds())/float64(b.N), "ms-to-first-hit")
	b.ReportMetric(0, "ns/op")
}

// simulateTier writes gib GiB of another instance's published segments under shared without
// their payloads: each a sparse file of the default segment size holding a real segment header
// and footer (1,024 records of 256 KiB), its summary, and a manifest listing them all. It
// returns the first block.
func simulateTier(b *testing.B, shared string, gib int) BlockID {
	var inst format.InstanceID
	inst[0], inst[15] = 0x5e, 0x11
	nsDir := tiers.NamespaceDir(shared, inst)
	segDir := filepath.Join(nsDir, SegmentDir)
	for _, d := range []string{segDir, filepath.Join(nsDir, SummaryDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	fp := testSchema.Fingerprint(startupLayout)
	l := startupLayout
	recBytes := format.RecordHeaderSize + int64(l.Shards)*l.ShardStride()
	perSeg := int((DefaultSegmentSize - format.SegmentHeaderSize - format.FooterSize(1024)) / recBytes)
	segs := gib << 30 / (perSeg * int(l.BlockBytes()))
	m := &format.Manifest{Instance: inst, Schema: fp, Sequence: 1, Written: time.Now().UnixNano()}
	hdr := devio.AlignedBuffer(format.SegmentHeaderSize)
	crcs := make([]uint32, l.Shards)
	for s := 1; s <= segs; s++ {
		n, gen := uint64(s), uint64(s)<<8
		if err := format.EncodeSegmentHeader(hdr, &format.SegmentHeader{Number: n, Generation: gen, Instance: inst, Schema: fp}); err != nil {
			b.Fatal(err)
		}
		foot := make([]format.FooterEntry, perSeg)
		sum := &format.Summary{Instance: inst, Schema: fp, Segment: n, Generation: gen, Entries: make([]format.SummaryEntry, perSeg)}
		off := int64(format.SegmentHeaderSize)
		for r := range perSeg {
			id := blockID((s-1)*perSeg + r)
			seq := wal.SequenceFor(n, uint64(r+1))
			foot[r] = format.FooterEntry{ID: id, Offset: off, Length: recBytes, Seq: seq, HeaderCRC: uint32(r), Type: format.RecordBlock}
			sum.Entries[r] = format.SummaryEntry{ID: id, Offset: off, Seq: seq, HeaderCRC: uint32(r), Type: format.RecordBlock, Layout: l, ShardCRCs: crcs}
			off += recBytes
		}
		fb, err := format.EncodeFooter(n, gen, off, foot)
		if err != nil {
			b.Fatal(err)
		}
		size := off + int64(len(fb))
		sum.Size = size
		f, err := os.Create(wal.SegmentPath(segDir, n))
		if err == nil {
			err = f.Truncate(size)
		}
		if err == nil {
			_, err = f.WriteAt(hdr, 0)
		}
		if err == nil {
			_, err = f.WriteAt(fb, off)
		}
		if err == nil {
			err = f.Close()
		}
		if err != nil {
			b.Fatal(err)
		}
		enc, err := format.EncodeSummary(sum)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(share.SummaryPath(nsDir, n), enc, 0o644); err != nil {
			b.Fatal(err)
		}
		m.Segments = append(m.Segments, format.ManifestEntry{Number: n, Generation: gen, Size: size, Sealed: 1, Records: uint32(perSeg)})
	}
	if err := tiers.WriteManifest(vfs.Default, nsDir, m); err != nil {
		b.Fatal(err)
	}
	b.Logf("simulated %d segments of %d records (%d GiB of blocks)", segs, perSeg, segs*perSeg*int(l.BlockBytes())>>30)
	return blockID(0)
}
