package fuzz

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/devio"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
	"github.com/ucm-go/ucm/wal"
)

var idRE = regexp.MustCompile(`[0-9a-f]{32}`)

// Diagnostics of a failed crash point (what found the sidecar "lost" in
// TestPowerLossDuringReclamation: docs/sidecars.md, "Crash contract"): the failing check's
// error carries the recovered engine's report and log (checkRecovered), and diagnose adds the
// state the crash left, before recovery.

// diagnose returns, for the block named in cause, its entries in the index and every record
// of it in every segment file of the crash clone the failing check recovered (made again from
// the same seed), before recovery, with the segment table and each file's scan.
func (c *crashPoints) diagnose(pct int, cause error) string {
	m := idRE.FindString(cause.Error())
	if m == "" {
		return ""
	}
	id, _ := format.ParseBlockID(m)
	fs := c.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(c.fig.points), uint64(pct)))})
	var b strings.Builder
	ix, err := index.Open("/store/index", index.Options{FS: fs, ReadOnly: true})
	if err != nil {
		fmt.Fprintf(&b, "index: %v\n", err)
	} else {
		loc, ok, err := ix.Get(id)
		fmt.Fprintf(&b, "index block: ok=%v seg=%d off=%d seq=%x err=%v\n", ok, loc.Segment, loc.Offset, loc.Seq, err)
		sl, ok, err := ix.GetSidecar(id, plSidecar)
		fmt.Fprintf(&b, "index sidecar: ok=%v seg=%d off=%d seq=%x err=%v\n", ok, sl.Segment, sl.Offset, sl.Seq, err)
		for _, s := range ix.Segments() {
			fmt.Fprintf(&b, "  row %d state=%v size=%d live=%d\n", s.Number, s.State, s.Size, s.LiveRecords)
		}
		_ = ix.Close()
	}
	be, _ := devio.NewBackend(devio.EnginePsync, 0, nil)
	dirs := []string{"/store"}
	for _, t := range c.opts.Tiers {
		dirs = append(dirs, t.Paths...)
	}
	slices.Sort(dirs)
	for _, dir := range slices.Compact(dirs) {
		dir = fs.PathJoin(dir, engine.SegmentDir)
		names, _ := fs.List(dir)
		for _, name := range names {
			path := fs.PathJoin(dir, name)
			res, err := wal.ScanSegment(fs, path, devio.DirectOff, be)
			if err != nil {
				fmt.Fprintf(&b, "%s: %v\n", path, err)
				continue
			}
			fmt.Fprintf(&b, "%s: seg %d gen %x records %d validEnd %d sealed %v\n", path, res.Header.Number, res.Header.Generation, len(res.Records), res.ValidEnd, res.Sealed)
			for _, r := range res.Records {
				if r.Header.ID == id {
					fmt.Fprintf(&b, "    kind %d off %d seq %x\n", r.Header.Kind, r.Offset, r.Header.Seq)
				}
			}
		}
	}
	return b.String()
}

// lockedWriter serializes writes to a buffer (a recovered engine logs from several goroutines).
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
